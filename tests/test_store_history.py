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
from ctxwarden.store.base import Store
from ctxwarden.types import format_time

DAY = 86400.0


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
    assert retired["versions"] == []  # went with the memory
    assert retired["superseded_by"] is None

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


def _edited_and_superseded(store: Store) -> Engine:
    """A note edited twice, a keyed fact superseded twice, and in a second tenant the same ids
    with their own texts (the ``store`` fixture: SQLite and PostgreSQL)."""
    clock = storyline.Clock(10 * DAY)
    engine = Engine(store, clock=clock)
    for tenant, word in (("default", "Tuesday"), ("other", "Saturday")):
        note = {"id": "n1", "session": "s", "content": f"standup on {word} at 10"}
        engine.ingest([{**note, "created_at": DAY}], tenant=tenant)
    clock.now = 11 * DAY
    engine.update("n1", "standup on Wednesday at 10")
    clock.now = 12 * DAY
    engine.ingest([{"id": "n1", "session": "s", "content": "standup on Thursday at 9:30"}])
    for id_, day, value in (("f1", 2, "Monday"), ("f2", 3, "Friday"), ("f3", 4, "Sunday")):
        fact = {"id": id_, "session": "s", "kind": "fact", "key": "deploy window",
                "content": f"the deploy window is {value}", "created_at": day * DAY}  # fmt: skip
        engine.ingest([fact])
    return engine


def test_a_memory_history_shows_its_versions_and_links(store: Store) -> None:
    engine = _edited_and_superseded(store)
    note = history.memory_history(store, "default", "n1")
    assert note["memory"]["content"] == "standup on Thursday at 9:30"
    versions = note["versions"]
    assert [v["version"] for v in versions] == [1, 2]
    assert [v["content"] for v in versions] == [
        "standup on Tuesday at 10",
        "standup on Wednesday at 10",
    ]
    assert [v["replaced_by"] for v in versions] == [
        "standup on Wednesday at 10",
        "standup on Thursday at 9:30",
    ]
    assert [(v["valid_from"], v["valid_until"]) for v in versions] == [
        (format_time(DAY), format_time(11 * DAY)),
        (format_time(11 * DAY), format_time(12 * DAY)),
    ]
    edits = [e for e in note["events"] if e["event"] == "edited"]
    assert [e["at"] for e in edits] == [format_time(11 * DAY), format_time(12 * DAY)]
    assert note["superseded_by"] is None
    assert note["supersedes"] == []

    # The other tenant's note, with the same id, has its own text and no versions.
    theirs = history.memory_history(store, "other", "n1")
    assert theirs["versions"] == []
    assert "Saturday" in theirs["memory"]["content"]
    assert "Saturday" not in str(note)
    assert "Tuesday" not in str(theirs)

    first, middle, last = (history.memory_history(store, "default", f) for f in ("f1", "f2", "f3"))
    reason = "same key 'deploy window'"
    assert first["superseded_by"] == {
        "id": "f2",
        "created_at": format_time(3 * DAY),
        "valid_until": format_time(3 * DAY),
        "reason": reason,
    }
    assert first["supersedes"] == []
    assert middle["superseded_by"] is not None
    assert middle["superseded_by"]["id"] == "f3"
    assert middle["supersedes"] == [
        {
            "id": "f1",
            "created_at": format_time(2 * DAY),
            "valid_until": format_time(3 * DAY),
            "reason": reason,
        }
    ]
    assert last["superseded_by"] is None
    assert [s["id"] for s in last["supersedes"]] == ["f2"]
    assert [(e["event"], e["id"]) for e in middle["events"]] == [
        ("created", "f2"),
        ("supersedes", "f1"),
        ("superseded", "f3"),
    ]
    # Erasing the newest relinks: f2 is in force again, and its history says so.
    engine.delete("f3")
    again = history.memory_history(store, "default", "f2")
    assert again["superseded_by"] is None
    assert [s["id"] for s in again["supersedes"]] == ["f1"]
    with pytest.raises(NotFound):
        history.memory_history(store, "other", "f1")


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
