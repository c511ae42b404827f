"""Assembly: budgets, blocks, order, tool-call groups, report, inclusion log, exact counts."""

from __future__ import annotations

import itertools
import json
import re
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ctxwarden import BudgetError, Engine, EngineConfig, tokens
from ctxwarden.embed import StaticEmbedder
from ctxwarden.models import default_registry


def _history(n: int, *, words: int = 30, session: str = "s") -> list[dict[str, Any]]:
    return [
        {
            "id": f"h{i}",
            "session": session,
            "channel": "general",
            "author": ["ana", "bo", "cy"][i % 3],
            "content": f"message {i} " + " ".join(f"word{(i * 7 + j) % 97}" for j in range(words)),
            "created_at": 1_700_000_000 + i * 60,
        }
        for i in range(n)
    ]


def _real_count(context: Any, model: str, tools: Any = ()) -> int:
    spec = default_registry().resolve(model)
    tok = tokens.get_tokenizer(spec.tokenizer)
    fmt = tokens.get_chat_format(spec.chat_format, tok)
    return tokens.count_messages(tok, fmt, list(context.messages), tools)


def test_recent_is_chronological_and_within_budget(engine: Engine) -> None:
    engine.ingest(_history(200))
    context = engine.assemble(session="s", model="gpt-4o", budget=1000)
    assert context.tokens <= 1000
    assert context.tokens == _real_count(context, "gpt-4o")
    ids = [int(i[1:]) for i in context.included]
    assert ids == sorted(ids)
    assert ids[-1] == 199  # the newest message is always there
    assert context.tokens >= 0.95 * 1000  # enough material: the budget is used


def test_related_finds_old_messages_for_the_query(engine: Engine) -> None:
    history = _history(300)
    history[5]["content"] = "the spare office key is taped under the blue plant pot"
    engine.ingest(history)
    context = engine.assemble(session="s", query="where is the spare office key?", budget=1500)
    assert "h5" in context.included
    related = context.report.block("related")
    assert related is not None
    assert "h5" in related.items
    assert context.messages[-1] == {"role": "user", "content": "where is the spare office key?"}
    assert context.tokens == _real_count(context, "gpt-4o")
    candidate = next(c for c in context.report.candidates if c.id == "h5")
    assert candidate.included
    assert candidate.score is not None


def test_a_memory_appears_once(engine: Engine) -> None:
    engine.ingest(_history(20))
    context = engine.assemble(session="s", query="word3 word10 message", budget=4000)
    assert len(context.included) == len(set(context.included))


def test_tool_call_and_result_stay_together(engine: Engine) -> None:
    records: list[dict[str, Any]] = _history(40, words=40)
    records += [
        {"id": "call", "session": "s", "role": "assistant", "content": "",
         "tool_calls": [{"id": "c1", "function": {"name": "lookup", "arguments": "{\"q\": 1}"}}],
         "created_at": 1_700_100_000},
        {"id": "result", "session": "s", "role": "tool", "tool_call_id": "c1",
         "content": json.dumps({"rows": list(range(60))}), "created_at": 1_700_100_001},
        {"id": "after", "session": "s", "role": "assistant", "content": "done",
         "created_at": 1_700_100_002},
    ]  # fmt: skip
    engine.ingest(records)
    for budget in range(120, 900, 7):
        context = engine.assemble(session="s", budget=budget)
        assert ("call" in context.included) == ("result" in context.included), budget
        assert context.tokens <= budget
        assert context.tokens == _real_count(context, "gpt-4o")
        if "result" in context.included:
            position = context.included.index("result")
            assert context.included[position - 1] == "call"


