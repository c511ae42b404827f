"""Tests of ctxwarden.summarize: the Summary value, the extractive and the LLM summarisers.

The LLM summariser runs against a real HTTP server on loopback with scripted replies
(tests/llmserver.py), through the real LLMClient.
"""

from __future__ import annotations

import json
import logging
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ctxwarden.errors import InputError, SummarizeError
from ctxwarden.llm import LLMClient
from ctxwarden.summarize import (
    ExtractiveSummarizer,
    Summarizer,
    Summary,
    SummaryItem,
    line_sources,
    truncate_summary,
)
from ctxwarden.summarize_llm import LLMSummarizer
from ctxwarden.tokens import get_tokenizer
from ctxwarden.types import parse_time
from llmserver import Reply, ScriptedServer


class WordCounter:
    """A real, simple tokenizer: one token per whitespace-separated word."""

    def count(self, text: str) -> int:
        return len(text.split())


WORDS = WordCounter()
O200K = get_tokenizer("o200k_base")
T0 = parse_time("2026-03-01T08:00:00Z")


def item(
    n: int, content: str, author: str = "alice", kind: str = "human", **extra: Any
) -> SummaryItem:
    return SummaryItem(
        id=f"m{n}",
        content=content,
        author=author,
        author_kind=kind,
        channel=extra.pop("channel", "dev"),
        created_at=T0 + 60 * n,
        **extra,
    )


CHAT = [
    item(1, "morning all", "bob"),
    item(2, "We decided to move the release of Atlas to Friday March 13.", "alice"),
    item(3, "Deploy #101 of api to staging succeeded (commit 1a2b3c4d)", "deploybot", "bot"),
    item(4, "Who owns the Grafana dashboards for billing?", "carol"),
    item(5, "lol", "bob"),
    item(6, "Deploy #102 of api to staging succeeded (commit 5e6f7a8b)", "deploybot", "bot"),
    item(7, "I grew up in Ghent before moving here.", "dave"),
    item(8, "What port does the Redis cache use?", "erin"),
    item(9, "Redis cache listens on port 6380 now, changed it yesterday.", "frank"),
    item(10, "Deploy #103 of api to staging succeeded (commit 9c0d1e2f)", "deploybot", "bot"),
    item(11, "ok thanks", "erin"),
    item(12, "the coffee machine is acting up again", "bob"),
]


# ---------------------------------------------------------------- Summary


def full_summary() -> Summary:
    return Summary(
        time_range=("2026-03-01T08:00:00Z", "2026-03-01T09:00:00Z"),
        key_entities=("Atlas", "alice"),
        main_events=("[m1] bob: hello", "[m2,m3] alice: shipped v2.1"),
        decisions=("[m4] release moved to Friday",),
        open_loops=("[m5] who owns billing?",),
        spam_patterns=("deploybot x3, last: Deploy #103",),
        source_ids=("m1", "m2", "m3", "m4", "m5"),
    )


def test_summary_json_round_trip():
    summary = full_summary()
    data = json.loads(json.dumps(summary.to_json()))
    assert data["time_range"] == {"start": "2026-03-01T08:00:00Z", "end": "2026-03-01T09:00:00Z"}
    assert Summary.from_mapping(data) == summary


def test_summary_from_mapping_normalises_times_and_accepts_pairs():
    summary = Summary.from_mapping(
        {"time_range": ["2026-03-01T08:00:00+00:00", "2026-03-01T10:00:00Z"], "main_events": []}
    )
    assert summary.time_range == ("2026-03-01T08:00:00Z", "2026-03-01T10:00:00Z")
    assert Summary.from_mapping({"time_range": None}).time_range is None


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({"main_events": "one"}, "main_events"),
        ({"decisions": ["ok", 3]}, "decisions[1]"),
        ({"key_entities": [{"name": "x"}]}, "key_entities[0]"),
        ({"summary": "text"}, "summary"),
        ({"time_range": {"start": "yesterday", "end": "2026-03-01T08:00:00Z"}}, "time_range.start"),
        ({"time_range": "2026-03-01"}, "time_range"),
        ({"time_range": ["2026-03-02T00:00:00Z", "2026-03-01T00:00:00Z"]}, "time_range"),
        ({"source_ids": [1]}, "source_ids[0]"),
    ],
)
def test_summary_from_mapping_names_the_bad_field(data: dict[str, Any], field: str):
    with pytest.raises(InputError) as info:
        Summary.from_mapping(data)
    assert info.value.field == field


