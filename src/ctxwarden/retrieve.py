"""Hybrid retrieval for the related block: what of the past matters for this turn.

Steps (every number below is a field of :class:`RetrievalWeights`; docs/retrieval.md explains
them):

1. **Candidates.** Lexical: the store's full-text search (FTS5 BM25 on SQLite, BM25 over the
   ``tsvector`` on PostgreSQL) for the query's terms. Vector: the store's nearest neighbours of
   the query's embedding, when the store holds vectors of the engine's embedding model. Either
   list may be empty: without vectors retrieval is BM25 plus recency, so an engine with embedding
   off works. The assembler embeds the query less the names of the people it names
   (:func:`ctxwarden.focus.vector_text`). Context: the nearest turns and the turns after them
   ranked by their cosine plus ``context_share`` times the turn before's
   (:func:`ctxwarden.turns.in_context`).
   Bridge: up to four words of each of the best ``bridge_hits`` hits that the query lacks are
   searched once more with the query's terms (a second hop for questions that need two
   messages).
2. **Fusion.** Reciprocal rank fusion, ``rrf = sum_i w_i / (k + rank_i)`` (rank from 1), with
   ``lexical`` and ``vector`` weights and ``k`` = ``rrf_k`` (the assembler sizes it to the related
   block, :func:`ctxwarden.assembly.fusion_k`); divided by the best candidate's value, so the
   ``relevance`` component is in (0, 1]. Ranks, not raw scores, are fused: BM25 and cosine are on
   scales that do not compare.
3. **Score.** ``score = relevance * (1 + recency * 0.5^(age / half_life) + author * [the
   memory's author is named in the query] + entity * share) + access * (1 - e^-a)``, where
   ``a`` is the memory's time-decayed access score (kept from the inclusion log) and ``share``
   the part of the query's entities (names, acronyms, identifiers, numbers;
   :func:`~ctxwarden.entities.entities`) the memory names verbatim. Newer wins among equals
   (an updated decision over the first one): recency scales with relevance, so it orders
   memories of like relevance and never lifts a barely related recent one over a relevant
   older one; memories assembled often before weigh a little more; a message by the person
   the question names ("what does omar use?") is preferred.
4. **Diversity.** Maximal marginal relevance over word sets: each pick pays
   ``(1 - mmr_lambda) * max Jaccard(similar picked memory)``, so near-identical memories do not
   crowd the block.
5. **Neighbours.** Around the best ``expand`` hits, read in one store statement
   (:meth:`~ctxwarden.store.base.Store.neighbours`): the turns before and after, the answers of
   a question and the question of an answer, replies, siblings and the thread root join with a
   share of their hit's score (:func:`_relations`); they are packed by value per token like any
   candidate, so they join only when the budget allows. When the query names people, a
   neighbour by someone else keeps ``max(bystander, its own relevance)`` of its score: the
   other side's turns around a named person's are about the other side.
6. **Packing order.** Value per token: ``score / tokens ^ density``; the assembler walks this order
   and skips what does not fit.

Every component is reported in :class:`~ctxwarden.types.CandidateReport`.

>>> from ctxwarden.store.sqlite import SQLiteStore
>>> store = SQLiteStore(":memory:")
>>> retrieve(store, tenant="default", query="deploy", now=0.0, cost=lambda ms: {}) == []
True
"""

from __future__ import annotations

import functools
import heapq
import math
import re
import zlib
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from ctxwarden.assemble import query_terms
from ctxwarden.attachments import search_text
from ctxwarden.entities import entity_patterns, entity_share
from ctxwarden.errors import ConfigError, InputError
from ctxwarden.focus import Focus, asked_words, focus, name_words, said_name, without_words
from ctxwarden.scope import ReadScope, in_scope
from ctxwarden.segment import bigrams, has_run, split_runs
from ctxwarden.store.base import Store
from ctxwarden.turns import in_context
from ctxwarden.types import Memory
from ctxwarden.vectors import _numkong

__all__ = ["MAX_QUERY_CHARS", "Hit", "RetrievalWeights", "check_query_length", "retrieve"]

#: The longest query :meth:`~ctxwarden.engine.Engine.assemble` and ``search`` accept, in
#: characters (``EngineConfig.max_query_chars``): longer is an :class:`InputError` naming
#: ``query`` (422 over HTTP). About 50k tokens of English: room for a pasted document.
MAX_QUERY_CHARS = 200_000

