"""One suite, every backend: the Store protocol's behaviour, run unchanged on SQLite and PostgreSQL.

The ``store`` fixture yields a fresh ``SQLiteStore(":memory:")`` and, when a server is reachable
(see ``pg_dsn`` in tests/conftest.py), a ``PostgresStore`` in a fresh schema.
"""

from __future__ import annotations

import dataclasses
import math
import sqlite3
from pathlib import Path

import numpy as np
import pytest

from ctxwarden.engine import Engine
from ctxwarden.errors import InputError, NotFound, StoreError
from ctxwarden.store.base import (
    AggregateUpdate,
    Alias,
    ContextLog,
    Inclusion,
    NewMemory,
    Store,
    TokenCount,
    Writer,
)
from ctxwarden.store.reads import MemoryReads
from ctxwarden.store.sqlite import ACCESS_TAU_SECONDS, SQLiteStore

INTEGRITY_ERRORS: tuple[type[Exception], ...] = (sqlite3.IntegrityError, StoreError)
try:
    import psycopg

    INTEGRITY_ERRORS += (psycopg.IntegrityError,)
except ImportError:  # pragma: no cover - without the postgres extra only SQLite runs
    pass


def _memory(id: str, *, tenant: str = "t", content: str = "hello", at: float = 100.0,
            session: str = "s", channel: str | None = "c", kind: str = "message",
            pinned: bool = False, near_key: str | None = None) -> NewMemory:  # fmt: skip
    return NewMemory(
        id=id, tenant=tenant, session=session, channel=channel, author="ana",
        author_kind="human", role="user", content=content, created_at=at, thread_id=None,
        reply_to=None, kind=kind, pinned=pinned, name=None, tool_calls=(),
        tool_call_id=None, attachments=(), metadata={}, content_hash=f"h-{content}",
        near_key=near_key,
    )  # fmt: skip


def test_protocols(store: Store) -> None:
    assert isinstance(store, Store)
    with store.write() as w:
        assert isinstance(w, Writer)


def test_insert_get_recent_and_tenant_isolation(store: Store) -> None:
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
    assert [m.id for m in store.recent("t", "s", channel="elsewhere")] == []
    assert store.search("t", ["secret"]) == []
    assert [m.id for m, _ in store.search("u", ["secret"])] == ["other"]


def test_round_trip_of_every_field(store: Store) -> None:
    memory = NewMemory(
        id="x", tenant="t", session="s", channel=None, author=None, author_kind="agent",
        role="assistant", content="calling a tool", created_at=5.5, thread_id="th",
        reply_to="r", kind="summary", pinned=True, name="bot",
        tool_calls=({"id": "call1", "function": {"name": "f", "arguments": "{}"}},),
        tool_call_id="call0", attachments=({"type": "image", "url": "u"},),
        metadata={"z": 1, "a": [1, 2]}, content_hash="hh", near_key="nk",
        source_ids=("a", "b"), time_range=(1.0, 2.0),
    )  # fmt: skip
    with store.write() as w:
        w.insert(memory)
    got = store.get("t", "x")
    assert (got.channel, got.author, got.thread_id, got.reply_to, got.name) == (
        None, None, "th", "r", "bot",
    )  # fmt: skip
    assert got.tool_calls == memory.tool_calls
    assert got.attachments == memory.attachments
    assert got.metadata == {"z": 1, "a": [1, 2]}
    assert list(got.metadata) == ["z", "a"]
    assert (got.source_ids, got.time_range, got.pinned) == (("a", "b"), (1.0, 2.0), True)
    assert (got.dup_count, got.last_seen_at, got.access_count) == (1, 5.5, 0)


def test_failed_transaction_leaves_store_unchanged(store: Store) -> None:
    with store.write() as w:
        w.insert(_memory("a"))
    with pytest.raises(INTEGRITY_ERRORS), store.write() as w:
        w.insert(_memory("b"))
        w.insert(_memory("a"))  # unique (tenant, id)
    assert store.stats("t")["memories"] == 1
    with pytest.raises(NotFound):
        store.get("t", "b")
    with store.write() as w:  # the store is still usable
        w.insert(_memory("b"))
    assert store.stats("t")["memories"] == 2


def test_same_id_in_two_tenants(store: Store) -> None:
    with store.write() as w:
        w.insert(_memory("a", tenant="t", content="one"))
        w.insert(_memory("a", tenant="u", content="two"))
    assert (store.get("t", "a").content, store.get("u", "a").content) == ("one", "two")


def _targets(w: Writer, **kw: object) -> list[str]:
    args: dict[str, object] = {
        "exact_scope": "channel", "exact": [], "exact_since": 0.0, "near": [], "near_since": 0.0,
    }  # fmt: skip
    args.update(kw)
    return sorted(t.id for t in w.find_targets("t", **args))  # type: ignore[arg-type]


def test_targets_aggregates_and_aliases(store: Store) -> None:
    with store.write() as w:
        rowid = w.insert(_memory("a", content="spam"))
        w.insert(_memory("b", content="spam", channel="other", session="s2"))
        assert _targets(w, exact=[("c", "h-spam")]) == ["a"]
        assert _targets(w, exact=[("other", "h-spam"), ("c", "h-spam")]) == ["a", "b"]
        assert _targets(w, exact=[("zz", "h-spam")]) == []
        assert _targets(w, exact_scope="session", exact=[("s", "h-spam")]) == ["a"]
        assert _targets(w, exact=[("c", "h-spam")], exact_since=101.0) == []  # outside the TTL
        assert _targets(w, exact=[("c", "h-spam")], exact_scope="session") == []
        w.update_aggregates(
            [AggregateUpdate(rowid=rowid, folded=2, last_seen_at=160.0, latest_content="s2")]
        )
        w.add_aliases(
            [
                Alias(tenant="t", id="x", rowid=rowid, status="duplicate", created_at=150.0),
                Alias(tenant="t", id="y", rowid=rowid, status="near_duplicate", created_at=160.0),
            ]
        )
        assert w.resolve("t", "x") == "a"
        assert w.resolve("t", "zzz") is None
        assert w.resolve_many("t", ["a", "y", "zz"]) == {"a": "a", "y": "a"}
    memory = store.get("t", "y")
    assert (memory.id, memory.dup_count, memory.last_seen_at) == ("a", 3, 160.0)
    assert memory.latest_content == "s2"
    stats = store.stats("t")
    assert stats["channels"]["c"] == {
        "memories": 1,
        "seen": 3,
        "folded": 2,
        "exact": 1,
        "near": 1,
        "semantic": 0,
    }
    assert stats["top_families"][0]["count"] == 3
    assert (stats["memories"], stats["seen"], stats["folded"]) == (2, 4, 2)


def test_aggregate_updates_are_increments(store: Store) -> None:
    """Two writers folding into one aggregate both count; an older batch keeps the newer value."""
    with store.write() as w:
        rowid = w.insert(_memory("a", content="tick", at=100.0))
    with store.write() as w:
        w.update_aggregates(
            [AggregateUpdate(rowid=rowid, folded=3, last_seen_at=300.0, latest_content="new")]
        )
    with store.write() as w:  # a batch that saw older members only
        w.update_aggregates(
            [AggregateUpdate(rowid=rowid, folded=2, last_seen_at=200.0, latest_content="old")]
        )
    memory = store.get("t", "a")
    assert (memory.dup_count, memory.last_seen_at, memory.latest_content) == (6, 300.0, "new")


def test_find_targets_near_keys_and_null_channels(store: Store) -> None:
    with store.write() as w:
        for i, at in enumerate([100.0, 300.0, 200.0]):
            w.insert(_memory(f"n{i}", content=f"tick {i}", at=at, near_key="k1"))
        w.insert(_memory("x", content="tick x", near_key="k2"))
        w.insert(_memory("z", content="tick z", channel=None, near_key="k1"))
        w.insert(_memory("dm", content="dm", channel=None))

        def near(pairs: list[tuple[str | None, str]], since: float) -> list[str]:
            return _targets(w, exact_scope="session", near=pairs, near_since=since)

        assert near([("c", "k1")], 150.0) == ["n1", "n2"]
        assert near([("c", "k1"), (None, "k1")], 0.0) == ["n0", "n1", "n2", "z"]
        assert near([(None, "k1")], 0.0) == ["z"]
        assert near([("other", "k1")], 0.0) == []
        assert _targets(w, exact=[(None, "h-dm")]) == ["dm"]
        assert _targets(w, exact=[("c", "h-dm")]) == []
        # The newest per (channel, near key) only, each channel on its own.
        pairs = [("c", "k1"), (None, "k1"), ("c", "k2")]
        assert _targets(w, near=pairs, near_limit=1) == ["n1", "x", "z"]
        assert _targets(w, near=pairs, near_limit=2) == ["n1", "n2", "x", "z"]
        assert _targets(w, near=pairs, near_since=250.0, near_limit=2) == ["n1"]


def test_insert_or_fold_stores_what_no_one_else_stored(store: Store) -> None:
    with store.write() as w:
        status, rowid, id_ = w.insert_or_fold(
            _memory("a", content="hi", at=100.0), heads=["channel:c", "session:s"], since=50.0
        )
        assert (status, id_) == ("stored", "a")
        assert w.insert_or_fold(_memory("b", content="other"))[0] == "stored"
    assert store.get("t", "a").rowid == rowid
    assert (store.stats("t")["memories"], store.stats("t")["seen"]) == (2, 2)


