"""Lossless packs shown as they were written: the read side of :mod:`ctxwarden.pack`'s stored
format, shared by the SQL backends.

A pack whose metadata names :data:`~ctxwarden.pack.PACK_FORMAT` stores per line only what the
rest of the store does not hold (``author: text``): the id of line ``n`` is ``source_ids[n]``,
its time the tombstone of that id (:mod:`ctxwarden.store.tombstones`, written in the same
transaction as the pack). :class:`PackReads` comes first in each store's bases and overrides
every read that returns memories: a pack leaves the store rendered as :func:`ctxwarden.pack.pack`
rendered it (``- [id] HH:MM author: text`` lines under its header), its metadata without the
format key, so every caller (assembly, passages, expand, exports, MCP) sees what it saw when
packs were stored rendered, and a memory passed through twice (a search's ``known``) is left
as it is. The times of the packs a call returns are read in one statement (their tombstone
groups by summary id, ``tombstone_groups_summary``; an id found elsewhere through
:func:`~ctxwarden.store.tombstones.find_tombstones`) and kept per store (:data:`TimesCache`:
times only), so a pack read again costs its rendering, ~50 us for 20 lines.

Packs stored rendered (before this format) have no format key and are returned unchanged; a
format this code does not know is a :class:`~ctxwarden.errors.StoreError`, never a pack shown
without its ids.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import replace
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt

from ctxwarden.errors import StoreError
from ctxwarden.pack import PACK_FORMAT, PACK_FORMAT_KEY, unpack
from ctxwarden.scope import ReadScope
from ctxwarden.store.base import Link
from ctxwarden.store.tombstones import decode_members, find_tombstones
from ctxwarden.types import Memory

__all__ = ["CACHE_LIMIT", "PackReads", "TimesCache", "is_stored_pack", "shown"]

_T = TypeVar("_T")

#: Summary ids per ``IN`` list (SQLite binds each value).
_CHUNK = 400


def is_stored_pack(memory: Memory) -> bool:
    """Whether ``memory`` is a pack in the stored format (its text without ids and times);
    :class:`StoreError` for a format this code does not know."""
    if memory.kind != "summary" or PACK_FORMAT_KEY not in memory.metadata:
        return False
    found = memory.metadata[PACK_FORMAT_KEY]
    if found != PACK_FORMAT:
        raise StoreError(
            f"summary {memory.id!r} is stored in pack format {found!r}, which this version "
            "cannot read: upgrade ctxwarden"
        )
    return True


#: A pack's source times by (tenant, summary id, content hash). The hash is of the text as
#: shown, ids and times included (compaction's, and erasure's when it rewrites a pack), so an
#: entry is never stale; it holds times only, no text (an erased pack's text is kept nowhere).
TimesCache = dict[tuple[str, str, str], dict[str, float]]

#: Entries kept per store at most (the cache is emptied when full).
CACHE_LIMIT = 4096


def shown(
    memories: Sequence[Memory],
    read: Callable[[str, Sequence[Any]], list[Any]],
    cache: TimesCache | None = None,
) -> list[Memory]:
    """``memories`` with every stored pack rendered (see the module doc); ``read`` runs a
    statement with ``?`` placeholders; ``cache`` keeps the packs' source times."""
    packs = [m for m in memories if is_stored_pack(m)]
    if not packs:
        return list(memories)
    cache = {} if cache is None else cache
    if len(cache) > CACHE_LIMIT:
        cache.clear()
    found: dict[tuple[str, str, str], dict[str, float]] = {}
    missing: dict[str, list[Memory]] = {}
    for m in packs:
        key = (m.tenant, m.id, m.content_hash)
        known = cache.get(key)
        if known is None:
            missing.setdefault(m.tenant, []).append(m)
        else:
            found[key] = known
    for tenant, group in missing.items():
        times = _times(read, tenant, group)
        for m in group:
            own = {i: times[i] for i in m.source_ids if i in times}
            found[m.tenant, m.id, m.content_hash] = cache[m.tenant, m.id, m.content_hash] = own
    marked = {id(m) for m in packs}
    out = []
    for m in memories:
        if id(m) in marked:
            metadata = {k: v for k, v in m.metadata.items() if k != PACK_FORMAT_KEY}
            m = m._replace(
                content=unpack(m.content, m.source_ids, found[m.tenant, m.id, m.content_hash]),
                metadata=metadata,
            )
        out.append(m)
    return out


def _times(
    read: Callable[[str, Sequence[Any]], list[Any]], tenant: str, packs: Sequence[Memory]
) -> dict[str, float]:
    """The creation time of each source of ``packs`` (of ``tenant``), from its tombstone: the
    group each pack's compaction wrote (found by its summary id, one index look-up for all),
    then, for an id not there (a pack compacted again, whose groups now name the summary
    above it), through :func:`find_tombstones`."""
    wanted = {i for m in packs for i in m.source_ids}
    out: dict[str, float] = {}
    named = sorted({m.id for m in packs})
    for start in range(0, len(named), _CHUNK):
        chunk = named[start : start + _CHUNK]
        rows = read(
            "SELECT codec, record FROM tombstone_groups WHERE tenant = ? AND summary_id IN "
            f"({','.join('?' * len(chunk))})",
            [tenant, *chunk],
        )
        for codec, record in rows:
            out.update(
                (member.id, member.time_start)
                for member in decode_members(record, codec)
                if member.id in wanted and member.time_start is not None
            )
    missing = wanted - out.keys()
    if missing:
        for id_, found in find_tombstones(read, tenant, missing).items():
            if found.member.time_start is not None:
                out[id_] = found.member.time_start
    return out


