"""The dashboard's data routes: the store's health over time and one memory's history.

    GET /v1/stats/history[?session=&buckets=&tokenizer=]   the series the /ui "Health" view plots
    GET /v1/memories/{id}/history                          what the store recorded about one memory

Read-only, in the caller's tenant, with the same API key and ``read`` scope as ``/v1/stats``;
the queries are :mod:`ctxwarden.store.history`'s. :func:`ctxwarden.server.surface.install`
includes :data:`router` in the app, so every server that has the HTTP API has these.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path, Query, Request
from pydantic import BaseModel, ConfigDict

from ctxwarden.store import history

__all__ = ["MemoryHistoryResponse", "StatsHistoryResponse", "router"]

router = APIRouter()


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class MemorySeries(_Open):
    """Memories over time: alive at each bucket's end, new ones by kind, retired by reason."""

    now: int
    alive: list[int]
    new: dict[str, list[int]]
    retired: dict[str, list[int]]


class TokenSeries(_Open):
    """New tokens per bucket by channel, counted with one tokenizer."""

    tokenizer: str | None
    memories_counted: int
    by_channel: dict[str, list[int]]


class Compaction(_Open):
    """One summary and the memories it retired."""

    summary_id: str
    session: str | None
    channel: str | None
    retired: int
    reason: str
    compacted_at: str
    time_range: list[str] | None
    tokens_before: int | None
    tokens_after: int | None
    tokens_saved: int | None


class Heat(_Open):
    """Contexts assembled per bucket and inclusions per channel and bucket."""

    contexts: list[int]
    context_tokens: list[int]
    by_channel: dict[str, list[int]]


class StatsHistoryResponse(_Open):
    """The store's health over time (see :func:`ctxwarden.store.history.health`)."""

    session: str | None
    start: str | None
    width: int
    buckets: int
    times: list[str]
    memories: MemorySeries
    folds: dict[str, list[int]]
    tokens: TokenSeries
    compactions: list[Compaction]
    heat: Heat
    hottest: list[dict[str, Any]]


class MemoryHistoryResponse(_Open):
    """One memory's history (see :func:`ctxwarden.store.history.memory_history`)."""

    asked: str
    found_as: str
    memory: dict[str, Any]
    access: dict[str, Any]
    folded: list[dict[str, Any]]
    tombstone: dict[str, Any] | None
    sources: list[dict[str, Any]]
    inclusions: list[dict[str, Any]]
    versions: str
    events: list[dict[str, Any]]


async def _read(request: Request, work: Any) -> Any:
    # The HTTP API's credentials dependency, looked up at request time: server.http imports
    # this package's surface, which includes this router.
    from ctxwarden.server.access import credentials_of

    caller = await credentials_of(request)
    engine = request.app.state.engine
    return await caller.run("read", lambda principal: work(engine.store, principal.tenant))


@router.get("/v1/stats/history", response_model=StatsHistoryResponse)
async def stats_history(
    request: Request,
    session: str | None = None,
    buckets: Annotated[int, Query(ge=1, le=500)] = 48,
    tokenizer: str | None = None,
) -> Any:
    """The store's health over time in the caller's tenant (one session when named): memories
    kept and retired, folds by layer, tokens by channel, compactions and what they saved,
    contexts assembled and the inclusions per channel (access heat), the hottest memories."""
    return await _read(
        request,
        lambda store, tenant: history.health(
            store, tenant, session=session, buckets=buckets, tokenizer=tokenizer
        ),
    )


@router.get("/v1/memories/{memory_id}/history", response_model=MemoryHistoryResponse)
async def memory_history(request: Request, memory_id: Annotated[str, Path()]) -> Any:
    """One memory's history: what its id resolves to, the repeats folded into it, its tombstone
    and the summary it went into, a summary's sources, and the contexts that included it."""
    return await _read(
        request, lambda store, tenant: history.memory_history(store, tenant, memory_id)
    )
