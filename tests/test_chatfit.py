"""The chat-completions adapter of fit.py, with the real o200k tokenizer and OpenAI chat format:
for all conversations (tool calls, parallel calls, repeated turns, images as content parts) the
request sent is valid for the OpenAI schema and for Anthropic's turn rules, within the cap as the
tokenizer counts it, and the input itself whenever the input fits."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ctxwarden.errors import BudgetError, InputError
from ctxwarden.fit import Unit
from ctxwarden.server.chatfit import (
    IMAGE_TOKENS,
    LOW_DETAIL_IMAGE_TOKENS,
    Conversations,
    TokenCache,
    count_units,
    fit_chat,
    kept_messages,
    validate_messages,
)
from ctxwarden.tokens import count_messages, get_chat_format, get_tokenizer

TOKENIZER = get_tokenizer("o200k_base")
FMT = get_chat_format("openai", TOKENIZER)
CACHE = TokenCache(size=5000)

text = st.text(alphabet=st.sampled_from('abc xyz,.é中\n{}"0123'), max_size=80)


def image(detail: str) -> dict[str, Any]:
    return {
        "type": "image_url",
        "image_url": {"url": "data:image/png;base64,AAAA", "detail": detail},
    }


@st.composite
def turn(draw: st.DrawFn, number: int) -> list[dict[str, Any]]:
    kind = draw(st.sampled_from(["text", "repeat", "image"]))
    if kind == "repeat":
        content: Any = "continue"
    elif kind == "image":
        content = [{"type": "text", "text": draw(text)}]
        content += [image(draw(st.sampled_from(["low", "high", "auto"])))]
    else:
        content = draw(text)
    out: list[dict[str, Any]] = [{"role": "user", "content": content}]
    for step in range(draw(st.integers(0, 3))):
        if draw(st.booleans()):
            ids = [f"c{number}_{step}_{i}" for i in range(draw(st.integers(1, 3)))]
            calls = [
                {"id": i, "type": "function",
                 "function": {"name": "search", "arguments": f'{{"q": "{draw(text)[:10]}"}}'}}
                for i in ids
            ]  # fmt: skip
            out.append({"role": "assistant", "content": None, "tool_calls": calls})
            out += [{"role": "tool", "tool_call_id": i, "content": draw(text)} for i in ids]
        else:
            out.append({"role": "assistant", "content": draw(text)})
    return out


@st.composite
def conversation(draw: st.DrawFn) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    if draw(st.booleans()):
        messages.append({"role": "system", "content": "You help. " + draw(text)})
    for number in range(draw(st.integers(1, 10))):
        messages += draw(turn(number))
    return messages


def tokenizer_count(messages: list[dict[str, Any]]) -> int:
    """The request's tokens by ctxwarden.tokens.count_messages, images at their flat cost."""
    images = 0
    plain = []
    for message in messages:
        content = message.get("content")
        if isinstance(content, list):
            for part in content:
                if part["type"] == "image_url":
                    low = part["image_url"].get("detail") == "low"
                    images += LOW_DETAIL_IMAGE_TOKENS if low else IMAGE_TOKENS
            content = [p for p in content if p["type"] == "text"]
        plain.append({**message, "content": content})
    return count_messages(TOKENIZER, FMT, plain) + images


def anthropic_valid(messages: list[dict[str, Any]]) -> bool:
    """Anthropic's turn rules after the system prompt is lifted out: the first message is the
    user's, and every tool_use block's result comes in the very next (user) turn."""
    rest = [m for m in messages if m["role"] != "system"]
    if not rest or rest[0]["role"] != "user":
        return False
    for index, message in enumerate(rest):
        if message.get("tool_calls"):
            results = {m["tool_call_id"] for m in rest[index + 1 :] if m["role"] == "tool"}
            following = rest[index + 1 : index + 1 + len(message["tool_calls"])]
            if {m.get("tool_call_id") for m in following} != {
                c["id"] for c in message["tool_calls"]
            }:
                return False
            if not results:
                return False
    return True