_WORDS = re.compile(r"\w+", re.UNICODE)
#: ``ranks`` entry keys of each candidate source, made once (not an f-string per row).
_RANK_KEYS = {
    s: f"{s}_rank"
    for s in ("bm25", "vector", "author_vector", "bridge", "speaker", "dated", "dated_vector",
              "context")
}  # fmt: skip
_RANK_KEY_SET = frozenset(_RANK_KEYS.values())


@dataclass(frozen=True, kw_only=True, slots=True)
class RetrievalWeights:
    """The constants of hybrid retrieval (see the module docstring and docs/retrieval.md).

    >>> RetrievalWeights().rrf_k
    20.0
    """

    lexical: float = 1.0
    vector: float = 1.0
    author_vector: float = 1.0
    #: Nearest turns read per named author (the ``author_vector`` list); the assembler asks
    #: for this many per 1,000 tokens of the related block, at least this many
    #: (:func:`ctxwarden.assembly.author_candidates`).
    author_candidates: int = 20
    bridge: float = 0.5
    bridge_hits: int = 2
    bridge_candidates: int = 10
    rrf_k: float = 20.0
    #: The assembler sizes ``rrf_k`` to the related block: this many per 1,000 of its tokens,
    #: within [2, 60] (:func:`ctxwarden.assembly.fusion_k`); 0 keeps ``rrf_k`` at every size,
    #: which is also what :func:`retrieve` called directly uses.
    rrf_k_per_thousand: float = 7.0
    candidates: int = 100
    recency: float = 0.15
    half_life_days: float = 30.0
    access: float = 0.05
    author: float = 0.3
    mmr_lambda: float = 0.7
    mmr_top: int = 100
    expand: int = 4
    neighbours: float = 0.5
    answer: float = 0.8
    thread: float = 0.3
    neighbour_decay: float = 0.5
    turns: int = 3
    replies: int = 4
    entity: float = 0.3
    #: Packing order ``score / tokens ** density``: 0.3, not 0.5, so a line twice as long
    #: needs 23 % more score (not 41 %); a conversation's long turns hold the stories asked
    #: about (docs/retrieval.md, step 6).
    density: float = 0.3
    speaker: float = 1.0
    dated: float = 1.0
    in_time: float = 0.5
    coverage: float = 0.0
    list_coverage: float = 0.1
    #: A neighbour by someone the query does not name, when it names people, keeps this share
    #: of its score, or its own relevance if higher: the named people's evidence is in their
    #: own turns, and the other side's turns around them are about the other side
    #: (docs/retrieval.md, step 5).
    bystander: float = 0.3
    #: Turns in context (a turn read with the one before it, :func:`ctxwarden.turns.in_context`):
    #: RRF weight of the list, share of the previous turn's cosine, how many of the nearest
    #: vectors are read with their turns, and the cosines known (``context_pool`` times
    #: ``candidates`` nearest).
    context: float = 1.0
    context_share: float = 0.5
    context_anchors: int = 40
    context_pool: int = 4
    #: The query's vector is made without the names of the people it names
    #: (:func:`ctxwarden.focus.vector_text`; the assembler embeds that text).
    name_free: bool = True
    #: Only the query's first ``query_chars`` characters drive retrieval (search terms,
    #: entities, the query's embedding); the whole query is still sent to the model.
    query_chars: int = 4_000
    #: At most this many of the query's entities (the first found) are matched in candidates.
    max_entities: int = 32

    def __post_init__(self) -> None:
        for name in ("lexical", "vector", "recency", "access", "author", "neighbours", "answer",
                     "thread", "neighbour_decay", "entity", "density", "speaker", "dated",
                     "in_time", "coverage", "list_coverage", "bystander", "context",
                     "context_share", "rrf_k_per_thousand"):  # fmt: skip
            if getattr(self, name) < 0:
                raise ConfigError(f"retrieval {name}: {getattr(self, name)} is negative")
        if self.rrf_k <= 0 or self.half_life_days <= 0:
            raise ConfigError("retrieval rrf_k and half_life_days must be positive")
        if not 0.0 <= self.mmr_lambda <= 1.0:
            raise ConfigError(f"retrieval mmr_lambda: {self.mmr_lambda} must be within [0, 1]")
        if self.candidates < 1 or self.bridge_candidates < 1 or self.expand < 0:
            raise ConfigError(
                "retrieval candidates and bridge_candidates must be >= 1 and expand >= 0"
            )
        if self.turns < 0 or self.replies < 0 or self.context_anchors < 0:
            raise ConfigError("retrieval turns, replies and context_anchors must be >= 0")
        if self.context_pool < 1:
            raise ConfigError(f"retrieval context_pool: {self.context_pool} must be >= 1")
        if self.query_chars < 1 or self.max_entities < 0:
            raise ConfigError(
                f"retrieval query_chars ({self.query_chars}) must be >= 1 and max_entities "
                f"({self.max_entities}) >= 0"
            )


