"""BM25 on PostgreSQL: the ranking of SQLite's FTS5 ``bm25()`` over a ``tsvector`` + GIN index.

PostgreSQL's own ``ts_rank``/``ts_rank_cd`` have no inverse document frequency: a word in every
message weighs what a word in one message weighs. :class:`Lexical` ranks instead with Okapi
BM25 as FTS5 computes it, in one SQL statement per search::

    score(d) = sum over query terms t of  idf(t) * tf(t, d) * (k1 + 1)
                                          / (tf(t, d) + k1 * (1 - b + b * |d| / avg|d|))
    idf(t)   = max(ln((N - n(t) + 0.5) / (n(t) + 0.5)), 1e-6)          (k1 = 1.2, b = 0.75)

- ``tf(t, d)``: ``ts_rank_cd('{1,1,1,1}', content_tsv, phraseto_tsquery(t), 0)``: with every
  weight 1 and no normalisation, cover density of a one-word query is the word's count in the
  message (of a phrase, the count of its occurrences), read from the stored ``tsvector``.
- ``|d|``: the message's distinct lexemes, ``length(content_tsv)``, and ``avg|d|`` their mean
  over the tenant's newest 2,000 messages. FTS5 counts every token; only the ratio enters the
  formula, and it is read from the stored vector at no cost (the message's characters, tried
  first, broke FTS5's ties between template messages: top-1 agreement 0.70 against 0.96).
- ``N``: the tenant's rows; ``n(t)``: rows of the tenant holding ``t``, counted with a bound
  (``SELECT count(*) FROM (SELECT 1 ... WHERE content_tsv @@ q LIMIT COMMON_TERM_ROWS)``).
  Statistics are per tenant (FTS5's are per file): one tenant's words never shift another's
  ranking.

Common terms are dropped as :meth:`SQLiteStore.search <ctxwarden.store.sqlite.SQLiteStore.search>`
drops them: with more than two terms, the rarest are searched while the rows they match add up
to at most ``row_budget(limit)`` (``SEARCH_ROW_BUDGET``, less for a short page), and none found in
``COMMON_TERM_ROWS`` rows or more (the two rarest are always kept); a term in
``VERY_COMMON_SHARE`` of the tenant's rows is dropped when a rarer one matches
(:func:`~ctxwarden.store.sqlite_lexical.choose_terms`; counted exactly, where SQLite judges a
store of more than ``VERY_COMMON_WINDOW`` rows by its newest rows). When the kept terms still
match more than the budget (two common words and nothing else), the newest budget's worth of
matching rows is ranked, so a common-word query costs a bounded amount at any size.

Statistics are cached in the process (at most :data:`CACHE_ENTRIES` entries). A tenant of
:data:`FRESH_ROWS` rows or more reuses ``N``, ``avg|d|`` and each ``n(t)`` for
:data:`STATS_TTL_SECONDS`, so a growing store is re-measured every ten minutes at most. A
smaller tenant reuses them only while no row was added to the table since they were measured
(its ``max(rowid)``, one index probe a search of such a tenant: the store's change stamp, as
SQLite's data version is) and for :data:`STAMPED_TTL_SECONDS` at most, which bounds how long another
process's deletes and edits (which the stamp does not see) can shift a weight. They were read
at every search: bounded counts, but at 10,000 rows of common words ~20 ms a search, three
searches an ``assemble`` (docs/postgres.md). Only the weights can be stale: which rows match
is always the table's.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Collection, Sequence
from typing import Any

from ctxwarden.scope import ReadScope
from ctxwarden.store import sqlite_lexical as _sqlite
from ctxwarden.store.reads import MEMORY_COLUMNS
from ctxwarden.store.sqlite_lexical import choose_terms

__all__ = ["K1", "B", "Lexical", "choose_terms", "idf"]

#: BM25's term-frequency saturation and length normalisation (FTS5's defaults).
K1 = 1.2
B = 0.75
#: A tenant with fewer rows has its statistics read at every search.
FRESH_ROWS = 20_000
#: How long a large tenant's statistics are reused.
STATS_TTL_SECONDS = 600.0
#: Bound of each in-process cache (cleared when full).
CACHE_ENTRIES = 50_000
#: A smaller tenant's statistics are reused while the stamp holds, this long at most.
STAMPED_TTL_SECONDS = 60.0
#: Messages whose mean length stands for the tenant's ``avg|d|``.
LENGTH_SAMPLE = 2000


def idf(rows: int, holding: int) -> float:
    """FTS5's inverse document frequency of a term in ``holding`` of ``rows`` rows.

    >>> round(idf(1000, 1), 3), idf(1000, 900)
    (6.502, 1e-06)
    """
    value = math.log((rows - holding + 0.5) / (holding + 0.5))
    return value if value > 0.0 else 1e-6


_COLUMNS = [c.strip() for c in MEMORY_COLUMNS.split(",")]
#: The access stats of :data:`MEMORY_COLUMNS`, kept in ``memory_access`` (migration 8), and what
#: a memory never included reads as.
_ACCESS = {
    "access_count": "0",
    "last_accessed_at": "NULL",
    "access_score": "0.0",
    "included_tokens_total": "0",
}
#: The columns ranked from ``memories``; the stats are joined to the ranked page only.
_STORED = [c for c in _COLUMNS if c not in _ACCESS]
_PAGE = ", ".join(f"coalesce(a.{c}, {_ACCESS[c]})" if c in _ACCESS else f"r.{c}" for c in _COLUMNS)

#: Per term: whether it has a lexeme in the ``english`` configuration, and its bounded count.
_TERM_ROWS = (
    "SELECT numnode(q) > 0, (SELECT count(*) FROM (SELECT 1 FROM memories m "
    "WHERE m.tenant = %(tenant)s AND m.content_tsv @@ q LIMIT %(cap)s) s) "
    "FROM unnest(%(terms)s::text[]) WITH ORDINALITY AS t(term, ord), "
    "LATERAL phraseto_tsquery('english', t.term) AS q ORDER BY t.ord"
)
#: The store's change stamp: the newest row of ``memories`` (an index probe).
_STAMP = "SELECT coalesce(max(rowid), 0) FROM memories"
_TENANT = (
    "SELECT (SELECT count(*) FROM memories WHERE tenant = %(tenant)s), "
    "(SELECT avg(length(content_tsv)) FROM (SELECT content_tsv FROM memories "
    "WHERE tenant = %(tenant)s "
    "ORDER BY created_at DESC, rowid DESC LIMIT %(sample)s) s)"
)


class Lexical:
    """BM25 search over ``memories.content_tsv`` with per-tenant statistics (module docstring).

    ``query(sql, params)`` runs one statement and returns its rows (the store's connection pool).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # rows, avg length, when, stamp
        self._tenants: dict[str, tuple[int, float, float, int]] = {}
        # rows, lexeme, when, counted up to, stamp
        self._terms: dict[tuple[str, str], tuple[int, bool, float, int, int]] = {}

    def statement(
        self,
        query: Any,
        tenant: str,
        terms: Sequence[str],
        limit: int,
        *,
        require: Collection[str] = (),
        scope: ReadScope | None = None,
    ) -> tuple[str, dict[str, Any]] | None:
        """The ranking statement and its parameters; None when no term can match, or when no
        ``require`` term is worth searching (see ``Store.search``)."""
        unique = list(dict.fromkeys(t for t in terms if t.strip()))
        if not unique or limit < 1:
            return None
        now = time.monotonic()
        cached = self._tenants.get(tenant)
        # The stamp is read only for a tenant whose statistics it keeps (under FRESH_ROWS at
        # its last count); -1 never matches one, so a tenant that shrank counts again.
        large = cached is not None and cached[0] >= FRESH_ROWS
        stamp = -1 if large else int(query(_STAMP, {})[0][0])
        rows, mean_length = self._tenant(query, tenant, now, stamp)
        if rows == 0:
            return None
        stats = self._term_rows(query, tenant, unique, now, rows=rows, stamp=stamp)
        frequency = {t: stats[t][0] for t in unique if stats[t][1]}
        budget = _sqlite.row_budget(limit)
        cutoff = _sqlite.very_common_rows(rows)
        very_common = {t for t, found in frequency.items() if found >= cutoff}
        kept = choose_terms(frequency, budget, very_common=very_common)
        if not kept or (require and not any(t in kept for t in require)):
            return None
        params: dict[str, Any] = {
            "tenant": tenant,
            "limit": limit,
            "avg": max(mean_length, 1.0),
            "k1": K1,
            "b": B,
        }
        tf_columns = []
        score_terms = []
        for i, term in enumerate(kept):
            params[f"t{i}"] = term
            params[f"idf{i}"] = idf(rows, frequency[term])
            tf_columns.append(
                f"ts_rank_cd('{{1,1,1,1}}', content_tsv, "
                f"phraseto_tsquery('english', %(t{i})s), 0)::float8 AS tf{i}"
            )
            score_terms.append(
                f"%(idf{i})s * c.tf{i} * (%(k1)s + 1) / (c.tf{i} + %(k1)s * "
                f"(1 - %(b)s + %(b)s * c.dl / %(avg)s))"
            )
        match = " || ".join(f"phraseto_tsquery('english', %(t{i})s)" for i in range(len(kept)))
        bounded = ""
        common = any(frequency[t] >= _sqlite.COMMON_TERM_ROWS for t in kept)  # count capped
        if common or sum(frequency[t] for t in kept) > budget:
            # Common words kept (the two rarest are): rank the newest matches within the
            # budget, not every match.
            bounded = " ORDER BY rowid DESC LIMIT %(budget)s"
            params["budget"] = budget
        cols = ", ".join(_STORED)
        # The read scope filters before the budget and the limit (never a post-filter).
        where_scope = ""
        if scope is not None and scope.session is not None:
            where_scope += " AND session = %(scope_session)s"
            params["scope_session"] = scope.session
        if scope is not None and scope.user is not None:
            where_scope += " AND end_user = %(scope_user)s"
            params["scope_user"] = scope.user
        sql = (
            f"SELECT {_PAGE}, r.score FROM ("
            f"SELECT {cols}, ({' + '.join(score_terms)}) AS score FROM ("
            f"SELECT {cols}, length(content_tsv)::float8 AS dl, {', '.join(tf_columns)} "
            f"FROM memories WHERE tenant = %(tenant)s{where_scope} AND content_tsv @@ ({match})"
            f"{bounded}) c "
            "ORDER BY score DESC, rowid LIMIT %(limit)s) r "
            "LEFT JOIN memory_access a ON a.memory_rowid = r.rowid ORDER BY r.score DESC, r.rowid"
        )
        return sql, params

    def _tenant(self, query: Any, tenant: str, now: float, stamp: int) -> tuple[int, float]:
        cached = self._tenants.get(tenant)
        if cached is not None and _current(cached[0], now - cached[2], cached[3], stamp):
            return cached[0], cached[1]
        count, mean = query(_TENANT, {"tenant": tenant, "sample": LENGTH_SAMPLE})[0]
        rows, mean_length = int(count), float(mean or 0.0)
        with self._lock:
            if len(self._tenants) >= CACHE_ENTRIES:
                self._tenants.clear()
            self._tenants[tenant] = (rows, mean_length, now, stamp)
        return rows, mean_length

    def _term_rows(
        self, query: Any, tenant: str, terms: list[str], now: float, *, rows: int, stamp: int
    ) -> dict[str, tuple[int, bool]]:
        """Each term's matching rows of ``tenant`` and whether it has a lexeme, counted far
        enough to tell ``COMMON_TERM_ROWS`` and ``very_common_rows(rows)``; a cached count made
        with a smaller cap is counted again."""
        cap = max(_sqlite.COMMON_TERM_ROWS, _sqlite.very_common_rows(rows))
        out: dict[str, tuple[int, bool]] = {}
        missing = []
        for term in terms:
            cached = self._terms.get((tenant, term))
            if (
                cached is not None
                and _current(rows, now - cached[2], cached[4], stamp)
                and (cached[0] < cached[3] or cached[3] >= cap)  # exact, or counted far enough
            ):
                out[term] = (cached[0], cached[1])
            else:
                missing.append(term)
        if missing:
            found = query(_TERM_ROWS, {"tenant": tenant, "cap": cap, "terms": missing})
            with self._lock:
                if len(self._terms) + len(missing) > CACHE_ENTRIES:
                    self._terms.clear()
                for term, (has_lexeme, count) in zip(missing, found, strict=True):
                    out[term] = (int(count), bool(has_lexeme))
                    self._terms[(tenant, term)] = (int(count), bool(has_lexeme), now, cap, stamp)
        return out


def _current(rows: int, age: float, stamp: int, now_stamp: int) -> bool:
    """Whether statistics measured ``age`` seconds ago at ``stamp``, of a tenant of ``rows``
    rows, are still used (module docstring).

    >>> _current(50_000, 30.0, 1, 9), _current(500, 30.0, 9, 9), _current(500, 30.0, 1, 9)
    (True, True, False)
    >>> _current(500, STAMPED_TTL_SECONDS, 9, 9)
    False
    """
    if rows >= FRESH_ROWS:
        return age < STATS_TTL_SECONDS
    return stamp == now_stamp and age < STAMPED_TTL_SECONDS
