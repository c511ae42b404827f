"""The PostgreSQL backend's write transaction: :class:`_PostgresWriter`.

Moved out of :mod:`ctxwarden.store.postgres`, whose :meth:`PostgresStore.write
<ctxwarden.store.postgres.PostgresStore.write>` hands one out per transaction (its module
docstring tells how concurrent writers are kept safe). The statements both backends share are in
:mod:`ctxwarden.store.writes`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import psycopg

from ctxwarden.errors import StoreError, StoreUnavailable
from ctxwarden.store.base import AggregateUpdate, Alias, FoldTarget, NewMemory, TokenCount
from ctxwarden.store.reads import bigram_column, memory_row
from ctxwarden.store.sqlite_writer import _TARGET_COLUMNS, _keep_wanted
from ctxwarden.store.writes import MemoryWrites

__all__ = ["Conn", "store_failure", "timeout_settings"]


def timeout_settings(timeout: float) -> tuple[str, ...]:
    """The session settings that bound a connection's waits by the store's ``timeout``
    (seconds): ``lock_timeout`` (a lock another transaction holds) and ``statement_timeout``
    (one statement). Write transactions lift the statement bound (``SET LOCAL``): an erasure of
    a large tenant may run long, but its waits for locks stay bounded.

    >>> timeout_settings(5)
    ('SET lock_timeout = 5000', 'SET statement_timeout = 5000')
    """
    ms = max(1, round(timeout * 1000))
    return (f"SET lock_timeout = {ms}", f"SET statement_timeout = {ms}")


def store_failure(exc: Exception, doing: str, timeout: float) -> StoreError:
    """The error a psycopg (or pool) failure while ``doing`` something stands for: a wait past
    the store's ``timeout`` is :class:`~ctxwarden.errors.StoreUnavailable` (``locked``: a lock
    held by another transaction; ``timeout``: a statement that ran too long; ``busy``: every
    pooled connection in use), as SQLite's busy timeout is; anything else a StoreError."""
    from psycopg_pool import PoolTimeout

    setting = f"{timeout:g}s (the store_timeout setting)"
    if isinstance(exc, psycopg.errors.LockNotAvailable):
        return StoreUnavailable(
            "locked",
            f"{doing}: another transaction held a lock for over {setting}; nothing was "
            "changed: retry",
        )
    if isinstance(exc, psycopg.errors.QueryCanceled):
        return StoreUnavailable(
            "timeout",
            f"{doing}: the statement did not finish within {setting}, waiting on a lock "
            "another transaction holds or running; nothing was changed: retry",
        )
    if isinstance(exc, PoolTimeout):
        return StoreUnavailable(
            "busy", f"{doing}: no database connection was free within {setting}: retry"
        )
    return StoreError(f"{doing} failed: {exc}")


_INSERT_MEMORY = (
    "INSERT INTO memories (rowid, id, tenant, session, channel, author, author_kind, role, "
    "content, created_at, thread_id, reply_to, kind, pinned, name, tool_calls, tool_call_id, "
    "attachments, metadata, content_hash, near_key, last_seen_at, source_ids, time_start, "
    "time_end, end_user, attachment_text, bigram_text) "
    "VALUES (coalesce(%s, nextval(pg_get_serial_sequence('memories', 'rowid'))), "
    "%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, "
    "%s, %s, %s, %s, %s)"
)

Conn = psycopg.Connection[tuple[Any, ...]]


