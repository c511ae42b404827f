"""Hybrid retrieval and the engine's embedding: real store, real (static, offline) embedder."""

from __future__ import annotations

import time
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import Clock
from ctxwarden.embed import StaticEmbedder
from ctxwarden.engine import Engine, EngineConfig
from ctxwarden.errors import ConfigError, EmbedError
from ctxwarden.retrieve import RetrievalWeights, retrieve

DAY = 86400.0


def _msg(id: str, content: str, at: float, **extra: Any) -> dict[str, Any]:
    return {"id": id, "session": "s", "channel": "general", "author": "ana", "content": content,
            "created_at": at, **extra}  # fmt: skip


def _filler(n: int, start: float) -> list[dict[str, Any]]:
    return [_msg(f"f{i}", f"chatter number {i} about lunch plans and weather", start + i)
            for i in range(n)]  # fmt: skip


class _Renamed(StaticEmbedder):
    """The static model under another name: a different embedding model to the store."""

    def __init__(self, name: str) -> None:
        super().__init__()
        self._name = name


def _related(context: Any) -> list[str]:
    return [c.id for c in context.report.candidates if c.block == "related" and c.included]


def test_retrieval_without_vectors_is_bm25_plus_recency(clock: Clock) -> None:
    now = clock.now
    with Engine.open(":memory:", clock=clock) as engine:
        engine.ingest([
            _msg("old", "the release train leaves on tuesday", now - 60 * DAY),
            _msg("new", "the release train leaves on thursday now", now - 2 * DAY),
            *_filler(40, now - DAY),
        ])  # fmt: skip
        hits = retrieve(engine.store, tenant="default", query="when does the release train leave",
                        now=now, cost=lambda ms: {m.rowid: 10 for m in ms})  # fmt: skip
        assert [h.memory.id for h in hits][:2] == ["new", "old"]
        top = hits[0].components
        assert {"bm25", "bm25_rank", "relevance", "recency", "access", "author", "score"} <= set(
            top
        )
        assert "vector" not in top
        context = engine.assemble(session="s", query="when does the release train leave?",
                                  budget=400)  # fmt: skip
        assert "new" in _related(context)


def test_author_named_in_the_query_is_preferred(clock: Clock) -> None:
    now = clock.now
    with Engine.open(":memory:", clock=clock) as engine:
        engine.ingest([
            _msg("a", "my laptop is a thinkpad", now - 5 * DAY, author="omar"),
            _msg("b", "my laptop is a macbook", now - 4 * DAY, author="lena"),
        ])  # fmt: skip
        hits = retrieve(engine.store, tenant="default", query="which laptop does Omar use?",
                        now=now, cost=lambda ms: {m.rowid: 8 for m in ms})  # fmt: skip
        assert hits[0].memory.id == "a"
        assert hits[0].components["author"] == 1.0
        assert hits[1].components["author"] == 0.0


def test_mmr_keeps_near_identical_memories_from_crowding(clock: Clock) -> None:
    now = clock.now
    with Engine.open(":memory:", clock=clock) as engine:
        engine.ingest([
            _msg("d1", "database migration failed on shard 3 tonight", now - DAY, author="x"),
            _msg("d2", "database migration failed on shard 3 tonight again", now - DAY + 1,
                 author="y"),
            _msg("other", "the migration of the billing database is planned", now - 3 * DAY),
        ])  # fmt: skip
        hits = retrieve(engine.store, tenant="default", query="database migration", now=now,
                        cost=lambda ms: {m.rowid: 10 for m in ms})  # fmt: skip
        order = [h.memory.id for h in hits]
        assert order.index("other") < max(order.index("d1"), order.index("d2"))
        assert max(h.components["mmr_penalty"] for h in hits) > 0


def test_neighbour_expansion_brings_the_question_of_an_answer(clock: Clock) -> None:
    now = clock.now
    with Engine.open(":memory:", clock=clock) as engine:
        engine.ingest([
            _msg("q", "hey, where should we meet for the offsite?", now - 10 * DAY),
            _msg("ans", "Porto, at the riverside venue", now - 10 * DAY + 5, reply_to="q"),
            *_filler(30, now - DAY),
        ])  # fmt: skip
        hits = retrieve(engine.store, tenant="default", query="riverside venue", now=now,
                        cost=lambda ms: {m.rowid: 12 for m in ms})  # fmt: skip
        by_id = {h.memory.id: h for h in hits}
        assert "q" in by_id
        assert by_id["q"].components["neighbour"] == pytest.approx(by_id["ans"].score)
        assert by_id["q"].score < by_id["ans"].score


