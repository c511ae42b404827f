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

from ctxwarden.errors import InputError
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
    return [b for b in content if isinstance(b, dict)] if isinstance(content, list) else []


_BLOCK_LIST = ", ".join(sorted(BLOCK_TYPES))
_RESULT_LIST = ", ".join(sorted(_RESULT_PARTS))


def _block_problem(block: Any, role: str) -> tuple[str, str] | None:
    """What is wrong with one content block: (the field below it, the problem), or None.
    Strings are only made for a block that fails (a long conversation is checked each turn)."""
    if not isinstance(block, dict):
        return "", "expected a content block object"
    kind = block.get("type")
    if kind == "text":
        return None if isinstance(block.get("text"), str) else (".text", "expected a string")
    if not isinstance(kind, str) or kind not in BLOCK_TYPES:
        return (
            ".type",
            f"unknown content block type {kind!r}; the Messages API defines {_BLOCK_LIST}",
        )
    if kind == "image" and not isinstance(block.get("source"), dict):
        return ".source", "expected an object"
    if kind == "tool_use":
        if role != "assistant":
            return "", "a tool_use block belongs in an assistant message"
        for name in ("id", "name"):
            value = block.get(name)
            if not isinstance(value, str) or not value:
                return f".{name}", "expected a string"
        if not isinstance(block.get("input"), dict):
            return ".input", "expected an object"
    elif kind == "tool_result":
        if role != "user":
            return "", "a tool_result block belongs in a user message"
        ref = block.get("tool_use_id")
        if not isinstance(ref, str) or not ref:
            return ".tool_use_id", "expected a string"
        content = block.get("content")
        if isinstance(content, list):
            for n, part in enumerate(content):
                if not isinstance(part, dict) or part.get("type") not in _RESULT_PARTS:
                    return f".content[{n}].type", f"a tool result holds {_RESULT_LIST} blocks"
        elif content is not None and not isinstance(content, str):
            return ".content", "expected a string or a list of blocks"
    return None


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
                isinstance(block, dict) and block.get("type") == "text",
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
            require(isinstance(tool, dict), f"tools[{n}]", "expected a tool object")
    messages = body.get("messages")
    require(isinstance(messages, list) and bool(messages), "messages", "expected a non-empty list")
    assert isinstance(messages, list)
    asked: dict[str, int] = {}  # the previous assistant message's tool_use ids -> block index
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise InputError("expected a message object", field=f"messages[{i}]")
        role = message.get("role")
        if role not in ("user", "assistant"):
            raise InputError(
                f"unknown role {role!r}: the Messages API has user and assistant (system goes "
                "in the top-level 'system' field)",
                field=f"messages[{i}].role",
            )
        content = message.get("content")
        answered: set[str] = set()
        calls: dict[str, int] = {}
        if isinstance(content, list):
            for j, block in enumerate(content):
                problem = _block_problem(block, role)
                if problem is not None:
                    raise InputError(problem[1], field=f"messages[{i}].content[{j}]{problem[0]}")
                kind = block.get("type")
                if kind == "tool_use":
                    calls[block["id"]] = j
                elif kind == "tool_result":
                    ref = block["tool_use_id"]
                    if ref not in asked:
                        raise InputError(
                            f"tool_result for {ref!r} has no matching tool_use in the assistant "
                            "message just before it",
                            field=f"messages[{i}].content[{j}].tool_use_id",
                        )
                    answered.add(ref)
        elif not isinstance(content, str):
            raise InputError("expected text or a list of blocks", field=f"messages[{i}].content")
        for ref, j in asked.items():
            if ref not in answered:
                raise InputError(
                    f"tool_use {ref!r} has no tool_result in the message just after it",
                    field=f"messages[{i - 1}].content[{j}].id",
                )
        asked = calls


def _starts_turn(message: Mapping[str, Any]) -> bool:
    if message.get("role") != "user":
        return False
    content = message.get("content")
    return not isinstance(content, list) or not any(
        isinstance(b, dict) and b.get("type") == "tool_result" for b in content
    )


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
        return "\n".join(str(b.get("text", "")) for b in system if isinstance(b, dict))
    return system if isinstance(system, str) else ""


def plan(body: Mapping[str, Any], pricer: Pricer) -> Plan:
    """Price a checked request: one unit per turn, and the fixed part."""
    messages: list[Mapping[str, Any]] = body["messages"]
    system = system_text(body)
    fixed = pricer.request(has_system=bool(system)) + pricer.tools(body.get("tools") or ())
    if system:
        fixed += pricer.message("system", system)
    starts = [0] + [i for i, m in enumerate(messages) if i > 0 and _starts_turn(m)]
    costs = pricer.costs("messages", messages, message_cost)
    units = []
    for n, start in enumerate(starts):
        stop = starts[n + 1] if n + 1 < len(starts) else len(messages)
        units.append(Unit(start=start, stop=stop, tokens=sum(costs[start:stop]), kind="turn"))
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