def test_insert_row_or_fold_stores_plain_and_full_rows(store: Store) -> None:
    from dataclasses import replace

    from ctxwarden.store.reads import memory_row

    full = replace(
        _memory("f", content="with extras", at=101.0, near_key="nk"),
        thread_id="th", reply_to="a", name="n", tool_call_id="c1",
        tool_calls=({"id": "c1", "type": "function", "function": {"name": "f", "arguments": ""}},),
        attachments=({"title": "doc", "url": "https://x.io/d"},), metadata={"k": [1]},
    )  # fmt: skip
    with store.write() as w:
        stored = [
            w.insert_row_or_fold(memory_row(None, m)[1:], heads=["channel:c"], since=0.0)
            for m in (_memory("a", content="plain"), full, _memory("b", content="plain too"))
        ]
    assert [(status, id_) for status, _, id_ in stored] == [("stored", i) for i in "afb"]
    plain = store.get("t", "a")
    assert (plain.content, plain.thread_id, plain.metadata, plain.attachments) == (
        "plain",
        None,
        {},
        (),
    )
    got = store.get("t", "f")
    assert got.rowid == stored[1][1]
    assert (got.thread_id, got.reply_to, got.name, got.tool_call_id) == ("th", "a", "n", "c1")
    assert (got.tool_calls, got.attachments, dict(got.metadata)) == (
        full.tool_calls,
        full.attachments,
        {"k": [1]},
    )
    assert (got.content_hash, got.created_at, got.last_seen_at) == ("h-with extras", 101.0, 101.0)


def test_token_counts_and_inclusion_log(store: Store) -> None:
    with store.write() as w:
        a = w.insert(_memory("a"))
        b = w.insert(_memory("b", content="world"))
        w.put_token_counts([TokenCount(rowid=a, tokenizer="x", message=3, line=9)])
    store.put_token_counts([TokenCount(rowid=b, tokenizer="x", message=4, line=10)])
    store.put_token_counts([TokenCount(rowid=b, tokenizer="x", message=5, line=11)])  # replaces
    store.put_token_counts([])
    counts = store.token_counts([a, b], "x")
    assert (counts[a].message, counts[b].message, counts[b].line) == (3, 5, 11)
    assert store.token_counts([a], "y") == {}
    assert store.token_counts([], "x") == {}
    store.log_context(
        ContextLog(
            id="ctx1", tenant="t", session="s", created_at=200.0, model="m", tokenizer="x",
            exact=True, cap=100, tokens=50, blocks={"recent": {"budget": 80, "used": 50}},
            inclusions=[Inclusion(rowid=b, id="b", block="recent", tokens=4),
                        Inclusion(rowid=a, id="a", block="recent", tokens=7)],
        )
    )  # fmt: skip
    assert store.inclusions("ctx1") == [
        {"memory_id": "b", "block": "recent", "tokens": 4},
        {"memory_id": "a", "block": "recent", "tokens": 7},
    ]
    assert store.inclusions("nope") == []
    memory = store.get("t", "a")
    assert (memory.access_count, memory.included_tokens_total) == (1, 7)
    assert memory.access_score == pytest.approx(1.0)
    assert memory.last_accessed_at == 200.0
    assert store.stats("t")["contexts"] == 1


def test_access_score_decays(store: Store) -> None:
    with store.write() as w:
        a = w.insert(_memory("a"))
    for n, at in enumerate((1000.0, 1000.0 + ACCESS_TAU_SECONDS)):
        store.log_context(
            ContextLog(
                id=f"ctx{n}", tenant="t", session="s", created_at=at, model="m", tokenizer="x",
                exact=True, cap=100, tokens=5, blocks={},
                inclusions=[Inclusion(rowid=a, id="a", block="recent", tokens=5)],
            )
        )  # fmt: skip
    memory = store.get("t", "a")
    assert memory.access_count == 2
    assert memory.access_score == pytest.approx(1.0 + math.exp(-1.0))


def test_a_memory_included_again_after_centuries_scores_one(store: Store) -> None:
    """The old score decays to nothing (exp of under -745 is below the smallest double): one
    more inclusion, not an error. PostgreSQL's ``exp`` raises an underflow there; a store whose
    clock jumped (a replay of old logs, a test's clock at 0) must still log its contexts."""
    with store.write() as w:
        a = w.insert(_memory("a"))
    _log(store, "ctx0", 0.0, (a, "a", 5))
    _log(store, "ctx1", 1000 * 365 * 86400.0, (a, "a", 5))
    memory = store.get("t", "a")
    assert (memory.access_count, memory.access_score) == (2, pytest.approx(1.0))
    assert store.inclusions("ctx1") == [{"memory_id": "a", "block": "related", "tokens": 5}]


# -- access stats (migration 8: the narrow memory_access table) -------------------------------

_ACCESS_ROWS = (
    "SELECT memory_rowid, access_count, last_accessed_at, access_score, access_score_at, "
    "included_tokens_total FROM memory_access ORDER BY memory_rowid"
)


def _sql(store: Store, sql: str, params: tuple[object, ...] = ()) -> list[tuple[object, ...]]:
    """Rows of one statement (``?`` placeholders) on either backend."""
    assert isinstance(store, MemoryReads)
    return [tuple(r) for r in store._read(sql, params)]


def _log(store: Store, id: str, at: float, *included: tuple[int, str, int]) -> None:
    store.log_context(
        ContextLog(
            id=id, tenant="t", session="s", created_at=at, model="m", tokenizer="x", exact=True,
            cap=100, tokens=sum(t for _, _, t in included), blocks={},
            inclusions=[Inclusion(rowid=r, id=i, block="related", tokens=t)
                        for r, i, t in included],
        )
    )  # fmt: skip


def test_access_stats_are_rows_of_their_own_table(store: Store) -> None:
    with store.write() as w:
        a = w.insert(_memory("a", content="one"))
        w.insert(_memory("b", content="two"))
        gone = w.insert(_memory("gone", content="three"))
        assert w.delete("t", "gone", deleted_at=150.0, reason="test")
    # a listed twice (one access, its tokens summed); a memory erased since it was retrieved is
    # skipped, not an error
    _log(store, "ctx1", 200.0, (a, "a", 3), (a, "a", 4), (gone, "gone", 5))
    assert _sql(store, _ACCESS_ROWS) == [(a, 1, 200.0, 1.0, 200.0, 7)]
    _log(store, "ctx2", 200.0 + ACCESS_TAU_SECONDS, (a, "a", 2))
    ((_, count, last, score, score_at, tokens),) = _sql(store, _ACCESS_ROWS)
    assert (count, last, score_at, tokens) == (
        2,
        200.0 + ACCESS_TAU_SECONDS,
        200.0 + ACCESS_TAU_SECONDS,
        9,
    )
    assert score == pytest.approx(1.0 + math.exp(-1.0))
    got = store.get("t", "a")
    assert (got.access_count, got.last_accessed_at, got.included_tokens_total) == (2, last, 9)
    assert got.access_score == pytest.approx(score)
    # a memory never included has no row and reads as zero, on every read path
    never = store.get("t", "b")
    assert (never.access_count, never.last_accessed_at, never.access_score,
            never.included_tokens_total) == (0, None, 0.0, 0)  # fmt: skip
    assert [m.access_count for m in store.recent("t", "s")] == [0, 2]  # newest first
    assert [m.access_count for m in store.iter_memories("t")] == [2, 0]
    assert [m.access_count for m, _ in store.search("t", ["one", "two"])] in ([2, 0], [0, 2])
    (candidate, score_time), _ = store.compaction_candidates("t", created_before=1000.0)
    assert (candidate.access_count, score_time) == (2, score_at)
    # the wide memory rows hold no access stats any more (migration 8 dropped the columns)
    with pytest.raises(StoreError):
        _sql(store, "SELECT access_count FROM memories")


def test_access_stats_go_with_their_memories(store: Store) -> None:
    with store.write() as w:
        rows = {
            id_: w.insert(_memory(id_, content=f"text of {id_}", session=session, tenant=tenant))
            for id_, session, tenant in [("a", "s", "t"), ("b", "s", "t"), ("c", "s", "t"),
                                         ("d", "s", "t"), ("e", "s2", "t"), ("f", "s", "u")]
        }  # fmt: skip
    _log(store, "ctx1", 300.0, *((rowid, id_, 10) for id_, rowid in rows.items()))
    _log(store, "ctx2", 300.0, (rows["d"], "d", 5))

    def stats() -> dict[int, tuple[object, ...]]:
        return {int(str(r[0])): r[1:] for r in _sql(store, _ACCESS_ROWS)}

    assert set(stats()) == set(rows.values())
    with store.write() as w:
        assert w.delete("t", "a", deleted_at=400.0, reason="test")
    assert rows["a"] not in stats()
    with store.write() as w:  # compaction: the originals' stats go (the summary has none)
        summary = w.insert(_summary("S", ["b"]))
        assert w.retire("t", ["b"], summary_rowid=summary, deleted_at=600.0, reason="compacted")
    assert rows["b"] not in stats()
    assert summary not in stats()
    with store.write() as w:  # a merge carries the stats forward into the aggregate
        assert w.merge("t", "c", into="d", merged_at=610.0, status="semantic_duplicate",
                       latest_content=None)  # fmt: skip
    assert rows["c"] not in stats()
    assert stats()[rows["d"]] == (3, 300.0, pytest.approx(3.0), 300.0, 25)
    with store.write() as w:  # merging a memory never included leaves the aggregate's stats
        w.insert(_memory("g", content="text of g"))
        assert w.merge("t", "g", into="d", merged_at=620.0, status="semantic_duplicate",
                       latest_content=None)  # fmt: skip
        w.insert(_memory("h", content="text of h"))
        w.insert(_memory("i", content="text of i"))
        assert w.merge("t", "h", into="i", merged_at=620.0, status="semantic_duplicate",
                       latest_content=None)  # fmt: skip
    assert stats()[rows["d"]] == (3, 300.0, pytest.approx(3.0), 300.0, 25)
    assert store.get("t", "i").access_count == 0
    assert len(stats()) == 3  # d, e, f
    with store.write() as w:
        w.delete_session("t", "s2", deleted_at=700.0, reason="test")
        w.delete_tenant("u", deleted_at=700.0, reason="test")
    assert set(stats()) == {rows["d"]}
    with store.write() as w:
        w.delete_tenant("t", deleted_at=800.0, reason="test")
    assert stats() == {}


