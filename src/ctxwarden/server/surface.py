"""The HTTP API's surface: one error shape on every path, strict query strings, the response
models of ``/openapi.json``, and ``/docs`` served from assets inside an installed package.

- Every error, 404 and 405 included, is ``{"error": {"type", "message", ...}}``; a body that
  is not JSON names the line and column; an unknown body field (``extra="forbid"`` on every
  body model) or query parameter is a 422 naming it.
- The endpoints return pre-serialised JSON (``server.http._json``), so FastAPI cannot see
  their shape: :func:`openapi` adds the response models below to the generated schema.
- ``/docs`` (Swagger UI) and ``/redoc`` load their scripts from the ``fastapi-offline``
  package's copies (``/docs/assets/...``): nothing comes from a CDN.
- ``/ui`` is the dashboard (``ctxwarden/data/ui``: HTML, CSS and plain JavaScript over this
  API): a context's composition against its budget with every candidate and why it is in or
  out, the store's counts per channel and top folded families, its health over time, search,
  and a memory's record and history. The data routes only the dashboard needs are
  :mod:`ctxwarden.server.dashboard`'s router, included here.
"""

from __future__ import annotations

import json
from importlib import resources
from typing import Any, Literal

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.openapi.utils import get_openapi
from fastapi.responses import HTMLResponse, JSONResponse
from fastapi.routing import APIRoute
from fastapi.staticfiles import StaticFiles
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match
from starlette.types import ASGIApp, Receive, Scope, Send

from ctxwarden.server import dashboard

__all__ = [
    "RESPONSES",
    "StrictBody",
    "StrictQueryMiddleware",
    "install",
    "unparsable_body",
    "validation_error_body",
]

_ASSETS = "/docs/assets"

# -- request bodies ----------------------------------------------------------------------------


class StrictBody(BaseModel):
    """A request body that refuses fields it does not know (a typo such as ``querry`` is a 422
    naming the field, not a silently ignored value)."""

    model_config = ConfigDict(extra="forbid")


# -- errors ------------------------------------------------------------------------------------

_STATUS_TYPES = {
    400: "BadRequest",
    401: "AuthError",
    403: "ScopeError",
    404: "NotFound",
    405: "MethodNotAllowed",
    413: "PayloadTooLarge",
    415: "UnsupportedMediaType",
    429: "OverloadedError",
}


def _line_column(document: str, position: int) -> tuple[int, int]:
    line = document.count("\n", 0, position) + 1
    column = position - (document.rfind("\n", 0, position) + 1) + 1
    return line, column


def validation_error_body(exc: RequestValidationError) -> dict[str, Any]:
    """The error body of a request FastAPI could not validate: the first problem, with the
    field it concerns, or the line and column where the JSON stopped parsing."""
    errors = exc.errors()
    first = errors[0] if errors else {"loc": (), "msg": "invalid request", "type": "invalid"}
    if first.get("type") == "json_invalid":
        document = exc.body if isinstance(exc.body, str) else ""
        position = next((p for p in first.get("loc", ()) if isinstance(p, int)), 0)
        line, column = _line_column(document, position)
        context = first.get("ctx")
        reason = (context.get("error") if isinstance(context, dict) else None) or first.get(
            "msg", "invalid JSON"
        )
        return {
            "error": {
                "type": "InputError",
                "message": f"request body is not valid JSON: {reason} "
                f"(line {line}, column {column})",
                "line": line,
                "column": column,
            }
        }
    where = ".".join(str(p) for p in first.get("loc", ()) if p != "body")
    message = str(first.get("msg", "invalid"))
    if first.get("type") == "extra_forbidden":
        message = "unknown field: check its spelling against the API's schema (/docs)"
    if not where:  # the body as a whole: not an object, or missing
        where = "body"
        if first.get("type") in {"model_attributes_type", "dict_type"}:
            message = "expected a JSON object (send it with content-type: application/json)"
    return {
        "error": {
            "type": "InputError",
            "message": f"{where}: {message}" if where else message,
            "field": where,
        }
    }


