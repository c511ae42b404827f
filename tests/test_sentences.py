"""Sentences and facts in any script, and summaries of CJK clusters that keep every fact."""

from __future__ import annotations

from typing import Any

import pytest

from conftest import Clock
from ctxwarden import Engine, compact
from ctxwarden.compact import CompactionPolicy, lost_facts
from ctxwarden.sentences import fact_values, is_fact, split_sentences
from ctxwarden.summarize import ExtractiveSummarizer, SummaryItem
from ctxwarden.tokens import get_tokenizer

DAY = 86400.0
CL100K = get_tokenizer("cl100k_base")

# Written for these tests: a Japanese team channel and a Chinese one, each with a changed
# meeting time, an owner, a place, a number, an open question and some chatter.
JAPANESE = [
    ("haruto", "おはようございます"),
    ("yui", "定例会議は水曜の午後3時から木曜の午前10時に変更になりました。"),
    ("haruto", "了解"),
    ("yui", "議事録の担当は佐藤さんです。場所は第二会議室です。"),
    ("haruto", "予算は120万円で確定しました！"),
    ("yui", "はい"),
    ("haruto", "新しいサーバーはいつ届きますか？"),
    ("yui", "ありがとう"),
]
CHINESE = [
    ("wang", "大家好"),
    ("li", "发布会从周三改到周四下午3点。"),
    ("wang", "好的"),
    ("li", "这次由李娜负责发布，地点在上海办公室。"),
    ("wang", "预算定为8万元。"),
    ("li", "嗯嗯"),
    ("wang", "测试环境什么时候能准备好？"),
    ("li", "收到"),
]


def _items(lines: list[tuple[str, str]], prefix: str) -> list[SummaryItem]:
    return [
        SummaryItem(id=f"{prefix}{n}", content=text, author=who, created_at=1.7e9 + 60 * n)
        for n, (who, text) in enumerate(lines)
    ]


def test_split_cjk_sentences_at_their_punctuation() -> None:
    assert split_sentences("議事録の担当は佐藤さんです。場所は第二会議室です。") == [
        "議事録の担当は佐藤さんです。",
        "場所は第二会議室です。",
    ]
    assert split_sentences("他说「明天见。」然后走了！真的吗？") == [
        "他说「明天见。」",
        "然后走了！",
        "真的吗？",
    ]
    # Latin punctuation: a cut only where a new sentence starts.
    assert split_sentences("Moved to v2.1 today. Ask Omar? yes. e.g. this") == [
        "Moved to v2.1 today.",
        "Ask Omar? yes. e.g. this",
    ]


@pytest.mark.parametrize(
    ("text", "values"),
    [
        ("The demo is now Thursday 10:00, not Wednesday 15:00", ("Thursday", "10:00")),
        ("budget is 3.5% over", ("3.5%",)),
        ("ping @rosa in #ops about `max_pool`", ("@rosa", "#ops", "`max_pool`")),
        ("会議は午後3時です", ("3時",)),
        ("发布会改到周四", ("周四",)),
        ("会议在三点开始", ("三点",)),
        ("Встреча перенесена на Четверг", ("Четверг",)),  # a cased script: a name by capitals
        ("where is the doc?", ("where is the doc?",)),
    ],
)
def test_fact_values_by_script_independent_signals(text: str, values: tuple[str, ...]) -> None:
    found = fact_values(text)
    for value in values:
        assert value in found


@pytest.mark.parametrize("text", ["ok sounds good", "Thanks", "好的", "はい", "lol"])
def test_chatter_is_no_fact(text: str) -> None:
    assert not is_fact(text)


@pytest.mark.parametrize(("lines", "prefix", "count"), [(JAPANESE, "j", 5), (CHINESE, "c", 4)])
def test_a_cjk_summary_keeps_every_fact_with_id_and_time(
    lines: list[tuple[str, str]], prefix: str, count: int
) -> None:
    items = _items(lines, prefix)
    summarizer = ExtractiveSummarizer()
    facts = summarizer.facts(items)
    assert len(facts) == count  # the chatter none (Japanese has two in one message)
    summary = summarizer.summarize(items, max_tokens=400, tokenizer=CL100K)
    text = summary.render()
    assert lost_facts(items, text) == []
    for id_, sentence, _ in facts:
        assert sentence in text
        assert f"[{id_}] " in text
    assert "22:14 " in text  # the time of item 1 (2023-11-14 22:14 UTC)
    for chatter in ("了解", "ありがとう", "好的", "收到"):
        assert chatter not in text.split("\n", 1)[1]  # the body: lines and entities
    # The open question is an open question.
    assert any("？" in line for line in summary.open_loops)


