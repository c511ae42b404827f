"""The HTTP API over one :class:`~ctxwarden.engine.Engine` (FastAPI, served by uvicorn).

Endpoints (OpenAPI schema at ``/openapi.json``)::

    GET    /health                      liveness
    POST   /v1/ingest                   {"records": [...], "session"?, "user"?} -> outcomes
    POST   /v1/assemble[?report=full]   {"session", "user"?, "scope"?, "query"?, ...} -> context
    POST   /v1/search                   {"query", "session"?, "user"?, "scope"?, "limit"?} -> hits
    GET    /v1/memories/{id}[?user=&session=]  one memory (404 outside that user/session)
    GET    /v1/pins?session=&user=&scope=      pinned memories and facts visible in a scope
    POST   /v1/memories/{id}/pin[?scope=]      pin (for its session, its user or the tenant)
    POST   /v1/memories/{id}/unpin      unpin
    PATCH  /v1/memories/{id}[?user=&session=]  {"content"} -> edited (old text kept as a version)
    GET    /v1/memories/{id}/versions   the texts edits replaced, oldest first
    GET    /v1/memories/{id}/sources[?user=&session=]  a summary's archived originals, or an
                                        offloaded tool result (Engine.expand)
    DELETE /v1/memories/{id}[?user=&session=]  erase (and summaries built from it)
    DELETE /v1/sessions/{session}       erase a session's memories and inclusion log
    DELETE /v1/tenant                   erase every memory of the caller's tenant
    GET    /v1/stats?session=&user=&scope=  counts
    POST   /v1/compact/plan             {"older_than"?, "access_threshold"?, "max_summary_share"?,
                                         "keep_originals"?, "archive_days"?,
                                         "lossless_packs"?, "min_pack_saving"?}
                                        -> plan (reads only)
    POST   /v1/compact/apply            same body -> summaries written, memories compacted
    GET    /metrics                     Prometheus metrics (latency, budget use, de-dup)

The API key's tenant is the hard boundary; within it, ``user`` (the end user) and ``session``
name whose memories a read sees, the narrowest named by default (:mod:`ctxwarden.scope`).

Errors from the error tree map to status codes in :data:`STATUS_BY_ERROR` (one table), bodies
above ``max_body_bytes`` get 413, and when ``max_concurrency`` requests are already running the
next one gets 429 with ``Retry-After`` rather than queueing without bound.

>>> from ctxwarden import Engine
>>> app = create_app(Engine.open(":memory:"))
>>> app.title
'ctxwarden'
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from typing import Annotated, Any, Literal

import anyio.to_thread
import orjson
from fastapi import FastAPI, Query, Request, params
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi.routing import APIRoute
from pydantic import Field
from starlette.middleware.body_limit import MAX_BODY_SIZE_SCOPE_KEY
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ctxwarden.compact import CompactionPolicy
from ctxwarden.engine import Engine
from ctxwarden.errors import CtxwardenError, InputError
from ctxwarden.models import remote_tokenizer

# The caller and its credentials live in ctxwarden.server.access; the ``X as X`` names are
# re-exported for the faces that build on this API (auth, proxy, agent APIs, MCP, the CLI).
from ctxwarden.server.access import SCOPES as SCOPES
from ctxwarden.server.access import (
    STATUS_BY_ERROR,
    CallerCredentials,
    ServerConfig,
    client_message,
    credentials_of,
    error_field,
    retry_after,
    status_for,
)
from ctxwarden.server.access import Caller as Caller
from ctxwarden.server.access import Credentials as Credentials
from ctxwarden.server.access import Principal as Principal
from ctxwarden.server.access import principal_of as principal_of
from ctxwarden.server.guard import ingest_view, memory_view, require_metrics_access
from ctxwarden.server.metrics import CONTENT_TYPE, Metrics
from ctxwarden.server.surface import StrictBody, install, validation_error_body
from ctxwarden.types import Context

__all__ = ["STATUS_BY_ERROR", "ServerConfig", "context_body", "create_app", "status_for"]

log = logging.getLogger(__name__)


# -- ASGI middleware: body limit and concurrency gate ------------------------------------------


class _BodyTooLargeError(Exception):
    pass


async def _send_json(send: Send, status: int, body: dict[str, Any], headers: Any = ()) -> None:
    data = json.dumps(body).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(data)).encode()),
                *headers,
            ],
        }
    )
    await send({"type": "http.response.body", "body": data})


class LimitsMiddleware:
    """Refuse bodies over ``max_body_bytes`` (413) and requests over the concurrency cap (429).

    The gate is a counter, not a queue: an overloaded server answers at once and the client
    retries after ``Retry-After`` seconds. ``/health`` bypasses the gate.
    """

    def __init__(self, app: ASGIApp, config: ServerConfig, metrics: Metrics | None = None) -> None:
        self.app = app
        self.config = config
        self.metrics = metrics
        self._lock = threading.Lock()
        self.running = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.config.max_body_bytes
        for name, value in scope.get("headers", ()):
            if name == b"content-length" and value.isdigit() and int(value) > limit:
                self._reject("body_too_large")
                await _send_json(send, 413, _too_large(limit))
                return
        if scope.get("path") in ("/health", "/metrics"):
            await self.app(scope, receive, send)
            return
        with self._lock:
            if self.running >= self.config.max_concurrency:
                busy = True
            else:
                busy = False
                self.running += 1
        if busy:
            self._reject("overloaded")
            retry = str(self.config.retry_after_seconds).encode()
            await _send_json(
                send,
                429,
                {"error": {"type": "Overloaded", "message": "server busy: retry after a moment"}},
                [(b"retry-after", retry)],
            )
            return
        received = 0
        started = False
        over = False
        status = 500
        began = time.perf_counter()

        async def limited_receive() -> Message:
            nonlocal received, over
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    over = True
                    raise _BodyTooLargeError
            return message

        async def tracking_send(message: Message) -> None:
            # the framework may turn the failed body read into its own error response: the
            # client gets the 413 instead
            nonlocal started, status
            if over:
                if message["type"] == "http.response.start" and not started:
                    started = True
                    await _send_json(send, 413, _too_large(limit))
                return
            if message["type"] == "http.response.start":
                started = True
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, limited_receive, tracking_send)
        except _BodyTooLargeError:
            if not started:
                started = True
                await _send_json(send, 413, _too_large(limit))
        finally:
            with self._lock:
                self.running -= 1
            if over:
                self._reject("body_too_large")
            elif self.metrics is not None:
                route = scope.get("route")
                name = getattr(route, "path", None) or "unmatched"
                self.metrics.observe_request(name, status, time.perf_counter() - began)

    def _reject(self, reason: str) -> None:
        if self.metrics is not None:
            self.metrics.rejected.labels(reason=reason).inc()


def _too_large(limit: int) -> dict[str, Any]:
    return {
        "error": {
            "type": "PayloadTooLarge",
            "message": f"request body over {limit} bytes: send smaller batches",
        }
    }


# -- request and response bodies ---------------------------------------------------------------


class IngestBody(StrictBody):
    """Records to ingest (the fields of :class:`~ctxwarden.types.Record`)."""

    records: list[dict[str, Any]]
    session: str | None = None
    #: The end user of records that name none.
    user: str | None = None


ScopeName = Literal["session", "user", "tenant"]


class AssembleBody(StrictBody):
    """Arguments of :meth:`Engine.assemble`."""

    session: str
    user: str | None = None
    scope: ScopeName | None = None
    query: str | None = None
    model: str | None = None
    budget: int | None = Field(default=None, ge=1)
    system: str | None = None
    tools: list[dict[str, Any]] | None = None
    channel: str | None = None
    items: dict[str, list[str]] | None = None
    #: A ``TOKENIZER_NAMES`` entry; ``gguf:`` paths only from the server's configuration.
    tokenizer: str | None = None
    #: The model's window in tokens, when the registry's is not the one served.
    window: int | None = None


class SearchBody(StrictBody):
    """A full-text query."""

    query: str
    limit: int = Field(default=20, ge=1, le=200)
    session: str | None = None
    user: str | None = None
    scope: ScopeName | None = None


class EditBody(StrictBody):
    """The new text of a memory (:meth:`Engine.update`)."""

    content: str


class CompactBody(StrictBody):
    """Which memories compaction takes: older than ``older_than`` seconds and with a decayed
    access score below ``access_threshold``; a summary may keep at most ``max_summary_share``
    of its cluster's tokens (a cluster whose facts need more is left alone, or with
    ``lossless_packs`` kept whole in one summary when that saves ``min_pack_saving`` of its
    estimated store bytes). ``keep_originals="archive"`` keeps the originals compressed for
    ``archive_days`` (``GET /v1/memories/{id}/sources`` returns them); ``"delete"`` removes
    them. A field left out is the server's setting (``compact_older_than``, ``keep_originals``,
    ``archive_days``, ``compact_*``; the library's :class:`CompactionPolicy` defaults when
    unset: 14 days, delete, lossless packs on)."""

    older_than: float | None = Field(default=None, ge=0)
    access_threshold: float | None = Field(default=None, ge=0)
    max_summary_share: float | None = Field(default=None, gt=0, lt=1)
    keep_originals: Literal["delete", "archive"] | None = None
    archive_days: float | None = Field(default=None, gt=0)
    lossless_packs: bool | None = None
    min_pack_saving: float | None = Field(default=None, gt=0, lt=1)

    def policy(self, base: CompactionPolicy | None = None) -> CompactionPolicy:
        """The :class:`CompactionPolicy` this body asks for: ``base`` (the server's) with the
        fields given in place."""
        given = self.model_dump(exclude_none=True)
        return dataclasses.replace(base or CompactionPolicy(), **given)


#: orjson refuses what ``json.dumps`` would write differently or refuse (subclasses of str,
#: int, dict and list such as enums or numpy scalars, dataclasses, datetimes): ``_json`` then
#: falls back to ``json.dumps``
_ORJSON_AS_JSON = (
    orjson.OPT_PASSTHROUGH_SUBCLASS
    | orjson.OPT_PASSTHROUGH_DATACLASS
    | orjson.OPT_PASSTHROUGH_DATETIME
)


def _json(body: Any) -> Response:
    """A JSON response serialised in one ``orjson.dumps`` call.

    Endpoint results are plain JSON values already (``to_dict()``); FastAPI's default path
    (``jsonable_encoder`` over the whole tree, then a dump) took about four times as long for
    an assembled context with its report (bench/serve.py), and ``json.dumps`` took 60 us for
    an assemble of budget 4000 (11 kB) and 95 us for 20 search hits, orjson 2.5 and 7.5 us,
    the same bytes but for the spelling of floats below 1e-4 (``0.00001``, not ``1e-05``).
    What orjson refuses (integers beyond 64 bits, keys that are not strings) goes through
    ``json.dumps`` as before. (orjson writes a NaN as ``null`` where ``json.dumps`` refused
    it; no response holds one: tool call arguments, the one free-form part, are stored as
    text.)
    """
    try:
        data = orjson.dumps(body, option=_ORJSON_AS_JSON)
    except orjson.JSONEncodeError:
        text = json.dumps(body, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
        data = text.encode("utf-8")
    return Response(data, media_type="application/json")


def context_body(context: Context, *, full: bool) -> dict[str, Any]:
    """The JSON of an assembled context. Without ``full`` the report leaves out the list of
    retrieval candidates and says how many there were (``candidate_count``)."""
    if full:
        return context.to_dict()
    count = len(context.report.candidates)
    body = dataclasses.replace(context, report=dataclasses.replace(context.report, candidates=()))
    shaped = body.to_dict()
    del shaped["report"]["candidates"]
    shaped["report"]["candidate_count"] = count
    return shaped


def _error_body(exc: CtxwardenError) -> dict[str, Any]:
    body: dict[str, Any] = {"type": type(exc).__name__, "message": client_message(exc)}
    field_name = error_field(exc)
    if field_name is not None:
        body["field"] = field_name
    return {"error": body}


# -- the hot endpoints' request handler ---------------------------------------------------------

_IMMUTABLE_DEFAULTS = (str, int, float, bool, type(None))


class _DirectRoute(APIRoute):
    """A route that, for a plain request, skips FastAPI's general request machinery.

    The endpoint, its parameters and its OpenAPI description are FastAPI's as declared; only
    how a request reaches the endpoint changes, and only for a route of the one shape the hot
    endpoints have (one JSON body model, the :func:`credentials_of` dependency, optional query
    parameters, a :class:`Response` returned). A request with ``content-type:
    application/json``, no query string and a body that parses and validates calls the
    endpoint directly: the same ``json.loads``, the same validator of the body field, the same
    dependency, in the same order (body parsed, credentials, body validated), and its errors
    go to the app's exception handlers as before. Any other request (another content type, a
    query string, an empty, malformed or invalid body, a disconnect, dependency overrides)
    goes to FastAPI's own route app with the body messages replayed, so every other answer a
    client can see is FastAPI's. FastAPI's path (a Request, two exit stacks, dependency
    solving, content-type parsing, telemetry hooks, exception wrappers) cost about as much CPU
    as the rest of the server's part of a request.
    """

    def __init__(self, path: str, endpoint: Callable[..., Any], **kwargs: Any) -> None:
        super().__init__(path, endpoint, **kwargs)
        if self._direct_shape():
            self.app = self._direct_app(self.app)

    def _direct_shape(self) -> bool:
        dependant = self.dependant
        call = dependant.call
        body_field = self.body_field
        return (
            body_field is not None
            and call is not None
            and inspect.iscoroutinefunction(call)
            and not self._embed_body_fields
            and len(dependant.body_params) == 1
            and not isinstance(body_field.field_info, params.Form)
            and not (dependant.path_params or dependant.header_params or dependant.cookie_params)
            and dependant.request_param_name is None
            and dependant.response_param_name is None
            and dependant.background_tasks_param_name is None
            and dependant.security_scopes_param_name is None
            and self.response_field is None
            and self.max_body_size is None
            and len(dependant.dependencies) == 1
            and dependant.dependencies[0].call is credentials_of
            and dependant.dependencies[0].name is not None
            and all(
                not q.field_info.is_required()
                and not q.field_info.validate_default
                and isinstance(q.field_info.default, _IMMUTABLE_DEFAULTS)
                for q in dependant.query_params
            )
        )

    def _direct_app(self, general: ASGIApp) -> ASGIApp:
        endpoint = self.dependant.call
        body_field = self.body_field
        assert endpoint is not None
        assert body_field is not None
        body_name = body_field.name
        dependency_name = str(self.dependant.dependencies[0].name)
        defaults = {q.name: q.field_info.default for q in self.dependant.query_params}
        overrides = self.dependency_overrides_provider
        validate = body_field.validate
        loc = ("body",)
        path = self.path

        async def app(scope: Scope, receive: Receive, send: Send) -> None:
            if (
                scope["query_string"]
                or MAX_BODY_SIZE_SCOPE_KEY in scope
                or (overrides is not None and getattr(overrides, "dependency_overrides", None))
            ):
                await general(scope, receive, send)
                return
            content_type = None
            for name, value in scope["headers"]:
                if name == b"content-type":
                    content_type = value  # the first, as Starlette's Headers.get
                    break
            if content_type != b"application/json":
                await general(scope, receive, send)
                return
            received: list[Message] = []
            while True:
                message = await receive()
                received.append(message)
                if message["type"] != "http.request" or not message.get("more_body", False):
                    break

            async def replay() -> Message:
                return received.pop(0) if received else await receive()

            if received[-1]["type"] != "http.request":
                await general(scope, replay, send)  # a disconnect: FastAPI's handling
                return
            raw = b"".join(m.get("body", b"") for m in received)
            if not raw:
                await general(scope, replay, send)
                return
            try:
                data = json.loads(raw)
            except Exception:
                await general(scope, replay, send)  # FastAPI's answer (422 for malformed JSON)
                return
            caller = await credentials_of(Request(scope, receive, send))
            body, errors = validate(data, {}, loc=loc)
            if errors:
                await general(scope, replay, send)  # FastAPI's 422 naming the field
                return
            result = await endpoint(**defaults, **{body_name: body, dependency_name: caller})
            if not isinstance(result, Response):
                raise TypeError(f"{path}: the endpoint must return a Response")
            await result(scope, receive, send)

        return app


def create_app(engine: Engine, config: ServerConfig | None = None) -> FastAPI:
    """The FastAPI application serving ``engine``. Run it with uvicorn."""
    config = config or ServerConfig()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        anyio.to_thread.current_default_thread_limiter().total_tokens = config.threads
        yield

    app = FastAPI(
        lifespan=lifespan,
        # /docs and /redoc are served by surface.install from packaged assets (no CDN)
        docs_url=None,
        redoc_url=None,
        title="ctxwarden",
        version="0.1.0",
        description="Context and memory engine for long-lived LLM agents.",
        # FastAPI's OpenTelemetry hooks checked the (unconfigured) global providers on every
        # request; the server's metrics are its own Prometheus registry (/metrics)
        telemetry={"tracing": False, "metrics": False, "logs": False},
    )
    app.router.route_class = _DirectRoute
    app.state.engine = engine
    app.state.config = config
    metrics = Metrics(engine.log_counters, engine.compactor.stats)
    app.state.metrics = metrics
    local = Principal(tenant=engine.config.tenant, scopes=frozenset(SCOPES))
    # idle threads end when the app is collected (ThreadPoolExecutor's own weak reference)
    workers = ThreadPoolExecutor(config.threads, thread_name_prefix="ctxwarden-http")
    app.state.workers = workers
    app.state.local_credentials = Credentials(
        token=None, authenticate=lambda _token: local, workers=workers
    )

    @app.exception_handler(CtxwardenError)
    async def _ctxwarden_error(request: Request, exc: CtxwardenError) -> JSONResponse:
        status = status_for(exc)
        if status >= 500:
            log.error("%s %s failed: %s", request.method, request.url.path, type(exc).__name__)
        headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
        retry = retry_after(exc, config.retry_after_seconds)
        if retry is not None:
            headers = {"Retry-After": retry}
        return JSONResponse(_error_body(exc), status_code=status, headers=headers)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        return JSONResponse(validation_error_body(exc), status_code=422)

    @app.get("/health")
    async def health() -> dict[str, str]:
        """Liveness: the process answers."""
        return {"status": "ok"}

    # Every endpoint below is async and does all its work, the key check included, in one
    # worker thread (Credentials.run): no engine or store call runs on the event loop.

    @app.post("/v1/ingest")
    async def ingest(body: IngestBody, caller: CallerCredentials) -> Response:
        """Ingest records into the caller's tenant; all or nothing."""

        def work(principal: Principal) -> Response:
            for number, record in enumerate(body.records, start=1):
                if "tenant" in record and record["tenant"] != principal.tenant:
                    raise InputError(
                        "records cannot name another tenant: leave 'tenant' out",
                        field="tenant",
                        line=number,
                    )
            result = engine.ingest(
                body.records, tenant=principal.tenant, session=body.session, user=body.user
            )
            metrics.observe_ingest(result.counts)
            return _json(ingest_view(principal, result))

        return await caller.run("write", work)

    @app.post("/v1/assemble")
    async def assemble(
        body: AssembleBody,
        caller: CallerCredentials,
        report: Annotated[Literal["summary", "full"], Query()] = "summary",
    ) -> Response:
        """Assemble the context of one turn.

        The report says, per block, its budget, what it used and the ids it holds; with
        ``?report=full`` it also lists every retrieval candidate with its score components
        (hundreds for a large budget, most of the response).
        """

        def work(principal: Principal) -> Response:
            began = time.perf_counter()
            context = engine.assemble(
                session=body.session,
                query=body.query,
                model=body.model,
                budget=body.budget,
                system=body.system,
                tools=body.tools,
                channel=body.channel,
                items=body.items,
                tenant=principal.tenant,
                tokenizer=remote_tokenizer(body.tokenizer),
                window=body.window,
                user=body.user,
                scope=body.scope,
            )
            metrics.observe_context(context, time.perf_counter() - began)
            return _json(context_body(context, full=report == "full"))

        return await caller.run("read", work)

    @app.post("/v1/search")
    async def search(body: SearchBody, caller: CallerCredentials) -> Response:
        """Full-text search of the caller's memories."""

        def work(principal: Principal) -> Response:
            hits = engine.search(
                body.query,
                tenant=principal.tenant,
                limit=body.limit,
                session=body.session,
                user=body.user,
                scope=body.scope,
            )
            return _json({"hits": [{"memory": m.to_dict(), "score": s} for m, s in hits]})

        return await caller.run("read", work)

    @app.get("/v1/memories/{memory_id}")
    async def get_memory(
        memory_id: str,
        caller: CallerCredentials,
        user: str | None = None,
        session: str | None = None,
    ) -> dict[str, Any]:
        """One memory by id (or the aggregate it was folded into); with ``user`` or
        ``session``, 404 unless it is that end user's or that session's."""
        return await caller.run(
            "read",
            lambda p: engine.get(memory_id, tenant=p.tenant, user=user, session=session).to_dict(),
        )

    @app.get("/v1/pins")
    async def pins(
        caller: CallerCredentials,
        session: str | None = None,
        user: str | None = None,
        scope: ScopeName | None = None,
    ) -> dict[str, Any]:
        """Pinned memories and facts visible in a scope (the narrowest named)."""
        return await caller.run(
            "read",
            lambda p: {
                "pins": [
                    m.to_dict()
                    for m in engine.pinned(tenant=p.tenant, session=session, user=user, scope=scope)
                ]
            },
        )

    @app.post("/v1/memories/{memory_id}/pin")
    async def pin(
        memory_id: str, caller: CallerCredentials, scope: ScopeName | None = None
    ) -> dict[str, Any]:
        """Pin a memory: it is then always offered to the pinned block of contexts in
        ``scope`` (its own session by default; ``user`` or ``tenant`` when asked)."""
        return await caller.run(
            "write",
            lambda p: memory_view(
                p, engine.pin(memory_id, pinned=True, tenant=p.tenant, scope=scope)
            ),
        )

    @app.post("/v1/memories/{memory_id}/unpin")
    async def unpin(memory_id: str, caller: CallerCredentials) -> dict[str, Any]:
        """Unpin a memory."""
        return await caller.run(
            "write", lambda p: memory_view(p, engine.pin(memory_id, pinned=False, tenant=p.tenant))
        )

    @app.patch("/v1/memories/{memory_id}")
    async def edit(
        memory_id: str,
        body: EditBody,
        caller: CallerCredentials,
        user: str | None = None,
        session: str | None = None,
    ) -> dict[str, Any]:
        """Replace a memory's text: stored and indexed again, the old text kept as a version
        (or erased, by configuration). With ``user`` or ``session``, 404 unless it is that end
        user's or session's."""
        return await caller.run(
            "write",
            lambda p: engine.update(
                memory_id, body.content, tenant=p.tenant, user=user, session=session
            ).to_dict(),
        )

    @app.get("/v1/memories/{memory_id}/versions")
    async def versions(memory_id: str, caller: CallerCredentials) -> dict[str, Any]:
        """The texts edits replaced in a memory, oldest first (404 if there is no memory)."""

        def work(principal: Principal) -> dict[str, Any]:
            engine.get(memory_id, tenant=principal.tenant)  # NotFound if there is none
            found = engine.versions(memory_id, tenant=principal.tenant)
            return {"id": memory_id, "versions": [v.to_dict() for v in found]}

        return await caller.run("read", work)

    @app.get("/v1/memories/{memory_id}/sources")
    async def sources(
        memory_id: str,
        caller: CallerCredentials,
        user: str | None = None,
        session: str | None = None,
    ) -> Response:
        """What a summary was made from (its originals, archived by compaction with
        ``keep_originals="archive"``) or an offloaded tool result's whole text; 404 when they
        are gone or outside that user/session, 422 when the id is neither."""

        def work(principal: Principal) -> dict[str, Any]:
            found = engine.expand(memory_id, tenant=principal.tenant, user=user, session=session)
            return {"id": memory_id, "sources": [m.to_dict() for m in found]}

        return _json(await caller.run("read", work))

    @app.delete("/v1/memories/{memory_id}")
    async def delete(
        memory_id: str,
        caller: CallerCredentials,
        user: str | None = None,
        session: str | None = None,
    ) -> dict[str, Any]:
        """Delete a memory; a content-free tombstone remains. With ``user`` or ``session``, 404
        unless it is that end user's or session's."""
        receipt = await caller.run(
            "delete",
            lambda p: engine.delete(memory_id, tenant=p.tenant, user=user, session=session),
        )
        return {"deleted": memory_id, "receipt": receipt.to_json()}

    @app.delete("/v1/sessions/{session}")
    async def delete_session(session: str, caller: CallerCredentials) -> dict[str, Any]:
        """Erase a session: its memories, the summaries built from them, its inclusion log."""
        receipt = await caller.run(
            "delete", lambda p: engine.erase_session(session, tenant=p.tenant)
        )
        return {"session": session, "deleted": len(receipt.rowids), "receipt": receipt.to_json()}

    @app.delete("/v1/tenant")
    async def delete_tenant(caller: CallerCredentials) -> dict[str, Any]:
        """Erase every memory of the caller's tenant and revoke its API keys (this one too)."""

        def erase(p: Principal) -> dict[str, Any]:
            receipt = engine.erase_tenant(tenant=p.tenant)
            return {
                "tenant": p.tenant,
                "deleted": len(receipt.rowids),
                "receipt": receipt.to_json(),
            }

        return await caller.run("delete", erase)

    @app.get("/v1/stats")
    async def stats(
        caller: CallerCredentials,
        session: str | None = None,
        user: str | None = None,
        scope: ScopeName | None = None,
    ) -> dict[str, Any]:
        """Counts of the caller's tenant, of the narrowest scope named."""
        return await caller.run(
            "read",
            lambda p: engine.stats(tenant=p.tenant, session=session, user=user, scope=scope),
        )

    # A compact request's unset fields are the server's settings (Settings.compaction_policy).
    server_policy = engine.config.compact_policy

    @app.post("/v1/compact/plan")
    async def compact_plan(body: CompactBody, caller: CallerCredentials) -> dict[str, Any]:
        """What compaction would do now in the caller's tenant (reads only)."""
        return await caller.run(
            "read",
            lambda p: engine.compact_plan(
                policy=body.policy(server_policy), tenant=p.tenant
            ).to_dict(),
        )

    @app.post("/v1/compact/apply")
    async def compact_apply(body: CompactBody, caller: CallerCredentials) -> dict[str, Any]:
        """Compact the caller's old, unused memories into summaries (extractive, offline),
        one transaction per cluster; originals leave tombstones. Needs the delete scope. 409
        while another compactor (a scheduled run, here or in another process) is running."""

        def work(principal: Principal) -> dict[str, Any]:
            with engine.compactor.lease():
                plan = engine.compact_plan(
                    policy=body.policy(server_policy), tenant=principal.tenant
                )
                result = engine.compact(plan)
            metrics.observe_compaction(len(result.summaries), result.compacted)
            return {
                "summaries": list(result.summaries),
                "compacted": result.compacted,
                "already_done": result.already_done,
                "stale": result.stale,
                "left_alone": result.left_alone,
                "tokens_saved": result.tokens_saved,
            }

        return await caller.run("delete", work)

    @app.get("/metrics", include_in_schema=False)
    def metrics_endpoint(request: Request) -> Response:
        """Prometheus metrics (no tenant data: counts and latencies only), for a loopback
        client or a key with the read scope (:mod:`ctxwarden.server.guard`)."""
        require_metrics_access(request.client, lambda: principal_of(request))
        return Response(metrics.render(), media_type=CONTENT_TYPE)

    install(app)  # 404/405 in our error shape, strict query strings, response models, /docs
    app.add_middleware(LimitsMiddleware, config=config, metrics=metrics)
    return app
