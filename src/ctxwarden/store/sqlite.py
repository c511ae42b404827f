"""The SQLite backend: the embedded default.

WAL journal (readers never block the writer), ``synchronous=NORMAL`` (durable across process
crashes; a power loss may drop the last commits but never corrupts), foreign keys on, a busy
timeout instead of "database is locked" errors, FTS5 for lexical search. One connection per
store object, guarded by a lock, so a store may be shared between threads.

WAL checkpoints run off the request path: the store's connection checkpoints only as a backstop,
when its WAL passes :data:`WAL_BACKSTOP_PAGES` (a bulk load outrunning the thread); a
:class:`Checkpointer` thread with its own connection runs
``PRAGMA wal_checkpoint(PASSIVE)`` every :data:`CHECKPOINT_INTERVAL_SECONDS`, which neither
takes the store's lock nor blocks SQLite's writers and readers. An automatic checkpoint ran on
whichever commit pushed the WAL past 1,000 pages, inside the store's lock, and its fsync of the
database file took up to 250 ms on a busy disk, stalling every request behind it (bench/serve.py,
docs/serving.md "Load").

By concern: the connection's pragmas and the :class:`Checkpointer` are in
:mod:`~ctxwarden.store.sqlite_connection`, the write transaction (:class:`_SQLiteWriter` and its
de-dup lookups) in :mod:`~ctxwarden.store.sqlite_writer`, FTS5 search in
:mod:`~ctxwarden.store.sqlite_lexical`, vectors in :mod:`~ctxwarden.store.sqlite_vectors` and
neighbours in :mod:`~ctxwarden.store.sqlite_neighbours` (mixins over this store's connection,
lock and ``_query``, as the shared reads of :mod:`~ctxwarden.store.reads` are); the schema in
:mod:`~ctxwarden.store.migrations`. This module keeps the store: opening, the write lock and
transactions, the inclusion log, API keys and maintenance.
"""

from __future__ import annotations

import json
import logging
import sqlite3
import threading
import time
import weakref
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from ctxwarden.errors import ConfigError, ConflictError, StoreError, StoreUnavailable
from ctxwarden.store import migrations
from ctxwarden.store.archive import ArchiveReads
from ctxwarden.store.base import ApiKey, ContextLog, TokenCount
from ctxwarden.store.pack_reads import PackReads
from ctxwarden.store.reads import CONTEXT_COLUMNS, MemoryReads, context_row
from ctxwarden.store.sqlite_connection import (
    CHECKPOINT_INTERVAL_SECONDS,
    MMAP_BYTES,
    STATEMENT_CACHE,
    STORE_TIMEOUT_SECONDS,
    WAL_BACKSTOP_PAGES,
    Checkpointer,
    connect,
    unavailable,
)
from ctxwarden.store.sqlite_lexical import (
    COMMON_TERM_ROWS,
    ROWS_PER_RESULT,
    SEARCH_ROW_BUDGET,
    VERY_COMMON_MIN_ROWS,
    VERY_COMMON_SHARE,
    VERY_COMMON_WINDOW,
    SQLiteLexical,
    choose_terms,
    row_budget,
    very_common_rows,
)
from ctxwarden.store.sqlite_neighbours import SQLiteNeighbours
from ctxwarden.store.sqlite_rows import SQLiteRows
from ctxwarden.store.sqlite_vectors import SQLiteVectors, VectorCache
from ctxwarden.store.sqlite_writer import _SQLiteWriter, bucket_of
from ctxwarden.store.writes import ACCESS_TAU_SECONDS, ACCESS_UPSERT, access_bump

# Besides SQLiteStore, the constants and functions that lived in this module before it was split
# by concern (connection, lexical search, writer, vectors): they stay importable from here.
__all__ = [
    "ACCESS_TAU_SECONDS",
    "CHECKPOINT_INTERVAL_SECONDS",
    "COMMON_TERM_ROWS",
    "MMAP_BYTES",
    "ROWS_PER_RESULT",
    "SEARCH_ROW_BUDGET",
    "STATEMENT_CACHE",
    "STORE_TIMEOUT_SECONDS",
    "VERY_COMMON_MIN_ROWS",
    "VERY_COMMON_SHARE",
    "VERY_COMMON_WINDOW",
    "WAL_BACKSTOP_PAGES",
    "Checkpointer",
    "SQLiteStore",
    "bucket_of",
    "choose_terms",
    "row_budget",
    "very_common_rows",
]

log = logging.getLogger(__name__)

#: How long a write waiting for another connection's write lock pauses between two tries to
#: start its transaction (seconds), holding nothing (see ``_begin``).
BUSY_PAUSE_SECONDS = 0.002

