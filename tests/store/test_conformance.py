"""One suite, every backend: the Store protocol's behaviour, run unchanged on SQLite and PostgreSQL.

The ``store`` fixture yields a fresh ``SQLiteStore(":memory:")`` and, when a server is reachable
(see ``pg_dsn`` in tests/conftest.py), a ``PostgresStore`` in a fresh schema.
"""

from __future__ import annotations

import math
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from ctxwarden.engine import Engine
from ctxwarden.errors import InputError, NotFound, StoreError
from ctxwarden.store.base import ContextLog, Inclusion, NewMemory, Store, TokenCount, Writer
from ctxwarden.store.sqlite import ACCESS_TAU_SECONDS, SQLiteStore

INTEGRITY_ERRORS: tuple[type[Exception], ...] = (sqlite3.IntegrityError, StoreError)
try:
    import psycopg

    INTEGRITY_ERRORS += (psycopg.IntegrityError,)
except ImportError:  # pragma: no cover - without the postgres extra only SQLite runs
    pass


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store(request: pytest.FixtureRequest) -> Iterator[Store]:
    if request.param == "sqlite":
        backend: Store = SQLiteStore(":memory:")
    else:
        from ctxwarden.store.postgres import PostgresStore

        backend = PostgresStore(request.getfixturevalue("pg_schema_dsn"))
    yield backend
    backend.close()


def _memory(id: str, *, tenant: str = "t", content: str = "hello", at: float = 100.0,
            session: str = "s", channel: str | None = "c", kind: str = "message",
            pinned: bool = False) -> NewMemory:  # fmt: skip
    return NewMemory(
        id=id, tenant=tenant, session=session, channel=channel, author="ana",
        author_kind="human", role="user", content=content, created_at=at, thread_id=None,
        reply_to=None, kind=kind, pinned=pinned, name=None, tool_calls=(),
        tool_call_id=None, attachments=(), metadata={}, content_hash=f"h-{content}",
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


def test_fold_counts_and_aliases(store: Store) -> None:
    with store.write() as w:
        rowid = w.insert(_memory("a", content="spam"))
        assert w.find_exact("t", "c", "h-spam", since=0) == (rowid, "a")
        assert w.find_exact("t", "other", "h-spam", since=0) is None
        assert w.find_exact("t", "c", "h-spam", since=101) is None  # outside the TTL
        w.fold(rowid, alias="b", status="duplicate", seen_at=150.0)
        assert w.resolve("t", "b") == "a"
        assert w.resolve("t", "zzz") is None
    memory = store.get("t", "b")
    assert (memory.id, memory.dup_count, memory.last_seen_at) == ("a", 2, 150.0)
    stats = store.stats("t")
    assert stats["channels"]["c"] == {"memories": 1, "seen": 2, "folded": 1}
    assert stats["top_families"][0]["count"] == 2
    assert (stats["memories"], stats["seen"], stats["folded"]) == (1, 2, 1)


def test_find_exact_with_no_channel(store: Store) -> None:
    with store.write() as w:
        rowid = w.insert(_memory("a", content="dm", channel=None))
        assert w.find_exact("t", None, "h-dm", since=0) == (rowid, "a")
        assert w.find_exact("t", "c", "h-dm", since=0) is None


def test_insert_or_fold(store: Store) -> None:
    with store.write() as w:
        status, rowid, id_ = w.insert_or_fold(_memory("a", content="hi", at=100.0), since=50.0)
        assert (status, id_) == ("stored", "a")
        assert w.insert_or_fold(_memory("b", content="hi", at=110.0), since=60.0) == (
            "duplicate", rowid, "a",
        )  # fmt: skip
        assert w.insert_or_fold(_memory("a", content="hi"), since=60.0)[0] == "known"
        assert w.insert_or_fold(_memory("b", content="hi"), since=60.0) == ("known", rowid, "a")
        # Outside the window: a new memory. Another channel: a new memory. No window: new.
        assert w.insert_or_fold(_memory("c", content="hi", at=500.0), since=400.0)[0] == "stored"
        assert (
            w.insert_or_fold(_memory("d", content="hi", channel="x", at=500.0), since=0.0)[0]
            == "stored"
        )
        assert w.insert_or_fold(_memory("e", content="hi", at=500.0), since=None)[0] == "stored"
    assert store.get("t", "b").dup_count == 2
    assert store.get("t", "c").dup_count == 1
    assert (store.stats("t")["memories"], store.stats("t")["seen"]) == (4, 5)


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
    assert [o.status for o in result.outcomes] == ["stored", "duplicate", "known", "stored"]
    assert result.outcomes[1].duplicate_of == "1"
    assert engine.get("2").dup_count == 2
    context = engine.assemble(session="s", query="friday")
    assert context.tokens > 0
    assert engine.stats()["contexts"] == 1
    assert engine.get("1").access_count == 1


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
