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

The write transaction (:class:`_PostgresWriter`) is in :mod:`~ctxwarden.store.pg_writer` and
the vector methods in :mod:`~ctxwarden.store.pg_vectors` (a mixin over this store's pool).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg_pool import ConnectionPool, PoolTimeout

from ctxwarden.errors import ConfigError, ConflictError, StoreError
from ctxwarden.scope import ReadScope
from ctxwarden.store import pg_migrations
from ctxwarden.store.archive import ArchiveReads
from ctxwarden.store.base import (
    ApiKey,
    ContextLog,
    TokenCount,
)
from ctxwarden.store.pack_reads import PackReads
from ctxwarden.store.pg_lexical import Lexical
from ctxwarden.store.pg_neighbours import PostgresNeighbours
from ctxwarden.store.pg_vectors import PostgresVectors
from ctxwarden.store.pg_writer import Conn, _PostgresWriter, store_failure, timeout_settings
from ctxwarden.store.reads import (
    CONTEXT_COLUMNS,
    MemoryReads,
    context_row,
    memory_of,
)
from ctxwarden.store.sqlite_connection import STORE_TIMEOUT_SECONDS
from ctxwarden.store.writes import ACCESS_UPSERT, access_bump
from ctxwarden.types import Memory

__all__ = ["PostgresStore"]

log = logging.getLogger(__name__)


#: The inclusion log's access-stats bump in PostgreSQL's dialect.
_ACCESS_BUMP = access_bump("greatest")

#: ``memories`` is analysed once this store has inserted this many rows, or a tenth of the
#: table, since it was last analysed (see ``PostgresStore._analyse``).
_ANALYZE_ROWS = 1000
_ANALYZE_SHARE = 0.1


#: The advisory-lock key of a lease: its name within this schema (servers of other schemas in
#: the same database do not block each other).
_LEASE_KEY = "hashtext(current_schema() || ':' || %s)"


def _unlock(conn: Conn, name: str) -> None:
    """Let a lease's advisory lock go and close its connection (errors logged: a connection
    that is gone has let go already)."""
    try:
        conn.execute(f"SELECT pg_advisory_unlock({_LEASE_KEY})", (f"ctxwarden.{name}",))
    except psycopg.Error as exc:
        log.warning("releasing the lease %r: %s (its connection is closed anyway)", name, exc)
    finally:
        conn.close()


class PostgresStore(PackReads, PostgresVectors, PostgresNeighbours, MemoryReads, ArchiveReads):
    """PostgreSQL storage for ctxwarden: ``PostgresStore("postgresql://user@host/db")``.

    Applies pending migrations on open (once, even when several servers open together).

    ``timeout`` (seconds, ``EngineConfig.store_timeout``) bounds every wait on the database:
    for a lock another transaction holds (``lock_timeout``), for a read statement
    (``statement_timeout``) and for a free pooled connection. Past it a call raises
    :class:`~ctxwarden.errors.StoreUnavailable` (HTTP 503 with ``Retry-After``), the
    transaction rolled back, as the SQLite store does.
    """

    def __init__(
        self,
        dsn: str,
        *,
        min_size: int = 1,
        max_size: int = 4,
        timeout: float = STORE_TIMEOUT_SECONDS,
    ) -> None:
        if not timeout > 0:
            raise ConfigError(f"store_timeout: {timeout} must be above 0 seconds")
        self.dsn = dsn
        self.timeout = timeout
        settings = timeout_settings(timeout)

        def configure(conn: Conn) -> None:
            for statement in settings:
                conn.execute(statement)
            conn.commit()

        try:
            with psycopg.connect(dsn, autocommit=True) as conn:
                pg_migrations.apply(conn)
            self._pool: ConnectionPool[Conn] = ConnectionPool(
                dsn,
                min_size=min_size,
                max_size=max_size,
                open=True,
                timeout=timeout,
                configure=configure,
            )
        except psycopg.Error as exc:
            raise StoreError(f"cannot open PostgreSQL database: {exc}") from exc
        self._closed = False
        # Leases held by this store: name -> (owner, the connection holding the advisory lock).
        self._leases: dict[str, tuple[str, Conn]] = {}
        self._lease_lock = threading.Lock()
        self._lexical = Lexical()
        self._inserted = 0  # rows of memories this store inserted since it last analysed
        self._analysed_rows = 0.0  # the table's rows then (pg_class.reltuples)

    # -- writes -----------------------------------------------------------------------------

    @contextmanager
    def write(self, *, wait: float | None = None) -> Iterator[_PostgresWriter]:
        """One write transaction: commits at the end, rolls back if the block raises.
        ``wait``: the longest wait for a pooled connection and for each lock, in seconds (None:
        the store's :attr:`timeout`; never longer than it)."""
        self._check_open()
        limit = self.timeout if wait is None else max(0.001, min(wait, self.timeout))
        try:
            with self._pool.connection(timeout=limit) as conn, conn.transaction():
                conn.execute("SET LOCAL statement_timeout = 0")  # waits stay bounded: locks
                if wait is not None:
                    conn.execute(f"SET LOCAL lock_timeout = {max(1, round(limit * 1000))}")
                writer = _PostgresWriter(conn)
                yield writer
        except (psycopg.errors.DeadlockDetected, psycopg.errors.SerializationFailure) as exc:
            raise ConflictError(f"write conflicted with a concurrent writer, retry: {exc}") from exc
        except (
            psycopg.errors.LockNotAvailable,
            psycopg.errors.QueryCanceled,
            PoolTimeout,
        ) as exc:
            raise store_failure(exc, "writing", limit) from exc
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

    def put_token_counts(self, counts: Sequence[TokenCount], *, wait: float | None = None) -> None:
        """Cache token counts computed after ingest (``wait``: see :meth:`write`)."""
        if not counts:
            return
        with self.write(wait=wait) as writer:
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
            # COPY, not executemany: one statement for the ~200 rows of an 8k context
            # (executemany sends one prepared INSERT a row, ~3 ms of client time there).
            with cur.copy(
                "COPY inclusions (context_rowid, position, memory_id, block, tokens) FROM STDIN"
            ) as copy:
                for position, inc in enumerate(entry.inclusions):
                    copy.write_row((row[0], position, inc.id, inc.block, inc.tokens))
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

    def _query(
        self,
        sql: str,
        params: Sequence[Any] | Mapping[str, Any],
        *,
        prepare: bool | None = None,
    ) -> list[tuple[Any, ...]]:
        """One statement's rows. ``prepare``: psycopg's (None: prepared from its fifth run on a
        connection; False: never, so the server plans it for each run's values)."""
        self._check_open()
        try:
            with self._pool.connection() as conn:
                return conn.execute(sql, params, prepare=prepare).fetchall()
        except (psycopg.Error, PoolTimeout) as exc:
            raise store_failure(exc, "query", self.timeout) from exc

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
        # Never prepared: a prepared statement is planned once for any values from its sixth
        # run on, and that generic plan ranks a large scope's matches ~4x slower than a plan
        # made for the terms and bounds at hand (one session of 10,000 messages: ~26 against
        # ~6.5 ms a search; docs/postgres.md).
        rows = self._query(*plan, prepare=False)
        return self._shown_pairs([(memory_of(r[:-1]), max(float(r[-1]), 1e-9)) for r in rows])

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

    def vacuum(self, *, full: bool = False) -> None:
        """Reclaim space after compaction or erasure: ``VACUUM (ANALYZE)`` of the tables
        compaction rewrites (outside a transaction; space becomes reusable, the files do not
        shrink, and deleted rows' bytes stay in their pages until overwritten). ``full``:
        ``VACUUM (FULL, ANALYZE)`` of every table, rewritten into new files without the deleted
        rows (the old files are removed); each table is locked while it is rewritten. What is
        left on disk then: the write-ahead log until its segments are recycled (and any WAL
        archive, replica or backup), and the blocks of the removed files until the file
        system reuses them (docs/postgres.md)."""
        self._check_open()
        try:
            with psycopg.connect(self.dsn, autocommit=True) as conn:
                if full:
                    conn.execute("VACUUM (FULL, ANALYZE)")
                    return
                for table in (
                    "memories",
                    "aliases",
                    "token_counts",
                    "tombstone_groups",
                    "tombstone_keys",
                ):
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
            self._close_leases()
            self._pool.close()

    def _check_open(self) -> None:
        if self._closed:
            raise StoreError("the store is closed; open a new one")

    def scrub(self) -> None:
        """Nothing to do per delete: deleted rows are gone from every query at commit, and
        (auto)vacuum reclaims their space, but their bytes stay in the table and index pages
        until overwritten. To remove them from the files, run :meth:`vacuum` with ``full``
        (``ctxwarden scrub --full``) in a maintenance window: it rewrites every table."""
        self._check_open()

    # -- the background compactor's lease (the Maintenance seam) --------------------------------

    def acquire_lease(self, name: str, owner: str, *, now: float, ttl: float) -> str | None:
        """Take the lease ``name``: a session advisory lock (keyed by the schema and ``name``)
        on a connection of its own, held until :meth:`release_lease` or until that connection
        ends (the holder's process died): PostgreSQL lets go, no expiry needed (``now`` and
        ``ttl`` are the SQLite lease's)."""
        self._check_open()
        with self._lease_lock:
            held = self._leases.get(name)
            if held is not None:
                return None if held[0] == owner else held[0]
            try:
                conn = psycopg.connect(self.dsn, autocommit=True)
            except psycopg.Error as exc:
                raise StoreError(f"cannot open a connection for the lease {name!r}: {exc}") from exc
            try:
                row = conn.execute(
                    f"SELECT pg_try_advisory_lock({_LEASE_KEY})", (f"ctxwarden.{name}",)
                ).fetchone()
            except psycopg.Error as exc:
                conn.close()
                raise StoreError(f"cannot take the lease {name!r}: {exc}") from exc
            if not (row and row[0]):
                conn.close()
                return "another process (PostgreSQL advisory lock)"
            self._leases[name] = (owner, conn)
            return None

    def release_lease(self, name: str, owner: str) -> None:
        """Unlock and close the lease's connection (a closed connection's lock is let go only
        when its server process has ended, a moment later: the unlock makes it immediate)."""
        with self._lease_lock:
            held = self._leases.get(name)
            if held is None or held[0] != owner:
                return
            del self._leases[name]
            _unlock(held[1], name)

    def _close_leases(self) -> None:
        with self._lease_lock:
            for name, (_owner, conn) in self._leases.items():
                _unlock(conn, name)
            self._leases.clear()

    def tenants(self) -> list[str]:
        """Tenants with stored memories."""
        return [
            str(r[0]) for r in self._query("SELECT DISTINCT tenant FROM memories ORDER BY 1", ())
        ]

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
