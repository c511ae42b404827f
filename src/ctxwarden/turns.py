"""A conversation turn read with the turn before it: the context list of retrieval
(:mod:`ctxwarden.retrieve`, docs/retrieval.md). Reads only."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ctxwarden.scope import ReadScope
from ctxwarden.store.base import Store
from ctxwarden.types import Memory

__all__ = ["in_context"]


def in_context(
    store: Store,
    tenant: str,
    near: Sequence[tuple[Memory, float]],
    *,
    anchors: int,
    share: float,
    scope: ReadScope | None = None,
    pool: Sequence[tuple[int, float]] | None = None,
    known: Mapping[int, Memory] | None = None,
) -> list[tuple[Memory, float]]:
    """The nearest vectors (``near``: memory and cosine, best first) re-ranked with the turn
    before each: ``cosine(turn) + share * cosine(previous turn)``, best first.

    A turn is embedded alone, but in a conversation it is read after the one before it: "Yes,
    three of them" answers "Do you have kids?", and the question holds the words. The first
    ``anchors`` of ``near`` and the turn after each (found through its predecessor) are scored
    so, in one :meth:`Store.neighbours` read (``turns=1``): the cosines are those of ``near``
    (retrieval's ``context_pool`` times its usual number of nearest vectors), a turn not in it
    counts as its last cosine (an upper bound of its own), a turn with nothing before it (a
    session's first) gets no context. The stored vectors are used as they are: no
    turn is embedded again. On locomo-dev's stored MiniLM vectors (categories 1-4, vector
    ranking alone) the evidence in the first 10 / 20 / 50 goes from 34.0 / 44.7 / 61.3 % to
    40.3 / 52.5 / 66.5 % with 40 anchors and a share of 0.5 (0.7: 41.1 / 52.7 / 64.3; 20
    anchors: 39.8 / 50.8 / 64.1; every turn with its own predecessor's exact cosine: 40.9 /
    53.4 / 67.7, so 40 anchors hold most of it).

    ``pool``: the ``(rowid, cosine)`` pairs of the whole pool when ``near`` holds only its
    first memories (at least ``anchors``; :meth:`Store.vector_nearest`): the memories of the
    others are never used. ``known``: memories read already (by rowid), not read again.
    """
    if not near:
        return []
    if pool is None:
        pool = [(memory.rowid, score) for memory, score in near]
    cosine = dict(pool)
    floor = pool[-1][1]
    first = [memory for memory, _ in near[:anchors]]
    links = store.neighbours(tenant, first, turns=1, replies=0, scope=scope, known=known)
    before: dict[int, Memory] = {}
    turns: dict[int, tuple[Memory, float]] = {}  # rowid -> (memory, its previous turn's cosine)
    for link in links:
        anchor = first[link.anchor]
        if link.relation == "before":
            before[anchor.rowid] = link.memory
        elif link.relation == "after" and link.memory.rowid not in turns:
            turns[link.memory.rowid] = (link.memory, cosine.get(anchor.rowid, floor))
    for anchor in first:
        previous = before.get(anchor.rowid)
        turns[anchor.rowid] = (
            anchor,
            0.0 if previous is None else cosine.get(previous.rowid, floor),
        )
    scored = [
        (memory, cosine.get(rowid, floor) + share * previous)
        for rowid, (memory, previous) in turns.items()
    ]
    scored.sort(key=lambda pair: (-pair[1], pair[0].rowid))
    return scored
