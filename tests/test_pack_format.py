"""Lossless packs stored without their ids and times (ctxwarden.pack's stored format): shown as
rendered on every read, on both backends; packs stored rendered still read as they are; erasure
of one compacted id takes its line out; an unknown format is an error, never a misread."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import Clock
from ctxwarden import Engine
from ctxwarden.compact import write_summary
from ctxwarden.engine import EngineConfig
from ctxwarden.errors import StoreError
from ctxwarden.pack import PACK_FORMAT, PACK_FORMAT_KEY, pack, unpack, without_lines
from ctxwarden.store.base import Store
from ctxwarden.store.history import health
from ctxwarden.summarize import SummaryItem
from ctxwarden.tokens import get_tokenizer

DAY = 86400.0
TOK = get_tokenizer("cl100k_base")


def _dense(start: float, n: int = 6, step: float = 60.0) -> list[dict[str, Any]]:
    """A conversation where every message is a fact (compaction packs it)."""
    places = ["Ghent", "Lyon", "Oslo", "Porto", "Riga", "Turin", "Bergen", "Cork"]
    systems = ["Atlas", "the db", "Kafka", "CI", "Redis", "the VPN", "Vault", "Nomad"]
    return [
        {"id": f"ops-{i}", "session": "team", "channel": "ops", "author": ["ana", "bo"][i % 2],
         "content": f"{systems[i % 8]} moves to rack {i + 10} in {places[(i * 3) % 8]}",
         "created_at": start + i * step}
        for i in range(n)
    ]  # fmt: skip


def _raw(store: Store, tenant: str, id: str) -> tuple[str, dict[str, Any]]:
    """A memory's content and metadata columns as stored (not as reads show them)."""
    rows = store._read(  # type: ignore[attr-defined]
        "SELECT content, metadata FROM memories WHERE tenant = ? AND id = ?", (tenant, id)
    )
    (content, metadata) = rows[0]
    return str(content), json.loads(metadata) if isinstance(metadata, str) else dict(metadata)


def _items(records: list[dict[str, Any]]) -> list[SummaryItem]:
    return [
        SummaryItem(
            id=r["id"], content=r["content"], author=r["author"], created_at=r["created_at"]
        )
        for r in records
    ]


def _compacted(store: Store, clock: Clock, records: list[dict[str, Any]]) -> tuple[Engine, str]:
    engine = Engine(store, config=EngineConfig(embed="off"), clock=clock)
    engine.ingest(records)
    plan = engine.compact_plan()
    (cluster,) = plan.clusters
    assert cluster.lossless
    engine.compact(plan)
    return engine, cluster.summary_id


def test_a_stored_pack_reads_as_it_was_rendered_on_both_backends(
    store: Store, clock: Clock
) -> None:
    records = _dense(clock.now - 20 * DAY)
    engine, summary_id = _compacted(store, clock, records)
    expected = pack(_items(records), TOK)
    assert expected is not None
    content, metadata = _raw(store, "default", summary_id)
    # Stored: one `author: text` line per source, no ids, no times, no header.
    assert content == "\n".join(f"{r['author']}: {r['content']}" for r in records)
    assert metadata[PACK_FORMAT_KEY] == PACK_FORMAT
    # Shown: exactly what pack() rendered, by every read; the format key stays in the store.
    got = engine.get("ops-2")
    assert got.content == expected.text
    assert "- [ops-0] " in got.content
    assert PACK_FORMAT_KEY not in got.metadata
    assert got.metadata["lossless"] is True
    assert [m.content for m in store.summaries("default")] == [expected.text]
    assert [m.content for m in store.memories_at([got.rowid])] == [expected.text]
    assert [m.content for m in store.iter_memories("default")] == [expected.text]
    found = store.search("default", ["Kafka"])
    assert [m.content for m, _ in found] == [expected.text]
    # A memory shown already passes through again unchanged (a search's ``known``).
    again = store.search("default", ["Kafka"], known={got.rowid: got})
    assert [m.content for m, _ in again] == [expected.text]