def check_query_length(query: str | None, limit: int) -> None:
    """Refuse a query longer than ``limit`` characters (:class:`InputError` naming ``query``).

    >>> check_query_length("deploy", 10)
    >>> check_query_length("x" * 11, 10)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ctxwarden.errors.InputError: field 'query': 11 characters, over the limit of 10: ...
    """
    if query is not None and len(query) > limit:
        raise InputError(
            f"{len(query):,} characters, over the limit of {limit:,}: shorten it, or raise "
            "max_query_chars",
            field="query",
        )


@dataclass(slots=True)
class Hit:
    """One retrieved memory, its value and the components that made it, in packing order."""

    memory: Memory
    score: float
    tokens: int
    components: dict[str, float] = field(default_factory=dict)
    #: A neighbour's anchor (the hit it is a neighbour of, by rowid), -1 for a direct hit: a
    #: neighbour is context for its anchor, so it is packed after it and only with it.
    anchor: int = -1


def _words(text: str) -> frozenset[str]:
    """The words of ``text`` longer than two characters, and the character bigrams of its
    runs in scripts written without spaces (:mod:`ctxwarden.segment`: such a run is one
    ``\\w+`` match, so two Chinese messages sharing words would share no word)."""
    folded = text.casefold()
    words = {w for w in _WORDS.findall(folded) if len(w) > 2}
    if not folded.isascii() and has_run(folded):
        for piece, is_run in split_runs(folded):
            if is_run:
                words.update(bigrams(piece))
    return frozenset(words)


#: Word-set masks of recently compared texts by the text's ``hash`` (see :func:`_mask`); emptied
#: when full. Keyed by hash, not by text, so the cache never holds a memory's words (an erased
#: memory's text is not kept alive in the process); a hash collision (64 bits) could only skew
#: one similarity in MMR.
_MASKS: dict[int, tuple[bytes, int]] = {}
_MASKS_MAX = 20_000


def _mask(text: str) -> tuple[bytes, int]:
    """The text's word set hashed into 1,024 bits (128 bytes, little-endian) and the count of
    bits set. Cached: the same memories come back turn after turn, and tokenising and hashing
    their words was most of the similarity step."""
    key = hash(text)
    hit = _MASKS.get(key)
    if hit is None:
        bits = 0
        for word in _words(text):
            bits |= 1 << (zlib.crc32(word.encode("utf-8", "surrogatepass")) & 1023)
        hit = (bits.to_bytes(128, "little"), bits.bit_count())
        if len(_MASKS) >= _MASKS_MAX:
            _MASKS.clear()
        _MASKS[key] = hit
    return hit


@functools.lru_cache(maxsize=8)
def _upper(count: int) -> npt.NDArray[np.bool_]:
    """The strict upper triangle of a ``count`` x ``count`` matrix, as a read-only mask."""
    upper = np.triu(np.ones((count, count), dtype=bool), 1)
    upper.flags.writeable = False
    return upper


def _similarities(texts: Sequence[str]) -> npt.NDArray[np.float64]:
    """Pairwise Jaccard similarity of the texts' word sets (words hashed into 1,024 bits).

    numkong's bit-set kernel gives every pair's Jaccard distance (SIMD popcounts of the
    intersection and union) from the 128-byte masks of :func:`_mask`, in float32: within 1e-7
    of the exact ratio, in one call (~0.03 ms for 100 texts, against ~0.15 ms for Hamming
    distances turned into ratios with numpy, and ~0.5 ms for numpy's ``bitwise_count`` over
    every pair's 16 words).
    """
    count = len(texts)
    packed = [_mask(text) for text in texts]
    masks = np.frombuffer(b"".join([m for m, _ in packed]), dtype=np.uint8).reshape(count, 128)
    # Only the upper triangle is written (the rest is whatever the memory held, so it is
    # masked before any arithmetic): mirror it. Two empty sets (distance 0 in the kernel)
    # share nothing: similar to nothing, as a memory is to itself.
    # (A cached mask of the upper triangle, not np.triu's twice built one: the same values.)
    upper = _upper(count)
    distance = np.where(upper, np.asarray(_numkong().jaccards_symmetric(masks, dtype="uint1")), 0)
    similarity: npt.NDArray[np.float64] = np.zeros((count, count))
    np.subtract(1.0, distance, out=similarity, where=upper, dtype=np.float64)
    similarity += similarity.T
    empty = [index for index, (_, size) in enumerate(packed) if not size]
    if empty:
        similarity[empty, :] = 0.0
        similarity[:, empty] = 0.0
    return similarity