def test_sync_embedding_enables_vector_candidates(clock: Clock) -> None:
    config = EngineConfig(embed="sync")
    with Engine.open(":memory:", clock=clock, config=config, embedder=StaticEmbedder()) as engine:
        engine.ingest([
            _msg("pet", "my dog barks at the mailman every morning", clock.now - DAY,
                 session="old"),
            *_filler(20, clock.now - DAY),
        ])  # fmt: skip
        assert engine.store.vector_models() == {"minilm-l6-static@1": 21}
        context = engine.assemble(session="s", query="puppy noise", budget=2000, scope="tenant")
        pet = next(c for c in context.report.candidates if c.id == "pet" and c.block == "related")
        assert "vector" in pet.components  # found by meaning: no word in common
        assert "bm25" not in pet.components
        assert pet.included


def test_a_changed_embedding_model_is_detected_never_mixed(tmp_path: Any, clock: Clock) -> None:
    path = tmp_path / "db.sqlite"
    with Engine.open(path, clock=clock, embedder=StaticEmbedder()) as engine:
        engine.ingest(_filler(5, clock.now - DAY))
        assert engine.embed_pending() == 5
    with Engine.open(path, clock=clock, embedder=_Renamed("other@1")) as engine:
        with pytest.raises(EmbedError, match="ctxwarden embed --reembed"):
            engine.embed_pending()
        context = engine.assemble(session="s", query="lunch plans", budget=1000)
        assert any("ctxwarden embed --reembed" in n for n in context.report.notes)
        assert all("vector" not in c.components for c in context.report.candidates)
        assert engine.embed_pending(reembed=True) == 5
        assert engine.store.vector_models() == {"other@1": 5}


def test_background_embedding_does_not_block_ingest(clock: Clock) -> None:
    config = EngineConfig(embed="background", embed_batch=4)
    with Engine.open(":memory:", clock=clock, config=config, embedder=StaticEmbedder()) as engine:
        engine.ingest(_filler(10, clock.now - DAY))
        deadline = time.monotonic() + 30
        while engine.store.vector_models().get("minilm-l6-static@1", 0) < 10:
            assert time.monotonic() < deadline, "background embedding never finished"
            time.sleep(0.01)
    # close() stopped the thread; a new ingest on a closed engine is not attempted


def test_bad_embedding_config_is_a_clear_error() -> None:
    with pytest.raises(ConfigError, match="embed"):
        EngineConfig(embed="later")
    with pytest.raises(ConfigError, match="mmr_lambda"):
        RetrievalWeights(mmr_lambda=2.0)
    with pytest.raises(ConfigError, match="context_share"):
        RetrievalWeights(context_share=-0.5)
    with pytest.raises(ConfigError, match="context_anchors"):
        RetrievalWeights(context_anchors=-1)
    with pytest.raises(ConfigError, match="context_pool"):
        RetrievalWeights(context_pool=0)
    with pytest.raises(ConfigError, match="rrf_k_per_thousand"):
        RetrievalWeights(rrf_k_per_thousand=-1)


def test_an_unreachable_embedder_degrades_to_words(clock: Clock) -> None:
    import numpy as np

    from ctxwarden.embed import OpenAIEmbedder

    down = OpenAIEmbedder("http://127.0.0.1:9/v1", "nomic", retries=0, timeout=2.0)
    with Engine.open(":memory:", clock=clock, embedder=down) as engine:
        engine.ingest([_msg("x", "the deploy key rotates monthly", clock.now - DAY, session="o")])
        rowid = engine.get("x").rowid
        vector = np.ones((1, 384), dtype=np.float32)
        engine.store.put_vectors(down.name, [rowid], vector)
        context = engine.assemble(session="s", query="deploy key", budget=500, scope="tenant")
        assert "x" in context.included
        assert any("words only" in note for note in context.report.notes)


def _hits(engine: Engine, query: str, now: float, **weights: Any) -> dict[str, Any]:
    found = retrieve(engine.store, tenant="default", query=query, now=now,
                     cost=lambda ms: {m.rowid: 12 for m in ms},
                     weights=RetrievalWeights(**weights))  # fmt: skip
    return {h.memory.id: h for h in found}