def unparsable_body(cause: BaseException | None) -> dict[str, Any] | None:
    """Our error body for a request body FastAPI could not parse for a reason other than a
    JSON syntax error (its bare 400 "There was an error parsing the body"): bytes that are not
    UTF-8 (with the line and column of the first bad byte) or JSON nested too deeply."""
    if isinstance(cause, UnicodeDecodeError) and isinstance(cause.object, bytes):
        before = cause.object[: cause.start]
        line = before.count(b"\n") + 1
        column = len(before) - (before.rfind(b"\n") + 1) + 1
        message = (
            f"request body is not valid UTF-8: byte 0x{cause.object[cause.start]:02x} "
            f"(line {line}, column {column})"
        )
        detail = {"type": "InputError", "message": message, "line": line, "column": column}
        return {"error": {**detail, "field": "body"}}
    if isinstance(cause, RecursionError):
        message = "request body is JSON nested too deeply: flatten it"
        return {"error": {"type": "InputError", "message": message, "field": "body"}}
    return None


async def _http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    if exc.status_code == 400:
        unparsable = unparsable_body(exc.__cause__)
        if unparsable is not None:
            return JSONResponse(unparsable, status_code=422)
    kind = _STATUS_TYPES.get(exc.status_code, "HTTPError")
    detail = exc.detail if isinstance(exc.detail, str) else json.dumps(exc.detail)
    message = detail
    if exc.status_code == 404:
        message = f"no such path: {request.method} {request.url.path} (see /docs)"
    elif exc.status_code == 405:
        allowed = (exc.headers or {}).get("Allow") or (exc.headers or {}).get("allow")
        message = f"{request.method} is not allowed on {request.url.path}" + (
            f" (allowed: {allowed})" if allowed else ""
        )
    return JSONResponse(
        {"error": {"type": kind, "message": message}},
        status_code=exc.status_code,
        headers=dict(exc.headers or {}),
    )


class StrictQueryMiddleware:
    """Refuse a query parameter the matched endpoint does not declare (422 naming it).

    Only requests with a query string are looked at, so the hot endpoints' plain requests
    pay nothing.
    """

    def __init__(self, app: ASGIApp, routes: Any) -> None:
        self.app = app
        self.routes = routes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope.get("query_string"):
            await self.app(scope, receive, send)
            return
        request = Request(scope)
        for route in self.routes:
            if not isinstance(route, APIRoute):
                continue
            match, _ = route.matches(scope)
            if match != Match.FULL:
                continue
            known = {q.alias for q in route.dependant.query_params}
            unknown = sorted(set(request.query_params) - known)
            if unknown:
                body = {
                    "error": {
                        "type": "InputError",
                        "message": f"query.{unknown[0]}: unknown query parameter"
                        + (f" (known: {', '.join(sorted(known))})" if known else ""),
                        "field": f"query.{unknown[0]}",
                    }
                }
                await JSONResponse(body, status_code=422)(scope, receive, send)
                return
            break
        await self.app(scope, receive, send)


# -- response models (documentation of what the endpoints return) -----------------------------


class ErrorDetail(BaseModel):
    """What went wrong, and where when it is known."""

    type: str = Field(description="The error class, e.g. InputError, NotFound, AuthError.")
    message: str = Field(description="What is wrong and what to do next.")
    field: str | None = Field(default=None, description="The offending field, when known.")
    line: int | None = Field(default=None, description="The 1-based line, when known.")
    column: int | None = Field(default=None, description="The 1-based column (bad JSON).")


class ErrorResponse(BaseModel):
    """Every error, on every path."""

    error: ErrorDetail


class Outcome(BaseModel):
    """What happened to one record (``accepted`` is all a key without ``read`` is told)."""

    id: str
    status: Literal["stored", "edited", "duplicate", "near_duplicate", "known", "accepted"]
    duplicate_of: str | None = None
    reason: str | None = None


class IngestResponse(BaseModel):
    """One outcome per record, in order, and the counts per status."""

    outcomes: list[Outcome]
    counts: dict[str, int]


class MemoryModel(BaseModel):
    """A stored memory (times are ISO 8601, UTC)."""

    model_config = ConfigDict(extra="allow")

    id: str
    tenant: str
    session: str
    user: str | None = None
    channel: str | None = None
    author: str | None = None
    author_kind: str
    role: str
    content: str
    created_at: str
    thread_id: str | None = None
    reply_to: str | None = None
    kind: str
    pinned: bool
    dup_count: int
    last_seen_at: str
    access_count: int
    access_score: float
    source_ids: list[str] = []


class BlockModel(BaseModel):
    """One block of a context: its budget, what it used, the ids it holds."""

    model_config = ConfigDict(extra="allow")

    name: str
    budget: int
    used: int
    items: list[str]
    note: str | None = None