def _named(author: str | None, words: frozenset[str]) -> bool:
    if not author:
        return False
    if said_name(author, words):
        return True
    # A name in a script without spaces is named by its bigrams (李娜 in 李娜说了什么).
    return any(has_run(p) and all(b in words for b in bigrams(p)) for p in name_words(author))


#: A query's vector, or a function that waits for it (None: not embedded after all).
LazyVector = npt.NDArray[np.float32] | Callable[[], npt.NDArray[np.float32] | None] | None


def retrieve(
    store: Store,
    *,
    tenant: str,
    query: str,
    now: float,
    cost: Callable[[Sequence[Memory]], Mapping[int, int]],
    query_vector: LazyVector = None,
    model: str | None = None,
    weights: RetrievalWeights | None = None,
    keep: Callable[[Memory], bool] | None = None,
    authors: Sequence[str] = (),
    scope: ReadScope | None = None,
) -> list[Hit]:
    """Related memories for ``query``, best value per token first (see the module docstring).

    ``cost`` gives each memory's token cost as a related-block line (by rowid). ``query_vector``
    and ``model`` (the embedding model's name) enable vector candidates; a function giving the
    vector (or None) is called after the lexical search, so an embedding made in another thread
    runs meanwhile. ``keep`` filters
    candidates (e.g. tool results out). ``authors`` (the tenant's authors): those the query
    names get their own vector candidates, searched among their messages only. ``scope``
    confines every store read (searches, neighbours) to a session's or an end user's memories,
    in the store's queries. Reads only.
    """
    w = weights or RetrievalWeights()
    query = query[: w.query_chars]  # bounds every step below, whatever the query's length
    ranks: dict[int, dict[str, float]] = {}
    memories: dict[int, Memory] = {}

    def add(source: str, found: Sequence[tuple[Memory, float]]) -> None:
        rank = 0
        rank_key = _RANK_KEYS[source]
        for memory, raw in found:
            if keep is not None and not keep(memory):
                continue
            rank += 1
            memories.setdefault(memory.rowid, memory)
            entry = ranks.setdefault(memory.rowid, {})
            if entry.get(rank_key, math.inf) > rank:  # a list searched twice: best rank
                entry[source] = raw
                entry[rank_key] = float(rank)

    terms = query_terms(query)
    if terms and w.lexical > 0:
        add("bm25", store.search(tenant, terms, limit=w.candidates, scope=scope))
    # The searches for what the query is about by words (_focused) need no vector: they run
    # while the query is still being embedded (in another thread), for the people named among
    # the authors known so far, and again below only if the vector hits add one. Not when
    # nothing was found and no vector comes (retrieval ends below, as it did).
    seen = {m.author for m in memories.values()}.union(authors)
    early = focus(query, now=now, authors=seen)
    focused = (
        _focused(store, early, tenant=tenant, terms=terms, w=w, scope=scope, known=memories)
        if memories or (query_vector is not None and model is not None)
        else []
    )
    query_vector = query_vector() if callable(query_vector) else query_vector
    # The words that can name people (two letters count: "Bo", "Li"), as in focus(), and the
    # bigrams that name a CJK author (_named).
    query_words = _words(query) | asked_words(query)
    pool_hits: list[tuple[int, float]] | None = None
    if query_vector is not None and model is not None:
        named = [a for a in authors if _named(a, query_words)][:3]
        contextual = w.context > 0 and w.context_anchors > 0
        if w.vector > 0 or contextual:
            pool = w.candidates * (w.context_pool if contextual else 1)
            pool_hits = store.vector_nearest(tenant, model, query_vector, k=pool, scope=scope)
            # Only the memories used are read (the pool's others give their cosines).
            read = max(w.candidates if w.vector > 0 else 0, w.context_anchors if contextual else 0)
            near = _memories_of(
                store, pool_hits[:read], _read_so_far(memories, focused), tenant, scope
            )
            if w.vector > 0:
                add("vector", near[: w.candidates])
            if contextual:
                found = in_context(store, tenant, near, anchors=w.context_anchors,
                                   share=w.context_share, scope=scope, pool=pool_hits,
                                   known=_read_so_far(memories, focused))  # fmt: skip
                add("context", found)
        for name in named if w.author_vector > 0 else []:
            hits = store.vector_nearest(
                tenant, model, query_vector, k=w.author_candidates, author=name, scope=scope
            )  # the memories of those not read yet are read
            found = _memories_of(store, hits, _read_so_far(memories, focused), tenant, scope)
            add("author_vector", found)
    if not memories:
        return []
    aim = early
    if not seen.issuperset(m.author for m in memories.values()):
        aim = focus(query, now=now, authors=[*(m.author for m in memories.values()), *authors])
        if (aim.people, aim.name_terms) != (early.people, early.name_terms):
            focused = _focused(store, aim, tenant=tenant, terms=terms, w=w, scope=scope,
                               known=memories)  # fmt: skip
    if aim.spans and w.dated > 0 and query_vector is not None and model is not None:
        if pool_hits is not None and pool == 4 * w.candidates:  # the same search: not again
            near = _memories_of(store, pool_hits, _read_so_far(memories, focused), tenant, scope)
        else:
            near = store.vector_search(tenant, model, query_vector, k=4 * w.candidates, scope=scope)
        focused.append(("dated_vector", [(m, r) for m, r in near if aim.when(m) > 0]))
    for source, found in focused:
        add(source, found)

    # Bridge (a second hop): a question that needs two messages ("the flag of the feature that
    # lena works on") names the first; the second shares words with the first, not with the
    # question. The best hits' own words that the query lacks are searched once more.
    if w.bridge > 0 and w.bridge_hits > 0:
        first = heapq.nsmallest(  # sorted(...)[: w.bridge_hits], without sorting them all
            w.bridge_hits,
            ranks,
            key=lambda r: (-sum(1.0 / (w.rrf_k + v) for k, v in ranks[r].items()
                                if k in _RANK_KEY_SET), r),
        )  # fmt: skip
        asked = set(terms)
        hop = w.bridge_candidates
        for rowid in first:
            extra_terms = bridge_terms(memories[rowid], asked)
            if extra_terms:
                # Only if a new word is worth searching: else the hop repeats the main search.
                found = store.search(
                    tenant,
                    [*extra_terms, *terms],
                    limit=hop,
                    require=extra_terms,
                    known=memories,
                    scope=scope,
                )
                add("bridge", found)

    sources = (
        ("bm25", w.lexical),
        ("vector", w.vector),
        ("author_vector", w.author_vector),
        ("bridge", w.bridge),
        ("speaker", w.speaker),
        ("dated", w.dated),
        ("dated_vector", w.dated),
        ("context", w.context),
    )
    keyed = [(_RANK_KEYS[source], weight) for source, weight in sources]
    fused = {  # sum of a list, not a generator: the same terms in the same order, sooner
        rowid: sum([weight / (w.rrf_k + entry[key]) for key, weight in keyed if key in entry])
        for rowid, entry in ranks.items()
    }
    best = max(fused.values()) or 1.0
    entities = entity_patterns(_without_spans(query, aim), limit=w.max_entities)
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
        # Recency scales with relevance ("newer wins among equals"): added flat, it outweighed
        # the small relevance of a deep pool's tail, so a larger pool let recent chatter in.
        value = (relevance * (1.0 + w.recency * recency + w.author * author)
                 + w.access * access)  # fmt: skip
        # One dict display (not dict() then update()): ~200 candidates a turn.
        components = {**entry, "relevance": relevance, "recency": recency, "access": access,
                      "author": author, "value": value}  # fmt: skip
        if entities:
            entity = entity_share(entities, _said(memory, aim))
            components["entity"] = entity
            components["value"] = value + w.entity * entity * relevance
        if aim.spans:
            when = aim.when(memory)
            components["when"] = when
            components["value"] += w.in_time * when
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
    nearest = np.zeros(len(head))  # each memory's greatest similarity to a pick so far
    crowd = _Crowding([memories[r] for r in head], aim, w)
    bounds = [(-value, index) for index, value in enumerate(lifted)]
    heapq.heapify(bounds)
    picked: list[int] = []
    while bounds:
        _, index = heapq.heappop(bounds)
        penalty = mu * nearest.item(index) + crowd.penalty(index)
        fresh = (-(lifted[index] - penalty), index)
        if bounds and fresh > bounds[0]:
            heapq.heappush(bounds, fresh)
            continue
        rowid = head[index]
        components = scored[rowid]
        components["mmr_penalty"] = penalty
        components["score"] = components["value"] - penalty
        picked.append(rowid)
        np.maximum(nearest, similarity[index], out=nearest)
        crowd.pick(index)
    for rowid in tail:
        scored[rowid]["mmr_penalty"] = 0.0
        scored[rowid]["score"] = scored[rowid]["value"]
        picked.append(rowid)

    # Neighbours of the best hits: the turns around each, its thread, the other side of its
    # question/answer pair (see _relations), in one store call (Store.neighbours).
    expanding = w.neighbours + w.answer + w.thread > 0
    anchors = [memories[r] for r in picked[: w.expand]] if expanding else []
    links = (
        store.neighbours(
            tenant, anchors, turns=w.turns, replies=w.replies, scope=scope, known=memories
        )
        if anchors
        else []
    )
    grouped: dict[int, dict[str, list[Memory]]] = {}
    for link in links:
        grouped.setdefault(link.anchor, {}).setdefault(link.relation, []).append(link.memory)
    extra: dict[int, tuple[Memory, dict[str, float]]] = {}
    anchor_of: dict[int, int] = {}  # neighbour rowid -> the anchor whose share it holds
    for index, anchor in enumerate(anchors):
        parent = scored[anchor.rowid]["score"]
        for neighbour, kind, weight in _relations(anchor, grouped.get(index, {}), w):
            if keep is not None and not keep(neighbour):
                continue
            entity = entity_share(entities, neighbour.content) if entities else 0.0
            score = weight * parent * (1.0 + w.entity * entity)
            known = extra.get(neighbour.rowid)
            direct = scored.get(neighbour.rowid)
            # A turn by someone the query does not name, next to a named person's, is about
            # its own author: it keeps its share only as far as it matches the query itself.
            aside = 0.0
            if aim.people and neighbour.author is not None and not aim.speaks(neighbour):
                aside = max(w.bystander, direct["relevance"] if direct is not None else 0.0)
                score *= aside
            if score <= 0 or (known and known[1]["score"] >= score):
                continue
            if direct is not None and direct["score"] >= score:
                continue
            components = {"neighbour": parent, f"neighbour_{kind}": weight, "score": score}
            if aside:
                components["bystander"] = aside
            if entities:
                components["entity"] = entity
            extra[neighbour.rowid] = (neighbour, components)
            anchor_of[neighbour.rowid] = anchor.rowid
    for rowid, (memory, components) in extra.items():
        memories.setdefault(rowid, memory)
        if rowid in scored:  # a weak direct hit raised by its neighbour: keep both stories
            scored[rowid].update(components)
        else:
            scored[rowid] = components

    costs = cost(list(memories.values()))
    # For speed (~150 hits a turn): sorted as (-density, rowid, hit) tuples, not with a key
    # function (rowids are unique, so a Hit is never compared); Hit made with positional
    # arguments (keywords cost ~2.5x on CPython 3.11); max() spelled as an if.
    densities: dict[int, float] = {}
    for rowid, components in scored.items():
        tokens = int(costs.get(rowid, 1))
        densities[rowid] = components["score"] / (tokens if tokens > 1 else 1) ** w.density
    ordered = []
    for rowid, components in scored.items():
        tokens = int(costs.get(rowid, 1))
        if tokens < 1:
            tokens = 1
        density = densities[rowid]
        anchor_row = anchor_of.get(rowid, -1)
        if anchor_row >= 0 and density > densities[anchor_row]:
            density = densities[anchor_row]  # a neighbour comes after its anchor (fill: with it)
        components["density"] = density
        hit = Hit(memories[rowid], components["score"], tokens, components, anchor_row)
        ordered.append((-density, rowid, hit))
    ordered.sort()
    return [hit for _, _, hit in ordered]


