"""An OpenAI-compatible proxy that fits an agent's conversation into the model's window.

``POST /v1/chat/completions`` (streamed or not), ``GET /v1/models``, ``GET /metrics``. For each
request the proxy:

1. checks the conversation against the chat schema (:mod:`ctxwarden.server.chatfit`): an
   unknown role, a malformed message, a ``tool`` message without its call or a call without its
   result gets 400 naming ``messages[i]...``, and nothing is stored (a body that continues
   one the caller sent is parsed, checked and counted only where it is new:
   :mod:`ctxwarden.server.proxybody`);
2. picks the tokenizer and window (:mod:`ctxwarden.server.windows`): the registry's, or the
   ``X-Ctxwarden-Tokenizer`` / ``X-Ctxwarden-Window`` headers, lowered to the window the upstream
   actually serves; an unknown model is counted with an over-estimating o200k, never refused;
3. fits it (:mod:`ctxwarden.fit`): a conversation that fits goes upstream as sent, every message
   the client's own; one that does not keeps its system messages first and its newest user turn
   and everything after it in order, and drops older turns oldest first, in large steps so the
   following requests only append (providers' prompt caches keep hitting); a tool call and its
   results are kept or dropped together;
4. remembers, only for a request that names an end user (``user`` or ``X-Ctxwarden-User``) or a
   session (``X-Ctxwarden-Session``): stores the new messages verbatim (those sent upstream
   while the upstream answers) and, when memory is on,
   inserts one retrieved-memory block after the system messages
   (:mod:`ctxwarden.server.proxymemory`). A request naming neither is only fitted: nothing is
   stored, nothing retrieved;
5. sends the request upstream with its other fields as sent: a streamed request without tools is
   streamed through event by event; a request with tools is asked unstreamed, because its tool
   calls are checked first (:func:`ctxwarden.toolcalls.check_reply`: repaired, re-asked once,
   destructive ones held for approval) and then sent as events if the agent asked to stream;
6. answers with the upstream body plus an ``x-ctxwarden-report`` header: the window and where it
   came from, the tokens, what was dropped, the memory block, what was stored, the provider's
   cached-token count, every repair and gate.

Upstream failures keep the upstream's status (a timeout is 504, an unreachable server 502) and a
body that never names the upstream's host or port. An upstream that answers "maximum context
length is N" teaches the proxy its window: the conversation is fitted again and sent once more.

The upstream URL and key come from configuration only: request fields that would redirect the
proxy (``api_base``, ``base_url``, ``api_key``...) are refused, the agent's ``Authorization``
header is never forwarded, and the client follows no redirects. Relayed ``tool`` messages are
stored unsigned, hence untrusted (:mod:`ctxwarden.provenance`), and the memory block quotes what
it holds as data.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Literal

import httpx
import orjson
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.background import BackgroundTask
from starlette.concurrency import run_in_threadpool

from ctxwarden.engine import Engine
from ctxwarden.errors import BudgetError, ConfigError, CtxwardenError, InputError, UpstreamError
from ctxwarden.fit import Fitted, fit
from ctxwarden.ingestion import collections_paused
from ctxwarden.llm import ChunkStream, LLMClient, UpstreamStatusError
from ctxwarden.llm_anthropic import AnthropicClient
from ctxwarden.server.access import client_message, retry_after
from ctxwarden.server.agents import install_agent_apis
from ctxwarden.server.chatfit import (
    Checked,
    Conversations,
    TokenCache,
    count_units,
    kept_messages,
    message_text,
)
from ctxwarden.server.guard import can_read, require_metrics_access
from ctxwarden.server.http import (
    Caller,
    LimitsMiddleware,
    Principal,
    ServerConfig,
    principal_of,
    status_for,
)
from ctxwarden.server.metrics import CONTENT_TYPE, Metrics
from ctxwarden.server.proxybody import Bodies
from ctxwarden.server.proxymemory import (
    SESSION_HEADER,
    USER_HEADER,
    Block,
    ProxyMemory,
    Who,
    who_of,
)
from ctxwarden.server.proxyoffload import offload_request
from ctxwarden.server.proxyreply import check_tool_calls, completion_events
from ctxwarden.server.proxyreport import ProxyMetrics, cached_tokens
from ctxwarden.server.windows import ModelChoice, Windows, window_from_error
from ctxwarden.sessions import Ticket, TurnSlots

__all__ = [
    "DEFAULT_MAX_BODY_BYTES",
    "FORBIDDEN_FIELDS",
    "REPORT_HEADER",
    "SESSION_HEADER",
    "USER_HEADER",
    "ProxyConfig",
    "create_proxy_app",
]

log = logging.getLogger(__name__)

#: Request fields that could point the proxy elsewhere or ask for its key: refused with 400.
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
REPORT_HEADER = "x-ctxwarden-report"
#: The proxy's default body limit: a 256k-token conversation with room to spare.
DEFAULT_MAX_BODY_BYTES = 32 << 20


def _proxy_server() -> ServerConfig:
    return ServerConfig(max_body_bytes=DEFAULT_MAX_BODY_BYTES)


@dataclass(frozen=True, kw_only=True, slots=True)
class ProxyConfig:
    """How the proxy behaves.

    ``destructive``: tool-name patterns (``fnmatch``, e.g. ``"delete_*"``) whose calls are held
    for approval. ``reask``: ask the model once to rewrite a call whose arguments cannot be
    repaired. ``memory``: store and retrieve for requests that name an end user or session (a
    request naming neither is never remembered). ``memory_tokens``: the largest memory block
    (kept free for it when a conversation has to be trimmed anyway). ``memory_refresh``:
    ``"cut"`` (default) changes the block only when the conversation's cut moves, so the
    prompt's prefix stays the same between cuts (prompt caches); ``"topic"`` also searches
    again for every new user message and changes the block when the search no longer finds
    any of its memories.
    ``keep_fraction``: when a conversation must be trimmed it is cut in steps of
    ``(1 - keep_fraction)`` of the cap (:func:`ctxwarden.fit.fit`). ``probe_window``: ask the
    upstream the window it serves. ``offload_tokens``: for a request that names an end user or
    session, a tool result over this many tokens is stored as a memory and replaced by a
    preview of ``offload_preview_chars`` characters naming its id (the MCP tool ``expand`` and
    ``GET /v1/memories/{id}/sources`` bring it back; :mod:`ctxwarden.server.proxyoffload`);
    None (default) keeps every conversation as sent. ``server``: body limit, concurrency gate
    and authentication;
    the default allows 32 MiB bodies (:data:`DEFAULT_MAX_BODY_BYTES`), a :class:`ServerConfig`
    of your own has its own default (1 MiB): pass ``max_body_bytes`` with it.
    """

    destructive: tuple[str, ...] = ()
    reask: bool = True
    memory: bool = True
    memory_tokens: int = 1024
    memory_refresh: Literal["cut", "topic"] = "cut"
    keep_fraction: float = 0.6
    probe_window: bool = True
    offload_tokens: int | None = None
    offload_preview_chars: int = 400
    server: ServerConfig = dataclasses.field(default_factory=_proxy_server)
    turn_slots: int = 8
    turn_timeout: float = 120.0

    def __post_init__(self) -> None:
        if self.memory_tokens < 0:
            raise ConfigError(f"memory_tokens: {self.memory_tokens} must not be negative")
        if self.memory_refresh not in ("cut", "topic"):
            raise ConfigError(f"memory_refresh: {self.memory_refresh!r} is not 'cut' or 'topic'")
        if self.offload_tokens is not None and (
            isinstance(self.offload_tokens, bool)
            or not isinstance(self.offload_tokens, int)
            or self.offload_tokens < 1
        ):
            raise ConfigError(
                f"offload_tokens: {self.offload_tokens!r} must be a positive number of tokens "
                "or None (off)"
            )
        if self.offload_preview_chars < 0:
            raise ConfigError(
                f"offload_preview_chars: {self.offload_preview_chars} must not be negative"
            )
        if not 0.0 <= self.keep_fraction < 1.0:
            raise ConfigError(f"keep_fraction: {self.keep_fraction} must be from 0 to below 1")


@dataclass
class _Proxy:
    """What every request shares."""

    engine: Engine
    upstream: LLMClient
    config: ProxyConfig
    slots: TurnSlots
    windows: Windows
    memory: ProxyMemory
    cache: TokenCache
    conversations: Conversations
    metrics: ProxyMetrics
    bodies: Bodies
    writer: ThreadPoolExecutor  # stores the messages sent upstream while it answers


def _openai_error(
    status: int, message: str, kind: str, *, code: str | None = None, param: str | None = None
) -> JSONResponse:
    error: dict[str, Any] = {"message": message, "type": kind, "code": code or status}
    if param is not None:
        error["param"] = param
    return JSONResponse({"error": error}, status_code=status)


def _report_header(report: Mapping[str, Any]) -> str:
    return json.dumps(report, separators=(",", ":"), ensure_ascii=True)


def _upstream_error(exc: UpstreamError) -> JSONResponse:
    """The upstream's failure with its status and message, never its host or port."""
    if isinstance(exc, UpstreamStatusError):
        return _openai_error(
            exc.status,
            f"upstream answered {exc.status}: {exc.detail}",
            "upstream_error",
            code=f"upstream_{exc.status}",
        )
    cause = exc.__cause__
    if isinstance(cause, httpx.TimeoutException):
        return _openai_error(
            504, "upstream: no answer in time; try again or raise the proxy's timeout",
            "upstream_timeout",
        )  # fmt: skip
    if isinstance(cause, httpx.HTTPError):
        return _openai_error(
            502, "upstream: the model server cannot be reached; check that it is running",
            "upstream_unreachable",
        )  # fmt: skip
    return _openai_error(
        502, "upstream: the model server's answer was not usable", "upstream_error"
    )


