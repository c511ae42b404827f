"""The SQLite store's row cache (ctxwarden.store.sqlite_rows): a read through it gives what a
read of the table gives, after every way a row can change."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest

from conftest import Clock
from ctxwarden import Engine
from ctxwarden.compact import CompactionPolicy
from ctxwarden.scope import ReadScope
from ctxwarden.store import sqlite_rows
from ctxwarden.store.base import NewMemory
from ctxwarden.store.reads import MEMORY_COLUMNS, MemoryReads, memory_of
from ctxwarden.store.sqlite import SQLiteStore
from ctxwarden.types import Memory

DAY = 86400.0


def _table(store: SQLiteStore, rowids: list[int]) -> list[Memory]:
    """The memories at ``rowids`` read from the table itself, past the cache."""
    marks = ",".join("?" * len(rowids))
    rows = store._query(
        f"SELECT {MEMORY_COLUMNS} FROM memory_rows WHERE rowid IN ({marks}) ORDER BY rowid",
        rowids,
    )
    return [memory_of(r) for r in rows]


def _records(start: float, count: int, session: str = "s") -> list[dict[str, Any]]:
    return [
        {
            "id": f"{session}-{n}",
            "session": session,
            "author": ["ana", "bo"][n % 2],
            "content": f"note {n}: the deploy of the billing service moved to week {n}",
            "created_at": start + n * 600,
        }
        for n in range(count)
    ]


def _cached(store: SQLiteStore, rowids: list[int]) -> list[Memory]:
    """``memories_at`` through the cache, after checking every row is cached (so the read
    after a write tells whether the write reached the cache)."""
    store.memories_at(rowids)
    found, missing = store._rows.take(rowids)
    assert not missing
    assert set(found) == set(rowids)
    return store.memories_at(rowids)


@pytest.fixture
def opened(tmp_path: Path, clock: Clock) -> Any:
    with Engine.open(tmp_path / "m.db", clock=clock) as engine:
        engine.ingest(_records(clock.now - 20 * DAY, 12))
        store = engine.store
        assert isinstance(store, SQLiteStore)
        yield engine, store, [engine.get(f"s-{n}").rowid for n in range(12)]


def test_a_duplicate_bump_an_edit_and_the_inclusion_log_reach_cached_rows(opened: Any) -> None:
    engine, store, rowids = opened
    _cached(store, rowids)
    first = engine.get("s-0")
    engine.ingest([{**_records(first.created_at, 1)[0], "id": "again"}])  # an exact repeat
    assert store.memories_at(rowids) == _table(store, rowids)
    assert store.memories_at([first.rowid])[0].dup_count == first.dup_count + 1

    _cached(store, rowids)
    engine.update("s-1", "the deploy moved to Friday")
    assert store.memories_at(rowids) == _table(store, rowids)
    assert store.memories_at([rowids[1]])[0].content == "the deploy moved to Friday"

    _cached(store, rowids)
    context = engine.assemble(session="s", query="when is the deploy?", budget=2000)
    assert context.included
    after = store.memories_at(rowids)
    assert after == _table(store, rowids)
    assert any(m.access_count > 0 and m.access_score > 0 for m in after)
    # The stats of the included rows were written into the cached rows, not dropped.
    assert not store._rows.take(rowids)[1]


def test_an_erased_row_leaves_the_cache(opened: Any) -> None:
    engine, store, rowids = opened
    _cached(store, rowids)
    engine.delete("s-3", reason="test")
    assert store.memories_at(rowids) == _table(store, rowids)
    assert rowids[3] not in {m.rowid for m in store.memories_at(rowids)}
    cached = list(store._rows._rows.values())
    assert all("week 3" not in str(row) for row in cached)
    engine.delete_session("s")
    assert store.memories_at(rowids) == []
    assert len(store._rows) == 0


def test_compaction_reaches_cached_rows(opened: Any) -> None:
    engine, store, rowids = opened
    _cached(store, rowids)
    result = engine.compact(policy=CompactionPolicy(older_than=DAY, min_cluster_size=2))
    assert result.compacted
    assert store.memories_at(rowids) == _table(store, rowids)
    assert len(store.memories_at(rowids)) < len(rowids)


def test_a_write_by_another_connection_empties_the_cache(opened: Any, tmp_path: Path) -> None:
    _, store, rowids = opened
    _cached(store, rowids)
    other = sqlite3.connect(tmp_path / "m.db", isolation_level=None)
    other.execute("UPDATE memories SET content = 'changed elsewhere' WHERE rowid = ?", (rowids[0],))
    other.close()
    assert store.memories_at(rowids)[0].content == "changed elsewhere"
    assert store.memories_at(rowids) == _table(store, rowids)
    # ... and the triggers still work afterwards.
    _cached(store, rowids)
    with store.write() as writer:
        writer._conn.execute("UPDATE memories SET content = 'mine' WHERE rowid = ?", (rowids[1],))
    assert store.memories_at([rowids[1]])[0].content == "mine"


def test_a_rolled_back_write_leaves_no_trace(opened: Any) -> None:
    _, store, rowids = opened
    before = _cached(store, rowids)
    with pytest.raises(RuntimeError), store.write() as writer:
        writer._conn.execute("UPDATE memories SET content = 'undone' WHERE rowid = ?", (rowids[0],))
        assert store.memories_at([rowids[0]])[0].content == "undone"  # its own transaction
        raise RuntimeError("abort")
    assert store.memories_at(rowids) == before == _table(store, rowids)


def test_cached_rows_of_one_tenant_never_answer_another(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "t.db")
    with store.write() as writer:
        for n, tenant in enumerate(["a", "b", "a", "b"]):
            memory = NewMemory(
                id=f"{tenant}{n}", tenant=tenant, session="s", channel=None, author="ana",
                author_kind="human", role="user", content=f"kafka lag alert {n}",
                created_at=100.0 + n, thread_id=None, reply_to=None, kind="message",
                pinned=False, name=None, tool_calls=(), tool_call_id=None, attachments=(),
                metadata={}, content_hash=f"h{n}",
            )  # fmt: skip
            writer.insert(memory)
    every = [int(r[0]) for r in store._query("SELECT rowid FROM memories", ())]
    assert len(store.memories_at(every)) == 4  # all four cached
    for tenant in ("a", "b"):
        hits = store.search(tenant, ["kafka", "lag"], limit=10)
        assert len(hits) == 2
        assert {m.tenant for m, _ in hits} == {tenant}
        anchors = [m for m, _ in hits]
        links = store.neighbours(tenant, anchors, turns=3)
        assert {link.memory.tenant for link in links} <= {tenant}
    store.close()


def test_the_cache_is_bounded(opened: Any) -> None:
    _, store, rowids = opened
    store._rows.limit = 5
    assert store.memories_at(rowids) == _table(store, rowids)
    assert len(store._rows) == 5


def test_remembered_reads_follow_every_write(opened: Any, tmp_path: Path) -> None:
    engine, store, rowids = opened
    count = "SELECT count(*) FROM memories WHERE tenant = ? AND session = ?"
    assert store._remembered(count, ["default", "s"]) == ((12,),)
    engine.ingest([{"id": "new", "session": "s", "content": "a fresh zeppelin note"}])
    assert store._remembered(count, ["default", "s"]) == ((13,),)
    # A scoped word search (its rowid range kept) and a vector scope see the new row.
    scope = ReadScope(kind="session", session="s")
    assert [m.id for m, _ in store.search("default", ["zeppelin"], scope=scope)] == ["new"]
    aliases = "SELECT count(*) FROM aliases WHERE tenant = ?"
    before = store._remembered(aliases, ["default"])[0][0]
    with store.write() as writer:
        writer._conn.execute(
            "INSERT INTO aliases (tenant, id, memory_rowid, status, created_at) "
            "VALUES ('default', 'other-name', ?, 'alias', 0)",
            (rowids[0],),
        )
    assert store._remembered(aliases, ["default"]) == ((before + 1,),)
    with pytest.raises(RuntimeError), store.write() as writer:
        writer._conn.execute("DELETE FROM memories WHERE rowid = ?", (rowids[0],))
        assert store._remembered(count, ["default", "s"]) == ((12,),)
        raise RuntimeError("abort")
    assert store._remembered(count, ["default", "s"]) == ((13,),)
    other = sqlite3.connect(tmp_path / "m.db", isolation_level=None)
    other.execute("PRAGMA foreign_keys = ON")
    other.execute("DELETE FROM memories WHERE rowid = ?", (rowids[1],))
    other.close()
    assert store._remembered(count, ["default", "s"]) == ((12,),)


def test_a_memory_with_dicts_is_made_anew_for_every_reader(opened: Any) -> None:
    engine, store, _ = opened
    engine.ingest([{"id": "meta", "session": "s", "content": "tagged", "metadata": {"k": [1]}}])
    rowid = engine.get("meta").rowid
    first = store.memories_at([rowid])[0]
    first.metadata["k"].append(2)  # a careless caller
    again = store.memories_at([rowid])[0]
    assert again.metadata == {"k": [1]}
    assert again is not first
    plain = engine.get("s-0").rowid
    assert store.memories_at([plain])[0] is store.memories_at([plain])[0]  # nothing to change


def test_recent_pages_follow_writes(opened: Any) -> None:
    engine, store, _ = opened

    def page(**options: Any) -> list[Memory]:
        return store.recent("default", "s", limit=5, **options)

    def table(**options: Any) -> list[Memory]:
        return MemoryReads.recent(store, "default", "s", limit=5, **options)

    assert page() == table()
    assert page() == table()  # (the page's rowids and rows kept)
    newest = page()[0]
    engine.ingest([{"id": "latest", "session": "s", "content": "the newest note"}])
    assert page()[0].id == "latest"
    assert page() == table()
    engine.update("latest", "the newest note, edited")
    assert page()[0].content == "the newest note, edited"
    engine.delete("latest", reason="test")
    assert page()[0] == newest
    before = (newest.created_at, newest.rowid)
    assert page(before=before) == table(before=before)


def test_a_page_whose_row_went_meanwhile_is_read_in_one_statement(
    opened: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, store, _ = opened
    stored_at = store._stored_at
    monkeypatch.setattr(
        store, "_stored_at", lambda rowids: dict(list(stored_at(rowids).items())[1:])
    )
    assert store.recent("default", "s", limit=5) == MemoryReads.recent(
        store, "default", "s", limit=5
    )


def test_remembered_reads_are_bounded(opened: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    _, store, rowids = opened
    monkeypatch.setattr(sqlite_rows, "MEMO_ROWS", 10)
    monkeypatch.setattr(sqlite_rows, "MEMO_LARGEST", 8)
    every = "SELECT rowid FROM memories WHERE tenant = ? ORDER BY rowid"
    assert [r[0] for r in store._remembered(every, ["default"])] == sorted(rowids)  # 12: not kept
    assert store._memo_rows == 0
    for n in range(1, 6):
        some = f"SELECT rowid FROM memories WHERE tenant = ? ORDER BY rowid LIMIT {n}"
        assert [r[0] for r in store._remembered(some, ["default"])] == sorted(rowids)[:n]
        assert store._memo_rows <= 10
    assert len(store._memos) < 5
