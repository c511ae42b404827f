"""The SQLite store: schema, writes in transactions, reads filtered by tenant."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from ctxwarden.errors import NotFound, StoreError
from ctxwarden.store import migrations
from ctxwarden.store.base import ContextLog, Inclusion, NewMemory, TokenCount
from ctxwarden.store.sqlite import SQLiteStore


def _memory(id: str, *, tenant: str = "t", content: str = "hello", at: float = 100.0,
            session: str = "s", channel: str | None = "c") -> NewMemory:  # fmt: skip
    return NewMemory(
        id=id, tenant=tenant, session=session, channel=channel, author="ana",
        author_kind="human", role="user", content=content, created_at=at, thread_id=None,
        reply_to=None, kind="message", pinned=False, name=None, tool_calls=(),
        tool_call_id=None, attachments=(), metadata={}, content_hash=f"h-{content}",
    )  # fmt: skip


def test_migrations_plan_then_apply(tmp_path: Path) -> None:
    conn = sqlite3.connect(tmp_path / "x.db", isolation_level=None)
    assert [m.name for m in migrations.plan(conn)] == ["initial", "dedupe"]
    assert [m.version for m in migrations.apply(conn)] == [1, 2]
    assert migrations.plan(conn) == []
    assert migrations.current_version(conn) == 2


def test_migration_2_upgrades_a_version_1_database(tmp_path: Path) -> None:
    conn = sqlite3.connect(tmp_path / "x.db", isolation_level=None)
    conn.execute("BEGIN")
    for statement in migrations.MIGRATIONS[0].statements:
        conn.execute(statement)
    conn.execute("PRAGMA user_version = 1")
    conn.execute("COMMIT")
    conn.close()
    store = SQLiteStore(tmp_path / "x.db")
    with store.write() as w:
        w.insert(_memory("a"))
    assert store.get("t", "a").latest_content is None
    indexes = {r[0] for r in store._query("SELECT name FROM sqlite_master", ())}
    assert {"memories_near", "memories_exact_session"} <= indexes
    store.close()


def test_wal_and_integrity(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "x.db")
    mode = store._query("PRAGMA journal_mode", ())[0][0]
    assert mode == "wal"
    assert store.integrity_check() == "ok"
    store.close()
    store.close()  # idempotent
    with pytest.raises(StoreError, match="closed"):
        store.stats("t")


def test_insert_get_recent_and_tenant_isolation() -> None:
    store = SQLiteStore(":memory:")
    with store.write() as w:
        for i in range(10):
            w.insert(_memory(f"m{i}", at=100.0 + i, content=f"message {i}"))
        w.insert(_memory("other", tenant="u", content="secret of tenant u"))
    assert store.get("t", "m3").content == "message 3"
    with pytest.raises(NotFound):
        store.get("t", "other")
    newest = store.recent("t", "s", limit=3)
    assert [m.id for m in newest] == ["m9", "m8", "m7"]
    page = store.recent("t", "s", before=(newest[-1].created_at, newest[-1].rowid), limit=3)
    assert [m.id for m in page] == ["m6", "m5", "m4"]
    assert store.search("t", ["secret"]) == []
    assert [m.id for m, _ in store.search("u", ["secret"])] == ["other"]


def test_failed_transaction_leaves_store_unchanged() -> None:
    store = SQLiteStore(":memory:")
    with store.write() as w:
        w.insert(_memory("a"))
    with pytest.raises(sqlite3.IntegrityError), store.write() as w:
        w.insert(_memory("b"))
        w.insert(_memory("a"))  # unique (tenant, id)
    assert store.stats("t")["memories"] == 1
    with pytest.raises(NotFound):
        store.get("t", "b")


def test_fold_counts_and_aliases() -> None:
    store = SQLiteStore(":memory:")
    with store.write() as w:
        rowid = w.insert(_memory("a", content="spam"))
        hit = w.find_exact("t", "h-spam", 0, channel="c")
        assert hit is not None
        assert (hit.rowid, hit.id) == (rowid, "a")
        assert w.find_exact("t", "h-spam", 0, channel="other") is None
        assert w.find_exact("t", "h-spam", 0, channel="other", session="s") is not None
        assert w.find_exact("t", "h-spam", 0, channel="c", session="s2") is None
        assert w.find_exact("t", "h-spam", 101, channel="c") is None  # outside the TTL
        w.fold(rowid, alias="b", status="duplicate", seen_at=150.0)
        w.fold(rowid, alias="c", status="near_duplicate", seen_at=160.0, latest_content="spam!")
        w.fold(rowid, alias="d", status="near_duplicate", seen_at=155.0, latest_content="late")
        assert w.resolve("t", "b") == "a"
        assert w.resolve_many("t", ["a", "c", "zz"]) == {"a": "a", "c": "a"}
    memory = store.get("t", "b")
    assert (memory.id, memory.dup_count, memory.last_seen_at) == ("a", 4, 160.0)
    assert memory.latest_content == "spam!"  # the late, older member does not replace it
    stats = store.stats("t")
    assert stats["channels"]["c"] == {"memories": 1, "seen": 4, "folded": 3, "exact": 1, "near": 2}
    assert stats["top_families"][0]["count"] == 4


def test_find_near_most_recent_first_within_since() -> None:
    store = SQLiteStore(":memory:")
    with store.write() as w:
        for i, at in enumerate([100.0, 300.0, 200.0]):
            memory = _memory(f"n{i}", content=f"tick {i}", at=at)
            w.insert(NewMemory(**{**_fields(memory), "near_key": "k1"}))
        w.insert(NewMemory(**{**_fields(_memory("x", content="tick x")), "near_key": "k2"}))
        assert [t.id for t in w.find_near("t", "c", "k1", 150.0)] == ["n1", "n2"]
        assert [t.id for t in w.find_near("t", "c", "k1", 0.0, limit=1)] == ["n1"]
        assert w.find_near("t", "other", "k1", 0.0) == []


def _fields(memory: NewMemory) -> dict[str, object]:
    return {name: getattr(memory, name) for name in NewMemory.__slots__}


def test_token_counts_and_inclusion_log() -> None:
    store = SQLiteStore(":memory:")
    with store.write() as w:
        a = w.insert(_memory("a"))
        b = w.insert(_memory("b", content="world"))
        w.put_token_counts([TokenCount(rowid=a, tokenizer="x", message=3, line=9)])
    store.put_token_counts([TokenCount(rowid=b, tokenizer="x", message=4, line=10)])
    counts = store.token_counts([a, b], "x")
    assert (counts[a].message, counts[b].line) == (3, 10)
    assert store.token_counts([a], "y") == {}
    store.log_context(
        ContextLog(
            id="ctx1", tenant="t", session="s", created_at=200.0, model="m", tokenizer="x",
            exact=True, cap=100, tokens=50, blocks={"recent": {"budget": 80, "used": 50}},
            inclusions=[Inclusion(rowid=a, id="a", block="recent", tokens=7)],
        )
    )  # fmt: skip
    assert store.inclusions("ctx1") == [{"memory_id": "a", "block": "recent", "tokens": 7}]
    memory = store.get("t", "a")
    assert (memory.access_count, memory.included_tokens_total) == (1, 7)
    assert memory.access_score == pytest.approx(1.0)


def test_deleting_a_memory_cascades() -> None:
    store = SQLiteStore(":memory:")
    with store.write() as w:
        a = w.insert(_memory("a", content="unique words here"))
        w.put_token_counts([TokenCount(rowid=a, tokenizer="x", message=3, line=9)])
    store._conn.execute("DELETE FROM memories WHERE rowid = ?", (a,))
    assert store.token_counts([a], "x") == {}
    assert store.search("t", ["unique"]) == []
