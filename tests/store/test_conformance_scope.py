"""The store's read scopes on every backend: the end-user field round-trips, and every scoped
read (search, vector search, neighbours, pinned, summaries, stats, history) filters in the query,
returning the scope's best ``limit`` even when other scopes hold many better matches.

Runs on SQLite and PostgreSQL (the ``store`` fixture); the migration test on both as well.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import numpy as np
import pytest

from ctxwarden.scope import ReadScope
from ctxwarden.store.base import NewMemory, Store
from ctxwarden.store.reads import memory_row
from ctxwarden.store.sqlite import SQLiteStore


def _memory(id: str, *, user: str | None, session: str = "s", content: str = "hello",
            at: float = 100.0, tenant: str = "t", kind: str = "message",
            channel: str | None = None, thread_id: str | None = None) -> NewMemory:  # fmt: skip
    return NewMemory(
        id=id, tenant=tenant, session=session, channel=channel, author="ana",
        author_kind="human", role="user", content=content, created_at=at, thread_id=thread_id,
        reply_to=None, kind=kind, pinned=False, name=None, tool_calls=(), tool_call_id=None,
        attachments=(), metadata={}, content_hash=f"h-{id}", user=user,
    )  # fmt: skip


SESSION_A = ReadScope(kind="session", session="a", user="alice")
USER_ALICE = ReadScope(kind="user", user="alice")


def test_the_end_user_round_trips_on_every_insert_path(store: Store) -> None:
    with store.write() as w:
        w.insert(_memory("full", user="alice"))
        w.insert(_memory("none", user=None))
        # the plain-row path (no thread, tool call, ...) and the full-row path
        w.insert_row_or_fold(memory_row(None, _memory("plain", user="bob"))[1:])
        w.insert_row_or_fold(
            memory_row(None, _memory("threaded", user="carol", thread_id="th"))[1:]
        )
    assert store.get("t", "full").user == "alice"
    assert store.get("t", "none").user is None
    assert store.get("t", "plain").user == "bob"
    assert store.get("t", "threaded").user == "carol"
    assert store.get("t", "full").to_dict()["user"] == "alice"


def test_scoped_search_returns_the_scopes_best_however_busy_the_tenant(store: Store) -> None:
    with store.write() as w:
        # 400 better matches in bob's session, newer than alice's (the newest-budget bound of
        # an unscoped search would hold none of alice's)
        for i in range(400):
            w.insert(_memory(f"b{i}", user="bob", session="b", at=1000.0 + i,
                             content="alpha alpha alpha beta"))  # fmt: skip
        for i in range(7):
            w.insert(_memory(f"a{i}", user="alice", session="a" if i < 5 else "a2",
                             at=10.0 + i, content=f"alpha note {i}"))  # fmt: skip
    found = store.search("t", ["alpha"], limit=5, scope=SESSION_A)
    assert sorted(m.id for m, _ in found) == [f"a{i}" for i in range(5)]
    found = store.search("t", ["alpha"], limit=50, scope=SESSION_A)
    assert len(found) == 5
    found = store.search("t", ["alpha"], limit=50, scope=USER_ALICE)
    assert sorted(m.id for m, _ in found) == [f"a{i}" for i in range(7)]
    assert len(store.search("t", ["alpha"], limit=3, scope=USER_ALICE)) == 3
    # the tenant: everyone's, best first
    assert len(store.search("t", ["alpha"], limit=50)) == 50
    assert store.search("t", ["alpha"], scope=ReadScope(kind="user", user="nobody")) == []


def _unit(seed: int, dim: int = 384) -> np.ndarray:
    vector = np.random.default_rng(seed).standard_normal(dim).astype(np.float32)
    return vector / np.linalg.norm(vector)


def test_scoped_vector_search_returns_k_of_the_scope(store: Store) -> None:
    # 300 of bob's vectors sit right next to the query; alice's 7 are far from it. An index
    # search filtered afterwards would find none of alice's in its first candidates.
    query = _unit(0)
    rowids: list[int] = []
    vectors = []
    with store.write() as w:
        for i in range(300):
            rowids.append(w.insert(_memory(f"b{i}", user="bob", session="b", at=float(i))))
            noise = _unit(1000 + i) * 0.05
            vectors.append((query + noise) / np.linalg.norm(query + noise))
        for i in range(7):
            session = "a" if i < 5 else "a2"
            rowids.append(w.insert(_memory(f"a{i}", user="alice", session=session, at=500.0 + i)))
            vectors.append(_unit(50 + i))
    assert store.put_vectors("m1", rowids, np.vstack(vectors).astype(np.float32)) == 307
    found = store.vector_search("t", "m1", query, k=5, scope=USER_ALICE)
    assert len(found) == 5
    assert {m.user for m, _ in found} == {"alice"}
    found = store.vector_search("t", "m1", query, k=50, scope=USER_ALICE)
    assert sorted(m.id for m, _ in found) == [f"a{i}" for i in range(7)]
    scores = [s for _, s in found]
    assert scores == sorted(scores, reverse=True)
    found = store.vector_search("t", "m1", query, k=50, scope=SESSION_A)
    assert sorted(m.id for m, _ in found) == [f"a{i}" for i in range(5)]
    both = store.vector_search("t", "m1", query, k=50, scope=SESSION_A, author="ana")
    assert sorted(m.id for m, _ in both) == [f"a{i}" for i in range(5)]
    assert {m.user for m, _ in store.vector_search("t", "m1", query, k=5)} == {"bob"}


def test_vector_nearest_is_vector_search_without_the_memories(store: Store) -> None:
    # The same (rowid, cosine) pairs in the same order, for every scope, author and k: retrieval
    # reads the memories of the first few and keeps the cosines of the rest.
    rowids: list[int] = []
    with store.write() as w:
        for i in range(60):
            user = ("alice", "bob", None)[i % 3]
            session = "a" if i % 2 else "b"
            rowids.append(w.insert(_memory(f"m{i}", user=user, session=session, at=float(i))))
        rowids.append(w.insert(_memory("other", user="alice", session="a", tenant="u")))
    vectors = np.vstack([_unit(7 + i) for i in range(len(rowids))]).astype(np.float32)
    vectors[5] = vectors[6]  # a tie: broken by rowid on both sides
    assert store.put_vectors("m1", rowids, vectors) == len(rowids)
    for seed in (0, 6 + 7):
        query = _unit(seed)
        for scope in (None, SESSION_A, USER_ALICE):
            for author in (None, "ana", "nobody"):
                for k in (1, 5, 60, 100):
                    found = store.vector_search("t", "m1", query, k=k, author=author, scope=scope)
                    nearest = store.vector_nearest(
                        "t", "m1", query, k=k, author=author, scope=scope
                    )
                    assert nearest == [(m.rowid, cosine) for m, cosine in found]
                    assert all(isinstance(r, int) for r, _ in nearest)
    assert store.vector_nearest("u", "m1", _unit(0), k=5) == [(rowids[-1], pytest.approx(
        store.vector_search("u", "m1", _unit(0), k=5)[0][1]))]  # fmt: skip
    assert store.vector_nearest("t", "m2", _unit(0), k=5) == []
    assert store.vector_nearest("t", "m1", _unit(0), k=0) == []


def test_pins_show_where_they_were_pinned_for(store: Store) -> None:
    with store.write() as w:
        w.insert(_memory("own", user="alice", session="a"))
        w.insert(_memory("mine", user="alice", session="a"))
        w.insert(_memory("team", user="bob", session="b"))
        w.insert(_memory("fact", user="bob", session="b", kind="fact"))
        assert w.set_pinned("t", "own", True)  # its session
        assert w.set_pinned("t", "mine", True, scope="user")
        assert w.set_pinned("t", "team", True, scope="tenant")

    def ids(scope: ReadScope | None) -> set[str]:
        return {m.id for m in store.pinned("t", scope=scope)}

    assert ids(SESSION_A) == {"own", "mine", "team"}
    assert ids(ReadScope(kind="session", session="a2", user="alice")) == {"mine", "team"}
    assert ids(USER_ALICE) == {"own", "mine", "team"}
    assert ids(ReadScope(kind="session", session="b", user="bob")) == {"team", "fact"}
    assert ids(ReadScope(kind="user", user="carol")) == {"team"}
    assert ids(None) == {"own", "mine", "team", "fact"}
    with store.write() as w:
        w.set_pinned("t", "team", False)
        w.set_pinned("t", "team", True)  # pinned again: its own session, not the tenant
    assert ids(USER_ALICE) == {"own", "mine"}


def test_summaries_stats_history_and_neighbours_follow_the_scope(store: Store) -> None:
    with store.write() as w:
        w.insert(_memory("sa", user="alice", session="a", kind="summary", content="sum a"))
        w.insert(_memory("sb", user="bob", session="b", kind="summary", content="sum b"))
        for i in range(3):
            w.insert(_memory(f"a{i}", user="alice", session="a", at=10.0 + i, channel="c",
                             thread_id="th"))  # fmt: skip
            w.insert(_memory(f"b{i}", user="bob", session="a", at=10.5 + i, channel="c",
                             thread_id="th"))  # fmt: skip
    assert [m.id for m in store.summaries("t", scope=SESSION_A)] == ["sa"]
    assert [m.id for m in store.summaries("t", scope=ReadScope("user", user="bob"))] == ["sb"]
    assert [m.id for m in store.summaries("t")] == ["sa", "sb"]
    assert store.stats("t", scope=USER_ALICE)["memories"] == 4
    assert store.stats("t", scope=ReadScope("session", session="a"))["memories"] == 7
    assert store.stats("t")["memories"] == 8
    # one session shared by two users: each user's history is their own
    assert [m.id for m in store.recent("t", "a", user="alice")] == ["a2", "a1", "a0"]
    assert len(store.recent("t", "a")) == 6
    # a thread shared by both: the neighbours of alice's message are alice's only
    anchor = store.get("t", "a1")
    links = store.neighbours("t", [anchor], scope=SESSION_A)
    assert links
    assert {link.memory.user for link in links} == {"alice"}
    assert {link.memory.user for link in store.neighbours("t", [anchor])} == {"alice", "bob"}


@pytest.mark.parametrize(
    "backend", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
)
def test_end_user_migration_keeps_old_pins_tenant_wide(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    insert = (
        "INSERT INTO memories (id, tenant, session, author_kind, role, content, created_at, "
        "kind, content_hash, last_seen_at, pinned) VALUES "
        "('pin', 't', 's', 'human', 'user', 'old pin', 10.0, 'message', 'h1', 10.0, {true}), "
        "('msg', 't', 's', 'human', 'user', 'old message', 20.0, 'message', 'h2', 20.0, {false}), "
        "('bot', 't', 's', 'agent', 'assistant', 'old reply', 30.0, 'message', 'h3', 30.0, "
        "{false})"
    )
    opened: Store
    if backend == "sqlite":
        from ctxwarden.store import migrations

        conn = sqlite3.connect(tmp_path / "v10.db", isolation_level=None)
        conn.execute("PRAGMA foreign_keys = ON")
        for migration in migrations.MIGRATIONS[:10]:
            for statement in migration.statements:
                conn.execute(statement)
        conn.execute("PRAGMA user_version = 10")
        conn.execute(insert.format(true=1, false=0))
        conn.close()
        opened = SQLiteStore(tmp_path / "v10.db")
    else:
        import psycopg

        from ctxwarden.store import pg_migrations
        from ctxwarden.store.postgres import PostgresStore

        dsn = request.getfixturevalue("pg_schema_dsn")
        with psycopg.connect(dsn, autocommit=True) as pg:
            assert pg_migrations.apply(pg, below=10)[-1].version == 9
            pg.execute(insert.format(true="true", false="false"))
        opened = PostgresStore(dsn)
    try:
        assert opened.get("t", "msg").user is None
        # an agent's old turn is no fold target any more; a person's message still is
        assert opened.get("t", "bot").content_hash == "~h3"
        assert opened.get("t", "msg").content_hash == "h2"
        elsewhere = ReadScope(kind="session", session="other", user="someone")
        assert [m.id for m in opened.pinned("t", scope=elsewhere)] == ["pin"]
        assert opened.stats("t", scope=USER_ALICE)["memories"] == 0
    finally:
        opened.close()
