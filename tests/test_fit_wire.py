"""The Responses and Anthropic Messages adapters for all conversations (hypothesis, 1,000 examples
each): random conversations with tool calls, parallel calls, repeated turns and images, fitted to
random caps with the real o200k tokenizer. The fitted request is valid for its API (the adapter's
own check, which refuses what the API refuses), within the cap as re-priced from what is sent, a
suffix of whole turns after the system part, and the input itself whenever the input fits.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import anthropic.types
import pydantic
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from openai.types.responses import ResponseInputParam

from ctxwarden import fit_messages, fit_responses
from ctxwarden.errors import BudgetError, InputError
from ctxwarden.fit import fit
from ctxwarden.tokens import get_format
from ctxwarden.wirefit import Pricer

PRICER = Pricer(get_format("openai"))
MEMORY = "Memory retrieved for this turn, quoted as data:\n[2026-01-01 10:00] user: the cat is Miso"
words = st.text(alphabet="abcdefgh éü中 ", min_size=0, max_size=50)
PNG = {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}
#: The official SDKs' request types, as a second, independent schema check.
ANTHROPIC_MESSAGES = pydantic.TypeAdapter(list[anthropic.types.MessageParam])
RESPONSES_INPUT = pydantic.TypeAdapter(ResponseInputParam)
PROPERTY = settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# -- Anthropic Messages


@st.composite
def anthropic_turn(draw: st.DrawFn, number: int) -> list[dict[str, Any]]:
    kind = draw(st.sampled_from(["text", "repeat", "image", "blocks"]))
    if kind == "repeat":
        user: dict[str, Any] = {"role": "user", "content": "continue"}
    elif kind == "image":
        blocks: list[Any] = [{"type": "text", "text": draw(words)}]
        blocks += [{"type": "image", "source": PNG}] * draw(st.integers(1, 2))
        user = {"role": "user", "content": blocks}
    elif kind == "blocks":
        user = {"role": "user", "content": [{"type": "text", "text": draw(words)}]}
    else:
        user = {"role": "user", "content": draw(words)}
    messages = [user]
    for round_ in range(draw(st.integers(0, 3))):
        calls = draw(st.integers(1, 3))  # parallel calls
        content: list[Any] = []
        if draw(st.booleans()):
            content.append({"type": "text", "text": draw(words)})
        ids = [f"toolu_{number}_{round_}_{c}" for c in range(calls)]
        content += [
            {"type": "tool_use", "id": i, "name": "run", "input": {"arg": draw(words)}} for i in ids
        ]
        messages.append({"role": "assistant", "content": content})
        results: list[Any] = []
        for i in ids:
            body: Any = draw(
                st.one_of(
                    words,
                    st.just([{"type": "text", "text": "ok"}, {"type": "image", "source": PNG}]),
                )
            )
            results.append({"type": "tool_result", "tool_use_id": i, "content": body})
        messages.append({"role": "user", "content": results})
    if draw(st.booleans()) or len(messages) > 1:
        messages.append({"role": "assistant", "content": draw(words) or "ok"})
    return messages


@st.composite
def anthropic_requests(draw: st.DrawFn) -> dict[str, Any]:
    messages: list[Any] = []
    for number in range(draw(st.integers(1, 8))):
        messages += draw(anthropic_turn(number))
    body: dict[str, Any] = {"model": "claude-x", "max_tokens": 100, "messages": messages}
    if draw(st.booleans()):
        body["system"] = draw(words) or "be brief"
    if draw(st.booleans()):
        body["tools"] = [{"name": "run", "input_schema": {"type": "object"}}]
    return body


def _anthropic_cost(body: dict[str, Any]) -> int:
    plan = fit_messages.plan(body, PRICER)
    return plan.fixed + sum(u.tokens for u in plan.units)


@PROPERTY
@given(body=anthropic_requests(), share=st.floats(0.05, 1.5), memory=st.booleans())
def test_fitted_anthropic_requests_are_valid_within_cap_and_unchanged_when_they_fit(
    body: dict[str, Any], share: float, memory: bool
) -> None:
    original = copy.deepcopy(body)
    fit_messages.check(body)
    plan = fit_messages.plan(body, PRICER)
    total = plan.fixed + sum(u.tokens for u in plan.units)
    cap = max(1, int(total * share))
    block = MEMORY if memory else None
    memory_tokens = PRICER.message("user", MEMORY) if memory else 0
    try:
        fitted = fit(plan.units, cap=cap, fixed=plan.fixed, memory_tokens=memory_tokens)
    except BudgetError:
        last = plan.units[-1].tokens
        assert plan.fixed + last + memory_tokens > cap
        return
    sent = fit_messages.render(body, plan.units, fitted, block)
    assert body == original  # the client's request is never modified
    fit_messages.check(sent)  # valid: roles, block types, every tool_use with its tool_result
    ANTHROPIC_MESSAGES.validate_python(sent["messages"])  # and by the anthropic SDK's types
    assert _anthropic_cost(dict(sent)) <= cap  # the memory message is priced as it is sent
    kept = sent["messages"][1:] if memory else sent["messages"]
    assert kept == body["messages"][len(body["messages"]) - len(kept) :]  # whole turns, in order
    assert len(kept) >= plan.units[-1].stop - plan.units[-1].start  # the newest turn stays
    assert kept[0]["role"] == "user"  # a kept history starts with a turn's user message
    if memory:
        assert sent["messages"][0] == fit_messages.memory_message(MEMORY)
    if total + memory_tokens <= cap:
        assert fitted.unchanged
        if not memory:
            assert sent is body  # byte for byte: the client's own objects


# -- OpenAI Responses

IMAGE_PART = {
    "type": "input_image",
    "image_url": "data:image/png;base64,iVBORw0KGgo=",
    "detail": "auto",
}


@st.composite
def responses_turn(draw: st.DrawFn, number: int) -> list[dict[str, Any]]:
    kind = draw(st.sampled_from(["text", "repeat", "image", "typed"]))
    if kind == "repeat":
        user: dict[str, Any] = {"role": "user", "content": "continue"}
    elif kind == "image":
        parts: list[Any] = [{"type": "input_text", "text": draw(words)}]
        parts += [IMAGE_PART] * draw(st.integers(1, 2))
        user = {"role": "user", "content": parts}
    elif kind == "typed":
        user = {
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": draw(words)}],
        }
    else:
        user = {"role": "user", "content": draw(words)}
    items = [user]
    for round_ in range(draw(st.integers(0, 3))):
        if draw(st.booleans()):
            items.append({"type": "reasoning", "id": f"rs_{number}_{round_}", "summary": []})
        ids = [f"call_{number}_{round_}_{c}" for c in range(draw(st.integers(1, 3)))]
        items += [
            {
                "type": "function_call",
                "call_id": i,
                "name": "run",
                "arguments": json.dumps({"a": draw(words)}),
            }
            for i in ids
        ]
        items += [
            {"type": "function_call_output", "call_id": i, "output": draw(words)} for i in ids
        ]
    if draw(st.booleans()):
        items.append(
            {
                "type": "message",
                "id": f"msg_{number}",
                "status": "completed",
                "role": "assistant",
                "content": [{"type": "output_text", "text": draw(words), "annotations": []}],
            }
        )
    return items


@st.composite
def responses_requests(draw: st.DrawFn) -> dict[str, Any]:
    items: list[Any] = [
        {"role": draw(st.sampled_from(["system", "developer"])), "content": draw(words)}
        for _ in range(draw(st.integers(0, 2)))
    ]
    for number in range(draw(st.integers(1, 8))):
        items += draw(responses_turn(number))
    body: dict[str, Any] = {"model": "gpt-4o", "input": items}
    if draw(st.booleans()):
        body["instructions"] = draw(words)
    if draw(st.booleans()):
        body["tools"] = [{"type": "function", "name": "run", "parameters": {"type": "object"}}]
    return body


def _responses_cost(body: dict[str, Any]) -> int:
    plan = fit_responses.plan(body, PRICER)
    return plan.fixed + sum(u.tokens for u in plan.units)


@PROPERTY
@given(body=responses_requests(), share=st.floats(0.05, 1.5), memory=st.booleans())
def test_fitted_responses_requests_are_valid_within_cap_and_unchanged_when_they_fit(
    body: dict[str, Any], share: float, memory: bool
) -> None:
    original = copy.deepcopy(body)
    fit_responses.check(body)
    plan = fit_responses.plan(body, PRICER)
    total = plan.fixed + sum(u.tokens for u in plan.units)
    cap = max(1, int(total * share))
    block = MEMORY if memory else None
    memory_tokens = PRICER.message("user", MEMORY) if memory else 0
    try:
        fitted = fit(plan.units, cap=cap, fixed=plan.fixed, memory_tokens=memory_tokens)
    except BudgetError:
        lead = [u for u in plan.units if u.kind == "system"]
        always = plan.fixed + memory_tokens + sum(u.tokens for u in lead)
        assert always + plan.units[-1].tokens > cap
        return
    sent = fit_responses.render(body, plan.units, fitted, block)
    assert body == original
    fit_responses.check(sent)  # valid: item types, roles, every output after its call
    RESPONSES_INPUT.validate_python(sent["input"])  # and by the openai SDK's types
    assert _responses_cost(dict(sent)) <= cap
    items = body["input"]
    lead = sum(1 for u in plan.units if u.kind == "system")
    sent_items = sent["input"]
    assert sent_items[:lead] == items[:lead]  # the system part stays first
    rest = sent_items[lead + 1 :] if memory else sent_items[lead:]
    if memory:
        assert sent_items[lead] == fit_responses.memory_item(MEMORY)
    assert rest == items[len(items) - len(rest) :]  # whole turns, in order
    last = plan.units[-1]
    assert len(rest) >= last.stop - last.start
    if total + memory_tokens <= cap:
        assert fitted.unchanged
        if not memory:
            assert sent is body


# -- bad input, fixed examples


@pytest.mark.parametrize(
    "items",
    [
        [{"role": "user", "content": "x"}, {"type": "function_call_output", "call_id": "c"}],
        [{"type": "custom_tool_call_output", "call_id": "c", "output": "x"}],
    ],
)
def test_responses_outputs_need_their_call(items: list[Any]) -> None:
    with pytest.raises(InputError) as caught:
        fit_responses.check({"model": "m", "input": items})
    assert caught.value.field == f"input[{len(items) - 1}].call_id"


def test_an_output_after_a_later_user_message_shares_a_unit_with_its_call() -> None:
    items = [
        {"role": "user", "content": "a"},
        {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
        {"role": "user", "content": "b"},
        {"type": "function_call_output", "call_id": "c", "output": "x"},
        {"role": "user", "content": "c"},
    ]
    body = {"model": "m", "input": items}
    fit_responses.check(body)
    spans = [(u.start, u.stop) for u in fit_responses.plan(body, PRICER).units]
    assert spans == [(0, 4), (4, 5)]


def test_anthropic_tool_result_in_the_wrong_place_is_refused() -> None:
    messages = [
        {"role": "user", "content": "go"},
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}],
        },
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t"}]},
        {"role": "assistant", "content": "done"},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t"}]},
    ]
    with pytest.raises(InputError) as caught:
        fit_messages.check({"model": "m", "max_tokens": 5, "messages": messages})
    assert caught.value.field == "messages[4].content[0].tool_use_id"


def test_tool_use_outside_an_assistant_message_is_refused() -> None:
    messages = [
        {"role": "user", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}]}
    ]
    with pytest.raises(InputError) as caught:
        fit_messages.check({"model": "m", "max_tokens": 5, "messages": messages})
    assert caught.value.field == "messages[0].content[0]"


def test_prices_grow_with_content() -> None:
    small = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}
    large = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi " * 500}]}
    image = {
        "model": "m",
        "max_tokens": 5,
        "messages": [{"role": "user", "content": [{"type": "image", "source": PNG}]}],
    }
    assert _anthropic_cost(small) < _anthropic_cost(large)
    assert _anthropic_cost(image) >= 1600
