"""PostgreSQL-only behaviour: migrations, vectors, cascades, missing-extra error, concurrency."""

from __future__ import annotations

import multiprocessing
import sys
from collections import Counter

import pytest

from ctxwarden.engine import Engine, EngineConfig
from ctxwarden.errors import ConfigError
from ctxwarden.store.base import Alias, NewMemory, TokenCount

pytestmark = pytest.mark.postgres


def _memory(id: str, content: str) -> NewMemory:
    return NewMemory(
        id=id, tenant="t", session="s", channel="c", author="ana", author_kind="human",
        role="user", content=content, created_at=1.0, thread_id=None, reply_to=None,
        kind="message", pinned=False, name=None, tool_calls=(), tool_call_id=None,
        attachments=(), metadata={}, content_hash=f"h-{content}",
    )  # fmt: skip


def test_missing_extra_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, "ctxwarden.store.postgres", raising=False)
    monkeypatch.setitem(sys.modules, "psycopg", None)  # as if the extra were not installed
    with pytest.raises(ConfigError, match=r"pip install 'ctxwarden\[postgres\]'"):
        Engine.open("postgresql://nobody@127.0.0.1:1/none")


def test_migrations_plan_apply_and_vectors(pg_schema_dsn: str) -> None:
    import psycopg

    from ctxwarden.store import pg_migrations
    from ctxwarden.store.postgres import PostgresStore

    with psycopg.connect(pg_schema_dsn, autocommit=True) as conn:
        assert [m.name for m in pg_migrations.plan(conn)] == [
            "initial",
            "vectors",
            "dedupe",
            "compaction",
            "pg_api_keys",
            "retrieve_author_index",
            "neighbour_indexes",
            "access_stats",
            "inclusions_unindexed",
            "end_user",
            "memory_as_data",
            "memory_versions",
            "fact_keys",
            "alias_session",
            "archive",
            "attachment_search",
            "script_bigrams",
            "tombstone_groups",
            "quoted_breaks",
        ]
        # 17 is the retention branch's number (issue 19): this branch took 18.
        assert [m.version for m in pg_migrations.apply(conn)] == [*range(1, 17), 18, 19, 20]
        assert pg_migrations.plan(conn) == []
        assert pg_migrations.apply(conn) == []
        assert pg_migrations.current_version(conn) == pg_migrations.MIGRATIONS[-1].version == 20
        indexes = conn.execute(
            "SELECT to_regclass('inclusions') IS NULL, to_regclass('inclusions_memory') IS NULL"
        ).fetchone()
        assert indexes == (False, True)  # the table is found, the dropped index is not
        methods = conn.execute(
            "SELECT am.amname FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
            "JOIN pg_am am ON am.oid = c.relam WHERE c.relname IN "
            "('memory_vectors_hnsw', 'memories_fts') "
            "AND c.relnamespace = current_schema()::regnamespace ORDER BY c.relname"
        ).fetchall()
        assert methods == [("gin",), ("hnsw",)]
    store = PostgresStore(pg_schema_dsn)  # opens an up-to-date schema without re-applying
    with store.write() as w:
        a = w.insert(_memory("a", "vectors later"))
    store.execute(
        "INSERT INTO memory_vectors (memory_rowid, model, embedding) VALUES (%s, 'm', %s)",
        (a, "[" + ",".join(["0.5"] * 384) + "]"),
    )
    store.close()


def test_delete_cascades_to_index_counts_aliases_and_vectors(pg_schema_dsn: str) -> None:
    from ctxwarden.store.postgres import PostgresStore

    store = PostgresStore(pg_schema_dsn)
    with store.write() as w:
        a = w.insert(_memory("a", "unique words here"))
        w.add_aliases([Alias(tenant="t", id="b", rowid=a, status="duplicate", created_at=2.0)])
        w.put_token_counts([TokenCount(rowid=a, tokenizer="x", message=3, line=9)])
    store.execute("DELETE FROM memories WHERE rowid = %s", (a,))
    assert store.token_counts([a], "x") == {}
    assert store.search("t", ["unique"]) == []
    with store.write() as w:
        assert w.resolve("t", "b") is None
    store.close()


PROCESSES = 8
PER_PROCESS = 2000


def _records(p: int) -> list[dict[str, object]]:
    """Per process: a quarter sent by all 8 into one channel from their own sessions, a quarter
    cross-posted by its pair into their own channels of a shared session (other ids), a quarter
    by its pair with the same ids, a quarter its own."""
    out: list[dict[str, object]] = []
    for i in range(PER_PROCESS):
        kind = i % 4
        session, channel = f"s{p}", "general"
        if kind == 0:
            rid, content = f"all-{p}-{i}", f"broadcast {i}"
        elif kind == 1:
            rid, content = f"pair-{p}-{i}", f"pair {p // 2} {i}"
            session, channel = f"pair{p // 2}", f"c{p}"
        elif kind == 2:
            rid, content = f"same-{p // 2}-{i}", f"same id {p // 2} {i}"
        else:
            rid, content = f"own-{p}-{i}", f"own {p} {i}"
        out.append(
            {"id": rid, "session": session, "channel": channel, "author": "ana",
             "content": content, "created_at": 1_700_000_000.0 + i}
        )  # fmt: skip
    return out