def create_proxy_app(
    engine: Engine,
    upstream: LLMClient,
    config: ProxyConfig | None = None,
    anthropic: AnthropicClient | None = None,
) -> Any:
    """The proxy application; ``upstream`` is the configured model server's client (chat
    completions and Responses), ``anthropic`` the Messages API upstream if there is one."""
    config = config or ProxyConfig()
    metrics = Metrics(engine.log_counters, engine.compactor.stats)
    proxy = _Proxy(
        engine=engine,
        upstream=upstream,
        config=config,
        slots=TurnSlots(config.turn_slots, timeout=config.turn_timeout),
        windows=Windows(upstream, engine.registry, probe=config.probe_window),
        memory=ProxyMemory(engine),
        cache=TokenCache(),
        conversations=Conversations(),
        metrics=ProxyMetrics(metrics),
        bodies=Bodies(),
        writer=ThreadPoolExecutor(
            max_workers=max(1, config.turn_slots), thread_name_prefix="ctxwarden-proxy-store"
        ),
    )
    app = FastAPI(title="ctxwarden proxy", version="0.1.0")
    app.state.slots = proxy.slots
    app.state.engine = engine
    app.state.config = config.server
    app.state.proxy = proxy

    @app.exception_handler(CtxwardenError)
    async def _error(request: Request, exc: CtxwardenError) -> JSONResponse:
        if isinstance(exc, UpstreamError):
            return _upstream_error(exc)
        if isinstance(exc, BudgetError):
            return _openai_error(
                400, str(exc), "invalid_request_error", code="context_length_exceeded"
            )
        if isinstance(exc, InputError):
            return _openai_error(400, str(exc), "invalid_request_error", param=exc.field)
        status = status_for(exc)
        if status >= 500:
            log.error("%s %s failed: %s", request.method, request.url.path, type(exc).__name__)
        response = _openai_error(status, client_message(exc), type(exc).__name__)
        if status == 401:
            response.headers["WWW-Authenticate"] = "Bearer"
        retry = retry_after(exc, config.server.retry_after_seconds)
        if retry is not None:
            response.headers["Retry-After"] = retry
        return response

    @app.get("/health")
    def health() -> dict[str, str]:
        """Liveness."""
        return {"status": "ok"}

    @app.get("/metrics")
    def metrics_endpoint(request: Request) -> Response:
        """Prometheus metrics: requests, fits, tokens sent, the provider's cached tokens; for a
        loopback client or a key with the read scope (:mod:`ctxwarden.server.guard`)."""
        require_metrics_access(request.client, lambda: principal_of(request))
        return Response(metrics.render(), media_type=CONTENT_TYPE)

    @app.get("/v1/models")
    def models(caller: Caller) -> dict[str, Any]:
        """The upstream's model list, as it sent it."""
        caller.require("read")
        return upstream.request("GET", "models")

    @app.post("/v1/chat/completions")
    async def chat(request: Request, caller: Caller) -> Response:
        """Fit the conversation, remember it when named, ask upstream, check tool calls."""
        caller.require("write")
        raw = await request.body()
        payload, report, stream, after = await run_in_threadpool(
            _turn, proxy, caller, raw, {k.lower(): v for k, v in request.headers.items()}
        )
        header = {REPORT_HEADER: _report_header(report)}
        # the reply is stored after the answer is sent (see _after)
        background = BackgroundTask(after) if after is not None else None
        if not isinstance(payload, dict):  # the upstream's own stream, relayed
            return StreamingResponse(
                payload, media_type="text/event-stream", headers=header, background=background
            )
        if stream is not None:
            return StreamingResponse(
                completion_events(payload, include_usage=stream),
                media_type="text/event-stream",
                headers=header,
                background=background,
            )
        return Response(
            orjson.dumps(payload),
            media_type="application/json",
            headers=header,
            background=background,
        )

    install_agent_apis(app, engine, upstream, anthropic)  # /v1/responses, /v1/messages
    app.add_middleware(LimitsMiddleware, config=config.server, metrics=metrics)
    return app


