"""The vector index the SQLite store owns: cosine top-k over integer row ids, with deletes.

Choice: a **usearch** HNSW graph (float16, connectivity 16, expansion 128 at build, 256 at
search) finds candidates, which are re-scored exactly from a float16 copy of the vectors kept
beside it. Measured by ``bench/vectors_choice.py`` on 384-d MiniLM-like vectors (mixtures of real
MiniLM embeddings of synthetic chat lines), k=50, one query thread, CPU time per query on a
2-core machine shared with other work (wall time agreed when the machine was quiet):

============================  =======  ==========  ==========  =========  ======  ======
candidate                     rows     build CPU   p50 / p95   recall@50  memory  disk
============================  =======  ==========  ==========  =========  ======  ======
numpy exact (float32)         100k     0 s         12.8/14 ms  1.000      146 MB  154 MB
usearch f16, ef 128 / 256     100k     161 s       1.8 / 2.5   .944/.975  107 MB  92 MB
usearch i8, ef 128 / 256      100k     95 s        0.7 / 1.6   .923/.942  55 MB   53 MB
hnswlib, ef 128 / 256         100k     135 s       3.0 / 4.1   .954/.980  167 MB  168 MB
faiss HNSWFlat, ef 128 / 256  100k     136 s       1.1 / 1.8   .952/.977  183 MB  168 MB
this index, ef 128 / 256      100k     88 s        2.6 / 2.4   .941/.977  171 MB  169 MB
numpy exact (float32)         1M       2 s         153/195 ms  1.000      1.5 GB  1.5 GB
this index, ef 128            1M       661 s       1.2/2.3 ms  0.922      1.9 GB  1.7 GB
this index, ef 256 (default)  1M       646 s       1.6/2.5 ms  0.983      1.9 GB  1.7 GB
============================  =======  ==========  ==========  =========  ======  ======

(p50 per ef at 100k; HNSW timings varied by 2x between runs on the shared machine, recall did
not.) With an ``allowed`` scope at 1M rows (ef 256): 1 % (10k ids) 2.9 ms, 2 % 8 ms, exact;
5 % 13 ms, 10 % 6 ms, 20 % 3-4 ms, 50 % 1.9 ms at recall@50 0.87-0.97 (graph, filtered).
Loading the 1M-row file takes ~6 s.

- At 1M rows exact search costs ~150 ms a query: far over the 20 ms p50 budget of a whole
  retrieval. The graph answers in ~2 ms at recall@50 0.98 (expansion 256; 128: 0.92).
- The three HNSW libraries give the same recall at the same expansion. usearch is maintained,
  ships cp311+ wheels (hnswlib has none: it compiles from source at install), removes entries
  from the graph (faiss's HNSW cannot: deletes would need tombstone filters and rebuilds), builds
  multi-threaded and serialises to bytes. usearch int8 halves memory but loses recall on
  normalised embeddings (components ~0.05 use few of its 255 levels). sqlite-vec is out: this
  Python's ``sqlite3`` cannot load extensions.
- usearch 2.26.x (its numkong builds) crashes onnxruntime when imported first; the dependency is
  pinned below 2.26 and ``tests/test_vectors.py`` guards that order.
- The float16 side copy makes exact work cheap where usearch alone is slow (it returns stored
  vectors one Python array per key): exhaustive search of an ``allowed`` scope, exhaustive search
  of a small index, and exact re-scoring of the graph's candidates, so a score is the same cosine
  whichever path answered and ties break by id deterministically. It costs ~0.8 KB a row.
- An exhaustive pass over >= 8,192 rows (an author's scope at 1M rows: ~25k) first shortlists
  them from an **int8 copy** of the vectors (one scale for all rows; half the bytes to gather of
  float16), keeping 10 rows per result wanted (at least 256), which are then scored exactly as
  above. On the 1M-row bench (``bench/retrieve.py``, 200 queries, top 20 of one author's ~25k
  rows) it returned the exact top 20 in the exact order for every query, at ~5 ms instead of
  ~8 ms. The int8 rows are scored by numkong's int8 dot kernel (exact int32 sums; numkong is
  usearch's own dependency): ~0.5 ms for 25k rows, against ~2.4 ms for usearch's exact search
  and ~8 ms for numpy (no integer BLAS), CPU time at load average ~3-4. The gather of the 25k
  rows (``np.take``, ~1.8 ms; fancy indexing ~2.2-2.6 ms) is then the larger part: one random
  384-byte row at a time, bound by memory latency; the whole scoped search is ~4 ms warm.
  Binary sign codes (48 bytes a row) were measured too and not taken: their top 2,000
  held the exact top 20 in 194 of 200 queries. The int8 copy costs ~0.4 KB a row; it is built
  by :meth:`load` for large indexes (~1.6 s at 1M rows) or at the first large exhaustive pass,
  and kept in step by :meth:`add` (a removed row's slot is never read again).
- A **named scope** (``search(..., scope=...)``: the store names an author's rows) keeps its
  int8 rows in a block of its own, contiguous chunks in id order, so its pass streams ~9.6 MB
  instead of gathering 25k scattered rows: warm author-scoped search at 1M rows 4.2-5.5 ->
  2.1-2.4 ms CPU (same results: the bench's ``--exact-check`` finds the exact top 20 in all
  200 queries). The block follows the index through a log of changed ids (patched rows) and
  a growing scope (appended rows); anything else rebuilds it (~2 ms from the int8 copy, plus
  page faults the first time), as does a shortlisted row whose slot no longer holds its id.
  The blocks hold at most ``len(index)`` rows together (least recently used dropped first):
  ~0.4 KB a row more when every author's block is kept, +367 MB anonymous memory at 1M rows /
  40 authors. As the block pass is ~6x cheaper a row than a gather, named scopes stay
  exhaustive (exact) up to 2x larger (~50k ids at 1M, k=20).

Consistency with the memories table: :meth:`VectorIndex.remove` takes a row out of the graph and
the side copy at once, so a deleted or tombstoned memory is never returned; :meth:`add` of a
present id replaces its vector. ``allowed`` (a tenant, a session) is honoured exactly: a scope is
searched exhaustively when that is cheaper (exact; at 1M rows up to ~40k ids), otherwise through
the graph with oversampling that widens until ``k`` allowed hits are found (recall ~0.87-0.97:
if large scopes are the common case, one index per scope serves better). After many removals
HNSW recall degrades: :meth:`rebuild` when :attr:`removed_since_rebuild` passes ~20 % of
``len(index)`` (it holds the lock for as long as a build takes: do it when idle).

The index lives in memory (~1.8 KB a row at 384 dimensions). :meth:`save` writes one file
atomically (temporary file, fsync, ``os.replace``) and :meth:`load` reads it back. It is a cache
of the vectors kept in the store: after a crash between a store commit and a save, the owner
re-adds the missing rows (compare :meth:`ids` with the table).

By concern: this module holds the index and its graph (adds, removes, rebuilds, the choice of
search path); the side copy (slots, float16 and int8 rows, scope blocks, exact re-scoring) is
:mod:`ctxwarden.vector_copy`, a base class of :class:`VectorIndex`, and the file that
:meth:`save` writes is :mod:`ctxwarden.vector_file`.

>>> import numpy as np
>>> index = VectorIndex(3)
>>> index.add([1, 2], np.array([[1, 0, 0], [0, 1, 0]], dtype=np.float32))
>>> [i for i, _ in index.search(np.array([1, 0.1, 0], dtype=np.float32), 2)]
[1, 2]
"""

