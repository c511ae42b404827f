"""``POST /v1/messages`` and ``/v1/messages/count_tokens``: the Anthropic Messages API through
the proxy (Claude Code, the ``anthropic`` SDK).

The request is checked (:func:`ctxwarden.fit_messages.check`), fitted into the model's window
and forwarded to the configured Messages upstream; the client's messages go upstream as they were
sent when they fit. Claude's tokenizer is not public: when the upstream serves
``/messages/count_tokens`` (Anthropic does) a request near the cap is sized by it, and the local
prices (o200k times a margin) are scaled to its count; otherwise the margin alone is used, and the
report says so. Streamed requests get the upstream's events as they come (``message_start`` ...
``message_stop``). Errors use the Anthropic shape (``{"type": "error", "error": {...}}``).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterator, Mapping
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.concurrency import run_in_threadpool

from ctxwarden import fit_messages
from ctxwarden.errors import (
    AuthError,
    BudgetError,
    CtxwardenError,
    InputError,
    NotFound,
    OverloadedError,
    ScopeError,
    UpstreamError,
)
from ctxwarden.fit import fit
from ctxwarden.llm_anthropic import FORWARDED_HEADERS, AnthropicClient
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
from ctxwarden.server.windows import Windows

__all__ = ["error_response", "install", "reply_text"]

#: Ask the upstream to count when the local estimate passes this share of the cap (below it,
#: the margin in the local estimate leaves room enough).
COUNT_ABOVE = 0.5
#: How many times a fitted request is re-counted and cut further when the count says it is over.
RECOUNTS = 2

_KINDS = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    502: "api_error",
    504: "timeout_error",
    529: "overloaded_error",
}


def error_response(exc: CtxwardenError) -> JSONResponse:
    """``exc`` in the Anthropic error shape: 400 for bad input, the upstream's own 4xx."""
    message = client_message(exc)
    if isinstance(exc, BudgetError):
        status = 400
    elif isinstance(exc, UpstreamError):
        status, message = upstream_failure(exc)
    elif isinstance(exc, InputError):
        status = 400
        if exc.field:
            message = f"{exc.field}: {exc.reason}"
    elif isinstance(exc, ScopeError):
        status = 403
    elif isinstance(exc, AuthError):
        status = 401
    elif isinstance(exc, NotFound):
        status = 404
    elif isinstance(exc, OverloadedError):
        status = 429
    else:
        status = status_for(exc)
    kind = _KINDS.get(status, "api_error")
    body = {"type": "error", "error": {"type": kind, "message": message}}
    retry = retry_after(exc, 1)
    headers = {"Retry-After": retry} if retry is not None else None
    return JSONResponse(body, status_code=status, headers=headers)


def reply_text(payload: Mapping[str, Any]) -> str:
    """The text blocks of a message."""
    return "".join(
        str(b.get("text", ""))
        for b in payload.get("content") or ()
        if isinstance(b, Mapping) and b.get("type") == "text"
    )


def _texts(body: Mapping[str, Any]) -> tuple[list[tuple[str, str]], str | None]:
    texts: list[tuple[str, str]] = []
    query = None
    for message in body["messages"]:
        content = message.get("content")
        if isinstance(content, str):
            text = content
        else:
            text = "\n".join(
                str(b.get("text", ""))
                for b in content
                if isinstance(b, Mapping) and b.get("type") == "text"
            )
        role = str(message.get("role"))
        texts.append((role, text))
        if role == "user" and text.strip():
            query = text
    return texts, query


def _missing() -> NotFound:
    return NotFound(
        "no Anthropic Messages upstream is configured: start the proxy with "
        "--anthropic-upstream URL (and CTXWARDEN_ANTHROPIC_API_KEY)"
    )


