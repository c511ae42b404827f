"""What a summary keeps when compaction sees the whole run (summarize.Background), and how a
summary's lines are shown to one query (summary.summary_excerpt).

The corpus is generated here: stock phrases over a few topics, bot alerts from one template, and
a handful of messages that say something once.
"""

from __future__ import annotations

import itertools
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import Clock
from ctxwarden import Engine
from ctxwarden.compact import CompactionPolicy, lost_facts
from ctxwarden.summarize import Background, ExtractiveSummarizer, SummaryItem, novel_facts
from ctxwarden.summary import summary_excerpt
from ctxwarden.tokens import get_tokenizer

CL100K = get_tokenizer("cl100k_base")
DAY = 86400.0
PEOPLE = ["ana", "bo", "cy", "dee", "eli", "fay"]
TOPICS = ["the build", "the PR queue", "the wiki", "the CI runner", "the sprint board"]
MOODS = ["is slow again, ideas?", "looks fine now", "needs a look after lunch", "is done for today"]
NEWS = {
    "bo": "I was born in Tromsø and moved south at nine",
    "dee": "heads up: I cannot eat hazelnuts, please skip them at the offsite",
    "fay": "the vendor contract renews on 2031-02-14 at 48,500 EUR",
}


def _corpus(start: float, days: int = 4, per_day: int = 60) -> list[dict[str, object]]:
    out: list[dict[str, object]] = []
    stock = itertools.cycle(itertools.product(TOPICS, MOODS))
    n = 0
    for day in range(days):
        for i in range(per_day):
            author = PEOPLE[n % len(PEOPLE)]
            if i % 6 == 5:
                author, kind = "buildbot", "bot"
                content = f"Build #{1000 + n} of {TOPICS[n % 3][4:]} passed in {n % 50 + 10}s"
            else:
                kind = "human"
                topic, mood = next(stock)
                content = f"{topic} {mood}"
            if day == 1 and i in (7, 19, 31):
                author = ["bo", "dee", "fay"][(i - 7) // 12]
                kind, content = "human", NEWS[author]
            out.append(
                {
                    "id": f"m{n}",
                    "session": "team",
                    "channel": "dev",
                    "author": author,
                    "author_kind": kind,
                    "content": content,
                    "created_at": start + day * DAY + i * 600,
                }
            )
            n += 1
    return out


def _items(messages: list[dict[str, object]]) -> list[SummaryItem]:
    return [
        SummaryItem(
            id=str(m["id"]),
            content=str(m["content"]),
            author=str(m["author"]),
            author_kind=str(m["author_kind"]),
            channel="dev",
            created_at=float(m["created_at"]),  # type: ignore[arg-type]
        )
        for m in messages
    ]


def test_stock_phrases_are_no_news_and_what_is_said_once_is() -> None:
    messages = _corpus(1_700_000_000.0)
    background = Background.of(str(m["content"]) for m in messages)
    assert background.measured
    assert background.common("pr")
    assert background.common("ci")
    assert not background.common("hazelnuts")
    assert not background.common("tromsø")
    day = _items(messages[60:120])
    summarizer = ExtractiveSummarizer(background=background)
    facts = summarizer.facts(day)
    said = {sentence for _, sentence, _ in facts}
    assert set(NEWS.values()) <= said
    # A stock phrase naming an acronym ("the PR queue is slow again") is no fact of its own.
    assert not any(s.startswith(tuple(TOPICS)) for s in said)
    summary = summarizer.summarize(day, max_tokens=300, tokenizer=CL100K)
    text = summary.render()
    assert lost_facts(day, text, background) == []
    for line in NEWS.values():
        assert line in text
    # The bot's alerts from one template are one noise line, not events.
    assert any(line.startswith("buildbot x") for line in summary.spam_patterns)
    assert "Build #" not in "\n".join(summary.main_events)
    # Without the background the same day keeps the acronym lines as facts: more text.
    plain = ExtractiveSummarizer().summarize(day, max_tokens=300, tokenizer=CL100K)
    assert len(ExtractiveSummarizer().facts(day)) > len(facts)
    assert CL100K.count(plain.render()) >= CL100K.count(text)


def test_a_small_corpus_is_not_judged_by_rarity() -> None:
    background = Background.of(["the build is slow", "I was born in Tromsø"])
    assert not background.measured
    summarizer = ExtractiveSummarizer(background=background)
    assert summarizer.background is None
    assert summarizer.with_background(background).background is None


def test_a_fact_is_kept_once() -> None:
    facts = [
        ("m1", "Launch on 2031-03-02 in Oslo.", ("2031-03-02", "Oslo")),
        ("m2", "Oslo it is", ("Oslo",)),
        ("m3", "and 2031-03-02 again", ("2031-03-02",)),
        ("m4", "Oslo, 2031-03-09 then", ("Oslo", "2031-03-09")),
    ]
    assert [f[0] for f in novel_facts(facts)] == ["m1", "m4"]


def test_compaction_keeps_the_news_and_the_plan_says_what_apply_does(
    tmp_path: Path, clock: Clock
) -> None:
    start = clock.now - 30 * DAY
    with Engine.open(tmp_path / "news.db", clock=clock) as engine:
        engine.ingest(_corpus(start))
        policy = CompactionPolicy(older_than=7 * DAY)
        plan = engine.compact_plan(policy=policy)
        assert plan.background is not None
        assert plan.background.measured
        previews = engine.compact_preview(plan)
        result = engine.compact(plan)
        assert result.compacted == plan.memories > 0
        assert len(result.summaries) == len(previews) == len(plan.clusters)
        stored = {s.id: s.content for s in engine.store.summaries("default")}
        assert stored == {p.summary_id: p.text for p in previews}
        texts = "\n".join(stored.values())
        for line in NEWS.values():
            assert line in texts
        # The summaries are a small share of what they stand for.
        raw = sum(CL100K.count(str(m["content"])) for m in _corpus(start))
        assert CL100K.count(texts) < 0.25 * raw
        # A question about one kept line gets that line from its summary, not the whole of it.
        context = engine.assemble(
            session="team", query="who cannot eat hazelnuts?", model="gpt-4o", budget=2000
        )
        shown = "\n".join(str(m.get("content") or "") for m in context.messages)
        assert NEWS["dee"] in shown


def test_an_excerpt_is_the_header_and_the_lines_that_match() -> None:
    text = "\n".join(
        [
            "Summary of 40 messages, 2031-01-05 08:00-18:00 UTC",
            "Events:",
            "- [m1] 08:10 ana: the wiki looks fine now",
            "- [m2] 09:00 dee: heads up: I cannot eat hazelnuts",
            "- [m3] 10:00 bo: the wiki is slow again",
            "- [m4] 11:00 cy: the wiki needs a look",
            "Noise:",
            "- buildbot x9, last: Build #1 passed",
        ]
    )
    assert summary_excerpt(text, "who cannot eat hazelnuts?") == "\n".join(
        [text.splitlines()[0], "- [m2] 09:00 dee: heads up: I cannot eat hazelnuts"]
    )
    # "wiki" is on most lines: it tells no line apart.
    assert summary_excerpt(text, "wiki") is None
    assert summary_excerpt(text, "nothing here matches") is None


@settings(max_examples=200, deadline=None)
@given(
    lines=st.lists(
        st.text(min_size=1, max_size=30).filter(lambda t: t.splitlines() == [t]), max_size=12
    ),
    query=st.text(max_size=40),
)
def test_an_excerpt_only_ever_holds_lines_of_its_summary_in_order(
    lines: list[str], query: str
) -> None:
    content = "\n".join(["Summary of n messages", *(f"- {line}" for line in lines)])
    excerpt = summary_excerpt(content, query)
    if excerpt is None:
        return
    got = excerpt.splitlines()
    assert got[0] == "Summary of n messages"
    source = content.splitlines()
    positions = [source.index(line, 1) for line in got[1:]]
    assert positions == sorted(positions)
    assert 1 <= len(got) - 1 <= 6