from __future__ import annotations

import math
import os
import threading
from collections.abc import Hashable, Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from ctxwarden.errors import ConfigError, InputError, StoreError
from ctxwarden.vector_copy import (
    _SHORTLIST_PER_RESULT,
    _SHORTLIST_ROWS,
    SideCopy,
    Vector,
)

# retrieve.py scores its int8 rows with numkong through this name.
from ctxwarden.vector_copy import _numkong as _numkong
from ctxwarden.vector_file import REBUILD_HINT, read_index, write_index

__all__ = ["VectorIndex"]

_MAX_ID = 2**63 - 1
# Below this many live rows exhaustive search is as fast as the graph, and exact.
_EXACT_ROWS = 4_096
# An allowed scope up to this size is searched exhaustively (gather + matmul, ~5 ms).
_EXACT_ALLOWED = 10_000
# Exhaustive search of a scope is chosen while it holds at most this many ids per graph candidate
# that the scope would need: at 1M rows that is scopes up to ~40k ids (<= ~20 ms, exact); larger
# ones take the graph (<= ~13 ms, recall@50 ~0.87-0.89).
_EXHAUSTIVE_PER_CANDIDATE = 16
# ... and this many for a named scope read from its contiguous int8 block (~0.05 us an id where a
# gather costs ~0.3): at 1M rows, scopes up to ~50k ids for k=20 (<= ~3 ms, exact).
_EXHAUSTIVE_PER_BLOCK_CANDIDATE = 64


