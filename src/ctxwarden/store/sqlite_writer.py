"""The SQLite backend's write transaction: :class:`_SQLiteWriter` and its de-dup lookups.

Moved out of :mod:`ctxwarden.store.sqlite`, whose :meth:`SQLiteStore.write
<ctxwarden.store.sqlite.SQLiteStore.write>` hands one out per transaction. The statements both
backends share are in :mod:`ctxwarden.store.writes`; :data:`_TARGET_COLUMNS` and
:func:`_keep_wanted` are used by the PostgreSQL writer too.
"""

from __future__ import annotations

import itertools
import json
import sqlite3
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

from ctxwarden.store.base import AggregateUpdate, Alias, FoldTarget, NewMemory, TokenCount
from ctxwarden.store.reads import bigram_column, memory_row
from ctxwarden.store.writes import MemoryWrites

__all__ = ["bucket_of"]

_TARGET_COLUMNS = (
    "rowid, id, tenant, session, channel, author, author_kind, content, latest_content, "
    "attachments, created_at, content_hash, near_key, dup_count, last_seen_at, end_user"
)


# Keys per de-dup lookup statement (SQLite allows 32766 parameters). Each statement scans its
# scope's rows within the window once, so a 1,000-record batch's keys go in one statement per
# scope (400 per statement cost ~0.2 us more per message in bench/ingest.py).
_CHUNK = 1000

#: The time bucket that the de-dup indexes are keyed by after the scope (migration 10): this
#: text must equal the indexed expression for the planner to use it.
_BUCKET_SECONDS = 300
_BUCKET = f"CAST(last_seen_at / {_BUCKET_SECONDS} AS INTEGER)"
_INT64 = 2**63
#: A lookup seeks each (scope, bucket, key) of its window (~2 us each) rather than read the
#: window's index entries once (~0.25 us each) when the window holds more than this many
#: entries per seek: a one-record ingest with a 1-hour window seeks 13 buckets per lookup;
#: bench/ingest.py's 1,000-record batches (~450 messages an hour) scan.
_SEEK_COST = 8
#: At most this many (scope, key) pairs or buckets are sought (bounds the statement).
_SEEK_PAIRS = 4000
_SEEK_BUCKETS = 2000


def bucket_of(at: float) -> int:
    """The de-dup indexes' bucket of a time, as SQLite computes ``_BUCKET``: truncated toward
    zero and saturated to 64 bits, so ``a <= b`` implies ``bucket_of(a) <= bucket_of(b)``.

    >>> bucket_of(1_800_000_299.0), bucket_of(-1.0), bucket_of(1e300)
    (6000000, 0, 9223372036854775807)
    """
    value = at / _BUCKET_SECONDS
    if value >= _INT64:
        return _INT64 - 1
    if value <= -_INT64:
        return -_INT64
    return int(value)


def _target(row: tuple[Any, ...]) -> FoldTarget:
    (
        rowid, id_, tenant, session, channel, author, author_kind, content, latest, attachments,
        created_at, content_hash, near_key, dup_count, seen, end_user,
    ) = row  # fmt: skip
    return FoldTarget(
        rowid=rowid,
        id=id_,
        tenant=tenant,
        session=session,
        channel=channel,
        author=author,
        author_kind=author_kind,
        content=content,
        latest_content=latest,
        attachments=tuple(json.loads(attachments)) if attachments else (),
        created_at=created_at,
        content_hash=content_hash,
        near_key=near_key,
        dup_count=dup_count,
        last_seen_at=seen,
        user=end_user,
    )


def _keep_wanted(
    found: dict[int, FoldTarget],
    rows: Iterable[tuple[Any, ...]],
    scope: str,
    key: str,
    wanted: set[tuple[str | None, str]],
) -> None:
    """Add to ``found`` (by rowid) the targets among ``rows`` (of ``_TARGET_COLUMNS``) whose
    (``scope``, ``key``) pair is wanted: a lookup matches every scope with every key it was
    given, so a row may pair one wanted scope with another's key. Both backends use it."""
    for row in rows:
        target = _target(row)
        pair = (
            target.session if scope == "session" else target.channel,
            target.content_hash if key == "content_hash" else target.near_key,
        )
        if pair in wanted:
            found.setdefault(target.rowid, target)