class ReportModel(BaseModel):
    """Why the context is what it is (``?report=full`` adds every candidate)."""

    model_config = ConfigDict(extra="allow")

    model: str
    tokenizer: str
    exact: bool
    window: int
    reserve: int
    margin: int
    cap: int
    tokens: int
    fixed: dict[str, int]
    blocks: list[BlockModel]
    candidate_count: int | None = None
    candidates: list[dict[str, Any]] | None = None
    notes: list[str] = []
    lexical_only: list[str] = []
    retrieval: dict[str, float] = Field(
        default={},
        description="How retrieval was sized for this context (empty without a query): "
        "related_tokens, candidates, author_candidates, anchors, rrf_k.",
    )


class ContextResponse(BaseModel):
    """An assembled context: chat messages to send, within the budget."""

    id: str = Field(description="The context id (its inclusion log).")
    messages: list[dict[str, Any]] = Field(description="OpenAI-style chat messages.")
    included: list[str] = Field(description="Ids of the memories included.")
    tokens: int = Field(description="The prompt's tokens by the model's tokenizer.")
    report: ReportModel


class Hit(BaseModel):
    """A search hit."""

    memory: MemoryModel
    score: float


class SearchResponse(BaseModel):
    """Hits, best first."""

    hits: list[Hit]


class PinsResponse(BaseModel):
    """Pinned memories and facts visible in the scope, oldest first."""

    pins: list[MemoryModel]


class EditedResponse(BaseModel):
    """What an edit did: ``edited`` (the text replaced) or ``known`` (the same text)."""

    id: str
    status: Literal["edited", "known"]
    reason: str | None = None


class VersionModel(BaseModel):
    """A text an edit replaced, in force from ``valid_from`` until ``valid_until`` (Unix
    seconds)."""

    version: int
    content: str
    valid_from: float
    valid_until: float


class VersionsResponse(BaseModel):
    """The texts edits replaced in a memory, oldest first."""

    id: str
    versions: list[VersionModel]


class DeletedResponse(BaseModel):
    """The id erased (a tombstone remains)."""

    deleted: str


class SessionDeletedResponse(BaseModel):
    """How many memories of the session were erased."""

    session: str
    deleted: int


class TenantDeletedResponse(BaseModel):
    """How many memories of the tenant were erased."""

    tenant: str
    deleted: int


class StatsResponse(BaseModel):
    """Counts of the scope named: per channel, and the top folded families."""

    model_config = ConfigDict(extra="allow")

    memories: int
    seen: int
    folded: int
    exact: int
    near: int
    semantic: int
    contexts: int
    channels: dict[str, dict[str, int]]
    top_families: list[dict[str, Any]]


class CompactPlanResponse(BaseModel):
    """What compaction would do now."""

    model_config = ConfigDict(extra="allow")

    now: float
    tokenizer: str
    considered: int
    skipped: dict[str, int]
    memories: int
    tokens: int
    tokens_saved: int
    clusters: list[dict[str, Any]]


class CompactApplyResponse(BaseModel):
    """What compaction did: the summaries written, the memories they replaced, the clusters
    skipped (already done, stale, left alone because a summary would lose a fact) and the
    tokens saved (the originals' line tokens minus their summaries')."""

    summaries: list[str]
    compacted: int
    already_done: int
    stale: int
    left_alone: int
    tokens_saved: int


class SourcesResponse(BaseModel):
    """What an id stands for: a summary's archived originals, or an offloaded tool result."""

    id: str
    sources: list[MemoryModel]


class HealthResponse(BaseModel):
    """The process answers."""

    status: Literal["ok"]


