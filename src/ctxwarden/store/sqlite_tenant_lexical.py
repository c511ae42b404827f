"""BM25 with one tenant's statistics on SQLite, when the store holds other tenants too.

One FTS5 index serves every tenant of a file, and FTS5's ``bm25()`` takes its statistics (rows
``N``, rows holding a term ``n(t)``, mean length ``avg|d|``) from the whole index: a key could
tell from its own scores whether another tenant stored a word. :class:`TenantLexical` ranks a
tenant's matches with that tenant's statistics only, as PostgreSQL does
(:mod:`ctxwarden.store.pg_lexical`)::

    score(d) = sum over kept terms t of  idf(N_T, n_T(t)) * tf(t, d) * (k1 + 1)
                                         / (tf(t, d) + k1 * (1 - b + b * |d| / avg_T|d|))

- ``N_T``: the tenant's rows; ``n_T(t)``: its rows holding ``t``, counted up to the cap the term
  choice needs (exact below it); ``avg_T|d|``: mean FTS5 length (tokens over every column, from
  ``memories_fts_docsize``) of the tenant's newest :data:`LENGTH_SAMPLE` rows (all of them in a
  smaller tenant, where the score is then exactly FTS5's for a store of that tenant alone).
- ``tf(t, d)`` and ``|d|`` are the row's own: FTS5 ranks each kept term alone, and the term's
  count in the row is solved from that one-term ``bm25()`` (the whole index's ``N``, ``n(t)`` and
  ``avg|d|`` are read from FTS5's own records: :func:`term_frequency`). It is an integer, so the
  solution is rounded: rounding absorbs a stale cached ``n(t)``.

The term choice (:func:`~ctxwarden.store.sqlite_lexical.choose_terms`), the very common share
and the newest-budget bound are the tenant's too. What is left: the time a search takes still
grows with other tenants' matches of its terms (one index walks them), which tells nothing
through the results. A store holding one tenant is ranked by FTS5 directly (the same scores,
less work): :meth:`SQLiteLexical.search <ctxwarden.store.sqlite_lexical.SQLiteLexical.search>`
asks :meth:`TenantLexical.alone` first.

Statistics are reused while the store is unchanged (its change stamp); a tenant of
:data:`FRESH_ROWS` rows or more reuses them for :data:`STATS_TTL_SECONDS` even after writes.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ctxwarden.scope import ReadScope
from ctxwarden.store.reads import scope_sql
from ctxwarden.types import Memory

__all__ = [
    "FRESH_ROWS",
    "K1",
    "LENGTH_SAMPLE",
    "STATS_TTL_SECONDS",
    "B",
    "TenantLexical",
    "idf",
    "term_frequency",
    "varint",
    "varint_sum",
]

#: BM25's term-frequency saturation and length normalisation (FTS5's defaults).
K1 = 1.2
B = 0.75
#: A tenant with fewer rows has its statistics measured again after every write.
FRESH_ROWS = 20_000
#: How long a large tenant's statistics are reused.
STATS_TTL_SECONDS = 600.0
#: Rows whose mean length stands for a tenant's ``avg|d|`` (its newest).
LENGTH_SAMPLE = 2000
#: Bound of each statistics cache (cleared when full).
CACHE_ENTRIES = 50_000


def idf(rows: int, holding: int) -> float:
    """FTS5's inverse document frequency of a term in ``holding`` of ``rows`` rows.

    >>> round(idf(1000, 1), 3), idf(1000, 900)
    (6.502, 1e-06)
    """
    value = math.log((rows - holding + 0.5) / (holding + 0.5))
    return value if value > 0.0 else 1e-6


def varint(data: bytes, offset: int = 0) -> tuple[int, int]:
    """SQLite's variable-length integer at ``offset`` of ``data`` (FTS5's record format): the
    value and the offset after it.

    >>> varint(bytes([0x05])), varint(bytes([0x81, 0x00]))
    ((5, 1), (128, 2))
    """
    value = 0
    for i in range(8):
        byte = data[offset + i]
        value = (value << 7) | (byte & 0x7F)
        if byte < 0x80:
            return value, offset + i + 1
    return (value << 8) | data[offset + 8], offset + 9


def varint_sum(data: bytes, offset: int = 0) -> int:
    """The sum of the varints from ``offset`` to the end of ``data``: a row's tokens over every
    column (``memories_fts_docsize``), or the index's (its averages record after the row
    count). FTS5's ``bm25()`` takes a row's length over all its columns.

    >>> varint_sum(bytes([0x05, 0x81, 0x00, 0x02]))
    135
    """
    total = 0
    while offset < len(data):
        value, offset = varint(data, offset)
        total += value
    return total


def length_norm(length: float, mean: float) -> float:
    """BM25's ``k1 * (1 - b + b * |d| / avg|d|)``."""
    return K1 * (1 - B + B * length / mean)


