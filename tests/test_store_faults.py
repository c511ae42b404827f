"""I/O faults, as SQLite's own test suite injects them: the fault at the N-th write, for every
N along an ingest, a compaction and an erasure (issue 20 item 6).

:class:`FaultyConnection` stands between the store and its real ``sqlite3`` connection (the
role of SQLite's test VFS shim): it counts the write statements (``BEGIN``, ``INSERT``,
``UPDATE``, ``DELETE``, ``COMMIT``...) and makes the N-th fail with the error SQLite gives for
a full disk, a read-only file, a lost lock or an I/O error, rolling the transaction back first
where SQLite itself does (a full disk, I/O errors). Each time the operation must raise
:class:`StoreUnavailable` naming the cause, the committed content of every table (FTS shadow
tables included) must be what it was when the failed transaction began, the file must pass
``integrity_check``, and the same operation must then succeed. The real mechanisms are tried
too: ``PRAGMA max_page_count`` (a full disk), ``PRAGMA query_only`` (a read-only store) and
a write lock held by another connection past the store's timeout.
"""

from __future__ import annotations

import hashlib
import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient

from ctxwarden.engine import Engine, EngineConfig
from ctxwarden.errors import StoreUnavailable
from ctxwarden.server.http import create_app
from ctxwarden.store.base import TokenCount

NOW = 1_800_000_000.0
DAY = 86400.0
WRITES = frozenset({"BEGIN", "INSERT", "UPDATE", "DELETE", "REPLACE", "COMMIT", "WITH"})
#: kind -> (SQLite's extended result code, its message, whether SQLite rolls back itself)
FAULTS: dict[str, tuple[int, str, bool]] = {
    "disk full": (13, "database or disk is full", True),
    "read-only": (8, "attempt to write a readonly database", False),
    "lost lock": (10 | 15 << 8, "disk I/O error", True),  # SQLITE_IOERR_LOCK
    "I/O error": (10 | 3 << 8, "disk I/O error", True),  # SQLITE_IOERR_WRITE
}


def table_hashes(path: Path) -> dict[str, str]:
    """A hash of the committed rows of every table in the file (virtual tables' shadow
    tables included), read through a connection of its own."""
    conn = sqlite3.connect(path)
    try:
        names = [
            name
            for name, sql in conn.execute("SELECT name, sql FROM sqlite_master WHERE type='table'")
            if not (sql or "").upper().startswith("CREATE VIRTUAL")
        ]
        out = {}
        for name in names:
            rows = sorted(repr(r) for r in conn.execute(f'SELECT * FROM "{name}"'))
            out[name] = hashlib.sha256("\n".join(rows).encode()).hexdigest()
        return out
    finally:
        conn.close()


class FaultyConnection:
    """The store's connection with a fault at its ``at``-th write statement (0: none; then it
    only counts). Before each transaction (and each write outside one) it hashes the file's
    tables: what a failure must leave."""

    def __init__(self, conn: sqlite3.Connection, path: Path, kind: str, at: int) -> None:
        self._conn, self.path, self.kind, self.at = conn, path, kind, at
        self.writes = 0
        self.before: dict[str, str] | None = None
        self.fired = False

    def _count(self, sql: str) -> None:
        words = sql.split(None, 1)
        if not words or words[0].upper() not in WRITES:
            return
        if not self._conn.in_transaction and self.at:
            self.before = table_hashes(self.path)
        self.writes += 1
        if self.writes == self.at:
            self.fired = True
            code, message, rolls_back = FAULTS[self.kind]
            if rolls_back and self._conn.in_transaction:
                self._conn.execute("ROLLBACK")
            error = sqlite3.OperationalError(message)
            error.sqlite_errorcode = code
            raise error

    def execute(self, sql: str, params: Any = ()) -> sqlite3.Cursor:
        self._count(sql)
        return self._conn.execute(sql, params)

    def executemany(self, sql: str, rows: Any) -> sqlite3.Cursor:
        self._count(sql)
        return self._conn.executemany(sql, rows)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)


def records(prefix: str, n: int, *, at: float = NOW) -> list[dict[str, Any]]:
    topics = "deploy release budget laptop standup kafka redis invoice".split()
    return [
        {
            "id": f"{prefix}{i}",
            "session": "s1" if i % 3 else "s2",
            "author": ["ana", "bo"][i % 2],
            # a fact in every eighth, the rest talk (a cluster of facts alone is left alone)
            "content": (
                f"{prefix} we moved the {topics[i % 8]} to version {i}; ticket T-{i * 7}"
                if i % 8 == 0
                else f"{prefix} ok, the {topics[i % 8]} and the {topics[(i * 3) % 8]} look fine, "
                f"more on the {topics[(i * 5) % 8]} later"
            ),
            "created_at": at + i * 900,
        }
        for i in range(n)
    ]


def seeded(folder: Path) -> Path:
    """A store with recent memories and old ones (compaction candidates), checkpointed."""
    path = folder / "seed.db"
    with Engine.open(path, config=EngineConfig(tokenizers=("o200k_base",))) as engine:
        engine.ingest(records("old", 24, at=NOW - 60 * DAY))
        engine.ingest(records("new", 9))
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    return path


