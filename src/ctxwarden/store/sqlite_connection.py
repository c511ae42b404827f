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

__all__ = [
    "CHECKPOINT_INTERVAL_SECONDS",
    "MMAP_BYTES",
    "STATEMENT_CACHE",
    "WAL_BACKSTOP_PAGES",
    "Checkpointer",
    "connect",
]

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


def connect(path: str) -> sqlite3.Connection:
    """The store's connection to the database at ``path`` (``":memory:"`` for a private one):
    autocommit (transactions are explicit), shareable between threads (the store locks it),
    WAL, ``synchronous=NORMAL``, foreign keys, ``secure_delete``, a busy timeout, and a memory
    map of the file. The parent directory is created. Raises :class:`sqlite3.DatabaseError`
    (the store translates it)."""
    if path != ":memory:":
        Path(path).parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(
        path,
        isolation_level=None,
        check_same_thread=False,
        timeout=30.0,
        cached_statements=STATEMENT_CACHE,
    )
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = NORMAL")
    conn.execute("PRAGMA foreign_keys = ON")
    # Deleted rows are zeroed on their pages, not left in free space (erasure).
    conn.execute("PRAGMA secure_delete = ON")
    conn.execute("PRAGMA busy_timeout = 30000")
    if path != ":memory:":
        conn.execute(f"PRAGMA mmap_size = {MMAP_BYTES}")
    return conn


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