#: (method, path) -> the model of a 200 answer
RESPONSES: dict[tuple[str, str], type[BaseModel]] = {
    ("get", "/health"): HealthResponse,
    ("post", "/v1/ingest"): IngestResponse,
    ("post", "/v1/assemble"): ContextResponse,
    ("post", "/v1/search"): SearchResponse,
    ("get", "/v1/memories/{memory_id}"): MemoryModel,
    ("get", "/v1/pins"): PinsResponse,
    ("post", "/v1/memories/{memory_id}/pin"): MemoryModel,
    ("post", "/v1/memories/{memory_id}/unpin"): MemoryModel,
    ("delete", "/v1/memories/{memory_id}"): DeletedResponse,
    ("patch", "/v1/memories/{memory_id}"): EditedResponse,
    ("get", "/v1/memories/{memory_id}/versions"): VersionsResponse,
    ("get", "/v1/memories/{memory_id}/sources"): SourcesResponse,
    ("delete", "/v1/sessions/{session}"): SessionDeletedResponse,
    ("delete", "/v1/tenant"): TenantDeletedResponse,
    ("get", "/v1/stats"): StatsResponse,
    ("post", "/v1/compact/plan"): CompactPlanResponse,
    ("post", "/v1/compact/apply"): CompactApplyResponse,
    ("get", "/v1/stats/history"): dashboard.StatsHistoryResponse,
    ("get", "/v1/memories/{memory_id}/history"): dashboard.MemoryHistoryResponse,
}

_ERRORS = {
    "401": "No API key, or an unknown or revoked one.",
    "403": "The key lacks the scope this operation needs.",
    "404": "No such memory, or no such path.",
    "413": "The body is over the server's limit.",
    "422": "The request is invalid: the error names the field, or the line and column.",
    "429": "Too many requests at once: retry after Retry-After seconds.",
}


def openapi(app: FastAPI) -> dict[str, Any]:
    """The OpenAPI schema with the response models and the error shape on every operation."""
    if app.openapi_schema is not None:
        return app.openapi_schema
    schema = get_openapi(
        title=app.title, version=app.version, description=app.description, routes=app.routes
    )
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    models: list[type[BaseModel]] = [*RESPONSES.values(), ErrorResponse]
    for model in models:
        defined = model.model_json_schema(ref_template="#/components/schemas/{model}")
        components.update(defined.pop("$defs", {}))
        components[model.__name__] = defined
    error_ref = {"$ref": "#/components/schemas/ErrorResponse"}
    for path, operations in schema.get("paths", {}).items():
        for method, operation in operations.items():
            responses = operation.setdefault("responses", {})
            answer = RESPONSES.get((method, path))
            if answer is not None:
                ok = responses.setdefault("200", {"description": "Successful Response"})
                ref = {"$ref": f"#/components/schemas/{answer.__name__}"}
                ok["content"] = {"application/json": {"schema": ref}}
            for status, description in _ERRORS.items():
                responses[status] = {
                    "description": description,
                    "content": {"application/json": {"schema": error_ref}},
                }
    # FastAPI's own 422 model is replaced by ours above: drop its now unused schemas
    for unused in ("HTTPValidationError", "ValidationError"):
        components.pop(unused, None)
    app.openapi_schema = schema
    return schema


def _assets() -> str:
    # fastapi-offline ships Swagger UI 5 (OpenAPI 3.1) and ReDoc; only its files are used.
    return str(resources.files("fastapi_offline") / "static")


def install(app: FastAPI) -> None:
    """Add the error shape for 404/405, strict query strings, the response models and the
    offline ``/docs`` to ``app`` (created with ``docs_url=None, redoc_url=None``)."""
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_middleware(StrictQueryMiddleware, routes=app.router.routes)
    app.openapi = lambda: openapi(app)  # type: ignore[method-assign]
    # The dashboard's data routes, added as routes of the app itself (FastAPI's include_router
    # now nests a router, which the query check above and the OpenAPI table would not see).
    app.router.routes.extend(dashboard.router.routes)
    app.mount(_ASSETS, StaticFiles(directory=_assets()), name="docs-assets")
    # The dashboard: static pages in the package that call this API from the browser.
    ui = str(resources.files("ctxwarden") / "data" / "ui")
    app.mount("/ui", StaticFiles(directory=ui, html=True), name="ui")

    @app.get("/docs", include_in_schema=False)
    async def docs() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url="/openapi.json",
            title=f"{app.title} API",
            swagger_js_url=f"{_ASSETS}/swagger-ui-bundle.js",
            swagger_css_url=f"{_ASSETS}/swagger-ui.css",
            swagger_favicon_url=f"{_ASSETS}/favicon.png",
        )

    @app.get("/redoc", include_in_schema=False)
    async def redoc() -> HTMLResponse:
        return get_redoc_html(
            openapi_url="/openapi.json",
            title=f"{app.title} API",
            redoc_js_url=f"{_ASSETS}/redoc.standalone.js",
            redoc_favicon_url=f"{_ASSETS}/favicon.png",
            with_google_fonts=False,
        )