def install(
    app: FastAPI,
    shared: Shared,
    anthropic: AnthropicClient | None,
    windows: Windows | None,
) -> None:
    """Add ``POST /v1/messages`` and ``POST /v1/messages/count_tokens`` to ``app``."""

    async def read(request: Request) -> tuple[dict[str, Any], dict[str, str], Principal]:
        caller = await run_in_threadpool(principal, request)
        caller.require("write")
        try:
            body = await request.json()
        except ValueError:
            raise InputError("the body is not JSON", field="body") from None
        if not isinstance(body, dict):
            raise InputError("expected a JSON object", field="body")
        headers = {k.lower(): v for k, v in request.headers.items()}
        return body, headers, caller

    @app.post("/v1/messages")
    async def messages(request: Request) -> Response:
        """Fit the conversation, forward it to the Messages upstream, relay the answer."""
        try:
            body, headers, caller = await read(request)
            if anthropic is None or windows is None:
                raise _missing()
            answer, report = await run_in_threadpool(
                _turn, shared, anthropic, windows, caller, body, headers
            )
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

    @app.post("/v1/messages/count_tokens")
    async def count_tokens(request: Request) -> Response:
        """The input tokens of a request: the upstream's count where it counts, else the
        proxy's own (flagged in the report header)."""
        try:
            body, headers, _tenant = await read(request)
            refuse_redirects(body)
            fit_messages.check(body)
            result = await run_in_threadpool(_count, shared, anthropic, windows, body, headers)
        except CtxwardenError as exc:
            return error_response(exc)
        value, report = result
        return JSONResponse({"input_tokens": value}, headers={REPORT_HEADER: report_header(report)})


def _forwarded(headers: Mapping[str, str]) -> dict[str, str]:
    return {name: headers[name] for name in FORWARDED_HEADERS if name in headers}


def _count(
    shared: Shared,
    anthropic: AnthropicClient | None,
    windows: Windows | None,
    body: Mapping[str, Any],
    headers: Mapping[str, str],
) -> tuple[int, dict[str, Any]]:
    if anthropic is not None and anthropic.counts:
        exact = anthropic.count_tokens(body, headers=_forwarded(headers))
        if exact is not None:
            return exact, {"counted_by": "upstream"}
    budget = budget_for(
        shared, windows or shared.windows, str(body["model"]), headers, None, field="max_tokens"
    )
    plan = fit_messages.plan(body, budget.pricer)
    local = plan.fixed + sum(u.tokens for u in plan.units)
    return local, {"counted_by": "proxy", "tokenizer": budget.tokenizer, "notes": budget.notes}


def _synthesized(payload: Mapping[str, Any]) -> Iterator[bytes]:
    """The events of a message the upstream answered in one body."""

    def event(kind: str, data: Mapping[str, Any]) -> bytes:
        return f"event: {kind}\ndata: {json.dumps({'type': kind, **data})}\n\n".encode()

    start = {**payload, "content": [], "stop_reason": None}
    yield event("message_start", {"message": start})
    for index, block in enumerate(payload.get("content") or ()):
        if not isinstance(block, Mapping):
            continue
        if block.get("type") == "text":
            yield event(
                "content_block_start",
                {"index": index, "content_block": {"type": "text", "text": ""}},
            )
            delta = {"type": "text_delta", "text": block.get("text", "")}
            yield event("content_block_delta", {"index": index, "delta": delta})
        elif block.get("type") == "tool_use":
            yield event(
                "content_block_start", {"index": index, "content_block": {**block, "input": {}}}
            )
            delta = {"type": "input_json_delta", "partial_json": json.dumps(block.get("input"))}
            yield event("content_block_delta", {"index": index, "delta": delta})
        else:
            yield event("content_block_start", {"index": index, "content_block": block})
        yield event("content_block_stop", {"index": index})
    usage = payload.get("usage") if isinstance(payload.get("usage"), Mapping) else {}
    yield event(
        "message_delta",
        {
            "delta": {
                "stop_reason": payload.get("stop_reason"),
                "stop_sequence": payload.get("stop_sequence"),
            },
            "usage": {"output_tokens": (usage or {}).get("output_tokens", 0)},
        },
    )
    yield event("message_stop", {})


def _fit(
    shared: Shared,
    anthropic: AnthropicClient,
    turn: Turn,
    body: dict[str, Any],
    forwarded: Mapping[str, str],
) -> None:
    """Fit without memory, sized by the upstream's count when the request is near the cap and
    the upstream counts (:class:`BudgetError` when even the newest turn does not fit)."""
    plan = fit_messages.plan(body, turn.budget.pricer)
    local = plan.fixed + sum(u.tokens for u in plan.units)
    exact: int | None = None
    if anthropic.counts and local > COUNT_ABOVE * turn.budget.cap:
        exact = anthropic.count_tokens(body, headers=forwarded)
        if exact is not None:
            turn.extra["counted_by"] = "upstream"
            turn.extra["upstream_count"] = exact
    turn.extra["exact_total"] = exact
    fit_turn(shared, turn, plan.units, plan.fixed, exact_total=exact)