@pytest.mark.parametrize(
    "backend", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
)
def test_migration_8_keeps_the_access_stats_of_a_version_7_store(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    insert = (
        "INSERT INTO memories (id, tenant, session, author_kind, role, content, created_at, "
        "kind, content_hash, last_seen_at, access_count, last_accessed_at, access_score, "
        "access_score_at, included_tokens_total) VALUES "
        "('used', 't', 's', 'human', 'user', 'used one', 10.0, 'message', 'h1', 10.0, "
        "3, 50.0, 2.5, 40.0, 120), "
        "('idle', 't', 's', 'human', 'user', 'idle one', 20.0, 'message', 'h2', 20.0, "
        "0, NULL, 0, NULL, 0)"
    )
    opened: Store
    if backend == "sqlite":
        from ctxwarden.store import migrations

        conn = sqlite3.connect(tmp_path / "v7.db", isolation_level=None)
        conn.execute("PRAGMA foreign_keys = ON")
        for migration in migrations.MIGRATIONS[:7]:
            for statement in migration.statements:
                conn.execute(statement)
        conn.execute("PRAGMA user_version = 7")
        conn.execute(insert)
        conn.close()
        opened = SQLiteStore(tmp_path / "v7.db")
    else:
        import psycopg

        from ctxwarden.store import pg_migrations
        from ctxwarden.store.postgres import PostgresStore

        dsn = request.getfixturevalue("pg_schema_dsn")
        with psycopg.connect(dsn, autocommit=True) as pg:
            assert pg_migrations.apply(pg, below=8)[-1].version == 7
            pg.execute(insert)
        opened = PostgresStore(dsn)
    try:
        used, idle = opened.get("t", "used"), opened.get("t", "idle")
        assert (used.access_count, used.last_accessed_at, used.access_score,
                used.included_tokens_total) == (3, 50.0, 2.5, 120)  # fmt: skip
        assert (idle.access_count, idle.last_accessed_at, idle.access_score,
                idle.included_tokens_total) == (0, None, 0.0, 0)  # fmt: skip
        assert _sql(opened, _ACCESS_ROWS) == [(used.rowid, 3, 50.0, 2.5, 40.0, 120)]
        # and the decay goes on from the copied score and its time
        _log(opened, "ctx", 40.0 + ACCESS_TAU_SECONDS, (used.rowid, "used", 1))
        again = opened.get("t", "used")
        assert again.access_count == 4
        assert again.access_score == pytest.approx(2.5 * math.exp(-1.0) + 1.0)
    finally:
        opened.close()


def test_pinned_and_summaries(store: Store) -> None:
    with store.write() as w:
        w.insert(_memory("p", pinned=True, at=3.0, content="pinned note"))
        w.insert(_memory("f", kind="fact", at=2.0, content="a fact", session="s2"))
        w.insert(_memory("m", at=1.0, content="plain"))
        w.insert(_memory("sum", kind="summary", at=4.0, content="summary text"))
        w.insert(_memory("sum2", kind="summary", at=5.0, content="other", session="s2"))
    assert [m.id for m in store.pinned("t")] == ["f", "p"]
    assert [m.id for m in store.pinned("t", session="s")] == ["p"]
    assert [m.id for m in store.summaries("t")] == ["sum", "sum2"]
    assert [m.id for m in store.summaries("t", session="s2")] == ["sum2"]
    assert [m.id for m in store.recent("t", "s")] == ["p", "m"]  # messages only
    assert store.pinned("u") == []


def test_set_pinned_finds_the_memory_through_an_alias(store: Store) -> None:
    with store.write() as w:
        rowid = w.insert(_memory("m", content="keep this"))
        w.add_aliases([Alias(tenant="t", id="m2", rowid=rowid, status="duplicate", created_at=1.0)])
        w.insert(_memory("other", tenant="u"))
        assert w.set_pinned("t", "m2", True) is True
        assert w.set_pinned("t", "nope", True) is False
        assert w.set_pinned("t", "other", True) is False  # another tenant's id
    assert [m.id for m in store.pinned("t")] == ["m"]
    assert store.get("t", "m").pinned is True
    assert store.pinned("u") == []
    with store.write() as w:
        assert w.set_pinned("t", "m", False) is True
    assert store.pinned("t") == []
    assert store.get("t", "m").pinned is False


def test_authors_are_distinct_sorted_and_per_tenant(store: Store) -> None:
    with store.write() as w:
        for n, author in enumerate(["cleo", "ana", None, "Bob", "ana", "_x"]):
            w.insert(dataclasses.replace(_memory(f"m{n}", at=float(n)), author=author))
        w.insert(dataclasses.replace(_memory("x", tenant="u"), author="zed"))
    # by code point on both backends (not by PostgreSQL's collation, which puts "Bob" after "ana")
    assert store.authors("t") == ["Bob", "_x", "ana", "cleo"]
    assert store.authors("u") == ["zed"]
    assert store.authors("nobody") == []


def test_search_ranks_and_filters(store: Store) -> None:
    with store.write() as w:
        w.insert(_memory("a", content="the database migration failed again", at=1.0))
        w.insert(_memory("b", content="lunch at noon?", at=2.0))
        w.insert(_memory("c", content="database database: migration rollback worked", at=3.0))
        w.insert(_memory("d", content="Deploying the new databases tomorrow", at=4.0))
    hits = store.search("t", ["migration", "rollback"])
    assert hits[0][0].id == "c"
    assert {m.id for m, _ in hits} == {"a", "c"}
    assert all(score > 0 for _, score in hits)
    assert [s for _, s in hits] == sorted((s for _, s in hits), reverse=True)
    assert "d" in {m.id for m, _ in store.search("t", ["database"])}  # stemming
    assert [m.id for m, _ in store.search("t", ["migration failed"])] == ["a"]  # a phrase
    assert store.search("t", []) == []
    assert store.search("t", ["zebra"]) == []
    assert len(store.search("t", ["database"], limit=1)) == 1
    assert [m.id for m, _ in store.search("t", ['"quoted" noon'])] in ([], ["b"])


def test_search_with_known_rows_gives_the_same_hits(store: Store) -> None:
    with store.write() as w:
        for i in range(30):
            w.insert(_memory(f"m{i}", content=f"deploy {'kafka ' * (i % 4)}note {i}", at=i))
        w.insert(_memory("x", tenant="u", content="deploy kafka elsewhere"))
    plain = store.search("t", ["deploy", "kafka"], limit=10)
    # Known rows: some of the hits (one changed, to tell where it came from), a non-hit and
    # another tenant's memory under a hit's rowid (never taken for this tenant's row).
    first, second = plain[0][0], plain[1][0]
    other = store.search("u", ["kafka"])[0][0]
    known = {
        first.rowid: first,
        second.rowid: second._replace(content="as read before"),
        plain[2][0].rowid: other._replace(rowid=plain[2][0].rowid),
        store.get("t", "m29").rowid: store.get("t", "m29"),
    }
    again = store.search("t", ["deploy", "kafka"], limit=10, known=known)
    assert [(m.rowid, s) for m, s in again] == [(m.rowid, s) for m, s in plain]
    assert [m for m, _ in again][2:] == [m for m, _ in plain][2:]
    assert again[0][0] == first
    assert again[1][0].content in ("as read before", second.content)  # a backend may re-read
    assert store.search("t", ["zebra"], known=known) == []


def test_iter_memories_pages_in_order(store: Store) -> None:
    with store.write() as w:
        for i in range(1203):
            w.insert(_memory(f"m{i}", at=float(i // 3), content=f"n {i}"))
        w.insert(_memory("x", tenant="u"))
    ids = [m.id for m in store.iter_memories("t")]
    assert ids == [f"m{i}" for i in range(1203)]
    assert [m.id for m in store.iter_memories("nobody")] == []


def test_closed_store_raises(store: Store) -> None:
    store.close()
    store.close()  # idempotent
    with pytest.raises(StoreError, match="closed"):
        store.stats("t")


def test_engine_over_the_store(store: Store) -> None:
    engine = Engine(store)
    result = engine.ingest(
        [
            {"id": "1", "session": "s", "channel": "c", "author": "ana",
             "content": "ship it on friday", "created_at": 100.0},
            {"id": "2", "session": "s2", "channel": "c", "author": "ana",
             "content": "ship it on friday", "created_at": 101.0},
            {"id": "1", "session": "s", "content": "again"},
            {"id": "3", "session": "s", "channel": "c", "author": "bo",
             "content": "no, monday", "created_at": 102.0},
        ]
    )  # fmt: skip
    # "1" again with other text is an edit of the aggregate it heads.
    assert [o.status for o in result.outcomes] == ["stored", "duplicate", "edited", "stored"]
    assert engine.get("1").content == "again"
    assert result.outcomes[1].duplicate_of == "1"
    assert engine.get("2").dup_count == 2
    context = engine.assemble(session="s", query="friday")
    assert context.tokens > 0
    assert engine.stats()["contexts"] == 1
    assert engine.get("1").access_count == 1


def _summary_of(id: str, sources: list[str], *, content: str, session: str = "s") -> NewMemory:
    return NewMemory(
        id=id, tenant="t", session=session, channel=None, author=None, author_kind="agent",
        role="assistant", content=content, created_at=50.0, thread_id=None, reply_to=None,
        kind="summary", pinned=False, name=None, tool_calls=(), tool_call_id=None,
        attachments=(), metadata={}, content_hash=f"h-{id}", source_ids=sources,
        time_range=(1.0, 9.0),
    )  # fmt: skip


def _tombstones(store: Store) -> list[tuple[str, str]]:
    return [(t.id, t.reason) for t in store.tombstones("t")]


def test_delete_erases_summaries_built_from_the_memory(store: Store) -> None:
    with store.write() as w:
        a = w.insert(_memory("a", content="alpha secret", at=1.0))
        w.insert(_memory("b", content="bravo", at=2.0))
        w.add_aliases([Alias(tenant="t", id="a2", rowid=a, status="duplicate", created_at=3.0)])
        w.insert(_summary_of("s1", ["a2", "b"], content="summary: alpha secret and bravo"))
        w.insert(_summary_of("s2", ["s1"], content="summary of s1: alpha secret"))
        w.insert(_summary_of("s3", ["b"], content="summary: bravo only"))
        w.insert(_memory("a", tenant="u", content="alpha secret", at=1.0))
        w.insert(_memory("z", tenant="u", content="u alone"))
    with store.write() as w:
        assert w.delete("t", "a2", deleted_at=10.0, reason="user request")
        assert not w.delete("t", "a2", deleted_at=10.0, reason="user request")
    remaining = {m.id for m in store.iter_memories("t")}
    assert remaining == {"b", "s3"}
    assert store.search("t", ["secret"]) == []
    assert [m.id for m, _ in store.search("u", ["secret"])] == ["a"]  # other tenant untouched
    assert _tombstones(store) == [
        ("a", "user request"),
        ("s1", "user request (summary of erased memories)"),
        ("s2", "user request (summary of erased memories)"),
    ]
    with pytest.raises(NotFound):
        store.get("t", "a2")


def test_erasing_an_id_again_rewrites_its_whole_tombstone(store: Store) -> None:
    # An id erased, stored again and erased again: the tombstone describes the last memory
    # (its hash, time and reason), the same on every backend.
    with store.write() as w:
        w.insert(_memory("x", content="first", at=1.0))
    with store.write() as w:
        assert w.delete("t", "x", deleted_at=10.0, reason="first request")
        w.insert(_memory("x", content="second", at=20.0))
    with store.write() as w:
        assert w.delete("t", "x", deleted_at=30.0, reason="second request")
    [tomb] = store.tombstones("t")
    assert (tomb.id, tomb.content_hash, tomb.deleted_at, tomb.reason, tomb.summary_id) == (
        "x", "h-second", 30.0, "second request", None,
    )  # fmt: skip


def test_delete_session_and_tenant(store: Store) -> None:
    with store.write() as w:
        for i in range(5):
            w.insert(_memory(f"s-{i}", content=f"in s number {i}", at=float(i)))
            w.insert(_memory(f"o-{i}", content=f"in o number {i}", at=float(i), session="o"))
        w.insert(_summary_of("sum", ["s-1"], content="summary of s", session="o"))
        w.insert(_memory("keep", tenant="u", content="in s number 1", at=1.0))
    store.log_context(
        ContextLog(
            id="ctx-s", tenant="t", session="s", created_at=9.0, model="m", tokenizer="k",
            exact=True, cap=100, tokens=10, blocks={},
            inclusions=[Inclusion(rowid=store.get("t", "s-1").rowid, id="s-1", block="recent",
                                  tokens=5)],
        )
    )  # fmt: skip
    with store.write() as w:
        erased = w.delete_session("t", "s", deleted_at=10.0, reason="session deleted")
    assert len(erased) == 6  # five messages and the summary citing one of them
    assert {m.id for m in store.iter_memories("t")} == {f"o-{i}" for i in range(5)}
    assert store.inclusions("ctx-s") == []
    assert store.stats("t")["contexts"] == 0
    with store.write() as w:
        assert w.delete_session("t", "s", deleted_at=11.0, reason="again") == []
        assert len(w.delete_tenant("t", deleted_at=12.0, reason="tenant deleted")) == 5
    assert list(store.iter_memories("t")) == []
    assert store.search("t", ["number"]) == []
    assert len(_tombstones(store)) == 11
    assert [m.id for m in store.iter_memories("u")] == ["keep"]


def test_key_store(store: Store) -> None:
    from ctxwarden.errors import AuthError, ConflictError
    from ctxwarden.server.auth import KeyAuth, issue_key
    from ctxwarden.store.base import ApiKey, KeyStore

    assert isinstance(store, KeyStore)
    key = ApiKey(
        key_id="k1", tenant="acme", scopes=frozenset({"read", "write"}), secret_hash="h",
        name="bot", created_at=5.0,
    )  # fmt: skip
    store.put_api_key(key)
    with pytest.raises(ConflictError):
        store.put_api_key(key)
    assert store.api_key("k1") == key
    assert store.api_key("nope") is None
    issued = issue_key(store, tenant="beta", scopes={"read"}, now=6.0)
    assert [k.tenant for k in store.api_keys()] == ["acme", "beta"]  # oldest first
    assert [k.tenant for k in store.api_keys("beta")] == ["beta"]
    assert KeyAuth(store)(issued).tenant == "beta"
    assert store.revoke_api_key("k1", 9.0)
    assert store.revoke_api_key("k1", 10.0)  # idempotent: the first time is kept
    assert store.api_key("k1").revoked_at == 9.0  # type: ignore[union-attr]
    assert not store.revoke_api_key("nope", 9.0)
    # deleting a tenant revokes its keys in the same transaction, and only its keys
    other = issue_key(store, tenant="gamma", scopes={"read"}, now=7.0)
    with store.write() as w:
        w.delete_tenant("beta", deleted_at=20.0, reason="tenant deleted")
    assert [k.revoked_at for k in store.api_keys("beta")] == [20.0]
    assert store.api_key("k1").revoked_at == 9.0  # type: ignore[union-attr]
    with pytest.raises(AuthError, match="revoked"):
        KeyAuth(store)(issued)
    assert KeyAuth(store)(other).tenant == "gamma"


# -- compaction: Writer.retire, Store.compaction_candidates / tombstones / vacuum ---------------


def _summary(id: str, sources: list[str], *, at: float = 500.0) -> NewMemory:
    base = _memory(id, kind="summary", at=at, content=f"summary {id} of kafka outage")
    return NewMemory(**{**{f: getattr(base, f) for f in base.__slots__},  # type: ignore[attr-defined]
                        "source_ids": tuple(sources), "time_range": (100.0, 200.0)})  # fmt: skip


def test_compaction_candidates_filter_and_order(store: Store) -> None:
    with store.write() as w:
        w.insert(_memory("old2", at=20.0, content="b"))
        w.insert(_memory("old1", at=10.0, content="a"))
        w.insert(_memory("pinned", at=5.0, content="p", pinned=True))
        w.insert(_memory("fact", at=5.0, content="f", kind="fact"))
        w.insert(_memory("young", at=90.0, content="y"))
        w.insert(_memory("other", at=1.0, content="o", tenant="u"))
        seen = w.insert(_memory("seen", at=5.0, content="s"))
        w.update_aggregates(
            [AggregateUpdate(rowid=seen, folded=1, last_seen_at=95.0, latest_content=None)]
        )
    rows = store.compaction_candidates("t", created_before=50.0)
    assert [m.id for m, _ in rows] == ["old1", "old2"]  # oldest first; last seen counts too
    assert [at for _, at in rows] == [None, None]
    store.log_context(
        ContextLog(
            id="ctx", tenant="t", session="s", created_at=30.0, model="m", tokenizer="k",
            exact=True, cap=10, tokens=3, blocks={},
            inclusions=(Inclusion(id="old1", rowid=store.get("t", "old1").rowid, block="b",
                                  tokens=3),),
        )
    )  # fmt: skip
    rows = store.compaction_candidates("t", created_before=50.0)
    assert rows[0][0].access_score == pytest.approx(1.0)
    assert rows[0][1] == pytest.approx(30.0)
    assert store.compaction_candidates("nobody", created_before=1e12) == []


def test_retire_replaces_memories_by_their_summary(store: Store) -> None:
    with store.write() as w:
        a = w.insert(_memory("a", at=100.0, content="kafka broker down"))
        w.insert(_memory("b", at=150.0, content="kafka restarted"))
        w.insert(_memory("keep", at=160.0, content="kafka is fine now"))
        w.add_aliases([Alias(tenant="t", id="a-dup", rowid=a, status="duplicate", created_at=1.0)])
        w.put_token_counts([TokenCount(rowid=a, tokenizer="k", message=5, line=4)])
    with store.write() as w:
        rowid = w.insert(_summary("S1", ["a", "b"]))
        assert w.retire("t", ["a", "b", "missing"], summary_rowid=rowid, deleted_at=600.0,
                        reason="compacted") == 2  # fmt: skip
        assert w.resolve("t", "a") == "S1"
        assert w.resolve_many("t", ["a", "a-dup", "b", "keep", "missing"]) == {
            "a": "S1", "a-dup": "S1", "b": "S1", "keep": "keep"}  # fmt: skip
    for old in ("a", "a-dup", "b"):
        assert store.get("t", old).id == "S1"
    with pytest.raises(NotFound):
        store.get("u", "a")  # tombstones are per tenant
    assert store.token_counts([a], "k") == {}
    assert [m.id for m, _ in store.search("t", ["broker"])] == []  # gone from the index
    assert {m.id for m, _ in store.search("t", ["kafka"])} == {"keep", "S1"}
    stones = store.tombstones("t")
    assert [t.id for t in stones] == ["a", "b"]
    assert stones[0].summary_id == "S1"
    assert stones[0].reason == "compacted"
    assert stones[0].content_hash == "h-kafka broker down"
    assert stones[0].time_range == (100.0, 100.0)
    assert stones[0].deleted_at == 600.0
    assert store.tombstones("t", summary_id="nope") == []
    assert store.tombstones("u") == []
    assert {m.id for m in store.iter_memories("t")} == {"keep", "S1"}
    # A summary of summaries takes over the older summary's tombstones.
    with store.write() as w:
        top = w.insert(_summary("S2", ["S1", "keep"], at=700.0))
        assert w.retire("t", ["S1", "keep"], summary_rowid=top, deleted_at=800.0,
                        reason="compacted") == 2  # fmt: skip
    assert {t.id for t in store.tombstones("t", summary_id="S2")} == {"a", "b", "S1", "keep"}
    s1 = next(t for t in store.tombstones("t") if t.id == "S1")
    assert s1.time_range == (100.0, 200.0)  # a summary keeps its own time range
    for old in ("a", "a-dup", "b", "S1", "keep"):
        assert store.get("t", old).id == "S2"
    store.vacuum()
    assert store.get("t", "a").id == "S2"


def test_erasing_a_compacted_id_rewrites_its_summary(store: Store) -> None:
    summary_text = (
        "Summary of 3 messages\nEntities: ana, bo\nEvents:\n"
        "- [a] ana: the vault code is 4711\n- [b] bo: kafka restarted\n"
        "Decisions:\n- [a,c] ana: rotate 4711 monthly\n- [c] bo: keep kafka 3.6"
    )
    with store.write() as w:
        w.insert(_memory("a", at=100.0, content="the vault code is 4711"))
        w.insert(_memory("b", at=150.0, content="kafka restarted"))
        w.insert(_memory("c", at=160.0, content="keep kafka 3.6, rotate monthly"))
        w.insert(_summary_of("top", ["S1"], content="Summary of 1 message\nEvents:\n- [S1] 4711"))
        rowid = w.insert(_summary_of("S1", ["a", "b", "c"], content=summary_text))
        assert w.retire("t", ["a", "b", "c"], summary_rowid=rowid, deleted_at=600.0,
                        reason="compacted") == 3  # fmt: skip
        w.put_token_counts([TokenCount(rowid=rowid, tokenizer="k", message=50, line=48)])
    with store.write() as w:
        receipt = w.erase_id("t", "a", deleted_at=700.0, reason="user request")
        assert w.erase_id("t", "nothing", deleted_at=700.0, reason="user request") is None
    assert receipt is not None
    assert receipt.ids == ("a", "top")  # the summary of S1 quoted only S1's dropped lines
    assert receipt.summaries_rewritten == ("S1",)
    assert receipt.summaries_removed == ("top",)
    s1 = store.get("t", "S1")
    assert s1.content == (
        "Summary of 2 messages\nEvents:\n- [b] bo: kafka restarted\n"
        "Decisions:\n- [c] bo: keep kafka 3.6"
    )
    assert s1.source_ids == ("b", "c")
    assert store.token_counts([rowid], "k") == {}  # counted again from the new text
    with pytest.raises(NotFound):
        store.get("t", "a")
    assert store.get("t", "b").id == "S1"
    assert store.search("t", ["4711"]) == []
    assert [m.id for m, _ in store.search("t", ["kafka"])] == ["S1"]
    a = next(t for t in store.tombstones("t") if t.id == "a")
    assert (a.summary_id, a.reason, a.deleted_at) == (None, "user request", 700.0)
    # nothing left once every cited source is erased: the summary goes, with a tombstone
    with store.write() as w:
        receipt = w.erase_id("t", "b", deleted_at=800.0, reason="gone")
        assert receipt is not None
        assert receipt.summaries_rewritten == ("S1",)
        receipt = w.erase_id("t", "c", deleted_at=800.0, reason="gone")
        assert receipt is not None
        assert receipt.summaries_removed == ("S1",)
    assert list(store.iter_memories("t")) == []
    with pytest.raises(NotFound):
        store.get("t", "S1")


def test_erasing_an_id_compacted_twice_removes_the_outer_summary(store: Store) -> None:
    with store.write() as w:
        w.insert(_memory("a", at=100.0, content="the vault code is 4711"))
        w.insert(_memory("b", at=150.0, content="kafka restarted"))
        inner = w.insert(_summary_of("S1", ["a", "b"], content="- [a] 4711\n- [b] kafka"))
        assert w.retire("t", ["a", "b"], summary_rowid=inner, deleted_at=600.0,
                        reason="compacted") == 2  # fmt: skip
        outer = w.insert(_summary_of("S2", ["S1"], content="- [S1] 4711 and kafka"))
        assert w.retire("t", ["S1"], summary_rowid=outer, deleted_at=700.0,
                        reason="compacted") == 1  # fmt: skip
    assert store.get("t", "a").id == "S2"
    with store.write() as w:
        receipt = w.erase_id("t", "a", deleted_at=800.0, reason="user request")
    assert receipt is not None
    assert receipt.ids == ("a", "S2")
    assert receipt.summaries_removed == ("S2",)
    assert store.search("t", ["4711"]) == []
    assert list(store.iter_memories("t")) == []


def test_erasing_a_session_unfolds_its_records_from_other_sessions(store: Store) -> None:
    with store.write() as w:
        a = w.insert(_memory("a", content="ci key 1111", at=1.0))
        w.add_aliases([
            Alias(tenant="t", id="b", rowid=a, status="duplicate", created_at=2.0, session="o"),
            Alias(tenant="t", id="c", rowid=a, status="duplicate", created_at=3.0, session="s"),
        ])  # fmt: skip
        w.update_aggregates(
            [AggregateUpdate(rowid=a, folded=2, last_seen_at=3.0, latest_content="ci key 2222")]
        )
        w.put_token_counts([TokenCount(rowid=a, tokenizer="k", message=5, line=4)])
    with store.write() as w:
        receipt = w.erase_session("t", "o", deleted_at=10.0, reason="session deleted")
    assert (receipt.ids, receipt.aggregates_touched, receipt.rowids) == (("b",), ("a",), ())
    kept = store.get("t", "a")
    assert (kept.dup_count, kept.latest_content) == (2, None)
    assert store.token_counts([a], "k") == {}
    assert store.get("t", "c").id == "a"  # another session's fold stays
    with pytest.raises(NotFound):
        store.get("t", "b")
    assert ("b", "session deleted") in _tombstones(store)


def test_retire_rolls_back_with_its_transaction(store: Store) -> None:
    with store.write() as w:
        w.insert(_memory("a", content="x"))
    with pytest.raises(RuntimeError), store.write() as w:
        rowid = w.insert(_summary("S", ["a"]))
        w.retire("t", ["a"], summary_rowid=rowid, deleted_at=1.0, reason="compacted")
        raise RuntimeError("crash before commit")
    assert store.get("t", "a").id == "a"
    assert store.tombstones("t") == []
    with pytest.raises(StoreError), store.write() as w:
        w.retire("t", ["a"], summary_rowid=999_999, deleted_at=1.0, reason="compacted")
    assert store.get("t", "a").id == "a"


def test_engine_compacts_on_the_store(store: Store) -> None:
    from ctxwarden.compact import CompactionPolicy

    day = 86400.0
    now = 100 * day
    engine = Engine(store, clock=lambda: now)
    engine.ingest(
        [{"id": f"m{i}", "session": "s", "channel": "c", "author": "ana",
          "content": f"decision {i}: ship release {i} on friday", "created_at": 10 * day + i}
         for i in range(6)]
        + [{"id": "new", "session": "s", "channel": "c", "author": "ana",
            "content": "fresh message", "created_at": now - 60}]
    )  # fmt: skip
    plan = engine.compact_plan(policy=CompactionPolicy())
    assert plan.memories == 6
    result = engine.compact(plan)
    assert result.compacted == 6
    assert len(result.summaries) == 1
    summary = engine.get("m0")
    assert summary.kind == "summary"
    assert set(summary.source_ids) == {f"m{i}" for i in range(6)}
    assert {t.summary_id for t in store.tombstones("default")} == {summary.id}
    assert engine.compact_plan().memories == 0  # nothing left to do
    again = engine.ingest([{"id": "m3", "session": "s", "content": "late re-send"}])
    assert again.outcomes[0].status == "known"


# -- vectors (branch ``retrieve``) -------------------------------------------------------------


def _unit(seed: int, dim: int = 384) -> np.ndarray:
    vector = np.random.default_rng(seed).standard_normal(dim).astype(np.float32)
    return vector / np.linalg.norm(vector)


def _vector_rows(store: Store) -> dict[str, int]:
    rowids = {}
    with store.write() as w:
        for i in range(6):
            rowids[f"v{i}"] = w.insert(_memory(f"v{i}", at=100.0 + i, content=f"vector {i}",
                                               session="s" if i < 4 else "s2"))  # fmt: skip
        rowids["other"] = w.insert(_memory("other", tenant="u", content="tenant u"))
    return rowids


def test_vectors_round_trip_scoped_by_tenant_and_session(store: Store) -> None:
    rowids = _vector_rows(store)
    ids = list(rowids.values())
    matrix = np.vstack([_unit(i) for i in range(len(ids))])
    assert store.put_vectors("m1", ids, matrix) == len(ids)
    found = store.vector_search("t", "m1", _unit(2), k=3)
    assert found[0][0].id == "v2"
    assert found[0][1] == pytest.approx(1.0, abs=1e-2)
    assert [s for _, s in found] == sorted((s for _, s in found), reverse=True)
    # The other tenant's memory is never returned, even when it is the nearest.
    assert "other" not in {m.id for m, _ in store.vector_search("t", "m1", _unit(6), k=10)}
    assert {m.id for m, _ in store.vector_search("t", "m1", _unit(6), k=10)} == {
        f"v{i}" for i in range(6)
    }
    assert store.vector_search("u", "m1", _unit(0), k=5)[0][0].id == "other"
    in_s2 = store.vector_search("t", "m1", _unit(0), k=10, session="s2")
    assert {m.id for m, _ in in_s2} == {"v4", "v5"}
    assert store.vector_models() == {"m1": len(ids)}


def test_author_scoped_vector_search_follows_inserts_and_deletes(store: Store) -> None:
    def add(id: str, author: str, seed: int) -> None:
        memory = dataclasses.replace(_memory(id, content=f"text {id}"), author=author)
        with store.write() as w:
            rowid = w.insert(memory)
        store.put_vectors("m1", [rowid], _unit(seed)[None, :])

    def by(author: str, seed: int) -> list[str]:
        found = store.vector_search("t", "m1", _unit(seed), k=10, author=author)
        return sorted(m.id for m, _ in found)

    add("a1", "ana", 1)
    add("b1", "bo", 2)
    assert by("ana", 1) == ["a1"]
    add("a2", "ana", 3)  # a search after an insert sees the new row
    assert by("ana", 3) == ["a1", "a2"]
    add("b2", "bo", 4)
    with store.write() as w:  # the newest rows go; a later insert may reuse their rowids
        assert w.delete("t", "a2", deleted_at=200.0, reason="test")
        assert w.delete("t", "b2", deleted_at=200.0, reason="test")
    assert by("ana", 3) == ["a1"]
    add("b3", "bo", 5)
    add("a3", "ana", 6)
    assert by("ana", 5) == ["a1", "a3"]
    assert by("bo", 6) == ["b1", "b3"]
    assert by("nobody", 1) == []


def test_vectors_of_another_model_are_never_mixed(store: Store) -> None:
    rowids = _vector_rows(store)
    store.put_vectors("m1", [rowids["v0"]], _unit(0)[None, :])
    store.put_vectors("m2", [rowids["v1"]], _unit(0)[None, :])
    assert [m.id for m, _ in store.vector_search("t", "m1", _unit(0), k=5)] == ["v0"]
    assert [m.id for m, _ in store.vector_search("t", "m2", _unit(0), k=5)] == ["v1"]
    assert store.vector_search("t", "nope", _unit(0), k=5) == []
    assert store.drop_vectors("m1") == 1
    assert store.vector_search("t", "m1", _unit(0), k=5) == []
    assert store.vector_models() == {"m2": 1}


def test_vectors_follow_deletes_and_replacements(store: Store) -> None:
    rowids = _vector_rows(store)
    ids = list(rowids.values())
    store.put_vectors("m1", ids, np.vstack([_unit(i) for i in range(len(ids))]))
    assert store.vector_search("t", "m1", _unit(3), k=1)[0][0].id == "v3"
    with store.write() as w:
        assert w.delete("t", "v3", deleted_at=200.0, reason="test")
    assert "v3" not in {m.id for m, _ in store.vector_search("t", "m1", _unit(3), k=10)}
    assert store.vector_models() == {"m1": len(ids) - 1}
    # A replaced vector answers for its new value only.
    store.put_vectors("m1", [rowids["v0"]], _unit(3)[None, :])
    assert store.vector_search("t", "m1", _unit(3), k=1)[0][0].id == "v0"
    # A vector for a memory deleted meanwhile is skipped, not an error.
    assert store.put_vectors("m1", [rowids["v3"]], _unit(3)[None, :]) == 0


def test_pending_embeddings_lists_what_a_model_lacks(store: Store) -> None:
    rowids = _vector_rows(store)
    with store.write() as w:
        tool = NewMemory(
            id="tool1", tenant="t", session="s", channel="c", author=None, author_kind="tool",
            role="tool", content="result", created_at=1.0, thread_id=None, reply_to=None,
            kind="message", pinned=False, name=None, tool_calls=(), tool_call_id="c1",
            attachments=(), metadata={}, content_hash="h-tool",
        )  # fmt: skip
        w.insert(tool)
    pending = store.pending_embeddings("m1", limit=100)
    assert [r for r, _ in pending] == sorted(rowids.values())
    assert dict(pending)[rowids["v1"]] == "vector 1"
    store.put_vectors("m1", [rowids["v0"], rowids["v1"]], np.vstack([_unit(0), _unit(1)]))
    rest = [r for r, _ in store.pending_embeddings("m1", limit=100)]
    assert rowids["v0"] not in rest
    assert rowids["v2"] in rest
    assert [r for r, _ in store.pending_embeddings("m1", after=rowids["v4"], limit=2)] == [
        rowids["v5"],
        rowids["other"],
    ]
    assert len(store.pending_embeddings("m2", limit=100)) == len(rowids)
    with pytest.raises(InputError):
        store.put_vectors("m1", [rowids["v2"]], np.vstack([_unit(0), _unit(1)]))


def test_embed_pending_batch_embeds_and_stores_in_rowid_order(store: Store) -> None:
    rowids = _vector_rows(store)
    seen: list[list[str]] = []

    def embed(texts: list[str]) -> np.ndarray:
        seen.append(texts)
        return np.vstack([_unit(len(t)) for t in texts])

    first = store.embed_pending_batch("m1", embed, limit=4)
    assert first == sorted(rowids.values())[:4]
    assert seen == [["vector 0", "vector 1", "vector 2", "vector 3"]]
    rest = store.embed_pending_batch("m1", embed, after=first[-1], limit=10)
    assert rest == sorted(rowids.values())[4:]
    assert store.embed_pending_batch("m1", embed) == []  # nothing left: embed not called
    assert len(seen) == 2
    assert store.vector_models() == {"m1": len(rowids)}
    assert store.pending_embeddings("m1") == []


def test_sqlite_vector_index_persists_and_follows_other_writers(tmp_path: Path) -> None:
    path = tmp_path / "db.sqlite"
    first = SQLiteStore(path)
    rowids = _vector_rows(first)
    ids = list(rowids.values())
    first.put_vectors("m1", ids, np.vstack([_unit(i) for i in range(len(ids))]))
    assert first.vector_search("t", "m1", _unit(1), k=1)[0][0].id == "v1"
    first.close()
    files = sorted(p.name for p in (tmp_path / "db.sqlite.vectors").iterdir())
    assert files == ["m1.idx", "m1.json"]
    second = SQLiteStore(path)
    reader = SQLiteStore(path)  # another process, in effect: its own connection and index
    assert reader.vector_search("t", "m1", _unit(1), k=1)[0][0].id == "v1"
    with second.write() as w:
        w.delete("t", "v1", deleted_at=1.0, reason="test")
    second.put_vectors("m1", [rowids["v2"]], _unit(1)[None, :])
    assert reader.vector_search("t", "m1", _unit(1), k=1)[0][0].id == "v2"
    assert "v1" not in {m.id for m, _ in reader.vector_search("t", "m1", _unit(1), k=10)}
    second.close()
    reader.close()
    # A damaged index file is rebuilt from the table.
    (tmp_path / "db.sqlite.vectors" / "m1.idx").write_bytes(b"garbage")
    third = SQLiteStore(path)
    assert third.vector_search("t", "m1", _unit(1), k=1)[0][0].id == "v2"
    third.close()


def test_sqlite_author_scope_follows_other_writers(tmp_path: Path) -> None:
    # The reader caches an author's rowids until a write could have changed them: another
    # connection's commit (PRAGMA data_version) as well as its own (total_changes).
    path = tmp_path / "db.sqlite"
    writer, reader = SQLiteStore(path), SQLiteStore(path)

    def add(store: SQLiteStore, id: str, seed: int) -> None:
        memory = dataclasses.replace(_memory(id, content=f"text {id}"), author="ana")
        with store.write() as w:
            rowid = w.insert(memory)
        store.put_vectors("m1", [rowid], _unit(seed)[None, :])

    def by_ana(seed: int) -> list[str]:
        return sorted(m.id for m, _ in reader.vector_search("t", "m1", _unit(seed), k=10,
                                                            author="ana"))  # fmt: skip

    add(writer, "a1", 1)
    assert by_ana(1) == ["a1"]
    assert by_ana(1) == ["a1"]  # served from the cache
    add(writer, "a2", 2)
    assert by_ana(2) == ["a1", "a2"]
    with writer.write() as w:
        assert w.delete("t", "a1", deleted_at=1.0, reason="test")
    assert by_ana(1) == ["a2"]
    add(reader, "a3", 3)
    assert by_ana(3) == ["a2", "a3"]
    writer.close()
    reader.close()


def test_sqlite_large_author_scope_follows_deletes_inserts_and_new_vectors(tmp_path: Path) -> None:
    # An author with >= 8,192 vectors is searched from the index's block of their int8 rows:
    # the top k must stay the exact one as another connection deletes a hit, replaces a
    # vector, and adds memories (embedded at once or later).
    path = tmp_path / "db.sqlite"
    writer, reader = SQLiteStore(path), SQLiteStore(path)
    dim, count = 16, 9_000
    rng = np.random.default_rng(31)
    vectors: dict[int, np.ndarray] = {}

    def add(ids: list[str], author: str, embed: bool = True) -> list[int]:
        with writer.write() as w:
            rows = [w.insert(dataclasses.replace(_memory(i, content=f"text {i}"), author=author))
                    for i in ids]  # fmt: skip
        if embed:
            put(rows, rng.standard_normal((len(rows), dim)).astype(np.float32))
        return rows

    def put(rows: list[int], matrix: np.ndarray) -> None:
        writer.put_vectors("m1", rows, matrix)
        # As the index holds them: stored as float16, normalised, kept as float16.
        matrix = matrix.astype(np.float16).astype(np.float32)
        matrix = (matrix / np.linalg.norm(matrix, axis=1, keepdims=True)).astype(np.float16)
        vectors.update(zip(rows, matrix, strict=True))

    ana = add([f"a{i}" for i in range(count)], "ana")
    add([f"b{i}" for i in range(500)], "bob")

    def check(query: np.ndarray, k: int = 10) -> list[int]:
        found = [m.rowid for m, _ in reader.vector_search("t", "m1", query, k=k, author="ana")]
        live = np.asarray([r for r in ana if r in vectors], dtype=np.int64)
        stored = np.vstack([vectors[r] for r in live.tolist()]).astype(np.float32)
        scores = stored @ (query / np.linalg.norm(query))
        assert found == [int(live[i]) for i in np.lexsort((live, -scores))[:k]]
        return found

    query = rng.standard_normal(dim).astype(np.float32)
    best = check(query)
    assert ("author", "t", "ana") in reader._vectors._entries["m1"].index._blocks
    with writer.write() as w:
        assert w.delete("t", f"a{ana.index(best[0])}", deleted_at=1.0, reason="test")
    del vectors[best[0]]
    ana.remove(best[0])
    put([best[1]], -query[None, :])  # replaced: now the farthest
    found = check(query)
    assert best[0] not in found
    assert best[1] not in found
    late = add([f"n{i}" for i in range(50)], "ana", embed=False)  # no vectors yet
    ana.extend(late)
    check(query)
    put(late, np.vstack([query + 0.01 * rng.standard_normal(dim).astype(np.float32)
                         for _ in late]))  # fmt: skip
    assert set(check(query)) <= set(late)
    writer.close()
    reader.close()


# -- semantic de-dup: Writer.merge, memories_at, vector_window ----------------------------------


def test_merge_folds_a_stored_memory_into_another(store: Store) -> None:
    with store.write() as w:
        y = w.insert(_memory("y", content="can someone review my PR", at=100.0))
        x = w.insert(_memory("x", content="could someone review my PR zzqmergecanary", at=150.0))
        other = w.insert(_memory("o", tenant="u", content="tenant u", at=120.0))
        w.add_aliases(
            [
                Alias(tenant="t", id="x-again", rowid=x, status="duplicate", created_at=160.0),
                Alias(tenant="t", id="y-again", rowid=y, status="duplicate", created_at=110.0),
            ]
        )
        w.update_aggregates(
            [
                AggregateUpdate(rowid=x, folded=1, last_seen_at=160.0, latest_content=None),
                AggregateUpdate(rowid=y, folded=1, last_seen_at=110.0, latest_content=None),
            ]
        )
        w.put_token_counts([TokenCount(rowid=x, tokenizer="cl100k", message=9, line=8)])
    store.put_vectors("m1", [y, x, other], np.vstack([_unit(1), _unit(1), _unit(1)]))
    store.log_context(
        ContextLog(
            id="ctx1", tenant="t", session="s", created_at=140.0, model="m", tokenizer="cl100k",
            exact=True, cap=100, tokens=20, blocks={},
            inclusions=[Inclusion(rowid=x, id="x", block="recent", tokens=9),
                        Inclusion(rowid=y, id="y", block="recent", tokens=7)],
        )
    )  # fmt: skip
    before = store.get("t", "y")
    with store.write() as w:
        assert not w.merge("t", "x", into="x", merged_at=200.0, status="s", latest_content=None)
        assert not w.merge("t", "x", into="o", merged_at=200.0, status="s", latest_content=None)
        assert not w.merge("t", "nope", into="y", merged_at=200.0, status="s", latest_content=None)
        assert w.merge(
            "t", "x", into="y", merged_at=200.0, status="semantic_duplicate", latest_content="new"
        )
    merged = store.get("t", "x")
    assert merged.id == "y"
    assert merged.dup_count == 4  # 2 (y and y-again) + 2 (x and x-again)
    assert merged.last_seen_at == 160.0
    assert merged.latest_content == "new"  # x was seen last: the caller's choice applies
    assert merged.access_count == before.access_count + 1
    assert merged.included_tokens_total == 16
    assert merged.access_score == pytest.approx(2.0)
    assert store.get("t", "x-again").id == "y"
    with store.write() as w:
        assert w.resolve("t", "x") == "y"
        assert w.resolve_many("t", ["x", "x-again", "y-again"]) == {
            "x": "y", "x-again": "y", "y-again": "y"
        }  # fmt: skip
    # x's text has left every index: full text, vectors, token counts, the memory list.
    assert store.search("t", ["zzqmergecanary"]) == []
    assert store.token_counts([x], "cl100k") == {}
    assert {m.id for m, _ in store.vector_search("t", "m1", _unit(1), k=10)} == {"y"}
    assert [m.id for m in store.iter_memories("t")] == ["y"]
    assert store.memories_at([x, y, other]) == [store.get("t", "y"), store.get("u", "o")]
    stats = store.stats("t")
    assert (stats["memories"], stats["seen"], stats["exact"], stats["semantic"]) == (1, 4, 2, 1)
    assert stats["channels"]["c"]["semantic"] == 1
    # An older member merged in does not move latest_content.
    with store.write() as w:
        w.insert(_memory("z", content="review my PR?", at=90.0))
        assert w.merge("t", "z", into="y", merged_at=210.0, status="semantic_duplicate",
                       latest_content="older")  # fmt: skip
    assert store.get("t", "z").latest_content == "new"
    assert store.get("t", "z").dup_count == 5


def test_merge_rolls_back_with_its_transaction(store: Store) -> None:
    with store.write() as w:
        w.insert(_memory("y", content="one", at=100.0))
        w.insert(_memory("x", content="two", at=150.0))
    with pytest.raises(RuntimeError), store.write() as w:
        assert w.merge("t", "x", into="y", merged_at=200.0, status="s", latest_content=None)
        raise RuntimeError("boom")
    assert store.get("t", "x").id == "x"
    assert store.get("t", "y").dup_count == 1


def test_vector_window_scopes_by_tenant_channel_author_and_time(store: Store) -> None:
    with store.write() as w:
        rows = {
            "a": w.insert(_memory("a", content="a", at=100.0)),
            "b": w.insert(_memory("b", content="b", at=200.0)),
            "c": w.insert(_memory("c", content="c", at=300.0)),
            "n": w.insert(_memory("n", content="n", at=250.0, channel=None)),
            "other-channel": w.insert(_memory("oc", content="oc", at=250.0, channel="d")),
            "other-tenant": w.insert(_memory("ot", tenant="u", content="ot", at=250.0)),
            "summary": w.insert(_memory("sm", content="sm", at=250.0, kind="summary")),
            "unembedded": w.insert(_memory("ue", content="ue", at=250.0)),
        }
    embedded = [r for k, r in rows.items() if k != "unembedded"]
    store.put_vectors("m1", embedded, np.vstack([_unit(i) for i in range(len(embedded))]))
    window = store.vector_window(
        "t", "m1", channel="c", author="ana", seen_since=150.0, created_until=300.0
    )
    assert [m.id for m, _ in window] == ["b", "c"]
    assert float(window[0][1] @ _unit(1)) == pytest.approx(1.0, abs=1e-2)
    assert [m.id for m, _ in store.vector_window(
        "t", "m1", channel=None, author="ana", seen_since=-math.inf, created_until=math.inf
    )] == ["n"]  # fmt: skip
    assert (
        store.vector_window("t", "m1", channel="c", author="bob", seen_since=0.0, created_until=1e9)
        == []
    )
    assert (
        store.vector_window("t", "m2", channel="c", author="ana", seen_since=0.0, created_until=1e9)
        == []
    )


def test_neighbours_turns_replies_threads_and_tenants(store: Store) -> None:
    def add(id: str, at: float, *, channel: str | None = "c", tenant: str = "t",
            thread: str | None = None, reply: str | None = None,
            kind: str = "message") -> None:  # fmt: skip
        memory = dataclasses.replace(_memory(id, tenant=tenant, content=f"text {id}", at=at,
                                             channel=channel, kind=kind),
                                     thread_id=thread, reply_to=reply)  # fmt: skip
        with store.write() as w:
            w.insert(memory)

    for i in range(6):  # the channel's turns c0..c5
        add(f"c{i}", 100.0 + i)
    add("elsewhere", 102.5, channel="d")  # another channel: never a turn of c
    add("fact", 102.6, kind="fact")  # not a message: never a turn
    add("c2-foreign", 102.5, tenant="u")  # another tenant: never returned
    add("r1", 110.0, reply="c2")
    add("r2", 111.0, reply="c2")
    add("r3", 112.0, reply="r1")
    add("t0", 120.0)  # a thread's root (starts the thread, thread_id unset)
    for i in range(1, 5):
        add(f"t{i}", 120.0 + i, thread="t0")
    add("n0", 130.0, channel=None)
    add("n1", 131.0, channel=None)
    c2, r1, t2, t0, n0 = (store.get("t", i) for i in ("c2", "r1", "t2", "t0", "n0"))

    links = store.neighbours("t", [c2, r1, t2, t0, n0], turns=2, replies=3)
    got: dict[tuple[int, str], list[str]] = {}
    for link in links:
        got.setdefault((link.anchor, link.relation), []).append(link.memory.id)
    got = {key: sorted(ids) for key, ids in got.items()}
    assert got[(0, "before")] == ["c0", "c1"]
    assert got[(0, "after")] == ["c3", "c4"]
    assert got[(0, "reply")] == ["r1", "r2"]
    assert got[(1, "parent")] == ["c2"]
    assert got[(1, "sibling")] == ["r2"]
    assert got[(1, "reply")] == ["r3"]
    assert got[(2, "before")] == ["t1"]  # a thread reply's turns are its thread's
    assert got[(2, "after")] == ["t3", "t4"]
    assert got[(2, "root")] == ["t0"]
    assert got[(3, "reply")] == ["t1", "t2", "t3"]  # at most `replies`, oldest first
    assert got[(4, "after")] == ["n1"]  # no channel: the session's messages without one
    assert (4, "before") not in got
    every = {link.memory.id for link in links}
    assert not every & {"elsewhere", "fact", "c2-foreign"}
    assert store.neighbours("t", []) == []
    many = store.neighbours("t", [c2] * 45 + [r1], turns=1, replies=0)  # several statements
    assert {(link.anchor, link.relation, link.memory.id) for link in many} >= {
        (44, "after", "c3"), (45, "parent", "c2")
    }  # fmt: skip
    assert {link.memory.id for link in store.neighbours("u", [c2])} == {"c2-foreign"}


def test_neighbours_follow_a_folded_parent(store: Store) -> None:
    with store.write() as w:
        w.insert(_memory("keep", content="the aggregate", at=100.0))
    keep = store.get("t", "keep")
    with store.write() as w:
        w.add_aliases([Alias(tenant="t", id="folded", rowid=keep.rowid,
                             status="duplicate", created_at=101.0)])  # fmt: skip
        w.insert(dataclasses.replace(_memory("child", content="a reply", at=102.0),
                                     reply_to="folded"))  # fmt: skip
    child = store.get("t", "child")
    links = store.neighbours("t", [child], turns=0)
    assert [(link.relation, link.memory.id) for link in links] == [("parent", "keep")]


def _reference(
    rows: list[dict[str, object]], scope: str, pairs: set[tuple[str | None, str]], key: str,
    since: float, limit: int | None = None,
) -> set[str]:  # fmt: skip
    """What ``find_targets`` must return, computed from the rows themselves."""
    hits = [
        r for r in rows
        if (r[scope], r[key]) in pairs and float(r["seen"]) >= since  # type: ignore[arg-type]
    ]  # fmt: skip
    if limit is None:
        return {str(r["id"]) for r in hits}
    kept: set[str] = set()
    for pair in pairs:
        group = [r for r in hits if (r[scope], r[key]) == pair]
        group.sort(key=lambda r: (r["seen"], r["rowid"]), reverse=True)  # type: ignore[return-value]
        kept |= {str(r["id"]) for r in group[:limit]}
    return kept


def test_find_targets_few_and_many_keys_find_the_same(store: Store) -> None:
    """Whatever the number of keys (a one-record ingest seeks them, a large batch scans the
    window), every message of the scope last seen at or after ``since`` is found: at the
    window's edge, in the bucket of the edge, moved into the window by a fold, seen after the
    newest record, in a NULL channel, by session, by near key (newest ``near_limit`` kept)."""
    import random

    rng = random.Random(3)
    base = 1_800_000_000.0
    rows: list[dict[str, object]] = []
    with store.write() as w:
        for i in range(1000):
            channel = rng.choice(["c", "d", None])
            session = rng.choice(["s1", "s2"])
            # Anywhere in 2.5 hours, or on the window's edge (base - 3600) and its bucket.
            edge = rng.choice([-3600.0, -3600.5, -3599.5, -3300.0, -3900.0, 0.0])
            at = base + (rng.uniform(-9000, 600) if rng.random() < 0.7 else edge)
            near = f"n{rng.randrange(12)}" if rng.random() < 0.7 else None
            memory = _memory(f"m{i}", content=f"k{rng.randrange(40)}", at=at, session=session,
                             channel=channel, near_key=near)  # fmt: skip
            rowid = w.insert(memory)
            rows.append({"id": memory.id, "rowid": rowid, "channel": channel, "session": session,
                         "hash": memory.content_hash, "near": near, "seen": at})  # fmt: skip
        # Folds move old messages' last_seen_at into the window (and one far past the newest).
        moved = rng.sample(rows, 30)
        w.update_aggregates(
            [
                AggregateUpdate(rowid=int(r["rowid"]), folded=1,  # type: ignore[call-overload]
                                last_seen_at=base + (90_000.0 if n == 0 else rng.uniform(-3000, 0)),
                                latest_content=None)
                for n, r in enumerate(moved)
            ]
        )  # fmt: skip
    for r in moved:
        r["seen"] = store.get("t", str(r["id"])).last_seen_at
    since = base - 3600.0
    statements: list[str] = []
    if isinstance(store, SQLiteStore):  # both plans must run: seeks for few keys, else a scan
        store._conn.set_trace_callback(statements.append)
    hashes = sorted({str(r["hash"]) for r in rows})
    nears = sorted({str(r["near"]) for r in rows if r["near"] is not None})
    with store.write() as w:
        for scope in ("channel", "session"):
            values: list[str | None] = ["c", "d", None] if scope == "channel" else ["s1", "s2"]
            every = {(v, h) for v in values for h in hashes}
            found = _targets(w, exact_scope=scope, exact=sorted(every, key=str), exact_since=since)
            assert set(found) == _reference(rows, scope, every, "hash", since)
            for pair in sorted(every, key=str)[::7]:
                found = _targets(w, exact_scope=scope, exact=[pair], exact_since=since)
                assert set(found) == _reference(rows, scope, {pair}, "hash", since), pair
        every = {(v, k) for v in ["c", "d", None] for k in nears}
        for limit in (None, 2):
            found = _targets(w, near=sorted(every, key=str), near_since=since, near_limit=limit)
            assert set(found) == _reference(rows, "channel", every, "near", since, limit)
            for pair in sorted(every, key=str):
                found = _targets(w, near=[pair], near_since=since, near_limit=limit)
                assert set(found) == _reference(rows, "channel", {pair}, "near", since, limit)
        # A window that holds nothing of the scope, and one past every message.
        assert _targets(w, exact=[("c", hashes[0])], exact_since=base + 10**6) == []
        assert _targets(w, near=[(None, nears[0])], near_since=base + 10**6) == []
    if isinstance(store, SQLiteStore):
        store._conn.set_trace_callback(None)
        assert any("CROSS JOIN memories AS m" in sql for sql in statements)
        assert any("AS INTEGER) >= " in sql for sql in statements)


def test_ingest_one_at_a_time_decides_as_one_batch(store: Store) -> None:
    """The same stream ingested record by record, three at a time and as one batch: the same
    outcomes (folds at the window's edge, a NULL channel, across sessions, near keys, a fold
    that keeps an old aggregate in the window)."""
    import random

    rng = random.Random(8)
    base = 1_800_000_000.0
    stream: list[dict[str, object]] = []
    at = base
    for i in range(160):
        at += rng.choice([1.0, 30.0, 299.0, 300.0, 900.0, 3599.0, 3600.0, 3601.0])
        roll = rng.random()
        record: dict[str, object] = {
            "id": f"r{i}", "session": rng.choice(["s1", "s2"]), "role": "user",
            "channel": rng.choice(["general", None]), "created_at": at,
        }  # fmt: skip
        if roll < 0.4:
            record |= {"author": "ana", "content": rng.choice(["lunch?", "ship it", "ok"])}
        elif roll < 0.7:
            record |= {"author": "deploybot", "author_kind": "bot",
                       "content": f"Deploy #{rng.randrange(1000)} of api ok at "
                                  f"{rng.randrange(24):02d}:{rng.randrange(60):02d}"}  # fmt: skip
        else:
            record |= {"author": rng.choice(["ana", "bo"]),
                       "content": f"note {rng.randrange(10**6)} about the plan"}  # fmt: skip
        stream.append(record)

    def outcomes(size: int) -> list[tuple[str, str, str | None]]:
        if isinstance(store, SQLiteStore):
            target: Store = SQLiteStore(":memory:")
        else:  # a fresh tenant of the same PostgreSQL schema
            target = store
        tenant = f"t{size}"
        engine = Engine(target, clock=lambda: base)
        out = []
        for start in range(0, len(stream), size):
            result = engine.ingest(stream[start : start + size], tenant=tenant)
            out += [(o.id, o.status, o.duplicate_of) for o in result.outcomes]
        return out

    single = outcomes(1)
    statuses = {status for _, status, _ in single}
    assert {"stored", "duplicate", "near_duplicate"} <= statuses
    assert outcomes(3) == single
    assert outcomes(len(stream)) == single


def test_log_contexts_writes_a_list_in_one_transaction(store: Store) -> None:
    with store.write() as w:
        a = w.insert(_memory("a", content="one"))
        b = w.insert(_memory("b", content="two"))

    def entry(id: str, at: float, *included: tuple[int, str, int]) -> ContextLog:
        return ContextLog(
            id=id, tenant="t", session="s", created_at=at, model="m", tokenizer="x", exact=True,
            cap=100, tokens=sum(t for _, _, t in included), blocks={"recent": {"used": 1}},
            inclusions=[Inclusion(rowid=r, id=i, block="recent", tokens=t)
                        for r, i, t in included],
        )  # fmt: skip

    store.log_contexts([])
    # the same rows as one log_context per entry, in order (b twice: its bumps add up)
    store.log_contexts(
        [entry("c1", 200.0, (a, "a", 3), (b, "b", 4)), entry("c2", 300.0, (b, "b", 5))]
    )
    assert store.inclusions("c1") == [
        {"memory_id": "a", "block": "recent", "tokens": 3},
        {"memory_id": "b", "block": "recent", "tokens": 4},
    ]
    assert store.inclusions("c2") == [{"memory_id": "b", "block": "recent", "tokens": 5}]
    got = store.get("t", "b")
    assert (got.access_count, got.included_tokens_total, got.last_accessed_at) == (2, 9, 300.0)
    assert got.access_score == pytest.approx(1.0 + math.exp(-100.0 / ACCESS_TAU_SECONDS))
    assert store.stats("t")["contexts"] == 2
    # all or nothing: a duplicate context id rolls back the entry before it too
    with pytest.raises(INTEGRITY_ERRORS):
        store.log_contexts([entry("c3", 400.0, (a, "a", 1)), entry("c1", 400.0, (a, "a", 1))])
    assert store.inclusions("c3") == []
    assert store.get("t", "a").access_count == 1
    assert store.stats("t")["contexts"] == 2