def test_an_assembled_context_and_a_search_by_author_find_the_lines(clock: Clock) -> None:
    store_engine = Engine.open(":memory:", config=EngineConfig(embed="off"), clock=clock)
    with store_engine as engine:
        records = _dense(clock.now - 20 * DAY)
        engine.ingest(records)
        engine.compact(engine.compact_plan())
        # The author's name is in the stored text, so lexical search finds the pack by it.
        assert engine.store.search("default", ["bo"])
        context = engine.assemble(
            session="team", query="where does Kafka move?", model="gpt-4", budget=2000
        )
        text = "\n".join(str(m.get("content") or "") for m in context.messages)
        rendered = pack(_items(records), TOK)
        assert rendered is not None
        (line,) = [x for x in rendered.text.splitlines() if x.startswith("- [ops-2] ")]
        assert line.endswith(" ana: Kafka moves to rack 12 in Bergen")
        assert line in text


def test_a_pack_stored_rendered_still_reads_as_stored(store: Store, clock: Clock) -> None:
    """Packs written before the stored format (lines with ids and times, no format key)."""
    engine = Engine(store, config=EngineConfig(embed="off"), clock=clock)
    records = _dense(clock.now - 20 * DAY)
    engine.ingest(records)
    sources = [engine.get(r["id"]) for r in records]
    old = pack(_items(records), TOK)
    assert old is not None
    assert write_summary(
        store, tenant="default", session="team", channel="ops", thread_id=None,
        sources=sources, content=old.text, id="old-pack", tokenizers=[TOK],
        reason="compacted", now=clock.now, metadata={"lossless": True},
    )  # fmt: skip
    assert _raw(store, "default", "old-pack")[0] == old.text
    assert engine.get("ops-1").content == old.text
    assert [m.content for m in store.summaries("default")] == [old.text]
    receipt = engine.delete("ops-1")
    assert "ops-1" in receipt.ids
    assert records[1]["content"] not in engine.get("old-pack").content
    assert "- [ops-2] " in engine.get("old-pack").content


def test_erasing_one_compacted_id_takes_its_line_out_everywhere(store: Store, clock: Clock) -> None:
    records = _dense(clock.now - 20 * DAY)
    engine, summary_id = _compacted(store, clock, records)
    gone = records[3]  # "CI moves to rack 13 in Lyon"
    whole = pack(_items(records), TOK)
    assert whole is not None
    assert engine.get(summary_id).content == whole.text  # read (and its times kept) before
    receipt = engine.delete(gone["id"])
    assert gone["id"] in receipt.ids
    assert summary_id in receipt.summaries_rewritten
    shown = engine.get(summary_id)
    kept = [r for r in records if r is not gone]
    expected = pack(_items(kept), TOK)
    assert expected is not None
    assert shown.content == expected.text  # the others keep their ids, times and authors
    # The rewritten pack's hash is of its text as shown (times included), as compaction's is.
    assert (
        shown.content_hash == "summary-" + hashlib.sha256(expected.text.encode()).hexdigest()[:32]
    )
    assert gone["content"] not in shown.content
    assert "Summary of 5 messages" in shown.content
    stored, _ = _raw(store, "default", summary_id)
    assert gone["content"] not in stored
    assert len(stored.split("\n")) == len(shown.source_ids) == 5
    assert store.search("default", ["CI"]) == []
    assert [m.id for m, _ in store.search("default", ["Kafka"])] == [summary_id]
    for record in kept:
        engine.delete(record["id"])
    with pytest.raises(Exception, match=summary_id):
        engine.get(summary_id)


def test_an_unknown_pack_format_is_an_error_not_a_misread(store: Store, clock: Clock) -> None:
    engine = Engine(store, config=EngineConfig(embed="off"), clock=clock)
    records = _dense(clock.now - 20 * DAY)
    engine.ingest(records)
    sources = [engine.get(r["id"]) for r in records]
    found = pack(_items(records), TOK)
    assert found is not None
    assert found.stored is not None
    assert write_summary(
        store, tenant="default", session="team", channel="ops", thread_id=None,
        sources=sources, content=found.text, stored=found.stored, id="future", tokenizers=[TOK],
        reason="compacted", now=clock.now,
        metadata={"lossless": True, PACK_FORMAT_KEY: PACK_FORMAT + 1},
    )  # fmt: skip
    with pytest.raises(StoreError, match="pack format"):
        store.summaries("default")