def test_pinned_memories_are_persistent(engine: Engine) -> None:
    engine.ingest(_history(100))
    engine.ingest([{"id": "p1", "session": "s", "content": "Always answer in French.",
                    "pinned": True, "created_at": 1_600_000_000}])  # fmt: skip
    context = engine.assemble(session="s", budget=2000, system="You are helpful.")
    # Memory is data, never instructions (issue 20): a pin is a quoted, attributed line in the
    # memory-data message, not part of the system prompt.
    assert context.messages[0] == {"role": "system", "content": "You are helpful."}
    assert context.messages[1]["role"] == "user"
    line = "## Persistent memory\n[2020-09-13 12:26] user: Always answer in French.\n"
    assert line in context.messages[1]["content"]
    assert context.included[0] == "p1"
    assert context.tokens == _real_count(context, "gpt-4o")


def test_fixed_costs_over_the_cap_is_a_clear_error(engine: Engine) -> None:
    with pytest.raises(BudgetError, match="system prompt, tools and query take"):
        engine.assemble(session="s", budget=50, system="word " * 200)


def test_inclusion_log_and_access_stats(engine: Engine) -> None:
    engine.ingest(_history(10))
    context = engine.assemble(session="s", budget=5000)
    logged = engine.store.inclusions(context.id)
    assert [row["memory_id"] for row in logged] == list(context.included)
    assert all(row["tokens"] > 0 for row in logged)
    assert engine.get("h3").access_count == 1
    engine.assemble(session="s", budget=5000)
    assert engine.get("h3").access_count == 2
    assert engine.stats()["contexts"] == 2


def test_report_explains_blocks_and_candidates(engine: Engine) -> None:
    engine.ingest(_history(100))
    context = engine.assemble(session="s", query="word5", budget=800)
    report = context.report
    names = [b.name for b in report.blocks]
    assert names == ["persistent", "summaries", "related", "recent", "scratch"]
    assert sum(b.used for b in report.blocks) + sum(report.fixed.values()) >= context.tokens - 8
    assert any(not c.included for c in report.candidates)
    assert all(c.reason for c in report.candidates)
    json.dumps(context.to_dict())


def test_report_says_how_retrieval_was_sized(engine: Engine) -> None:
    # Every size retrieval chose for a context is in its report, and grows with the block.
    engine.ingest(_history(300))
    small = engine.assemble(session="s", query="word5", budget=1000).report
    large = engine.assemble(session="s", query="word5", budget=8000).report
    keys = ["related_tokens", "candidates", "author_candidates", "anchors", "rrf_k"]
    assert list(small.retrieval) == list(large.retrieval) == keys
    for key in ("related_tokens", "anchors", "rrf_k"):
        assert 0 < small.retrieval[key] < large.retrieval[key], key
    assert small.retrieval["related_tokens"] <= small.cap
    assert large.to_dict()["retrieval"] == dict(large.retrieval)
    # No query, no retrieval: nothing to size.
    assert engine.assemble(session="s", budget=1000).report.retrieval == {}


def test_report_candidates_read_like_a_tuple(engine: Engine) -> None:
    # The entries are made when first read: the count, order and equality must be those of the
    # tuple of entries, and reading twice gives the same objects.
    engine.ingest(_history(100))
    engine.embed_pending()  # the same store for both: no backlog left to the background worker
    a = engine.assemble(session="s", query="word5", budget=800, log_inclusions=False).report
    b = engine.assemble(session="s", query="word5", budget=800, log_inclusions=False).report
    entries = tuple(a.candidates)
    assert len(a.candidates) == len(entries) > 10
    assert a.candidates[0] is entries[0]
    assert a.candidates[-1] is entries[-1]
    assert a.candidates[1:3] == entries[1:3]
    assert isinstance(a.candidates[1:3], tuple)
    assert a.candidates == entries == b.candidates
    assert a == b
    assert a.candidates != entries[:-1]
    assert [c.to_dict() for c in a.candidates] == a.to_dict()["candidates"]
    assert all(isinstance(c.components, dict) for c in entries)


