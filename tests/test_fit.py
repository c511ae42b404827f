"""The conversation-fitting core: fixed examples and the rules for all conversations."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ctxwarden.errors import BudgetError, ConfigError, InputError
from ctxwarden.fit import Fitted, Lead, Unit, fit, turn_spans

IMAGE = {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}


def _cost(message: dict[str, Any]) -> int:
    """A stand-in per-message cost (the adapters' tests use the real tokenizer)."""
    content = message.get("content")
    total = 4
    if isinstance(content, str):
        total += len(content) // 4 + 1
    elif isinstance(content, list):
        for part in content:
            total += len(part.get("text", "")) // 4 + 1 if part["type"] == "text" else 85
    for call in message.get("tool_calls") or []:
        total += 10 + len(call["function"]["arguments"]) // 4
    return total


def _lead(message: dict[str, Any]) -> Lead:
    role = message["role"]
    if role in ("system", "developer"):
        return "system"
    return "user" if role == "user" else "other"


def units_of(messages: list[dict[str, Any]]) -> list[Unit]:
    return [
        Unit(start=a, stop=b, tokens=sum(_cost(m) for m in messages[a:b]), kind=kind)
        for a, b, kind in turn_spans([_lead(m) for m in messages])
    ]


words = st.text(alphabet="abcdefgh ", min_size=0, max_size=60)


@st.composite
def turns(draw: st.DrawFn, number: int) -> list[dict[str, Any]]:
    """One user turn: the question (text, repeated text, or parts with images), then replies,
    tool calls (parallel ones too) each followed by all their results."""
    kind = draw(st.sampled_from(["text", "repeat", "image"]))
    if kind == "repeat":
        user: dict[str, Any] = {"role": "user", "content": "continue"}
    elif kind == "image":
        parts: list[dict[str, Any]] = [{"type": "text", "text": draw(words)}]
        parts += [IMAGE] * draw(st.integers(1, 2))
        user = {"role": "user", "content": parts}
    else:
        user = {"role": "user", "content": draw(words)}
    out = [user]
    for step in range(draw(st.integers(0, 3))):
        if draw(st.booleans()):
            ids = [f"call_{number}_{step}_{i}" for i in range(draw(st.integers(1, 3)))]
            out.append(
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": i,
                            "type": "function",
                            "function": {"name": "look", "arguments": f'{{"q":"{draw(words)}"}}'},
                        }
                        for i in ids
                    ],
                }
            )
            order = draw(st.permutations(ids))
            out += [{"role": "tool", "tool_call_id": i, "content": draw(words)} for i in order]
        else:
            out.append({"role": "assistant", "content": draw(words)})
    return out


@st.composite
def conversations(draw: st.DrawFn) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    for _ in range(draw(st.integers(0, 2))):
        messages.append({"role": draw(st.sampled_from(["system", "developer"])), "content": "be"})
    if draw(st.booleans()):
        messages.append({"role": "assistant", "content": "hello, how can I help?"})
    for number in range(draw(st.integers(1, 12))):
        messages += draw(turns(number))
    return messages


def _sent(messages: list[dict[str, Any]], units: list[Unit], fitted: Fitted) -> list[Any]:
    return [m for i in fitted.keep for m in messages[units[i].start : units[i].stop]]


def _check_pairs(sent: list[dict[str, Any]]) -> None:
    """Every call has all its results and every result its call, results after their call."""
    open_calls: set[str] = set()
    for message in sent:
        if message["role"] == "tool":
            assert message["tool_call_id"] in open_calls
            open_calls.discard(message["tool_call_id"])
        else:
            assert not open_calls, "a call without its result"
            open_calls = {c["id"] for c in message.get("tool_calls") or []}
    assert not open_calls


