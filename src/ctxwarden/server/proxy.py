"""An OpenAI-compatible proxy: the agent sends its whole conversation, the model gets a context.

``POST /v1/chat/completions`` (streamed or not) and ``GET /v1/models``. For each request the
proxy:

1. picks the session: the ``X-Ctxwarden-Session`` header, else the body's ``user``, else a hash
   of the system prompt;
2. ingests the messages it has not seen (ids derived from the session and the message, so a
   conversation sent again is recognised as known);
3. assembles a context that fits the model's window (window and tokenizer from the registry);
4. sends that upstream with the configured :class:`~ctxwarden.llm.LLMClient`: a streamed
   request without tools is streamed through event by event; any request with tools is asked
   unstreamed, because its tool calls are checked before anything reaches the agent (and then
   sent as events if the agent asked to stream);
5. checks the reply's tool calls (:func:`ctxwarden.toolcalls.check_reply`): repairs malformed
   arguments, asks the model once to rewrite a call that cannot be repaired, holds back calls to
   destructive tools and says approval is needed;
6. stores the reply and answers with the upstream body, plus an ``x-ctxwarden-report``
   header: session, context size, ingest counts, and every repair and gate.

Provenance of relayed tool results: the agent's client ran its tools, not the proxy, so the
``tool`` messages in a conversation are stored unsigned, hence untrusted
(:mod:`ctxwarden.provenance`), even when the tenant has a tool key configured: signing what it
merely relays would claim a verification nobody made. A tool that wants its results trusted
signs them itself and posts them through the HTTP API. Untrusted content never enters the
system message; in the context a relayed result goes back only as a ``tool`` message paired
with its call in recent history (its role marks it as data); retrieval leaves tool messages out.

The upstream URL and key come from configuration only. Request fields that would redirect the
proxy (``api_base``, ``base_url``, ``api_key``...) are refused, the agent's ``Authorization``
header is never forwarded, and the client follows no redirects.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import xxhash
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.concurrency import run_in_threadpool

from ctxwarden.engine import Engine
from ctxwarden.errors import CtxwardenError, InputError
from ctxwarden.llm import ChunkStream, LLMClient, UpstreamStatusError
from ctxwarden.llm_anthropic import AnthropicClient
from ctxwarden.server.agents import install_agent_apis
from ctxwarden.server.http import Caller, LimitsMiddleware, Principal, ServerConfig, status_for
from ctxwarden.sessions import Ticket, TurnSlots
from ctxwarden.toolcalls import ToolCall, ToolCallReport, check_call, check_reply
from ctxwarden.toolcalls import repair_request_messages as reask_messages
from ctxwarden.types import Context

__all__ = ["FORBIDDEN_FIELDS", "ProxyConfig", "create_proxy_app", "session_of"]

log = logging.getLogger(__name__)

#: Request fields that could point the proxy elsewhere or ask for its key: refused with 422.
FORBIDDEN_FIELDS = frozenset(
    {
        "api_base",
        "base_url",
        "api_key",
        "api_type",
        "api_version",
        "organization",
        "upstream",
        "url",
        "endpoint",
        "headers",
        "extra_headers",
    }
)
#: The header a client may set to name its session.
SESSION_HEADER = "x-ctxwarden-session"
REPORT_HEADER = "x-ctxwarden-report"


@dataclass(frozen=True, kw_only=True, slots=True)
class ProxyConfig:
    """How the proxy behaves.

    ``destructive``: tool-name patterns (``fnmatch``, e.g. ``"delete_*"``) whose calls are held
    for approval. ``reask``: ask the model once to rewrite a call whose arguments cannot be
    repaired. ``server``: body limit, concurrency gate and authentication.
    """

    destructive: tuple[str, ...] = ()
    reask: bool = True
    server: ServerConfig = dataclasses.field(default_factory=ServerConfig)
    turn_slots: int = 8
    turn_timeout: float = 120.0


def session_of(headers: Mapping[str, str], body: Mapping[str, Any]) -> str:
    """The session of a request: header, else ``user``, else a hash of the system prompt."""
    named = headers.get(SESSION_HEADER)
    if named and named.strip():
        return named.strip()
    user = body.get("user")
    if isinstance(user, str) and user.strip():
        return user.strip()
    system = "\n".join(
        _text(m.get("content"))
        for m in body.get("messages", ())
        if isinstance(m, Mapping) and m.get("role") in ("system", "developer")
    )
    return "sys-" + xxhash.xxh3_64_hexdigest(system.encode("utf-8", "surrogatepass"))


def _text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            str(part.get("text", ""))
            for part in content
            if isinstance(part, Mapping) and part.get("type") in ("text", "input_text")
        )
    return str(content)


def _message_key(session: str, message: Mapping[str, Any]) -> str:
    # only what an agent keeps when it sends a reply back (clients add null fields of their own)
    calls = [
        [
            c.get("id"),
            (c.get("function") or {}).get("name"),
            (c.get("function") or {}).get("arguments"),
        ]
        for c in message.get("tool_calls") or []
        if isinstance(c, Mapping)
    ]
    return "\x00".join(
        [
            session,
            str(message.get("role")),
            _text(message.get("content")).strip(),
            json.dumps(calls, sort_keys=True, separators=(",", ":")),
            str(message.get("tool_call_id") or ""),
        ]
    )


class _Ids:
    """Stable ids for a conversation's messages: the n-th copy of a message gets the same id
    every time the conversation is sent, so only new messages are stored."""

    def __init__(self, session: str) -> None:
        self.session = session
        self.seen: Counter[str] = Counter()

    def next(self, message: Mapping[str, Any]) -> str:
        key = _message_key(self.session, message)
        self.seen[key] += 1
        digest = xxhash.xxh3_64_hexdigest(f"{key}\x00{self.seen[key]}".encode("utf-8", "replace"))
        return f"px-{digest}"


def _record(message: Mapping[str, Any], id: str) -> dict[str, Any] | None:
    role = message.get("role")
    content = _text(message.get("content")).strip()
    calls = message.get("tool_calls") or []
    if not content and not calls:
        return None
    record: dict[str, Any] = {"id": id, "role": role, "content": content or None}
    if calls:
        record["tool_calls"] = calls
    if message.get("tool_call_id"):
        record["tool_call_id"] = message["tool_call_id"]
    if isinstance(message.get("name"), str):
        record["name"] = message["name"]
    return record


def _openai_error(status: int, message: str, kind: str) -> JSONResponse:
    return JSONResponse(
        {"error": {"message": message, "type": kind, "code": status}}, status_code=status
    )


def _report_header(report: Mapping[str, Any]) -> str:
    return json.dumps(report, separators=(",", ":"), ensure_ascii=True)


def create_proxy_app(
    engine: Engine,
    upstream: LLMClient,
    config: ProxyConfig | None = None,
    anthropic: AnthropicClient | None = None,
) -> Any:
    """The proxy application; ``upstream`` is the configured model server's client (chat
    completions and Responses), ``anthropic`` the Messages API upstream if there is one."""
    config = config or ProxyConfig()
    slots = TurnSlots(config.turn_slots, timeout=config.turn_timeout)
    app = FastAPI(title="ctxwarden proxy", version="0.1.0")
    app.state.slots = slots
    app.state.engine = engine
    app.state.config = config.server

    @app.exception_handler(CtxwardenError)
    async def _error(request: Request, exc: CtxwardenError) -> JSONResponse:
        if isinstance(exc, UpstreamStatusError) and 400 <= exc.status < 500:
            return _openai_error(exc.status, f"upstream: {exc.detail}", "upstream_error")
        status = status_for(exc)
        if status >= 500:
            log.error("%s %s failed: %s", request.method, request.url.path, type(exc).__name__)
        response = _openai_error(status, str(exc), type(exc).__name__)
        if status == 401:
            response.headers["WWW-Authenticate"] = "Bearer"
        if status == 429:
            response.headers["Retry-After"] = str(config.server.retry_after_seconds)
        return response

    @app.get("/health")
    def health() -> dict[str, str]:
        """Liveness."""
        return {"status": "ok"}

    @app.get("/v1/models")
    def models(caller: Caller) -> dict[str, Any]:
        """The upstream's model list, as it sent it."""
        caller.require("read")
        return upstream.request("GET", "models")

    @app.post("/v1/chat/completions")
    async def chat(request: Request, caller: Caller) -> Response:
        """Ingest the new messages, assemble, ask upstream, check tool calls, store the reply."""
        caller.require("write")
        try:
            body = await request.json()
        except ValueError:
            raise InputError("the body is not JSON", field="body") from None
        if not isinstance(body, dict):
            raise InputError("expected a JSON object", field="body")
        headers = {k.lower(): v for k, v in request.headers.items()}
        payload, report = await run_in_threadpool(
            _turn, engine, upstream, config, slots, caller, body, headers
        )
        header = {REPORT_HEADER: _report_header(report)}
        if not isinstance(payload, dict):  # the upstream's own stream, relayed
            return StreamingResponse(payload, media_type="text/event-stream", headers=header)
        if body.get("stream"):
            include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
            return StreamingResponse(
                _sse(payload, include_usage=include_usage),
                media_type="text/event-stream",
                headers=header,
            )
        return JSONResponse(payload, headers=header)

    install_agent_apis(app, engine, upstream, anthropic)  # /v1/responses, /v1/messages
    app.add_middleware(LimitsMiddleware, config=config.server)
    return app