def test_same_inputs_same_context(engine: Engine) -> None:
    engine.ingest(_history(120))
    # The same inputs include the store's vectors: a backlog past `assemble_embed_limit` is
    # still being embedded in the background between two calls.
    engine.embed_pending()
    a = engine.assemble(session="s", query="word7 message", budget=1200, log_inclusions=False)
    b = engine.assemble(session="s", query="word7 message", budget=1200, log_inclusions=False)
    assert a.messages == b.messages
    assert a.included == b.included


def test_assemble_snapshot(engine: Engine, snapshot: Any) -> None:
    engine.ingest(_history(12, words=8))
    engine.ingest([{"id": "p", "session": "s", "content": "The team is called Otters.",
                    "pinned": True, "created_at": 1_600_000_000}])  # fmt: skip
    engine.embed_pending()  # the same vectors whatever the load (see the next test)
    context = engine.assemble(
        session="s", query="word40 otters", budget=360, system="Be brief.", log_inclusions=False
    )
    assert {"messages": list(context.messages), "included": list(context.included),
            "tokens": context.tokens} == snapshot  # fmt: skip


def test_assemble_snapshot_with_related_memory(engine: Engine, snapshot: Any) -> None:
    # Stored memory (pinned and retrieved) goes in its own user-role message framed as quoted
    # data, never in the system message (issue 20: memory is data, never instructions).
    engine.ingest(_history(30, words=8))
    engine.ingest([{"id": "p", "session": "s", "content": "The team is called Otters.",
                    "pinned": True, "created_at": 1_600_000_000}])  # fmt: skip
    # Every vector first: assemble's catch-up is bounded by time (assemble_embed_seconds), and
    # loading MiniLM alone may pass it on a loaded machine (what it leaves is found by words).
    engine.embed_pending()
    context = engine.assemble(
        session="s", query="word40 otters", budget=480, system="Be brief.", log_inclusions=False
    )
    assert context.messages[0] == {"role": "system", "content": "Be brief."}
    assert "user: The team is called Otters." in context.messages[1]["content"]
    assert [m["role"] for m in context.messages[:2]] == ["system", "user"]
    assert "Related" not in context.messages[0]["content"]
    assert context.tokens == _real_count(context, "gpt-4o")
    assert {"messages": list(context.messages), "included": list(context.included),
            "tokens": context.tokens} == snapshot  # fmt: skip


# Any text the boundary accepts: all of Unicode but NUL (refused at ingest and in assemble's
# arguments, tests/test_boundary.py). Lone surrogates are refused too, and hypothesis draws
# them when only `exclude_characters` is given (it did in session 9): their category is out.
_ACCEPTED = st.characters(exclude_characters="\x00", exclude_categories=("Cs",))

TEXT = st.one_of(
    st.text(_ACCEPTED, min_size=1, max_size=300),
    st.text(alphabet="日本語中文한국어テキスト漢字", min_size=1, max_size=200),
    st.text(alphabet="😀🎉👍🏽🔥✨🧪🚀", min_size=1, max_size=80),
    st.builds(
        lambda d: json.dumps(d),
        st.dictionaries(st.text(max_size=10), st.integers() | st.text(max_size=20), max_size=8),
    ),
    st.sampled_from(
        ["def f(x):\n    return {'a': [1, 2, 3]}\n", "SELECT * FROM t WHERE a = '<|endoftext|>';",
         "    indented\n\n\nlines\t\ttabs  ", "<|im_start|>user\nhi<|im_end|>"]
    ),
)  # fmt: skip


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    contents=st.lists(TEXT, min_size=1, max_size=25),
    budget=st.integers(min_value=256, max_value=262_144),
    model=st.sampled_from(["gpt-4o", "gpt-4", "qwen2.5-7b-instruct", "llama-3.1-8b-instruct"]),
    query=st.one_of(st.none(), TEXT),
    system=st.one_of(st.none(), st.text(_ACCEPTED, min_size=1, max_size=200)),
)
def test_never_over_budget(
    contents: list[str], budget: int, model: str, query: str | None, system: str | None
) -> None:
    # The static model (~7,000 texts a second): the vector path runs in every example at a
    # cost the property's 60 stores of 25 random texts can afford; MiniLM's vectors are no
    # different to the budget.
    with Engine.open(":memory:", embedder=StaticEmbedder()) as e:
        records = [
            {"id": f"x{i}", "session": "s", "author": "ana", "content": c,
             "created_at": 1_700_000_000 + i, "pinned": i % 7 == 3}
            for i, c in enumerate(contents) if c.strip() and "\x00" not in c
        ]  # fmt: skip
        if records:
            e.ingest(records)
        try:
            context = e.assemble(
                session="s", query=query, model=model, budget=budget, system=system
            )
        except BudgetError:
            return  # the system prompt and query alone do not fit: a clear error, not an overflow
        assert context.tokens <= context.report.cap <= budget
        assert _real_count(context, model) <= context.tokens