def test_a_question_hit_brings_its_answers_the_turns_after(clock: Clock) -> None:
    now = clock.now
    with Engine.open(":memory:", clock=clock) as engine:
        engine.ingest([
            _msg("before", "morning all", now - 10 * DAY - 60, author="cy"),
            _msg("own", "quick one for the infra folks", now - 10 * DAY - 30),
            _msg("q", "which port does the staging database listen on?", now - 10 * DAY),
            _msg("a1", "5433, since the upgrade", now - 10 * DAY + 30, author="bo"),
            _msg("a2", "and the replica is on 5434", now - 10 * DAY + 40, author="cy"),
            _msg("again", "thanks! noted", now - 10 * DAY + 50),  # the asker again: not an answer
            *_filler(30, now - DAY),
        ])  # fmt: skip
        by_id = _hits(engine, "staging database port", now)
        q = by_id["q"].score
        assert by_id["a1"].components["neighbour_answer"] == pytest.approx(0.8)
        assert by_id["a1"].score == pytest.approx(0.8 * q)
        assert by_id["a2"].components["neighbour_answer"] == pytest.approx(0.4)
        assert "neighbour_answer" not in by_id["again"].components
        # In a channel the turns around a hit are its author's own (ana's lead-in), not
        # whoever spoke next to it (cy's greeting may be another conversation).
        assert by_id["own"].components["neighbour_before"] == pytest.approx(0.5)
        assert "before" not in by_id
        context = engine.assemble(
            session="new", query="staging database port?", budget=300, scope="tenant"
        )
        assert {"q", "a1"} <= set(_related(context))


def test_a_statement_hit_brings_the_turn_after_and_the_question_before(clock: Clock) -> None:
    now = clock.now
    with Engine.open(":memory:", clock=clock) as engine:
        engine.ingest([
            _msg("ask", "what is the office wifi password now?", now - 5 * DAY, author="bo"),
            _msg("tell", "it is hunter2 until friday", now - 5 * DAY + 20),
            _msg("next", "great, works for me", now - 5 * DAY + 40, author="bo"),
            *_filler(30, now - DAY),
        ])  # fmt: skip
        by_id = _hits(engine, "is hunter2 still valid", now)
        tell = by_id["tell"].score
        assert by_id["ask"].components["neighbour_question"] == pytest.approx(0.8)
        assert by_id["ask"].score == pytest.approx(0.8 * tell)
        # bo's thanks is another person's next turn in the channel: not a neighbour.
        assert "next" not in by_id
        # Without the pair weight the question is not brought at all (bo's, not the hit's
        # author's, turn).
        plain = _hits(engine, "is hunter2 still valid", now, answer=0.0)
        assert "ask" not in plain


def test_replies_siblings_and_the_thread_root_join(clock: Clock) -> None:
    now = clock.now
    with Engine.open(":memory:", clock=clock) as engine:
        engine.ingest([
            _msg("root", "release checklist for the quarter", now - 9 * DAY),
            _msg("t1", "docs are done", now - 9 * DAY + 10, thread_id="root", author="bo"),
            _msg("t2", "the canary rollout uses ring zero", now - 9 * DAY + 20,
                 thread_id="root", author="cy"),
            _msg("t3", "signed off", now - 9 * DAY + 30, thread_id="root", author="di"),
            _msg("p", "who owns the pager this week?", now - 8 * DAY, channel="ops"),
            _msg("s1", "omar does", now - 8 * DAY + 10, channel="ops", reply_to="p", author="bo"),
            *[_msg(f"x{i}", f"unrelated chatter {i}", now - 8 * DAY + 11 + i, channel="ops",
                   author="eve") for i in range(4)],
            _msg("s2", "the pager rotation moved to opsgenie", now - 8 * DAY + 20,
                 channel="ops", reply_to="p", author="cy"),
            *[_msg(f"y{i}", f"other chatter {i}", now - 8 * DAY + 21 + i, channel="ops",
                   author="eve") for i in range(4)],
            _msg("r", "since monday", now - 8 * DAY + 30, channel="ops", reply_to="s2"),
            *_filler(30, now - DAY),
        ])  # fmt: skip
        by_id = _hits(engine, "canary rollout ring", now)
        assert by_id["root"].components["neighbour_root"] == pytest.approx(0.3)
        assert by_id["t1"].components["neighbour_before"] == pytest.approx(0.5)  # in the thread
        assert by_id["t3"].components["neighbour_after"] == pytest.approx(0.5)
        by_id = _hits(engine, "rotation opsgenie", now)
        assert by_id["s1"].components["neighbour_sibling"] == pytest.approx(0.3)
        assert by_id["r"].components["neighbour_reply"] == pytest.approx(0.5)
        assert "neighbour_question" in by_id["p"].components  # s2 answers p
        # Switched off: no neighbour at all.
        off = _hits(engine, "rotation opsgenie", now, neighbours=0.0, answer=0.0, thread=0.0)
        assert not any(k.startswith("neighbour") for h in off.values() for k in h.components)


