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

from ctxwarden.server.access import credentials_of
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


class HistoryMemory(_Open):
    """The memory the id resolves to, as ``GET /v1/memories/{id}`` shows it (the fields the
    dashboard reads are named; the rest are kept). Not ``surface.MemoryModel``: surface imports
    this module."""

    id: str
    tenant: str
    session: str
    kind: str
    content: str
    created_at: str
    source_ids: list[str] = []


class HistoryAccess(_Open):
    """How often a memory went into contexts."""

    access_count: int
    access_score: float
    last_accessed_at: str | None
    included_tokens_total: int


class FoldedRepeat(_Open):
    """A repeat folded into the memory: its id, the de-dup layer, when."""

    id: str
    layer: str
    at: str


class HistoryTombstone(_Open):
    """A retired id's tombstone: when, why, the summary it went into (none for an erasure)."""

    id: str
    deleted_at: str
    summary_id: str | None
    reason: str
    time_range: list[str] | None


class RetiredSource(_Open):
    """One memory a summary replaced, as its tombstone tells."""

    id: str
    deleted_at: str
    reason: str
    time_range: list[str] | None


class HistoryInclusion(_Open):
    """One context that included the memory."""

    context_id: str
    created_at: str
    session: str
    model: str | None
    block: str
    tokens: int


class HistoryVersion(_Open):
    """A text an edit replaced: in force from ``valid_from`` until ``valid_until``, when
    ``replaced_by`` (the next version's text, or the current one) took its place."""

    version: int
    content: str
    valid_from: str
    valid_until: str
    replaced_by: str


class SupersessionLink(_Open):
    """A supersession link to another memory: its id, its creation time, when the older of the
    two stopped being in force, and why."""

    id: str
    created_at: str | None
    valid_until: str
    reason: str


class HistoryEvent(_Open):
    """One event on the memory's timeline (``created``, a fold layer, ``edited``,
    ``superseded``, ``supersedes``, ``retired``, ``source retired``, ``included (block)``)."""

    at: str
    event: str
    id: str


class MemoryHistoryResponse(_Open):
    """One memory's history (see :func:`ctxwarden.store.history.memory_history`)."""

    asked: str
    found_as: str
    memory: HistoryMemory
    access: HistoryAccess
    folded: list[FoldedRepeat]
    tombstone: HistoryTombstone | None
    sources: list[RetiredSource]
    inclusions: list[HistoryInclusion]
    versions: list[HistoryVersion]
    superseded_by: SupersessionLink | None
    supersedes: list[SupersessionLink]
    events: list[HistoryEvent]


async def _read(request: Request, work: Any) -> Any:
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
    """One memory's history: what its id resolves to, the repeats folded into it, the texts
    edits replaced, the memories that superseded it or that it superseded, its tombstone and
    the summary it went into, a summary's sources, and the contexts that included it."""
    return await _read(
        request, lambda store, tenant: history.memory_history(store, tenant, memory_id)
    )