def _worker(dsn: str, p: int, barrier: object, results: object) -> None:
    # Concurrent ingest is under test: no embedder (eight MiniLM loads on two cores cost
    # minutes and test nothing here; tests/test_embedding.py covers PG's shared embedding).
    engine = Engine.open(dsn, config=EngineConfig(embed="off"))
    records = _records(p)
    barrier.wait()  # type: ignore[attr-defined]
    statuses: Counter[str] = Counter()
    for record in records:
        statuses.update(o.status for o in engine.ingest([record]).outcomes)
    engine.close()
    results.put(dict(statuses))  # type: ignore[attr-defined]


@pytest.mark.slow
def test_concurrent_ingest_from_eight_processes(pg_schema_dsn: str) -> None:
    Engine.open(pg_schema_dsn).close()  # migrate once up front (workers would also cope)
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(PROCESSES)
    results = ctx.Queue()
    workers = [
        ctx.Process(target=_worker, args=(pg_schema_dsn, p, barrier, results))
        for p in range(PROCESSES)
    ]
    for w in workers:
        w.start()
    totals: Counter[str] = Counter()
    for _ in workers:
        totals.update(results.get(timeout=600))
    for w in workers:
        w.join(timeout=60)
        assert w.exitcode == 0
    quarter = PER_PROCESS // 4
    pairs = PROCESSES // 2
    memories = quarter + pairs * quarter + pairs * quarter + PROCESSES * quarter
    assert totals == {
        "stored": memories,
        "duplicate": quarter * (PROCESSES - 1) + pairs * quarter,
        "known": pairs * quarter,
    }
    with Engine.open(pg_schema_dsn) as engine:
        assert type(engine.store).__name__ == "PostgresStore"
        stats = engine.stats()
        assert stats["memories"] == memories
        assert stats["seen"] == PROCESSES * PER_PROCESS - pairs * quarter
        dups = Counter(
            (m.content.split()[0], m.dup_count) for m in engine.store.iter_memories("default")
        )
    assert dups == {
        ("broadcast", PROCESSES): quarter,
        ("pair", 2): pairs * quarter,
        ("same", 1): pairs * quarter,
        ("own", 1): PROCESSES * quarter,
    }


def test_a_grown_table_is_analysed_so_lookups_use_their_index(pg_schema_dsn: str) -> None:
    """Rows inserted faster than autovacuum looks: the store analyses ``memories`` itself, and
    a de-dup lookup of one key is planned on ``memories_exact`` (not a read of the tenant)."""
    import psycopg

    from ctxwarden.store.postgres import PostgresStore

    store = PostgresStore(pg_schema_dsn)
    with store.write() as w:
        for i in range(1500):
            w.insert(_memory(f"m{i}", f"say {i}"))
    with psycopg.connect(pg_schema_dsn, autocommit=True) as conn:
        (rows,) = conn.execute(
            "SELECT reltuples FROM pg_class WHERE oid = 'memories'::regclass"
        ).fetchone()  # type: ignore[misc]
        assert rows >= 1000
        plan = "\n".join(
            r[0]
            for r in conn.execute(
                "EXPLAIN SELECT rowid FROM memories WHERE tenant = 't' AND channel = ANY(%s) "
                "AND content_hash = ANY(%s) AND last_seen_at >= 0 AND kind = 'message'",
                (["c"], ["h-say 7"]),
            )
        )
    assert "memories_exact" in plan
    store.close()


def test_a_word_search_is_planned_for_its_own_terms_every_time(pg_schema_dsn: str) -> None:
    """psycopg prepares a statement on its sixth run on a connection, and the server may then
    run one generic plan for any values. For the word search that plan ranked a large scope's
    matches ~4x slower, so the search is never prepared (the server plans each run for its
    terms and bounds), while other reads still are."""
    from ctxwarden.store.postgres import PostgresStore

    store = PostgresStore(pg_schema_dsn, min_size=1, max_size=1)  # one connection to look at
    with store.write() as w:
        for i in range(40):
            w.insert(_memory(f"m{i}", f"budget review {i} with the design team"))
    for word in ("budget", "review", "design", "team", "budget", "review", "design", "team"):
        assert store.search("t", [word], limit=5)
    for _ in range(8):
        store.get("t", "m1")
    with store._pool.connection() as conn:
        prepared = [r[0] for r in conn.execute("SELECT statement FROM pg_prepared_statements")]
    assert prepared  # the other reads are prepared: the check can see a prepared statement
    assert not [s for s in prepared if "ts_rank_cd" in s]
    store.close()