@pytest.mark.parametrize(
    ("last", "tail"),
    [
        # '""}' costs two tokens where '""}\n' cost one.
        ('""}', '""}\n'),
        # A memory of several lines is JSON-quoted on one line (it cannot forge lines).
        ("0\n 0", 'ana: "0\\n 0"\n'),
    ],
)
def test_trimming_template_counts_the_last_data_segment_without_its_newline(
    last: str, tail: str
) -> None:
    # Llama 3 trims message content: the persistent block's last memory (in the memory-data
    # message) loses the newline it was counted with at ingest.
    with Engine.open(":memory:") as e:
        e.ingest(
            [
                {"id": f"x{i}", "session": "s", "author": "ana", "content": c,
                 "created_at": 1_700_000_000 + i, "pinned": i == 3}
                for i, c in enumerate(["0", "0", "0", last])
            ]
        )  # fmt: skip
        context = e.assemble(session="s", model="llama-3.1-8b-instruct", budget=256)
    assert context.messages[0]["content"].endswith(tail)
    assert context.tokens == _real_count(context, "llama-3.1-8b-instruct")


def test_related_candidates_scale_with_the_lines_the_budget_holds() -> None:
    from ctxwarden.engine import MAX_RELATED_CANDIDATES, related_candidates

    assert related_candidates(3900, 45.0, floor=100) == 100  # 87 lines fit: the floor
    assert related_candidates(15_900, 30.0, floor=100) == 530  # ceil(15,900 / 30)
    assert related_candidates(15_900, 60.0, floor=100) == 265  # longer lines, fewer
    assert related_candidates(900_000, 30.0, floor=100) == MAX_RELATED_CANDIDATES
    assert related_candidates(15_900, 0.0, floor=100) == MAX_RELATED_CANDIDATES  # no div by 0
    assert related_candidates(15_900, 30.0, floor=0) == 0  # retrieval off stays off


def _matching(n: int, *, session: str = "archive") -> list[dict[str, Any]]:
    return [
        {"id": f"m{i}", "session": session, "author": "ana",
         "content": f"deploy note {i}: shard{i % 37} green",
         "created_at": 1_600_000_000 + i * 60}
        for i in range(n)
    ]  # fmt: skip


def test_a_large_budget_fills_the_related_block_past_the_default_candidates(
    engine: Engine,
) -> None:
    # 600 matching lines of ~15 tokens fit a 32k budget's related share: a fixed 100 candidates
    # (the engine's floor) would leave most of them out.
    engine.ingest(_matching(600))
    context = engine.assemble(session="new", query="deploy note", budget=32_000, scope="tenant")
    related = context.report.block("related")
    assert related is not None
    assert len(related.items) == 600
    assert context.tokens == _real_count(context, "gpt-4o")


