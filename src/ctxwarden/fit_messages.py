"""The Anthropic Messages adapter: check a request, price it in units, render the fitted request.

Pure: no I/O. ``system`` is not a unit (it is always sent, priced in ``fixed``); the messages
form turns: a turn starts at a user message that holds no ``tool_result`` block (a user message
of tool results answers the assistant's ``tool_use`` blocks just before it, so it belongs to that
turn), which keeps every ``tool_use`` with its ``tool_result`` in one unit. Kept messages are the
client's own objects, so they go upstream unchanged.

>>> from ctxwarden.tokens import get_format
>>> body = {"model": "claude-x", "max_tokens": 64, "messages": [
...     {"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"},
...     {"role": "user", "content": "bye"}]}
>>> check(body)
>>> [(u.start, u.stop) for u in plan(body, Pricer(get_format("openai"))).units]
[(0, 2), (2, 3)]
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ctxwarden.fit import Fitted, Unit
from ctxwarden.wirefit import IMAGE_TOKENS, Pricer, require

__all__ = ["BLOCK_TYPES", "Plan", "check", "plan", "render"]

#: Content block types the Messages API defines for request messages.
BLOCK_TYPES = frozenset(
    {
        "text",
        "image",
        "document",
        "search_result",
        "thinking",
        "redacted_thinking",
        "tool_use",
        "tool_result",
        "server_tool_use",
        "web_search_tool_result",
        "web_fetch_tool_result",
        "code_execution_tool_result",
        "bash_code_execution_tool_result",
        "text_editor_code_execution_tool_result",
        "tool_search_tool_result",
        "mcp_tool_use",
        "mcp_tool_result",
        "container_upload",
    }
)
_RESULT_PARTS = frozenset({"text", "image", "document", "search_result", "tool_reference"})


@dataclass(frozen=True, slots=True)
class Plan:
    """A request priced: its units (over ``messages``) and the fixed part (system, tools,
    the request's own overhead)."""

    units: tuple[Unit, ...]
    fixed: int


def _blocks(message: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    content = message.get("content")
    return [b for b in content if isinstance(b, Mapping)] if isinstance(content, list) else []


def _check_block(block: Any, where: str, role: str) -> None:
    require(isinstance(block, Mapping), where, "expected a content block object")
    kind = block.get("type")
    require(
        isinstance(kind, str) and kind in BLOCK_TYPES,
        f"{where}.type",
        f"unknown content block type {kind!r}; the Messages API defines "
        f"{', '.join(sorted(BLOCK_TYPES))}",
    )
    if kind == "text":
        require(isinstance(block.get("text"), str), f"{where}.text", "expected a string")
    elif kind == "image":
        require(isinstance(block.get("source"), Mapping), f"{where}.source", "expected an object")
    elif kind == "tool_use":
        require(role == "assistant", where, "a tool_use block belongs in an assistant message")
        for name in ("id", "name"):
            value = block.get(name)
            require(isinstance(value, str) and bool(value), f"{where}.{name}", "expected a string")
        require(isinstance(block.get("input"), Mapping), f"{where}.input", "expected an object")
    elif kind == "tool_result":
        require(role == "user", where, "a tool_result block belongs in a user message")
        ref = block.get("tool_use_id")
        require(isinstance(ref, str) and bool(ref), f"{where}.tool_use_id", "expected a string")
        content = block.get("content")
        if isinstance(content, list):
            for n, part in enumerate(content):
                require(
                    isinstance(part, Mapping) and part.get("type") in _RESULT_PARTS,
                    f"{where}.content[{n}].type",
                    f"a tool result holds {', '.join(sorted(_RESULT_PARTS))} blocks",
                )
        else:
            require(
                content is None or isinstance(content, str),
                f"{where}.content",
                "expected a string or a list of blocks",
            )


def check(body: Mapping[str, Any]) -> None:
    """Raise :class:`~ctxwarden.errors.InputError` naming the field when ``body`` is not a
    valid Messages request: roles, block types, and every ``tool_result`` answering a
    ``tool_use`` of the assistant message just before it (and every ``tool_use`` followed by a
    message answered)."""
    model = body.get("model")
    require(isinstance(model, str) and bool(model.strip()), "model", "missing: name the model")
    system = body.get("system")
    if isinstance(system, list):
        for n, block in enumerate(system):
            require(
                isinstance(block, Mapping) and block.get("type") == "text",
                f"system[{n}]",
                "expected a text block",
            )
            require(isinstance(block.get("text"), str), f"system[{n}].text", "expected a string")
    else:
        require(system is None or isinstance(system, str), "system", "expected text or blocks")
    tools = body.get("tools")
    if tools is not None:
        require(isinstance(tools, list), "tools", "expected a list of tools")
        for n, tool in enumerate(tools):
            require(isinstance(tool, Mapping), f"tools[{n}]", "expected a tool object")
    messages = body.get("messages")
    require(isinstance(messages, list) and bool(messages), "messages", "expected a non-empty list")
    assert isinstance(messages, list)
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        require(isinstance(message, Mapping), where, "expected a message object")
        role = message.get("role")
        require(
            role in ("user", "assistant"),
            f"{where}.role",
            f"unknown role {role!r}: the Messages API has user and assistant (system goes in "
            "the top-level 'system' field)",
        )
        content = message.get("content")
        require(
            isinstance(content, str | list), f"{where}.content", "expected text or a list of blocks"
        )
        if isinstance(content, list):
            for j, block in enumerate(content):
                _check_block(block, f"{where}.content[{j}]", str(role))
    _check_pairs(messages)


def _check_pairs(messages: Sequence[Mapping[str, Any]]) -> None:
    for i, message in enumerate(messages):
        blocks = _blocks(message)
        if message.get("role") == "user":
            results = [
                (j, b["tool_use_id"])
                for j, b in enumerate(blocks)
                if b.get("type") == "tool_result"
            ]
            if not results:
                continue
            before = messages[i - 1] if i > 0 else {}
            asked = {b.get("id") for b in _blocks(before) if b.get("type") == "tool_use"}
            for j, ref in results:
                require(
                    ref in asked,
                    f"messages[{i}].content[{j}].tool_use_id",
                    f"tool_result for {ref!r} has no matching tool_use in the assistant message "
                    "just before it",
                )
        else:
            calls = [(j, b["id"]) for j, b in enumerate(blocks) if b.get("type") == "tool_use"]
            if not calls or i + 1 >= len(messages):
                continue
            after = {
                b.get("tool_use_id")
                for b in _blocks(messages[i + 1])
                if b.get("type") == "tool_result"
            }
            for j, ref in calls:
                require(
                    ref in after,
                    f"messages[{i}].content[{j}].id",
                    f"tool_use {ref!r} has no tool_result in the message just after it",
                )


def _starts_turn(message: Mapping[str, Any]) -> bool:
    if message.get("role") != "user":
        return False
    return not any(b.get("type") == "tool_result" for b in _blocks(message))


def _result_cost(pricer: Pricer, content: Any) -> int:
    if isinstance(content, str):
        return pricer.message("tool", content)
    texts: list[str] = []
    extra = 0
    for part in content if isinstance(content, list) else ():
        if part.get("type") == "text":
            texts.append(str(part.get("text", "")))
        elif part.get("type") == "image":
            extra += IMAGE_TOKENS
        else:
            extra += pricer.json(part)
    return pricer.message("tool", "\n".join(texts), extra=extra)


def message_cost(pricer: Pricer, message: Mapping[str, Any]) -> int:
    """Tokens one (checked) message costs, its blocks priced by kind."""
    role = str(message.get("role"))
    content = message.get("content")
    if isinstance(content, str):
        return pricer.message(role, content)
    texts: list[str] = []
    extra = 0
    for block in _blocks(message):
        kind = block.get("type")
        if kind == "text":
            texts.append(str(block.get("text", "")))
        elif kind == "image":
            extra += IMAGE_TOKENS
        elif kind == "tool_use":
            arguments = json.dumps(block.get("input", {}), ensure_ascii=False)
            extra += pricer.call(str(block.get("name", "")), arguments)
        elif kind == "tool_result":
            extra += _result_cost(pricer, block.get("content"))
        elif kind == "thinking":
            extra += pricer.text(str(block.get("thinking", ""))) + pricer.text(
                str(block.get("signature", ""))
            )
        else:
            extra += pricer.json(block)
    return pricer.message(role, "\n".join(texts), extra=extra)


def system_text(body: Mapping[str, Any]) -> str:
    """The ``system`` field as one text."""
    system = body.get("system")
    if isinstance(system, list):
        return "\n".join(str(b.get("text", "")) for b in system if isinstance(b, Mapping))
    return system if isinstance(system, str) else ""


def plan(body: Mapping[str, Any], pricer: Pricer) -> Plan:
    """Price a checked request: one unit per turn, and the fixed part."""
    messages: list[Mapping[str, Any]] = body["messages"]
    system = system_text(body)
    fixed = pricer.request(has_system=bool(system)) + pricer.tools(body.get("tools") or ())
    if system:
        fixed += pricer.message("system", system)
    starts = [0] + [i for i, m in enumerate(messages) if i > 0 and _starts_turn(m)]
    units = []
    for n, start in enumerate(starts):
        stop = starts[n + 1] if n + 1 < len(starts) else len(messages)
        cost = sum(message_cost(pricer, messages[i]) for i in range(start, stop))
        units.append(Unit(start=start, stop=stop, tokens=cost, kind="turn"))
    return Plan(units=tuple(units), fixed=fixed)


def memory_message(text: str) -> dict[str, Any]:
    """The retrieved-memory block as one user message."""
    return {"role": "user", "content": [{"type": "text", "text": text}]}


def render(
    body: Mapping[str, Any],
    units: Sequence[Unit],
    fitted: Fitted,
    memory: str | None = None,
) -> Mapping[str, Any]:
    """The request to send: ``body`` itself when everything is kept and there is no memory,
    else a copy holding the memory message and then the kept messages (the client's objects)."""
    if fitted.unchanged and memory is None:
        return body
    messages = body["messages"]
    kept: list[Any] = [memory_message(memory)] if memory is not None else []
    for index in fitted.keep:
        unit = units[index]
        kept.extend(messages[unit.start : unit.stop])
    return {**body, "messages": kept}
