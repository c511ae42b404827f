"""Hybrid retrieval and the engine's embedding: real store, real (static, offline) embedder."""

from __future__ import annotations

import time
from typing import Any

import pytest

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
        context = engine.assemble(session="s", query="puppy noise", budget=2000)
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


def test_an_unreachable_embedder_degrades_to_words(clock: Clock) -> None:
    import numpy as np

    from ctxwarden.embed import OpenAIEmbedder

    down = OpenAIEmbedder("http://127.0.0.1:9/v1", "nomic", retries=0, timeout=2.0)
    with Engine.open(":memory:", clock=clock, embedder=down) as engine:
        engine.ingest([_msg("x", "the deploy key rotates monthly", clock.now - DAY, session="o")])
        rowid = engine.get("x").rowid
        vector = np.ones((1, 384), dtype=np.float32)
        engine.store.put_vectors(down.name, [rowid], vector)
        context = engine.assemble(session="s", query="deploy key", budget=500)
        assert "x" in context.included
        assert any("words only" in note for note in context.report.notes)
