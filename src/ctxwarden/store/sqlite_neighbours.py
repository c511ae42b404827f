"""Neighbours on SQLite: one statement per anchor that reads rowids only, then the rows of the
memories the caller has not read yet, in one statement.

:class:`SQLiteNeighbours` is the neighbours half of :class:`~ctxwarden.store.sqlite.SQLiteStore`
(a mixin over the store's :meth:`_query`). The branches are those of
:meth:`~ctxwarden.store.reads.MemoryReads.neighbours` (the conversation before and after an
anchor in its place, its parent, through an alias too, its siblings, its thread's root, the
replies to it), each an index range scan bounded by its own ``LIMIT``, one ``UNION ALL``
statement per anchor whose text depends only on the anchor's shape (thread, channel, reply), so
it stays compiled in the connection's statement cache: a ``UNION ALL`` over all the anchors has
a new text whenever their mix of shapes changes, and compiling 32 branches cost ~10 times
running them. The statements select rowids (~6 us a statement, 40 anchors ~0.25 ms); the
memory rows are read after, once each, leaving out those in ``known`` and those the store's
row cache holds (:mod:`~ctxwarden.store.sqlite_rows`; a row read costs ~10 us). Retrieval's
two neighbour reads read ~160 rows an assembly at 10k memories (``bench/query_latency.py``),
most of them read already by its searches.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ctxwarden.scope import ReadScope
from ctxwarden.store.base import Link
from ctxwarden.store.reads import (
    _neighbour_branches,
    _neighbour_statement,
    scope_sql,
)
from ctxwarden.types import Memory

__all__ = ["SQLiteNeighbours"]

#: The statement text of each anchor shape and scope filter (made once: ~15 us each).
_TEXTS: dict[tuple[Any, ...], str] = {}


class SQLiteNeighbours:
    """:meth:`neighbours` by rowids first (the store supplies :meth:`_query`)."""

    def _query(self, sql: str, params: Sequence[Any]) -> list[Any]:
        raise NotImplementedError

    if TYPE_CHECKING:  # supplied by the store (SQLiteRows: a stub here would shadow it)

        def _stored_at(self, rowids: Sequence[int]) -> dict[int, Memory]: ...

        def _remembered_all(
            self, reads: Sequence[tuple[str, Sequence[Any]]]
        ) -> list[Sequence[Any]]: ...

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
        """The conversation around each anchor (see :meth:`Store.neighbours`): the same links in
        the same order as :meth:`~ctxwarden.store.reads.MemoryReads.neighbours`. Memories in
        ``known`` (this tenant's, by rowid, read earlier by the caller) are not read again."""
        found: list[tuple[int, str, int]] = []
        scope_filter, scope_params = scope_sql(scope)
        reads: list[tuple[str, list[Any]]] = []
        read_anchors: list[tuple[int, Memory]] = []
        for index, anchor in enumerate(anchors):
            branches = _neighbour_branches(tenant, anchor, turns, replies)
            if not branches:
                continue
            shape = (scope_filter, *((b[0], b[1], b[3], b[4]) for b in branches))
            sql = _TEXTS.get(shape)
            if sql is None:  # a few shapes in all: (thread, channel, reply) x limits x scope
                sql = _neighbour_statement(
                    tenant, [branches], scope=scope, columns="rowid", rows="memories"
                )[0]
                if len(_TEXTS) >= 1024:
                    _TEXTS.clear()
                _TEXTS[shape] = sql
            reads.append((sql, [p for b in branches for p in (tenant, *b[2], *scope_params)]))
            read_anchors.append((index, anchor))
        # (Rowids only: kept while the store's rows do not change, SQLiteRows._remembered.)
        for (index, anchor), rows in zip(read_anchors, self._remembered_all(reads), strict=True):
            for _, relation, rowid in rows:
                if rowid != anchor.rowid:
                    found.append((index, str(relation), int(rowid)))
        memories: dict[int, Memory] = {}
        unread: list[int] = []
        for rowid in sorted({rowid for _, _, rowid in found}):
            memory = known.get(rowid) if known else None
            if memory is not None and memory.tenant == tenant:
                memories[rowid] = memory
            else:
                unread.append(rowid)
        if unread:
            memories.update(self._stored_at(unread))
        return [
            Link(index, relation, memories[rowid])
            for index, relation, rowid in found
            if rowid in memories  # (a row deleted in between is left out)
        ]