@settings(max_examples=1000, deadline=None)
@given(conversations(), st.integers(10, 900), st.integers(0, 40), st.integers(0, 60))
def test_fit_rules_hold_for_all_conversations(
    messages: list[dict[str, Any]], cap: int, fixed: int, memory: int
) -> None:
    units = units_of(messages)
    assert [u.start for u in units] == [0, *[u.stop for u in units[:-1]]]
    assert units[-1].stop == len(messages)
    total = fixed + memory + sum(u.tokens for u in units)
    lead = sum(1 for u in units if u.kind == "system")
    always = fixed + memory + sum(u.tokens for u in units[:lead]) + units[-1].tokens
    if always > cap and total > cap:
        with pytest.raises(BudgetError, match=f"at least {always} tokens but the cap is {cap}"):
            fit(units, cap=cap, fixed=fixed, memory_tokens=memory)
        return
    fitted = fit(units, cap=cap, fixed=fixed, memory_tokens=memory)
    sent = _sent(messages, units, fitted)
    assert fitted.tokens <= cap
    assert fitted.tokens == fixed + memory + sum(units[i].tokens for i in fitted.keep)
    assert sorted(fitted.keep + fitted.dropped) == list(range(len(units)))
    if total <= cap:
        assert fitted.unchanged
        assert sent == messages
        assert not fitted.dropped
        return
    assert not fitted.unchanged
    assert fitted.notes
    # the leading system messages first, then the kept history; the newest turn is the tail
    system = list(messages[:lead])
    assert sent[:lead] == system
    tail = messages[units[-1].start :]
    assert sent[-len(tail) :] == tail
    assert sent[-len(tail)]["role"] == "user" or lead == len(units) - 1 or len(units) == 1
    # dropped oldest first: the dropped units are the oldest turns after the system units
    assert fitted.dropped == tuple(range(lead, lead + len(fitted.dropped)))
    _check_pairs([m for m in sent if m["role"] not in ("system", "developer")])
    # the order of what is kept is the client's order
    positions = [i for k in fitted.keep for i in range(units[k].start, units[k].stop)]
    assert positions == sorted(positions)
    assert [messages[i] for i in positions] == sent
    # large steps: either at least a step was dropped, or every droppable turn
    step = 0.4 * cap
    dropped_tokens = sum(units[i].tokens for i in fitted.dropped)
    assert dropped_tokens >= step or len(fitted.dropped) == len(units) - lead - 1


@settings(max_examples=1000, deadline=None)
@given(conversations(), st.lists(st.integers(0, 1000), min_size=1, max_size=6), st.data())
def test_a_growing_conversation_is_cut_at_the_same_places(
    start: list[dict[str, Any]], seeds: list[int], data: st.DataObject
) -> None:
    """Appending turns never moves an earlier cut backwards, and while the cut stays put the
    previous upstream messages are a prefix of the next ones (what prompt caches need)."""
    cap = data.draw(st.integers(150, 900))
    messages = list(start)
    previous: tuple[list[Any], Fitted] | None = None
    for number, _ in enumerate(seeds):
        units = units_of(messages)
        try:
            fitted = fit(units, cap=cap, fixed=20)
        except BudgetError:
            previous = None
        else:
            sent = _sent(messages, units, fitted)
            if previous is not None:
                before, earlier = previous
                assert set(earlier.dropped) <= set(fitted.dropped)
                if earlier.dropped == fitted.dropped:
                    assert sent[: len(before)] == before
            previous = (sent, fitted)
        messages = messages + data.draw(turns(100 + number))


def test_a_conversation_that_fits_is_kept_whole() -> None:
    units = [
        Unit(start=0, stop=1, tokens=10, kind="system"),
        Unit(start=1, stop=3, tokens=20, kind="turn"),
    ]
    fitted = fit(units, cap=40, fixed=5, memory_tokens=5)
    assert fitted == Fitted(keep=(0, 1), dropped=(), tokens=40, unchanged=True, notes=())


def test_the_cut_is_the_first_boundary_past_a_step() -> None:
    units = [Unit(start=0, stop=1, tokens=10, kind="system")]
    units += [Unit(start=i, stop=i + 1, tokens=10, kind="turn") for i in range(1, 21)]
    # 10 + 200 + 0 = 210 > 100; step 40: k=1 drops 4 turns (170 left), k=2 8 (130), k=3 12 (90)
    fitted = fit(units, cap=100, fixed=0)
    assert fitted.dropped == tuple(range(1, 13))
    assert fitted.tokens == 90
    assert fitted.keep[0] == 0
    assert fitted.keep[-1] == 20
    assert "12 oldest turn" in fitted.notes[0]


