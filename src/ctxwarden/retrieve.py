"""Hybrid retrieval for the related block: what of the past matters for this turn.

Steps (every number below is a field of :class:`RetrievalWeights`; docs/retrieval.md explains
them):

1. **Candidates.** Lexical: the store's full-text search (FTS5 BM25 on SQLite, ``ts_rank_cd`` on
   PostgreSQL) for the query's terms. Vector: the store's nearest neighbours of the query's
   embedding, when the store holds vectors of the engine's embedding model. Either list may be
   empty: without vectors retrieval is BM25 plus recency, so an engine with embedding off works.
   Bridge: up to four words of each of the best ``bridge_hits`` hits that the query lacks are
   searched once more with the query's terms (a second hop for questions that need two
   messages).
2. **Fusion.** Reciprocal rank fusion, ``rrf = sum_i w_i / (k + rank_i)`` (rank from 1), with
   ``lexical`` and ``vector`` weights and ``rrf_k``; divided by the best candidate's value, so the
   ``relevance`` component is in (0, 1]. Ranks, not raw scores, are fused: BM25 and cosine are on
   scales that do not compare.
3. **Score.** ``score = relevance + recency * 0.5^(age / half_life) + access * (1 - e^-a) +
   author * [the memory's author is named in the query] * relevance``, where ``a`` is the memory's
   time-decayed access score (kept from the inclusion log). Newer wins among equals (an updated
   decision over the first one); memories assembled often before weigh a little more; a message
   by the person the question names ("what does omar use?") is preferred.
4. **Diversity.** Maximal marginal relevance over word sets: each pick pays
   ``(1 - mmr_lambda) * max Jaccard(similar picked memory)``, so near-identical memories do not
   crowd the block.
5. **Neighbours.** For the best ``expand`` hits, the turn just before in the same channel and
   the message a hit replies to (the other side of a question/answer pair) join with
   ``neighbours * parent score``: they come after every direct hit of higher value, so they are
   packed only when the budget allows.
6. **Packing order.** Value per token: ``score / tokens ^ density``; the assembler walks this order
   and skips what does not fit.

Every component is reported in :class:`~ctxwarden.types.CandidateReport`.

>>> from ctxwarden.store.sqlite import SQLiteStore
>>> store = SQLiteStore(":memory:")
>>> retrieve(store, tenant="default", query="deploy", now=0.0, cost=lambda ms: {}) == []
True
"""

from __future__ import annotations

import contextlib
import heapq
import math
import re
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from ctxwarden.assemble import query_terms
from ctxwarden.errors import ConfigError, NotFound
from ctxwarden.store.base import Store
from ctxwarden.types import Memory

__all__ = ["Hit", "RetrievalWeights", "retrieve"]

_WORDS = re.compile(r"\w+", re.UNICODE)


@dataclass(frozen=True, kw_only=True, slots=True)
class RetrievalWeights:
    """The constants of hybrid retrieval (see the module docstring and docs/retrieval.md).

    >>> RetrievalWeights().rrf_k
    20.0
    """

    lexical: float = 1.0
    vector: float = 1.0
    author_vector: float = 1.0
    author_candidates: int = 20
    bridge: float = 0.5
    bridge_hits: int = 2
    rrf_k: float = 20.0
    candidates: int = 100
    recency: float = 0.15
    half_life_days: float = 30.0
    access: float = 0.05
    author: float = 0.3
    mmr_lambda: float = 0.7
    mmr_top: int = 100
    expand: int = 8
    neighbours: float = 0.5
    density: float = 0.5

    def __post_init__(self) -> None:
        for name in ("lexical", "vector", "recency", "access", "author", "neighbours", "density"):
            if getattr(self, name) < 0:
                raise ConfigError(f"retrieval {name}: {getattr(self, name)} is negative")
        if self.rrf_k <= 0 or self.half_life_days <= 0:
            raise ConfigError("retrieval rrf_k and half_life_days must be positive")
        if not 0.0 <= self.mmr_lambda <= 1.0:
            raise ConfigError(f"retrieval mmr_lambda: {self.mmr_lambda} must be within [0, 1]")
        if self.candidates < 1 or self.expand < 0:
            raise ConfigError("retrieval candidates must be >= 1 and expand >= 0")


@dataclass(slots=True)
class Hit:
    """One retrieved memory, its value and the components that made it, in packing order."""

    memory: Memory
    score: float
    tokens: int
    components: dict[str, float] = field(default_factory=dict)


def _words(text: str) -> frozenset[str]:
    return frozenset(w for w in _WORDS.findall(text.casefold()) if len(w) > 2)