def _turn(
    engine: Engine,
    upstream: LLMClient,
    config: ProxyConfig,
    slots: TurnSlots,
    caller: Principal,
    body: dict[str, Any],
    headers: Mapping[str, str],
) -> tuple[dict[str, Any] | Iterator[bytes], dict[str, Any]]:
    """One turn in its session's slot: the upstream body, or for a streamed request without
    tools the upstream's own events as they come (the slot is held until the stream ends)."""
    for name in body:
        if name.lower() in FORBIDDEN_FIELDS:
            raise InputError(
                "the upstream is fixed by the proxy's configuration: remove this field",
                field=name,
            )
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise InputError("expected a non-empty list of messages", field="messages")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise InputError("missing: name the model", field="model")
    tools = body.get("tools") or []
    session = session_of(headers, body)
    ticket = slots.enqueue(f"{caller.tenant}\x00{session}")
    ticket.wait(slots.timeout)
    try:
        turn = _prepare(engine, caller.tenant, session, body, model, tools)
        if body.get("stream") and not tools:
            outgoing = {**turn.outgoing, "stream": True}
            events = upstream.stream("chat/completions", outgoing)
            if events.body is None:
                return _relay(engine, turn, events, ticket), turn.report()
            payload = events.body  # the upstream did not stream: sent on as events
            answer = ((payload.get("choices") or [{}])[0] or {}).get("message")
            if isinstance(answer, dict):
                turn.store_reply(engine, answer)
            report = turn.report()
        else:
            payload, report = _finish(engine, upstream, config, turn, model, tools)
    except BaseException:
        ticket.release()
        raise
    ticket.release()
    return payload, report


