"""Neighbours on PostgreSQL: the branches of every anchor in one statement, a branch per shape.

:meth:`MemoryReads.neighbours <ctxwarden.store.reads.MemoryReads.neighbours>` sends one
``UNION ALL`` of every anchor's branches (the conversation before and after it in its place, its
parent, through an alias too, its siblings, its thread's root, the replies to it): about a
hundred small index range scans for the 26 anchors of an 8k related block. PostgreSQL spent
~17 ms planning that statement and ~2 ms running it (``EXPLAIN (ANALYZE, SUMMARY)`` at 10,000
memories). :class:`PostgresNeighbours` sends the branches of one shape (relation, condition,
order, limit: about ten kinds) once, as a ``LATERAL`` subquery over arrays of the anchors'
values, so the plan is made for ten branches whatever the number of anchors. The rows of a
lateral are put back in each branch's order in Python; the links are the ``UNION ALL``'s, in
its order (``tests/store/test_conformance.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ctxwarden.scope import ReadScope
from ctxwarden.store.base import Link
from ctxwarden.store.reads import (
    _BACKWARD,
    _FORWARD,
    MEMORY_COLUMNS,
    _neighbour_branches,
    memory_of,
    scope_sql,
)
from ctxwarden.types import Memory

__all__ = ["PostgresNeighbours"]


class PostgresNeighbours:
    """:meth:`neighbours` in one statement of one branch per shape (the store supplies
    :meth:`_read`)."""

    if TYPE_CHECKING:  # supplied by the store (a stub here would shadow it)

        def _read(self, sql: str, params: Sequence[Any]) -> list[Any]: ...

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
        """The conversation around each anchor (see :meth:`Store.neighbours`), in one
        statement: the branches of every anchor (:func:`_neighbour_branches`: small index range
        scans of ``memories_channel_recent``, ``memories_thread``, ``memories_reply``, the
        ``(tenant, id)`` key, each bounded by its own ``LIMIT``, so a message with thousands of
        replies costs ``replies`` rows), those of one shape for all anchors at once as a
        ``LATERAL`` over arrays of their values (:func:`_neighbour_lateral`). A ``UNION ALL``
        of every anchor's branches (~100 at an 8k block) cost PostgreSQL ~17 ms to plan
        against ~2 ms to run; one branch per shape (about ten) plans in ~1 ms. The links and
        their order are those of :meth:`MemoryReads.neighbours
        <ctxwarden.store.reads.MemoryReads.neighbours>` (its ``UNION ALL``). ``known`` is not
        used (every row comes in that statement)."""
        per_anchor = [_neighbour_branches(tenant, a, turns, replies) for a in anchors]
        sql, params = _neighbour_lateral(tenant, per_anchor, scope=scope)
        if not sql:
            return []
        found: dict[tuple[int, int], list[Memory]] = {}
        for row in self._read(sql, params):
            found.setdefault((int(row[0]), int(row[1])), []).append(memory_of(row[2:]))
        links: list[Link] = []
        for index, branches in enumerate(per_anchor):
            for number, (relation, _, _, order, _) in enumerate(branches):
                rows = found.get((index, number), [])
                for memory in sorted(rows, key=_ORDER_KEYS[order]):
                    if memory.rowid != anchors[index].rowid:
                        links.append(Link(index, relation, memory))
        return links


#: Python's sort key for each order a branch reads in (the rows of a lateral come back
#: unordered across anchors).
_ORDER_KEYS: dict[str, Callable[[Memory], tuple[float, ...]]] = {
    _FORWARD: lambda m: (m.created_at, m.rowid),
    _BACKWARD: lambda m: (-m.created_at, -m.rowid),
    "rowid": lambda m: (m.rowid,),
}
#: A branch parameter's PostgreSQL array type, by its Python type (None alone: text).
_ARRAY_TYPES = {str: "text[]", float: "float8[]", int: "int8[]"}


def _neighbour_lateral(
    tenant: str,
    anchors: Sequence[list[tuple[str, str, list[Any], str, int]]],
    *,
    scope: ReadScope | None = None,
) -> tuple[str, list[Any]]:
    """The neighbour branches of ``anchors`` as one statement with a branch per shape
    (relation, condition, order, limit): ``SELECT anchor, branch, row FROM unnest(arrays of
    the anchors' values) CROSS JOIN LATERAL (the branch, its ``?`` taken from the arrays)``,
    ``UNION ALL`` over the shapes; ("", []) without branches. Each row is led by its anchor's
    position and the branch's position in that anchor's list. ``scope`` filters each branch
    before its limit."""
    shapes: dict[tuple[str, str, str, int], list[tuple[int, int, list[Any]]]] = {}
    for number, branch_list in enumerate(anchors):
        for position, (relation, where, args, order, limit) in enumerate(branch_list):
            shapes.setdefault((relation, where, order, limit), []).append((number, position, args))
    scope_filter, scope_params = scope_sql(scope)
    parts: list[str] = []
    params: list[Any] = []
    for (_, where, order, limit), rows in shapes.items():
        width = len(rows[0][2])
        columns = [[r[2][k] for r in rows] for k in range(width)]
        types = [_array_type(values) for values in columns]
        names = ", ".join(["n", "i", *(f"p{k}" for k in range(width))])
        arrays = ", ".join(["?::int4[]", "?::int4[]", *(f"?::{t}" for t in types)])
        condition = where
        for k in range(width):  # the branch's own placeholders, in order, from the arrays
            condition = condition.replace("?", f"a.p{k}", 1)
        parts.append(
            f"SELECT a.n, a.i, b.* FROM unnest({arrays}) AS a({names}) CROSS JOIN LATERAL "
            f"(SELECT {MEMORY_COLUMNS} FROM memory_rows WHERE tenant = ? AND {condition}"
            f"{scope_filter} ORDER BY {order} LIMIT {int(limit)}) AS b"
        )
        params.extend(([r[0] for r in rows], [r[1] for r in rows], *columns))
        params.extend((tenant, *scope_params))
    return " UNION ALL ".join(parts), params


def _array_type(values: Sequence[Any]) -> str:
    """The array type of one branch parameter's values (one Python type, or None)."""
    kinds = {type(v) for v in values if v is not None}
    if kinds == {int, float}:  # times given as whole seconds beside fractions
        kinds = {float}
    if len(kinds) > 1:
        raise TypeError(f"neighbour branch parameter of mixed types: {sorted(map(str, kinds))}")
    return _ARRAY_TYPES[kinds.pop()] if kinds else "text[]"