def _similarities(texts: Sequence[str]) -> npt.NDArray[np.float64]:
    """Pairwise Jaccard similarity of the texts' word sets (words hashed into 1,024 bits).

    The bit sets are 16 uint64 words a text, intersected for every pair at once and counted
    with ``np.bitwise_count``: no BLAS call (whose thread pool costs more than the work), ~3x
    less than a Python loop over the pairs, and the same values.
    """
    count = len(texts)
    rows: list[int] = []
    cols: list[int] = []
    slot: dict[str, int] = {}
    for i, text in enumerate(texts):
        for word in _words(text):
            bit = slot.get(word)
            if bit is None:
                bit = slot[word] = zlib.crc32(word.encode("utf-8", "surrogatepass")) & 1023
            rows.append(i)
            cols.append(bit)
    bits = np.zeros((count, 1024), dtype=bool)
    bits[rows, cols] = True
    masks = np.packbits(bits, axis=1).view(np.uint64)
    sizes = bits.sum(axis=1, dtype=np.int64)
    inter = np.bitwise_count(masks[:, None, :] & masks[None, :, :]).sum(axis=2, dtype=np.int64)
    union = sizes[:, None] + sizes[None, :] - inter
    similarity: npt.NDArray[np.float64] = np.zeros((count, count), dtype=np.float64)
    np.divide(inter, union, out=similarity, where=inter > 0)
    np.fill_diagonal(similarity, 0.0)
    return similarity


def _named(author: str | None, words: frozenset[str]) -> bool:
    if not author:
        return False
    parts = [p for p in _WORDS.findall(author.casefold()) if len(p) > 1]
    return bool(parts) and any(p in words for p in parts)


