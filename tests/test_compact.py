"""Compaction: policy validation, planning (pure), apply (summary, deletion, tombstones, aliases),
sliding-window summaries and summaries of summaries."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable
from typing import Any

import pytest
from click.testing import Result

from conftest import Clock
from ctxwarden import ConfigError, Engine, NotFound, render
from ctxwarden.compact import CompactionPolicy, decayed_score, plan, summary_id
from ctxwarden.store.sqlite import SQLiteStore
from ctxwarden.summarize import ExtractiveSummarizer
from ctxwarden.types import format_time


def cli_on(tmp_path: Any, records: list[dict[str, Any]], *options: str) -> Callable[..., Result]:
    """``ctxwarden`` on a fresh database in ``tmp_path`` that ``ctxwarden ingest`` filled with
    ``records``: call it with a command's arguments (``options``, such as ``--config F``, go
    before each command)."""
    from typer.testing import CliRunner

    from ctxwarden.cli import app

    data = tmp_path / "m.jsonl"
    data.write_text("\n".join(json.dumps(r) for r in records), encoding="utf-8")
    base = ["--db", str(tmp_path / "c.db"), *options]
    runner = CliRunner()

    def run(*args: str, **invoke: Any) -> Result:
        return runner.invoke(app, [*base, *args], **invoke)

    assert run("ingest", str(data)).exit_code == 0
    return run


DAY = 86400.0
WORDS = [
    "deploy",
    "release",
    "budget",
    "laptop",
    "standup",
    "kafka",
    "redis",
    "invoice",
    "roadmap",
    "review",
]


def _messages(start: float, days: int, per_day: int, channel: str = "dev") -> list[dict[str, Any]]:
    out = []
    for d in range(days):
        for i in range(per_day):
            n = d * per_day + i
            out.append(
                {
                    "id": f"{channel}-{n}",
                    "session": "team",
                    "channel": channel,
                    "author": ["ana", "bo", "cy"][n % 3],
                    # One message in three states a fact (a version, a name); the rest is
                    # talk a summary may drop.
                    "content": f"{channel}: we moved the {WORDS[n % 10]} to version {n} after the "
                    f"{WORDS[(n * 3) % 10]} meeting with {['Omar', 'Ines'][n % 2]}"
                    if n % 3 == 0
                    else f"{channel}: the {WORDS[n % 10]} chat went fine, nothing new on the "
                    f"{WORDS[(n * 3) % 10]} side honestly, just the usual back and forth about "
                    "who reads which doc first and whether the notes should be longer or shorter, "
                    "nobody minded much either way and we moved on to lunch plans after that",
                    "created_at": start + d * DAY + i * 600,
                }
            )
    return out


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("older_than", -1),
        ("tau", 0),
        ("time_window", -5),
        ("max_cluster_tokens", 0),
        ("summary_ratio", 1.5),
        ("max_summary_share", 1.0),
        ("access_threshold", float("nan")),
        ("min_cluster_size", 0),
    ],
)
def test_policy_errors_name_the_field(field: str, value: Any) -> None:
    with pytest.raises(ConfigError, match=f"compact.{field}"):
        CompactionPolicy(**{field: value})


def test_decayed_score() -> None:
    assert decayed_score(0.0, None, 10.0, 1.0) == 0.0
    assert decayed_score(2.0, 0.0, 0.0, 5.0) == 2.0
    assert decayed_score(1.0, 0.0, 7 * DAY, 7 * DAY) == pytest.approx(0.36788, rel=1e-4)


def test_plan_selects_old_unused_unpinned_and_clusters_by_channel_and_day(
    engine: Engine, clock: Clock
) -> None:
    start = clock.now - 30 * DAY
    engine.ingest(
        _messages(start, days=20, per_day=6) + _messages(start, days=3, per_day=4, channel="ops")
    )
    engine.ingest([{"id": "pin", "session": "team", "content": "keep me", "pinned": True,
                    "created_at": start}])  # fmt: skip
    before = engine.stats()["memories"]
    p = engine.compact_plan(policy=CompactionPolicy(lossless_packs=False))
    assert engine.stats()["memories"] == before  # read-only
    # 16 days (30 - 14) of dev at 6 a day and 3 days of ops at 4 a day are old enough; one ops
    # day is half facts, more than a summary may keep (apply would leave it alone without
    # lossless packs; with them it is packed: tests/test_compact_pack.py).
    assert p.skipped["facts"] == 4
    assert p.memories == 16 * 6 + 3 * 4 - 4
    assert len(p.clusters) == 16 + 3 - 1
    for cluster in p.clusters:
        assert len({int(t // DAY) for t in cluster.time_range}) == 1
        assert cluster.tokens > cluster.target_tokens
        assert cluster.fact_tokens > 0  # one message in three is a fact
        assert cluster.tokens_saved == cluster.tokens - cluster.target_tokens - cluster.fact_tokens
    assert all("pin" not in c.ids for c in p.clusters)
    cutoff = clock.now - 14 * DAY
    assert all(c.time_range[1] < cutoff for c in p.clusters)


def test_recently_accessed_memories_stay(engine: Engine, clock: Clock) -> None:
    start = clock.now - 20 * DAY
    engine.ingest(_messages(start, days=1, per_day=6))
    clock.now -= 1 * DAY
    context = engine.assemble(session="team", query="kafka redis", model="gpt-4o", budget=3000)
    clock.now += 1 * DAY
    used = set(context.included)
    assert used
    p = engine.compact_plan()
    planned = {i for c in p.clusters for i in c.ids}
    assert not planned & used
    # A day-old single use decays to exp(-1/7) = 0.87 (over 0.5); with tau = 0.1 day it is gone.
    loose = engine.compact_plan(policy=CompactionPolicy(tau=0.1 * DAY))
    assert {i for c in loose.clusters for i in c.ids} >= used


def test_plan_is_pure_and_uses_topics_when_embeddings_exist(engine: Engine, clock: Clock) -> None:
    start = clock.now - 20 * DAY
    engine.ingest(_messages(start, days=1, per_day=8))
    rows = engine.store.compaction_candidates("default", created_before=clock.now)
    memories = [m for m, _ in rows]
    tokens = {m.rowid: 40 for m in memories}
    policy = CompactionPolicy()
    plain = plan(memories, now=clock.now, policy=policy, tokens=tokens)
    assert len(plain.clusters) == 1
    vectors = {m.id: [1.0, 0.0] if i % 2 else [0.0, 1.0] for i, m in enumerate(memories)}
    topical = plan(memories, now=clock.now, policy=policy, tokens=tokens, embeddings=vectors)
    assert len(topical.clusters) == 2
    assert {len(c.ids) for c in topical.clusters} == {4}
    assert plan(memories, now=clock.now, policy=policy, tokens=tokens) == plain
    # Referenced by a summary: never a candidate.
    cited = plan(memories, now=clock.now, policy=policy, tokens=tokens,
                 referenced={m.id for m in memories})  # fmt: skip
    assert cited.clusters == ()
    assert cited.skipped["summarised"] == len(memories)


def _tables(store: SQLiteStore) -> dict[str, int]:
    conn = store._conn
    return {
        "memories": conn.execute("SELECT count(*) FROM memories").fetchone()[0],
        "token_counts": conn.execute("SELECT count(*) FROM token_counts").fetchone()[0],
        "tombstones": len(store.tombstones("default")),
        "tombstone_groups": conn.execute("SELECT count(*) FROM tombstone_groups").fetchone()[0],
        "tombstone_keys": conn.execute("SELECT count(*) FROM tombstone_keys").fetchone()[0],
    }


def test_apply_writes_summaries_deletes_originals_and_leaves_tombstones(
    engine: Engine, clock: Clock
) -> None:
    start = clock.now - 20 * DAY
    records = _messages(start, days=3, per_day=6)
    # A verbatim repeat folds into its first copy: its alias must follow it into the summary.
    records.append({**records[0], "id": "repeat-of-0", "created_at": start + 60})
    engine.ingest(records)
    store = engine.store
    assert isinstance(store, SQLiteStore)
    p = engine.compact_plan()
    assert len(p.clusters) == 3
    seen: list[str] = []
    result = engine.compact(p, progress=lambda c, outcome: seen.append(outcome))
    assert seen == ["compacted"] * 3
    assert result.compacted == 18
    counts = _tables(store)
    assert counts["memories"] == 3
    assert counts["tombstones"] == 18
    # one tombstone row per summary, and one key per retired id to find it by
    assert (counts["tombstone_groups"], counts["tombstone_keys"]) == (3, 18)
    assert counts["token_counts"] == 3  # the summaries' counts; the originals' cascaded away
    for cluster in p.clusters:
        summary = engine.get(cluster.summary_id)
        assert summary.kind == "summary"
        assert summary.source_ids == cluster.ids
        assert summary.time_range == cluster.time_range
        assert summary.content.startswith("Summary of 6 messages")
        for id_ in cluster.ids:
            assert engine.get(id_).id == cluster.summary_id
        stones = store.tombstones("default", summary_id=cluster.summary_id)
        assert [t.id for t in stones] == sorted(cluster.ids)
        assert all(t.reason == "compacted" and t.time_range for t in stones)
    assert engine.get("repeat-of-0").id == p.clusters[0].summary_id
    # Tombstones hold no content; the originals' text is gone from the FTS index.
    columns = [r[1] for r in store._conn.execute("PRAGMA table_info(tombstone_groups)")]
    assert "content" not in columns
    original = records[1]["content"]
    assert not store._conn.execute(
        "SELECT 1 FROM memories m JOIN memories_fts f ON f.rowid = m.rowid "
        "WHERE memories_fts MATCH ? AND m.kind = 'message'",
        ('"' + original.split()[3] + '"',),
    ).fetchall()
    # The summary is searchable and shows up for a query, standing in for its sources.
    context = engine.assemble(session="team", query="release version Omar", budget=2000)
    summaries = {c.summary_id for c in p.clusters}
    assert summaries & set(context.included)
    # Re-ingesting a compacted id is a no-op, not a resurrection.
    outcome = engine.ingest([records[1]]).outcomes[0]
    assert outcome.status == "known"
    # Running again finds nothing to do; a stale plan is recognised.
    assert engine.compact_plan().clusters == ()
    again = engine.compact(p)
    assert again.compacted == 0
    assert again.already_done == 3
    assert store.integrity_check() == "ok"


def _dense(start: float) -> list[dict[str, Any]]:
    """A day of an ops channel where every message is a fact: nothing a summary could drop."""
    places = ["Ghent", "Lyon", "Oslo", "Porto", "Riga", "Turin"]
    systems = ["Atlas", "the db", "Kafka", "CI", "Redis", "the VPN"]
    return [
        {"id": f"ops-{n}", "session": "team", "channel": "ops", "author": "ana",
         "content": f"{what} moves to rack {n + 10} in {where}", "created_at": start + n * 60}
        for n, (what, where) in enumerate(zip(systems, places, strict=True))
    ]  # fmt: skip


def test_the_plan_leaves_out_what_apply_would_leave_alone(engine: Engine, clock: Clock) -> None:
    start = clock.now - 20 * DAY
    engine.ingest(_messages(start, days=2, per_day=6) + _dense(start))
    policy = CompactionPolicy(lossless_packs=False)
    p = engine.compact_plan(policy=policy)
    # The ops day's facts need more than half its tokens: apply would leave it alone, so the
    # plan does not count it (it used to, and promised tokens it then did not save).
    assert p.skipped["facts"] == 6
    assert {c.channel for c in p.clusters} == {"dev"}
    rows = engine.store.compaction_candidates("default", created_before=clock.now)
    memories = [m for m, _ in rows]
    stored = engine.store.token_counts([m.rowid for m in memories], "o200k_base")
    counts = {rowid: count.line for rowid, count in stored.items()}
    assert len(counts) == len(memories)
    blind = plan(memories, now=clock.now, policy=policy, tokens=counts)
    assert {c.channel for c in blind.clusters} == {"dev", "ops"}  # without a tokenizer
    assert blind.tokens_saved > p.tokens_saved
    outcomes: list[str] = []
    result = engine.compact(p, progress=lambda _c, outcome: outcomes.append(outcome))
    assert outcomes == ["compacted"] * len(p.clusters)
    assert result.compacted == p.memories == 12
    assert len(result.summaries) == len(p.clusters) == 2
    assert result.left_alone == 0
    # the estimate is the most each summary may take: what apply saved is at least that
    assert result.tokens_saved >= p.tokens_saved > 0
    summaries = [engine.get(s) for s in result.summaries]
    written = sum(_o200k().count(s.content) for s in summaries)
    assert result.tokens_saved == p.tokens - written
    assert engine.get("ops-3").content == "CI moves to rack 13 in Porto"


def _o200k() -> Any:
    from ctxwarden.tokens import get_tokenizer

    return get_tokenizer("o200k_base")


def test_apply_skips_a_cluster_whose_originals_changed(engine: Engine, clock: Clock) -> None:
    start = clock.now - 20 * DAY
    engine.ingest(_messages(start, days=1, per_day=6))
    p = engine.compact_plan()
    store = engine.store
    assert isinstance(store, SQLiteStore)
    store._conn.execute("DELETE FROM memories WHERE id = 'dev-3'")
    result = engine.compact(p)
    assert result.stale == 1
    assert result.compacted == 0
    with pytest.raises(NotFound):
        engine.get(p.clusters[0].summary_id)


def test_summary_id_is_deterministic() -> None:
    assert summary_id("t", ["a", "b"]) == summary_id("t", ["a", "b"])
    assert summary_id("t", ["a", "b"]) != summary_id("u", ["a", "b"])


def test_sliding_window_summarises_before_overflow(clock: Clock) -> None:
    with Engine.open(":memory:", clock=clock) as engine:
        records = _messages(clock.now - 2 * DAY, days=1, per_day=60)
        engine.ingest(records[:10])
        assert engine.summarize_session("team", capacity=1000) == []
        engine.ingest(records[10:])
        written = engine.summarize_session("team", capacity=1000)
        assert len(written) == 1
        summary = engine.get(written[0])
        assert summary.source_ids[0] == "dev-0"
        # Originals stay (retrieval still finds them); the summary is in the summaries block.
        assert engine.get("dev-0").id == "dev-0"
        context = engine.assemble(session="team", model="gpt-4o", budget=4000)
        assert written[0] in context.included
        # a summary is retrieved content: quoted data in the user-role memory message, never
        # in the system message
        assert all(m["role"] != "system" for m in context.messages)
        data = context.messages[0]
        assert data["role"] == "user"
        assert data["content"].startswith(render.data_intro())
        assert "## Summaries of earlier conversation\n" in data["content"]
        # Nothing new: no new summary.
        assert engine.summarize_session("team", capacity=1000) == []


def test_summaries_of_summaries_when_they_pile_up(clock: Clock) -> None:
    from ctxwarden.engine import EngineConfig

    config = EngineConfig(max_window_summaries=3)
    with Engine.open(":memory:", clock=clock, config=config) as engine:
        records = _messages(clock.now - 2 * DAY, days=1, per_day=120)
        written: list[str] = []
        for start in range(0, 120, 20):
            engine.ingest(records[start : start + 20])
            written += engine.summarize_session("team", capacity=600)
        windows = engine.store.summaries("default", session="team")
        assert len(windows) <= 4
        merged = [s for s in windows if any(i.startswith("s-") for i in s.source_ids)]
        assert merged
        for s in merged:
            for old in s.source_ids:
                assert engine.get(old).id in {w.id for w in windows}
        # Every tombstone points at a summary that exists.
        for t in engine.store.tombstones("default"):
            assert t.summary_id is not None
            assert engine.get(t.summary_id).kind == "summary"


def test_auto_summarize_after_ingest(clock: Clock) -> None:
    from ctxwarden.engine import EngineConfig

    config = EngineConfig(auto_summarize=True, default_model="gpt-4")  # 8k window
    with Engine.open(":memory:", clock=clock, config=config) as engine:
        capacity = engine.recent_capacity()
        assert 0 < capacity < 8192
        engine.ingest(_messages(clock.now - DAY, days=1, per_day=140))
        assert engine.store.summaries("default", session="team")


def test_integrity_on_file(tmp_path: Any, clock: Clock) -> None:
    path = tmp_path / "c.db"
    with Engine.open(path, clock=clock) as engine:
        engine.ingest(_messages(clock.now - 20 * DAY, days=2, per_day=5))
        engine.compact(summarizer=ExtractiveSummarizer())
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    orphans = conn.execute(
        "SELECT count(*) FROM tombstone_groups t LEFT JOIN memories m ON m.id = t.summary_id "
        "WHERE m.rowid IS NULL"
    ).fetchone()[0]
    assert orphans == 0
    conn.close()


def test_cli_compact_plan_then_apply(tmp_path: Any) -> None:
    from ctxwarden.cli import parse_duration

    assert parse_duration("14d") == 14 * DAY
    assert parse_duration("90m") == 5400
    cli = cli_on(tmp_path, _messages(1_700_000_000.0, days=2, per_day=6))
    shown = cli("compact", "--plan", "--json", "--older-than", "1d")
    assert shown.exit_code == 0, shown.output
    plan = json.loads(shown.output)
    assert plan["memories"] == 12
    assert len(plan["clusters"]) == 2
    done = cli("compact", "--apply", "--json")
    assert done.exit_code == 0, done.output
    result = json.loads(done.output.strip().splitlines()[-1])
    assert result["compacted"] == 12
    assert len(result["summaries"]) == 2
    again = cli("compact", "--plan", "--json")
    assert json.loads(again.output)["clusters"] == []


def test_cli_compact_plan_shows_each_summary_and_what_it_drops(tmp_path: Any) -> None:
    records = _messages(1_700_000_000.0, days=1, per_day=6)
    cli = cli_on(tmp_path, records)
    shown = cli("compact", "--plan", "--json")
    [summary] = json.loads(shown.output)["summaries"]
    assert summary["facts"] == 2
    assert "[dev-0] 22:13 ana: dev: we moved the deploy to version 0" in summary["text"]
    assert summary["lost"] == []
    assert ["dev-1", records[1]["content"]] in summary["dropped"]
    text = cli("compact", "--plan", env={"COLUMNS": "200"})
    assert text.exit_code == 0, text.output
    assert "we moved the deploy to version 0" in text.output
    assert "drops " in text.output
    assert "[dev-1]" in text.output


def test_window_summary_lines_already_in_persistent_are_dropped(clock: Clock) -> None:
    with Engine.open(":memory:", clock=clock) as engine:
        records = _messages(clock.now - 2 * DAY, days=1, per_day=60)
        fact = "the standup is now at 10:30 in room Kepler 7"
        records[3] = {**records[3], "content": fact}
        engine.ingest(records)
        engine.ingest([{"id": "f1", "session": "team", "kind": "fact", "content": fact}])
        written = engine.summarize_session("team", capacity=1000)
        assert written
        summary = engine.get(written[0])
        when = format_time(records[3]["created_at"], precision="minutes")[11:16]
        assert f"[dev-3] {when} {records[3]['author']}: {fact}" in summary.content
        context = engine.assemble(session="team", model="gpt-4o", budget=8000)
        assert written[0] in context.included
        data = context.messages[0]  # no system prompt: memory is data, never the system
        assert data["role"] == "user"
        assert data["content"].startswith(render.data_intro())
        persistent, summaries = data["content"].split("## Summaries of earlier conversation\n")
        assert persistent.count(fact) == 1  # in persistent,
        assert fact not in summaries  # dropped from the summary
        assert any("already in persistent dropped" in n for n in context.report.notes)


def test_a_fact_only_an_attachment_states_is_kept_in_the_summary(
    engine: Engine, clock: Clock
) -> None:
    start = clock.now - 20 * DAY
    records = _messages(start, days=1, per_day=12)
    # A message of chatter whose image says what nobody wrote: its caption is the fact.
    caption = "whiteboard: the Zephyr cutover moves to rack 42 in Lisbon on 3 May"
    records[1]["attachments"] = [{"kind": "image", "name": "board.jpg", "caption": caption}]
    engine.ingest(records)
    p = engine.compact_plan()
    assert [c.ids for c in p.clusters] == [tuple(r["id"] for r in records)]
    result = engine.compact(p)
    assert result.compacted == 12
    summary = engine.get(result.summaries[0])
    assert caption in summary.content
    # and it is found by what only the caption said
    context = engine.assemble(session="team", query="Zephyr cutover Lisbon", budget=2000)
    assert "rack 42 in Lisbon" in "\n".join(str(m["content"]) for m in context.messages)