def test_candidates_follow_the_sessions_line_cost(engine: Engine) -> None:
    # The same budget holds fewer long lines than short ones: a session whose history has long
    # lines asks retrieval for fewer candidates (but at least the floor).
    engine.ingest(_matching(1500))
    engine.ingest([
        {"id": "short", "session": "short", "author": "bo", "content": "ok",
         "created_at": 1_700_000_000},
        {"id": "long", "session": "long", "author": "bo",
         "content": " ".join(f"word{j}" for j in range(150)), "created_at": 1_700_000_000},
    ])  # fmt: skip

    def offered(session: str) -> int:
        context = engine.assemble(
            session=session, query="deploy note", budget=16_000, scope="tenant"
        )
        return sum(1 for c in context.report.candidates if c.block == "related")

    short, long = offered("short"), offered("long")
    assert long < short
    assert long >= EngineConfig().related_candidates  # the floor


def test_report_snapshot_of_every_decision(engine: Engine, snapshot: Any) -> None:
    # Where each candidate went and why (fits, top-up, already in another block, over the
    # block's budget, older than recent reaches), pinned: a faster fill must decide the same.
    engine.ingest(_history(60, words=8))
    engine.ingest(_history(40, words=8, session="other"), session="other")
    engine.ingest([{"id": "p", "session": "s", "content": "The team is called Otters.",
                    "pinned": True, "created_at": 1_600_000_000}])  # fmt: skip
    engine.embed_pending()  # the steady state: every memory has its vector
    context = engine.assemble(
        session="s", query="word40 word41 otters", budget=700, log_inclusions=False
    )
    assert context.report.lexical_only == ()
    decisions = [(c.id, c.block, c.included, c.reason, c.tokens) for c in context.report.candidates]
    reasons = {reason for *_, reason, _ in decisions}
    assert {"fits", "already in another block", "over the block's budget"} <= reasons
    blocks = [(b.name, b.budget, b.used, list(b.items)) for b in context.report.blocks]
    assert {"decisions": decisions, "blocks": blocks, "notes": list(context.report.notes)} == (
        snapshot
    )


def test_related_lines_are_grouped_by_day_and_channel_and_their_tokens_add_up(
    engine: Engine,
) -> None:
    # Three days x two channels of "deploy" talk: the related block shows each day-and-channel
    # group once, under one header, its lines with their time of day only; the first line taken
    # from a group pays for its header, so the included lines' tokens are the block's text.
    day = 86_400
    engine.ingest(
        [
            {"id": f"m{d}{c}{i}", "session": "s", "channel": channel, "author": "ana",
             "content": f"deploy note {d} {c} {i} about the release train",
             "created_at": 1_700_000_000 + d * day + i * 600 + c * 60}
            for d in range(3)
            for c, channel in enumerate(["ops", "dev"])
            for i in range(3)
        ]
        + [{"id": f"n{i}", "session": "s", "content": f"chatter {i} " + "lorem ipsum " * 20,
            "created_at": 1_700_000_000 + 5 * day + i} for i in range(60)]
    )  # fmt: skip
    engine.embed_pending()
    context = engine.assemble(session="s", query="deploy release", model="gpt-4o", budget=1200)
    assert context.tokens == _real_count(context, "gpt-4o")
    data = context.messages[0]["content"]  # the memory-data message (no system prompt)
    block = data.split("## Related earlier messages\n", 1)[1]
    lines = block.splitlines()
    headers = [line for line in lines if line.startswith("[")]
    assert len(headers) == len(set(headers)) >= 2  # each group once
    assert all(re.fullmatch(r"\[\d{4}-\d\d-\d\d( #ops| #dev)?\]", h) for h in headers)
    entries = [line for line in lines if not line.startswith("[")]
    assert all(re.match(r"\d\d:\d\d (ana: deploy note|user: chatter) ", e) for e in entries)
    for header in headers:  # a group's lines follow its header, in time order
        at = lines.index(header)
        group = list(itertools.takewhile(lambda ln: not ln.startswith("["), lines[at + 1 :]))
        assert group
        assert group == sorted(group)
    taken = [c for c in context.report.candidates if c.block == "related" and c.included]
    assert len(taken) == len(entries)
    tok = tokens.get_tokenizer("o200k_base")
    assert sum(c.tokens for c in taken) == tok.count(block)


