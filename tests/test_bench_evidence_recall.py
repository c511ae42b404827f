"""The evidence-recall yardstick reads LoCoMo's JSON format (a fixture written for this test)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from benchload import load_bench
from ctxwarden.engine import Engine, EngineConfig

ROOT = Path(__file__).resolve().parents[1]


def _bench() -> Any:
    return load_bench("evidence_recall", "evidence_recall")


def test_locomo_reader() -> None:
    bench = _bench()
    [conversation] = bench.read(ROOT / "tests" / "data" / "locomo_mini.json")
    assert conversation.name == "mini-1"
    assert [r["id"] for r in conversation.records] == ["D1:1", "D1:2", "D1:3", "D2:1", "D2:2"]
    first = conversation.records[0]
    assert first["author"] == "Iris"
    assert first["created_at"] == datetime(2024, 2, 3, 9, 15, tzinfo=UTC).timestamp()
    assert (
        conversation.records[3]["created_at"]
        == datetime(2024, 3, 11, 18, 40, tzinfo=UTC).timestamp()
    )
    # A caption is the turn's image attachment, not pasted into its text.
    assert conversation.records[2]["content"] == "Grey with white paws."
    assert conversation.records[2]["attachments"] == [
        {"kind": "image", "caption": "a photo of a grey cat on a sofa"}
    ]
    assert {r["channel"] for r in conversation.records} == {"session-1", "session-2"}
    # Questions without evidence (adversarial) are left out; "a; b" evidence is split.
    assert [q.evidence for q in conversation.questions] == [("D1:1",), ("D2:1",), ("D1:3", "D1:1")]
    assert [q.category for q in conversation.questions] == ["1", "2", "3"]
    assert all(q.asked_at > conversation.records[-1]["created_at"] for q in conversation.questions)


def test_recall_run_on_the_fixture() -> None:
    bench = _bench()
    conversations = bench.read(ROOT / "tests" / "data" / "locomo_mini.json")
    results = bench.run(conversations, budgets=[1000], model="gpt-4", embedder="none", limit=None)
    # A five-turn conversation fits in 1,000 tokens: every method finds all the evidence.
    for method in ("ctxwarden", "recency", "bm25"):
        assert len(results[method][1000]["all"]) == 3
    assert results["ctxwarden"][1000]["all"] == [1.0, 1.0, 1.0]
    assert results["recency"][1000]["all"] == [1.0, 1.0, 1.0]


def test_filler_interleaves_distractors_in_time_order() -> None:
    bench = _bench()
    [conversation] = bench.read(ROOT / "tests" / "data" / "locomo_mini.json")
    original = {r["id"]: r for r in conversation.records}
    places = {(r["session"], r["channel"]) for r in original.values()}
    bench.add_filler(conversation, 40, seed=3)
    records = conversation.records
    assert len(records) == len(original) + 40
    times = [bench.parse_time(r["created_at"]) for r in records]
    assert times == sorted(times)
    filler = [r for r in records if r["id"] not in original]
    assert len({r["id"] for r in filler}) == 40
    assert {(r["session"], r["channel"]) for r in filler} <= places
    # Within the conversation's own span (not the merged list's, which holds the filler too).
    span = [bench.parse_time(r["created_at"]) for r in original.values()]
    lo, hi = min(span), max(span)
    words = {w for r in original.values() for w in str(r["content"]).split()}
    for record in filler:
        assert lo <= bench.parse_time(record["created_at"]) <= hi
        assert set(record["content"].split()) <= words  # the conversation's own words
    # The conversation's own records are kept as they were, in their order.
    assert [r for r in records if r["id"] in original] == list(original.values())


def test_where_the_evidence_went_on_the_fixture(capsys: Any) -> None:
    bench = _bench()
    conversations = bench.read(ROOT / "tests" / "data" / "locomo_mini.json")
    where: dict[tuple[int, str], dict[str, int]] = {}
    bench.run(conversations, budgets=[1000], model="gpt-4", embedder="none", limit=None,
              where=where)  # fmt: skip
    # Every evidence memory (1 + 1 + 2) is counted once, in a block: all of it fits in 1k.
    assert sum(sum(p.values()) for p in where.values()) == 4
    assert set(where) == {(1000, "1"), (1000, "2"), (1000, "3")}
    assert {place for p in where.values() for place in p} <= {"related", "neighbour", "recent"}
    bench.show_where(where, apart=frozenset())
    table = capsys.readouterr().out
    assert "| 1000 | all | 4 | " in table


def test_evidence_place_names_each_miss() -> None:
    bench = _bench()
    [conversation] = bench.read(ROOT / "tests" / "data" / "locomo_mini.json")
    with Engine.open(":memory:", config=EngineConfig(embed="off")) as engine:
        engine.ingest(conversation.records[:3], session="mini-1")
        context = engine.assemble(session="mini-1", query="grey cat", budget=1000)
        places = bench.evidence_place(context, {"D1:3", "nowhere"})
    # sorted ids: the cat's turn is related or recent; an unknown id was never retrieved
    assert places[0] in {"related", "neighbour", "recent"}
    assert places[1] == "not retrieved"


def test_questions_rephrased_as_a_user_types_them() -> None:
    bench = _bench()
    [conversation] = bench.read(ROOT / "tests" / "data" / "locomo_mini.json")
    asked = [q.question for q in conversation.questions]
    bench.rephrase(conversation, "as-is")
    assert [q.question for q in conversation.questions] == asked
    bench.rephrase(conversation, "lower-bare")
    assert [q.question for q in conversation.questions] == [
        q.lower().rstrip("?").rstrip() for q in asked
    ]
    assert all(not q.question.endswith("?") for q in conversation.questions)
    with pytest.raises(ValueError, match="phrasing"):
        bench.rephrase(conversation, "shouting")


def test_dumped_candidates_feed_the_ranking_ceiling(capsys: Any, tmp_path: Path) -> None:
    """`--dump` writes each question's related candidates; bench/ranking_ceiling.py reads them
    and prints a table of rankers. On the fixture everything fits: every row is 100."""
    dump = tmp_path / "candidates.jsonl"
    fixture = ROOT / "tests" / "data" / "locomo_mini.json"
    _bench().main(["--embedder", "none", "--budgets", "1000", "--dump", str(dump), str(fixture)])
    capsys.readouterr()
    lines = [json.loads(line) for line in dump.read_text(encoding="utf-8").splitlines()]
    assert [line["wanted"] for line in lines] == [["D1:1"], ["D2:1"], ["D1:1", "D1:3"]]
    assert {line["data"] for line in lines} == {"locomo_mini.json"}
    assert all(line["found"] == line["wanted"] for line in lines)
    first = {c["id"]: c for c in lines[0]["candidates"]}
    assert first["D1:1"]["evidence"]  # in the context (recent history, at this size)
    assert not any(c["evidence"] for i, c in first.items() if i != "D1:1")
    assert "bm25_rank" in first["D1:1"]["components"]
    load_bench("ranking_ceiling", "ranking_ceiling").main([str(dump), "--density", "0.3"])
    rows = {
        cells[0]: cells[1:]
        for line in capsys.readouterr().out.splitlines()
        if line.startswith("| ") and not line.startswith("| ranker")
        for cells in [[c.strip() for c in line.strip("|").split("|")]]
    }
    assert rows == {m: ["100.0"] for m in ("engine", "packed", "learned, d = 0.3", "oracle")}


def test_the_ranking_ceiling_packs_by_its_ranker() -> None:
    """Two candidates of 60 tokens, room for one (the engine included one): packed by the
    engine's scores the distractor goes in, by the oracle the evidence; evidence the engine
    found in another block (recent history) counts for every ranker."""
    ceiling = load_bench("ranking_ceiling", "ranking_ceiling")
    row = {
        "wanted": ["e", "r"],
        "found": ["r", "x"],
        "candidates": [
            {"id": "x", "included": True, "tokens": 60, "score": 0.9, "components": {},
             "evidence": False},
            {"id": "e", "included": False, "tokens": 60, "score": 0.5, "components": {},
             "evidence": True},
        ],
    }  # fmt: skip
    assert ceiling.pack(row, [0.9, 0.5], 0.3) == {"x"}
    assert ceiling.pack(row, [0.0, 1.0], 1.0) == {"e"}
    assert ceiling.recall(row, {"x"}) == 0.5
    assert ceiling.recall(row, {"e"}) == 1.0