@dataclass
class _Turn:
    tenant: str
    session: str
    ids: _Ids
    context: Context
    ingested: Mapping[str, int]
    outgoing: dict[str, Any]
    received: int

    def report(self, **extra: Any) -> dict[str, Any]:
        return {
            "session": self.session,
            "model": self.context.report.model,
            "tokens": self.context.tokens,
            "cap": self.context.report.cap,
            "window": self.context.report.window,
            "included": len(self.context.included),
            "sent_messages": len(self.context.messages),
            "received_messages": self.received,
            "ingested": dict(self.ingested),
            **extra,
        }

    def store_reply(self, engine: Engine, message: Mapping[str, Any]) -> None:
        reply = _record(message, self.ids.next(message))
        if reply is not None:
            reply["role"] = "assistant"
            engine.ingest([reply], tenant=self.tenant, session=self.session)


def _prepare(
    engine: Engine,
    tenant: str,
    session: str,
    body: dict[str, Any],
    model: str,
    tools: Sequence[Mapping[str, Any]],
) -> _Turn:
    """Ingest the new messages and assemble the context to send."""
    messages = body["messages"]
    system_parts: list[str] = []
    records: list[dict[str, Any]] = []
    ids = _Ids(session)
    query: str | None = None
    for index, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise InputError("expected an object", field=f"messages[{index}]")
        role = message.get("role")
        if role in ("system", "developer"):
            system_parts.append(_text(message.get("content")))
            continue
        record = _record(message, ids.next(message))
        if record is not None:
            records.append(record)
        if role == "user":
            query = _text(message.get("content")).strip() or query
    ingested = engine.ingest(records, tenant=tenant, session=session)
    system = "\n\n".join(p for p in system_parts if p.strip()) or None
    context = engine.assemble(
        session=session, query=query, model=model, system=system, tools=tools, tenant=tenant
    )
    outgoing = {k: v for k, v in body.items() if k not in ("stream", "user")}
    if not body.get("stream"):
        outgoing.pop("stream_options", None)
    outgoing["messages"] = list(context.messages)
    outgoing["stream"] = False
    return _Turn(
        tenant=tenant,
        session=session,
        ids=ids,
        context=context,
        ingested=ingested.counts,
        outgoing=outgoing,
        received=len(messages),
    )


