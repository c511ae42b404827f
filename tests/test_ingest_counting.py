"""Ingest counts tokens before its write transaction, never while it holds the write lock
(issue 20, item 6: writers keep transactions short), and caches the same counts as before: those
of the stored memory, rendered as assembly renders it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from ctxwarden import Engine, EngineConfig, ingestion, render, tokens
from ctxwarden.store.sqlite import SQLiteStore


class _Watched:
    """A real tokenizer that records, at each count, whether the store's connection is inside
    a transaction."""

    def __init__(self, inner: tokens.Tokenizer, store: SQLiteStore, seen: list[bool]) -> None:
        self._inner = inner
        self._store = store
        self._seen = seen
        self.name = inner.name

    def count(self, text: str) -> int:
        self._seen.append(self._store._conn.in_transaction)
        return self._inner.count(text)

    def __getattr__(self, name: str) -> object:
        return getattr(self._inner, name)


@pytest.fixture
def watched(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Engine, list[bool]]]:
    seen: list[bool] = []
    with Engine.open(":memory:", config=EngineConfig(tokenizers=("o200k_base",))) as engine:
        store = engine.store
        assert isinstance(store, SQLiteStore)
        real = tokens.get_tokenizer
        monkeypatch.setattr(
            ingestion.tokens, "get_tokenizer", lambda name: _Watched(real(name), store, seen)
        )
        yield engine, seen


def _cached_counts(engine: Engine, id: str) -> tuple[int, int]:
    memory = engine.get(id)
    (count,) = engine.store.token_counts([memory.rowid], "o200k_base").values()
    return count.message, count.line


def _fresh_counts(engine: Engine, id: str) -> tuple[int, int]:
    memory = engine.get(id)
    tok = tokens.get_tokenizer("o200k_base")
    return tok.count(render.message_text(memory)), tok.count(render.line_text(memory))


def test_ingest_and_edits_count_outside_the_write_transaction(
    watched: tuple[Engine, list[bool]],
) -> None:
    engine, seen = watched
    engine.ingest(
        [
            {"id": "a", "content": "the deploy went out at noon", "author": "ana"},
            {
                "id": "b",
                "content": "kafka lag is back to normal",
                "author": "omar",
                "channel": "ops",
            },
            {"id": "c", "content": "the deploy went out at noon", "author": "ana"},  # folds
        ],
        session="s",
    )
    for id in ("a", "b"):
        assert _cached_counts(engine, id) == _fresh_counts(engine, id)
    # An edit through ingest (its stored time differs from the record's: counted after commit)
    engine.ingest(
        [{"id": "b", "content": "kafka lag is high again", "author": "omar"}], session="s"
    )
    assert _cached_counts(engine, "b") == _fresh_counts(engine, "b")
    # ... and through update (counted beforehand from the memory's own fields).
    engine.update("a", "the deploy went out at one instead")
    assert _cached_counts(engine, "a") == _fresh_counts(engine, "a")
    assert seen  # the counts were made, and none while the write transaction was open
    assert not any(seen)