def _parse(body: dict[str, Any]) -> dict[str, Any]:
    for name in body:
        if name.lower() in FORBIDDEN_FIELDS:
            raise InputError(
                "the upstream is fixed by the proxy's configuration: remove this field",
                field=name,
            )
    if not isinstance(body.get("model"), str) or not body["model"]:
        raise InputError("missing: name the model", field="model")
    tools = body.get("tools")
    if tools is not None and (
        not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools)
    ):
        raise InputError("must be a list of tool objects", field="tools")
    options = body.get("stream_options")
    if options is not None:
        if not isinstance(options, dict):
            raise InputError(
                'must be an object such as {"include_usage": true}', field="stream_options"
            )
        if not isinstance(options.get("include_usage", False), bool):
            raise InputError("expected true or false", field="stream_options.include_usage")
    return body


def _requested_output(body: Mapping[str, Any]) -> int | None:
    for name in ("max_completion_tokens", "max_tokens"):
        value = body.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise InputError(f"must be a positive integer, got {value!r}", field=name)
        return value
    return None


@dataclass
class _Plan:
    """One fitted request: what goes upstream and the report's numbers."""

    outgoing: dict[str, Any]
    choice: ModelChoice
    cap: int
    fitted: Fitted
    block: Block | None
    block_kept: bool
    sent: int
    counted: int
    stored: dict[str, int]
    conversation_tokens: int  # what sending the whole conversation would cost
    offloaded: list[str] = dataclasses.field(default_factory=list)
    later: list[dict[str, Any]] = dataclasses.field(default_factory=list)  # stored in _turn