#: The inclusion log's access-stats bump in SQLite's dialect.
_ACCESS_BUMP = access_bump("max")


def _setting(limit: float, timeout: float) -> str:
    """Names the setting in an error when the wait that ran out (``limit``) was the store's
    ``timeout``; a shorter one was the caller's (a cache write on a request's path)."""
    return " (the store_timeout setting)" if limit == timeout else ""


def _enable_fts_secure_delete(conn: sqlite3.Connection) -> bool:
    """Turn on FTS5's ``secure-delete`` (SQLite >= 3.44: a deleted row's terms leave the index
    pages at delete time); False where this SQLite lacks it (scrub then merges the index)."""
    try:
        conn.execute("INSERT INTO memories_fts (memories_fts, rank) VALUES ('secure-delete', 1)")
    except sqlite3.DatabaseError:
        return False
    return True


class SQLiteStore(
    PackReads, SQLiteLexical, SQLiteVectors, SQLiteNeighbours, SQLiteRows, MemoryReads, ArchiveReads
):
    """SQLite storage for ctxwarden. ``SQLiteStore(":memory:")`` for tests.

    ``timeout``: how long a call waits for the write lock (another process's or another
    thread's) before :class:`~ctxwarden.errors.StoreUnavailable` (cause ``"locked"``).

    >>> store = SQLiteStore(":memory:")
    >>> store.stats("default")["memories"]
    0
    """

    def __init__(self, path: str | Path, *, timeout: float = STORE_TIMEOUT_SECONDS) -> None:
        self.path = str(path)
        if not timeout > 0:
            raise ConfigError(f"store_timeout: {timeout} must be above 0 seconds")
        self.timeout = timeout
        self._lock = threading.RLock()
        try:
            self._conn = connect(self.path, timeout=timeout)
            migrations.apply(self._conn)
            self._open_rows()  # the row cache's triggers (sqlite_rows)
            self.checkpointer: Checkpointer | None = None
            if self.path != ":memory:":
                # Checkpoints off the request path (see the module docstring).
                self._conn.execute(f"PRAGMA wal_autocheckpoint = {WAL_BACKSTOP_PAGES}")
                self.checkpointer = Checkpointer(self.path)
                weakref.finalize(self, self.checkpointer.stop)
        except sqlite3.DatabaseError as exc:
            cause = unavailable(exc, self.path, "opening the store", timeout)
            if cause is not None:
                raise cause from exc
            raise StoreError(f"cannot open SQLite database {self.path}: {exc}") from exc
        self._fts_secure_delete = _enable_fts_secure_delete(self._conn)
        self._closed = False
        self._log_lock = threading.Lock()
        self._pending_logs: list[tuple[ContextLog, list[Exception | None]]] = []
        self._vectors = VectorCache(self.path, self._query)
        self._term_cache: dict[str, tuple[int, float]] = {}
        self._common_cache: dict[str, tuple[bool, float]] = {}
        self._tenant_stats: dict[Any, tuple[Any, tuple[int, int], float]] = {}
        self._scope_cache: dict[tuple[str, str], npt.NDArray[np.int64]] = {}
        # The change stamp (see _change_stamp) each cached scope was last checked at.
        self._scope_stamp: dict[tuple[str, str], tuple[int, int]] = {}

    # -- writes -----------------------------------------------------------------------------

    @contextmanager
    def write(self, *, wait: float | None = None) -> Iterator[_SQLiteWriter]:
        """One write transaction (BEGIN IMMEDIATE ... COMMIT, ROLLBACK on error).

        ``wait``: how long to wait for the write lock at most, in seconds (None: the store's
        :attr:`timeout`; never longer than it). 0 tries once: a cache write on a request's path
        takes the lock only if it is free soon, and is skipped otherwise.

        A cause outside ctxwarden (disk full, a read-only file, the lock held past
        :attr:`timeout` or lost, an I/O error) raises
        :class:`~ctxwarden.errors.StoreUnavailable` naming it, after the rollback: the store is
        as it was. SQLite itself rolls back on some of these (a full disk, an I/O error), so
        the ROLLBACK runs only while a transaction is open, and its own failure never hides
        the cause."""
        limit = self.timeout if wait is None else max(0.0, min(wait, self.timeout))
        self._begin(time.monotonic() + limit, limit)  # the store's lock is held from here
        try:
            writer = _SQLiteWriter(self._conn)
            try:
                yield writer
                writer.flush()
            except BaseException as exc:
                self._rollback()
                if isinstance(exc, sqlite3.DatabaseError):
                    cause = unavailable(exc, self.path, "writing", self.timeout)
                    if cause is not None:
                        raise cause from exc
                raise
            try:
                self._conn.execute("COMMIT")
            except sqlite3.DatabaseError as exc:
                self._rollback()
                raise self._translate(exc, "commit") from exc
        finally:
            self._lock.release()

    def _begin(self, deadline: float, limit: float) -> None:
        """Take the store's lock and BEGIN IMMEDIATE, retried until ``deadline`` while another
        connection writes; returns holding the lock, with the transaction open.

        SQLite's own busy handler sleeps ever longer between tries (up to 100 ms), so a
        waiter beside writers that commit back to back kept missing the moments the lock was
        free: server requests waited up to 23.6 s beside two library writers (issue 20). Here
        each try takes the lock only if it is free (a busy timeout of 0) and a waiter asks again
        every :data:`BUSY_PAUSE_SECONDS` until its deadline. The store's lock is held only for
        the try itself: a try that waited in SQLite's busy handler (10 ms slices, before) held
        it meanwhile, and every read of this process (a retrieval runs ~20 statements) queued
        behind each slice, beside other processes' writers."""
        conn = self._conn
        while True:
            if not self._lock.acquire(timeout=max(0.0, deadline - time.monotonic())):
                raise StoreUnavailable(
                    "locked",
                    f"writing: other requests of this process held {self.path} for over "
                    f"{limit:g}s{_setting(limit, self.timeout)}; nothing was changed: retry",
                )
            try:
                self._check_open()
                conn.execute("PRAGMA busy_timeout = 0")
                try:
                    conn.execute("BEGIN IMMEDIATE")
                    return
                except sqlite3.DatabaseError as exc:
                    busy = (getattr(exc, "sqlite_errorcode", 0) or 0) & 0xFF in (5, 6)
                    if not busy or time.monotonic() >= deadline:
                        cause = unavailable(exc, self.path, "starting a write transaction", limit)
                        if cause is not None:
                            raise cause from exc
                        raise StoreError(f"starting a write transaction failed: {exc}") from exc
                finally:
                    conn.execute(f"PRAGMA busy_timeout = {int(self.timeout * 1000)}")
            except BaseException:
                self._lock.release()
                raise
            self._lock.release()
            time.sleep(BUSY_PAUSE_SECONDS)  # reads of this process go on meanwhile

    def _rollback(self) -> None:
        """Roll back the open transaction, if SQLite has not already (a failed ROLLBACK is
        logged: the error that led here is the one the caller needs)."""
        self._rows.clear()  # rows read in the transaction were not cached; the rest may be
        if not self._conn.in_transaction:
            return
        try:
            self._conn.execute("ROLLBACK")
        except sqlite3.Error as exc:
            log.warning("rollback of %s failed: %s", self.path, exc)

    def _translate(self, exc: sqlite3.DatabaseError, doing: str) -> StoreError:
        cause = unavailable(exc, self.path, doing, self.timeout)
        return cause if cause is not None else StoreError(f"{doing} failed: {exc}")

    @contextmanager
    def _locked(self, doing: str) -> Iterator[None]:
        """This store's lock (one connection, shared by threads), waited for at most
        :attr:`timeout` seconds: a thread queued behind others' writes gives up as a writer
        waiting on another process does."""
        if not self._lock.acquire(timeout=self.timeout):
            raise StoreUnavailable(
                "locked",
                f"{doing}: other requests of this process held {self.path} for over "
                f"{self.timeout:g}s (the store_timeout setting); nothing was changed: retry",
            )
        try:
            yield
        finally:
            self._lock.release()

    def put_token_counts(self, counts: Sequence[TokenCount], *, wait: float | None = None) -> None:
        """Cache token counts computed after ingest (waiting at most ``wait`` seconds for the
        write lock, see :meth:`write`)."""
        if not counts:
            return
        with self.write(wait=wait) as writer:
            writer.put_token_counts(counts)

    def log_context(self, entry: ContextLog) -> None:
        """Write the inclusion log and bump access stats (count, time, decayed score, tokens).

        Group commit: entries that arrive while another thread holds the write lock are written
        together in one transaction by whichever caller takes the lock next, so a busy server
        pays one commit (and one write of each touched page) for several contexts. Every call
        still returns only once its own entry is committed, and raises its own entry's error (a
        failed group is written again one entry per transaction, so one bad entry fails only
        its caller).
        """
        ticket: list[Exception | None] = []
        with self._log_lock:
            self._pending_logs.append((entry, ticket))
        with self._lock:
            with self._log_lock:
                batch, self._pending_logs = self._pending_logs, []
            if batch:  # else a caller that held the lock before us committed ours
                results: list[Exception | None] = [None] * len(batch)
                try:
                    with self.write():
                        for queued, _ in batch:
                            self._log_one(queued)
                except Exception:  # the batch may hold other callers' entries: one by one
                    for number, (queued, _) in enumerate(batch):
                        try:
                            with self.write():
                                self._log_one(queued)
                        except Exception as exc:
                            results[number] = exc
                for (_, owner), result in zip(batch, results, strict=True):
                    owner.append(result)
        if not ticket:  # the thread writing the group was interrupted (BaseException)
            raise StoreError("the inclusion log was not written (interrupted): assemble again")
        if ticket[0] is not None:
            raise ticket[0]

    def log_contexts(self, entries: Sequence[ContextLog]) -> None:
        """Several entries in one transaction (one commit), all or none; see the protocol."""
        if not entries:
            return
        with self.write():
            for entry in entries:
                self._log_one(entry)

    def _log_one(self, entry: ContextLog) -> None:
        """One context's statements, inside a write transaction. Set-based: the inclusions
        travel as one JSON array and SQLite expands it with ``json_each``, so logging costs
        three statements whatever the context's size."""
        rows = json.dumps(
            [[i.rowid, i.id, i.block, i.tokens] for i in entry.inclusions], separators=(",", ":")
        )
        now = entry.created_at
        cursor = self._conn.execute(
            f"INSERT INTO contexts ({CONTEXT_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            context_row(entry),
        )
        self._conn.execute(
            "INSERT INTO inclusions (context_rowid, position, memory_id, block, tokens) "
            "SELECT ?, key, value ->> 1, value ->> 2, value ->> 3 FROM json_each(?)",
            (cursor.lastrowid, rows),
        )
        # One row per memory even if a caller lists it twice: its tokens summed here (a GROUP
        # BY in the statement cost ~20 % more). The stats live in the narrow memory_access
        # (migration 8), not in the wide memory row; the join skips a memory erased since it
        # was retrieved (its stats row would break the foreign key).
        tokens: dict[int, int] = {}
        for i in entry.inclusions:
            tokens[i.rowid] = tokens.get(i.rowid, 0) + i.tokens
        self._conn.execute(
            f"{ACCESS_UPSERT} SELECT m.rowid, 1, ?, 1.0, ?, j.value ->> 1 FROM json_each(?) j "
            f"JOIN memories m ON m.rowid = j.value ->> 0 WHERE true {_ACCESS_BUMP}",
            (now, now, json.dumps(list(tokens.items()), separators=(",", ":"))),
        )

    # -- reads ------------------------------------------------------------------------------

    def _read(self, sql: str, params: Sequence[Any]) -> list[Any]:
        return self._query(sql, params)

    def _query(self, sql: str, params: Sequence[Any]) -> list[Any]:
        with self._locked("reading"):
            self._check_open()
            try:
                return self._conn.execute(sql, params).fetchall()
            except sqlite3.DatabaseError as exc:
                raise self._translate(exc, "query") from exc

    def token_counts(self, rowids: Sequence[int], tokenizer: str) -> dict[int, TokenCount]:
        """Cached counts for these rowids under ``tokenizer``. One statement of one text (the
        rowids as a JSON array): an ``IN`` list's text changes with its length, and each new
        length was compiled again."""
        if not rowids:
            return {}
        return {
            rowid: TokenCount(rowid=rowid, tokenizer=tokenizer, message=message, line=line)
            for rowid, message, line in self._query(
                "SELECT t.memory_rowid, t.message, t.line FROM json_each(?) j "
                "JOIN token_counts t ON t.memory_rowid = j.value AND t.tokenizer = ?",
                (json.dumps([int(r) for r in rowids], separators=(",", ":")), tokenizer),
            )
        }

    def vacuum(self, *, full: bool = False) -> None:
        """Reclaim space after compaction: merges FTS5 segments so deleted rows' tokens leave
        the index, VACUUMs (SQLite's VACUUM always rewrites the file: ``full`` changes
        nothing), then checkpoints and truncates the WAL: the file shrinks only then, since
        VACUUM's pages are written to the WAL. Raises :class:`StoreError` when a reader (or the
        checkpoint thread) kept that checkpoint from finishing: the database is vacuumed, the
        file not yet shrunk; call it again (it used to return as if the file had shrunk)."""
        with self._lock:
            self._check_open()
            self._rows.clear()  # (VACUUM keeps rowids, the INTEGER PRIMARY KEY: to be sure)
            try:
                self._conn.execute("INSERT INTO memories_fts (memories_fts) VALUES ('optimize')")
                self._conn.execute("VACUUM")
                busy, _, _ = self._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
            except sqlite3.DatabaseError as exc:
                raise self._translate(exc, "vacuum") from exc
            if busy:
                raise StoreError(
                    "vacuum: a reader kept the WAL from being checkpointed, so the file has not "
                    "shrunk yet; retry when it has finished"
                )

    # -- API keys (the KeyStore seam) ---------------------------------------------------------

    def put_api_key(self, key: ApiKey) -> None:
        """Insert an API key (its secret's hash only)."""
        with self.write():
            try:
                self._conn.execute(
                    "INSERT INTO api_keys (key_id, tenant, scopes, secret_hash, name, created_at, "
                    "revoked_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
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
            except sqlite3.IntegrityError as exc:
                raise ConflictError(f"api key {key.key_id!r} exists: issue a new one") from exc

    def revoke_api_key(self, key_id: str, at: float) -> bool:
        """Revoke a key; False if unknown."""
        with self.write():
            cursor = self._conn.execute(
                "UPDATE api_keys SET revoked_at = coalesce(revoked_at, ?) WHERE key_id = ?",
                (at, key_id),
            )
            return cursor.rowcount > 0

    # -- the background compactor's lease (the Maintenance seam) --------------------------------

    def acquire_lease(self, name: str, owner: str, *, now: float, ttl: float) -> str | None:
        """Take (or extend) the lease row ``name`` unless another owner's has not expired."""
        with self.write():
            row = self._conn.execute(
                "SELECT owner, expires_at FROM leases WHERE name = ?", (name,)
            ).fetchone()
            if row is not None and row[0] != owner and row[1] > now:
                return str(row[0])
            self._conn.execute(
                "INSERT INTO leases (name, owner, acquired_at, expires_at) VALUES (?, ?, ?, ?) "
                "ON CONFLICT (name) DO UPDATE SET owner = excluded.owner, "
                "acquired_at = CASE WHEN leases.owner = excluded.owner THEN leases.acquired_at "
                "ELSE excluded.acquired_at END, expires_at = excluded.expires_at",
                (name, owner, now, now + ttl),
            )
            return None

    def release_lease(self, name: str, owner: str) -> None:
        """Delete the lease row ``name`` if ``owner`` holds it."""
        with self.write():
            self._conn.execute("DELETE FROM leases WHERE name = ? AND owner = ?", (name, owner))

    def tenants(self) -> list[str]:
        """Tenants with stored memories (a skip scan of the tenant-first indexes)."""
        return [
            str(r[0]) for r in self._query("SELECT DISTINCT tenant FROM memories ORDER BY 1", ())
        ]

    def integrity_check(self) -> str:
        """``PRAGMA integrity_check``'s answer ("ok" when sound)."""
        return str(self._query("PRAGMA integrity_check", ())[0][0])

    def close(self) -> None:
        """Close the connection (saving changed vector indexes first). Idempotent."""
        with self._lock:
            if not self._closed:
                self._vectors.save()
                self._closed = True
                self._rows.clear()
                self._memos.clear()
                if self.checkpointer is not None:
                    self.checkpointer.stop()
                self._conn.close()

    def _check_open(self) -> None:
        if self._closed:
            raise StoreError("the store is closed; open a new one")

    # -- erasure --------------------------------------------------------------------------------

    def scrub(self) -> None:
        """Make deleted text unrecoverable from the files: drop deleted rows' terms from the
        full-text index (FTS5's ``secure-delete`` option does it at delete time where SQLite
        has it, >= 3.44; otherwise a merge of every segment rebuilds the index without them),
        save the vector indexes without deleted vectors, then checkpoint the WAL and truncate
        it (its frames hold old page images). With ``secure_delete`` on, freed pages are
        zeroed. Raises :class:`StoreError` when a step could not finish (a reader kept the WAL
        from being truncated): call it again (:func:`~ctxwarden.store.base.scrub_until_done`)."""
        with self._lock:
            self._check_open()
            try:
                if not self._fts_secure_delete:
                    self._conn.execute(
                        "INSERT INTO memories_fts (memories_fts) VALUES ('optimize')"
                    )
                self._vectors.persist_deletions()
                busy, _, _ = self._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
            except sqlite3.DatabaseError as exc:
                raise self._translate(exc, "scrub") from exc
            if busy:
                raise StoreError(
                    "scrub: a reader kept the WAL from being checkpointed and truncated; "
                    "retry when it has finished"
                )