def test_neighbours_pay_their_tokens(clock: Clock) -> None:
    now = clock.now
    long_answer = " ".join(f"step{i} check the valve and the gauge" for i in range(60))
    with Engine.open(":memory:", clock=clock) as engine:
        engine.ingest([
            _msg("q", "how do we restart the boiler?", now - 3 * DAY),
            _msg("a", long_answer, now - 3 * DAY + 30, author="bo"),
            *_filler(10, now - DAY),
        ])  # fmt: skip
        small = engine.assemble(session="new", query="restart boiler", budget=250, scope="tenant")
        assert "q" in _related(small)
        assert "a" not in _related(small)  # its hundreds of tokens do not fit
        large = engine.assemble(session="new", query="restart boiler", budget=3000, scope="tenant")
        assert {"q", "a"} <= set(_related(large))


def test_entities_of_the_query_are_matched_verbatim(clock: Clock) -> None:
    from ctxwarden.entities import entities as _entities

    assert _entities("When did Caroline visit Lake Tahoe with the SSO team?") == [
        "Caroline", "Lake Tahoe", "SSO"
    ]  # fmt: skip
    assert _entities("What changed in config_v2.yaml and kafkaConsumer at 10GB?") == [
        "config_v2.yaml", "kafkaConsumer", "10GB"
    ]  # fmt: skip
    assert _entities("where do we meet?") == []  # the opening word is no name
    now = clock.now
    with Engine.open(":memory:", clock=clock) as engine:
        engine.ingest([
            _msg("phrase", "the trip to lake tahoe is booked", now - 3 * DAY),
            _msg("apart", "the lake was cold, tahoe trip booked later", now - 3 * DAY + 1),
            _msg("none", "the trip is booked", now - 3 * DAY + 2),
            *_filler(10, now - DAY),
        ])  # fmt: skip
        by_id = _hits(engine, "is the trip to Lake Tahoe booked?", now, neighbours=0.0,
                      answer=0.0, thread=0.0)  # fmt: skip
        assert by_id["phrase"].components["entity"] == 1.0
        assert by_id["apart"].components["entity"] == 0.0  # both words, not the name
        assert by_id["phrase"].score > by_id["apart"].score
        off = _hits(engine, "is the trip to Lake Tahoe booked?", now, entity=0.0)
        assert off["phrase"].components["value"] < by_id["phrase"].components["value"]
        assert "entity" not in _hits(engine, "is the trip booked?", now)["none"].components


@settings(max_examples=200, deadline=None)
@given(st.lists(st.text(alphabet="abcdeé 1-", max_size=60), max_size=12), st.booleans())
def test_similarities_are_the_jaccard_of_hashed_word_sets(texts: list[str], warm: bool) -> None:
    # The word-set masks are cached by text: a cached mask must give what a fresh one gives.
    import zlib

    from ctxwarden import retrieve as retrieve_module

    if not warm:
        retrieve_module._MASKS.clear()
    got = retrieve_module._similarities(texts)
    sets = [
        {zlib.crc32(w.encode("utf-8", "surrogatepass")) & 1023 for w in retrieve_module._words(t)}
        for t in texts
    ]
    for i, a in enumerate(sets):
        for j, b in enumerate(sets):
            want = 0.0 if i == j or not (a & b) else len(a & b) / len(a | b)
            assert got[i, j] == pytest.approx(want)