def _fit(
    proxy: _Proxy,
    who: Who,
    body: dict[str, Any],
    headers: Mapping[str, str],
    checked: Checked,
    remember: bool,
    offloaded: Sequence[dict[str, Any]] = (),
) -> _Plan:
    """Fit the conversation to the chosen window, with the memory block when there is one;
    ``offloaded``: the records of tool results offloaded from it, stored when it is."""
    messages: list[Any] = body["messages"]
    model: str = body["model"]
    choice = proxy.windows.choose(model, headers)
    fmt = choice.fmt
    limits = proxy.engine.config.policy.limits(window=choice.window, max_output=choice.max_output)
    cap = limits.cap
    requested = _requested_output(body)
    if requested is not None:
        cap = min(cap, choice.window - requested - limits.margin)
        if cap <= 0:
            field = "max_completion_tokens" if "max_completion_tokens" in body else "max_tokens"
            raise InputError(
                f"{requested} leaves no room for the prompt in a window of {choice.window}",
                field=field,
            )
    tools = body.get("tools") or []
    fixed = fmt.request_overhead(has_system=checked.leads[0] == "system")
    fixed += fmt.tools_tokens(choice.tokenizer, tools) if tools else 0
    units, counted, keys = count_units(messages, checked, fmt, proxy.cache, proxy.conversations)
    keep_fraction = proxy.config.keep_fraction
    whole = fixed + sum([u.tokens for u in units])  # what sending the whole conversation costs
    memory = remember and proxy.config.memory and proxy.config.memory_tokens > 0
    reserved = 0
    fitted: Fitted | None = None
    if memory and whole > cap:
        # A conversation that must be trimmed anyway is trimmed with room for the memory
        # block kept (a constant, so the cut points stay a function of the prefix): the block
        # never has to leave between two cuts for want of room.
        try:
            fitted = fit(
                units, cap=cap, fixed=fixed, keep_fraction=keep_fraction,
                memory_tokens=proxy.config.memory_tokens,
            )  # fmt: skip
            reserved = proxy.config.memory_tokens
        except BudgetError:
            pass  # the newest turn leaves no such room: the block gets what is left
    if fitted is None:
        fitted = fit(units, cap=cap, fixed=fixed, keep_fraction=keep_fraction)
    block: Block | None = None
    kept_block = False
    lead = 0
    while lead < len(units) and units[lead].kind == "system":
        lead += 1
    memory_at = units[lead - 1].stop if lead else 0
    # the conversation's own messages as sent: the system messages and the kept tail
    tail_from = units[fitted.dropped[-1]].stop if fitted.dropped else memory_at
    stored: dict[str, int] = {}
    later: list[dict[str, Any]] = []
    if remember:
        # only now: a request that cannot be fitted stores nothing. The messages that go
        # upstream are stored while the upstream answers (_turn): no memory block holds them
        # (they are in the prompt), so the block is the same whether they are stored yet or not.
        stored, _ = proxy.memory.remember(who, messages, keys, later=later, later_from=tail_from)
        if offloaded:
            for status, count in proxy.memory.store(who, list(offloaded)).items():
                stored[status] = stored.get(status, 0) + count
    if memory:
        exclude = proxy.memory.kept(who, memory_at, tail_from)
        question = next(
            (message_text(m.get("content")) for m in reversed(messages) if m["role"] == "user"),
            "",
        )
        room = min(proxy.config.memory_tokens, cap - fitted.tokens + reserved)
        cut = tail_from if proxy.config.memory_refresh == "cut" else None
        block, kept_block = proxy.memory.block(
            who, question, exclude=exclude, budget=room, fmt=fmt, cut=cut
        )
        # The block takes only the room kept for it, or else the room the fit left (then fit()
        # with its tokens would choose the same units: tests/test_fit.py), so the units stay
        # and the total stays within the cap.
        used = block.tokens if block is not None else 0
        fitted = dataclasses.replace(fitted, tokens=fitted.tokens - reserved + used)
    if fitted.unchanged and block is None:
        sent_messages = messages
    else:
        kept = kept_messages(messages, units, fitted.keep)
        sent_messages = (
            kept if block is None else [*kept[:memory_at], block.message(), *kept[memory_at:]]
        )
    outgoing = dict(body)
    outgoing["messages"] = sent_messages
    return _Plan(
        outgoing=outgoing,
        choice=choice,
        cap=cap,
        fitted=fitted,
        block=block,
        block_kept=kept_block,
        sent=len(sent_messages),
        counted=counted,
        stored=stored,
        conversation_tokens=whole,
        offloaded=[str(r["id"]) for r in offloaded],
        later=later,
    )


