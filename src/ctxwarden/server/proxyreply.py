"""The proxy's answer side: tool calls in a reply checked (repaired, re-asked, gated), and a
completed reply sent as OpenAI ``chat.completion.chunk`` events when the agent asked to stream.

A reply's calls are checked with :func:`ctxwarden.toolcalls.check_reply`: malformed arguments
are repaired, a call whose arguments cannot be repaired is re-asked once (``ProxyConfig.reask``),
calls to destructive tools (``ProxyConfig.destructive``) are held and the reply says approval
is needed.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from ctxwarden.llm import LLMClient
from ctxwarden.toolcalls import ToolCall, ToolCallReport, check_call, check_reply
from ctxwarden.toolcalls import repair_request_messages as reask_messages

__all__ = ["check_tool_calls", "completion_events"]


def check_tool_calls(
    upstream: LLMClient,
    destructive: tuple[str, ...],
    reask: bool,
    model: str,
    message: dict[str, Any],
    tools: Sequence[Mapping[str, Any]],
    choice: dict[str, Any],
) -> dict[str, Any]:
    """Check, repair, re-ask (``reask``) and gate (tool-name patterns ``destructive``) the
    reply's calls in ``message`` in place; the report of what was done."""
    raw_calls = message.get("tool_calls") or []
    calls = [ToolCall.from_openai(c) for c in raw_calls]
    report = check_reply(calls, tools, destructive=destructive)
    checks = list(report.calls)
    reasks: list[dict[str, Any]] = []
    if reask:
        for position, check in enumerate(checks):
            if check.status != "invalid" or check.problems[0].code == "unknown_tool":
                continue
            schema = _schema_for(tools, check.call.name)
            answer = upstream.chat(
                reask_messages(check.call, check.problems, schema=schema), model=model
            )
            again = check_call(
                dataclasses.replace(check.call, arguments=answer.text or ""),
                tools,
                destructive=destructive,
            )
            reasks.append({"id": check.call.id, "name": check.call.name, "status": again.status})
            if again.status != "invalid":
                checks[position] = dataclasses.replace(
                    again,
                    original_arguments=check.original_arguments,
                    steps=(*check.steps, "asked the model to rewrite the call", *again.steps),
                )
    final = ToolCallReport(calls=tuple(checks))
    runnable = final.runnable_calls()
    message["tool_calls"] = [c.to_openai() for c in runnable] or None
    if message["tool_calls"] is None:
        del message["tool_calls"]
    notes = []
    if final.held:
        notes.append(final.held_notice())
    dropped = [c for c in final.calls if c.status == "invalid"]
    if dropped:
        notes.append(
            "\n".join(
                f"The call to {c.call.name} (call {c.call.id}) was dropped: its arguments are "
                "not valid for the tool."
                for c in dropped
            )
        )
    if notes:
        content = message.get("content")
        message["content"] = "\n".join(p for p in [content, *notes] if p)
    if not runnable and choice.get("finish_reason") == "tool_calls":
        choice["finish_reason"] = "stop"
    out = final.to_json()
    out["reasks"] = reasks
    return out


def _schema_for(tools: Sequence[Mapping[str, Any]], name: str) -> Mapping[str, Any] | None:
    for tool in tools:
        function = tool.get("function", tool)
        if isinstance(function, Mapping) and function.get("name") == name:
            parameters = function.get("parameters")
            return parameters if isinstance(parameters, Mapping) else None
    return None


def completion_events(payload: Mapping[str, Any], *, include_usage: bool) -> Iterator[bytes]:
    """The completed reply as OpenAI ``chat.completion.chunk`` server-sent events."""
    base = {
        "id": payload.get("id", "chatcmpl-ctxwarden"),
        "object": "chat.completion.chunk",
        "created": payload.get("created", int(time.time())),
        "model": payload.get("model", ""),
    }

    def event(data: Mapping[str, Any]) -> bytes:
        return b"data: " + json.dumps(data, separators=(",", ":")).encode() + b"\n\n"

    for choice in payload.get("choices") or []:
        index = choice.get("index", 0)
        message = choice.get("message") or {}
        delta: dict[str, Any] = {"role": message.get("role", "assistant")}
        if message.get("content") is not None:
            delta["content"] = message["content"]
        if message.get("tool_calls"):
            delta["tool_calls"] = [
                {"index": position, **call} for position, call in enumerate(message["tool_calls"])
            ]
        yield event({**base, "choices": [{"index": index, "delta": delta, "finish_reason": None}]})
        yield event(
            {
                **base,
                "choices": [
                    {"index": index, "delta": {}, "finish_reason": choice.get("finish_reason")}
                ],
            }
        )
    if include_usage and payload.get("usage") is not None:
        yield event({**base, "choices": [], "usage": payload["usage"]})
    yield b"data: [DONE]\n\n"