def _memory(rowid: int, content: str) -> Any:
    from ctxwarden.types import Memory

    return Memory(
        rowid=rowid, id=f"m{rowid}", tenant="default", session="s", channel=None,
        author="ana", author_kind="human", role="user", content=content,
        created_at=1_700_000_000.0 + rowid, thread_id=None, reply_to=None, kind="message",
        pinned=False, name=None, tool_calls=(), tool_call_id=None,
        content_hash=f"hash{rowid}", dup_count=1, last_seen_at=1_700_000_000.0 + rowid,
        access_count=0, last_accessed_at=None, access_score=0.0, included_tokens_total=0,
    )  # fmt: skip


def test_the_top_up_offers_related_memory_before_more_recent_history() -> None:
    # Leftover tokens (rounding, the gap a skipped line leaves) go to retrieval's next line
    # before they become older recent history: recent gets them only when related has
    # nothing left that fits.
    from ctxwarden.assemble import Candidate, Material, fill
    from ctxwarden.budget import chat_policy

    policy = chat_policy()
    limits = policy.limits(window=128_000, budget=1000)

    def plan(related: list[int]) -> Any:
        material = Material(count=lambda text: len(text.split()))
        material.recent = [
            Candidate(memories=(_memory(i, "r"),), tokens=90, text="r") for i in range(20)
        ]
        material.related = [
            Candidate(memories=(_memory(100 + i, "x"),), tokens=cost, score=1.0 - i / 100)
            for i, cost in enumerate(related)
        ]
        return fill(policy, limits, fixed=20, material=material)

    # Related's 784 tokens hold the two 300-token lines; the 190-token one waits for the
    # top-up, where recent's gap (16) and related's (184) make room for it: it goes in
    # before a third recent unit (which the old order, recent first, would have taken).
    many = plan([300, 300, 190])
    assert many.budgets["recent"] == 196
    assert many.budgets["related"] == 784
    assert len(many.chosen["related"]) == 3
    assert len(many.chosen["recent"]) == 2  # its share's worth of 90-token units
    top_ups = [row for row in many.candidates if row[3].startswith("top-up")]
    assert [row[1] for row in top_ups] == ["related"]
    assert sum(many.used.values()) <= 980
    few = plan([300])  # retrieval has little: the rest becomes recent history
    assert len(few.chosen["related"]) == 1
    assert len(few.chosen["recent"]) == 7
    assert sum(few.used.values()) <= 980


@given(
    lines=st.lists(
        st.tuples(st.integers(min_value=1, max_value=300), st.integers(min_value=-1, max_value=9)),
        min_size=1,
        max_size=10,
    ),
    budget=st.integers(min_value=300, max_value=3000),
)
@settings(max_examples=200, deadline=None)
def test_a_neighbour_is_never_shown_without_its_anchor(
    lines: list[tuple[int, int]], budget: int
) -> None:
    # A retrieval neighbour (Candidate.anchor: the rowid of the hit it is context for) goes in
    # only with its anchor, whatever the costs and order; left out, its report says why.
    from ctxwarden.assemble import Candidate, Material, fill
    from ctxwarden.budget import chat_policy

    policy = chat_policy()
    limits = policy.limits(window=128_000, budget=budget)
    material = Material(count=lambda text: len(text.split()))
    material.recent = [Candidate(memories=(_memory(900, "r"),), tokens=50, text="r")]
    material.related = []
    for i, (cost, anchor) in enumerate(lines):
        cand = Candidate(memories=(_memory(100 + i, f"x{i}"),), tokens=cost, score=1.0 - i / 100)
        cand.anchor = 100 + anchor if 0 <= anchor < len(lines) and anchor != i else -1
        material.related.append(cand)
    plan = fill(policy, limits, fixed=20, material=material)
    shown = {m.rowid for c in plan.chosen["related"] for m in c.memories} | {900}
    for cand in plan.chosen["related"]:
        assert cand.anchor < 0 or cand.anchor in shown
    for row in plan.candidates:
        cand = next((c for c in material.related if c.ids[0] == row[0]), None)
        if cand is not None and not row[2] and cand.anchor >= 0 and cand.anchor not in shown:
            assert row[3] == "neighbour of a hit that is not in this context"
    assert sum(plan.used.values()) <= limits.cap - 20