def test_summary_from_mapping_rejects_non_objects():
    with pytest.raises(InputError):
        Summary.from_mapping(["not", "an", "object"])  # type: ignore[arg-type]


def test_render_is_compact_and_leaves_out_empty_sections():
    text = full_summary().render()
    assert text.splitlines() == [
        "Summary of 5 messages, 2026-03-01 08:00-09:00 UTC",
        "Entities: Atlas, alice",
        "Events:",
        "- [m1] bob: hello",
        "- [m2,m3] alice: shipped v2.1",
        "Decisions:",
        "- [m4] release moved to Friday",
        "Open questions:",
        "- [m5] who owns billing?",
        "Noise:",
        "- deploybot x3, last: Deploy #103",
    ]
    assert Summary(source_ids=("a",)).render() == "Summary of 1 message"


def test_line_sources():
    assert line_sources("[m2,m3] alice: shipped") == ("m2", "m3")
    assert line_sources("[m2, m3] x") == ("m2", "m3")
    assert line_sources("plain [m1] text") == ()


def test_summary_item_of_copies_matching_attributes():
    memory = SimpleNamespace(
        id="m1",
        content="hi",
        author="a",
        author_kind="bot",
        channel="c",
        created_at=1.0,
        kind="message",
        thread_id=None,
        tenant="t",
    )
    assert SummaryItem.of(memory) == SummaryItem(
        id="m1", content="hi", author="a", author_kind="bot", channel="c", created_at=1.0
    )


def test_truncate_summary_drops_from_the_longest_section_first():
    summary = full_summary()
    size = WORDS.count(summary.render())
    cut = truncate_summary(summary, max_tokens=size - 3, tokenizer=WORDS)
    assert WORDS.count(cut.render()) <= size - 3
    assert cut.decisions == summary.decisions
    assert cut.source_ids == summary.source_ids
    assert truncate_summary(summary, max_tokens=size, tokenizer=WORDS) == summary
    with pytest.raises(SummarizeError, match="max_tokens=2"):
        truncate_summary(summary, max_tokens=2, tokenizer=WORDS)


# ---------------------------------------------------------------- ExtractiveSummarizer


def test_extractive_is_a_summarizer():
    assert isinstance(ExtractiveSummarizer(), Summarizer)


def test_extractive_fills_the_structure():
    summary = ExtractiveSummarizer().summarize(CHAT, max_tokens=300, tokenizer=O200K)
    assert O200K.count(summary.render()) <= 300
    assert summary.source_ids == tuple(f"m{n}" for n in range(1, 13))
    assert summary.time_range == ("2026-03-01T08:01:00Z", "2026-03-01T08:12:00Z")
    assert summary.decisions == (
        "[m2] 08:02 alice: We decided to move the release of Atlas to Friday March 13.",
    )
    # carol's question got no answer; erin's did (frank answered about the Redis port)
    assert summary.open_loops == ("[m4] 08:04 carol: Who owns the Grafana dashboards for billing?",)
    assert any(
        line.startswith("[m9] 08:09 frank: Redis cache listens on port 6380")
        for line in summary.main_events
    )
    assert summary.spam_patterns == (
        "deploybot x3, last: Deploy #103 of api to staging succeeded (commit 9c0d1e2f)",
    )
    assert not any("Deploy #" in line for line in summary.main_events)
    # An entity is named once: in its line when a line is kept, else on the entities line.
    lines = "\n".join((*summary.main_events, *summary.decisions, *summary.open_loops))
    for name in ("Atlas", "Ghent"):
        assert (name in lines) != (name in summary.key_entities)
    assert not any(name in lines for name in summary.key_entities)
    # chatter is never an event
    text = summary.render()
    assert "lol" not in text
    assert "ok thanks" not in text
    for line in (*summary.main_events, *summary.decisions, *summary.open_loops):
        assert set(line_sources(line)) <= set(summary.source_ids)