def test_the_dashboard_previews_a_pack_as_shown(clock: Clock) -> None:
    with Engine.open(":memory:", config=EngineConfig(embed="off"), clock=clock) as engine:
        engine.ingest(_dense(clock.now - 20 * DAY))
        engine.compact(engine.compact_plan())
        engine.assemble(session="team", query="Kafka rack", model="gpt-4", budget=2000)
        hottest = health(engine.store, "default")["hottest"]  # type: ignore[arg-type]
        previews = [h["content"] for h in hottest if h["kind"] == "summary"]
        assert previews
        assert all(p.startswith("Summary of 6 messages") for p in previews)


_text = st.text(
    st.characters(blacklist_categories=("Cs", "Cc", "Zl", "Zp")), min_size=1, max_size=30
).filter(lambda t: len(t.strip().splitlines()) == 1)


@settings(max_examples=80, deadline=None)
@given(
    rows=st.lists(
        st.tuples(
            _text,
            st.one_of(st.none(), st.sampled_from(["ana", "bo", "李娜", "a: b"])),
            st.integers(0, 5 * 86400),
        ),
        min_size=1,
        max_size=12,
    ),
    start=st.integers(1_600_000_000, 1_900_000_000),
)
def test_unpack_gives_what_pack_rendered(
    rows: list[tuple[str, str | None, int]], start: int
) -> None:
    items = [
        SummaryItem(id=f"m{n}", content=text, author=author, created_at=float(start + offset))
        for n, (text, author, offset) in enumerate(rows)
    ]
    found = pack(items, TOK)
    assert found is not None
    assert found.stored is not None
    ids = [i.id for i in items]
    times = {i.id: float(i.created_at or 0) for i in items}
    assert unpack(found.stored, ids, times) == found.text
    # Erasing any one id gives the pack of the others.
    for n, item in enumerate(items):
        stored, kept = without_lines(found.stored, ids, {item.id})
        rest = items[:n] + items[n + 1 :]
        if not rest:
            assert stored is None
            continue
        again = pack(rest, TOK)
        assert again is not None
        assert stored is not None
        assert unpack(stored, kept, times) == again.text


def test_lines_and_ids_that_disagree_are_an_error() -> None:
    with pytest.raises(StoreError, match="2 lines for 1 source ids"):
        unpack("ana: a\nbo: b", ["m1"], {})


def test_an_edited_pack_keeps_its_shown_text_as_the_version(store: Store, clock: Clock) -> None:
    records = _dense(clock.now - 20 * DAY)
    engine, summary_id = _compacted(store, clock, records)
    before = engine.get(summary_id).content
    assert engine.update(summary_id, before).status == "known"  # the same text: no edit
    assert engine.update(summary_id, "ops moved everything to Ghent").status == "edited"
    assert engine.get(summary_id).content == "ops moved everything to Ghent"
    assert [v.content for v in engine.versions(summary_id)] == [before]
    content, metadata = _raw(store, "default", summary_id)
    assert content == "ops moved everything to Ghent"
    assert PACK_FORMAT_KEY not in metadata


def test_a_pack_whose_tombstones_name_another_summary_reads_the_same(
    store: Store, clock: Clock
) -> None:
    """A pack compacted in turn: its sources' tombstone groups then name the summary above it
    (Store.retire), and its archived record is read through the ids' keys instead."""
    records = _dense(clock.now - 20 * DAY)
    _, summary_id = _compacted(store, clock, records)
    expected = pack(_items(records), TOK)
    assert expected is not None
    with store.write() as writer:
        writer._run(  # type: ignore[attr-defined]
            "UPDATE tombstone_groups SET summary_id = ? WHERE summary_id = ?",
            ("above", summary_id),
        )
    store._pack_times = {}  # type: ignore[attr-defined]  # nothing read before
    assert [m.content for m in store.summaries("default")] == [expected.text]