class _PostgresWriter(MemoryWrites):
    _LOCK_ROWS = " FOR UPDATE"

    def __init__(self, conn: Conn) -> None:
        self._conn = conn
        self.inserted = 0  # rows of memories inserted (PostgresStore.write analyses by it)

    def _one(self, sql: str, params: Sequence[Any]) -> tuple[Any, ...] | None:
        return self._conn.execute(sql, params).fetchone()

    def resolve(self, tenant: str, id: str) -> str | None:
        row = self._one("SELECT id FROM memories WHERE tenant = %s AND id = %s", (tenant, id))
        if row:
            return str(row[0])
        row = self._one(
            "SELECT m.id FROM aliases a JOIN memories m ON m.rowid = a.memory_rowid "
            "WHERE a.tenant = %s AND a.id = %s",
            (tenant, id),
        )
        if row:
            return str(row[0])
        return self._resolve_retired(tenant, [id]).get(id)

    def resolve_many(self, tenant: str, ids: Sequence[str]) -> dict[str, str]:
        unique = list(dict.fromkeys(ids))
        out: dict[str, str] = {}
        for (id_,) in self._conn.execute(
            "SELECT id FROM memories WHERE tenant = %s AND id = ANY(%s)", (tenant, unique)
        ):
            out[id_] = id_
        for alias, id_ in self._conn.execute(
            "SELECT a.id, m.id FROM aliases a JOIN memories m ON m.rowid = a.memory_rowid "
            "WHERE a.tenant = %s AND a.id = ANY(%s)",
            (tenant, unique),
        ):
            out.setdefault(alias, id_)
        # Compacted ids resolve to their summary (re-ingesting one is ``known``, not new).
        for gone, id_ in self._resolve_retired(tenant, [i for i in unique if i not in out]).items():
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
        lookups = [
            (scope_column, "content_hash", exact, exact_since),
            ("channel", "near_key", near, near_since),
        ]
        for scope, key, pairs, since in lookups:
            wanted = set(pairs)
            if not wanted:
                continue
            values = sorted({p[0] for p in wanted if p[0] is not None})
            keys = sorted({p[1] for p in wanted})
            arms = []
            if values:
                arms.append((f"{scope} = ANY(%s)", [values]))
            if any(p[0] is None for p in wanted):
                arms.append((f"{scope} IS NULL", []))
            for arm, arm_params in arms:
                sql = (
                    f"SELECT {_TARGET_COLUMNS} FROM memories WHERE tenant = %s AND {arm} "
                    f"AND {key} = ANY(%s) AND last_seen_at >= %s AND kind = 'message'"
                )
                params = [tenant, *arm_params, keys, since]
                if key == "near_key" and near_limit is not None:
                    sql = (
                        f"SELECT {_TARGET_COLUMNS} FROM (SELECT *, row_number() OVER "
                        "(PARTITION BY channel, near_key ORDER BY last_seen_at DESC, rowid DESC) "
                        f"AS newest FROM ({sql}) AS lookup) AS ranked WHERE newest <= %s"
                    )
                    params.append(near_limit)
                _keep_wanted(found, self._conn.execute(sql, params).fetchall(), scope, key, wanted)
        return list(found.values())

    def update_aggregates(self, updates: Sequence[AggregateUpdate]) -> None:
        # One row at a time in rowid order: two writers lock shared aggregates in the same order.
        with self._conn.cursor() as cursor:
            cursor.executemany(
                "UPDATE memories SET dup_count = dup_count + %s, "
                "latest_content = CASE WHEN %s >= last_seen_at THEN %s ELSE latest_content END, "
                "last_seen_at = greatest(last_seen_at, %s) WHERE rowid = %s",
                [
                    (u.folded, u.last_seen_at, u.latest_content, u.last_seen_at, u.rowid)
                    for u in sorted(updates, key=lambda u: u.rowid)
                ],
            )

    def add_aliases(self, aliases: Sequence[Alias]) -> list[str]:
        # An id another writer stored (as a memory or an alias) since resolve_many is not
        # re-added: it is returned, and the caller reports the record as known.
        rows = self._conn.execute(
            "INSERT INTO aliases (tenant, id, memory_rowid, status, created_at, session) "
            "SELECT a.tenant, a.id, a.rowid, a.status, a.at, a.session FROM unnest("
            "%s::text[], %s::text[], %s::bigint[], %s::text[], %s::float8[], %s::text[]) "
            "AS a(tenant, id, rowid, status, at, session) WHERE NOT EXISTS "
            "(SELECT 1 FROM memories m WHERE m.tenant = a.tenant AND m.id = a.id) "
            "ON CONFLICT (tenant, id) DO NOTHING RETURNING tenant, id",
            (
                [a.tenant for a in aliases],
                [a.id for a in aliases],
                [a.rowid for a in aliases],
                [a.status for a in aliases],
                [a.created_at for a in aliases],
                [a.session for a in aliases],
            ),
        ).fetchall()
        added = {(r[0], r[1]) for r in rows}
        return [a.id for a in aliases if (a.tenant, a.id) not in added]

    def insert(self, memory: NewMemory) -> int:
        values = memory_row(None, memory)
        row = self._one(
            _INSERT_MEMORY + " RETURNING rowid", (*values, bigram_column(values[8], values[26]))
        )
        assert row is not None
        self.inserted += 1
        return int(row[0])

    def insert_or_fold(
        self, memory: NewMemory, *, heads: Sequence[str] = (), since: float = 0.0
    ) -> tuple[str, int, str]:
        return self.insert_row_or_fold(memory_row(None, memory)[1:], heads=heads, since=since)

    def insert_row_or_fold(
        self, values: tuple[Any, ...], *, heads: Sequence[str] = (), since: float = 0.0
    ) -> tuple[str, int, str]:
        # The columns this method reads, by their place in memory_row(None, memory)[1:].
        id_, tenant, created_at, content_hash = values[0], values[1], values[8], values[18]
        values = (*values, bigram_column(values[7], values[25]))  # the column after them
        if not heads:
            row = self._one(
                _INSERT_MEMORY + " ON CONFLICT (tenant, id) DO NOTHING RETURNING rowid",
                (None, *values),
            )
            if row is not None:
                self.inserted += 1
                return ("stored", int(row[0]), id_)
            return self._known(tenant, id_)
        seq = self._one("SELECT nextval(pg_get_serial_sequence('memories', 'rowid'))", ())
        assert seq is not None
        mine = int(seq[0])
        # Claim the (tenant, scope, hash) heads in one order (two writers never wait on each
        # other crosswise): a concurrent claimant waits on the row lock until this transaction
        # ends, then sees the committed head and folds into it.
        target = mine
        claimed = False
        for scope in sorted(heads):
            head = self._one(
                "INSERT INTO exact_heads AS h (tenant, scope, content_hash, memory_rowid, "
                "last_seen_at) VALUES (%s, %s, %s, %s, %s) "
                "ON CONFLICT (tenant, scope, content_hash) DO UPDATE SET "
                "memory_rowid = CASE WHEN h.last_seen_at >= %s THEN h.memory_rowid "
                "ELSE excluded.memory_rowid END, "
                "last_seen_at = CASE WHEN h.last_seen_at >= %s "
                "THEN greatest(h.last_seen_at, excluded.last_seen_at) "
                "ELSE excluded.last_seen_at END "
                "RETURNING memory_rowid",
                (tenant, scope, content_hash, mine, created_at, since, since),
            )
            assert head is not None
            if int(head[0]) != mine:
                target = int(head[0])
                break
            claimed = True
        if target == mine:
            row = self._one(
                _INSERT_MEMORY + " ON CONFLICT (tenant, id) DO NOTHING RETURNING rowid",
                (mine, *values),
            )
            if row is not None:
                self.inserted += 1
                return ("stored", mine, id_)
        if claimed:  # not stored after all: give the heads claimed for it back
            self._conn.execute("DELETE FROM exact_heads WHERE memory_rowid = %s", (mine,))
        if target == mine:  # the id was stored by another writer meanwhile
            return self._known(tenant, id_)
        if self.resolve(tenant, id_) is not None:
            return self._known(tenant, id_)
        # Folding here is rare (a race with another writer), so one row at a time is fine.
        alias = self._one(
            "INSERT INTO aliases (tenant, id, memory_rowid, status, created_at) "
            "VALUES (%s, %s, %s, 'duplicate', %s) ON CONFLICT (tenant, id) DO NOTHING "
            "RETURNING memory_rowid",
            (tenant, id_, target, created_at),
        )
        if alias is None:
            return self._known(tenant, id_)
        row = self._one(
            "UPDATE memories SET dup_count = dup_count + 1, "
            "last_seen_at = greatest(last_seen_at, %s) WHERE rowid = %s RETURNING id",
            (created_at, target),
        )
        assert row is not None
        return ("duplicate", target, str(row[0]))

    def _known(self, tenant: str, id_: str) -> tuple[str, int, str]:
        row = self._one(
            "SELECT rowid, id FROM memories WHERE tenant = %s AND id = %s "
            "UNION ALL SELECT m.rowid, m.id FROM aliases a JOIN memories m "
            "ON m.rowid = a.memory_rowid WHERE a.tenant = %s AND a.id = %s LIMIT 1",
            (tenant, id_, tenant, id_),
        )
        if row is None:
            raise StoreError(f"id {id_!r} conflicted but cannot be found; retry the ingest")
        return ("known", int(row[0]), str(row[1]))

    def put_token_counts(self, counts: Sequence[TokenCount]) -> None:
        if not counts:
            return
        with self._conn.cursor() as cur:
            cur.executemany(
                "INSERT INTO token_counts (memory_rowid, tokenizer, message, line) "
                "VALUES (%s, %s, %s, %s) ON CONFLICT (memory_rowid, tokenizer) "
                "DO UPDATE SET message = excluded.message, line = excluded.line",
                [(c.rowid, c.tokenizer, c.message, c.line) for c in counts],
            )

    # -- erasure (the rest in store/writes.py) ----------------------------------------------

    _CHUNK = 1 << 62  # one array parameter per statement

    def _in(self, values: Sequence[Any]) -> tuple[str, list[Any]]:
        return "= ANY(?)", [list(values)]

    def _summaries_citing(self, tenant: str, ids: Sequence[str]) -> list[int]:
        return [
            int(r[0])
            for r in self._conn.execute(
                "SELECT rowid FROM memories WHERE tenant = %s AND kind = 'summary' "
                "AND source_ids IS NOT NULL AND source_ids::jsonb ?| %s::text[]",
                (tenant, list(ids)),
            )
        ]

    # -- what store/writes.py needs -------------------------------------------------------------

    def _rows(self, sql: str, params: Sequence[Any]) -> list[Any]:
        return self._conn.execute(sql.replace("?", "%s"), params).fetchall()

    def _run(self, sql: str, params: Sequence[Any]) -> None:
        self._conn.execute(sql.replace("?", "%s"), params)

    def _run_many(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        with self._conn.cursor() as cursor:
            cursor.executemany(sql.replace("?", "%s"), rows)