def _hit(content: str, attachments: tuple[dict[str, str], ...] = ()) -> Any:
    from ctxwarden.types import Memory

    return Memory(
        rowid=1, id="m1", tenant="default", session="s", channel=None, author="mel",
        author_kind="human", role="user", content=content, created_at=0.0, thread_id=None,
        reply_to=None, kind="message", pinned=False, name=None, tool_calls=(),
        tool_call_id=None, content_hash="h", dup_count=1, last_seen_at=0.0, access_count=0,
        last_accessed_at=None, access_score=0.0, included_tokens_total=0,
        attachments=attachments,
    )  # fmt: skip


def test_the_second_hop_searches_a_hits_new_words_and_what_it_shared() -> None:
    from ctxwarden.retrieve import bridge_terms

    hit = _hit("yes, we adopted Bailey, a tabby cat, from the shelter on Elm Road")
    assert bridge_terms(hit, {"cat", "pets"}) == ["yes", "adopted", "bailey", "tabby"]
    # What the hit shared counts: a caption's words are its words too.
    shared = _hit("look!", ({"kind": "image", "caption": "a hand-built ceramics kiln"},))
    assert bridge_terms(shared, {"look"}, limit=2) == ["hand-built", "ceramics"]
    assert bridge_terms(_hit("cat pets"), {"cat", "pets"}) == []


def test_words_of_text_without_spaces_are_its_bigrams() -> None:
    """MMR's word sets and the names a query mentions see Chinese and Japanese words: a run is
    one ``\\w+`` match, so two messages sharing 预算 shared no word, and 李娜 was never named."""
    from ctxwarden.retrieve import _named, _words

    first, second = _words("这个项目的预算已经批准了"), _words("预算下周再讨论")
    assert "预算" in first & second
    assert _named("李娜", _words("李娜说了什么"))
    assert _named("王小明", _words("王小明明天几点到"))
    assert not _named("王小明", _words("小明明天几点到"))
    assert _named("ana", _words("what did ana say"))
    assert not _named("ana", _words("banana"))


def test_a_turn_is_found_through_the_turn_before_it(clock: Clock, store: Any) -> None:
    """An answer that lacks the question's words ("Yes, two: Luna and Max") is ranked with the
    turn it answers (``context``): higher in the context list than by its own vector, and only
    when the context list is on."""
    from ctxwarden.embed import get_embedder

    embedder = get_embedder("minilm")
    now = clock.now
    turns = [
        ("bo", "How was the hike on Saturday?"),
        ("ana", "Long but the view from the ridge was worth it."),
        ("bo", "Do you have any pets at home?"),
        ("ana", "Yes, two of them: Luna and Max, both very lazy."),
        ("bo", "Did you finish the quarterly report?"),
        ("ana", "Almost, the charts still need work."),
        ("bo", "What are you cooking tonight?"),
        ("ana", "Probably pasta with whatever is left in the fridge."),
        # Nearer the query by their own vectors than the answer is, not by their context.
        ("bo", "Where are your parents these days?"),
        ("ana", "They moved into a small house near the lake."),
    ]
    with Engine(store, clock=clock, config=EngineConfig(embed="sync"),
                embedder=embedder) as engine:  # fmt: skip
        engine.ingest([
            {"id": f"t{i}", "session": "s", "channel": "c", "author": who, "content": text,
             "created_at": now - 86400.0 + 60.0 * i}
            for i, (who, text) in enumerate(turns)
        ])  # fmt: skip
        query = "Which animals live in the house?"

        def run(**weights: Any) -> dict[str, Any]:
            hits = retrieve(engine.store, tenant="default", query=query, now=now,
                            cost=lambda ms: {m.rowid: 10 for m in ms},
                            query_vector=embedder.embed([query])[0], model=embedder.name,
                            weights=RetrievalWeights(**weights))  # fmt: skip
            return {h.memory.id: h.components for h in hits}

        found = run()
        answer = found["t3"]
        assert answer["context_rank"] < answer["vector_rank"]
        # Its score in the context list: its own cosine plus half the question's.
        assert answer["context"] > answer["vector"]
        assert "context_rank" not in run(context=0.0)["t3"]