OPERATIONS: dict[str, Callable[[Engine], object]] = {
    "ingest": lambda e: e.ingest(records("fresh", 6, at=NOW + DAY)),
    "compaction": lambda e: e.compact(),
    "erasure": lambda e: e.delete_session("s2"),
}


def _copy(seed: Path, to: Path) -> Path:
    source = sqlite3.connect(seed)
    target = sqlite3.connect(to)
    source.backup(target)
    source.close()
    target.close()
    return to


def _run(seed: Path, folder: Path, op: str, kind: str, at: int) -> FaultyConnection:
    path = _copy(seed, folder / f"{op}-{kind}-{at}.db".replace(" ", "_").replace("/", ""))
    # No background embedder: its vector writes would move the N-th write under test.
    config = EngineConfig(embed="off")
    engine = Engine.open(path, clock=lambda: NOW + 2 * DAY, config=config)
    store: Any = engine.store
    faulty = FaultyConnection(store._conn, path, kind, at)
    store._conn = faulty
    try:
        if not at:
            OPERATIONS[op](engine)
            return faulty
        try:
            OPERATIONS[op](engine)
        except StoreUnavailable as exc:
            caught = exc
        else:
            # The fault fell in the scrub after the commit, which is retried until it is done
            # (store.base.scrub_until_done): the operation succeeded, the store is whole.
            assert faulty.fired, (kind, at)
            assert engine.store.integrity_check() == "ok"
            return faulty
        assert faulty.fired, caught
        assert caught.cause == kind, caught
        assert "no transaction is active" not in str(caught)
        assert faulty.before is not None
        assert table_hashes(path) == faulty.before  # the failed transaction left nothing
        # reads go on, and the same operation succeeds once the fault is gone
        assert engine.store.integrity_check() == "ok"
        faulty.at = 0
        OPERATIONS[op](engine)
    finally:
        engine.close()
    return faulty


@pytest.mark.parametrize("op", sorted(OPERATIONS))
def test_a_fault_at_every_write_leaves_the_store_as_it_was(tmp_path: Path, op: str) -> None:
    seed = seeded(tmp_path)
    clean = _run(seed, tmp_path, op, "disk full", 0)
    assert clean.writes >= 3, clean.writes  # the operation writes: the sweep means something
    for kind in FAULTS:
        for at in range(1, clean.writes + 1):
            faulty = _run(seed, tmp_path, op, kind, at)
            assert faulty.fired, (kind, at)


def test_a_full_disk_for_real(tmp_path: Path) -> None:
    """SQLite's own SQLITE_FULL: the file may not grow past its current pages."""
    path = _copy(seeded(tmp_path), tmp_path / "full.db")
    before = table_hashes(path)
    with Engine.open(path) as engine:
        store: Any = engine.store
        pages = store._conn.execute("PRAGMA page_count").fetchone()[0]
        store._conn.execute(f"PRAGMA max_page_count = {pages}")
        big = [{**r, "content": r["content"] + " x" * 4000} for r in records("big", 40)]
        with pytest.raises(StoreUnavailable, match="disk holding .* is full") as caught:
            engine.ingest(big)
        assert caught.value.cause == "disk full"
        assert table_hashes(path) == before
        assert engine.assemble(session="s1", query="deploy").messages  # reads go on


def test_assemble_works_on_a_read_only_store(tmp_path: Path) -> None:
    """Token counts are made on first use for a tokenizer ingest did not count: on a store
    that cannot be written they are not kept, and the assemble goes on."""
    path = _copy(seeded(tmp_path), tmp_path / "ro.db")
    before = table_hashes(path)
    with Engine.open(path) as engine:  # default model's tokenizer: not counted at ingest
        store: Any = engine.store
        store._conn.execute("PRAGMA query_only = ON")
        context = engine.assemble(session="s1", query="deploy kafka", model="llama-3")
        assert context.messages
        assert any("store not written (read-only)" in n for n in context.report.notes)
        again = engine.assemble(session="s1", query="deploy kafka", model="llama-3")
        assert again.messages == context.messages
        with pytest.raises(StoreUnavailable, match="read-only") as caught:
            engine.ingest(records("late", 2))
        assert caught.value.cause == "read-only"
    assert table_hashes(path) == before


def test_a_lock_held_past_the_timeout_is_a_503_with_retry_after(tmp_path: Path) -> None:
    path = _copy(seeded(tmp_path), tmp_path / "locked.db")
    before = table_hashes(path)
    engine = Engine.open(path, config=EngineConfig(store_timeout=0.05))
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # another process's long write
    try:
        with pytest.raises(StoreUnavailable, match="store_timeout") as caught:
            engine.ingest(records("late", 2))
        assert caught.value.cause == "locked"
        client = TestClient(create_app(engine))
        response = client.post("/v1/ingest", json={"records": records("http", 2)})
        assert response.status_code == 503, response.text
        assert int(response.headers["Retry-After"]) >= 1
        assert response.json()["error"]["type"] == "StoreUnavailable"
        assert "another writer held" in response.json()["error"]["message"]
        read = client.post("/v1/assemble", json={"session": "s1", "query": "deploy"})
        assert read.status_code == 200, read.text  # reads go on
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert table_hashes(path) == before
    engine.ingest(records("late", 2))  # the lock is free again
    engine.close()