def _report(plan: _Plan, who: Who, received: int, started: float, **extra: Any) -> dict[str, Any]:
    """The ``x-ctxwarden-report`` header's content (``offloaded``: the ids of tool results
    replaced by previews, when any)."""
    choice = plan.choice
    fitted = plan.fitted
    report: dict[str, Any] = {
        "model": choice.model,
        "tokenizer": choice.tokenizer.name,
        "exact": choice.tokenizer.exact,
        "known_model": choice.known,
        "window": choice.window,
        "window_source": choice.window_source,
        "cap": plan.cap,
        "tokens": fitted.tokens,
        "conversation_tokens": plan.conversation_tokens,
        "unchanged": fitted.unchanged,
        "received_messages": received,
        "sent_messages": plan.sent,
        "dropped_turns": len(fitted.dropped),
        "counted_messages": plan.counted,
        "user": who.user,
        "session": who.session,
        "remembered": who.named,
        "stored": plan.stored,
        "memory": None
        if plan.block is None
        else {
            "scope": who.scope,
            "memories": len(plan.block.ids),
            "tokens": plan.block.tokens,
            "kept": plan.block_kept,
        },
        "notes": [*choice.notes, *fitted.notes],
        "proxy_ms": round((time.perf_counter() - started) * 1000, 2),
    }
    if plan.offloaded:
        report["offloaded"] = plan.offloaded
    report.update(extra)
    return report


