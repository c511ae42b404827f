"""Lexical search on SQLite: FTS5 BM25, common terms dropped, a bounded number of rows ranked.

:class:`SQLiteLexical` is the search half of :class:`~ctxwarden.store.sqlite.SQLiteStore` (a
mixin over the store's :meth:`_query`, as :class:`~ctxwarden.store.reads.MemoryReads` is over
``_read``). The choice of terms (:func:`choose_terms`, :func:`row_budget`,
:func:`very_common_rows` and the constants here) is shared with the PostgreSQL backend
(:mod:`ctxwarden.store.pg_lexical`), so both drop the same terms.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from ctxwarden.scope import ReadScope
from ctxwarden.store.reads import MEMORY_COLUMNS, memory_of, scope_sql
from ctxwarden.store.sqlite_tenant_lexical import FRESH_ROWS, TenantLexical
from ctxwarden.types import Memory

__all__ = [
    "COMMON_TERM_ROWS",
    "ROWS_PER_RESULT",
    "SCOPE_LIST_PER_MATCH",
    "SEARCH_ROW_BUDGET",
    "VERY_COMMON_MIN_ROWS",
    "VERY_COMMON_SHARE",
    "VERY_COMMON_WINDOW",
    "SQLiteLexical",
    "choose_terms",
    "row_budget",
    "very_common_rows",
]

#: A search term in at least this many rows is too common to search for (see ``search``).
COMMON_TERM_ROWS = 2000
#: Rarest terms are searched while the rows they match add up to at most this many, and no search
#: ranks more matching rows than this (the newest are ranked when the kept terms match more).
SEARCH_ROW_BUDGET = 6000
#: A search for ``limit`` results ranks at most ``ROWS_PER_RESULT * limit`` rows (see
#: :func:`row_budget`): a bridge hop's 20 results need fewer rows ranked than the main search.
#: 20 (was 60, then 30): evidence recall on chatbench-dev unchanged (its searches never reach the
#: bound), ~1 ms less a retrieval at 1M rows per 10 fewer, where the main search's 100 results
#: then come from the newest 2,000 rows its terms match.
ROWS_PER_RESULT = 20
#: A term found in at least this share of the rows is a stop word for this store (FTS5's IDF
#: below ~3, against ~7 for a word in one row in a thousand): it is left out of a search that
#: has a rarer term that matches, as Lucene's common-terms cut-off leaves such terms out of the
#: match. Keeping it would rank the rows holding only it (the newest of them, at scale), and
#: FTS5 reads its whole posting list for the IDF at every search (~7 ms for a word in half of
#: 1M rows).
VERY_COMMON_SHARE = 0.05
#: ... and in at least this many rows: in a small store ranking every match costs little, and a
#: word in a handful of messages still tells them apart.
VERY_COMMON_MIN_ROWS = 200
#: In a store of more rows than this, that share is measured among the newest this many rows
#: (counting a term's every row costs ~0.2 us a row through the MATCH cursor): at most
#: ``COMMON_TERM_ROWS`` matches are walked, as for the term's own count.
VERY_COMMON_WINDOW = int(COMMON_TERM_ROWS / VERY_COMMON_SHARE)
#: A scoped search checks its matches against the list of the scope's rowids while the scope
#: holds at most this many rows per expected match (else it looks each match's row up): the
#: list costs ~0.1 us a scope row to build, a look-up ~0.5 us a match (SQLite 3.40, a 10k-row
#: store, ``bench/query_latency.py``), so up to ~3 rows a match the list is the cheaper.
SCOPE_LIST_PER_MATCH = 3


def choose_terms(
    frequency: dict[str, int], budget: int | None = None, *, very_common: Collection[str] = ()
) -> list[str]:
    """The terms worth searching, in the given order; ``frequency`` holds each term's matching
    rows, counted up to :data:`COMMON_TERM_ROWS` at least. Both backends use it.

    With more than two terms, the rarest are kept while the rows they match add up to at most
    ``budget`` (rows to rank, default :data:`SEARCH_ROW_BUDGET`) and none is found in
    :data:`COMMON_TERM_ROWS` rows or more; the two rarest are always kept. Then the
    ``very_common`` terms (found in :data:`VERY_COMMON_SHARE` of the rows or more) are dropped
    when a kept term that is not very common matches: a query of only such words still
    searches them.

    >>> choose_terms({"the": 5000, "deploy": 40, "kafka": 3, "we": 4000})
    ['deploy', 'kafka']
    >>> choose_terms({"the": 5000, "we": 4000})
    ['the', 'we']
    >>> choose_terms({"the": 900, "kafka": 3}, very_common={"the"})
    ['kafka']
    >>> choose_terms({"the": 900, "kafka": 0}, very_common={"the"})
    ['the', 'kafka']
    """
    terms = list(frequency)
    budget = SEARCH_ROW_BUDGET if budget is None else budget
    kept = terms
    if len(terms) > 2:
        ranked = sorted(terms, key=lambda t: (frequency[t], terms.index(t)))
        kept = []
        matched = 0
        for term in ranked:  # rarest first, while the rows to rank stay within budget
            if len(kept) >= 2 and (
                frequency[term] >= COMMON_TERM_ROWS or matched + frequency[term] > budget
            ):
                break
            kept.append(term)
            matched += frequency[term]
    if very_common and any(frequency[t] > 0 and t not in very_common for t in kept):
        kept = [t for t in kept if t not in very_common]
    return [t for t in terms if t in kept]


def very_common_rows(rows: int) -> int:
    """Matching rows from which a term is very common among ``rows`` rows (see
    :data:`VERY_COMMON_SHARE`); at least :data:`VERY_COMMON_MIN_ROWS`.

    >>> very_common_rows(5000), very_common_rows(10)
    (250, 200)
    """
    return max(VERY_COMMON_MIN_ROWS, int(rows * VERY_COMMON_SHARE))


def _quote(term: str) -> str:
    """``term`` as an FTS5 string (a phrase of its tokens)."""
    return '"' + term.replace('"', '""') + '"'


def row_budget(limit: int) -> int:
    """The most matching rows one search for ``limit`` results ranks (and the rows its terms
    may match, in the choice of terms): ``ROWS_PER_RESULT * limit``, at most
    ``SEARCH_ROW_BUDGET``. Both backends use it, so they drop the same terms.

    >>> row_budget(20), row_budget(100), row_budget(1000)
    (400, 2000, 6000)
    """
    return max(1, min(SEARCH_ROW_BUDGET, ROWS_PER_RESULT * limit))


class SQLiteLexical(TenantLexical):
    """FTS5 search over ``memories_fts`` (the store supplies :meth:`_query` and the term and
    statistics caches, which it creates empty)."""

    _term_cache: dict[str, tuple[int, float]]
    _common_cache: dict[str, tuple[bool, float]]

    def _query(self, sql: str, params: Sequence[Any]) -> list[Any]:
        raise NotImplementedError

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
        """FTS5 BM25 over content; any term may match. Scores are positive, higher is better.
        Only memories in ``scope`` (the tenant's when None) are returned: a scope narrower than
        the tenant ranks every match of its own rows (:meth:`_search_scope`).
        Rows in ``known`` (this tenant's memories by rowid, read earlier in the same retrieval)
        are not read again: a bridge hop's hits were ~60 % of them (~4 us a row read).

        With more than two terms, the rarest are searched while the rows they match add up to
        at most :func:`row_budget` (``limit``), and none found in :data:`COMMON_TERM_ROWS` rows
        or more (the two rarest are always kept): an OR of common terms makes FTS5 rank every
        row holding any of them (~0.8 s for twelve terms at 100k rows), while such terms add
        little to BM25 anyway. A term in :data:`VERY_COMMON_SHARE` of the rows is dropped even
        then when a rarer term matches (:func:`choose_terms`). When the kept terms still match
        more rows than that budget (two common words), only the newest budget's worth of
        matching rows is ranked: a rowid bound in the MATCH query, so a search costs a bounded
        amount at any store size (FTS5 still reads each kept term's whole list once for its
        IDF, ~0.015 us a row).

        In a store that holds other tenants too, the terms, their rarity, the bound and the
        scores are the tenant's own (:mod:`~ctxwarden.store.sqlite_tenant_lexical`): FTS5's
        statistics span the file, and another tenant's words would shift them.
        """
        if not terms:
            return []
        budget = row_budget(limit)
        quoted = [_quote(t) for t in dict.fromkeys(terms)]
        if not self.alone(tenant):
            return self._search_shared(tenant, quoted, budget, limit, require, known, scope)
        frequency = {q: self._term_rows(q) for q in quoted}
        quoted = choose_terms(frequency, budget, very_common=self._very_common(frequency))
        if require and not any(_quote(t) in quoted for t in require):
            return []
        match = " OR ".join(quoted)
        scope_filter, scope_params = scope_sql(scope)
        if scope_filter:  # the scope's own newest matches are the bound (_search_scope)
            expected = sum(frequency[q] for q in quoted)
            return self._search_scope(
                tenant, match, limit, scope_filter, scope_params, known, expected, budget
            )
        floor = 0
        if any(frequency[q] >= COMMON_TERM_ROWS for q in quoted) or (
            sum(frequency[q] for q in quoted) > budget
        ):
            # More matching rows than the budget (or a count that stopped at its cap): rank
            # the newest `budget` of them. Walking the rowids costs ~0.3 us a row, ranking ~1.
            oldest = self._query(
                "SELECT rowid FROM memories_fts WHERE memories_fts MATCH ? "
                "ORDER BY rowid DESC LIMIT 1 OFFSET ?",
                (match, budget - 1),
            )
            floor = int(oldest[0][0]) if oldest else 0
        # Rank inside FTS5 first (no join per matching row), then read the rows of the best,
        # filtered by tenant; the joined query only when other tenants crowd the page.
        # bm25() sorted by SQLite's top-k sorter: the same scores as FTS5's "ORDER BY rank",
        # whose own sorter keeps every matching row (~1.5x the time).
        page = limit * 2
        ranked_rows = self._query(
            "SELECT rowid, bm25(memories_fts) AS score FROM memories_fts "
            "WHERE memories_fts MATCH ? AND rowid >= ? ORDER BY score, rowid LIMIT ?",
            (match, floor, page),
        )
        rank: dict[int, float] = dict(ranked_rows)  # (rowid INTEGER, bm25 REAL) pairs
        found: list[tuple[Memory, float]] = []
        ids = list(rank)
        # Rows are read in rank order, only as many as the tenant's best `limit` need (with a
        # single tenant, the first `limit`): each read row costs more than ranking it. The
        # ranking is ordered by (score, rowid), the order of the result, so rows tied with the
        # last one read need not be read (in chat, where many rows tie, they were ~30 %).
        start = 0
        while start < len(ids) and len(found) < limit:
            wanted = limit - len(found)
            chunk = ids[start : start + (wanted if not start else min(500, max(wanted, 16)))]
            start += len(chunk)
            if known:
                unread = []
                for rowid in chunk:
                    memory = known.get(rowid)
                    if memory is not None and memory.tenant == tenant:
                        found.append((memory, -rank[rowid]))
                    else:
                        unread.append(rowid)
                chunk = unread
                if not chunk:
                    continue
            for rowid, memory in self._stored_at(chunk).items():
                if memory.tenant == tenant:
                    found.append((memory, -rank[rowid]))
        if len(found) < limit and len(ranked_rows) == page:
            rows = self._query(
                f"SELECT {', '.join('m.' + c.strip() for c in MEMORY_COLUMNS.split(','))}, "
                "bm25(memories_fts) AS rank FROM memories_fts JOIN memory_rows m "
                "ON m.rowid = memories_fts.rowid WHERE memories_fts MATCH ? "
                "AND memories_fts.rowid >= ? AND m.tenant = ? ORDER BY rank, m.rowid LIMIT ?",
                (match, floor, tenant, limit),
            )
            return [(memory_of(r[:-1]), -float(r[-1])) for r in rows]
        found.sort(key=lambda pair: (-pair[1], pair[0].rowid))
        return found[:limit]

    def _search_shared(
        self,
        tenant: str,
        quoted: list[str],
        budget: int,
        limit: int,
        require: Collection[str],
        known: Mapping[int, Memory] | None,
        scope: ReadScope | None,
    ) -> list[tuple[Memory, float]]:
        """:meth:`search` in a store shared with other tenants: the same choice of terms and
        the same bound as below, from the tenant's own counts, and the tenant's BM25."""
        stamp = self._change_stamp()
        rows, mean_length = self.tenant_statistics(tenant, stamp)
        if not rows:
            return []
        cap = max(COMMON_TERM_ROWS, very_common_rows(rows))
        large = rows >= FRESH_ROWS
        frequency = {q: self.tenant_term_rows(tenant, q, cap, stamp, large=large) for q in quoted}
        cutoff = very_common_rows(rows)
        kept = choose_terms(
            frequency, budget, very_common={q for q, n in frequency.items() if n >= cutoff}
        )
        if require and not any(_quote(t) in kept for t in require):
            return []
        kept = [q for q in kept if frequency[q]]
        if not kept:
            return []
        # The newest `budget` matches, of the scope's rows when scoped (as _search_scope).
        return self.rank_tenant(
            tenant, kept, frequency, rows, mean_length, budget, limit, scope, known, stamp
        )

    def _search_scope(
        self,
        tenant: str,
        match: str,
        limit: int,
        scope_filter: str,
        scope_params: list[Any],
        known: Mapping[int, Memory] | None,
        expected: int = 0,
        budget: int = SEARCH_ROW_BUDGET,
    ) -> list[tuple[Memory, float]]:
        """:meth:`search` within a session's or an end user's memories: the scope's newest
        ``budget`` matches ranked (never the tenant's newest budget, which may hold none of
        them), FTS5 bounded to the scope's rowid range (a live conversation's rows are a narrow
        range of the store), then the best ``limit`` read.

        The bound is the unscoped search's (and PostgreSQL's, which filters by the scope before
        it): a scope of more rows than ``budget`` whose terms may match more (``expected``)
        has the rowid of its ``budget``-th newest match found first (a walk of the newest
        matches, ~0.3 us a row), and only the matches from there on are ranked. Until session
        12 every match of the scope was ranked: a bot's one session of 10,000 messages of
        common words cost ~14 ms a search, three searches an ``assemble``
        (``bench/backends.py``).

        A match in the range is kept if its rowid is in the scope: checked against the list
        of the scope's rowids (read from an index, ~0.1 us a row; ``+rowid`` keeps FTS5 from
        being run once per listed rowid) when the scope holds at most
        :data:`SCOPE_LIST_PER_MATCH` rows per match its terms are ``expected`` to have (the
        sum of their counts), else by a look-up of each match's row (~0.5 us a match). In a
        session whose rows interleave with others' (its range is most of the store), the
        look-ups of every match in the range were 70 % of a search's time. Either way the
        same rows and scores."""
        lo, hi, size = self._remembered(
            f"SELECT min(rowid), max(rowid), count(*) FROM memories WHERE tenant = ?{scope_filter}",
            [tenant, *scope_params],
        )[0]
        if lo is None:
            return []
        keep_params: list[Any] = [tenant, *scope_params]
        join = ""
        if hi - lo + 1 == size:
            # Every rowid of the range is one of the scope's rows (a conversation written
            # alone: one bot's session, an agent's run): no other row can match in it.
            keep, keep_params = "1", []
        elif size <= SCOPE_LIST_PER_MATCH * expected:
            keep = (
                "+memories_fts.rowid IN (SELECT rowid FROM memories "
                f"WHERE tenant = ?{scope_filter})"
            )
        else:
            keep = f"m.tenant = ?{scope_filter.replace(' AND ', ' AND m.')}"
            join = "JOIN memories m ON m.rowid = memories_fts.rowid "
        if size > budget and expected > budget:
            newest = self._query(
                f"SELECT memories_fts.rowid FROM memories_fts {join}"
                "WHERE memories_fts MATCH ? AND memories_fts.rowid BETWEEN ? AND ? "
                f"AND {keep} ORDER BY memories_fts.rowid DESC LIMIT 1 OFFSET ?",
                [match, lo, hi, *keep_params, budget - 1],
            )
            if newest:
                lo = int(newest[0][0])
        ranked = self._query(
            f"SELECT memories_fts.rowid, bm25(memories_fts) AS score FROM memories_fts {join}"
            "WHERE memories_fts MATCH ? AND memories_fts.rowid BETWEEN ? AND ? "
            f"AND {keep} ORDER BY score, memories_fts.rowid LIMIT ?",
            [match, lo, hi, *keep_params, limit],
        )
        rank: dict[int, float] = dict(ranked)
        rows = self._memories_at(list(rank), known, tenant)
        return [(rows[r], -rank[r]) for r in rank if r in rows]

    def _term_rows(self, quoted: str) -> int:
        """Rows holding the (quoted) term, counted up to COMMON_TERM_ROWS; cached 10 minutes."""
        now = time.monotonic()
        cached = self._term_cache.get(quoted)
        if cached is not None and now - cached[1] < 600.0:
            return cached[0]
        count = int(
            self._query(
                "SELECT count(*) FROM (SELECT rowid FROM memories_fts WHERE memories_fts "
                "MATCH ? LIMIT ?)",
                (quoted, COMMON_TERM_ROWS),
            )[0][0]
        )
        if len(self._term_cache) > 50_000:
            self._term_cache.clear()
        self._term_cache[quoted] = (count, now)
        return count

    def _very_common(self, frequency: dict[str, int]) -> set[str]:
        """The (quoted) terms found in :data:`VERY_COMMON_SHARE` of the rows or more: decided by
        their counts in a store of up to :data:`VERY_COMMON_WINDOW` rows, else by their share of
        the newest that many rows (cached 10 minutes)."""
        if len(frequency) < 2 or max(frequency.values()) < min(
            VERY_COMMON_MIN_ROWS, COMMON_TERM_ROWS
        ):
            return set()  # none can be: a term in fewer rows never is (either branch below)
        stored = int(self._remembered("SELECT coalesce(max(rowid), 0) FROM memories", ())[0][0])
        if stored <= VERY_COMMON_WINDOW:
            cutoff = very_common_rows(stored)
            return {q for q, rows in frequency.items() if rows >= cutoff}
        # Only a term counted at the cap can be in 5 % of more than VERY_COMMON_WINDOW rows.
        now = time.monotonic()
        found = set()
        for quoted in (q for q, rows in frequency.items() if rows >= COMMON_TERM_ROWS):
            cached = self._common_cache.get(quoted)
            if cached is None or now - cached[1] >= 600.0:
                recent = int(
                    self._query(
                        "SELECT count(*) FROM (SELECT rowid FROM memories_fts WHERE "
                        "memories_fts MATCH ? AND rowid > ? LIMIT ?)",
                        (quoted, stored - VERY_COMMON_WINDOW, COMMON_TERM_ROWS),
                    )[0][0]
                )
                if len(self._common_cache) > 50_000:
                    self._common_cache.clear()
                cached = self._common_cache[quoted] = (recent >= COMMON_TERM_ROWS, now)
            if cached[0]:
                found.add(quoted)
        return found