def test_the_servers_wait_a_few_seconds_and_commands_longer() -> None:
    from ctxwarden.config import SERVER_STORE_TIMEOUT, load_settings

    settings = load_settings(db=":memory:")
    assert settings.engine_config().store_timeout == 30.0
    assert SERVER_STORE_TIMEOUT <= 10
    assert load_settings(db=":memory:", store_timeout=2.5).engine_config().store_timeout == 2.5


def test_client_facing_errors_never_name_the_upstreams_address() -> None:
    """A summariser's failure caused by an unreachable model server (issue 20 item 5): the
    library's message names host and port for the operator; what a client sees does not."""
    from ctxwarden.errors import SummarizeError, UpstreamError
    from ctxwarden.llm import LLMClient
    from ctxwarden.server.access import client_message

    client = LLMClient("http://127.0.0.1:9/v1", timeout=2, max_retries=0)
    with pytest.raises(UpstreamError) as caught:
        client.chat([{"role": "user", "content": "hi"}], model="m")
    client.close()
    assert "127.0.0.1:9" in str(caught.value)
    wrapped = SummarizeError(f"the summariser's model server failed: {caught.value}")
    wrapped.__cause__ = caught.value  # as summarize.py raises it (raise ... from exc)
    shown = client_message(wrapped)
    assert "cannot be reached" in shown
    assert "127.0.0.1" not in shown
    assert ":9" not in shown
    assert "127.0.0.1" not in client_message(caught.value)


def test_reads_go_on_while_a_write_waits_for_another_process(tmp_path: Path) -> None:
    """A writer of this process polling for a lock another connection holds lets go of the
    store between tries: reads meanwhile are answered before the writer is."""
    path = _copy(seeded(tmp_path), tmp_path / "waiting.db")
    engine = Engine.open(path, config=EngineConfig(store_timeout=60.0))
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    done: list[object] = []
    writer = threading.Thread(target=lambda: done.append(engine.ingest(records("late", 2))))
    try:
        writer.start()
        assert engine.store.get("default", "new1") is not None
        assert engine.store.stats("default")["memories"] > 0
        assert writer.is_alive()  # still waiting for the lock: the reads did not queue behind it
        assert not done
    finally:
        holder.execute("ROLLBACK")
        holder.close()
        writer.join(60)
    assert done  # and it wrote once the lock was free
    engine.close()


def test_the_proxys_apis_answer_503_with_retry_after() -> None:
    """The Responses and Messages APIs' error shapes (the chat path shares the table)."""
    from ctxwarden.server import messages, responses

    error = StoreUnavailable("disk full", "writing: the disk holding x.db is full", retry_after=30)
    for face in (responses, messages):
        answer = face.error_response(error)
        assert answer.status_code == 503
        assert answer.headers["Retry-After"] == "30"
        assert b"is full" in answer.body


def test_writes_on_a_requests_path_wait_at_most_their_own_bound(tmp_path: Path) -> None:
    """Token counts made by an assemble and vectors of its catch-up are cache writes: with
    another process holding the write lock they give up after their own short wait (the store
    keeps nothing of them) instead of the store's timeout, and the assemble goes on."""
    path = _copy(seeded(tmp_path), tmp_path / "bounded.db")
    engine = Engine.open(path, config=EngineConfig(store_timeout=60.0, embed="off"))
    store = engine.store
    rowid = store.get("default", "new1").rowid
    holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    holder.execute("BEGIN IMMEDIATE")  # another process's long write
    release = threading.Timer(20.0, holder.rollback)  # a 60 s wait would get in after this
    release.start()
    try:
        count = TokenCount(rowid=rowid, tokenizer="probe", message=1, line=1)
        with pytest.raises(StoreUnavailable) as caught:
            store.put_token_counts([count], wait=0.05)
        assert caught.value.cause == "locked"
        with pytest.raises(StoreUnavailable):
            store.put_vectors("probe", [rowid], np.ones((1, 4), dtype=np.float32), wait=0.0)
        # cl100k counts were not made at ingest (o200k were): counted now, not stored
        context = engine.assemble(
            session="s1", query="deploy", model="gpt-4", budget=1000, log_inclusions=False
        )
        assert any("store not written (locked)" in n for n in context.report.notes)
        assert release.is_alive()  # nothing above waited for the lock to come free
    finally:
        release.cancel()
        if holder.in_transaction:
            holder.rollback()
        holder.close()
    assert store.token_counts([rowid], "probe") == {}
    assert store.vector_models() == {}
    store.put_token_counts([count], wait=0.05)  # the lock is free: stored at once
    assert store.token_counts([rowid], "probe") == {rowid: count}
    engine.close()