def _memories_of(
    store: Store,
    nearest: Sequence[tuple[int, float]],
    known: Mapping[int, Memory],
    tenant: str,
    scope: ReadScope | None,
) -> list[tuple[Memory, float]]:
    """The memories of :meth:`Store.vector_nearest`'s ``(rowid, cosine)`` pairs, in their order
    (those ``known``, read earlier in the same retrieval, not read again; a row deleted since,
    or whose rowid another tenant's or scope's row took since, is left out)."""
    unread = [rowid for rowid, _ in nearest if rowid not in known]
    read = {
        m.rowid: m
        for m in (store.memories_at(unread) if unread else ())
        if m.tenant == tenant and in_scope(m, scope)
    }
    out = []
    for rowid, cosine in nearest:
        memory = known.get(rowid) or read.get(rowid)
        if memory is not None:
            out.append((memory, cosine))
    return out


def _read_so_far(
    memories: Mapping[int, Memory], focused: Sequence[tuple[str, list[tuple[Memory, float]]]]
) -> dict[int, Memory]:
    """The memories a retrieval has read so far: its candidates and its focused lists'."""
    out = dict(memories)
    for _, found in focused:
        for memory, _ in found:
            out.setdefault(memory.rowid, memory)
    return out


def _focused(
    store: Store,
    aim: Focus,
    *,
    tenant: str,
    terms: Sequence[str],
    w: RetrievalWeights,
    scope: ReadScope | None,
    known: Mapping[int, Memory],
) -> list[tuple[str, list[tuple[Memory, float]]]]:
    """Candidate lists by words for what the query is about (:mod:`ctxwarden.focus`), by
    source (``known``: the rows read so far, not read again).

    - ``speaker``: the named people's own turns, searched by the query's other words (the
      names left out: a turn that says the name is more often the other side's).
    - ``dated``: memories created within a named time, searched by the query's words (time
      words left out) among four times the usual number of hits (the time filter keeps few);
      ``retrieve`` adds ``dated_vector``, the same by the query's vector.
    """
    out: list[tuple[str, list[tuple[Memory, float]]]] = []
    if aim.people and w.speaker > 0:
        rest = without_words(terms, aim.name_terms | aim.time_terms)
        if rest and len(rest) < len(terms):
            found = store.search(tenant, rest, limit=2 * w.candidates, scope=scope, known=known)
            out.append(("speaker", [(m, r) for m, r in found if aim.speaks(m)]))
    if aim.spans and w.dated > 0:
        rest = without_words(terms, aim.time_terms)
        if rest:
            found = store.search(tenant, rest, limit=4 * w.candidates, scope=scope, known=known)
            out.append(("dated", [(m, r) for m, r in found if aim.when(m) > 0]))
    return out