def retrieve(
    store: Store,
    *,
    tenant: str,
    query: str,
    now: float,
    cost: Callable[[Sequence[Memory]], Mapping[int, int]],
    query_vector: npt.NDArray[np.float32] | None = None,
    model: str | None = None,
    weights: RetrievalWeights | None = None,
    keep: Callable[[Memory], bool] | None = None,
    authors: Sequence[str] = (),
) -> list[Hit]:
    """Related memories for ``query``, best value per token first (see the module docstring).

    ``cost`` gives each memory's token cost as a related-block line (by rowid). ``query_vector``
    and ``model`` (the embedding model's name) enable vector candidates. ``keep`` filters
    candidates (e.g. tool results out). ``authors`` (the tenant's authors): those the query
    names get their own vector candidates, searched among their messages only. Reads only.
    """
    w = weights or RetrievalWeights()
    ranks: dict[int, dict[str, float]] = {}
    memories: dict[int, Memory] = {}

    def add(source: str, found: Sequence[tuple[Memory, float]]) -> None:
        rank = 0
        for memory, raw in found:
            if keep is not None and not keep(memory):
                continue
            rank += 1
            memories.setdefault(memory.rowid, memory)
            entry = ranks.setdefault(memory.rowid, {})
            if entry.get(f"{source}_rank", math.inf) > rank:  # a list searched twice: best rank
                entry[source] = raw
                entry[f"{source}_rank"] = float(rank)

    terms = query_terms(query)
    if terms and w.lexical > 0:
        add("bm25", store.search(tenant, terms, limit=w.candidates))
    query_words = _words(query)
    if query_vector is not None and model is not None:
        if w.vector > 0:
            add("vector", store.vector_search(tenant, model, query_vector, k=w.candidates))
        named = [a for a in authors if _named(a, query_words)][:3]
        for name in named if w.author_vector > 0 else []:
            found = store.vector_search(
                tenant, model, query_vector, k=w.author_candidates, author=name
            )
            add("author_vector", found)
    if not memories:
        return []

    # Bridge (a second hop): a question that needs two messages ("the flag of the feature that
    # lena works on") names the first; the second shares words with the first, not with the
    # question. The best hits' own words that the query lacks are searched once more.
    if w.bridge > 0 and w.bridge_hits > 0:
        first = sorted(
            ranks,
            key=lambda r: (-sum(1.0 / (w.rrf_k + v) for k, v in ranks[r].items()
                                if k.endswith("_rank")), r),
        )[: w.bridge_hits]  # fmt: skip
        asked = set(terms)
        for rowid in first:
            extra_terms = [t for t in query_terms(memories[rowid].content) if t not in asked][:4]
            if extra_terms:
                add("bridge", store.search(tenant, [*extra_terms, *terms], limit=20))

    sources = (
        ("bm25", w.lexical),
        ("vector", w.vector),
        ("author_vector", w.author_vector),
        ("bridge", w.bridge),
    )
    fused = {
        rowid: sum(
            weight / (w.rrf_k + entry[f"{source}_rank"])
            for source, weight in sources
            if f"{source}_rank" in entry
        )
        for rowid, entry in ranks.items()
    }
    best = max(fused.values()) or 1.0
    scored: dict[int, dict[str, float]] = {}
    named_author: dict[str | None, float] = {}  # a few authors among hundreds of candidates
    for rowid, entry in ranks.items():
        memory = memories[rowid]
        relevance = fused[rowid] / best
        age_days = max(0.0, now - memory.created_at) / 86400.0
        recency = 0.5 ** (age_days / w.half_life_days)
        access = 1.0 - math.exp(-max(0.0, memory.access_score))
        author = named_author.get(memory.author)
        if author is None:
            author = named_author[memory.author] = float(_named(memory.author, query_words))
        components = dict(entry)
        components.update(relevance=relevance, recency=recency, access=access, author=author)
        components["value"] = (
            relevance + w.recency * recency + w.access * access + w.author * author * relevance
        )
        scored[rowid] = components

    # MMR over word sets, greedy, among the best `mmr_top` (the rest keep their value order).
    order = sorted(scored, key=lambda r: (-scored[r]["value"], r))
    head, tail = order[: w.mmr_top], order[w.mmr_top :]
    similarity = _similarities([memories[r].content for r in head])
    # Lazy greedy (a heap of upper bounds): a memory's adjusted value only falls as picks are
    # made, so the best stale bound, once refreshed and still best, is the argmax; ties go to
    # the lower index (higher value, lower rowid). The same picks as recomputing every value
    # at every step, in ~1/3 of the time.
    mu = 1.0 - w.mmr_lambda
    lifted = [w.mmr_lambda * scored[r]["value"] for r in head]
    nearest = np.zeros(len(head))
    near = [0.0] * len(head)
    bounds = [(-value, index) for index, value in enumerate(lifted)]
    heapq.heapify(bounds)
    picked: list[int] = []
    while bounds:
        _, index = heapq.heappop(bounds)
        fresh = (-(lifted[index] - mu * near[index]), index)
        if bounds and fresh > bounds[0]:
            heapq.heappush(bounds, fresh)
            continue
        rowid = head[index]
        penalty = mu * near[index]
        scored[rowid]["mmr_penalty"] = penalty
        scored[rowid]["score"] = scored[rowid]["value"] - penalty
        picked.append(rowid)
        np.maximum(nearest, similarity[index], out=nearest)
        near = nearest.tolist()
    for rowid in tail:
        scored[rowid]["mmr_penalty"] = 0.0
        scored[rowid]["score"] = scored[rowid]["value"]
        picked.append(rowid)

    # Neighbours of the best hits: the turn before in the channel, the message replied to.
    extra: dict[int, tuple[Memory, dict[str, float]]] = {}
    for rowid in picked[: w.expand] if w.neighbours > 0 else []:
        hit = memories[rowid]
        parent = scored[rowid]["score"]
        for neighbour in _neighbours(store, tenant, hit):
            if neighbour.rowid in scored or (keep is not None and not keep(neighbour)):
                continue
            known = extra.get(neighbour.rowid)
            score = w.neighbours * parent
            if known is None or known[1]["score"] < score:
                extra[neighbour.rowid] = (neighbour, {"neighbour": parent, "score": score})
    for rowid, (memory, components) in extra.items():
        memories[rowid] = memory
        scored[rowid] = components

    costs = cost(list(memories.values()))
    hits = []
    for rowid, components in scored.items():
        tokens = max(1, int(costs.get(rowid, 1)))
        density = components["score"] / tokens**w.density
        components["density"] = density
        hits.append(Hit(memory=memories[rowid], score=components["score"], tokens=tokens,
                        components=components))  # fmt: skip
    hits.sort(key=lambda h: (-h.components["density"], h.memory.rowid))
    return hits


def _neighbours(store: Store, tenant: str, hit: Memory) -> list[Memory]:
    out: list[Memory] = []
    before = store.recent(
        tenant, hit.session, channel=hit.channel, before=(hit.created_at, hit.rowid), limit=1
    )
    out.extend(before)
    if hit.reply_to and not any(m.id == hit.reply_to for m in out):
        with contextlib.suppress(NotFound):
            out.append(store.get(tenant, hit.reply_to))
    return out


def describe(weights: RetrievalWeights) -> dict[str, Any]:
    """The weights as a plain dict (for reports and docs)."""
    return {name: getattr(weights, name) for name in weights.__dataclass_fields__}