def test_a_neighbour_is_packed_after_its_anchor(engine: Engine) -> None:
    # Retrieval orders a neighbour after its anchor (its value per token at most the
    # anchor's): the question before an answer is shown only with that answer.
    engine.ingest([
        {"id": "q", "session": "s", "author": "bo", "content": "What did you bring?",
         "created_at": 1_700_000_000},
        {"id": "a", "session": "s", "author": "ana", "content":
         "I brought the violin and my old sheet music for the recital, plus the stand, two "
         "spare strings, the rosin my teacher gave me last spring and a folding chair for the "
         "long rehearsal", "created_at":
         1_700_000_060},
        *[{"id": f"n{i}", "session": "s", "author": "cy", "content": f"unrelated note {i}",
           "created_at": 1_700_000_120 + i} for i in range(30)],
    ])  # fmt: skip
    context = engine.assemble(session="s", query="violin recital", budget=4000, scope="tenant")
    rows = [c for c in context.report.candidates if c.block == "related"]
    density = {c.id: c.components["density"] for c in rows}
    question = next(c for c in rows if c.id == "q")
    assert any(k.startswith("neighbour_") for k in question.components)
    assert density["q"] <= density["a"]
    assert {"q", "a"} <= set(context.included)


def test_retrieval_is_sized_by_the_related_block() -> None:
    from ctxwarden.assemble import Candidate, Material, related_budget
    from ctxwarden.assembly import author_candidates, fusion_k, related_anchors, sized_weights
    from ctxwarden.budget import chat_policy
    from ctxwarden.retrieve import RetrievalWeights

    material = Material(count=len)
    material.recent = [Candidate(memories=(_memory(1, "r"),), tokens=10**6, text="r")]
    assert related_budget(chat_policy(), material, 980) == 784  # recent keeps its share
    assert related_budget(chat_policy(), material, 600) == 440  # recent keeps its floor
    assert related_budget(chat_policy(), material, 7980) == 6384
    material.recent = []  # a new session: all of it may be related memory
    assert related_budget(chat_policy(), material, 7980) == 7980
    # Neighbours around `expand` hits per 1,000 related tokens (rounded up, at least one).
    assert [related_anchors(8, t) for t in (0, 100, 724, 1584, 6384)] == [1, 1, 6, 13, 52]
    assert related_anchors(0, 6384) == 0  # expansion off stays off
    # A named author's own nearest turns: `author_candidates` per 1,000 related tokens, at
    # least that many (a 1k block reads as many as before).
    assert [author_candidates(20, t) for t in (0, 724, 1000, 1584, 6384)] == [20, 20, 20, 32,
                                                                              128]  # fmt: skip
    assert author_candidates(0, 6384) == 0  # the list off stays off
    # RRF's k: `rrf_k_per_thousand` per 1,000 related tokens within [2, 60]; 0 keeps `rrf_k`.
    sized = [fusion_k(RetrievalWeights(rrf_k_per_thousand=7), t) for t in (0, 724, 6384, 10**5)]
    assert sized == [2.0, pytest.approx(5.068), pytest.approx(44.688), 60.0]
    assert fusion_k(RetrievalWeights(rrf_k_per_thousand=0, rrf_k=33), 724) == 33
    weights = sized_weights(RetrievalWeights(), 70, 1584)
    assert (weights.candidates, weights.rrf_k) == (70, fusion_k(RetrievalWeights(), 1584))