def test_the_newest_turn_and_system_are_always_kept_or_the_error_names_the_counts() -> None:
    units = [
        Unit(start=0, stop=1, tokens=30, kind="system"),
        Unit(start=1, stop=2, tokens=80, kind="turn"),
    ]
    with pytest.raises(BudgetError, match="at least 110 tokens but the cap is 100"):
        fit(units, cap=100, fixed=0)
    only_turn = [Unit(start=0, stop=3, tokens=80, kind="turn")]
    assert fit(only_turn, cap=80, fixed=0).unchanged


def test_bad_arguments_name_the_field() -> None:
    units = [Unit(start=0, stop=1, tokens=-1, kind="turn")]
    with pytest.raises(InputError, match=r"units\[0\].tokens"):
        fit(units, cap=10, fixed=0)
    with pytest.raises(ConfigError, match="keep_fraction"):
        fit([], cap=10, fixed=0, keep_fraction=1.0)
    with pytest.raises(InputError, match="cap"):
        fit([], cap=-1, fixed=0)


def test_turn_spans_groups_leading_system_and_turns() -> None:
    assert turn_spans([]) == []
    assert turn_spans(["system", "system"]) == [(0, 1, "system"), (1, 2, "system")]
    # a system message after the first user message belongs to its turn
    assert turn_spans(["user", "system", "other", "user"]) == [(0, 3, "turn"), (3, 4, "turn")]


@settings(max_examples=1000, deadline=None)
@given(conversations(), st.integers(10, 900), st.integers(0, 40), st.data())
def test_memory_in_the_room_left_keeps_the_same_cut(
    messages: list[dict[str, Any]], cap: int, fixed: int, data: st.DataObject
) -> None:
    """What the proxy relies on: a memory block no larger than the room the fit left changes
    only the total, never which units are kept."""
    units = units_of(messages)
    try:
        alone = fit(units, cap=cap, fixed=fixed)
    except BudgetError:
        return
    memory = data.draw(st.integers(0, cap - alone.tokens))
    together = fit(units, cap=cap, fixed=fixed, memory_tokens=memory)
    assert together.keep == alone.keep
    assert together.tokens == alone.tokens + memory
    assert together.unchanged == alone.unchanged


def _cut_by_walking(tokens: list[int], always: int, cap: int, step: float) -> int:
    """The cut (middle turns dropped) found by walking the turns one by one: the rule as
    written, against which fit()'s prefix-sum search is checked."""
    k, position, running = 1, 0, 0
    while True:
        while position < len(tokens) and running < k * step:
            running += tokens[position]
            position += 1
        if always + sum(tokens) - running <= cap or position == len(tokens):
            return position
        k += 1


@settings(max_examples=500, deadline=None)
@given(
    st.lists(st.integers(0, 300), min_size=1, max_size=60),
    st.integers(0, 50),
    st.integers(1, 400),
    st.integers(0, 3000),
    st.floats(0.0, 0.95),
)
def test_the_cut_is_the_one_walking_the_turns_finds(
    middle: list[int], system: int, newest: int, cap: int, keep_fraction: float
) -> None:
    units = [Unit(start=0, stop=1, tokens=system, kind="system")]
    units += [Unit(start=i + 1, stop=i + 2, tokens=t, kind="turn") for i, t in enumerate(middle)]
    units.append(Unit(start=len(middle) + 1, stop=len(middle) + 2, tokens=newest, kind="turn"))
    always = system + newest
    if always > cap:
        with pytest.raises(BudgetError):
            fit(units, cap=cap, fixed=0, keep_fraction=keep_fraction)
        return
    fitted = fit(units, cap=cap, fixed=0, keep_fraction=keep_fraction)
    if fitted.unchanged:
        assert always + sum(middle) <= cap
        return
    step = max(1.0, (1.0 - keep_fraction) * cap)
    cut = _cut_by_walking(middle, always, cap, step)
    assert fitted.dropped == tuple(range(1, 1 + cut))
    assert fitted.tokens == always + sum(middle[cut:])
