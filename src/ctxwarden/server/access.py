"""Who may call the HTTP API and how a call runs: the error-to-status table, the server's
limits (:class:`ServerConfig`), the caller (:class:`Principal`), the request's credentials
checked and worked on in one worker thread (:class:`Credentials`), and the FastAPI
dependencies that give them. :mod:`ctxwarden.server.http` re-exports the public names, and the
proxy, the agent APIs and the MCP server build on them.
"""

from __future__ import annotations

import asyncio
import math
import re
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Annotated, TypeVar

import httpx
from fastapi import Depends, Request

from ctxwarden.engine import Engine
from ctxwarden.errors import (
    AuthError,
    BudgetError,
    ConfigError,
    ConflictError,
    CtxwardenError,
    EmbedError,
    InputError,
    NotFound,
    OverloadedError,
    ScopeError,
    StoreError,
    StoreUnavailable,
    SummarizeError,
    TokenizerError,
    UpstreamError,
)
from ctxwarden.llm import UpstreamStatusError

__all__ = [
    "SCOPES",
    "STATUS_BY_ERROR",
    "Caller",
    "CallerCredentials",
    "Credentials",
    "Principal",
    "ServerConfig",
    "client_message",
    "credentials_of",
    "error_field",
    "principal_of",
    "retry_after",
    "status_for",
    "upstream_failure",
]

_T = TypeVar("_T")

#: The one table from error class to HTTP status; the first matching row (most specific first)
#: wins. A ConfigError raised while serving a request is the request naming something the
#: server does not know (a model, a block), so it is the client's to fix: 422.
STATUS_BY_ERROR: tuple[tuple[type[CtxwardenError], int], ...] = (
    (ScopeError, 403),
    (AuthError, 401),
    (NotFound, 404),
    (ConflictError, 409),
    (OverloadedError, 429),
    (InputError, 422),
    (BudgetError, 422),
    (TokenizerError, 422),
    (ConfigError, 422),
    (UpstreamError, 502),
    (SummarizeError, 502),
    (StoreError, 503),
    (EmbedError, 500),
    (CtxwardenError, 500),
)

SCOPES: tuple[str, ...] = ("read", "write", "delete", "admin")


def status_for(error: CtxwardenError) -> int:
    """The HTTP status of ``error`` from :data:`STATUS_BY_ERROR`."""
    for cls, status in STATUS_BY_ERROR:
        if isinstance(error, cls):
            return status
    return 500


def upstream_failure(exc: UpstreamError) -> tuple[int, str]:
    """The status and message an upstream failure is answered with: the upstream's own
    status and message, a 504 for a timeout, a 502 otherwise; never the upstream's host or
    port (the library's message names them, for the operator's log)."""
    if isinstance(exc, UpstreamStatusError):
        return exc.status, f"upstream answered {exc.status}: {exc.detail}"
    cause = exc.__cause__
    if isinstance(cause, httpx.TimeoutException):
        return 504, "upstream: no answer in time; try again or raise the proxy's timeout"
    if isinstance(cause, httpx.HTTPError):
        return 502, "upstream: the model server cannot be reached; check that it is running"
    return 502, "upstream: the model server's answer was not usable"


#: A message that starts by naming what it is about: ``budget.margin: ...``.
_NAMED = re.compile(r"([A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z0-9_]+)*): ")
#: What a 422 without a named field is about, by error class (first match wins).
_FIELD_BY_ERROR: tuple[tuple[type[CtxwardenError], str], ...] = (
    (BudgetError, "budget"),
    (TokenizerError, "tokenizer"),
    (ConfigError, "model"),
)


def error_field(error: CtxwardenError) -> str | None:
    """The request field a client error (422) is about, so that every one names one: the
    field an :class:`InputError` names, else the name a message starts with (``budget.margin:
    ...``), else what the error class is about (a budget, the tokenizer, the model: the
    request's model, window or tokenizer chose them), else ``body``. None for other errors.

    >>> error_field(BudgetError("budget.margin: reserve (2) and margin (16) leave no room"))
    'budget.margin'
    >>> error_field(TokenizerError("cannot count")), error_field(InputError("bad"))
    ('tokenizer', 'body')
    """
    if status_for(error) not in (400, 422):
        return None
    if isinstance(error, InputError) and error.field is not None:
        return error.field
    named = _NAMED.match(str(error))
    if named is not None:
        return named.group(1)
    for kind, field_name in _FIELD_BY_ERROR:
        if isinstance(error, kind):
            return field_name
    return "body"


def client_message(error: CtxwardenError) -> str:
    """``error``'s message as a client may see it: an upstream failure (or a summariser's
    failure caused by one) without the upstream's host and port."""
    upstream: BaseException | None = error
    while upstream is not None and not isinstance(upstream, UpstreamError):
        upstream = upstream.__cause__
    if upstream is None:
        return str(error)
    assert isinstance(upstream, UpstreamError)
    _, message = upstream_failure(upstream)
    if upstream is error:
        return message
    return f"{type(error).__name__}: {message}"


def retry_after(error: CtxwardenError, default: int) -> str | None:
    """The ``Retry-After`` header (seconds) for ``error``: the store's own hint when it is
    unavailable (disk full, read-only, locked, I/O error: 503), ``default`` for 429, else
    None."""
    if isinstance(error, StoreUnavailable):
        return str(max(1, math.ceil(error.retry_after)))
    if isinstance(error, OverloadedError):
        return str(default)
    return None


