"""WAL checkpoints run on the store's background thread, not on a committing request."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import pytest

from ctxwarden.errors import StoreError
from ctxwarden.store.sqlite import Checkpointer, SQLiteStore


def _fill(store: SQLiteStore, rows: int) -> None:
    with store.write():
        store._conn.executemany(  # a plain table keeps the test about the WAL, not the schema
            "INSERT INTO filler (body) VALUES (?)", [("x" * 2000,) for _ in range(rows)]
        )


def _store(path: Path) -> SQLiteStore:
    store = SQLiteStore(path)
    store._conn.execute("CREATE TABLE IF NOT EXISTS filler (body TEXT)")
    return store


def _wal_bytes(path: Path) -> int:
    wal = Path(str(path) + "-wal")
    return wal.stat().st_size if wal.exists() else 0


def test_store_connection_checkpoints_only_as_a_backstop(tmp_path: Path) -> None:
    from ctxwarden.store.sqlite import WAL_BACKSTOP_PAGES

    store = _store(tmp_path / "a.db")
    try:
        assert WAL_BACKSTOP_PAGES > 3000
        assert store._conn.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == WAL_BACKSTOP_PAGES
        assert store.checkpointer is not None
        # well past the 1,000 pages an automatic checkpoint would start at
        _fill(store, 3000)
        log, done = store.checkpointer.run_once()
        assert log > 1000
        assert done == log  # nobody reading: every frame copied into the database file
    finally:
        store.close()


def test_checkpointed_rows_are_in_the_database_file(tmp_path: Path) -> None:
    path = tmp_path / "b.db"
    store = _store(path)
    try:
        _fill(store, 50)
        assert store.checkpointer is not None
        log, done = store.checkpointer.run_once()
        assert log == done > 0
        assert _in_file(path) == 50
    finally:
        store.close()


def _in_file(path: Path) -> int:
    """Rows of ``filler`` in the database file itself (an immutable connection skips the WAL)."""
    with sqlite3.connect(f"file:{path}?immutable=1", uri=True) as plain:
        try:
            return int(plain.execute("SELECT count(*) FROM filler").fetchone()[0])
        except sqlite3.OperationalError:  # the table's creation not checkpointed yet
            return 0


def test_the_stores_thread_checkpoints_without_being_asked(tmp_path: Path) -> None:
    path = tmp_path / "c.db"
    store = _store(path)
    try:
        _fill(store, 20)
        deadline = time.monotonic() + 60  # a generous bound, not a timing assertion
        while _in_file(path) < 20 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _in_file(path) == 20
        assert store.checkpointer is not None
        assert store.checkpointer.checkpoints > 0
    finally:
        store.close()


def test_a_checkpointer_of_its_own_copies_another_connections_writes(tmp_path: Path) -> None:
    path = tmp_path / "f.db"
    store = _store(path)
    checkpointer = Checkpointer(str(path), interval=3600)  # only when asked
    try:
        _fill(store, 30)
        checkpointer.run_once()
        assert _in_file(path) == 30
    finally:
        checkpointer.stop()
        store.close()


def test_close_stops_the_thread_and_memory_stores_have_none(tmp_path: Path) -> None:
    store = _store(tmp_path / "d.db")
    assert store.checkpointer is not None
    thread = store.checkpointer._thread
    assert thread.is_alive()
    store.close()
    assert not thread.is_alive()
    assert SQLiteStore(":memory:").checkpointer is None


def test_scrub_still_truncates_the_wal(tmp_path: Path) -> None:
    path = tmp_path / "e.db"
    store = _store(path)
    try:
        _fill(store, 200)
        assert _wal_bytes(path) > 0
        store.scrub()
        assert _wal_bytes(path) == 0
    finally:
        store.close()


def test_vacuum_shrinks_the_file_or_says_it_could_not(tmp_path: Path) -> None:
    path = tmp_path / "v.db"
    store = SQLiteStore(path, timeout=0.2)
    store._conn.execute("CREATE TABLE IF NOT EXISTS filler (body TEXT)")
    reader = sqlite3.connect(path, isolation_level=None)
    try:
        _fill(store, 400)
        store.vacuum()
        full = path.stat().st_size
        with store.write():
            store._conn.execute("DELETE FROM filler WHERE rowid % 4 <> 0")
        # A reader on an older snapshot: VACUUM's pages stay in the WAL, the file keeps its size.
        reader.execute("BEGIN")
        reader.execute("SELECT count(*) FROM filler").fetchone()
        with pytest.raises(StoreError, match="vacuum: a reader kept the WAL"):
            store.vacuum()
        assert path.stat().st_size == full
        reader.execute("COMMIT")
        store.vacuum()
        assert path.stat().st_size < full / 2
        assert _wal_bytes(path) == 0
        assert store._query("SELECT count(*) FROM filler", ())[0][0] == 100
    finally:
        reader.close()
        store.close()