def test_a_tight_budget_loses_facts_and_says_so() -> None:
    items = _items(JAPANESE, "j")
    summary = ExtractiveSummarizer().summarize(items, max_tokens=40, tokenizer=CL100K)
    assert lost_facts(items, summary.render())


def _records(lines: list[tuple[str, str]], prefix: str, start: float) -> list[dict[str, Any]]:
    out = [
        {"id": f"{prefix}{n}", "session": "team", "channel": prefix, "author": who,
         "content": text, "created_at": start + 120 * n}
        for n, (who, text) in enumerate(lines)
    ]  # fmt: skip
    # A bot's alerts that differ only in counters: noise, not facts; the summary saves these.
    out += [
        {"id": f"{prefix}-bot{n}", "session": "team", "channel": prefix, "author": "cibot",
         "author_kind": "bot", "created_at": start + 30 + 120 * n,
         "content": f"{prefix} build #{4000 + n} ok ({10 + n}s) commit {n:07x} at {n % 24}:05 "
                    f"on runner {n % 5} of pool {prefix}-{n % 3}"}
        for n in range(40)
    ]  # fmt: skip
    return out


def test_compaction_of_cjk_clusters_keeps_every_fact(engine: Engine, clock: Clock) -> None:
    start = clock.now - 20 * DAY
    engine.ingest(_records(JAPANESE, "jp", start) + _records(CHINESE, "zh", start))
    # CJK sentences of six ideographs or more are facts whole, so these clusters are mostly
    # facts: let a summary keep up to 90 % of its cluster.
    policy = CompactionPolicy(older_than=7 * DAY, max_summary_share=0.9)
    plan = engine.compact_plan(policy=policy)
    assert len(plan.clusters) == 2
    previews = engine.compact_preview(plan)
    assert [(p.text is not None, p.facts) for p in previews] == [(True, 5), (True, 4)]
    assert all(p.lost == () for p in previews)
    result = engine.compact(plan)
    assert result.compacted == plan.memories
    assert result.left_alone == 0
    for cluster, lines in zip(plan.clusters, (JAPANESE, CHINESE), strict=True):
        text = engine.get(cluster.summary_id).content
        items = _items(lines, "x")
        for _, sentence, _ in ExtractiveSummarizer().facts(items):
            assert sentence in text
    assert "木曜の午前10時" in engine.get(plan.clusters[0].summary_id).content
    assert "李娜" in engine.get(plan.clusters[1].summary_id).content


def test_a_cluster_that_would_lose_facts_is_left_alone(engine: Engine, clock: Clock) -> None:
    start = clock.now - 20 * DAY
    # Every message a fact, nothing to drop: a summary would save nothing.
    engine.ingest(
        [
            {"id": f"f{n}", "session": "team", "channel": "ops", "author": "ana",
             "content": f"{what} moves to rack {n + 10} in {where}", "created_at": start + n}
            for n, (what, where) in enumerate(
                zip(["Atlas", "the db", "Kafka", "CI", "Redis", "the VPN"],
                    ["Ghent", "Lyon", "Oslo", "Porto", "Riga", "Turin"], strict=True)
            )
        ]
    )  # fmt: skip
    # (without lossless packs: with them such a cluster is packed, tests/test_compact_pack.py)
    policy = CompactionPolicy(older_than=7 * DAY, lossless_packs=False)
    # The engine's plan counts the facts and leaves the cluster out...
    planned = engine.compact_plan(policy=policy)
    assert planned.clusters == ()
    assert planned.skipped["facts"] == 6
    # ...and apply leaves it alone when a plan made without a tokenizer holds it.
    rows = engine.store.compaction_candidates("default", created_before=clock.now)
    memories = [m for m, _ in rows]
    stored = engine.store.token_counts([m.rowid for m in memories], planned.tokenizer)
    plan = compact.plan(
        memories,
        now=clock.now,
        policy=policy,
        tokens={rowid: count.line for rowid, count in stored.items()},
        tokenizer=planned.tokenizer,
    )
    [preview] = engine.compact_preview(plan)
    assert preview.text is None
    assert "facts" in preview.reason
    assert "need" in preview.reason
    outcomes: list[str] = []
    result = engine.compact(plan, progress=lambda _c, outcome: outcomes.append(outcome))
    assert outcomes == ["left_alone"]
    assert result.left_alone == 1
    assert result.compacted == 0
    assert engine.get("f3").content == "CI moves to rack 13 in Porto"
