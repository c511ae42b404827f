"""What a query is about (ctxwarden.focus) and how retrieval uses it: real SQLite store."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from conftest import Clock
from ctxwarden.engine import Engine, EngineConfig
from ctxwarden.focus import focus, vector_text
from ctxwarden.retrieve import RetrievalWeights, retrieve

DAY = 86400.0


def _msg(id: str, author: str, content: str, at: float, **extra: Any) -> dict[str, Any]:
    return {"id": id, "session": "s", "channel": "general", "author": author, "content": content,
            "created_at": at, **extra}  # fmt: skip


def _cost(memories: Any) -> dict[int, int]:
    return {m.rowid: 10 for m in memories}


def test_focus_finds_people_times_and_lists() -> None:
    aim = focus("What did Ana Li and bo both paint in 2022?", now=0.0, authors=["Ana Li", "Bo",
                                                                           "Cy", None])  # fmt: skip
    assert aim.people == {"Ana Li", "Bo"}
    assert aim.name_terms == {"ana", "li", "bo"}
    assert aim.listing
    assert [s.text for s in aim.spans] == ["in 2022"]
    assert aim.time_terms == {"in", "2022"}
    plain = focus("Where does Cy live?", now=0.0, authors=["Ana Li", "Cy"])
    assert plain.people == {"Cy"}
    assert not plain.listing
    assert plain.spans == ()
    assert focus("Which countries has Cy visited?", now=0.0, authors=[]).listing
    assert not focus("Which class does Cy teach?", now=0.0, authors=[]).listing


def test_a_persons_own_turn_outranks_the_turn_that_addresses_them(clock: Clock) -> None:
    now = clock.now
    with Engine.open(":memory:", clock=clock) as engine:
        engine.ingest([
            _msg("own", "ana", "I painted a lake at sunrise last weekend", now - 3 * DAY),
            _msg("mention", "bo", "Wow, Ana! A painted lake at sunrise sounds lovely", now - DAY),
        ])  # fmt: skip
        hits = retrieve(engine.store, tenant="default", query="What did Ana paint at sunrise?",
                        now=now, cost=_cost)  # fmt: skip
        assert [h.memory.id for h in hits][:2] == ["own", "mention"]
        assert "speaker_rank" in hits[0].components
        # Without the speaker-aware parts the address wins (newer, says the name).
        plain = RetrievalWeights(speaker=0.0)
        hits = retrieve(engine.store, tenant="default", query="What did Ana paint at sunrise?",
                        now=now, cost=_cost, weights=plain)  # fmt: skip
        assert "speaker_rank" not in hits[0].components


def test_a_named_day_selects_that_days_memories(clock: Clock) -> None:
    now = clock.now  # 2027-01-15
    oct13 = 1_791_849_600.0  # 2026-10-13 00:00 UTC
    with Engine.open(":memory:", clock=clock) as engine:
        engine.ingest([
            _msg("that-day", "ana", "look Bo, my new pottery bowl", oct13 + 3600),
            _msg("other-day", "ana", "I want to show Bo the pottery studio", oct13 + 30 * DAY),
            *[_msg(f"x{i}", "bo", f"pottery chat {i}", oct13 + (40 + i) * DAY) for i in range(5)],
        ])  # fmt: skip
        query = "What did Ana show Bo on 13 October?"
        hits = retrieve(engine.store, tenant="default", query=query, now=now, cost=_cost)
        assert hits[0].memory.id == "that-day"
        assert hits[0].components["when"] == 1.0
        assert "dated_rank" in hits[0].components
        other = next(h for h in hits if h.memory.id == "other-day")
        assert other.components["when"] == 0.0
        # Without time-awareness the memory with the query's words and newer wins.
        plain = RetrievalWeights(dated=0.0, in_time=0.0)
        hits = retrieve(engine.store, tenant="default", query=query, now=now, cost=_cost,
                        weights=plain)  # fmt: skip
        assert hits[0].memory.id == "other-day"


def test_a_list_question_spreads_over_episodes(clock: Clock) -> None:
    now = clock.now
    day = [_msg(f"d{i}", "ana", f"reading the novel Dune again, chapter {i} of the book",
                now - 2 * DAY + i * 60) for i in range(6)]  # fmt: skip
    other = [
        _msg("e1", "ana", "finished the book Piranesi on the train", now - 40 * DAY),
        _msg("e2", "ana", "started the book Circe, a novel about myths", now - 80 * DAY),
    ]
    with Engine.open(":memory:", clock=clock) as engine:
        engine.ingest([*other, *day])
        weights = RetrievalWeights(expand=0)
        hits = retrieve(engine.store, tenant="default", query="What books has Ana read?",
                        now=now, cost=_cost, weights=weights)  # fmt: skip
        top = [h.memory.id for h in hits[:4]]
        assert {"e1", "e2"} <= set(top)
        assert any(h.components["mmr_penalty"] > 0 for h in hits)
        crowded = RetrievalWeights(expand=0, coverage=0.0, list_coverage=0.0)
        hits = retrieve(engine.store, tenant="default", query="What books has Ana read?",
                        now=now, cost=_cost, weights=crowded)  # fmt: skip
        assert not {"e1", "e2"} <= {h.memory.id for h in hits[:4]}


def test_a_person_named_only_among_the_vector_hits_gets_their_own_turns(clock: Clock) -> None:
    # The searches by words for the query's people run while the query is embedded, with the
    # authors known then; a person whose turns only the vector search found is searched for
    # again once it has: Zoe's own turn (no vector near the query, below the word hits that
    # say her name) is found among her turns.
    now = clock.now
    with Engine.open(":memory:", clock=clock) as engine:
        engine.ingest([
            *[_msg(f"b{i}", "bo", f"Zoe, zoe: the sunrise {i}", now - DAY + i) for i in range(3)],
            _msg("own", "zoe", "sunrise over the lake", now - 2 * DAY),
            _msg("near", "zoe", "an unrelated line", now - 3 * DAY),
        ])  # fmt: skip
        query = np.zeros(8, dtype=np.float32)
        query[0] = 1.0
        rowids = {m: engine.get(m).rowid for m in ("b0", "b1", "b2", "own", "near")}
        vectors = np.eye(8, dtype=np.float32)[[1, 2, 3, 4, 0]]
        vectors[3] = -query  # "own": the farthest from the query
        engine.store.put_vectors("test-model", list(rowids.values()), vectors)
        weights = RetrievalWeights(candidates=2, author_vector=0.0)
        hits = retrieve(engine.store, tenant="default", query="What did Zoe say about the sunrise?",
                        now=now, cost=_cost, query_vector=lambda: query, model="test-model",
                        weights=weights)  # fmt: skip
        found = {h.memory.id: h.components for h in hits}
        assert "bm25_rank" not in found["own"]
        assert "vector_rank" not in found["own"]
        assert "speaker_rank" in found["own"]
        assert "vector_rank" in found["near"]


def test_vectors_search_the_query_without_the_names_it_says(clock: Clock) -> None:
    """A name dominates a short question's embedding: the query's vector is made of the query
    less the names of the people it names (vector_text), and the assembler embeds that text;
    with the names in, the turns that only say the name are nearest."""
    from ctxwarden.embed import get_embedder
    from ctxwarden.engine import EngineConfig

    embedder = get_embedder("minilm")
    now = clock.now
    query = "What has Ana been researching?"
    assert vector_text(query, ["ana", "bo"]) == "What has   been researching?"
    assert vector_text(query, ["bo"]) == query
    records = [
        _msg("own", "ana", "researching adoption agencies for my family", now - 9 * DAY),
        *[
            _msg(f"hi{i}", "bo", f"Wow, Ana! You rock, Ana. {i}", now - i * DAY)
            for i in range(1, 6)
        ],
    ]

    def vector_rank(name_free: bool) -> float:
        config = EngineConfig(embed="sync", retrieval=RetrievalWeights(name_free=name_free))
        with Engine.open(":memory:", clock=clock, config=config, embedder=embedder) as engine:
            engine.ingest(records)
            context = engine.assemble(session="q", query=query, budget=2000, scope="tenant")
            own = next(c for c in context.report.candidates if c.id == "own")
            return own.components["vector_rank"]

    assert vector_rank(True) == 1.0
    assert vector_rank(False) > 1.0


def test_the_other_sides_turns_around_a_named_persons_hit_are_context_only(clock: Clock) -> None:
    now = clock.now
    with Engine.open(":memory:", clock=clock) as engine:
        engine.ingest([
            _msg("asks", "ana", "I painted a lake at sunrise! Have you painted lately?",
                 now - 9 * DAY),
            _msg("reply", "bo", "Not really, I built a bookshelf for the hallway instead",
                 now - 9 * DAY + 60),
            _msg("more", "ana", "My kids and I painted the garden fence blue", now - 20 * DAY),
        ])  # fmt: skip

        def by_id(**weights: Any) -> dict[str, Any]:
            hits = retrieve(engine.store, tenant="default", query="What has Ana painted?",
                            now=now, cost=_cost, weights=RetrievalWeights(**weights))  # fmt: skip
            return {h.memory.id: h for h in hits}

        hits = by_id(bystander=0.3)
        reply, anchor = hits["reply"], hits["asks"].score
        # Bo answers Ana's question: an answer, but Bo's, and the question names only Ana.
        assert reply.components["neighbour_answer"] == 0.8
        assert reply.components["bystander"] == 0.3
        assert reply.score == pytest.approx(0.8 * 0.3 * anchor)
        # Bo's turn matched nothing itself; one that does keeps its own relevance as its share.
        assert "relevance" not in reply.components
        for hit in hits.values():
            if "bystander" in hit.components:
                assert hit.components["bystander"] == max(0.3, hit.components.get("relevance", 0))
        full = by_id(bystander=1.0)["reply"]
        assert full.score == pytest.approx(0.8 * anchor)
        assert "bystander" in full.components
        # A question that names no one: every neighbour keeps its share.
        plain = retrieve(engine.store, tenant="default", query="who painted a lake at sunrise?",
                         now=now, cost=_cost)  # fmt: skip
        assert all("bystander" not in h.components for h in plain)


def test_a_role_name_is_not_a_person_a_query_names(clock: Clock) -> None:
    # Transcripts ingested with the chat roles as authors: "user" in a question is a topic
    # ("add a user"), not the author, so no person-aware list, bonus or bystander applies.
    now = clock.now
    assert focus("How do I add a user?", now=now, authors=["user", "assistant"]).people == set()
    assert vector_text("How do I add a user?", ["user", "assistant"]) == "How do I add a user?"
    with Engine.open(":memory:", clock=clock) as engine:
        engine.ingest([
            _msg("q", "user", "How do I add a user to the billing group?", now - 9 * DAY),
            _msg("a", "assistant", "Open Settings, then Members, and invite them by email",
                 now - 9 * DAY + 60),
            _msg("u", "user", "thanks, the user shows up now", now - 9 * DAY + 120),
        ])  # fmt: skip
        hits = retrieve(engine.store, tenant="default", query="how to add a user to a group?",
                        now=now, cost=_cost)  # fmt: skip
        by_id = {h.memory.id: h for h in hits}
        assert {"q", "a"} <= set(by_id)
        for hit in hits:
            assert hit.components.get("author", 0.0) == 0.0, hit
            assert not {"bystander", "speaker_rank", "author_vector_rank"} & set(hit.components)
        # The answer keeps its full share as the question's neighbour.
        assert "bystander" not in by_id["a"].components
    # A person's name is still one, whatever its case in the query.
    assert focus("what did kwame ship?", now=now, authors=["kwame", "user"]).people == {"kwame"}


def test_an_identifier_is_named_by_its_first_word_or_whole() -> None:
    # An author joined with punctuation (an adapter's, a bot's, an address) is named by its
    # first word or by all its words; its later words are kinds and domains, not the author.
    authors = ["langgraph-store", "ana@example.com", "Ana Li", "jean-luc picard"]
    people = {q: focus(q, now=0.0, authors=authors).people for q in (
        "what did I store last week?",
        "any mail from example.com?",
        "what did langgraph save?",
        "what is in the langgraph-store?",
        "what did Li say?",
        "did Jean call?",
        "did Picard call?",
        "did Luc call?",
    )}  # fmt: skip
    assert people == {
        "what did I store last week?": set(),
        "any mail from example.com?": set(),
        "what did langgraph save?": {"langgraph-store"},
        "what is in the langgraph-store?": {"langgraph-store"},
        "what did Li say?": {"Ana Li"},  # a space-separated part names its person alone
        "did Jean call?": {"jean-luc picard"},
        "did Picard call?": {"jean-luc picard"},
        "did Luc call?": set(),
    }
    assert vector_text("what did I store last week?", authors) == "what did I store last week?"
    assert vector_text("what is in the langgraph-store?", authors) == "what is in the  - ?"


def test_a_two_letter_name_gets_its_own_turns_searched(clock: Clock) -> None:
    # "Bo" names Bo for every part of retrieval (focus and the author-restricted search alike).
    now = clock.now
    with Engine.open(":memory:", clock=clock, config=EngineConfig(embed="sync")) as engine:
        engine.ingest([
            _msg("b1", "Bo", "I finally repaired the old bicycle in the garage", now - 9 * DAY),
            _msg("c1", "Cy", "Bo, nice work on that", now - 9 * DAY + 60),
        ])  # fmt: skip
        vector = engine.embedder.embed(["what did Bo fix?"])[0]
        hits = retrieve(engine.store, tenant="default", query="what did Bo fix?", now=now,
                        cost=_cost, query_vector=vector, model=engine.embedder.name,
                        authors=["Bo", "Cy"])  # fmt: skip
    by_id = {h.memory.id: h for h in hits}
    assert "author_vector_rank" in by_id["b1"].components
    assert by_id["b1"].components["author"] == 1.0