def _finish(
    engine: Engine,
    upstream: LLMClient,
    config: ProxyConfig,
    turn: _Turn,
    model: str,
    tools: Sequence[Mapping[str, Any]],
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Ask upstream (not streamed), check the tool calls, store the reply."""
    turn.outgoing.pop("stream_options", None)
    started = time.perf_counter()
    payload = upstream.post("chat/completions", turn.outgoing)
    upstream_ms = round((time.perf_counter() - started) * 1000, 1)
    tool_report: dict[str, Any] | None = None
    choices = payload.get("choices")
    first: dict[str, Any] = {}
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        first = choices[0]
    answer = first.get("message")
    if isinstance(answer, dict) and answer.get("tool_calls"):
        tool_report = _check_tool_calls(upstream, config, model, answer, tools, first)
    if isinstance(answer, dict):
        turn.store_reply(engine, answer)
    report = turn.report(upstream_ms=upstream_ms)
    if tool_report is not None:
        report["tool_calls"] = tool_report
    return payload, report


def _relay(engine: Engine, turn: _Turn, events: ChunkStream, ticket: Ticket) -> Iterator[bytes]:
    """Pass the upstream's events through as they come; store the reply text at the end."""
    parts: list[str] = []
    try:
        for data in events:
            try:
                chunk = json.loads(data)
            except ValueError:
                chunk = None
            if isinstance(chunk, dict):
                for choice in chunk.get("choices") or []:
                    delta = choice.get("delta") if isinstance(choice, dict) else None
                    if isinstance(delta, dict) and choice.get("index", 0) == 0:
                        content = delta.get("content")
                        if isinstance(content, str):
                            parts.append(content)
            yield b"data: " + data.encode() + b"\n\n"
        yield b"data: [DONE]\n\n"
        if parts:
            turn.store_reply(engine, {"role": "assistant", "content": "".join(parts)})
    finally:
        events.close()
        ticket.release()


def _check_tool_calls(
    upstream: LLMClient,
    config: ProxyConfig,
    model: str,
    message: dict[str, Any],
    tools: Sequence[Mapping[str, Any]],
    choice: dict[str, Any],
) -> dict[str, Any]:
    """Check, repair, re-ask and gate the reply's calls in place; the report of what was done."""
    raw_calls = message.get("tool_calls") or []
    calls = [ToolCall.from_openai(c) for c in raw_calls]
    report = check_reply(calls, tools, destructive=config.destructive)
    checks = list(report.calls)
    reasks: list[dict[str, Any]] = []
    if config.reask:
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
                destructive=config.destructive,
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


def _sse(payload: Mapping[str, Any], *, include_usage: bool) -> Iterator[bytes]:
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
