"""Neighbours on SQLite: one statement per kind of branch for all the anchors of a call, the
rows of the memories read once, those the caller read already not again.

:class:`SQLiteNeighbours` is the neighbours half of :class:`~ctxwarden.store.sqlite.SQLiteStore`
(a mixin over the store's :meth:`_query`). The branches are those of
:meth:`~ctxwarden.store.reads.MemoryReads.neighbours` (the conversation before and after an
anchor in its place, its parent, through an alias too, its siblings, its thread's root, the
replies to it), each an index range scan bounded by its own ``LIMIT``; here each kind of branch
is one statement over a JSON array of the anchors it applies to (``json_each``, a correlated
subquery per anchor), so its text depends on the kind only and stays compiled in the
connection's statement cache, whatever the mix of anchors. The branches select rowids; the
memories are read after, in one statement, leaving out those in ``known``. Retrieval's two
neighbour reads (the turns in context of 40 vector hits, the neighbours of its best hits) were
~50 statements and ~160 memory rows an assembly at 10k memories (``bench/query_latency.py``):
now 2 + 4 statements, and a row read only when retrieval has not read it yet (~10 us a row).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from ctxwarden.scope import ReadScope
from ctxwarden.store.base import Link
from ctxwarden.store.reads import MEMORY_COLUMNS, memory_of, scope_sql
from ctxwarden.types import Memory

__all__ = ["SQLiteNeighbours"]

_FORWARD, _BACKWARD = "created_at, rowid", "created_at DESC, rowid DESC"
#: The anchor's own (created_at, rowid), read from its row: a float through JSON could be
#: parsed one unit in the last place off, and the bound must be exact (ties on created_at).
_BEFORE = "(created_at, rowid) < ((SELECT a.created_at FROM memories a WHERE a.rowid = {0}), {0})"
_AFTER = "(created_at, rowid) > ((SELECT a.created_at FROM memories a WHERE a.rowid = {0}), {0})"
_COLUMNS = ", ".join("m." + c.strip() for c in MEMORY_COLUMNS.split(","))

#: A branch: (relation, condition with ``{i}`` for the i-th argument, arguments, order, limit).
_Branch = tuple[str, str, list[Any], str, int]


class SQLiteNeighbours:
    """:meth:`neighbours` in a statement per kind of branch (the store supplies :meth:`_query`)."""

    def _query(self, sql: str, params: Sequence[Any]) -> list[Any]:
        raise NotImplementedError

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
        branches = [_branches(tenant, anchor, turns, replies) for anchor in anchors]
        kinds: dict[tuple[str, str, int], list[list[Any]]] = {}
        for index, own in enumerate(branches):
            for position, (_, where, args, order, limit) in enumerate(own):
                kinds.setdefault((where, order, limit), []).append([index, position, *args])
        scope_filter, scope_params = scope_sql(scope)
        found: dict[tuple[int, int], list[tuple[float, int]]] = {}
        for (where, order, limit), rows in kinds.items():
            fields = [f"j.value ->> {i + 2}" for i in range(len(rows[0]) - 2)]
            sql = (
                "SELECT j.value ->> 0, j.value ->> 1, m.rowid, m.created_at FROM json_each(?) j "
                "JOIN memories m ON m.rowid IN (SELECT rowid FROM memories WHERE tenant = ? AND "
                f"{where.format(*fields)}{scope_filter} ORDER BY {order} LIMIT {int(limit)})"
            )
            params = [json.dumps(rows, separators=(",", ":")), tenant, *scope_params]
            for index, position, rowid, created_at in self._query(sql, params):
                found.setdefault((int(index), int(position)), []).append((created_at, rowid))
        memories: dict[int, Memory] = {}
        unread: list[int] = []
        for rowid in sorted({rowid for rows in found.values() for _, rowid in rows}):
            memory = known.get(rowid) if known else None
            if memory is not None and memory.tenant == tenant:
                memories[rowid] = memory
            else:
                unread.append(rowid)
        if unread:
            for row in self._query(
                f"SELECT {_COLUMNS} FROM json_each(?) j JOIN memory_rows m ON m.rowid = j.value",
                [json.dumps(unread, separators=(",", ":"))],
            ):
                memories[int(row[0])] = memory_of(row)
        links: list[Link] = []
        for index, own in enumerate(branches):
            for position, (relation, _, _, order, _) in enumerate(own):
                hits = found.get((index, position))
                if not hits:
                    continue
                hits.sort(reverse=order == _BACKWARD)  # the branch's own order
                for _, rowid in hits:
                    memory = memories.get(rowid)
                    if memory is not None and rowid != anchors[index].rowid:
                        links.append(Link(index, relation, memory))
        return links


def _branches(tenant: str, anchor: Memory, turns: int, replies: int) -> list[_Branch]:
    """The branches of one anchor, in :func:`~ctxwarden.store.reads._neighbour_branches`'s
    order and with its conditions (``{i}`` for the i-th argument, taken from the JSON array);
    the text depends only on the anchor's shape (thread, channel, reply) and the limits."""
    out: list[_Branch] = []
    in_thread = anchor.thread_id is not None and anchor.thread_id != anchor.id
    place_args: list[Any]
    if in_thread:
        place, place_args = "thread_id = {1}", [anchor.thread_id]
    elif anchor.channel is None:
        place, place_args = "session = {1} AND channel IS NULL", [anchor.session]
    else:
        place, place_args = "session = {1} AND channel = {2}", [anchor.session, anchor.channel]
    if turns > 0:
        args = [anchor.rowid, *place_args]
        out.append(("before", f"{place} AND kind = 'message' AND {_BEFORE}", args, _BACKWARD,
                    turns))  # fmt: skip
        out.append(("after", f"{place} AND kind = 'message' AND {_AFTER}", args, _FORWARD,
                    turns))  # fmt: skip
    if anchor.reply_to is not None:
        out.append(("parent", "id = {0}", [anchor.reply_to], "rowid", 1))
        alias = "rowid = (SELECT memory_rowid FROM aliases WHERE tenant = {0} AND id = {1})"
        out.append(("parent", alias, [tenant, anchor.reply_to], "rowid", 1))
        if replies > 0:
            out.append(("sibling", "reply_to = {0} AND kind = 'message' AND rowid <> {1}",
                        [anchor.reply_to, anchor.rowid], _FORWARD, replies))  # fmt: skip
    if in_thread and anchor.thread_id != anchor.reply_to:
        out.append(("root", "id = {0}", [anchor.thread_id], "rowid", 1))
    if replies > 0:
        out.append(("reply", "reply_to = {0} AND kind = 'message'", [anchor.id], _FORWARD,
                    replies))  # fmt: skip
        if not in_thread:
            out.append(("reply", "thread_id = {0} AND kind = 'message'", [anchor.id], _FORWARD,
                        replies))  # fmt: skip
    return out