def _without_spans(query: str, aim: Focus) -> str:
    """The query less its time expressions (their capitalised month names and numbers are not
    entities a memory should name)."""
    for span in aim.spans:
        query = query.replace(span.text, " ")
    return query


def _said(memory: Memory, aim: Focus) -> str:
    """The text a memory's entity share is read from: a named person's own turn also names its
    author (it needs not say its own name), so it outranks a turn that only addresses them."""
    if aim.people and aim.speaks(memory):
        return f"{memory.content}\n{memory.author}"
    return memory.content


class _Crowding:
    """The coverage penalty of MMR: each pick from an episode (place and day,
    :meth:`Focus.episode`) adds ``coverage`` (``list_coverage`` for a list question) to the
    others of that episode, up to three picks. It only grows as picks are made, as the lazy
    greedy needs."""

    def __init__(self, head: Sequence[Memory], aim: Focus, w: RetrievalWeights) -> None:
        self.step = w.list_coverage if aim.listing else w.coverage
        self.keys = [aim.episode(m) for m in head] if self.step > 0 else []
        self.counts: dict[tuple[str | None, str | None, int], int] = {}

    def penalty(self, index: int) -> float:
        if not self.keys:
            return 0.0
        return self.step * min(3, self.counts.get(self.keys[index], 0))

    def pick(self, index: int) -> None:
        if self.keys:
            key = self.keys[index]
            self.counts[key] = self.counts.get(key, 0) + 1


