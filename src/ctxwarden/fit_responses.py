"""The OpenAI Responses adapter: check a request, price it in units, render the fitted request.

Pure: no I/O. ``instructions`` are not a unit (always sent, priced in ``fixed``); leading
system/developer messages of ``input`` are "system" units; the rest forms turns, a turn starting
at each user message. A tool call and its output always share a unit: when an output comes
after a later user message than its call, the turns between are merged. ``input`` as a string is
one turn. ``previous_response_id`` is forwarded as it is: what the upstream keeps under it is the
upstream's, and outputs answering calls held there are accepted without their call.

>>> from ctxwarden.tokens import get_format
>>> body = {"model": "gpt-4o", "input": [
...     {"role": "developer", "content": "be brief"}, {"role": "user", "content": "hi"},
...     {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
...     {"type": "function_call_output", "call_id": "c1", "output": "ok"},
...     {"role": "user", "content": "bye"}]}
>>> check(body)
>>> [(u.start, u.stop, u.kind) for u in plan(body, Pricer(get_format("openai"))).units]
[(0, 1, 'system'), (1, 4, 'turn'), (4, 5, 'turn')]
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ctxwarden.errors import InputError
from ctxwarden.fit import Fitted, Unit
from ctxwarden.wirefit import IMAGE_TOKENS, Pricer, require

__all__ = ["ITEM_TYPES", "Plan", "check", "plan", "render"]

#: Input item types the Responses API defines.
ITEM_TYPES = frozenset(
    {
        "message",
        "function_call",
        "function_call_output",
        "reasoning",
        "item_reference",
        "file_search_call",
        "web_search_call",
        "computer_call",
        "computer_call_output",
        "image_generation_call",
        "code_interpreter_call",
        "local_shell_call",
        "local_shell_call_output",
        "shell_call",
        "shell_call_output",
        "apply_patch_call",
        "apply_patch_call_output",
        "mcp_list_tools",
        "mcp_approval_request",
        "mcp_approval_response",
        "mcp_call",
        "custom_tool_call",
        "custom_tool_call_output",
        "compaction",
    }
)
ROLES = frozenset({"user", "assistant", "system", "developer"})
#: Content part types of input messages (and of assistant messages sent back).
PART_TYPES = frozenset(
    {"input_text", "input_image", "input_file", "input_audio", "output_text", "refusal"}
)
#: Output items and the call items they answer.
_ANSWERS = {
    "function_call_output": "function_call",
    "custom_tool_call_output": "custom_tool_call",
    "computer_call_output": "computer_call",
    "local_shell_call_output": "local_shell_call",
    "shell_call_output": "shell_call",
    "apply_patch_call_output": "apply_patch_call",
}
_CALLS = {call: output for output, call in _ANSWERS.items()}


@dataclass(frozen=True, slots=True)
class Plan:
    """A request priced: its units (over ``input`` items) and the fixed part."""

    units: tuple[Unit, ...]
    fixed: int


def item_type(item: Mapping[str, Any]) -> str:
    """An item's type; a bare ``{"role", "content"}`` is a message (the API's easy form)."""
    kind = item.get("type")
    if kind is None and "role" in item:
        return "message"
    return str(kind)


def _call_id(item: Mapping[str, Any]) -> str | None:
    value = item.get("call_id")
    if value is None and item_type(item) == "local_shell_call_output":
        value = item.get("id")
    return value if isinstance(value, str) else None


_ROLE_LIST = ", ".join(sorted(ROLES))
_PART_LIST = ", ".join(sorted(PART_TYPES))
_ITEM_LIST = ", ".join(sorted(ITEM_TYPES))


def _check_message(item: Mapping[str, Any], i: int) -> None:
    role = item.get("role")
    if role not in ROLES:
        raise InputError(
            f"unknown role {role!r}: the Responses API has {_ROLE_LIST}", field=f"input[{i}].role"
        )
    content = item.get("content")
    if isinstance(content, str):
        return
    if not isinstance(content, list):
        raise InputError("expected text or a list of parts", field=f"input[{i}].content")
    for n, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in PART_TYPES:
            raise InputError(
                f"unknown content part type {kind!r}; the Responses API defines {_PART_LIST}",
                field=f"input[{i}].content[{n}].type",
            )


def _check_item(item: Any, i: int, calls: dict[str, str], stateful: bool) -> None:
    # explicit ifs, not require(): messages are only formatted for an item that fails
    if not isinstance(item, dict):
        raise InputError("expected an item object", field=f"input[{i}]")
    kind = item_type(item)
    if kind == "message":
        _check_message(item, i)
        return
    if kind not in ITEM_TYPES:
        raise InputError(
            f"unknown item type {kind!r}; the Responses API defines {_ITEM_LIST}",
            field=f"input[{i}].type",
        )
    if kind in ("function_call", "custom_tool_call"):
        name = item.get("name")
        if not isinstance(name, str) or not name:
            raise InputError("expected a string", field=f"input[{i}].name")
        field = "arguments" if kind == "function_call" else "input"
        if not isinstance(item.get(field), str):
            raise InputError("expected a string", field=f"input[{i}].{field}")
    if kind in _CALLS or kind in _ANSWERS:
        ref = _call_id(item)
        if ref is None:
            raise InputError("expected a string", field=f"input[{i}].call_id")
        if kind in _CALLS:
            calls[ref] = kind
        elif not stateful and calls.get(ref) != _ANSWERS[kind]:
            raise InputError(
                f"{kind} for {ref!r} has no matching {_ANSWERS[kind]} earlier in input",
                field=f"input[{i}].call_id",
            )


def check(body: Mapping[str, Any]) -> None:
    """Raise :class:`~ctxwarden.errors.InputError` naming the field when ``body`` is not a
    valid Responses request: item types, roles, part types, and every tool output answering a
    call earlier in ``input`` (unless ``previous_response_id`` holds the calls upstream)."""
    model = body.get("model")
    require(isinstance(model, str) and bool(model.strip()), "model", "missing: name the model")
    instructions = body.get("instructions")
    require(
        instructions is None or isinstance(instructions, str), "instructions", "expected a string"
    )
    tools = body.get("tools")
    if tools is not None:
        require(isinstance(tools, list), "tools", "expected a list of tools")
        for n, tool in enumerate(tools):
            require(isinstance(tool, dict), f"tools[{n}]", "expected a tool object")
    items = body.get("input")
    stateful = body.get("previous_response_id") is not None or bool(body.get("conversation"))
    if isinstance(items, str) or (items is None and stateful):
        return
    require(isinstance(items, list) and bool(items), "input", "expected text or a list of items")
    assert isinstance(items, list)
    calls: dict[str, str] = {}
    for i, item in enumerate(items):
        _check_item(item, i, calls, stateful)


def _starts_turn(item: Mapping[str, Any]) -> bool:
    return item_type(item) == "message" and item.get("role") == "user"


def _parts_cost(pricer: Pricer, role: str, content: Any) -> int:
    if isinstance(content, str):
        return pricer.message(role, content)
    texts: list[str] = []
    extra = 0
    for part in content if isinstance(content, list) else ():
        if not isinstance(part, dict):
            extra += pricer.json(part)
        elif part.get("type") in ("input_text", "output_text", "text"):
            texts.append(str(part.get("text", "")))
        elif part.get("type") == "refusal":
            texts.append(str(part.get("refusal", "")))
        elif part.get("type") == "input_image":
            extra += IMAGE_TOKENS
        else:
            extra += pricer.json(part)
    return pricer.message(role, "\n".join(texts), extra=extra)


def item_cost(pricer: Pricer, item: Mapping[str, Any]) -> int:
    """Tokens one (checked) input item costs."""
    kind = item_type(item)
    if kind == "message":
        return _parts_cost(pricer, str(item.get("role")), item.get("content"))
    if kind == "function_call":
        call = pricer.call(str(item.get("name", "")), item.get("arguments", "{}"))
        return pricer.message("assistant", extra=call)
    if kind in ("function_call_output", "custom_tool_call_output"):
        return _parts_cost(pricer, "tool", item.get("output", ""))
    if kind == "reasoning":
        summary = item.get("summary")
        texts = [str(s.get("text", "")) for s in summary or () if isinstance(s, dict)] + [
            str(item.get("encrypted_content") or "")
        ]
        return pricer.text("\n".join(texts)) + pricer.json(item.get("content") or "")
    return pricer.message("assistant", extra=pricer.json(item))


def plan(body: Mapping[str, Any], pricer: Pricer) -> Plan:
    """Price a checked request: leading system units, turns, and the fixed part."""
    items = body.get("input")
    instructions = body.get("instructions") or ""
    fixed = pricer.tools(body.get("tools") or ())
    if instructions:
        fixed += pricer.message("system", instructions)
    if isinstance(items, str):
        fixed += pricer.request(has_system=bool(instructions))
        return Plan(
            units=(Unit(start=0, stop=1, tokens=pricer.message("user", items), kind="turn"),),
            fixed=fixed,
        )
    entries: list[Mapping[str, Any]] = list(items or ())
    lead = 0
    while (
        lead < len(entries)
        and item_type(entries[lead]) == "message"
        and entries[lead].get("role") in ("system", "developer")
    ):
        lead += 1
    fixed += pricer.request(has_system=bool(instructions) or lead > 0)
    costs = pricer.costs("responses", entries, item_cost)
    units = [Unit(start=i, stop=i + 1, tokens=costs[i], kind="system") for i in range(lead)]
    starts: list[int] = [lead] if lead < len(entries) else []
    where_called: dict[str, int] = {}
    for i in range(lead, len(entries)):
        item = entries[i]
        kind = item_type(item)
        if kind == "message":
            if item.get("role") == "user" and i > lead:
                starts.append(i)
        elif kind in _CALLS:
            ref = _call_id(item)
            if ref is not None:
                where_called[ref] = i
        elif kind in _ANSWERS:
            called = where_called.get(_call_id(item) or "")
            # an output after a later user message than its call: merge the turns between
            while called is not None and len(starts) > 1 and starts[-1] > called:
                starts.pop()
    for n, start in enumerate(starts):
        stop = starts[n + 1] if n + 1 < len(starts) else len(entries)
        units.append(Unit(start=start, stop=stop, tokens=sum(costs[start:stop]), kind="turn"))
    return Plan(units=tuple(units), fixed=fixed)


def memory_item(text: str) -> dict[str, Any]:
    """The retrieved-memory block as one user input item."""
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


def render(
    body: Mapping[str, Any],
    units: Sequence[Unit],
    fitted: Fitted,
    memory: str | None = None,
) -> Mapping[str, Any]:
    """The request to send: ``body`` itself when everything is kept and there is no memory,
    else a copy whose ``input`` holds the kept system items, the memory item, then the kept
    turns (the client's own objects)."""
    if fitted.unchanged and memory is None:
        return body
    raw = body.get("input")
    items: list[Any] = (
        [{"type": "message", "role": "user", "content": raw}]
        if isinstance(raw, str)
        else list(raw or ())
    )
    kept: list[Any] = []
    placed = memory is None
    for index in fitted.keep:
        unit = units[index]
        if not placed and unit.kind != "system":
            kept.append(memory_item(str(memory)))
            placed = True
        kept.extend(items[unit.start : unit.stop])
    if not placed:
        kept.append(memory_item(str(memory)))
    return {**body, "input": kept}