def _usearch() -> Any:
    try:
        from usearch.index import Index
    except ImportError as exc:
        raise ConfigError(
            "the vector index needs usearch: reinstall ctxwarden (it is a base dependency)"
        ) from exc
    return Index


def _as_ids(ids: Iterable[int], field: str = "ids") -> list[int]:
    values = [int(i) for i in ids]
    for position, value in enumerate(values):
        if not 0 <= value <= _MAX_ID:
            raise InputError(
                f"id {value} must be between 0 and 2**63-1", field=f"{field}[{position}]"
            )
    return values


#: Removed vectors save() blanks by scanning the graph's bytes (one pass each) before a
#: rebuild of the graph is the cheaper way to drop them.
_WIPE_SCANS = 64


class VectorIndex(SideCopy):
    """Cosine nearest neighbours over integer ids, with deletes and scoped search.

    ``dim`` is the vector length. ``expansion_search`` (256: recall@50 ~0.98 at 1M rows; 128:
    ~0.93, faster) and ``oversample`` trade speed for recall:
    the graph is asked for ``oversample * k`` candidates with a search list of at least
    ``expansion_search``, which are then re-scored exactly. ``threads`` is used by :meth:`add`
    only (a search runs on its caller's thread). An index of at most ``exact_below`` rows, and an
    ``allowed`` scope of at most ``exact_scope`` ids, are searched exhaustively (exact, and as
    fast as the graph at those sizes). Vectors are normalised on the way in, so any
    non-zero vector is accepted and scores are cosine similarities. Thread-safe.

    >>> import numpy as np
    >>> index = VectorIndex(2)
    >>> index.add([7], np.array([[3.0, 4.0]], dtype=np.float32))
    >>> index.search(np.array([3.0, 4.0], dtype=np.float32), 1)[0][0], len(index)
    (7, 1)
    """

    def __init__(
        self,
        dim: int,
        *,
        connectivity: int = 16,
        expansion_add: int = 128,
        expansion_search: int = 256,
        oversample: float = 2.0,
        threads: int = 1,
        exact_below: int = _EXACT_ROWS,
        exact_scope: int = _EXACT_ALLOWED,
        scope_oversample: float = 2.0,
    ) -> None:
        if dim < 1:
            raise ConfigError(f"vector index dim: {dim} must be >= 1")
        if connectivity < 2 or expansion_add < 1 or expansion_search < 1 or threads < 1:
            raise ConfigError(
                "vector index: connectivity must be >= 2, expansions and threads >= 1"
            )
        if oversample < 1:
            raise ConfigError(f"vector index oversample: {oversample} must be >= 1")
        super().__init__(dim)
        self._connectivity = connectivity
        self._expansion_add = expansion_add
        self._expansion_search = expansion_search
        self.oversample = oversample
        self.threads = threads
        self.exact_below = exact_below
        self.exact_scope = exact_scope
        self.scope_oversample = scope_oversample
        self._lock = threading.RLock()
        self._graph: Any = None
        self._removed = 0
        # The float16 rows of vectors removed (or replaced) since the graph was built: usearch
        # keeps them in their slots, so save() blanks them in the bytes it writes.
        self._wipe: list[bytes] = []

    # -- properties ----------------------------------------------------------------------------

    @property
    def dim(self) -> int:
        """Vector length."""
        return self._dim

    @property
    def expansion_search(self) -> int:
        """Minimum HNSW candidate list size at search time (recall versus speed)."""
        return self._expansion_search

    @expansion_search.setter
    def expansion_search(self, value: int) -> None:
        if value < 1:
            raise ConfigError(f"vector index expansion_search: {value} must be >= 1")
        with self._lock:
            self._expansion_search = value

    def __len__(self) -> int:
        """Number of live (added and not removed) ids."""
        return len(self._slot)

    def __contains__(self, item: object) -> bool:
        """Whether ``item`` is a live id."""
        return isinstance(item, int) and item in self._slot

    def ids(self) -> npt.NDArray[np.int64]:
        """All live ids, sorted (to reconcile the index with its table)."""
        with self._lock:
            return np.sort(self._ids[self._ids >= 0])

    def _new_graph(self) -> Any:
        return _usearch()(
            ndim=self._dim,
            metric="ip",
            dtype="f16",
            connectivity=self._connectivity,
            expansion_add=self._expansion_add,
            expansion_search=self._expansion_search,
        )

    def _ensure_graph(self) -> Any:
        if self._graph is None:
            self._graph = self._new_graph()
        return self._graph

    # -- writes --------------------------------------------------------------------------------

    def add(self, ids: Sequence[int], vectors: npt.ArrayLike) -> None:
        """Add or replace the vectors of ``ids`` (one row of ``vectors`` per id).

        Raises :class:`~ctxwarden.errors.InputError` for a shape mismatch, a repeated id, a
        negative id, or a zero, NaN or infinite vector; nothing is added then.
        """
        keys = _as_ids(ids)
        matrix = np.asarray(vectors, dtype=np.float32)
        if matrix.ndim == 1 and len(keys) == 1:
            matrix = matrix[None, :]
        if matrix.ndim != 2 or matrix.shape != (len(keys), self._dim):
            raise InputError(
                f"expected {len(keys)} vectors of length {self._dim}, got shape {matrix.shape}: "
                "pass one row per id, from the embedder the index was built for",
                field="vectors",
            )
        if not keys:
            return
        if len(set(keys)) != len(keys):
            raise InputError("an id appears twice in one add(): pass each id once", field="ids")
        norms = np.linalg.norm(matrix, axis=1)
        bad = np.flatnonzero(~np.isfinite(norms) | (norms == 0))
        if bad.size:
            raise InputError(
                f"vector for id {keys[int(bad[0])]} is zero, NaN or infinite: re-embed the text",
                field=f"vectors[{int(bad[0])}]",
            )
        matrix = matrix / norms[:, None]
        key_array = np.asarray(keys, dtype=np.uint64)
        with self._lock:
            graph = self._ensure_graph()
            present = [i for i in keys if i in self._slot]
            if present:
                self._wipe.extend(self._matrix[self._slot[i]].tobytes() for i in present)
                graph.remove(np.asarray(present, dtype=np.uint64))
                self._removed += len(present)
            slots = self._allocate(keys)
            try:
                graph.add(key_array, matrix, threads=self.threads)
            except (RuntimeError, ValueError) as exc:
                # Keep the side copy in step with the graph: forget what did not go in.
                self._release(keys)
                self._changed(np.asarray(keys, dtype=np.int64))
                raise StoreError(f"vector index add failed: {exc}; rebuild the index") from exc
            self._matrix[slots] = matrix.astype(np.float16)
            if self._codes is not None:
                self._codes[slots] = self._quantise(matrix)
            self._changed(np.asarray(keys, dtype=np.int64))

    @property
    def removed_since_rebuild(self) -> int:
        """Removals (and replacements) since the graph was built: past ~20 % of ``len(self)``,
        HNSW recall degrades and :meth:`rebuild` is worth its cost."""
        return self._removed

    def rebuild(self) -> None:
        """Rebuild the graph from the stored vectors (drops the debris of removals).

        Takes about as long as adding every vector again (~40 s per 100k rows on one core).
        """
        with self._lock:
            live = np.flatnonzero(self._ids >= 0)
            graph = self._new_graph()
            if live.size:
                graph.add(
                    self._ids[live].astype(np.uint64),
                    self._matrix[live].astype(np.float32),
                    threads=self.threads,
                )
            self._graph = graph
            self._removed = 0
            self._wipe = []

    def remove(self, ids: Iterable[int]) -> int:
        """Remove ``ids``; unknown ids are ignored. Returns how many were removed."""
        keys = _as_ids(ids)
        with self._lock:
            present = sorted({i for i in keys if i in self._slot})
            if not present:
                return 0
            self._wipe.extend(self._matrix[self._slot[i]].tobytes() for i in present)
            self._graph.remove(np.asarray(present, dtype=np.uint64))
            self._release(present)
            self._removed += len(present)
            self._changed(np.asarray(present, dtype=np.int64))
            return len(present)

    # -- reads ---------------------------------------------------------------------------------

    def search(
        self,
        vector: npt.ArrayLike,
        k: int,
        *,
        allowed: set[int] | npt.NDArray[np.int64] | None = None,
        scope: Hashable | None = None,
    ) -> list[tuple[int, float]]:
        """The ``k`` live ids most similar to ``vector``: ``(id, cosine)``, best first.

        Equal scores are ordered by id. With ``allowed`` (a set, or an array of distinct ids),
        only those ids are returned (ids in ``allowed`` that are not in the index are ignored).
        Exact for small indexes and small scopes, approximate otherwise (see
        ``expansion_search`` and ``oversample``).

        ``scope`` names ``allowed`` (an ascending array of ids, e.g. one author's rows) so that
        a large scope searched again reads its int8 rows from one contiguous block kept for
        that name (:meth:`_scope_block`) instead of gathering them from the whole copy: the
        same results, faster. The block follows every later add and remove, and a changed
        ``allowed`` (new ids appended: cheap; anything else: rebuilt).
        """
        query = np.asarray(vector, dtype=np.float32).reshape(-1)
        if query.shape != (self._dim,):
            raise InputError(
                f"query vector has length {query.size}, the index holds {self._dim}: embed the "
                "query with the index's embedder",
                field="vector",
            )
        norm = float(np.linalg.norm(query))
        if k <= 0 or not math.isfinite(norm) or norm == 0.0 or not self._slot:
            return []
        query = query / norm
        with self._lock:
            if allowed is not None:
                return self._search_allowed(query, k, allowed, scope)
            if len(self._slot) <= self.exact_below:
                return self._rescore(query, k, np.flatnonzero(self._ids >= 0))
            count = min(len(self._slot), math.ceil(k * self.oversample))
            found = self._rescore(query, k, self._slots_of(self._candidates(query, count)))
            if len(found) < min(k, len(self._slot)):
                # Deletions can cut a graph into parts the search cannot reach: stay complete.
                return self._rescore(query, k, np.flatnonzero(self._ids >= 0))
            return found

    def _candidates(self, query: Vector, count: int) -> npt.NDArray[np.uint64]:
        graph = self._graph
        graph.expansion_search = max(self._expansion_search, count)
        return np.asarray(graph.search(query, count, threads=1).keys, dtype=np.uint64)

    def _search_allowed(
        self,
        query: Vector,
        k: int,
        allowed: set[int] | npt.NDArray[np.int64],
        scope: Hashable | None = None,
    ) -> list[tuple[int, float]]:
        size = len(self._slot)
        # Ask the graph for enough candidates that k of them are likely allowed (x scope_oversample
        # for recall).
        count = min(
            size,
            max(
                math.ceil(k * self.oversample),
                math.ceil(self.scope_oversample * k * size / max(1, len(allowed))),
            ),
        )
        # A named scope large enough for the int8 shortlist is read from its block.
        blocked = (
            scope is not None
            and isinstance(allowed, np.ndarray)
            and allowed.size >= _SHORTLIST_ROWS
            and allowed.size > _SHORTLIST_PER_RESULT * 4 * k
        )
        per_candidate = _EXHAUSTIVE_PER_BLOCK_CANDIDATE if blocked else _EXHAUSTIVE_PER_CANDIDATE
        while True:
            # Exhaustive costs ~0.3 us per allowed id (~0.05 from a block), the graph ~10 us per
            # candidate asked for (its search list grows with the count): take the cheaper;
            # exhaustive is also exact.
            exhaustive_limit = max(self.exact_scope, per_candidate * count)
            if len(allowed) <= exhaustive_limit or size <= self.exact_below:
                if blocked and scope is not None and isinstance(allowed, np.ndarray):
                    block = self._scope_block(scope, allowed)
                    shortlist = None if block is None else self._block_shortlist(query, k, block)
                    if shortlist is None and block is not None:
                        # A block out of step with the slots (never expected): read it again.
                        self._drop_block(scope)
                        block = self._scope_block(scope, allowed)
                        shortlist = (
                            None if block is None else self._block_shortlist(query, k, block)
                        )
                    if shortlist is not None:
                        return self._rescore(query, k, shortlist)
                return self._rescore(query, k, self._allowed_slots(allowed))
            if isinstance(allowed, np.ndarray):
                allowed = set(allowed.tolist())
            keys = [int(key) for key in self._candidates(query, count) if int(key) in allowed]
            if len(keys) >= k:
                return self._rescore(query, k, self._slots_of(keys))
            if count >= size:
                # The whole graph was asked and fewer than k allowed ids came back (a graph cut
                # by deletions, or a scope smaller than k): exhaustive is exact and complete.
                return self._rescore(query, k, self._allowed_slots(allowed))
            count = min(size, count * 4)

    # -- persistence ---------------------------------------------------------------------------

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the index to ``path`` atomically (a reader sees the old file or the new one).

        Removed vectors never reach the file: usearch keeps a removed entry's vector in its
        slot, so those bytes are zeroed in what is written (past :data:`_WIPE_SCANS` removals
        since the graph was built, the graph is rebuilt instead).

        Layout: ``CTXWVEC1``, an 8-byte little-endian header length, a JSON header, the live ids
        (int64), their float16 vectors, then the serialised graph (:mod:`ctxwarden.vector_file`).
        """
        target = Path(path)
        with self._lock:
            if len(self._wipe) > _WIPE_SCANS:
                self.rebuild()  # cheaper than a scan of the graph's bytes per removed vector
            live = np.flatnonzero(self._ids >= 0)
            # usearch serialises to a bytearray; written as is (no second copy of ~1 KB a row).
            graph_bytes = self._ensure_graph().save()
            self._blank_removed(graph_bytes, live)
            write_index(
                target,
                dim=self._dim,
                connectivity=self._connectivity,
                expansion_add=self._expansion_add,
                ids=self._ids[live],
                vectors=self._matrix[live],
                graph_bytes=graph_bytes,
            )

    def _blank_removed(self, graph_bytes: bytearray, live: npt.NDArray[np.int64]) -> None:
        """Zero the removed vectors usearch keeps in the graph's slots (a removed node still
        routes searches; its vector no longer matters: results are re-scored from the side
        copy), so a deleted memory's vector never reaches the file (issue 20). A row equal
        to a live vector is left: those bytes are that vector's too."""
        if not self._wipe:
            return
        rows = self._matrix[live]
        for pattern in dict.fromkeys(self._wipe):
            row = np.frombuffer(pattern, dtype=np.float16)
            if rows.size and bool((rows == row).all(axis=1).any()):
                continue
            blank = bytes(len(pattern))
            at = graph_bytes.find(pattern)
            while at >= 0:
                graph_bytes[at : at + len(pattern)] = blank
                at = graph_bytes.find(pattern, at + len(pattern))

    @classmethod
    def load(
        cls,
        path: str | os.PathLike[str],
        *,
        expansion_search: int = 256,
        oversample: float = 2.0,
        threads: int = 1,
    ) -> VectorIndex:
        """Read an index written by :meth:`save`.

        Raises :class:`~ctxwarden.errors.StoreError` if the file is missing, truncated or not an
        index (then rebuild it from the vectors in the store).
        """
        source = Path(path)
        header, dim, count, ids, matrix, graph_bytes = read_index(source)
        graph = _usearch().restore(graph_bytes)
        if graph is None or len(graph) != count or int(graph.ndim) != dim:
            raise StoreError(
                f"{source} holds a graph that does not match its vectors: {REBUILD_HINT}"
            )
        index = cls(
            dim,
            connectivity=int(header["connectivity"]),
            expansion_add=int(header["expansion_add"]),
            expansion_search=expansion_search,
            oversample=oversample,
            threads=threads,
        )
        index._graph = graph
        index._matrix = matrix.reshape(count, dim).astype(np.float16)
        index._ids = ids.copy()
        index._slot = {int(i): slot for slot, i in enumerate(ids.tolist())}
        index._map_dense(index._ids, np.arange(count, dtype=np.int64))
        if count >= _SHORTLIST_ROWS:
            # Now rather than in the first large scoped search (~1 s at 1M rows).
            index._ensure_codes()
        return index