def _turn(
    proxy: _Proxy, caller: Principal, raw: bytes, headers: Mapping[str, str]
) -> tuple[
    dict[str, Any] | Iterator[bytes], dict[str, Any], bool | None, Callable[[], None] | None
]:
    """One request: the upstream body (or its relayed events), the report, whether to send the
    body as events (None: as JSON; otherwise whether the client asked for usage), and what to
    do once the answer is sent (store the reply)."""
    started = time.perf_counter()
    with collections_paused():
        # read where it is new when it continues a body this caller sent (proxybody)
        read, learn = proxy.bodies.read(
            raw, (caller.tenant, headers.get(SESSION_HEADER), headers.get(USER_HEADER))
        )
        body = _parse(read)
        offloaded = offload_request(
            body,
            who_of(caller.tenant, headers, body, reads=can_read(caller)),
            headers,
            max_tokens=proxy.config.offload_tokens,
            preview_chars=proxy.config.offload_preview_chars,
            windows=proxy.windows,
            cache=proxy.cache,
        )
        checked = proxy.conversations.check(body.get("messages"))
    who = who_of(caller.tenant, headers, body, reads=can_read(caller))
    wants_stream = bool(body.get("stream"))
    tools = body.get("tools") or []
    # One turn per conversation at a time (its reply is stored before the next is fitted);
    # a request that names nobody is its own conversation.
    ticket = proxy.slots.enqueue(
        f"{who.tenant}\x00{who.user}\x00{who.session}" if who.named else uuid.uuid4().hex
    )
    ticket.wait(proxy.slots.timeout)
    handed = False  # to the relay of a stream, which releases it when the stream ends
    settle = _nothing
    try:
        with collections_paused():  # a big conversation is ~100k new objects: no GC passes
            plan = _fit(proxy, who, body, headers, checked, who.named, offloaded)
        settle = _store_later(proxy, who, plan)
        proxy.metrics.fits.labels(outcome="unchanged" if plan.fitted.unchanged else "trimmed").inc()
        proxy.metrics.sent_tokens.inc(plan.fitted.tokens)
        if plan.block is not None:
            proxy.metrics.memory_blocks.labels(kept=str(plan.block_kept).lower()).inc()
        if wants_stream and not tools:
            events = _send(proxy, who, body, headers, checked, plan, stream=True)
            assert isinstance(events, ChunkStream)
            settle()
            if events.body is None:
                report = _report(plan, who, len(body["messages"]), started)
                # the relay releases the ticket when the stream ends
                handed = True
                return _relay(proxy, who, events, ticket), report, None, learn
            payload = events.body  # the upstream did not stream: sent on as events
            proxy.metrics.observe_usage(payload.get("usage"))
            report = _report(plan, who, len(body["messages"]), started)
        else:
            payload, plan, upstream_ms = _ask(proxy, who, body, headers, checked, plan)
            settle()
            report = _report(
                plan, who, len(body["messages"]), started, upstream_ms=upstream_ms,
                cached_tokens=cached_tokens(payload.get("usage")),
            )  # fmt: skip
            report["proxy_ms"] = round(report["proxy_ms"] - upstream_ms, 2)
            tool_report = _checked(proxy, payload, body["model"], tools)
            if tool_report is not None:
                report["tool_calls"] = tool_report
        after = _after(proxy, who, payload)
    finally:
        try:
            settle()  # the upstream failed: still stored before the next turn is fitted
        finally:
            if not handed:
                ticket.release()
    stream: bool | None = None
    if wants_stream:
        stream = bool((body.get("stream_options") or {}).get("include_usage"))
    return payload, report, stream, _then(after, learn)


def _nothing() -> None:
    return None


def _store_later(proxy: _Proxy, who: Who, plan: _Plan) -> Callable[[], None]:
    """Store ``plan.later`` (the messages sent upstream, not stored yet) in another thread,
    while the upstream answers; the function returned waits for it (once) and adds its counts
    to ``plan.stored``. If storing fails, the conversation's stored state is forgotten, so the
    next request stores it again, and the error is raised."""
    if not plan.later:
        return _nothing
    future: Future[dict[str, int]] | None = proxy.writer.submit(proxy.memory.store, who, plan.later)

    def settle() -> None:
        nonlocal future
        if future is None:
            return
        pending, future = future, None
        try:
            counts = pending.result()
        except Exception:
            proxy.memory.reset(who)
            raise
        for status, count in counts.items():
            plan.stored[status] = plan.stored.get(status, 0) + count

    return settle