@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(conversation(), st.integers(60, 1500))
def test_the_request_sent_is_valid_within_the_cap_and_unchanged_when_it_fits(
    messages: list[dict[str, Any]], cap: int
) -> None:
    has_system = messages[0]["role"] == "system"
    fixed = FMT.request_overhead(has_system=has_system)
    total = tokenizer_count(messages)
    try:
        result = fit_chat(messages, fmt=FMT, cap=cap, fixed=fixed, cache=CACHE)
    except BudgetError:
        assert total > cap
        return
    sent = result.messages
    validate_messages(sent)
    assert result.fitted.tokens == tokenizer_count(sent)
    assert result.fitted.tokens <= cap
    if total <= cap:
        assert sent is messages
        assert result.fitted.unchanged
        return
    assert anthropic_valid(sent)
    if has_system:
        assert sent[0] == messages[0]
    last_user = max(i for i, m in enumerate(messages) if m["role"] == "user")
    tail = messages[last_user:]
    assert sent[-len(tail) :] == tail


def test_token_counts_are_cached_per_message() -> None:
    cache = TokenCache(size=100)
    messages = [{"role": "user", "content": f"message {i}"} for i in range(50)]
    first = fit_chat(messages, fmt=FMT, cap=10_000, fixed=3, cache=cache)
    assert first.counted == 50
    grown = [*messages, {"role": "assistant", "content": "ok"}, {"role": "user", "content": "more"}]
    second = fit_chat(grown, fmt=FMT, cap=10_000, fixed=3, cache=cache)
    assert second.counted == 2  # only what is new is counted
    assert second.fitted.tokens == count_messages(TOKENIZER, FMT, grown)


def test_the_cache_is_bounded() -> None:
    cache = TokenCache(size=10)
    for key in range(100):
        cache.put(key, key)
    assert len(cache) <= 20
    assert cache.get(99) == 99
    assert cache.get(0) is None


@pytest.mark.parametrize(
    ("messages", "field"),
    [
        ([{"role": "user", "content": [{"type": "text"}]}], "messages[0].content[0].text"),
        ([{"role": "assistant"}], "messages[0].content"),
        ([{"role": "user", "content": "x", "tool_calls": []}], "messages[0].tool_calls"),
        ([{"role": "user", "name": 5, "content": "x"}], "messages[0].name"),
    ],
)
def test_validation_names_the_field(messages: list[Any], field: str) -> None:
    with pytest.raises(Exception, match=field.replace("[", r"\[").replace("]", r"\]")):
        validate_messages(messages)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(conversation(), st.data())
def test_a_grown_conversation_is_counted_as_if_counted_whole(
    messages: list[dict[str, Any]], data: st.DataObject
) -> None:
    conversations = Conversations()
    cache = TokenCache()
    valid_prefixes = []
    for cut in range(1, len(messages)):
        try:
            validate_messages(messages[:cut])
        except InputError:
            continue
        valid_prefixes.append(cut)
    cuts = (
        sorted(set(data.draw(st.lists(st.sampled_from(valid_prefixes), max_size=3))))
        if valid_prefixes
        else []
    )
    for cut in [*cuts, len(messages)]:
        request = [dict(m) for m in messages[:cut]]  # parsed anew, as each request is
        checked = conversations.check(request)
        units, _, keys = count_units(request, checked, FMT, cache, conversations)
        whole, _, whole_keys = count_units(request, validate_messages(request), FMT, TokenCache())
        assert checked.leads == validate_messages(request)
        assert units == whole
        assert keys == whole_keys
    # a client that edits its history (after the first three messages, which name the
    # conversation) is checked and counted in full again
    edited = [dict(m) for m in messages]
    changed = [i for i, m in enumerate(edited) if i >= 3 and isinstance(m.get("content"), str)]
    if changed:
        edited[changed[0]]["content"] += " edited"
        checked = conversations.check(edited)
        assert checked.base is None
        units, _, _ = count_units(edited, checked, FMT, cache, conversations)
        assert units == count_units(edited, validate_messages(edited), FMT, TokenCache())[0]


@settings(max_examples=300, deadline=None)
@given(
    sizes=st.lists(st.integers(min_value=0, max_value=3), min_size=1, max_size=30),
    chosen=st.data(),
)
def test_kept_messages_are_the_kept_units_messages_in_order(
    sizes: list[int], chosen: st.DataObject
) -> None:
    units, start = [], 0
    for size in sizes:
        units.append(Unit(start=start, stop=start + size, tokens=1, kind="turn"))
        start += size
    messages = list(range(start))
    keep = sorted(chosen.draw(st.sets(st.integers(0, len(units) - 1))))
    expected = [m for i in keep for m in messages[units[i].start : units[i].stop]]
    assert kept_messages(messages, units, keep) == expected
