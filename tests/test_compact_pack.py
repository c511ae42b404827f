"""Lossless packs (dense clusters compacted with every message kept) and a background that does
not shrink as compaction proceeds (a resumed or repeated run decides as the uncut run)."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import Clock
from ctxwarden import ConfigError, Engine
from ctxwarden.background import (
    Background,
    read_corrections,
    summary_documents,
    term_corrections,
)
from ctxwarden.compact import CompactionPolicy
from ctxwarden.engine import EngineConfig
from ctxwarden.pack import pack, store_saving
from ctxwarden.store.base import Store
from ctxwarden.store.sqlite import SQLiteStore
from ctxwarden.summarize import SummaryItem, lost_facts
from ctxwarden.tokens import get_tokenizer
from test_compact import cli_on

DAY = 86400.0


def _dense(start: float, channel: str = "ops", n: int = 6) -> list[dict[str, Any]]:
    """A day where every message is a fact: nothing a summary could drop."""
    places = ["Ghent", "Lyon", "Oslo", "Porto", "Riga", "Turin", "Bergen", "Cork"]
    systems = ["Atlas", "the db", "Kafka", "CI", "Redis", "the VPN", "Vault", "Nomad"]
    return [
        {"id": f"{channel}-{i}", "session": "team", "channel": channel,
         "author": ["ana", "bo"][i % 2],
         "content": f"{systems[i % 8]} moves to rack {i + 10} in {places[(i * 3) % 8]}",
         "created_at": start + i * 60}
        for i in range(n)
    ]  # fmt: skip


@pytest.mark.parametrize(("field", "value"), [("min_pack_saving", 0), ("lossless_packs", 1)])
def test_pack_policy_errors_name_the_field(field: str, value: Any) -> None:
    with pytest.raises(ConfigError, match=f"compact.{field}"):
        CompactionPolicy(**{field: value})


def test_a_dense_cluster_becomes_a_lossless_pack(engine: Engine, clock: Clock) -> None:
    start = clock.now - 20 * DAY
    records = _dense(start)
    engine.ingest(records)
    left = engine.compact_plan(policy=CompactionPolicy(lossless_packs=False))
    assert left.clusters == ()
    assert left.skipped["facts"] == 6
    p = engine.compact_plan()
    (cluster,) = p.clusters
    assert cluster.lossless
    assert cluster.size == 6
    assert p.to_dict()["clusters"][0]["lossless"] is True  # type: ignore[index]
    (preview,) = engine.compact_preview(p)
    assert preview.lossless
    assert preview.dropped == ()
    assert preview.lost == ()
    assert preview.saving >= 0.3
    assert "lossless pack" in preview.reason
    result = engine.compact(p)
    assert result.compacted == 6
    assert result.left_alone == 0
    summary = engine.get("ops-3")
    assert summary.kind == "summary"
    assert summary.id == cluster.summary_id
    assert summary.metadata["lossless"] is True
    for record in records:
        # every message verbatim, on a line citing its id, with its time and author
        line = f"- [{record['id']}] "
        (found,) = [x for x in summary.content.splitlines() if x.startswith(line)]
        assert found.endswith(f"{record['author']}: {record['content']}")
    store = engine.store
    assert isinstance(store, SQLiteStore)
    count = "SELECT count(*) FROM {} WHERE tenant = 'default'"
    assert store._conn.execute(count.format("memories")).fetchone()[0] == 1
    tombs = store.tombstones("default", summary_id=summary.id)
    assert sorted(t.id for t in tombs) == sorted(str(r["id"]) for r in records)


def test_long_messages_and_multi_line_messages_are_not_packed(engine: Engine, clock: Clock) -> None:
    start = clock.now - 20 * DAY
    long = _dense(start, "long")
    for record in long:  # text is most of what a long message costs: a pack saves too little
        record["content"] += " " + " ".join(f"Host{k}-{record['id']}" for k in range(120))
    lines = _dense(start + DAY, "code")
    lines[2]["content"] = "the new config:\n  rack: 12\n  site: Porto"
    engine.ingest(long + lines)
    p = engine.compact_plan()
    assert p.clusters == ()
    assert p.skipped["facts"] == 12


def test_pack_saving_follows_the_store_cost_model() -> None:
    tok = get_tokenizer("cl100k_base")
    short = [SummaryItem(id=f"m{i}", content=f"rack {i} in Oslo", author="ana") for i in range(9)]
    long = [replace_content(item, item.content + " x" * 400) for item in short]
    assert pack(short, tok).saving > 0.3  # type: ignore[union-attr]
    assert pack(long, tok).saving < 0.3  # type: ignore[union-attr]
    assert store_saving([], "") == 0.0


def replace_content(item: SummaryItem, content: str) -> SummaryItem:
    return SummaryItem(id=item.id, content=content, author=item.author)


_line = st.text(
    st.characters(blacklist_categories=("Cs", "Cc", "Zl", "Zp")), min_size=1, max_size=60
).filter(lambda t: t.strip() == t and t != "")


@settings(max_examples=60, deadline=None)
@given(st.lists(_line, min_size=1, max_size=8), st.integers(0, 4_000_000_000))
def test_a_pack_keeps_every_message_and_loses_no_fact(texts: list[str], start: int) -> None:
    tok = get_tokenizer("cl100k_base")
    items = [
        SummaryItem(id=f"m{i}", content=t, author="ana", created_at=float(start + 61 * i))
        for i, t in enumerate(texts)
    ]
    found = pack(items, tok)
    assert found is not None
    lines = found.text.splitlines()
    for item in items:
        assert any(
            x.startswith(f"- [{item.id}] ") and x.endswith(f"ana: {item.content}") for x in lines
        )
    assert lost_facts(items, found.text) == []
    assert found.tokens == tok.count(found.text)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.sampled_from("deploy review Ghent ok rack 12 Oslo budget api the".split()),
             min_size=1, max_size=6).map(" ".join),
    st.lists(st.booleans(), min_size=4, max_size=4),
)  # fmt: skip
def test_corrections_restore_every_common_count_and_never_overcount(
    extra: str, keep: list[bool]
) -> None:
    texts = {f"m{i}": f"{extra} deploy {i} review" for i in range(4)}
    kept = [f"- [m{i}] 10:00 ana: {texts[f'm{i}']}" for i in range(4) if keep[i]]
    text = "Summary of 4 messages\nEvents:\n" + "\n".join(kept)
    corpus = [*texts.values(), "deploy api", "review budget", "Ghent"] * 3
    background = Background.of(corpus)
    corrections = read_corrections(term_corrections(texts, text, background))
    recovered: dict[str, int] = {}
    for id_, terms in summary_documents(text).items():
        assert id_ in texts
        for term in terms:
            recovered[term] = recovered.get(term, 0) + 1
    said: dict[str, int] = {}
    for source in texts.values():
        for term in set(Background.of([source]).frequency):
            said[term] = said.get(term, 0) + 1
    for term in said.keys() | recovered.keys():
        total = recovered.get(term, 0) + corrections.get(term, 0)
        if background.common(term):
            assert total == said.get(term, 0)
        else:
            assert total <= said.get(term, 0)


def _busy(start: float, days: int) -> list[dict[str, Any]]:
    """Two channels, 13 messages a day: stock phrases in many messages, facts in some."""
    out = []
    for d in range(days):
        for i in range(13):
            n = d * 13 + i
            stock = "the usual standup notes, nothing new, see the board for the review"
            out.append({
                "id": f"b{n}", "session": "team", "channel": ["dev", "ops"][i % 2],
                "author": ["ana", "bo", "cy"][n % 3],
                "content": f"{stock}; rack {n} moved to Oslo for Omar" if n % 4 == 0
                else f"{stock} and the review went fine" if n % 4 == 1
                else f"{stock}, Kafka lag {n * 7} on the review host {n % 5}",
                "created_at": start + d * DAY + i * 600,
            })  # fmt: skip
    return out


def test_a_resumed_run_decides_every_remaining_cluster_as_the_uncut_run(
    tmp_path: Any, clock: Clock
) -> None:
    records = _busy(clock.now - 40 * DAY, 20)  # 260 candidates: the background is measured
    policy = CompactionPolicy(max_summary_share=0.6)
    paths = [tmp_path / "uncut.db", tmp_path / "cut.db"]
    for path in paths:
        with Engine.open(path, clock=clock) as engine:
            engine.ingest(records)
    with Engine.open(paths[0], clock=clock) as engine:
        uncut = engine.compact_plan(policy=policy)
        assert uncut.background is not None
        assert uncut.background.measured
        engine.compact(uncut)
        uncut_rows = sorted(
            (m.id, m.content, json.dumps(dict(m.metadata), sort_keys=True))
            for m in engine.store.summaries("default")
        )
    assert len(uncut.clusters) >= 20
    with Engine.open(paths[1], clock=clock) as engine:
        first = engine.compact_plan(policy=policy)
        assert first.clusters == uncut.clusters
        # a run cut short after seven clusters: the first seven of the same plan
        cut = engine.compact(dataclasses.replace(first, clusters=first.clusters[:7]))
        done = set(cut.summaries)
        assert len(done) == 7
        resumed = engine.compact_plan(policy=policy)
        bg0, bg1 = uncut.background, resumed.background
        assert bg1 is not None
        assert (bg1.documents, bg1.limit) == (bg0.documents, bg0.limit)
        assert {t for t in bg0.frequency if bg0.common(t)} == {
            t for t in bg1.frequency if bg1.common(t)
        }
        assert resumed.clusters == tuple(c for c in uncut.clusters if c.summary_id not in done)
        engine.compact(resumed)
        assert engine.compact_plan(policy=policy).clusters == ()
        cut_rows = sorted(
            (m.id, m.content, json.dumps(dict(m.metadata), sort_keys=True))
            for m in engine.store.summaries("default")
        )
    assert cut_rows == uncut_rows


def test_cli_compact_plan_shows_a_lossless_pack(tmp_path: Any) -> None:
    records = _dense(1_700_000_000.0)
    cli = cli_on(tmp_path, records)
    shown = cli("compact", "--plan", "--json")
    [summary] = json.loads(shown.output)["summaries"]
    assert summary["lossless"] is True
    assert summary["dropped"] == []
    assert summary["lost"] == []
    assert f"[ops-2] 22:15 ana: {records[2]['content']}" in summary["text"]
    text = cli("compact", "--plan", env={"COLUMNS": "200"})
    assert text.exit_code == 0, text.output
    assert "lossless pack" in text.output
    assert "every message kept" in text.output


def test_lines_leave_out_the_time_when_the_header_states_the_one_minute() -> None:
    from ctxwarden.summarize import ExtractiveSummarizer

    tok = get_tokenizer("cl100k_base")
    said = ["Atlas moves to Oslo.", "Rack 11 moves to Oslo.", "Kafka lands in Riga on Friday."]
    items = [
        SummaryItem(id=f"m{i}", content=text, author="ana", created_at=1_700_000_000.0 + i)
        for i, text in enumerate(said)
    ]
    packed = pack(items, tok)
    assert packed is not None
    summary = ExtractiveSummarizer().summarize(items, max_tokens=200, tokenizer=tok).render()
    for text in (packed.text, summary):
        header, *lines = text.splitlines()
        assert header.endswith("2023-11-14 22:13 UTC")
        assert "- [m1] ana: Rack 11 moves to Oslo." in lines
    later = [*items[:2], SummaryItem(id="m2", content=said[2], author="ana",
                                     created_at=1_700_000_100.0)]  # fmt: skip
    assert "- [m1] 22:13 ana: Rack 11 moves to Oslo." in pack(later, tok).text  # type: ignore[union-attr]


def test_the_http_compact_body_and_the_cli_turn_packs_off(tmp_path: Any) -> None:
    from ctxwarden.server.http import CompactBody

    assert CompactBody().policy().lossless_packs is True
    assert CompactBody(lossless_packs=False, min_pack_saving=0.5).policy().min_pack_saving == 0.5
    with pytest.raises(ValueError, match="min_pack_saving"):
        CompactBody(min_pack_saving=1.0)
    cli = cli_on(tmp_path, _dense(1_700_000_000.0))
    off = cli("compact", "--plan", "--json", "--no-lossless-packs")
    assert json.loads(off.output)["clusters"] == []
    assert json.loads(off.output)["skipped"]["facts"] == 6


def test_a_resumed_run_decides_as_the_first_on_both_backends(store: Store, clock: Clock) -> None:
    engine = Engine(store, config=EngineConfig(embed="off"), clock=clock)  # words only
    engine.ingest(_busy(clock.now - 40 * DAY, 16) + _dense(clock.now - 50 * DAY))
    policy = CompactionPolicy(max_summary_share=0.6)
    first = engine.compact_plan(policy=policy)
    assert first.background is not None
    assert first.background.measured  # 208 + 6 candidates
    assert any(c.lossless for c in first.clusters)
    cut = engine.compact(dataclasses.replace(first, clusters=first.clusters[:5]))
    assert len(cut.summaries) == 5
    written = engine.get(cut.summaries[0])
    assert isinstance(written.metadata.get("terms"), str)  # round-trips as written
    resumed = engine.compact_plan(policy=policy)
    assert resumed.background is not None
    assert resumed.background.documents == first.background.documents
    assert resumed.clusters == first.clusters[5:]
    engine.compact(resumed)
    assert engine.compact_plan(policy=policy).clusters == ()