def _render(
    shared: Shared,
    anthropic: AnthropicClient,
    turn: Turn,
    body: dict[str, Any],
    forwarded: Mapping[str, str],
    *,
    question: str | None,
) -> Mapping[str, Any]:
    """The request to send: with the memory block, re-counted by the upstream when it was cut
    by scaled counts (and cut further while that count is over the cap)."""
    fitted = with_memory(shared, turn, question=question, memory_at=0)
    block = turn.block.text if turn.block is not None else None
    outgoing = fit_messages.render(body, turn.units, fitted, block)
    if turn.extra.pop("exact_total", None) is None or (fitted.unchanged and block is None):
        return outgoing
    memory_tokens = math.ceil(turn.block.tokens * turn.scale) if turn.block is not None else 0
    cap = turn.budget.cap
    for _ in range(RECOUNTS):
        sent = anthropic.count_tokens(outgoing, headers=forwarded)
        if sent is None or sent <= turn.budget.cap:
            break
        # the scaled prices fell short by this much: fit again to a cap that much smaller
        cap -= max(sent - fitted.tokens, 1)
        if cap <= 0:
            break
        fitted = fit(
            turn.units,
            cap=cap,
            fixed=turn.fixed,
            memory_tokens=memory_tokens,
            keep_fraction=shared.keep_fraction,
        )
        turn.fitted = fitted
        outgoing = fit_messages.render(body, turn.units, fitted, block)
    return outgoing


def _turn(
    shared: Shared,
    anthropic: AnthropicClient,
    windows: Windows,
    caller: Principal,
    body: dict[str, Any],
    headers: Mapping[str, str],
) -> tuple[dict[str, Any] | Iterator[bytes], dict[str, Any]]:
    refuse_redirects(body)
    fit_messages.check(body)
    metadata = body.get("metadata")
    user = metadata.get("user_id") if isinstance(metadata, Mapping) else None
    try:
        who = who_of(caller.tenant, headers, {"user": user}, reads=can_read(caller))
    except InputError as exc:
        field = "metadata.user_id" if exc.field == "user" else exc.field
        raise InputError(exc.reason, field=field) from None
    budget = budget_for(
        shared, windows, str(body["model"]), headers, body.get("max_tokens"), field="max_tokens"
    )
    turn = Turn(who=who, budget=budget, received=len(body["messages"]), remember=who.named)
    forwarded = _forwarded(headers)
    release = take_slot(shared.slots, turn)
    handed = False  # the stream releases the slot when it ends
    try:
        _fit(shared, anthropic, turn, body, forwarded)  # before storing: a refusal stores nothing
        texts, question = _texts(body)
        remember_conversation(shared, turn, texts)
        outgoing = _render(shared, anthropic, turn, body, forwarded, question=question)
        if body.get("stream"):
            events = anthropic.stream_messages(outgoing, headers=forwarded)
            if events.body is None:
                parts: list[str] = []

                def on_event(event: dict[str, Any]) -> None:
                    kind = event.get("type")
                    delta = event.get("delta")
                    if (
                        kind == "content_block_delta"
                        and isinstance(delta, Mapping)
                        and delta.get("type") == "text_delta"
                    ):
                        parts.append(str(delta.get("text", "")))
                    elif kind == "message_start" and isinstance(event.get("message"), Mapping):
                        observe(shared, event["message"].get("usage"))

                def on_end() -> None:
                    remember_reply(shared, turn, "".join(parts))

                stream = relay(events, on_event=on_event, on_end=on_end, release=release)
                handed = True
                return stream, turn.report(streamed=True)
            payload = events.body
        else:
            started = time.perf_counter()
            payload = anthropic.messages(outgoing, headers=forwarded)
            turn.extra["upstream_ms"] = round((time.perf_counter() - started) * 1000, 1)
        remember_reply(shared, turn, reply_text(payload))
        return payload, turn.report(**observe(shared, payload.get("usage")))
    finally:
        if not handed:
            release()