def test_extractive_prefers_facts_over_chatter_when_tight():
    summary = ExtractiveSummarizer().summarize(CHAT, max_tokens=60, tokenizer=O200K)
    text = summary.render()
    assert O200K.count(text) <= 60
    assert "Friday March 13" in text
    assert "coffee machine" not in text


def test_extractive_without_citations():
    summary = ExtractiveSummarizer(cite_sources=False).summarize(
        CHAT, max_tokens=200, tokenizer=WORDS
    )
    assert summary.decisions[0].startswith("08:02 alice: We decided")
    assert summary.source_ids[0] == "m1"


def test_extractive_is_deterministic():
    first = ExtractiveSummarizer().summarize(CHAT, max_tokens=120, tokenizer=O200K)
    again = ExtractiveSummarizer().summarize(list(CHAT), max_tokens=120, tokenizer=O200K)
    assert first == again


def test_extractive_long_sentences_are_shortened():
    # No digits, no names: not a fact, so shortened at max_sentence_tokens.
    long_text = "the migration plan covers " + " ".join("table" for _ in range(300)) + "."
    summary = ExtractiveSummarizer(max_sentence_tokens=20).summarize(
        [item(1, long_text)], max_tokens=100, tokenizer=WORDS
    )
    [line] = summary.main_events
    assert line.endswith(" ...")
    assert WORDS.count(line) <= 20 + 3


def test_extractive_summarises_summaries():
    first = ExtractiveSummarizer().summarize(CHAT[:6], max_tokens=200, tokenizer=O200K)
    second = ExtractiveSummarizer().summarize(CHAT[6:], max_tokens=200, tokenizer=O200K)
    rolled = [
        SummaryItem(id="s1", content=first.render(), kind="summary", created_at=T0),
        SummaryItem(id="s2", content=second.render(), kind="summary", created_at=T0 + 600),
    ]
    summary = ExtractiveSummarizer().summarize(rolled, max_tokens=200, tokenizer=O200K)
    assert summary.source_ids == ("s1", "s2")
    assert any("Friday March 13" in line for line in summary.decisions)
    # The lines keep the citations (and times) of the original messages.
    assert any(line.startswith("[m2] 08:02 alice: ") for line in summary.decisions)
    assert any("deploybot x" in line for line in summary.spam_patterns)
    assert "Atlas" in summary.render()  # in its decision line (an entity is named once)


@pytest.mark.parametrize(
    ("items", "max_tokens", "error", "field"),
    [
        ([], 100, InputError, "items"),
        (CHAT, 0, InputError, "max_tokens"),
        (CHAT, True, InputError, "max_tokens"),
        ([SummaryItem(id="", content="x")], 100, InputError, "items[0].id"),
    ],
)
def test_extractive_rejects_bad_input(
    items: list[SummaryItem], max_tokens: int, error: type[Exception], field: str
):
    with pytest.raises(error) as info:
        ExtractiveSummarizer().summarize(items, max_tokens=max_tokens, tokenizer=WORDS)
    assert getattr(info.value, "field", None) == field


def test_extractive_budget_below_the_header_is_a_summarize_error():
    with pytest.raises(SummarizeError, match="raise max_tokens"):
        ExtractiveSummarizer().summarize(CHAT, max_tokens=3, tokenizer=O200K)


words = st.text(alphabet="abcdefghij XYZ?.!0123456789#@", min_size=0, max_size=80)
items_strategy = st.lists(
    st.builds(
        lambda n, text, author, bot: item(n, text, author, "bot" if bot else "human"),
        st.integers(0, 10_000),
        words,
        st.sampled_from(["ann", "bo", "cy", "rssbot"]),
        st.booleans(),
    ),
    min_size=1,
    max_size=25,
)


