"""The PostgreSQL backend: several stateless ctxwarden servers over one database.

psycopg 3 with a connection pool (``psycopg_pool``); install with ``pip install
'ctxwarden[postgres]'``. Every write is one transaction (READ COMMITTED). Concurrent ingest is
made safe by the schema, not by application locks: caller ids are unique per tenant
(``INSERT ... ON CONFLICT DO NOTHING``), and the newest memory of each ``(tenant, scope,
content_hash)`` is claimed through ``exact_heads`` with ``INSERT ... ON CONFLICT DO UPDATE``, which
makes a second, simultaneous ingest of the same message wait for the first and fold into it.
Folds decided from rows read earlier in the transaction are written as increments
(``dup_count = dup_count + n``), and aliases that another writer took meanwhile are reported back
(the record is ``known``), so no update is lost. A deadlock between two writers' row locks is
raised as :class:`~ctxwarden.errors.ConflictError`, which the engine retries.

Lexical search: a stored ``tsvector`` (``english``) with a GIN index, ranked by BM25 computed in
SQL with per-tenant document frequencies (:mod:`ctxwarden.store.pg_lexical`), dropping common
terms as the SQLite backend does.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np
import numpy.typing as npt
import psycopg
from psycopg_pool import ConnectionPool

from ctxwarden.errors import ConflictError, InputError, StoreError
from ctxwarden.scope import ReadScope
from ctxwarden.store import pg_migrations
from ctxwarden.store.base import (
    AggregateUpdate,
    Alias,
    ApiKey,
    ContextLog,
    FoldTarget,
    NewMemory,
    TokenCount,
)
from ctxwarden.store.pg_lexical import Lexical
from ctxwarden.store.reads import (
    CONTEXT_COLUMNS,
    MEMORY_COLUMNS,
    MemoryReads,
    context_row,
    memory_of,
    memory_row,
    scope_sql,
)
from ctxwarden.store.sqlite import _TARGET_COLUMNS, _keep_wanted
from ctxwarden.store.writes import ACCESS_UPSERT, MemoryWrites, access_bump
from ctxwarden.types import Memory

__all__ = ["PostgresStore"]

log = logging.getLogger(__name__)


_INSERT_MEMORY = (
    "INSERT INTO memories (rowid, id, tenant, session, channel, author, author_kind, role, "
    "content, created_at, thread_id, reply_to, kind, pinned, name, tool_calls, tool_call_id, "
    "attachments, metadata, content_hash, near_key, last_seen_at, source_ids, time_start, "
    "time_end, end_user) "
    "VALUES (coalesce(%s, nextval(pg_get_serial_sequence('memories', 'rowid'))), "
    "%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, "
    "%s, %s, %s)"
)

Conn = psycopg.Connection[tuple[Any, ...]]


#: The inclusion log's access-stats bump in PostgreSQL's dialect.
_ACCESS_BUMP = access_bump("greatest")

#: ``memories`` is analysed once this store has inserted this many rows, or a tenth of the
#: table, since it was last analysed (see ``PostgresStore._analyse``).
_ANALYZE_ROWS = 1000
_ANALYZE_SHARE = 0.1


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
        row = self._one(
            "SELECT m.id FROM tombstones t JOIN memories m "
            "ON m.tenant = t.tenant AND m.id = t.summary_id WHERE t.tenant = %s AND t.id = %s",
            (tenant, id),
        )
        return str(row[0]) if row else None

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
        for gone, id_ in self._conn.execute(
            "SELECT t.id, m.id FROM tombstones t JOIN memories m "
            "ON m.tenant = t.tenant AND m.id = t.summary_id "
            "WHERE t.tenant = %s AND t.id = ANY(%s)",
            (tenant, unique),
        ):
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
            "INSERT INTO aliases (tenant, id, memory_rowid, status, created_at) "
            "SELECT a.tenant, a.id, a.rowid, a.status, a.at FROM unnest("
            "%s::text[], %s::text[], %s::bigint[], %s::text[], %s::float8[]) "
            "AS a(tenant, id, rowid, status, at) WHERE NOT EXISTS (SELECT 1 FROM memories m "
            "WHERE m.tenant = a.tenant AND m.id = a.id) "
            "ON CONFLICT (tenant, id) DO NOTHING RETURNING tenant, id",
            (
                [a.tenant for a in aliases],
                [a.id for a in aliases],
                [a.rowid for a in aliases],
                [a.status for a in aliases],
                [a.created_at for a in aliases],
            ),
        ).fetchall()
        added = {(r[0], r[1]) for r in rows}
        return [a.id for a in aliases if (a.tenant, a.id) not in added]

    def insert(self, memory: NewMemory) -> int:
        row = self._one(_INSERT_MEMORY + " RETURNING rowid", memory_row(None, memory))
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


class PostgresStore(MemoryReads):
    """PostgreSQL storage for ctxwarden: ``PostgresStore("postgresql://user@host/db")``.

    Applies pending migrations on open (once, even when several servers open together).
    """

    def __init__(self, dsn: str, *, min_size: int = 1, max_size: int = 4) -> None:
        self.dsn = dsn
        try:
            with psycopg.connect(dsn, autocommit=True) as conn:
                pg_migrations.apply(conn)
            self._pool: ConnectionPool[Conn] = ConnectionPool(
                dsn, min_size=min_size, max_size=max_size, open=True, timeout=30.0
            )
        except psycopg.Error as exc:
            raise StoreError(f"cannot open PostgreSQL database: {exc}") from exc
        self._closed = False
        self._lexical = Lexical()
        self._inserted = 0  # rows of memories this store inserted since it last analysed
        self._analysed_rows = 0.0  # the table's rows then (pg_class.reltuples)

    # -- writes -----------------------------------------------------------------------------

    @contextmanager
    def write(self) -> Iterator[_PostgresWriter]:
        """One write transaction: commits at the end, rolls back if the block raises."""
        self._check_open()
        try:
            with self._pool.connection() as conn, conn.transaction():
                writer = _PostgresWriter(conn)
                yield writer
        except (psycopg.errors.DeadlockDetected, psycopg.errors.SerializationFailure) as exc:
            raise ConflictError(f"write conflicted with a concurrent writer, retry: {exc}") from exc
        self._inserted += writer.inserted
        if self._inserted >= max(_ANALYZE_ROWS, _ANALYZE_SHARE * self._analysed_rows):
            self._analyse()

    def _analyse(self) -> None:
        """``ANALYZE memories``: the de-dup lookups need statistics to be planned on their
        indexes. Without them (a table that grew faster than autovacuum looked: it wakes once
        a minute) the planner took ``memories_kind`` for them and read every message of the
        tenant: ~9 ms per lookup at 20,000 messages instead of ~0.02. Like autovacuum's own
        rule, once per tenth of growth (counted from this store's inserts), so the cost per
        row stays small. The write it follows is committed: a failure here is logged, not
        raised (autovacuum analyses in time anyway)."""
        self._inserted = 0
        try:
            with self._pool.connection() as conn, conn.transaction():
                conn.execute("ANALYZE memories")
                row = conn.execute(
                    "SELECT reltuples FROM pg_class WHERE oid = 'memories'::regclass"
                ).fetchone()
        except psycopg.Error as exc:
            log.warning("ANALYZE memories failed (the lookups may be slow until it runs): %s", exc)
            return
        self._analysed_rows = float(row[0]) if row else 0.0

    def put_token_counts(self, counts: Sequence[TokenCount]) -> None:
        """Cache token counts computed after ingest."""
        if not counts:
            return
        with self.write() as writer:
            writer.put_token_counts(counts)

    def log_context(self, entry: ContextLog) -> None:
        """Write the inclusion log and bump access stats (count, time, decayed score, tokens)."""
        self.log_contexts([entry])

    def log_contexts(self, entries: Sequence[ContextLog]) -> None:
        """Several entries in one transaction (one commit), all or none; see the protocol.

        Each entry's access rows are locked in rowid order (see :meth:`_log_one`), but two
        entries of one list may not be in order with each other: the existing access rows of
        the whole list are locked first, in rowid order (after their memory rows, as a single
        entry and a merge lock them), so a concurrent writer can conflict only on a memory's
        first access row (a rare :class:`ConflictError`; the engine's log
        writer then writes the entries one by one)."""
        if not entries:
            return
        with self.write() as writer:
            conn = writer._conn
            if len(entries) > 1:
                # memories before memory_access, as a single entry and a merge lock them
                rowids = sorted({i.rowid for e in entries for i in e.inclusions})
                conn.execute(
                    "SELECT 1 FROM memories WHERE rowid = ANY(%s) ORDER BY rowid FOR KEY SHARE",
                    (rowids,),
                ).fetchall()
                conn.execute(
                    "SELECT 1 FROM memory_access WHERE memory_rowid = ANY(%s) "
                    "ORDER BY memory_rowid FOR UPDATE",
                    (rowids,),
                ).fetchall()
            for entry in entries:
                self._log_one(conn, entry)

    @staticmethod
    def _log_one(conn: Conn, entry: ContextLog) -> None:
        """One context's statements, inside a write transaction."""
        row = conn.execute(
            f"INSERT INTO contexts ({CONTEXT_COLUMNS}) "
            "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s) RETURNING rowid",
            context_row(entry),
        ).fetchone()
        assert row is not None
        if not entry.inclusions:
            return
        now = entry.created_at
        with conn.cursor() as cur:
            cur.executemany(
                "INSERT INTO inclusions (context_rowid, position, memory_id, block, tokens) "
                "VALUES (%s, %s, %s, %s, %s)",
                [
                    (row[0], position, inc.id, inc.block, inc.tokens)
                    for position, inc in enumerate(entry.inclusions)
                ],
            )
            # One upsert of the narrow memory_access rows (migration 8), one per memory
            # (a memory listed twice sums its tokens). The memory rows are key-share locked
            # first, in rowid order, so concurrent assemblers never deadlock, a memory erased
            # meanwhile is skipped (not a foreign-key error), and a merge (which locks them
            # for update) waits or is waited for.
            tokens: dict[int, int] = {}
            for inc in entry.inclusions:
                tokens[inc.rowid] = tokens.get(inc.rowid, 0) + inc.tokens
            ordered = sorted(tokens)
            cur.execute(
                "WITH inc AS (SELECT m.rowid, t.tokens FROM memories m JOIN "
                "unnest(%s::bigint[], %s::bigint[]) AS t(rowid, tokens) "
                "ON m.rowid = t.rowid ORDER BY m.rowid FOR KEY SHARE OF m) "
                f"{ACCESS_UPSERT} SELECT rowid, 1, %s, 1.0, %s, tokens FROM inc "
                f"ORDER BY rowid {_ACCESS_BUMP}",
                (ordered, [tokens[r] for r in ordered], now, now),
            )

    # -- reads ------------------------------------------------------------------------------

    _PINNED = "pinned"
    _CODE_POINT_ORDER = ' COLLATE "C"'

    def _read(self, sql: str, params: Sequence[Any]) -> list[Any]:
        return self._query(sql.replace("?", "%s"), params)

    def _query(self, sql: str, params: Sequence[Any] | Mapping[str, Any]) -> list[tuple[Any, ...]]:
        self._check_open()
        try:
            with self._pool.connection() as conn:
                return conn.execute(sql, params).fetchall()
        except psycopg.Error as exc:
            raise StoreError(f"query failed: {exc}") from exc

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
        """tsvector/GIN search, any term (a phrase each), ranked by BM25 as FTS5 ranks it
        (per-tenant IDF, saturated term frequency, length normalisation; common terms dropped
        as on SQLite): see :mod:`ctxwarden.store.pg_lexical`. Positive scores, higher is better.
        ``known`` is accepted and not used: one statement ranks and reads the rows here.
        ``scope`` filters in that statement's WHERE, before its limits.
        """
        plan = self._lexical.statement(
            self._query, tenant, terms, limit, require=require, scope=scope
        )
        if plan is None:
            return []
        rows = self._query(*plan)
        return [(memory_of(r[:-1]), max(float(r[-1]), 1e-9)) for r in rows]

    def token_counts(self, rowids: Sequence[int], tokenizer: str) -> dict[int, TokenCount]:
        """Cached counts for these rowids under ``tokenizer``."""
        ids = list(rowids)
        if not ids:
            return {}
        rows = self._query(
            "SELECT memory_rowid, message, line FROM token_counts WHERE tokenizer = %s "
            "AND memory_rowid = ANY(%s)",
            (tokenizer, ids),
        )
        return {
            int(r[0]): TokenCount(rowid=int(r[0]), tokenizer=tokenizer, message=r[1], line=r[2])
            for r in rows
        }

    # -- compaction (ctxwarden.compact) ---------------------------------------------------------

    def vacuum(self) -> None:
        """Reclaim space after compaction: ``VACUUM (ANALYZE)`` of the tables compaction
        rewrites (outside a transaction; space becomes reusable, the files do not shrink)."""
        self._check_open()
        try:
            with psycopg.connect(self.dsn, autocommit=True) as conn:
                for table in ("memories", "aliases", "token_counts", "tombstones"):
                    conn.execute(f"VACUUM (ANALYZE) {table}")  # fixed names, no user input
        except psycopg.Error as exc:
            raise StoreError(f"vacuum failed: {exc}") from exc

    def execute(self, sql: str, params: Sequence[Any] = ()) -> None:
        """Run one maintenance statement in its own transaction (tests, admin tasks)."""
        with self.write() as writer:
            writer._conn.execute(sql, params)

    def close(self) -> None:
        """Close the pool. Idempotent."""
        if not self._closed:
            self._closed = True
            self._pool.close()

    def _check_open(self) -> None:
        if self._closed:
            raise StoreError("the store is closed; open a new one")

    def scrub(self) -> None:
        """Nothing to do per delete: deleted rows are gone from every query at commit, and
        (auto)vacuum reclaims their space. For a byte-level guarantee on disk run
        ``VACUUM FULL`` in a maintenance window (it rewrites the tables)."""
        self._check_open()

    # -- API keys (the KeyStore seam) ---------------------------------------------------------

    def put_api_key(self, key: ApiKey) -> None:
        """Insert an API key (its secret's hash only)."""
        try:
            with self.write() as writer:
                writer._conn.execute(
                    "INSERT INTO api_keys (key_id, tenant, scopes, secret_hash, name, created_at, "
                    "revoked_at) VALUES (%s, %s, %s, %s, %s, %s, %s)",
                    (
                        key.key_id,
                        key.tenant,
                        " ".join(sorted(key.scopes)),
                        key.secret_hash,
                        key.name,
                        key.created_at,
                        key.revoked_at,
                    ),
                )
        except psycopg.errors.UniqueViolation as exc:
            raise ConflictError(f"api key {key.key_id!r} exists: issue a new one") from exc

    def revoke_api_key(self, key_id: str, at: float) -> bool:
        """Revoke a key; False if unknown."""
        with self.write() as writer:
            cursor = writer._conn.execute(
                "UPDATE api_keys SET revoked_at = coalesce(revoked_at, %s) WHERE key_id = %s",
                (at, key_id),
            )
            return cursor.rowcount > 0

    # -- vectors (added on branch ``retrieve``) ----------------------------------------------

    def put_vectors(
        self, model: str, rowids: Sequence[int], vectors: npt.NDArray[np.float32]
    ) -> int:
        """Store one vector per rowid under ``model`` in ``memory_vectors`` (pgvector)."""
        matrix = np.asarray(vectors, dtype=np.float32)
        if matrix.ndim != 2 or matrix.shape[0] != len(rowids):
            raise InputError(
                f"{len(rowids)} rowids but vectors of shape {matrix.shape}: pass one row each",
                field="vectors",
            )
        if not rowids:
            return 0
        if matrix.shape[1] != _VECTOR_DIM:
            raise InputError(
                f"the PostgreSQL schema keeps {_VECTOR_DIM}-d vectors, these are "
                f"{matrix.shape[1]}-d: use a {_VECTOR_DIM}-d embedder (the default 'minilm')",
                field="vectors",
            )
        rows = [(int(r), model, _literal(v)) for r, v in zip(rowids, matrix, strict=True)]
        with self.write() as writer:
            stored = 0
            for row in rows:
                cursor = writer._conn.execute(
                    "INSERT INTO memory_vectors (memory_rowid, model, embedding) "
                    "SELECT %s, %s, %s::vector FROM memories WHERE rowid = %s "
                    "ON CONFLICT (memory_rowid, model) "
                    "DO UPDATE SET embedding = excluded.embedding",
                    (*row, row[0]),
                )
                stored += max(0, cursor.rowcount)
        return stored

    def pending_embeddings(
        self, model: str, *, after: int = 0, limit: int = 256
    ) -> list[tuple[int, str]]:
        """Memories with text and no ``model`` vector, ``(rowid, content)``, rowid > ``after``."""
        rows = self._query(
            "SELECT m.rowid, m.content FROM memories m WHERE m.rowid > %s AND m.content <> '' "
            "AND m.role <> 'tool' AND NOT EXISTS (SELECT 1 FROM memory_vectors v "
            "WHERE v.memory_rowid = m.rowid AND v.model = %s) ORDER BY m.rowid LIMIT %s",
            (after, model, limit),
        )
        return [(int(r[0]), str(r[1])) for r in rows]

    def vector_models(self) -> dict[str, int]:
        """How many vectors each embedding model has in the store."""
        rows = self._query(
            "SELECT model, count(*) FROM memory_vectors GROUP BY model ORDER BY model", ()
        )
        return {str(m): int(n) for m, n in rows}

    def drop_vectors(self, model: str) -> int:
        """Delete every vector of ``model``; returns how many."""
        with self.write() as writer:
            cursor = writer._conn.execute("DELETE FROM memory_vectors WHERE model = %s", (model,))
            return max(0, cursor.rowcount)

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
        """pgvector cosine ``<=>`` over the HNSW index, filtered by tenant (session, author).

        A read scope narrower than the tenant (a session's, an end user's rows) is searched
        exactly over its rows (a materialised set of rowids first): the HNSW iterative scan
        stops after ``hnsw.max_scan_tuples`` and could return fewer than ``k`` of them.
        """
        query = np.asarray(vector, dtype=np.float32).reshape(-1)
        if k < 1:
            return []
        if query.shape[0] != _VECTOR_DIM:
            raise InputError(
                f"query vector has {query.shape[0]} dimensions, the store keeps {_VECTOR_DIM}: "
                "embed the query with the store's embedder",
                field="vector",
            )
        literal = _literal(query)
        extra = " AND m.session = %s" if session is not None else ""
        params: list[Any] = [literal, model, tenant]
        if session is not None:
            params.append(session)
        if author is not None:
            extra += " AND m.author = %s"
            params.append(author)
        params.extend([literal, k])
        cols = ", ".join("m." + c.strip() for c in MEMORY_COLUMNS.split(","))
        read_filter, read_params = scope_sql(scope)
        if read_filter:
            extra += read_filter.replace("?", "%s")
            narrowed = extra.replace("m.", "")
            rows = self._query(
                f"WITH s AS MATERIALIZED (SELECT rowid FROM memories WHERE tenant = %s"
                f"{narrowed}) SELECT {cols}, 1 - (v.embedding <=> %s::vector) AS score "
                "FROM s JOIN memory_vectors v ON v.memory_rowid = s.rowid AND v.model = %s "
                "JOIN memory_rows m ON m.rowid = s.rowid "
                "ORDER BY v.embedding <=> %s::vector, m.rowid LIMIT %s",
                [tenant, *params[3:-2], *read_params, literal, model, literal, k],
            )
            found = [(memory_of(r[:-1]), float(r[-1])) for r in rows]
            found.sort(key=lambda pair: (-pair[1], pair[0].rowid))
            return found
        self._check_open()
        try:
            with self._pool.connection() as conn, conn.transaction():
                # Iterative scans keep looking past other tenants' rows until k are found.
                conn.execute("SET LOCAL hnsw.ef_search = 200")
                conn.execute("SET LOCAL hnsw.iterative_scan = relaxed_order")
                rows = conn.execute(
                    f"SELECT {cols}, 1 - (v.embedding <=> %s::vector) AS score "
                    "FROM memory_vectors v JOIN memory_rows m ON m.rowid = v.memory_rowid "
                    f"WHERE v.model = %s AND m.tenant = %s{extra} "
                    "ORDER BY v.embedding <=> %s::vector, m.rowid LIMIT %s",
                    params,
                ).fetchall()
        except psycopg.Error as exc:
            raise StoreError(f"vector search failed: {exc}") from exc
        found = [(memory_of(r[:-1]), float(r[-1])) for r in rows]
        found.sort(key=lambda pair: (-pair[1], pair[0].rowid))
        return found

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
        """Messages of ``tenant`` in ``channel`` by ``author`` in layer C's window, with their
        ``model`` vector, oldest first."""
        cols = ", ".join("m." + c.strip() for c in MEMORY_COLUMNS.split(","))
        rows = self._query(
            f"SELECT {cols}, v.embedding::text FROM memory_rows m JOIN memory_vectors v "
            "ON v.memory_rowid = m.rowid AND v.model = %s WHERE m.tenant = %s "
            "AND m.author IS NOT DISTINCT FROM %s AND m.channel IS NOT DISTINCT FROM %s "
            "AND m.kind = 'message' AND m.last_seen_at >= %s AND m.created_at <= %s "
            "ORDER BY m.created_at, m.rowid",
            (model, tenant, author, channel, seen_since, created_until),
        )
        return [(memory_of(r[:-1]), np.array(json.loads(r[-1]), dtype=np.float32)) for r in rows]


#: Length of ``memory_vectors.embedding`` in the PostgreSQL schema (migration ``vectors``).
_VECTOR_DIM = 384


def _literal(vector: npt.NDArray[np.float32]) -> str:
    return "[" + ",".join(f"{float(x):.7g}" for x in vector) + "]"
