"""The store's history (ctxwarden.store.history): the series the dashboard plots agree with the
store's own counts, compaction records what it saved, and a memory's history follows its id
through folds, compaction and the inclusion log. On the story of tests/storyline.py."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import storyline
from ctxwarden import Engine
from ctxwarden.compact import CompactionPolicy
from ctxwarden.errors import InputError, NotFound
from ctxwarden.store import history


@pytest.fixture(scope="module")
def told(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    engine, _clock = storyline.tell(tmp_path_factory.mktemp("story") / "story.db")
    with engine:
        yield engine


def _health(engine: Engine, **kwargs: Any) -> dict[str, Any]:
    return history.health(engine.store, engine.config.tenant, **kwargs)


def test_the_series_add_up_to_the_stores_counts(told: Engine) -> None:
    health = _health(told, buckets=48)
    stats = told.stats()
    assert health["width"] == 86400  # a month and a week of days fits 48 buckets
    assert len(health["times"]) == health["buckets"] == len(health["memories"]["alive"])
    assert health["memories"]["now"] == health["memories"]["alive"][-1] == stats["memories"]
    new = sum(sum(series) for series in health["memories"]["new"].values())
    assert new == stats["memories"]
    tombstones = told.store.tombstones(told.config.tenant)
    retired = sum(sum(series) for series in health["memories"]["retired"].values())
    assert retired == len(tombstones) > 0
    # before the compaction every memory the story stored was alive at once
    assert max(health["memories"]["alive"]) == stats["memories"] + len(tombstones)
    for layer in ("exact", "near", "semantic"):
        assert sum(health["folds"][layer]) == stats[layer]
    assert stats["exact"] > 0
    assert set(health["tokens"]["by_channel"]) == {"general", "dev", "alerts"}
    assert sum(health["heat"]["contexts"]) == stats["contexts"]
    inclusions = sum(sum(series) for series in health["heat"]["by_channel"].values())
    assert inclusions > stats["contexts"]  # several memories per context
    hottest = health["hottest"]
    assert hottest[0]["id"] == "d000"  # the pinned note goes into every context
    assert hottest[0]["access_count"] == stats["contexts"]
    counts = [m["access_count"] for m in hottest]
    assert counts == sorted(counts, reverse=True)


def test_a_coarser_grid_keeps_the_totals(told: Engine) -> None:
    fine, coarse = _health(told, buckets=48), _health(told, buckets=5)
    assert coarse["width"] == 7 * 86400
    assert coarse["buckets"] <= 5
    for key in ("exact", "near", "semantic"):
        assert sum(fine["folds"][key]) == sum(coarse["folds"][key])
    assert fine["memories"]["alive"][-1] == coarse["memories"]["alive"][-1]
    assert sum(fine["heat"]["contexts"]) == sum(coarse["heat"]["contexts"])


def test_compaction_records_the_tokens_it_saved(tmp_path: Path) -> None:
    engine, clock = storyline.tell(tmp_path / "story.db")
    with engine:
        # one more day, a month later, compacted on its own: the plan's sizes are known
        records = storyline.demo_records()[1:]
        late = clock.now + 40 * storyline.DAY
        clock.now = late
        engine.ingest([{**r, "id": r["id"] + "-late", "created_at": late} for r in records])
        clock.now = late + 30 * storyline.DAY
        policy = CompactionPolicy(
            older_than=20 * storyline.DAY, min_cluster_size=2, max_summary_share=0.95
        )
        plan = engine.compact_plan(policy=policy)
        assert plan.clusters
        assert plan.tokenizer == "o200k_base"  # gpt-4o's: the default model, as in the story
        engine.compact(plan)
        compactions = {c["summary_id"]: c for c in _health(engine)["compactions"]}
        for cluster in plan.clusters:
            done = compactions[cluster.summary_id]
            assert done["retired"] == cluster.size
            assert done["tokens_before"] == cluster.tokens
            rowid = engine.store.get(engine.config.tenant, cluster.summary_id).rowid
            counted = engine.store.token_counts([rowid], plan.tokenizer)
            assert done["tokens_after"] == counted[rowid].line
            assert done["tokens_saved"] == done["tokens_before"] - done["tokens_after"] > 0


def test_a_memory_history_follows_its_id(told: Engine) -> None:
    tenant = told.config.tenant
    summary_id = _health(told)["compactions"][0]["summary_id"]
    summary = history.memory_history(told.store, tenant, summary_id)
    assert summary["found_as"] == "memory"
    assert summary["memory"]["kind"] == "summary"
    assert {s["id"] for s in summary["sources"]} == set(summary["memory"]["source_ids"])
    source = summary["sources"][0]["id"]
    retired = history.memory_history(told.store, tenant, source)
    assert retired["found_as"] == "retired"
    assert retired["memory"]["id"] == summary_id
    assert retired["tombstone"]["summary_id"] == summary_id
    assert retired["tombstone"]["reason"] == "compacted"
    lived = [e for e in retired["events"] if not e["event"].startswith("included")]
    assert [e["event"] for e in lived] == ["created", "retired"]
    assert lived[1]["id"] == summary_id
    assert "not recorded" in retired["versions"]

    pinned = history.memory_history(told.store, tenant, "d000")
    assert pinned["found_as"] == "memory"
    assert pinned["tombstone"] is None
    assert len(pinned["inclusions"]) == told.stats()["contexts"]
    assert {i["block"] for i in pinned["inclusions"]} == {"persistent"}
    times = [e["at"] for e in pinned["events"]]
    assert times == sorted(times)
    assert pinned["events"][0]["event"] == "created"


def test_a_folded_repeat_resolves_to_its_aggregate(told: Engine) -> None:
    tenant = told.config.tenant
    folded = next(
        m for m in history.health(told.store, tenant)["hottest"] if m["kind"] == "message"
    )
    record = history.memory_history(told.store, tenant, folded["id"])
    for repeat in record["folded"]:
        again = history.memory_history(told.store, tenant, repeat["id"])
        assert again["found_as"] == "folded"
        assert again["memory"]["id"] == record["memory"]["id"]
        assert repeat["layer"] in ("exact", "near", "semantic")


def test_scopes_and_bad_input(told: Engine) -> None:
    other = _health(told, session="nobody")
    assert other["memories"]["now"] == 0
    assert other["compactions"] == []
    assert sum(other["heat"]["contexts"]) == 0
    team = _health(told, session="team")
    assert team["memories"]["now"] == told.stats()["memories"]
    with pytest.raises(InputError, match="buckets"):
        _health(told, buckets=0)
    with pytest.raises(InputError, match="store"):
        history.health(object(), "default")
    with pytest.raises(NotFound):
        history.memory_history(told.store, told.config.tenant, "no-such-id")
    with pytest.raises(NotFound):
        history.memory_history(told.store, "another-tenant", "d000")


@pytest.mark.postgres
def test_postgres_tells_the_same_history(told: Engine, pg_schema_dsn: str) -> None:
    engine, _clock = storyline.tell(pg_schema_dsn)
    with engine:
        tenant = engine.config.tenant
        assert type(engine.store).__name__ == "PostgresStore"
        for session in (None, "team"):
            on_pg = history.health(engine.store, tenant, session=session)
            on_sqlite = history.health(told.store, tenant, session=session)
            for memory in on_pg["hottest"] + on_sqlite["hottest"]:
                memory["access_score"] = round(memory["access_score"], 6)
            assert on_pg == on_sqlite
        for id_ in ("d000", "d001", on_pg["compactions"][0]["summary_id"], "d017-2"):
            pg_record = history.memory_history(engine.store, tenant, id_)
            sqlite_record = history.memory_history(told.store, tenant, id_)
            for record in (pg_record, sqlite_record):  # context ids are random
                record["inclusions"] = [{**i, "context_id": ""} for i in record["inclusions"]]
                record["events"] = [
                    {**e, "id": ""} if e["event"].startswith("included") else e
                    for e in record["events"]
                ]
                record["access"]["access_score"] = round(record["access"]["access_score"], 6)
                record["memory"]["access_score"] = round(record["memory"]["access_score"], 6)
            assert pg_record == sqlite_record