@settings(max_examples=60, deadline=None)
@given(items_strategy, st.integers(40, 400))
def test_extractive_never_exceeds_the_budget_and_covers_all_inputs(
    items: list[SummaryItem], max_tokens: int
):
    summary = ExtractiveSummarizer().summarize(items, max_tokens=max_tokens, tokenizer=O200K)
    assert O200K.count(summary.render()) <= max_tokens
    assert summary.source_ids == tuple(dict.fromkeys(i.id for i in items))
    assert summary == ExtractiveSummarizer().summarize(
        items, max_tokens=max_tokens, tokenizer=O200K
    )


# ---------------------------------------------------------------- LLMSummarizer over real HTTP

GOOD = {
    "time_range": {"start": "2026-01-01T00:00:00Z", "end": "2026-01-02T00:00:00Z"},
    "key_entities": ["Atlas", "Redis"],
    "main_events": ["frank moved Redis to port 6380"],
    "decisions": ["Atlas release moved to Friday March 13"],
    "open_loops": ["who owns the Grafana dashboards for billing"],
    "spam_patterns": ["deploybot x3: deploy succeeded"],
    "source_ids": ["m2", "m9", "m999"],
}


def run_llm(script: list[Any], max_tokens: int = 200, **options: Any):
    # These tests are about reading the model's JSON: one re-ask, no fact check (GOOD keeps few
    # of CHAT's facts); tests/test_summarize_llm.py checks the facts.
    options = {"retries": 1, "keep_facts": False, **options}
    with (
        ScriptedServer(script) as server,
        LLMClient(server.url, "sk-x", model="tiny", backoff=0.001, max_retries=0) as client,
    ):
        outcome = LLMSummarizer(client, **options).summarize_detailed(
            CHAT, max_tokens=max_tokens, tokenizer=O200K
        )
    return outcome, server


def test_llm_valid_json_first_time():
    outcome, server = run_llm([json.dumps(GOOD)])
    summary = outcome.summary
    assert outcome.calls == 1
    assert outcome.repairs == ()
    assert not outcome.reasked_invalid
    assert not outcome.reasked_shorter
    assert not outcome.truncated
    assert summary.decisions == ("Atlas release moved to Friday March 13",)
    # ids and times come from the inputs, not from the model (m999 was made up)
    assert summary.source_ids == tuple(f"m{n}" for n in range(1, 13))
    assert summary.time_range == ("2026-03-01T08:01:00Z", "2026-03-01T08:12:00Z")
    [request] = server.chat_requests()
    # constrained decoding: the reply's JSON Schema, in OpenAI's field (tried first by "auto")
    assert request.body["response_format"]["type"] == "json_schema"
    schema = request.body["response_format"]["json_schema"]["schema"]
    assert schema["additionalProperties"] is False
    assert outcome.structured_output == "json_schema"
    assert request.body["model"] == "tiny"
    prompt = request.body["messages"][1]["content"]
    assert "[m2] 2026-03-01T08:02Z #dev alice: We decided" in prompt
    assert "under 200 tokens" in prompt


def test_llm_fenced_json_with_python_literals_is_repaired_without_a_reask():
    fenced = "Here is the summary:\n```json\n" + repr(GOOD) + "\n```"
    outcome, server = run_llm([fenced])
    assert outcome.calls == 1
    assert "code_fence" in outcome.repairs
    assert "single_quotes" in outcome.repairs
    assert outcome.summary.key_entities == ("Atlas", "Redis")
    assert len(server.chat_requests()) == 1


def test_llm_broken_then_valid_reasks_once_with_the_error():
    outcome, server = run_llm(["I cannot do JSON today.", json.dumps(GOOD)])
    assert outcome.calls == 2
    assert outcome.reasked_invalid
    second = server.chat_requests()[1].body["messages"]
    assert second[-2] == {"role": "assistant", "content": "I cannot do JSON today."}
    assert "not valid: the reply is not JSON" in second[-1]["content"]
    assert outcome.summary.main_events == ("frank moved Redis to port 6380",)