def _then(first: Callable[[], None] | None, second: Callable[[], None]) -> Callable[[], None]:
    def both() -> None:
        try:
            if first is not None:
                first()
        finally:
            second()

    return both


def _send(
    proxy: _Proxy,
    who: Who,
    body: dict[str, Any],
    headers: Mapping[str, str],
    checked: Checked,
    plan: _Plan,
    *,
    stream: bool,
) -> ChunkStream | dict[str, Any]:
    """Send ``plan`` upstream; on a context-length error that names a smaller window, learn it,
    fit again and send once more (``plan`` is updated in place)."""
    for attempt in (0, 1):
        outgoing = dict(plan.outgoing)
        if stream:
            outgoing["stream"] = True
        else:
            outgoing["stream"] = False
            outgoing.pop("stream_options", None)
        try:
            if stream:
                return proxy.upstream.stream("chat/completions", outgoing)
            return proxy.upstream.post("chat/completions", outgoing)
        except UpstreamStatusError as exc:
            served = window_from_error(exc.detail) if exc.status == 400 else None
            if attempt or served is None or served >= plan.choice.window:
                raise
            proxy.windows.learn(body["model"], served)
            refitted = _fit(proxy, who, body, headers, checked, who.named)
            refitted.offloaded = plan.offloaded  # stored by the first fit
            plan.__dict__.update(refitted.__dict__)
    raise AssertionError("unreachable")


def _ask(
    proxy: _Proxy,
    who: Who,
    body: dict[str, Any],
    headers: Mapping[str, str],
    checked: Checked,
    plan: _Plan,
) -> tuple[dict[str, Any], _Plan, float]:
    """Ask upstream unstreamed; the answer, the plan sent, and the upstream's milliseconds."""
    began = time.perf_counter()
    payload = _send(proxy, who, body, headers, checked, plan, stream=False)
    assert isinstance(payload, dict)
    proxy.metrics.observe_usage(payload.get("usage"))
    return payload, plan, round((time.perf_counter() - began) * 1000, 2)


def _answer(payload: Mapping[str, Any]) -> dict[str, Any] | None:
    choices = payload.get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        message = choices[0].get("message")
        if isinstance(message, dict):
            return message
    return None


def _after(proxy: _Proxy, who: Who, payload: Mapping[str, Any]) -> Callable[[], None] | None:
    """Storing the reply, to run once the answer is sent. Its id is fixed now, while the turn
    holds its slot: it is the id the client's echo of the reply gets, so if the next turn comes
    first (or the client hung up and this never runs), the echo stores it and this is known."""
    answer = _answer(payload)
    if answer is None or not who.named:
        return None
    record = proxy.memory.reply_record(who, answer)
    if record is None:
        return None

    def store() -> None:
        try:
            proxy.memory.store(who, [record])
        except CtxwardenError:
            log.exception("storing the reply failed; the client's echo of it will store it")

    return store


def _checked(
    proxy: _Proxy, payload: dict[str, Any], model: str, tools: Sequence[Mapping[str, Any]]
) -> dict[str, Any] | None:
    answer = _answer(payload)
    if answer is None or not answer.get("tool_calls"):
        return None
    first = payload["choices"][0]
    config = proxy.config
    return check_tool_calls(
        proxy.upstream, config.destructive, config.reask, model, answer, tools, first
    )


def _relay(proxy: _Proxy, who: Who, events: ChunkStream, ticket: Ticket) -> Iterator[bytes]:
    """Pass the upstream's events through as they come; store the reply text at the end."""
    parts: list[str] = []
    try:
        for data in events:
            try:
                chunk = orjson.loads(data)
            except orjson.JSONDecodeError:
                chunk = None
            if isinstance(chunk, dict):
                if chunk.get("usage") is not None:
                    proxy.metrics.observe_usage(chunk["usage"])
                for choice in chunk.get("choices") or []:
                    delta = choice.get("delta") if isinstance(choice, dict) else None
                    if isinstance(delta, dict) and choice.get("index", 0) == 0:
                        content = delta.get("content")
                        if isinstance(content, str):
                            parts.append(content)
            yield b"data: " + data.encode() + b"\n\n"
        yield b"data: [DONE]\n\n"
        if parts and who.named:
            proxy.memory.remember_reply(who, {"role": "assistant", "content": "".join(parts)})
    finally:
        events.close()
        ticket.release()
