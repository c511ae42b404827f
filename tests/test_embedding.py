"""Semantic retrieval by default: the background worker, assemble's catch-up of what is still
pending, the report of memories searched by words only, and one embedding per memory when
several engines share a PostgreSQL database. Real store, real MiniLM (loaded once a process)."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from conftest import Clock
from ctxwarden.embed import MiniLMEmbedder, StaticEmbedder
from ctxwarden.engine import Engine, EngineConfig
from ctxwarden.errors import ConfigError, EmbedError

DAY = 86400.0

# The pet is the only match of the question, and shares no word with it.
_MEMORIES = [
    "we adopted another kitten, she is called Bailey",
    "the quarterly report is due on friday",
    "my sister moved to Lisbon for work",
    "remember to water the tomatoes in the garden",
    "the train to the airport was late again",
]
_QUESTION = "which animals live at her home?"


def _records(at: float) -> list[dict[str, Any]]:
    return [
        {"id": f"m{i}", "session": "earlier", "author": "ana", "content": text,
         "created_at": at + i}
        for i, text in enumerate(_MEMORIES)
    ]  # fmt: skip


def _related(context: Any) -> dict[str, Any]:
    return {c.id: c for c in context.report.candidates if c.block == "related" and c.included}


class _Gated(MiniLMEmbedder):
    """MiniLM that waits for ``gate`` before each batch (an embedder busy elsewhere), counting
    the texts it embedded."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()
        self.calls = 0

    def embed(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        self.calls += 1
        self.gate.wait(timeout=60)
        return super().embed(texts)


def test_the_default_is_background_embedding() -> None:
    assert EngineConfig().embed == "background"
    assert EngineConfig().assemble_embed_limit > 0
    with pytest.raises(ConfigError, match="assemble_embed_limit"):
        EngineConfig(assemble_embed_limit=-1)


def test_a_paraphrase_ingested_just_before_is_found_by_meaning(clock: Clock) -> None:
    # The defaults a new user gets, but for the time bound: loading MiniLM alone may take
    # longer than assemble_embed_seconds on a loaded machine (the bound is tested below).
    config = EngineConfig(assemble_embed_seconds=60.0)
    with Engine.open(":memory:", clock=clock, config=config) as engine:
        engine.ingest(_records(clock.now - DAY))
        context = engine.assemble(session="now", query=_QUESTION, budget=2000, scope="tenant")
        pet = _related(context).get("m0")
        assert pet is not None, context.report.candidates
        assert "vector" in pet.components
        assert "bm25" not in pet.components
        assert context.report.lexical_only == ()
        assert not any("words only" in note for note in context.report.notes)


def test_ingest_never_waits_for_the_embedder(clock: Clock) -> None:
    embedder = _Gated()
    with Engine.open(":memory:", clock=clock, embedder=embedder) as engine:
        result = engine.ingest(_records(clock.now - DAY))  # the worker is stuck in embed
        assert result.counts["stored"] == len(_MEMORIES)
        assert engine.store.vector_models() == {}
        embedder.gate.set()


def test_with_the_cap_at_zero_pending_memories_are_reported_lexical_only(clock: Clock) -> None:
    embedder = _Gated()
    config = EngineConfig(assemble_embed_limit=0)
    with Engine.open(":memory:", clock=clock, config=config, embedder=embedder) as engine:
        engine.ingest(_records(clock.now - DAY))
        try:
            context = engine.assemble(session="now", query=_QUESTION, budget=2000, scope="tenant")
            assert "m0" not in _related(context)  # no word in common, no vector yet
            assert set(context.report.lexical_only) == {f"m{i}" for i in range(len(_MEMORIES))}
            assert any("searched by words only" in n for n in context.report.notes)
            assert context.report.to_dict()["lexical_only"] == list(context.report.lexical_only)
            # Another session's scope sees none of these ids.
            own = engine.assemble(session="now", query=_QUESTION, budget=2000)
            assert own.report.lexical_only == ()
        finally:
            embedder.gate.set()


def test_assemble_embeds_the_pending_few_while_the_worker_is_busy(clock: Clock) -> None:
    embedder = _Gated()
    config = EngineConfig(assemble_embed_seconds=60.0)  # generous: the gate opens at 0.05 s
    with Engine.open(":memory:", clock=clock, config=config, embedder=embedder) as engine:
        engine.ingest(_records(clock.now - DAY))
        # The worker holds its batch; assemble waits for that batch, not for a backlog.
        threading.Timer(0.05, embedder.gate.set).start()
        context = engine.assemble(session="now", query=_QUESTION, budget=2000, scope="tenant")
        assert "m0" in _related(context)
        assert context.report.lexical_only == ()


class _Flaky(StaticEmbedder):
    """The static model, failing while ``fail`` is set; every text it embedded is kept."""

    def __init__(self) -> None:
        super().__init__()
        self.fail = True
        self.texts: list[str] = []

    def embed(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        if self.fail:
            raise EmbedError("the embedder is down (a test)")
        self.texts.extend(texts)
        return super().embed(texts)


class _Slow(_Flaky):
    """:class:`_Flaky` whose every call, once up, takes ``pause`` seconds."""

    pause = 0.0

    def embed(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        vectors = super().embed(texts)
        threading.Event().wait(self.pause)
        return vectors


def _garden_notes(clock: Clock, count: int) -> list[dict[str, Any]]:
    """``count`` notes of session ``s``, a day old, a second apart."""
    return [
        {"id": f"n{i}", "session": "s", "content": f"note {i} about the garden",
         "created_at": clock.now - DAY + i}
        for i in range(count)
    ]  # fmt: skip


@pytest.mark.parametrize(("seconds", "embedded"), [(0.2, 8), (60.0, 32)])
def test_the_catch_up_stops_at_its_time_bound_or_its_count(
    clock: Clock, seconds: float, embedded: int
) -> None:
    """40 memories of the query's session pending, an embedder that takes 0.3 s a call (a
    slice of 8): with a 0.2 s bound the catch-up stops after its first slice, with a generous
    one at assemble_embed_limit (32). No worker runs ("sync", the embedder down at ingest)."""
    embedder = _Slow()
    config = EngineConfig(embed="sync", assemble_embed_seconds=seconds)
    with Engine.open(":memory:", clock=clock, config=config, embedder=embedder) as engine:
        engine.ingest(_garden_notes(clock, 40))
        embedder.fail, embedder.pause = False, 0.3
        context = engine.assemble(session="s", query="what grows there?", budget=2000)
        assert len(context.report.lexical_only) == 40 - embedded
        assert len(engine.store.pending_embeddings(engine.embedder.name)) == 40 - embedded
        assert any(f"assemble_embed_seconds {seconds:g}" in n for n in context.report.notes)


class _ColdStart(_Flaky):
    """:class:`_Flaky` whose model takes ``load_seconds`` to load, once (a cold process)."""

    load_seconds = 0.6

    def __init__(self) -> None:
        super().__init__()
        self._cold = threading.Lock()
        self.loaded = False

    def load(self) -> None:
        with self._cold:
            if not self.loaded:
                threading.Event().wait(self.load_seconds)
                self.loaded = True

    def embed(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        if not self.fail:
            self.load()
        return super().embed(texts)


def test_a_cold_model_load_is_not_counted_in_the_catch_up_bound(clock: Clock) -> None:
    """A new process: 10 memories pending and a model that loads in 0.6 s, three times the
    0.2 s bound. The load is not embedding work (the query's embedding waits for it too), so
    every pending memory is embedded and searched by meaning. Counted in the bound, the load
    used it up inside the first slice of 8, and 2 were searched by words only."""
    embedder = _ColdStart()
    config = EngineConfig(embed="sync", assemble_embed_seconds=0.2)
    with Engine.open(":memory:", clock=clock, config=config, embedder=embedder) as engine:
        engine.ingest(_garden_notes(clock, 10))
        assert not embedder.loaded
        embedder.fail = False
        context = engine.assemble(session="s", query="what grows there?", budget=2000)
        assert embedder.loaded
        assert context.report.lexical_only == ()
        assert engine.store.pending_embeddings(engine.embedder.name) == []
        assert not any("not embedded yet" in n for n in context.report.notes)


def test_caught_up_vectors_the_busy_store_cannot_take_are_written_later(
    clock: Clock, tmp_path: Path
) -> None:
    """Another process holds the file's write lock: the catch-up's write gives up within the
    time bound (the memories are searched by words this turn) and the vectors are written by
    the next pass, not embedded again."""
    db = tmp_path / "busy.db"
    embedder = _Flaky()
    config = EngineConfig(embed="sync", assemble_embed_seconds=0.5, inclusion_log="deferred")
    with Engine.open(db, clock=clock, config=config, embedder=embedder) as engine:
        engine.ingest(_records(clock.now - DAY))  # not embedded: the embedder is down
        model = engine.embedder.name
        assert len(engine.store.pending_embeddings(model)) == len(_MEMORIES)
        embedder.fail = False
        other = sqlite3.connect(db, isolation_level=None, check_same_thread=False)
        other.execute("BEGIN IMMEDIATE")  # another process's writer, in the middle of a batch
        # Had the write waited for the lock (the store timeout is 30 s), this would let it in.
        release = threading.Timer(10.0, other.rollback)
        release.start()
        try:
            context = engine.assemble(session="now", query=_QUESTION, budget=2000, scope="tenant")
        finally:
            release.cancel()
            if other.in_transaction:
                other.rollback()
            other.close()
        assert set(context.report.lexical_only) == {f"m{i}" for i in range(len(_MEMORIES))}
        memories = [t for t in embedder.texts if t != _QUESTION]  # the query's own aside
        assert sorted(memories) == sorted(_MEMORIES)  # embedded, not stored
        engine.ingest([{"id": "late", "session": "s", "content": "a parrot joined us"}])
        assert engine.store.pending_embeddings(model) == []
        memories = [t for t in embedder.texts if t != _QUESTION]
        assert sorted(memories) == sorted([*_MEMORIES, "a parrot joined us"])  # once each
        context = engine.assemble(session="now", query=_QUESTION, budget=2000, scope="tenant")
        assert context.report.lexical_only == ()
        assert "m0" in _related(context)


def test_edits_and_later_ingests_are_caught_up_too(clock: Clock) -> None:
    config = EngineConfig(embed="background")
    with Engine.open(":memory:", clock=clock, config=config, embedder=StaticEmbedder()) as engine:
        engine.ingest(_records(clock.now - DAY))
        engine.assemble(session="now", query=_QUESTION, budget=500, scope="tenant")
        engine.update("m1", "the quarterly report moved to monday")
        engine.ingest([{"id": "late", "session": "earlier", "content": "a parrot joined us"}])
        context = engine.assemble(session="now", query="report", budget=500, scope="tenant")
        assert context.report.lexical_only == ()
        model = engine.embedder.name
        assert engine.store.pending_embeddings(model) == []


def test_embed_off_loads_no_model_and_searches_words(clock: Clock) -> None:
    embedder = _Gated()  # never released: any embed would hang the test
    config = EngineConfig(embed="off")
    with Engine.open(":memory:", clock=clock, config=config, embedder=embedder) as engine:
        engine.ingest(_records(clock.now - DAY))
        context = engine.assemble(session="now", query=_QUESTION, budget=2000, scope="tenant")
        assert context.report.lexical_only == ()
        assert embedder.calls == 0


@pytest.mark.postgres
def test_two_engines_on_one_postgres_embed_each_memory_once(
    pg_schema_dsn: str, clock: Clock
) -> None:
    class Counting(StaticEmbedder):
        name = "minilm-l6-int8@1"  # the schema keeps 384-d vectors: pad the static 256

        def __init__(self, barrier: threading.Barrier) -> None:
            super().__init__()
            self.barrier = barrier
            self.texts: list[str] = []

        @property
        def dim(self) -> int:
            return 384

        def embed(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
            if not self.texts:
                self.barrier.wait(timeout=30)  # both engines hold a claim at once
            self.texts.extend(texts)
            base = super().embed(texts)
            return np.hstack([base, np.zeros((len(texts), 128), dtype=np.float32)])

    config = EngineConfig(embed="off", embed_batch=8)
    barrier = threading.Barrier(2)
    embedders = [Counting(barrier), Counting(barrier)]
    engines = [
        Engine.open(pg_schema_dsn, clock=clock, config=config, embedder=e) for e in embedders
    ]
    try:
        engines[0].ingest([
            {"id": f"n{i}", "session": "s", "content": f"note {i}: the garden needs {i} seeds"}
            for i in range(60)
        ])  # fmt: skip
        done: list[int] = []
        threads = [threading.Thread(target=lambda e=e: done.append(e.embed_pending()))
                   for e in engines]  # fmt: skip
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
        texts = embedders[0].texts + embedders[1].texts
        assert len(texts) == len(set(texts)) == 60  # every memory once, by one engine
        assert embedders[0].texts
        assert embedders[1].texts
        assert sorted(done) == sorted([len(embedders[0].texts), len(embedders[1].texts)])
        assert engines[1].store.vector_models() == {"minilm-l6-int8@1": 60}
        assert engines[1].store.pending_embeddings("minilm-l6-int8@1") == []
    finally:
        for engine in engines:
            engine.close()


@pytest.mark.postgres
def test_a_claim_for_one_model_does_not_hide_memories_from_another(pg_schema_dsn: str) -> None:
    # Servers sharing a database skip each other's claims of the same model; a worker of
    # another model (a server switching models, `ctxwarden embed` of a new one) must not skip
    # them: it would find nothing pending while the first embeds, and stop.
    from ctxwarden.store.postgres import PostgresStore

    first, second = PostgresStore(pg_schema_dsn), PostgresStore(pg_schema_dsn)
    try:
        Engine(first, config=EngineConfig(embed="off")).ingest([
            {"id": f"n{i}", "session": "s", "content": f"note {i} about the garden"}
            for i in range(3)
        ])  # fmt: skip
        seen: dict[str, list[str]] = {"same": [], "other": []}

        def vectors(texts: Sequence[str]) -> npt.NDArray[np.float32]:
            return np.ones((len(texts), 384), dtype=np.float32)

        def holding_the_claims(texts: Sequence[str]) -> npt.NDArray[np.float32]:
            # while the first store's transaction holds its claims of model "a"
            for name, model in (("same", "a"), ("other", "b")):
                second.embed_pending_batch(
                    model, lambda batch, n=name: seen[n].extend(batch) or vectors(batch)
                )
            return vectors(texts)

        assert len(first.embed_pending_batch("a", holding_the_claims, limit=10)) == 3
        assert seen["same"] == []  # the same model's claims are skipped
        assert sorted(seen["other"]) == [f"note {i} about the garden" for i in range(3)]
        assert first.vector_models() == {"a": 3, "b": 3}
    finally:
        first.close()
        second.close()


def test_a_text_the_embedder_gives_no_direction_does_not_break_search(clock: Clock) -> None:
    # The static model has no token for a lone control or combining character: its vector is
    # all zero. It is stored (the memory is not embedded again) and left out of the index.
    config = EngineConfig(embed="sync")
    with Engine.open(":memory:", clock=clock, config=config, embedder=StaticEmbedder()) as engine:
        engine.ingest([
            {"id": "blank", "session": "earlier", "content": "\x01"},
            {"id": "pet", "session": "earlier", "content": "my dog barks at the mailman"},
        ])  # fmt: skip
        assert engine.store.pending_embeddings(engine.embedder.name) == []
        context = engine.assemble(session="now", query="puppy noise", budget=500, scope="tenant")
        assert "pet" in _related(context)


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store_path(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A SQLite file, or a fresh PostgreSQL schema's DSN."""
    if request.param == "sqlite":
        return str(tmp_path / "old.db")
    dsn: str = request.getfixturevalue("pg_schema_dsn")
    return dsn


def test_a_store_embedded_with_the_float_path_goes_on_with_it(
    store_path: str, clock: Clock
) -> None:
    # A store made before MiniLM ran on int8 activations keeps working with the defaults: its
    # vectors stay usable and new memories get vectors of the same space, until it is moved.
    path = store_path
    float_path = EngineConfig(embedder="minilm-l6-int8@1", embed="off")
    with Engine.open(path, clock=clock, config=float_path) as engine:
        engine.ingest(_records(clock.now - DAY)[1:])
        assert engine.embed_pending() == len(_MEMORIES) - 1
    config = EngineConfig(embed="off")  # the default embedder, "minilm"
    with Engine.open(path, clock=clock, config=config) as engine:
        assert engine.embedder.name == "minilm-l6-int8@1"
        engine.ingest(_records(clock.now - DAY)[:1])
        assert engine.embed_pending() == 1
        assert engine.store.vector_models() == {"minilm-l6-int8@1": len(_MEMORIES)}
        context = engine.assemble(session="now", query=_QUESTION, budget=2000, scope="tenant")
        assert "vector" in _related(context)["m0"].components
        assert not any("ignored" in note for note in context.report.notes)
    # Moving it: re-embedded with the int8 path, which the defaults then use.
    moved = EngineConfig(embedder="minilm-l6-int8@2", embed="off")
    with Engine.open(path, clock=clock, config=moved) as engine:
        with pytest.raises(EmbedError, match="--reembed"):
            engine.embed_pending()
        assert engine.embed_pending(reembed=True) == len(_MEMORIES)
    with Engine.open(path, clock=clock, config=config) as engine:
        assert engine.embedder.name == "minilm-l6-int8@2"
        assert engine.store.vector_models() == {"minilm-l6-int8@2": len(_MEMORIES)}
        context = engine.assemble(session="now", query=_QUESTION, budget=2000, scope="tenant")
        assert "vector" in _related(context)["m0"].components


def test_a_new_store_is_embedded_with_int8_activations(clock: Clock) -> None:
    with Engine.open(":memory:", clock=clock, config=EngineConfig(embed="sync")) as engine:
        engine.ingest(_records(clock.now - DAY))
        assert engine.store.vector_models() == {"minilm-l6-int8@2": len(_MEMORIES)}