def test_llm_missing_field_is_invalid_and_reasked():
    partial = {k: v for k, v in GOOD.items() if k != "open_loops"}
    outcome, server = run_llm([json.dumps(partial), json.dumps(GOOD)])
    assert outcome.reasked_invalid
    assert "missing: open_loops" in server.chat_requests()[1].body["messages"][-1]["content"]


def test_llm_always_broken_is_a_summarize_error_never_a_placeholder():
    with pytest.raises(SummarizeError, match="rejected 2 time") as info:
        run_llm(["{broken", '{"main_events": [1, 2]'])
    assert info.value.reason == "invalid"


def test_llm_wrong_types_twice_names_the_field():
    bad = dict(GOOD, decisions=[{"what": "x"}])
    with pytest.raises(SummarizeError, match=r"decisions\[0\]"):
        run_llm([json.dumps(bad), json.dumps(bad)])


def test_llm_extra_keys_and_strings_are_repaired_deterministically():
    sloppy = dict(GOOD, summary="a prose summary", open_loops="nothing open")
    outcome, _ = run_llm([json.dumps(sloppy)])
    assert outcome.calls == 1
    assert "extra_keys_dropped" in outcome.repairs
    assert "string_as_list" in outcome.repairs
    assert outcome.summary.open_loops == ("nothing open",)


def test_llm_too_long_is_shortened_by_asking_again():
    long = dict(GOOD, main_events=[f"event number {n} with some words" for n in range(14)])
    outcome, server = run_llm([json.dumps(long), json.dumps(GOOD)], max_tokens=120)
    assert outcome.reasked_shorter
    assert not outcome.truncated
    assert outcome.calls == 2
    assert O200K.count(outcome.summary.render()) <= 120
    assert "the limit is 120" in server.chat_requests()[1].body["messages"][-1]["content"]


def test_llm_still_too_long_is_truncated_as_last_resort(caplog: pytest.LogCaptureFixture):
    long = dict(GOOD, main_events=[f"event number {n} with some words" for n in range(14)])
    caplog.set_level(logging.WARNING, logger="ctxwarden.summarize")
    outcome, _ = run_llm([json.dumps(long), json.dumps(long)], max_tokens=120)
    assert outcome.truncated
    assert O200K.count(outcome.summary.render()) <= 120
    assert outcome.summary.decisions == tuple(GOOD["decisions"])
    assert outcome.summary.main_events[0] == "event number 0 with some words"
    assert any("truncated" in r.getMessage() for r in caplog.records)


def test_llm_upstream_failure_is_a_summarize_error():
    failing = [Reply(status=500, body={"error": {"message": "model crashed"}})]
    with pytest.raises(SummarizeError, match="model crashed") as info:
        run_llm(failing)
    assert info.value.__cause__ is not None


def test_llm_structured_output_off_sends_no_response_format():
    _, server = run_llm([json.dumps(GOOD)], structured_output="off")
    assert "response_format" not in server.chat_requests()[0].body


def test_llm_summarize_returns_the_summary():
    with (
        ScriptedServer([json.dumps(GOOD)]) as server,
        LLMClient(server.url, model="tiny", max_retries=0) as client,
    ):
        summarizer = LLMSummarizer(client, keep_facts=False)
        assert isinstance(summarizer, Summarizer)
        summary = summarizer.summarize(CHAT, max_tokens=200, tokenizer=O200K)
    assert summary.key_entities == ("Atlas", "Redis")


def test_extractive_stock_phrases_lose_to_a_specific_fact():
    stock = [
        item(n, f"the {thing} broke twice before noon, anyone else seeing this?", who)
        for n, (thing, who) in enumerate(
            [("build", "ann"), ("wiki", "bo"), ("printer", "cy"), ("vpn", "dee"), ("kettle", "ed")]
        )
    ]
    fact = item(9, "my new work laptop is a Framework 13 with 64 GB", "fay")
    summary = ExtractiveSummarizer().summarize([*stock, fact], max_tokens=70, tokenizer=O200K)
    text = summary.render()
    assert "Framework 13 with 64 GB" in text
    assert "broke twice" not in text