@dataclass(frozen=True, kw_only=True, slots=True)
class ServerConfig:
    """Limits of the HTTP server.

    ``max_body_bytes``: larger request bodies get 413. ``max_concurrency``: requests running at
    once; more get 429 with ``Retry-After: retry_after_seconds``. ``threads``: worker threads
    that run the engine's (synchronous) work; admitted requests beyond it wait for one. The GIL
    and the store's one connection serialise most of that work, so a few threads answer as
    many requests per second as forty, without forty requests interleaving (bench/serve.py).
    ``authenticate``: maps the bearer token to a :class:`Principal` (in the worker thread that
    then runs the request's work; a request without a token gets 401 before it is called); None
    serves every request as the engine's default tenant with every scope (a loopback
    development server).
    """

    max_body_bytes: int = 1 << 20
    max_concurrency: int = 16
    retry_after_seconds: int = 1
    threads: int = 4
    authenticate: Callable[[str | None], Principal] | None = None

    def __post_init__(self) -> None:
        if self.max_body_bytes < 1:
            raise ConfigError(f"max_body_bytes: {self.max_body_bytes} must be at least 1")
        if self.max_concurrency < 1:
            raise ConfigError(f"max_concurrency: {self.max_concurrency} must be at least 1")
        if self.threads < 1:
            raise ConfigError(f"threads: {self.threads} must be at least 1")
        if self.retry_after_seconds < 0:
            raise ConfigError(f"retry_after_seconds: {self.retry_after_seconds} is negative")


@dataclass(frozen=True, kw_only=True, slots=True)
class Principal:
    """Who is calling: a tenant and what they may do."""

    tenant: str
    scopes: frozenset[str]

    def require(self, scope: str) -> None:
        """Raise :class:`AuthError` unless this principal holds ``scope`` (or admin)."""
        if scope not in self.scopes and "admin" not in self.scopes:
            raise ScopeError(f"this API key lacks the {scope!r} scope: use a key that has it")


def _bearer(request: Request) -> str | None:
    value = request.headers.get("authorization")
    if value is None:
        return None
    scheme, _, token = value.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise AuthError("Authorization header must be 'Bearer <key>'")
    return token.strip()


@dataclass(frozen=True, slots=True)
class Credentials:
    """What a request's ``Authorization`` header says, read on the event loop (no I/O).

    :meth:`run` checks them and does the endpoint's work in one worker thread: the key lookup
    (``ServerConfig.authenticate`` reads the store) never runs on the event loop, and a request
    costs one thread hop rather than one for the check and another for the work.
    """

    token: str | None = field(repr=False)  # keys never reach logs or reprs
    authenticate: Callable[[str | None], Principal] = field(repr=False)
    #: the app's worker threads (:func:`_in_worker`)
    workers: Executor = field(repr=False)

    async def run(self, scope: str, work: Callable[[Principal], _T]) -> _T:
        """In one worker thread: the caller's principal, which must hold ``scope``, then
        ``work(principal)``."""

        def call() -> _T:
            principal = self.authenticate(self.token)
            principal.require(scope)
            return work(principal)

        return await _in_worker(self.workers, call)


async def _in_worker(workers: Executor, call: Callable[[], _T]) -> _T:
    """``call()`` in one of ``workers``' threads, awaited on the event loop.

    Like ``anyio.to_thread.run_sync`` (the work is never abandoned: a cancelled request waits
    for its running work to end) at about a third of its cost on the event loop: anyio's
    capacity limiter, cancel scope and async-library lookups were a fifth of the server's own
    CPU per request. ``workers`` bounds the threads (``ServerConfig.threads``); requests
    beyond it wait in its queue, first come first served, as they did in anyio's limiter.
    """
    future = workers.submit(call)
    try:
        return await asyncio.wrap_future(future)
    except asyncio.CancelledError:
        if not future.cancel():  # running: let it end before the request does
            await asyncio.shield(asyncio.wait((asyncio.wrap_future(future),)))
        raise


async def credentials_of(request: Request) -> Credentials:
    """The caller's credentials (the dependency every endpoint takes). It runs before the body
    is validated: a missing or malformed ``Authorization`` header is a 401 even for a bad body;
    the key itself is checked in the endpoint's worker thread (:meth:`Credentials.run`)."""
    token = _bearer(request)
    config: ServerConfig = request.app.state.config
    if config.authenticate is None:
        local: Credentials = request.app.state.local_credentials
        return local
    if token is None:
        raise AuthError("missing API key: send 'Authorization: Bearer <key>'")
    return Credentials(
        token=token, authenticate=config.authenticate, workers=request.app.state.workers
    )


CallerCredentials = Annotated[Credentials, Depends(credentials_of)]


def principal_of(request: Request) -> Principal:
    """The caller of ``request``, authenticated where this runs (the proxy's dependency; the
    HTTP API's endpoints take :func:`credentials_of` and check the key in their worker)."""
    token = _bearer(request)
    config: ServerConfig = request.app.state.config
    if config.authenticate is None:
        engine: Engine = request.app.state.engine
        return Principal(tenant=engine.config.tenant, scopes=frozenset(SCOPES))
    return config.authenticate(token)


Caller = Annotated[Principal, Depends(principal_of)]
