"""The engine's in-process count cache (ctxwarden.counts): it serves the counts the store and the
tokenizer would, never a count made for other text, stays within its bound, and spares the store
the rows it holds."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from types import MappingProxyType
from typing import Any

import pytest

from conftest import Clock
from ctxwarden import render, tokens
from ctxwarden.counting import MemoryCounts
from ctxwarden.counts import CountCache, fingerprint
from ctxwarden.engine import Engine, EngineConfig
from ctxwarden.errors import ConfigError
from ctxwarden.store.base import Store, TokenCount
from ctxwarden.store.sqlite import SQLiteStore
from ctxwarden.types import Memory

TOKENIZER = "o200k_base"  # gpt-4o's


class CountingStore:
    """A real store that records the rowids ``token_counts`` is asked for."""

    def __init__(self, inner: Store) -> None:
        self.inner = inner
        self.asked: list[int] = []

    def token_counts(self, rowids: Sequence[int], tokenizer: str) -> dict[int, TokenCount]:
        self.asked.extend(rowids)
        return self.inner.token_counts(rowids, tokenizer)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def _history(n: int, *, session: str = "s", start: int = 0) -> list[dict[str, Any]]:
    return [
        {
            "id": f"h{i}",
            "session": session,
            "channel": "general",
            "author": ["ana", "bo", "cy"][i % 3],
            "content": f"message {i} about the deploy "
            + " ".join(f"w{(i * 7 + j) % 89}" for j in range(20)),
            "created_at": 1_700_000_000 + i * 60,
        }
        for i in range(start, start + n)
    ]  # fmt: skip


def _fresh(memory: Memory) -> tuple[int, int]:
    tok = tokens.get_tokenizer(TOKENIZER)
    return tok.count(render.message_text(memory)), tok.count(render.line_text(memory))


def _all(store: Store, session: str = "s") -> list[Memory]:
    return store.recent("default", session, limit=1000)


@pytest.fixture
def counting(store: Store) -> Iterator[CountingStore]:
    return CountingStore(store)


def test_cached_counts_equal_fresh_counts_and_spare_the_store(
    counting: CountingStore, clock: Clock
) -> None:
    engine = Engine(counting, clock=clock)  # type: ignore[arg-type]
    engine.ingest(_history(80))
    engine.embed_pending()  # every vector in: both turns retrieve from the same store
    first = engine.assemble(session="s", query="the deploy w3", budget=1500, log_inclusions=False)
    assert counting.asked  # the first assembly read (or made) its counts
    counting.asked.clear()
    second = engine.assemble(session="s", query="the deploy w3", budget=1500, log_inclusions=False)
    assert counting.asked == []  # every count it needed was cached
    assert second.messages == first.messages
    assert second.tokens == first.tokens
    memories = _all(counting.inner)
    tok = tokens.get_tokenizer(TOKENIZER)
    counts = engine._counter.counts(memories, tok)
    assert {m.rowid: (counts[m.rowid].message, counts[m.rowid].line) for m in memories} == {
        m.rowid: _fresh(m) for m in memories
    }
    # and what the store holds agrees (the cache never served a count the store lacks)
    stored = counting.inner.token_counts([m.rowid for m in memories], TOKENIZER)
    assert {r: (c.message, c.line) for r, c in stored.items()} == {
        m.rowid: _fresh(m) for m in memories
    }


def test_only_uncached_rowids_are_read(counting: CountingStore, clock: Clock) -> None:
    engine = Engine(counting, clock=clock)  # type: ignore[arg-type]
    engine.ingest(_history(20))
    tok = tokens.get_tokenizer(TOKENIZER)
    memories = _all(counting.inner)
    engine._counter.counts(memories[:12], tok)
    counting.asked.clear()
    engine._counter.counts(memories, tok)
    assert sorted(counting.asked) == sorted(m.rowid for m in memories[12:])


def test_another_writer_reusing_a_rowid_never_meets_a_stale_count(
    store: Store, clock: Clock
) -> None:
    """Engine ``a`` caches the count of the newest row; engine ``b`` (another process on the
    same database) erases that row and stores other text, which SQLite gives the same rowid."""
    counting = CountingStore(store)
    a = Engine(counting, clock=clock)  # type: ignore[arg-type]
    b = Engine(store, clock=clock)
    a.ingest(
        [*_history(10), {"id": "last", "session": "s", "content": "ok", "created_at": 1700001000}]
    )
    a.assemble(session="s", query="deploy", budget=1500, log_inclusions=False)
    old = next(m for m in _all(store) if m.id == "last")
    assert len(a._counter.cache) >= 11
    b.delete("last")
    b.ingest(
        [{"id": "new", "session": "s", "created_at": 1_700_001_000,
          "content": "a much longer message that costs many more tokens than the two letters did"}]
    )  # fmt: skip
    new = next(m for m in _all(store) if m.id == "new")
    if isinstance(store, SQLiteStore):
        assert new.rowid == old.rowid  # the case under test: the rowid was reused
    counting.asked.clear()
    context = a.assemble(session="s", query="deploy", budget=1500, log_inclusions=False)
    assert new.rowid in counting.asked  # the cached entry for that rowid did not match
    tok = tokens.get_tokenizer(TOKENIZER)
    got = a._counter.counts([new], tok)[new.rowid]
    assert (got.message, got.line) == _fresh(new) != _fresh(old)
    # the same turn assembled by an engine with an empty cache costs the same
    fresh = Engine(store, clock=clock).assemble(
        session="s", query="deploy", budget=1500, log_inclusions=False
    )
    assert context.messages == fresh.messages
    assert context.tokens == fresh.tokens


def test_a_memory_with_other_text_at_a_cached_rowid_misses() -> None:
    tok = tokens.get_tokenizer(TOKENIZER)
    cache = CountCache(size=100)
    old = _memory(content="short")
    count = TokenCount(rowid=old.rowid, tokenizer=tok.name, message=1, line=9)
    cache.fill([(old, count)])
    assert cache.lookup([old], tok.name) == ({old.rowid: count}, [])
    for other in (
        old._replace(content="other text", content_hash="h2"),  # reused rowid
        old._replace(content="Short"),  # same id and content hash (normalised), other text
        old._replace(metadata=MappingProxyType({"provenance": {"trusted": False}})),
    ):
        assert cache.lookup([other], tok.name) == ({}, [other])
    assert cache.lookup([old], "cl100k_base") == ({}, [old])  # another tokenizer


# One other value per Memory field, to check that whatever render reads moves the fingerprint.
_OTHER: dict[str, Any] = {
    "rowid": 8, "id": "m2", "tenant": "t2", "session": "s2", "channel": "ops", "author": "bo",
    "author_kind": "agent", "role": "assistant", "content": "other words", "created_at": 1e9 + 3600,
    "thread_id": "t", "reply_to": "r", "kind": "fact", "pinned": True, "name": "n",
    "tool_calls": ({"id": "c1"},), "tool_call_id": "c1", "content_hash": "h9", "dup_count": 4,
    "last_seen_at": 1e9 + 7200, "access_count": 3, "last_accessed_at": 5.0, "access_score": 2.0,
    "included_tokens_total": 40, "source_ids": ("a",), "time_range": (0.0, 1.0),
    "attachments": ({"name": "x"},),
    "metadata": MappingProxyType({"provenance": {"trusted": False}}),
    "latest_content": "newest",
    "user": "bob",
}  # fmt: skip


def _memory(**fields: Any) -> Memory:
    values: dict[str, Any] = {
        "rowid": 7, "id": "m1", "tenant": "default", "session": "s", "channel": None,
        "author": "ana", "author_kind": "human", "role": "user", "content": "short",
        "created_at": 1e9, "thread_id": None, "reply_to": None, "kind": "message",
        "pinned": False, "name": None, "tool_calls": (), "tool_call_id": None,
        "content_hash": "h1", "dup_count": 1, "last_seen_at": 1e9, "access_count": 0,
        "last_accessed_at": None, "access_score": 0.0, "included_tokens_total": 0,
    }  # fmt: skip
    values.update(fields)
    return Memory(**values)


@pytest.mark.parametrize("kind", ["message", "summary", "fact", "pinned"])
@pytest.mark.parametrize("role", ["user", "assistant", "tool"])
def test_every_field_render_reads_moves_the_fingerprint(kind: str, role: str) -> None:
    assert set(_OTHER) == set(Memory._fields)  # a new Memory field needs a value here
    base = _memory(kind=kind, role=role)
    # The related block's entry too: MemoryCounts.entries keys its counts by the fingerprint.
    texts = (render.message_text(base), render.line_text(base), render.entry_text(base))
    moved = []
    for name, value in _OTHER.items():
        other = base._replace(**{name: value})
        if (render.message_text(other), render.line_text(other), render.entry_text(other)) != texts:
            moved.append(name)
            assert fingerprint(other, TOKENIZER) != fingerprint(base, TOKENIZER), name
    assert "content" in moved  # the check above did run


def test_the_cache_stays_within_its_bound_oldest_out_first() -> None:
    cache = CountCache(size=8)
    memories = [_memory(rowid=i, content=f"text {i}") for i in range(20)]
    cache.fill(
        (m, TokenCount(rowid=m.rowid, tokenizer="t", message=i, line=i))
        for i, m in enumerate(memories)
    )
    assert len(cache) == 8
    found, missing = cache.lookup(memories, "t")
    assert sorted(found) == list(range(12, 20))
    assert [m.rowid for m in missing] == list(range(12))
    assert all(c.message == rowid for rowid, c in found.items())
    off = CountCache(size=0)
    off.fill([(memories[0], TokenCount(rowid=0, tokenizer="t", message=1, line=1))])
    assert len(off) == 0


def test_a_small_bound_changes_no_context(store: Store, clock: Clock) -> None:
    small = Engine(store, clock=clock, config=EngineConfig(count_cache_size=16))
    small.ingest(_history(120))
    small.embed_pending()  # every vector in: both engines retrieve from the same store
    for query in ("deploy w1", "w7 w9", "message 3", "deploy w1"):
        got = small.assemble(session="s", query=query, budget=2500, log_inclusions=False)
        assert len(small._counter.cache) <= 16
        want = Engine(store, clock=clock).assemble(
            session="s", query=query, budget=2500, log_inclusions=False
        )
        assert got.messages == want.messages
        assert got.tokens == want.tokens


def test_the_cache_holds_no_text_and_erasure_empties_it(engine: Engine) -> None:
    engine.ingest(_history(30))
    engine.assemble(session="s", query="the deploy", budget=1500)
    assert len(engine._counter.cache) >= 30
    for key, count in engine._counter.cache._entries.items():
        assert isinstance(key, int)
        assert isinstance(count, TokenCount)
        assert count.tokenizer == TOKENIZER  # the only string an entry holds
    # the related block's line counts too: by the memory's fingerprint, never the text
    related = engine._counter._entries
    assert related
    for key, count in related.items():
        assert isinstance(key, int)
        assert isinstance(count, int)
    engine.delete("h3")
    assert len(engine._counter.cache) == 0
    assert not engine._counter._entries


def test_threads_never_get_a_count_made_for_other_text() -> None:
    """Eight threads cache different texts at the same rowids in a cache too small for them
    all: each only ever gets back the counts of its own texts."""
    cache = CountCache(size=24)
    errors: list[str] = []

    def work(thread: int) -> None:
        memories = [_memory(rowid=r, content=f"thread {thread} row {r}") for r in range(16)]
        pairs = [
            (m, TokenCount(rowid=m.rowid, tokenizer="t", message=thread, line=m.rowid))
            for m in memories
        ]
        for _ in range(300):
            cache.fill(pairs)
            found, _ = cache.lookup(memories, "t")
            errors.extend(
                f"{thread}: {c}" for r, c in found.items() if c.message != thread or c.line != r
            )

    threads = [threading.Thread(target=work, args=(t,)) for t in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert len(cache) <= 24


def test_a_negative_bound_is_refused() -> None:
    with pytest.raises(ConfigError, match="count_cache_size"):
        EngineConfig(count_cache_size=-1)


def test_a_related_line_count_follows_the_memory_at_its_rowid() -> None:
    # MemoryCounts.entries keys its counts by fingerprint: the same rowid holding other text
    # (re-used by another writer), another author or another time is counted afresh.
    counts = MemoryCounts(SQLiteStore(":memory:"), size=100)
    tok = tokens.get_tokenizer(TOKENIZER)
    first = _memory(content="short")
    for other in (
        first,
        _memory(content="other words, and a good many more of them than before"),
        _memory(author="a much longer author name"),
        _memory(created_at=1e9 + 3600),
        first,
    ):
        assert counts.entries([other], tok) == {7: tok.count(render.entry_text(other))}
    assert len(counts._entries) == 4


def test_the_text_counter_counts_each_text_once_and_exactly() -> None:
    tok = tokens.get_tokenizer("o200k_base")
    calls: list[str] = []

    class Counting:
        name = tok.name

        def count(self, text: str) -> int:
            calls.append(text)
            return tok.count(text)

    counter = MemoryCounts(SQLiteStore(":memory:"), 2)
    count = counter.text_counter(Counting())  # type: ignore[arg-type]
    lines = ["- [m1] 08:00 ana: demo moved to Thursday\n", "- [m2] 08:01 bo: ok\n"]
    assert [count(t) for t in lines * 3] == [tok.count(t) for t in lines * 3]
    assert calls == lines  # counted once each
    assert all(isinstance(k, tuple) and "ana" not in repr(k) for k in counter._texts)
    count("a third text")  # over the bound: the cache starts again, the count stays exact
    assert len(counter._texts) == 1
    counter.clear()
    assert counter._texts == {}
    assert count(lines[0]) == tok.count(lines[0])