_INSERT_MEMORY = (
    "INSERT INTO memories (rowid, id, tenant, session, channel, author, author_kind, role, "
    "content, created_at, thread_id, reply_to, kind, pinned, name, tool_calls, "
    "tool_call_id, attachments, metadata, content_hash, near_key, last_seen_at, "
    "source_ids, time_start, time_end, end_user, attachment_text, bigram_text) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)


#: The insert of the common message (no thread, reply, name, tool call, attachments, metadata,
#: sources or time range): the columns left out are NULL either way, and a shorter statement
#: costs SQLite ~3 us less per row (measured on bench/ingest.py's rows).
_INSERT_PLAIN = (
    "INSERT INTO memories (rowid, id, tenant, session, channel, author, author_kind, role, "
    "content, created_at, kind, pinned, content_hash, near_key, last_seen_at, end_user) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
_NONE_2 = (None, None)
_NONE_3 = (None, None, None)
_NONE_5 = (None, None, None, None, None)
_PLAIN_WIDTH = 16


def _newest_per_key(sql: str, params: list[Any], limit: int) -> tuple[str, list[Any]]:
    """``sql`` (a near-key lookup) keeping the newest ``limit`` rows per (channel, near_key)."""
    return (
        f"SELECT {_TARGET_COLUMNS} FROM (SELECT *, row_number() OVER (PARTITION BY channel, "
        f"near_key ORDER BY last_seen_at DESC, rowid DESC) AS newest FROM ({sql})) "
        "WHERE newest <= ?",
        [*params, limit],
    )


class _Lookup(NamedTuple):
    """One de-dup lookup (see ``_SQLiteWriter.find_targets``): the ``wanted`` (scope value,
    key) pairs of ``tenant`` among messages seen since ``since``, ``through`` the index on
    (tenant, ``scope``, bucket, ``key``)."""

    tenant: str
    through: str
    scope: str
    key: str
    wanted: set[tuple[str | None, str]]
    since: float


def _scope_order(value: str | None) -> tuple[bool, str]:
    """Sort key of scope values (sessions or channels): by value, NULL (no channel) last."""
    return (value is None, value or "")


def _seek_statements(lookup: _Lookup, buckets: list[int]) -> list[tuple[str, list[Any]]]:
    """Statements seeking each (scope, bucket, key) of the lookup's pairs in its index (CROSS
    JOIN: the pairs are the outer loop whatever statistics the planner has)."""
    tenant, index, scope, key, wanted, since = lookup
    pairs = sorted(wanted, key=lambda p: (*_scope_order(p[0]), p[1]))
    columns = ", ".join(f"m.{c.strip()}" for c in _TARGET_COLUMNS.split(","))
    out: list[tuple[str, list[Any]]] = []
    for start in range(0, len(pairs), _CHUNK):
        chunk = pairs[start : start + _CHUNK]
        sql = (
            f"SELECT {columns} FROM (VALUES {','.join(['(?, ?)'] * len(chunk))}) AS p "
            f"CROSS JOIN memories AS m INDEXED BY {index} ON m.tenant = ? "
            f"AND m.{scope} IS p.column1 AND {_BUCKET} IN ({','.join('?' * len(buckets))}) "
            f"AND m.{key} = p.column2 WHERE m.last_seen_at >= ? AND m.kind = 'message'"
        )
        params = [item for pair in chunk for item in pair]
        out.append((sql, [*params, tenant, *buckets, since]))
    return out


def _scan_statements(lookup: _Lookup, first: int) -> list[tuple[str, list[Any]]]:
    """Statements reading the window's entries of the lookup's index in its scopes once and
    testing the key there."""
    tenant, index, scope, key, wanted, since = lookup
    scopes = sorted({p[0] for p in wanted}, key=_scope_order)
    keys = sorted({p[1] for p in wanted})
    values = [v for v in scopes if v is not None]
    # `IN` for the scope values (few: sessions or channels) and the keys; NULL channels
    # need their own `IS NULL` arm.
    arms: list[tuple[str, list[Any]]] = []
    if values:
        arms.append((f"{scope} IN ({','.join('?' * len(values))})", values))
    if scopes[-1] is None:
        arms.append((f"{scope} IS NULL", []))
    out: list[tuple[str, list[Any]]] = []
    for arm, arm_values in arms:
        for start in range(0, len(keys), _CHUNK):
            chunk = keys[start : start + _CHUNK]
            out.append(
                (
                    f"SELECT {_TARGET_COLUMNS} FROM memories INDEXED BY {index} "
                    f"WHERE tenant = ? AND {arm} AND {_BUCKET} >= ? "
                    f"AND {key} IN ({','.join('?' * len(chunk))}) AND last_seen_at >= ? "
                    "AND kind = 'message'",
                    [tenant, *arm_values, first, *chunk, since],
                )
            )
    return out


class _SQLiteWriter(MemoryWrites):
    """One write transaction's statements.

    ``insert_or_fold`` (the ingest path) does not execute: it allocates the rowid itself and
    queues the row, and the queue is written with one ``executemany`` before the next statement
    of any kind (``_conn`` flushes it), so every read and write sees the rows in order. Allocating
    is safe because BEGIN IMMEDIATE makes this the only writer, and ``max(rowid) + 1`` is what
    SQLite itself would choose for a table without AUTOINCREMENT.
    """

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._raw = conn
        self._unindexed: list[int] = []
        self._queued: list[tuple[Any, ...]] = []
        self._next_rowid: int | None = None

    @property
    def _conn(self) -> sqlite3.Connection:
        if self._queued:
            queued, self._queued = self._queued, []
            # In order, one executemany per run of rows of one statement (plain or full).
            for width, rows in itertools.groupby(queued, len):
                self._raw.executemany(
                    _INSERT_PLAIN if width == _PLAIN_WIDTH else _INSERT_MEMORY, list(rows)
                )
        return self._raw

    def flush(self) -> None:
        """Add the rows inserted so far to the full-text index (one statement per chunk)."""
        pending, self._unindexed = sorted(set(self._unindexed)), []
        # Ingest allocates consecutive rowids: one range scan per run of them (cheaper than
        # probing each rowid of an IN list). Rows deleted meanwhile are simply not found.
        runs: list[tuple[int, int]] = []
        for rowid in pending:
            if runs and runs[-1][1] == rowid - 1:
                runs[-1] = (runs[-1][0], rowid)
            else:
                runs.append((rowid, rowid))
        for first, last in runs:
            self._conn.execute(
                "INSERT INTO memories_fts (rowid, content, attachment_text, bigram_text) "
                "SELECT rowid, content, attachment_text, bigram_text FROM memories "
                "WHERE rowid BETWEEN ? AND ?",
                (first, last),
            )

    def resolve(self, tenant: str, id: str) -> str | None:
        row = self._conn.execute(
            "SELECT id FROM memories WHERE tenant = ? AND id = ?", (tenant, id)
        ).fetchone()
        if row:
            return str(row[0])
        row = self._conn.execute(
            "SELECT m.id FROM aliases a JOIN memories m ON m.rowid = a.memory_rowid "
            "WHERE a.tenant = ? AND a.id = ?",
            (tenant, id),
        ).fetchone()
        if row:
            return str(row[0])
        return self._resolve_retired(tenant, [id]).get(id)

    def resolve_many(self, tenant: str, ids: Sequence[str]) -> dict[str, str]:
        out: dict[str, str] = {}
        unique = list(dict.fromkeys(ids))
        for start in range(0, len(unique), 500):
            chunk = unique[start : start + 500]
            marks = ",".join("?" * len(chunk))
            for (id_,) in self._conn.execute(
                f"SELECT id FROM memories WHERE tenant = ? AND id IN ({marks})", [tenant, *chunk]
            ):
                out[id_] = id_
            for alias, id_ in self._conn.execute(
                "SELECT a.id, m.id FROM aliases a JOIN memories m ON m.rowid = a.memory_rowid "
                f"WHERE a.tenant = ? AND a.id IN ({marks})",
                [tenant, *chunk],
            ):
                out.setdefault(alias, id_)
            # Compacted ids resolve to their summary (re-ingesting one is ``known``, not new).
            for gone, id_ in self._resolve_retired(
                tenant, [i for i in chunk if i not in out]
            ).items():
                out.setdefault(gone, id_)
        return out

    def find_targets(
        self,
        tenant: str,
        *,
        exact_scope: str,
        exact: Sequence[tuple[str | None, str]],
        exact_since: float,
        near: Sequence[tuple[str | None, str]],
        near_since: float,
        near_limit: int | None = None,
    ) -> list[FoldTarget]:
        found: dict[int, FoldTarget] = {}
        scope_column = "session" if exact_scope == "session" else "channel"
        # INDEXED BY: without statistics the planner prefers memories_recent for the session
        # lookup (tenant, session, kind), a scan of the whole session that grows with the store.
        exact_index = "memories_exact_session" if exact_scope == "session" else "memories_exact"
        lookups = [
            (scope_column, "content_hash", exact, exact_since, exact_index),
            ("channel", "near_key", near, near_since, "memories_near"),
        ]
        rows_since: dict[float, int] = {}
        for scope, key, pairs, since, index in lookups:
            wanted = set(pairs)
            if not wanted:
                continue
            first = bucket_of(since)
            lookup = _Lookup(tenant, index, scope, key, wanted, since)
            plan = self._probe_plan(lookup, first, rows_since)
            if plan == []:
                continue  # none of these scopes has a message seen within the window
            statements = (
                _seek_statements(lookup, plan)
                if plan is not None
                else _scan_statements(lookup, first)
            )
            for sql, params in statements:
                if key == "near_key" and near_limit is not None:
                    sql, params = _newest_per_key(sql, params, near_limit)
                _keep_wanted(found, self._conn.execute(sql, params), scope, key, wanted)
        return list(found.values())

    def _probe_plan(
        self, lookup: _Lookup, first: int, rows_since: dict[float, int]
    ) -> list[int] | None:
        """The buckets to seek for each pair of ``wanted`` (from ``first`` to the newest of
        their scopes), [] when their scopes have no message seen within the window, or None
        when reading the window's index entries once costs less than the seeks."""
        tenant, index, scope, key, wanted, since = lookup
        if len(wanted) > _SEEK_PAIRS:
            return None
        # Seeking costs ~8 times reading one index entry: worth it when the window holds more
        # than 8 entries per (pair, bucket). The estimate of its entries: the rows stored since
        # the tenant's first message created in the window (two seeks; rowids are allocated in
        # arrival order). Messages arriving in time order make it the tenant's messages in the
        # window, an upper bound for any one scope; a store filled newest first makes it low,
        # and the lookup scans, as it always did. Either plan finds the same targets.
        estimate = rows_since.get(since)
        if estimate is None:
            row = self._conn.execute(
                "SELECT rowid FROM memories INDEXED BY memories_kind WHERE tenant = ? "
                "AND kind = 'message' AND created_at >= ? ORDER BY created_at LIMIT 1",
                (tenant, since),
            ).fetchone()
            estimate = 0
            if row is not None:
                (top,) = self._conn.execute("SELECT max(rowid) FROM memories").fetchone()
                estimate = top - row[0] + 1
            rows_since[since] = estimate
        if len(wanted) * _SEEK_COST > estimate:
            return None
        values = sorted({p[0] for p in wanted}, key=_scope_order)
        # Per scope value, its newest bucket: one seek each, in index order.
        (newest,) = self._conn.execute(
            f"SELECT max((SELECT {_BUCKET} FROM memories INDEXED BY {index} WHERE tenant = ? "
            f"AND {scope} IS v.column1 AND {key} IS NOT NULL ORDER BY {_BUCKET} DESC LIMIT 1)) "
            f"FROM (VALUES {','.join(['(?)'] * len(values))}) AS v",
            [tenant, *values],
        ).fetchone()
        if newest is None or newest < first:
            return []
        buckets = newest - first + 1
        if buckets > _SEEK_BUCKETS or len(wanted) * buckets * _SEEK_COST > estimate:
            return None
        return list(range(first, newest + 1))

    def update_aggregates(self, updates: Sequence[AggregateUpdate]) -> None:
        self._conn.executemany(
            "UPDATE memories SET dup_count = dup_count + ?, "
            "latest_content = CASE WHEN ? >= last_seen_at THEN ? ELSE latest_content END, "
            "last_seen_at = max(last_seen_at, ?) WHERE rowid = ?",
            [
                (u.folded, u.last_seen_at, u.latest_content, u.last_seen_at, u.rowid)
                for u in updates
            ],
        )

    def add_aliases(self, aliases: Sequence[Alias]) -> list[str]:
        # Writers are serialised: resolve_many saw every id, none can be taken meanwhile.
        self._conn.executemany(
            "INSERT INTO aliases (tenant, id, memory_rowid, status, created_at, session) "
            "VALUES (?, ?, ?, ?, ?, ?)",
            [(a.tenant, a.id, a.rowid, a.status, a.created_at, a.session) for a in aliases],
        )
        return []

    def insert(self, memory: NewMemory) -> int:
        row = memory_row(None, memory)
        cursor = self._conn.execute(_INSERT_MEMORY, (*row, bigram_column(row[8], row[26])))
        rowid = cursor.lastrowid
        assert rowid is not None
        self._unindexed.append(rowid)
        self._next_rowid = None  # read again: this row took max(rowid) + 1
        return rowid

    def insert_or_fold(
        self, memory: NewMemory, *, heads: Sequence[str] = (), since: float = 0.0
    ) -> tuple[str, int, str]:
        return self.insert_row_or_fold(memory_row(None, memory)[1:], heads=heads, since=since)

    def insert_row_or_fold(
        self, values: tuple[Any, ...], *, heads: Sequence[str] = (), since: float = 0.0
    ) -> tuple[str, int, str]:
        # BEGIN IMMEDIATE serialises writers: nothing was committed since the caller's lookups.
        rowid = self._next_rowid
        if rowid is None:
            (top,) = self._conn.execute("SELECT max(rowid) FROM memories").fetchone()
            rowid = (top or 0) + 1
        self._next_rowid = rowid + 1
        # values: memory_row(None, memory)[1:] (id, tenant, session, channel, author,
        # author_kind, role, content, created_at, thread_id, reply_to, kind, pinned, name,
        # tool_calls, tool_call_id, attachments, metadata, content_hash, near_key, last_seen_at,
        # source_ids, time_start, time_end, end_user, attachment_text).
        # ASCII text (most) has no bigrams: the check costs ~0.1 us.
        bigrams = (
            None
            if values[25] is None and values[7].isascii()
            else bigram_column(values[7], values[25])
        )
        if (
            values[9:11] == _NONE_2
            and values[13:18] == _NONE_5
            and values[21:24] == _NONE_3
            and bigrams is None
        ):
            self._queued.append(
                (rowid, *values[:9], values[11], values[12], *values[18:21], values[24])
            )
        else:
            self._queued.append((rowid, *values, bigrams))
        self._unindexed.append(rowid)
        return ("stored", rowid, values[0])

    def put_token_counts(self, counts: Sequence[TokenCount]) -> None:
        self._conn.executemany(
            "INSERT OR REPLACE INTO token_counts (memory_rowid, tokenizer, message, line) "
            "VALUES (?, ?, ?, ?)",
            [(c.rowid, c.tokenizer, c.message, c.line) for c in counts],
        )

    # -- erasure (the rest in store/writes.py) ----------------------------------------------

    def _summaries_citing(self, tenant: str, ids: Sequence[str]) -> list[int]:
        return [
            r
            for (r,) in self._conn.execute(
                "SELECT rowid FROM memories WHERE tenant = ? AND kind = 'summary' "
                "AND source_ids IS NOT NULL AND EXISTS (SELECT 1 FROM "
                "json_each(memories.source_ids) s WHERE s.value IN "
                "(SELECT value FROM json_each(?)))",
                (tenant, json.dumps(ids)),
            )
        ]

    # -- what store/writes.py needs -------------------------------------------------------------

    def _rows(self, sql: str, params: Sequence[Any]) -> list[Any]:
        return self._conn.execute(sql, params).fetchall()

    def _run(self, sql: str, params: Sequence[Any]) -> None:
        self._conn.execute(sql, params)

    def _run_many(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        self._conn.executemany(sql, rows)

    def _before_delete(self) -> None:
        self.flush()  # the FTS delete trigger needs every row indexed first
