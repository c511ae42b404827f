"""``POST /v1/responses``: the OpenAI Responses API through the proxy (Codex, the Agents SDK).

The request is checked (:func:`ctxwarden.fit_responses.check`), fitted into the model's window
and forwarded to the configured OpenAI-compatible upstream's ``/responses``; the client's items go
upstream as they were sent when they fit. Streamed requests get the upstream's events as they come
(``response.created`` ... ``response.completed``). ``previous_response_id`` is forwarded
unchanged: what the upstream keeps under it is the upstream's state, not the proxy's. Errors use
the OpenAI shape (``{"error": {"message", "type", "param", "code"}}``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Mapping
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.concurrency import run_in_threadpool

from ctxwarden import fit_responses
from ctxwarden.errors import (
    AuthError,
    BudgetError,
    CtxwardenError,
    InputError,
    ScopeError,
    UpstreamError,
)
from ctxwarden.llm import LLMClient
from ctxwarden.server.access import client_message, retry_after
from ctxwarden.server.agents import (
    REPORT_HEADER,
    Shared,
    Turn,
    budget_for,
    fit_turn,
    observe,
    principal,
    refuse_redirects,
    relay,
    remember_conversation,
    remember_reply,
    report_header,
    take_slot,
    upstream_failure,
    with_memory,
)
from ctxwarden.server.guard import can_read
from ctxwarden.server.http import Principal, status_for
from ctxwarden.server.proxymemory import who_of

__all__ = ["error_response", "install", "reply_text"]


def error_response(exc: CtxwardenError) -> JSONResponse:
    """``exc`` as an OpenAI-style error: 400 for bad input, the upstream's own status for its
    errors (:func:`upstream_failure`)."""
    param = exc.field if isinstance(exc, InputError) else None
    code: str | None = None
    kind = "invalid_request_error"
    if isinstance(exc, BudgetError):
        status, code = 400, "context_length_exceeded"
    elif isinstance(exc, UpstreamError):
        status, message = upstream_failure(exc)
        body = {"error": {"message": message, "type": "upstream_error", "param": None,
                          "code": f"upstream_{status}"}}  # fmt: skip
        return JSONResponse(body, status_code=status)
    elif isinstance(exc, InputError):
        status = 400
    elif isinstance(exc, ScopeError):
        status, kind = 403, "permission_error"
    elif isinstance(exc, AuthError):
        status, kind = 401, "authentication_error"
    else:
        status = status_for(exc)
        kind = "upstream_error" if status == 502 else "server_error"
    message = (
        f"{param}: {exc.reason}" if isinstance(exc, InputError) and param else client_message(exc)
    )
    body = {"error": {"message": message, "type": kind, "param": param, "code": code}}
    retry = retry_after(exc, 1)
    headers = {"Retry-After": retry} if retry is not None else None
    return JSONResponse(body, status_code=status, headers=headers)


def reply_text(payload: Mapping[str, Any]) -> str:
    """The text of a response's output messages."""
    parts: list[str] = []
    for item in payload.get("output") or ():
        if isinstance(item, Mapping) and item.get("type") == "message":
            for part in item.get("content") or ():
                if isinstance(part, Mapping) and part.get("type") == "output_text":
                    parts.append(str(part.get("text", "")))
    return "".join(parts)


def _texts(body: Mapping[str, Any]) -> tuple[list[tuple[str, str]], str | None]:
    """One ``(role, text)`` per input item (``(type, "")`` for items that are not messages)
    and the newest user text."""
    raw = body.get("input")
    if isinstance(raw, str):
        return [("user", raw)], raw
    texts: list[tuple[str, str]] = []
    query = None
    for item in raw or ():
        kind = fit_responses.item_type(item)
        if kind != "message":
            texts.append((kind, ""))
            continue
        content = item.get("content")
        if isinstance(content, str):
            text = content
        else:
            text = "\n".join(
                str(p.get("text", ""))
                for p in content or ()
                if isinstance(p, dict) and p.get("type") in ("input_text", "output_text")
            )
        role = str(item.get("role"))
        texts.append((role, text))
        if role == "user" and text.strip():
            query = text
    return texts, query


