"""The SQLite backend's connection: its pragmas, and WAL checkpoints off the request path.

:func:`connect` opens the store's one connection with the settings the module docstring of
:mod:`ctxwarden.store.sqlite` describes; a :class:`Checkpointer` thread with a connection of its
own copies the WAL into the database file every :data:`CHECKPOINT_INTERVAL_SECONDS`, while the
store's connection checkpoints only past :data:`WAL_BACKSTOP_PAGES`.
"""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

from ctxwarden.errors import StoreUnavailable

__all__ = [
    "CHECKPOINT_INTERVAL_SECONDS",
    "MMAP_BYTES",
    "STATEMENT_CACHE",
    "STORE_TIMEOUT_SECONDS",
    "WAL_BACKSTOP_PAGES",
    "Checkpointer",
    "connect",
    "unavailable",
]

#: How long a library call waits for the store's write lock (held by another connection or
#: process, or by another thread of this store) before it fails with
#: :class:`~ctxwarden.errors.StoreUnavailable` (``EngineConfig.store_timeout``; the servers
#: default to a few seconds, ``Settings.store_timeout``).
STORE_TIMEOUT_SECONDS = 30.0

#: How often the background :class:`Checkpointer` copies the WAL into the database file. Between
#: checkpoints the WAL grows by what was written meanwhile (a busy server: a few MB a second).
CHECKPOINT_INTERVAL_SECONDS = 1.0
#: The store's own connection checkpoints (inside its lock) only when the WAL passes this many
#: pages (~40 MB): a bound on the WAL should the thread fall behind a bulk load. SQLite's
#: default, 1,000, put a checkpoint with its fsync on a serving request every few seconds.
WAL_BACKSTOP_PAGES = 10_000

#: Reads go through a memory map of the database file up to this size (SQLite caps it at its
#: compile-time limit, 2 GB in the usual builds): a page read is then a memory access instead
#: of a ``pread`` into SQLite's page cache. Retrieval over 1M memories (``bench/retrieve.py``):
#: ~1 ms less a query, mostly in FTS5 ranking and row reads. The pages are the OS's file cache
#: (shared, evictable), not the process's own memory.
MMAP_BYTES = 1 << 32
#: Compiled statements the connection keeps (the sqlite3 module's LRU cache, keyed by text;
#: its default is 128). A request runs ~20 statements, several with ``IN`` lists whose length
#: (so text) varies, and ingest others: with 128, statements used at every request fell out of
#: the cache between requests and were compiled again.
STATEMENT_CACHE = 1024


def connect(path: str, *, timeout: float = STORE_TIMEOUT_SECONDS) -> sqlite3.Connection:
    """The store's connection to the database at ``path`` (``":memory:"`` for a private one):
    autocommit (transactions are explicit), shareable between threads (the store locks it),
    WAL, ``synchronous=NORMAL``, foreign keys, ``secure_delete``, a busy timeout of
    ``timeout`` seconds, and a memory map of the file. The parent directory is created.
    Raises :class:`sqlite3.DatabaseError` (the store translates it)."""
    if path != ":memory:":
        Path(path).parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(
        path,
        isolation_level=None,
        check_same_thread=False,
        timeout=timeout,
        cached_statements=STATEMENT_CACHE,
    )
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = NORMAL")
    conn.execute("PRAGMA foreign_keys = ON")
    # Deleted rows are zeroed on their pages, not left in free space (erasure).
    conn.execute("PRAGMA secure_delete = ON")
    conn.execute(f"PRAGMA busy_timeout = {int(timeout * 1000)}")
    if path != ":memory:":
        conn.execute(f"PRAGMA mmap_size = {MMAP_BYTES}")
    return conn


# SQLite's primary result codes (the low byte of an extended code) that mean "not now, for a
# cause outside ctxwarden", and the extended codes that mean a lock was lost rather than busy.
_BUSY, _LOCKED, _READONLY, _IOERR, _FULL, _CANTOPEN, _PROTOCOL = 5, 6, 8, 10, 13, 14, 15
_IOERR_LOCKS = frozenset(
    {10 | 15 << 8, 10 | 8 << 8, 10 | 9 << 8, 10 | 20 << 8}  # LOCK, RDLOCK, UNLOCK, CHECKRESERVED
)


def unavailable(
    exc: sqlite3.Error, path: str, doing: str, timeout: float
) -> StoreUnavailable | None:
    """The :class:`~ctxwarden.errors.StoreUnavailable` that SQLite's error ``exc`` (raised
    while ``doing`` something to the database at ``path``) stands for, naming its cause and
    what to do; None when ``exc`` is not one of those causes (a constraint, a bad statement,
    a damaged file: the caller raises it as it is)."""
    code = getattr(exc, "sqlite_errorcode", None)
    if code is None:
        return None
    primary = code & 0xFF
    if code in _IOERR_LOCKS or primary == _PROTOCOL:
        return StoreUnavailable(
            "lost lock",
            f"{doing}: the lock on {path} was lost ({exc}); nothing was changed: retry",
        )
    if primary in (_BUSY, _LOCKED):
        return StoreUnavailable(
            "locked",
            f"{doing}: another writer held {path} for over {timeout:g}s (the store_timeout "
            "setting); nothing was changed: retry",
        )
    if primary == _FULL:
        return StoreUnavailable(
            "disk full",
            f"{doing}: the disk holding {path} is full ({exc}); nothing was changed: free "
            "space, then retry",
            retry_after=30.0,
        )
    if primary == _READONLY:
        return StoreUnavailable(
            "read-only",
            f"{doing}: {path} is read-only ({exc}); reads go on, writes need a writable file "
            "and folder",
            retry_after=60.0,
        )
    if primary in (_IOERR, _CANTOPEN):
        return StoreUnavailable(
            "I/O error",
            f"{doing}: the disk answered an I/O error on {path} ({exc}); nothing was changed: "
            "check the disk, then retry",
            retry_after=30.0,
        )
    return None


class Checkpointer:
    """WAL checkpoints of the database at ``path`` on a thread of their own.

    Own connection, ``PRAGMA wal_checkpoint(PASSIVE)`` every ``interval`` seconds: frames are
    copied into the database file and synced without waiting for (or blocking) readers and
    writers on other connections; the next writer restarts the WAL from its beginning once it
    is all copied. :meth:`run_once` is one checkpoint (what the thread does each time).
    """

    def __init__(self, path: str, interval: float = CHECKPOINT_INTERVAL_SECONDS) -> None:
        self.path = path
        self.interval = interval
        self.checkpoints = 0
        self._stop = threading.Event()
        self._conn_lock = threading.Lock()
        self._conn = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self._conn.execute("PRAGMA busy_timeout = 5000")
        self._thread = threading.Thread(target=self._loop, name="ctxwarden-checkpoint", daemon=True)
        self._thread.start()

    def run_once(self) -> tuple[int, int]:
        """One PASSIVE checkpoint: (frames in the WAL, frames now in the database file)."""
        with self._conn_lock:
            if self._stop.is_set():
                return (0, 0)
            _busy, log, done = self._conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
            self.checkpoints += 1
            return int(log), int(done)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.run_once()
            except sqlite3.Error:  # busy or closing: the next round tries again
                continue

    def stop(self) -> None:
        """Stop the thread and close its connection (idempotent)."""
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join()
        with self._conn_lock:
            self._conn.close()