class PackReads:
    """The store's reads of memories, stored packs rendered (first in a store's bases)."""

    def _read(self, sql: str, params: Sequence[Any]) -> list[Any]:
        raise NotImplementedError

    #: This store's :data:`TimesCache` (made on first use: the mixin has no constructor).
    _pack_times: TimesCache | None = None

    def _shown(self, memories: Sequence[Memory]) -> list[Memory]:
        if self._pack_times is None:
            self._pack_times = {}
        return shown(memories, self._read, self._pack_times)

    def _shown_pairs(self, pairs: Sequence[tuple[Memory, _T]]) -> list[tuple[Memory, _T]]:
        if not any(is_stored_pack(m) for m, _ in pairs):
            return list(pairs)
        memories = self._shown([m for m, _ in pairs])
        return [(m, value) for m, (_, value) in zip(memories, pairs, strict=True)]

    def get(self, tenant: str, id: str) -> Memory:
        return self._shown([super().get(tenant, id)])[0]  # type: ignore[misc]

    def recent(
        self,
        tenant: str,
        session: str,
        *,
        channel: str | None = None,
        before: tuple[float, int] | None = None,
        limit: int = 64,
        user: str | None = None,
    ) -> list[Memory]:
        return self._shown(
            super().recent(  # type: ignore[misc]
                tenant, session, channel=channel, before=before, limit=limit, user=user
            )
        )

    def pinned(
        self, tenant: str, *, session: str | None = None, scope: ReadScope | None = None
    ) -> list[Memory]:
        return self._shown(super().pinned(tenant, session=session, scope=scope))  # type: ignore[misc]

    def summaries(
        self, tenant: str, *, session: str | None = None, scope: ReadScope | None = None
    ) -> list[Memory]:
        return self._shown(super().summaries(tenant, session=session, scope=scope))  # type: ignore[misc]

    def memories_at(self, rowids: Sequence[int]) -> list[Memory]:
        return self._shown(super().memories_at(rowids))  # type: ignore[misc]

    def neighbours(
        self,
        tenant: str,
        anchors: Sequence[Memory],
        *,
        turns: int = 3,
        replies: int = 4,
        scope: ReadScope | None = None,
        known: Mapping[int, Memory] | None = None,
    ) -> list[Link]:
        links: list[Link] = super().neighbours(  # type: ignore[misc]
            tenant, anchors, turns=turns, replies=replies, scope=scope, known=known
        )
        if not any(is_stored_pack(link.memory) for link in links):
            return links
        memories = self._shown([link.memory for link in links])
        return [replace(link, memory=m) for link, m in zip(links, memories, strict=True)]

    def compaction_candidates(
        self, tenant: str, *, created_before: float
    ) -> list[tuple[Memory, float | None]]:
        return self._shown_pairs(
            super().compaction_candidates(tenant, created_before=created_before)  # type: ignore[misc]
        )

    def iter_memories(self, tenant: str) -> Iterator[Memory]:
        batch: list[Memory] = []
        for memory in super().iter_memories(tenant):  # type: ignore[misc]
            batch.append(memory)
            if len(batch) == 500:
                yield from self._shown(batch)
                batch = []
        yield from self._shown(batch)

    def search(
        self,
        tenant: str,
        terms: Sequence[str],
        *,
        limit: int = 100,
        require: Collection[str] = (),
        known: Mapping[int, Memory] | None = None,
        scope: ReadScope | None = None,
    ) -> list[tuple[Memory, float]]:
        return self._shown_pairs(
            super().search(  # type: ignore[misc]
                tenant, terms, limit=limit, require=require, known=known, scope=scope
            )
        )

    def vector_search(
        self,
        tenant: str,
        model: str,
        vector: npt.NDArray[np.float32],
        *,
        k: int = 100,
        session: str | None = None,
        author: str | None = None,
        scope: ReadScope | None = None,
    ) -> list[tuple[Memory, float]]:
        return self._shown_pairs(
            super().vector_search(  # type: ignore[misc]
                tenant, model, vector, k=k, session=session, author=author, scope=scope
            )
        )

    def vector_window(
        self,
        tenant: str,
        model: str,
        *,
        channel: str | None,
        author: str | None,
        seen_since: float,
        created_until: float,
    ) -> list[tuple[Memory, npt.NDArray[np.float32]]]:
        return self._shown_pairs(
            super().vector_window(  # type: ignore[misc]
                tenant,
                model,
                channel=channel,
                author=author,
                seen_since=seen_since,
                created_until=created_until,
            )
        )

    def archived(self, tenant: str, summary_id: str, *, now: float) -> list[Memory]:
        return self._shown(super().archived(tenant, summary_id, now=now))  # type: ignore[misc]