def _synthesized(payload: Mapping[str, Any]) -> Iterator[bytes]:
    """An upstream that answered a streamed request in one body: its events, completed."""
    for number, kind in enumerate(("response.created", "response.completed")):
        event = {"type": kind, "sequence_number": number, "response": payload}
        yield f"event: {kind}\ndata: {json.dumps(event)}\n\n".encode()


def install(app: FastAPI, shared: Shared, upstream: LLMClient) -> None:
    """Add ``POST /v1/responses`` to ``app``."""

    @app.post("/v1/responses")
    async def responses(request: Request) -> Response:
        """Fit the conversation, forward it to the upstream's Responses API, relay the answer."""
        try:
            caller = await run_in_threadpool(principal, request)
            caller.require("write")
            try:
                body = await request.json()
            except ValueError:
                raise InputError("the body is not JSON", field="body") from None
            if not isinstance(body, dict):
                raise InputError("expected a JSON object", field="body")
            headers = {k.lower(): v for k, v in request.headers.items()}
            answer, report = await run_in_threadpool(_turn, shared, upstream, caller, body, headers)
        except CtxwardenError as exc:
            return error_response(exc)
        header = {REPORT_HEADER: report_header(report)}
        if isinstance(answer, dict):
            if body.get("stream"):
                return StreamingResponse(
                    _synthesized(answer), media_type="text/event-stream", headers=header
                )
            return JSONResponse(answer, headers=header)
        return StreamingResponse(answer, media_type="text/event-stream", headers=header)


def _turn(
    shared: Shared,
    upstream: LLMClient,
    caller: Principal,
    body: dict[str, Any],
    headers: Mapping[str, str],
) -> tuple[dict[str, Any] | Iterator[bytes], dict[str, Any]]:
    refuse_redirects(body)
    fit_responses.check(body)
    who = who_of(caller.tenant, headers, body, reads=can_read(caller))
    budget = budget_for(
        shared,
        shared.windows,
        str(body["model"]),
        headers,
        body.get("max_output_tokens"),
        field="max_output_tokens",
    )
    raw = body.get("input")
    turn = Turn(
        who=who,
        budget=budget,
        received=len(raw) if isinstance(raw, list) else 1,
        remember=who.named,
    )
    plan = fit_responses.plan(body, budget.pricer)
    release = take_slot(shared.slots, turn)
    handed = False  # the stream releases the slot when it ends
    try:
        texts, question = _texts(body)
        # a request that cannot be fitted stores nothing: fit first
        fit_turn(shared, turn, plan.units, plan.fixed)
        remember_conversation(shared, turn, texts)
        memory_at = sum(u.stop - u.start for u in plan.units if u.kind == "system")
        fitted = with_memory(shared, turn, question=question, memory_at=memory_at)
        block = turn.block.text if turn.block is not None else None
        outgoing = fit_responses.render(body, plan.units, fitted, block)
        if body.get("stream"):
            events = upstream.stream("responses", outgoing)
            if events.body is None:
                parts: list[str] = []

                def on_event(event: dict[str, Any]) -> None:
                    kind = event.get("type")
                    if kind == "response.output_text.delta":
                        parts.append(str(event.get("delta", "")))
                    elif kind == "response.completed" and isinstance(event.get("response"), dict):
                        observe(shared, event["response"].get("usage"))

                def on_end() -> None:
                    remember_reply(shared, turn, "".join(parts))

                stream = relay(events, on_event=on_event, on_end=on_end, release=release)
                handed = True
                return stream, turn.report(streamed=True)
            payload = events.body
        else:
            started = time.perf_counter()
            payload = upstream.post("responses", outgoing)
            turn.extra["upstream_ms"] = round((time.perf_counter() - started) * 1000, 1)
        remember_reply(shared, turn, reply_text(payload))
        return payload, turn.report(**observe(shared, payload.get("usage")))
    finally:
        if not handed:
            release()