def test_recency_orders_like_relevance_but_lifts_no_weak_match_over_a_strong_one(
    clock: Clock,
) -> None:
    # Deep in the pool relevance values are small and close: a flat recency bonus (0.15) would
    # reorder them by age. Scaled by relevance, it only orders memories of like relevance.
    now = clock.now
    old = now - 400 * DAY
    strong = [_msg(f"s{i}", f"alpha alpha alpha k{i}x", old + i) for i in range(40)]
    middle = [_msg(f"m{i}", f"alpha beta{i} delta{i} epsilon{i} zeta{i}", old + 100 + i)
              for i in range(20)]  # fmt: skip
    with Engine.open(":memory:", clock=clock) as engine:
        engine.ingest([
            *strong,
            _msg("older", "alpha gamma", old + 50),
            *middle,
            _msg("recent", "alpha " + " ".join(f"word{i}" for i in range(14)), now - DAY),
            _msg("recent-twin", "alpha gamma", now - DAY + 1),
        ])  # fmt: skip
        weights = RetrievalWeights(mmr_lambda=1.0, expand=0, candidates=100)
        hits = retrieve(engine.store, tenant="default", query="alpha", now=now, weights=weights,
                        cost=lambda ms: {m.rowid: 10 for m in ms})  # fmt: skip
    by_id = {h.memory.id: h.components for h in hits}
    older, recent = by_id["older"], by_id["recent"]
    # The setting: the recent one matches less well, and a flat bonus would put it first.
    assert recent["bm25_rank"] > older["bm25_rank"]
    assert recent["relevance"] + weights.recency * recent["recency"] > older["relevance"]
    order = [h.memory.id for h in hits]
    assert order.index("older") < order.index("recent")
    # Among equals the newer still wins: the same text a year later comes first.
    assert order.index("recent-twin") < order.index("older")


def test_a_larger_budget_reads_more_of_a_named_authors_own_turns(clock: Clock) -> None:
    # The author-restricted vector search reads `author_candidates` per 1,000 tokens of the
    # related block: a 1k block 20 of omar's turns, an 8k block about six times as many.
    config = EngineConfig(embed="sync")
    with Engine.open(":memory:", clock=clock, config=config, embedder=StaticEmbedder()) as engine:
        engine.ingest([
            _msg(f"o{i}", f"today omar tried recipe {i}: soup number {i} with leek", clock.now
                 - (200 - i) * DAY, author="omar", session="old")
            for i in range(200)
        ])  # fmt: skip

        def read(budget: int) -> int:
            context = engine.assemble(session="s", query="What did Omar cook?", budget=budget,
                                      scope="tenant", log_inclusions=False)  # fmt: skip
            related = [c for c in context.report.candidates if c.block == "related"]
            return sum(1 for c in related if "author_vector_rank" in c.components)

        small, large = read(1000), read(8000)
    assert small <= RetrievalWeights().author_candidates
    assert large > 3 * RetrievalWeights().author_candidates


def test_a_small_block_fuses_with_a_smaller_k(clock: Clock) -> None:
    # The assembler sizes RRF's k to the related block (`rrf_k_per_thousand` per 1,000 tokens):
    # in a 1k block the first lexical hit stands further above the second than in an 8k one,
    # and with the sizing off both budgets fuse with `rrf_k`. Words only: with background
    # embedding, assemble's bounded catch-up could leave the two budgets different lists.
    def relevances(weights: RetrievalWeights) -> dict[int, tuple[float, float]]:
        config = EngineConfig(embed="off", retrieval=weights)
        with Engine.open(":memory:", clock=clock, config=config) as engine:
            engine.ingest([
                _msg("best", "the violin recital moved to the violin hall", clock.now - 9 * DAY),
                _msg("next", "a violin lesson on friday", clock.now - 9 * DAY),
                *_filler(40, clock.now - 30 * DAY),
            ])  # fmt: skip
            got = {}
            for budget in (1000, 8000):
                context = engine.assemble(session="s", query="violin recital", budget=budget,
                                          scope="tenant", log_inclusions=False)  # fmt: skip
                rows = {c.id: c.components for c in context.report.candidates}
                assert (rows["best"]["bm25_rank"], rows["next"]["bm25_rank"]) == (1, 2)
                got[budget] = (rows["best"]["relevance"], rows["next"]["relevance"])
            return got

    sized = relevances(RetrievalWeights())
    assert sized[1000][0] == sized[8000][0] == 1.0
    assert sized[1000][1] < sized[8000][1] < 1.0
    fixed = relevances(RetrievalWeights(rrf_k_per_thousand=0))
    assert fixed[1000] == fixed[8000]
    assert sized[1000][1] < fixed[1000][1]  # k = 20 at any size: above the 1k block's ~5
