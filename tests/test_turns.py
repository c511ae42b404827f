"""Turns read in context (:func:`ctxwarden.turns.in_context`) on a real store: the pool's
memories beyond the anchors are never needed, only their cosines."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from ctxwarden.store.base import NewMemory
from ctxwarden.store.sqlite import SQLiteStore
from ctxwarden.turns import in_context
from ctxwarden.types import Memory


def _store(count: int) -> tuple[SQLiteStore, list[Memory]]:
    store = SQLiteStore(":memory:")
    with store.write() as w:
        for i in range(count):
            w.insert(
                NewMemory(
                    id=f"m{i}", tenant="t", session=f"s{i % 3}", channel=None,
                    author="ana" if i % 2 else "bo", author_kind="human", role="user",
                    content=f"turn {i}", created_at=100.0 + i, thread_id=None, reply_to=None,
                    kind="message", pinned=False, name=None, tool_calls=(), tool_call_id=None,
                    attachments=(), metadata={}, content_hash=f"h{i}",
                )
            )  # fmt: skip
    return store, list(store.iter_memories("t"))


STORE, MEMORIES = _store(60)


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    pool=st.integers(1, 60),
    anchors=st.integers(0, 70),
    share=st.sampled_from([0.0, 0.5, 1.0]),
)
def test_the_pool_gives_cosines_and_the_anchors_memories(
    seed: int, pool: int, anchors: int, share: float
) -> None:
    rng = random.Random(seed)
    chosen = rng.sample(MEMORIES, pool)
    cosines = sorted((round(rng.uniform(-1, 1), 2) for _ in chosen), reverse=True)  # ties
    near = list(zip(chosen, cosines, strict=True))
    whole = in_context(STORE, "t", near, anchors=anchors, share=share)
    pairs = [(m.rowid, c) for m, c in near]
    first = near[: max(1, anchors)]
    assert in_context(STORE, "t", first, anchors=anchors, share=share, pool=pairs) == whole
    # An anchor's score, from the memories themselves: its cosine plus a share of the turn
    # before it in its session (the pool's last cosine when outside it, 0 for a first turn).
    cosine = {m.rowid: c for m, c in near}
    got = {m.rowid: s for m, s in whole}
    for memory, own in near[:anchors]:
        earlier = [m for m in MEMORIES if m.session == memory.session and m.rowid < memory.rowid]
        previous = 0.0 if not earlier else cosine.get(earlier[-1].rowid, cosines[-1])
        assert got[memory.rowid] == own + share * previous


def test_nothing_near_is_nothing_in_context() -> None:
    assert in_context(STORE, "t", [], anchors=5, share=0.5, pool=[]) == []