# A question: a "?" that ends a sentence (not one inside a URL's query string). One "?", not
# "\?+": the last of a run is the one the lookahead sees, and "\?+" rescanned a run of question
# marks from each of its positions (quadratic in a memory's length).
_QUESTION = re.compile(r"\?(?=[\s\"')\]]|$)")


def _is_question(text: str) -> bool:
    return "?" in text and _QUESTION.search(text) is not None  # most texts ask nothing


def _relations(
    hit: Memory, links: Mapping[str, Sequence[Memory]], w: RetrievalWeights
) -> list[tuple[Memory, str, float]]:
    """A hit's neighbours as ``(memory, kind, weight)``: what each is to the hit and the share
    of the hit's score it gets. Pure.

    - ``before`` / ``after``: the nearest turn on either side (``neighbours``): in a thread any
      turn; in a channel only the hit's author's own, since in a busy channel the turns next to
      a hit are as often another conversation's (with 5x interleaved distractors, adjacent
      turns by anyone cost 11 points of evidence recall at 2k without vectors and gained
      nothing without them; ``bench/evidence_recall.py --filler``).
    - ``answer``: the hit asks (ends a sentence with "?"): the turns after it by other people
      until the asker speaks again, and replies by others (``answer``, the first in full, each
      next one ``neighbour_decay`` times less).
    - ``question``: the hit is not a question: the message it replies to, or else the nearest
      earlier turn by someone else, when that one asks (``answer``).
    - ``parent`` / ``reply``: the message it replies to, replies to it (``neighbours``).
    - ``root`` / ``sibling`` / ``turn``: its thread's first message, other replies to its
      parent, the further turns on either side (``thread``, each next one ``neighbour_decay``
      times less).
    """
    out: list[tuple[Memory, str, float]] = []
    decay = w.neighbour_decay
    before = sorted(links.get("before", ()), key=lambda m: (-m.created_at, -m.rowid))
    after = sorted(links.get("after", ()), key=lambda m: (m.created_at, m.rowid))
    replies = sorted(links.get("reply", ()), key=lambda m: (m.created_at, m.rowid))
    asks = _is_question(hit.content)

    def other(m: Memory) -> bool:
        return m.author is None or hit.author is None or m.author != hit.author

    # Turns by position: the thread's (links come from it when the hit is in one), else the
    # channel's turns by the hit's own author (a message continued over several lines).
    in_thread = hit.thread_id is not None and hit.thread_id != hit.id
    anyone = in_thread or hit.author is None
    for rank, turn in enumerate([t for t in before if anyone or not other(t)]):
        out.append((turn, "before" if rank == 0 else "turn", w.neighbours if rank == 0
                    else w.thread * decay ** (rank - 1)))  # fmt: skip
    for rank, turn in enumerate([t for t in after if anyone or not other(t)]):
        out.append((turn, "after" if rank == 0 else "turn", w.neighbours if rank == 0
                    else w.thread * decay ** (rank - 1)))  # fmt: skip
    if asks:
        for rank, turn in enumerate(after):
            if not other(turn):
                break  # the asker speaks again: what follows answers something else
            out.append((turn, "answer", w.answer * decay**rank))
    for rank, reply in enumerate(replies):
        if asks and other(reply):
            out.append((reply, "answer", w.answer * decay**rank))
        else:
            out.append((reply, "reply", w.neighbours * decay**rank))
    for parent in links.get("parent", ())[:1]:
        asked = not asks and other(parent) and _is_question(parent.content)
        out.append((parent, "question" if asked else "parent", w.answer if asked
                    else w.neighbours))  # fmt: skip
    if not asks and not links.get("parent"):
        earlier = next((turn for turn in before if other(turn)), None)
        if earlier is not None and _is_question(earlier.content):
            out.append((earlier, "question", w.answer))
    for root in links.get("root", ())[:1]:
        out.append((root, "root", w.thread))
    siblings = sorted(links.get("sibling", ()), key=lambda m: (m.created_at, m.rowid))
    for rank, sibling in enumerate(siblings):
        out.append((sibling, "sibling", w.thread * decay**rank))
    return out


def bridge_terms(memory: Memory, asked: Collection[str], *, limit: int = 4) -> list[str]:
    """The words of a first-hop hit that the second hop searches: the first ``limit`` terms of
    its text, then of its attachments' words (:func:`ctxwarden.attachments.search_text`), that
    the query lacks. Pure.

    Ordering them otherwise (the hit's names first, then its longest words) was measured on
    locomo-dev's first 60 questions per conversation (categories 1-3) and changed nothing, so
    the text order stays.
    """
    terms = query_terms(memory.content)
    if memory.attachments:
        terms += query_terms(search_text(memory.attachments))
    return [t for t in dict.fromkeys(terms) if t not in asked][:limit]


def describe(weights: RetrievalWeights) -> dict[str, Any]:
    """The weights as a plain dict (for reports and docs)."""
    return {name: getattr(weights, name) for name in weights.__dataclass_fields__}