def term_frequency(score: float, term_idf: float, length: float, mean: float) -> int:
    """A term's count in a row, solved from FTS5's one-term ``bm25()`` (``score``, positive)
    with the index's ``idf`` and mean length: ``score = idf * tf * (k1 + 1) / (tf + norm)``.

    >>> s = idf(100, 3) * 2 * (K1 + 1) / (2 + length_norm(9, 7.5))
    >>> term_frequency(s, idf(100, 3), 9, 7.5)
    2
    """
    room = term_idf * (K1 + 1) - score
    if room <= 0.0:
        return 1_000_000  # saturated: more than any row holds
    return max(1, round(score * length_norm(length, mean) / room))


class TenantLexical:
    """Per-tenant BM25 over the shared ``memories_fts`` (module docstring); a mixin of
    :class:`~ctxwarden.store.sqlite.SQLiteStore`, which supplies :meth:`_query`,
    :meth:`_change_stamp` and an empty ``_tenant_stats`` dict."""

    _tenant_stats: dict[Any, tuple[Any, tuple[int, int], float]]

    if TYPE_CHECKING:  # supplied by the store (stubs here would shadow them in its MRO)

        def _query(self, sql: str, params: Sequence[Any]) -> list[Any]: ...

        def _stored_at(self, rowids: Sequence[int]) -> dict[int, Memory]: ...

        def _remembered(self, sql: str, params: Sequence[Any]) -> Sequence[Any]: ...

        def _change_stamp(self) -> tuple[int, int]: ...

    def alone(self, tenant: str) -> bool:
        """True when no row of the store belongs to another tenant (two index probes)."""
        return not self._remembered(
            "SELECT 1 WHERE EXISTS (SELECT 1 FROM memories WHERE tenant > ?) "
            "OR EXISTS (SELECT 1 FROM memories WHERE tenant < ?)",
            (tenant, tenant),
        )

    def _cached(self, key: Any, stamp: tuple[int, int], large: bool) -> Any:
        entry = self._tenant_stats.get(key)
        if entry is None:
            return None
        value, when_stamp, when = entry
        if when_stamp == stamp or (large and time.monotonic() - when < STATS_TTL_SECONDS):
            return value
        return None

    def _keep(self, key: Any, value: Any, stamp: tuple[int, int]) -> None:
        if len(self._tenant_stats) >= CACHE_ENTRIES:
            self._tenant_stats.clear()
        self._tenant_stats[key] = (value, stamp, time.monotonic())

    def tenant_statistics(self, tenant: str, stamp: tuple[int, int]) -> tuple[int, float]:
        """The tenant's rows and the mean FTS5 length of its newest :data:`LENGTH_SAMPLE`."""
        key = ("tenant", tenant)
        cached = self._tenant_stats.get(key)
        large = cached is not None and cached[0][0] >= FRESH_ROWS
        value = self._cached(key, stamp, large)
        if value is None:
            rows = int(
                self._query("SELECT count(*) FROM memories WHERE tenant = ?", (tenant,))[0][0]
            )
            # `+tenant`: walk the newest rows back (the sample), not the whole tenant sorted.
            sizes = self._query(
                "SELECT d.sz FROM memories m JOIN memories_fts_docsize d ON d.id = m.rowid "
                "WHERE +m.tenant = ? ORDER BY m.rowid DESC LIMIT ?",
                (tenant, LENGTH_SAMPLE),
            )
            lengths = [varint_sum(bytes(sz)) for (sz,) in sizes]
            value = (rows, sum(lengths) / len(lengths) if lengths else 1.0)
            self._keep(key, value, stamp)
        return value  # type: ignore[no-any-return]

    def tenant_term_rows(
        self, tenant: str, quoted: str, cap: int, stamp: tuple[int, int], *, large: bool
    ) -> int:
        """The tenant's rows holding the (quoted) term, counted up to ``cap``. ``CROSS JOIN``
        keeps FTS5 the outer loop: the planner otherwise walks the tenant's rows by index and
        runs the MATCH once per row (~1 s a term at 20,000 rows)."""
        key = ("term", tenant, quoted, cap)
        value = self._cached(key, stamp, large)
        if value is None:
            value = int(
                self._query(
                    "SELECT count(*) FROM (SELECT 1 FROM memories_fts f CROSS JOIN memories m "
                    "ON m.rowid = f.rowid WHERE memories_fts MATCH ? AND m.tenant = ? LIMIT ?)",
                    (quoted, tenant, cap),
                )[0][0]
            )
            self._keep(key, value, stamp)
        return value  # type: ignore[no-any-return]

    def _index_idf(self, quoted: str, rows: int, stamp: tuple[int, int]) -> float:
        """FTS5's own idf of the term over the whole index (its hits counted; a count of more
        than a few thousand rows is reused for the TTL: rounding the solved tf absorbs it)."""
        key = ("hits", quoted)
        cached = self._tenant_stats.get(key)
        value = self._cached(key, stamp, cached is not None and cached[0] >= 2000)
        if value is None:
            value = int(
                self._query(
                    "SELECT count(*) FROM memories_fts WHERE memories_fts MATCH ?", (quoted,)
                )[0][0]
            )
            self._keep(key, value, stamp)
        return idf(rows, value)

    def rank_tenant(
        self,
        tenant: str,
        kept: Sequence[str],
        frequency: Mapping[str, int],
        tenant_rows: int,
        mean_length: float,
        budget: int | None,
        limit: int,
        scope: ReadScope | None,
        known: Mapping[int, Memory] | None,
        stamp: tuple[int, int],
    ) -> list[tuple[Memory, float]]:
        """The tenant's best ``limit`` matches of the (quoted) ``kept`` terms by the tenant's
        BM25, among its newest ``budget`` matches (every match when None), within ``scope``."""
        scope_filter, scope_params = scope_sql(scope)
        m_scope = scope_filter.replace(" AND ", " AND m.")
        candidates = [
            int(r[0])
            for r in self._query(
                "SELECT f.rowid FROM memories_fts f CROSS JOIN memories m ON m.rowid = f.rowid "
                f"WHERE memories_fts MATCH ? AND m.tenant = ?{m_scope} "
                "ORDER BY f.rowid DESC LIMIT ?",
                [" OR ".join(kept), tenant, *scope_params, -1 if budget is None else budget],
            )
        ]
        if not candidates:
            return []
        wanted = set(candidates)
        lengths: dict[int, int] = {}
        for start in range(0, len(candidates), 500):
            chunk = candidates[start : start + 500]
            marks = ",".join("?" * len(chunk))
            for rowid, sz in self._query(
                f"SELECT id, sz FROM memories_fts_docsize WHERE id IN ({marks})", chunk
            ):
                lengths[int(rowid)] = varint_sum(bytes(sz))
        record = self._query("SELECT block FROM memories_fts_data WHERE id = 1", ())
        index_rows, offset = varint(bytes(record[0][0]))
        index_tokens = varint_sum(bytes(record[0][0]), offset)
        index_mean = index_tokens / max(index_rows, 1)
        scores = dict.fromkeys(candidates, 0.0)
        floor, ceiling = min(candidates), max(candidates)
        for quoted in kept:
            if not frequency[quoted]:
                continue
            term_idf = self._index_idf(quoted, index_rows, stamp)
            own_idf = idf(tenant_rows, frequency[quoted])
            # bm25() only for the tenant's rows (~1.6 us a row, the join ~0.5).
            for rowid, rank in self._query(
                "SELECT f.rowid, bm25(memories_fts) FROM memories_fts f CROSS JOIN memories m "
                "ON m.rowid = f.rowid WHERE memories_fts MATCH ? AND f.rowid BETWEEN ? AND ? "
                "AND m.tenant = ?",
                (quoted, floor, ceiling, tenant),
            ):
                if rowid not in wanted:
                    continue
                length = lengths.get(rowid, 0)
                tf = term_frequency(-rank, term_idf, length, index_mean)
                scores[rowid] += own_idf * tf * (K1 + 1) / (tf + length_norm(length, mean_length))
        best = sorted(candidates, key=lambda r: (-scores[r], r))[:limit]
        rows = self._memories_at(best, known, tenant)
        return [(rows[r], scores[r]) for r in best if r in rows]

    def _memories_at(
        self, rowids: Sequence[int], known: Mapping[int, Memory] | None, tenant: str
    ) -> dict[int, Memory]:
        """The memories at ``rowids``: the caller's ``known`` ones of ``tenant`` as they are,
        the rest read (:meth:`~ctxwarden.store.sqlite_rows.SQLiteRows._stored_at`: cached rows
        are not read again)."""
        rows: dict[int, Memory] = {}
        unread = []
        for rowid in rowids:
            memory = known.get(rowid) if known else None
            if memory is not None and memory.tenant == tenant:
                rows[rowid] = memory
            else:
                unread.append(rowid)
        if unread:
            rows.update(self._stored_at(unread))
        return rows
