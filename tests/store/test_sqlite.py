"""The SQLite store: schema, writes in transactions, reads filtered by tenant."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from ctxwarden.errors import NotFound, StoreError
from ctxwarden.store import migrations
from ctxwarden.store.base import (
    AggregateUpdate,
    Alias,
    ContextLog,
    Inclusion,
    NewMemory,
    TokenCount,
)
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


def test_targets_aggregates_and_aliases() -> None:
    store = SQLiteStore(":memory:")
    with store.write() as w:
        rowid = w.insert(_memory("a", content="spam"))
        w.insert(_memory("b", content="spam", channel="other", session="s2"))

        def ids(**kw: object) -> list[str]:
            args: dict[str, object] = {
                "exact_scope": "channel", "exact": [], "exact_since": 0.0, "near": [],
                "near_since": 0.0,
            }  # fmt: skip
            args.update(kw)
            return sorted(t.id for t in w.find_targets("t", **args))  # type: ignore[arg-type]

        assert ids(exact=[("c", "h-spam")]) == ["a"]
        assert ids(exact=[("other", "h-spam"), ("c", "h-spam")]) == ["a", "b"]
        assert ids(exact=[("zz", "h-spam")]) == []
        assert ids(exact_scope="session", exact=[("s", "h-spam")]) == ["a"]
        assert ids(exact=[("c", "h-spam")], exact_since=101.0) == []  # outside the TTL
        assert ids(exact=[("c", "h-spam")], exact_scope="session") == []
        w.update_aggregates(
            [AggregateUpdate(rowid=rowid, dup_count=3, last_seen_at=160.0, latest_content="s2")]
        )
        w.add_aliases(
            [
                Alias(tenant="t", id="x", rowid=rowid, status="duplicate", created_at=150.0),
                Alias(tenant="t", id="y", rowid=rowid, status="near_duplicate", created_at=160.0),
            ]
        )
        assert w.resolve("t", "x") == "a"
        assert w.resolve_many("t", ["a", "y", "zz"]) == {"a": "a", "y": "a"}
    memory = store.get("t", "y")
    assert (memory.id, memory.dup_count, memory.last_seen_at) == ("a", 3, 160.0)
    assert memory.latest_content == "s2"
    stats = store.stats("t")
    assert stats["channels"]["c"] == {"memories": 1, "seen": 3, "folded": 2, "exact": 1, "near": 1}
    assert stats["top_families"][0]["count"] == 3


def test_find_targets_near_keys_and_null_channels() -> None:
    store = SQLiteStore(":memory:")
    with store.write() as w:
        for i, at in enumerate([100.0, 300.0, 200.0]):
            memory = _memory(f"n{i}", content=f"tick {i}", at=at)
            w.insert(NewMemory(**{**_fields(memory), "near_key": "k1"}))
        w.insert(NewMemory(**{**_fields(_memory("x", content="tick x")), "near_key": "k2"}))
        nochan = _memory("z", content="tick z", channel=None)
        w.insert(NewMemory(**{**_fields(nochan), "near_key": "k1"}))

        def near(pairs: list[tuple[str | None, str]], since: float) -> list[str]:
            found = w.find_targets(
                "t", exact_scope="session", exact=[], exact_since=0.0, near=pairs,
                near_since=since,
            )  # fmt: skip
            return sorted(t.id for t in found)

        assert near([("c", "k1")], 150.0) == ["n1", "n2"]
        assert near([("c", "k1"), (None, "k1")], 0.0) == ["n0", "n1", "n2", "z"]
        assert near([(None, "k1")], 0.0) == ["z"]
        assert near([("other", "k1")], 0.0) == []


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


def test_inserted_rows_are_searchable_after_commit_and_not_after_rollback() -> None:
    store = SQLiteStore(":memory:")
    with store.write() as w:
        w.insert(_memory("a", content="the zebra deploy"))
    with pytest.raises(RuntimeError), store.write() as w:
        w.insert(_memory("b", content="zebra crossing"))
        raise RuntimeError("abort")
    assert [m.id for m, _ in store.search("t", ["zebra"])] == ["a"]
    with store.write() as w:
        w.insert(_memory("c", content="zebra again"))
    assert sorted(m.id for m, _ in store.search("t", ["zebra"])) == ["a", "c"]
    assert (
        store._query("INSERT INTO memories_fts (memories_fts) VALUES ('integrity-check')", ()) == []
    )
