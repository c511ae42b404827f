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

>>> import numpy as np
>>> index = VectorIndex(3)
>>> index.add([1, 2], np.array([[1, 0, 0], [0, 1, 0]], dtype=np.float32))
>>> [i for i, _ in index.search(np.array([1, 0.1, 0], dtype=np.float32), 2)]
[1, 2]
"""

from __future__ import annotations

import itertools
import json
import math
import os
import threading
from collections import OrderedDict, deque
from collections.abc import Hashable, Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from ctxwarden.errors import ConfigError, InputError, StoreError

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
# An exhaustive pass over at least this many rows first shortlists them from an int8 copy of the
# vectors (half the bytes to gather and score of float16), then scores the shortlist exactly.
_SHORTLIST_ROWS = 8_192
# The int8 pass keeps this many rows per result wanted (and at least _SHORTLIST_MIN) for the
# exact pass: on the 1M-row bench the top 20 of an author's 25k rows were the exact top 20 in
# every query already from 40 kept; 10x leaves room for data that quantises worse.
_SHORTLIST_PER_RESULT = 10
_SHORTLIST_MIN = 256
# Scope blocks (see VectorIndex.search's ``scope``) are patched from a log of the ids that add()
# and remove() changed; the log keeps this many ids (a block older than the log is rebuilt).
_CHANGE_LOG_IDS = 65_536
# The scope blocks hold at most this many rows together, or len(index) if that is more.
_SCOPE_ROWS_MIN = 65_536
# A scope block is kept in chunks of at most this many bytes (see _ScopeBlock).
_BLOCK_CHUNK_BYTES = 2 << 20
_MAGIC = b"CTXWVEC1"
_FORMAT = 1

Vector = npt.NDArray[np.float32]


def _usearch() -> Any:
    try:
        from usearch.index import Index
    except ImportError as exc:
        raise ConfigError(
            "the vector index needs usearch: reinstall ctxwarden (it is a base dependency)"
        ) from exc
    return Index


def _usearch_module() -> Any:
    try:
        import usearch.index
    except ImportError as exc:
        raise ConfigError(
            "the vector index needs usearch: reinstall ctxwarden (it is a base dependency)"
        ) from exc
    return usearch.index


def _numkong() -> Any:
    try:
        import numkong
    except ImportError as exc:
        raise ConfigError(
            "the vector index needs numkong (a dependency of usearch): reinstall ctxwarden"
        ) from exc
    return numkong


def _as_ids(ids: Iterable[int], field: str = "ids") -> list[int]:
    values = [int(i) for i in ids]
    for position, value in enumerate(values):
        if not 0 <= value <= _MAX_ID:
            raise InputError(
                f"id {value} must be between 0 and 2**63-1", field=f"{field}[{position}]"
            )
    return values


def _pack_query(query: Vector) -> Any:
    """``query`` quantised to int8 by its own scale (a common factor does not change the
    ranking), packed for numkong's int8 dot kernel."""
    peak = float(np.abs(query).max())
    query_code = np.clip(np.rint(query * (127.0 / peak)), -127, 127).astype(np.int8)
    return _numkong().dots_pack(query_code[None, :])


def _int8_scores(rows: npt.NDArray[np.int8], packed: Any) -> npt.NDArray[np.int32]:
    """int32 dot products of int8 ``rows`` with a :func:`_pack_query` query. numkong's int8
    kernel (exact int32 sums) scores 25k rows in ~0.5 ms, where usearch's exact search took
    ~2.4 ms and numpy (no integer BLAS) ~8 ms."""
    return np.asarray(_numkong().dots_packed(rows, packed)).reshape(-1)


def _gather(codes: npt.NDArray[np.int8], slots: npt.NDArray[np.int64]) -> npt.NDArray[np.int8]:
    """The rows of ``codes`` at ``slots``, a zero row where a slot is -1."""
    rows = np.take(codes, np.maximum(slots, 0), axis=0)
    rows[slots < 0] = 0
    return rows


class _ScopeBlock:
    """The int8 rows of one named scope's ids (ascending) in row order, in chunks of
    ``chunk_rows`` rows (< 4 MB each: numpy asks the kernel for huge pages for larger arrays,
    whose compaction stalled each new 9.6 MB block ~20 ms; a chunk also appends without
    copying the block). ``slots[i]``: the index slot of ``ids[i]``, -1 (a zero row) for an id
    without a vector. ``version``: the index's change count the rows reflect."""

    __slots__ = ("chunk_rows", "chunks", "ids", "slots", "version")

    def __init__(self, ids: npt.NDArray[np.int64], chunk_rows: int, version: int) -> None:
        self.ids = ids
        self.slots = np.zeros(0, dtype=np.int64)
        self.chunk_rows = chunk_rows
        self.chunks: list[npt.NDArray[np.int8]] = []
        self.version = version

    def append(self, slots: npt.NDArray[np.int64], codes: npt.NDArray[np.int8]) -> None:
        """Add rows for ``slots`` (the new ids' slots) at the end, gathered from ``codes``."""
        start = 0
        if self.chunks and len(self.chunks[-1]) < self.chunk_rows:
            start = self.chunk_rows - len(self.chunks[-1])
            self.chunks[-1] = np.concatenate([self.chunks[-1], _gather(codes, slots[:start])])
        for begin in range(start, slots.size, self.chunk_rows):
            self.chunks.append(_gather(codes, slots[begin : begin + self.chunk_rows]))
        self.slots = np.concatenate([self.slots, slots])

    def refresh(self, rows: npt.NDArray[np.int64], slots: npt.NDArray[np.int64],
                codes: npt.NDArray[np.int8]) -> None:  # fmt: skip
        """Point ``rows`` (ascending) at ``slots`` and read their codes again."""
        self.slots[rows] = slots
        for chunk in np.unique(rows // self.chunk_rows).tolist():
            mine = rows[(rows // self.chunk_rows) == chunk]
            self.chunks[chunk][mine - chunk * self.chunk_rows] = _gather(codes, self.slots[mine])

    def scores(self, packed: Any) -> npt.NDArray[np.int32]:
        """The int8 score of every row (dead rows' included)."""
        return np.concatenate([_int8_scores(chunk, packed) for chunk in self.chunks])


class VectorIndex:
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
        self._dim = dim
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
        # Side copy: row `slot` of _matrix holds the vector of id _ids[slot] (-1: free slot).
        self._matrix = np.zeros((0, dim), dtype=np.float16)
        self._ids = np.zeros(0, dtype=np.int64)
        self._slot: dict[int, int] = {}
        # Vectorised id -> slot map while ids are small (SQLite rowids are): scope lookups then
        # run in numpy instead of a Python loop. None once an id is too large to index densely.
        self._dense: npt.NDArray[np.int32] | None = np.zeros(0, dtype=np.int32)
        self._free: list[int] = []
        self._removed = 0
        # int8 copy of _matrix (same slots) for the shortlist of large exhaustive passes, built
        # on first use with one scale for every row (a per-row scale would bias the ranking);
        # rows added later that exceed it are clipped, which only loosens their shortlist score.
        self._codes: npt.NDArray[np.int8] | None = None
        self._code_scale = 0.0
        # Named scopes' int8 rows, contiguous (most recently used last), and the log of changed
        # ids that keeps them current: see _scope_block.
        self._blocks: OrderedDict[Hashable, _ScopeBlock] = OrderedDict()
        self._block_rows = 0
        self._version = 0
        self._changes: deque[tuple[int, npt.NDArray[np.int64]]] = deque()
        self._changes_ids = 0
        self._changes_floor = 0

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

    def _allocate(self, keys: list[int]) -> npt.NDArray[np.int64]:
        slots = np.empty(len(keys), dtype=np.int64)
        needed = sum(1 for i in keys if i not in self._slot) - len(self._free)
        if needed > 0:
            capacity = max(len(self._ids) + needed, int(len(self._ids) * 1.5), 1024)
            grown = np.zeros((capacity, self._dim), dtype=np.float16)
            grown[: len(self._matrix)] = self._matrix
            ids = np.full(capacity, -1, dtype=np.int64)
            ids[: len(self._ids)] = self._ids
            if self._codes is not None:
                codes = np.zeros((capacity, self._dim), dtype=np.int8)
                codes[: len(self._codes)] = self._codes
                self._codes = codes
            self._free.extend(range(capacity - 1, len(self._ids) - 1, -1))
            self._matrix, self._ids = grown, ids
        for position, key in enumerate(keys):
            slot = self._slot.get(key)
            if slot is None:
                slot = self._free.pop()
                self._slot[key] = slot
                self._ids[slot] = key
            slots[position] = slot
        self._map_dense(np.asarray(keys, dtype=np.int64), slots)
        return slots

    def _map_dense(self, keys: npt.NDArray[np.int64], slots: npt.NDArray[np.int64]) -> None:
        if self._dense is None or keys.size == 0:
            return
        top = int(keys.max())
        if top >= len(self._dense):
            size = max(top + 1, int(len(self._dense) * 1.5), 1024)
            if size > max(1 << 20, 4 * len(self._slot)):
                self._dense = None
                return
            grown = np.full(size, -1, dtype=np.int32)
            grown[: len(self._dense)] = self._dense
            self._dense = grown
        self._dense[keys] = slots

    def _release(self, keys: Iterable[int]) -> None:
        for key in keys:
            slot = self._slot.pop(key, None)
            if slot is not None:
                self._ids[slot] = -1
                self._free.append(slot)
                if self._dense is not None:
                    self._dense[key] = -1

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

    def remove(self, ids: Iterable[int]) -> int:
        """Remove ``ids``; unknown ids are ignored. Returns how many were removed."""
        keys = _as_ids(ids)
        with self._lock:
            present = sorted({i for i in keys if i in self._slot})
            if not present:
                return 0
            self._graph.remove(np.asarray(present, dtype=np.uint64))
            self._release(present)
            self._removed += len(present)
            self._changed(np.asarray(present, dtype=np.int64))
            return len(present)

    def _changed(self, ids: npt.NDArray[np.int64]) -> None:
        """Note that the vectors of ``ids`` were added, replaced or removed (for the blocks)."""
        self._version += 1
        if not self._blocks:  # nothing to patch later: no log either
            self._changes.clear()
            self._changes_ids = 0
            self._changes_floor = self._version
            return
        self._changes.append((self._version, ids))
        self._changes_ids += ids.size
        while self._changes and self._changes_ids > _CHANGE_LOG_IDS:
            version, dropped = self._changes.popleft()
            self._changes_ids -= dropped.size
            self._changes_floor = version

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

    def _allowed_slots(self, allowed: set[int] | npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        dense = self._dense
        if isinstance(allowed, np.ndarray) and dense is None:
            allowed = set(allowed.tolist())
        if dense is not None:
            wanted: npt.NDArray[np.int64] | None
            if isinstance(allowed, np.ndarray):
                wanted = allowed.astype(np.int64, copy=False)
            else:
                try:
                    wanted = np.fromiter(allowed, dtype=np.int64, count=len(allowed))
                except (OverflowError, TypeError, ValueError):
                    wanted = None
            if wanted is not None:
                wanted = wanted[(wanted >= 0) & (wanted < len(dense))]
                found = dense[wanted].astype(np.int64)
                return found[found >= 0]
        # map(dict.get) runs in C: ~3x faster than a generator with `in` and indexing.
        slots = np.fromiter(
            map(self._slot.get, allowed, itertools.repeat(-1)), dtype=np.int64, count=len(allowed)
        )
        return slots[slots >= 0]

    def _slots_of(self, keys: Iterable[int]) -> npt.NDArray[np.int64]:
        if isinstance(keys, np.ndarray) and self._dense is not None:
            # The graph's candidates: mapped in numpy (a Python loop costs ~0.5 ms for 200).
            wanted = keys.astype(np.int64)
            wanted = wanted[(wanted >= 0) & (wanted < len(self._dense))]
            found = self._dense[wanted].astype(np.int64)
            return found[found >= 0]
        slot = self._slot
        return np.fromiter((slot[int(key)] for key in keys if int(key) in slot), dtype=np.int64)

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

    def _quantise(self, matrix: npt.NDArray[Any]) -> npt.NDArray[np.int8]:
        scaled = np.multiply(matrix, np.float32(self._code_scale), dtype=np.float32)
        np.rint(scaled, out=scaled)
        np.clip(scaled, -127, 127, out=scaled)
        codes: npt.NDArray[np.int8] = scaled.astype(np.int8)
        return codes

    def _ensure_codes(self) -> npt.NDArray[np.int8]:
        """The int8 copy of the vectors, built on first use or by :meth:`load` (~0.4 KB a row
        at 384 dimensions; ~1 s per 1M rows)."""
        if self._codes is None:
            # Unit vectors: no component exceeds 1. The scale maps the largest component of a
            # sample of rows to 127 (a larger one elsewhere is clipped: shortlist only).
            sample = self._matrix[:: max(1, len(self._matrix) // 65_536)]
            peak = float(max(sample.max(initial=0.0), -sample.min(initial=0.0)))
            self._code_scale = 127.0 / (peak if peak > 0 else 1.0)
            # Free slots hold zeros or stale rows: quantised too, never read (slots come from
            # live ids). Slices, not a gather of the live rows: half the time.
            codes = np.empty(self._matrix.shape, dtype=np.int8)
            for start in range(0, len(self._matrix), 65_536):
                part = slice(start, start + 65_536)
                codes[part] = self._quantise(self._matrix[part])
            self._codes = codes
        return self._codes

    def _shortlist(
        self, query: Vector, k: int, slots: npt.NDArray[np.int64]
    ) -> npt.NDArray[np.int64]:
        """The ``slots`` (ascending) whose int8 scores are among the best few per result."""
        codes = self._ensure_codes()
        keep = min(slots.size, max(_SHORTLIST_MIN, _SHORTLIST_PER_RESULT * k))
        # np.take gathers ~20 % faster than fancy indexing (but see _scope_block: no gather).
        scores = _int8_scores(np.take(codes, slots, axis=0), _pack_query(query))
        if keep < scores.size:
            best = np.argpartition(scores, scores.size - keep)[scores.size - keep :]
            slots = slots[best]
        return np.sort(slots)

    def _slots_for(self, ids: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        """The slot of each of ``ids``, -1 where an id is not in the index."""
        dense = self._dense
        if dense is None:
            return np.fromiter(
                map(self._slot.get, ids.tolist(), itertools.repeat(-1)),
                dtype=np.int64,
                count=ids.size,
            )
        slots = np.full(ids.size, -1, dtype=np.int64)
        inside = (ids >= 0) & (ids < len(dense))
        slots[inside] = dense[ids[inside]]
        return slots

    def _scope_rows_limit(self) -> int:
        return max(_SCOPE_ROWS_MIN, len(self._slot))

    def _drop_block(self, scope: Hashable) -> None:
        block = self._blocks.pop(scope, None)
        if block is not None:
            self._block_rows -= block.ids.size

    def _scope_block(self, scope: Hashable, allowed: npt.NDArray[np.int64]) -> _ScopeBlock | None:
        """The block of ``scope``: ``allowed``'s int8 rows in a few contiguous chunks, kept
        current. None if ``allowed`` is not ascending and distinct (then the caller gathers).

        A kept block is first patched with the ids changed since it was read (the log of
        :meth:`add` and :meth:`remove`; rebuilt if the log no longer reaches back), then
        compared with ``allowed``: equal, used as it is; ``allowed`` extends it (new ids, the
        usual case of a store's growing scope), the new rows are appended; else rebuilt. The
        blocks hold at most ``max(len(self), 65,536)`` rows together (least recently used
        dropped first): at most the size of the whole int8 copy, ~0.4 KB a row at 384
        dimensions.
        """
        block = self._blocks.get(scope)
        if block is not None and block.version < self._changes_floor:
            self._drop_block(scope)
            block = None
        if block is not None and block.version != self._version:
            touched = np.concatenate(
                [ids for version, ids in self._changes if version > block.version]
            )
            where = np.minimum(np.searchsorted(block.ids, touched), block.ids.size - 1)
            rows = np.unique(where[block.ids[where] == touched])
            if rows.size:
                block.refresh(rows, self._slots_for(block.ids[rows]), self._ensure_codes())
            block.version = self._version
        if block is not None and not np.array_equal(allowed, block.ids):
            count = block.ids.size
            added = allowed[count:]
            if (
                allowed.size > count
                and np.array_equal(allowed[:count], block.ids)
                and added[0] > block.ids[-1]
                and bool(np.all(added[1:] > added[:-1]))
            ):
                block.ids = allowed.copy()
                block.append(self._slots_for(added), self._ensure_codes())
                self._block_rows += added.size
            else:
                self._drop_block(scope)
                block = None
        if block is None:
            if allowed.size > 1 and not bool(np.all(allowed[1:] > allowed[:-1])):
                return None
            # Rows gathered from the int8 copy (~2 ms for 25k rows at 1M; quantising them from
            # the float16 copy instead costs ~20 ms: numpy's float16 conversion is slow).
            block = _ScopeBlock(
                allowed.copy(), max(1, _BLOCK_CHUNK_BYTES // self._dim), self._version
            )
            block.append(self._slots_for(allowed), self._ensure_codes())
            self._blocks[scope] = block
            self._block_rows += allowed.size
        self._blocks.move_to_end(scope)
        limit = self._scope_rows_limit()
        while self._block_rows > limit and len(self._blocks) > 1:
            self._drop_block(next(iter(self._blocks)))
        return block

    def _block_shortlist(
        self, query: Vector, k: int, block: _ScopeBlock
    ) -> npt.NDArray[np.int64] | None:
        """Like :meth:`_shortlist`, over a scope block's contiguous rows (no gather). None if a
        shortlisted row's slot no longer holds its id (a change the log missed)."""
        scores = block.scores(_pack_query(query))
        live = block.slots >= 0
        alive = int(np.count_nonzero(live))
        if alive < scores.size:
            scores[~live] = np.iinfo(scores.dtype).min
        keep = min(alive, max(_SHORTLIST_MIN, _SHORTLIST_PER_RESULT * k))
        rows = np.flatnonzero(live)
        if keep < scores.size:
            rows = np.argpartition(scores, scores.size - keep)[scores.size - keep :]
            rows = rows[live[rows]]
        slots = block.slots[rows]
        if not np.array_equal(self._ids[slots], block.ids[rows]):
            return None
        return np.sort(slots)

    def _rescore(
        self, query: Vector, k: int, slots: npt.NDArray[np.int64]
    ) -> list[tuple[int, float]]:
        """Exact cosine of ``slots`` against ``query``; top ``k`` by score, then id.

        Many slots are first shortlisted by their int8 copy (:meth:`_shortlist`); the
        shortlist is scored exactly, so a score is the same cosine whichever path answered.
        """
        if slots.size == 0:
            return []
        if slots.size >= _SHORTLIST_ROWS and slots.size > _SHORTLIST_PER_RESULT * 4 * k:
            slots = self._shortlist(query, k, np.sort(slots))
        if slots.size > 4 * k and slots.size > 512:
            # Many rows: usearch's SIMD float16 kernel shortlists 2k of them (numpy's float16 to
            # float32 conversion alone costs ~5x more); the shortlist is then scored below.
            slots = np.sort(slots)  # ascending rows gather faster
            shortlist = _usearch_module().search(
                self._matrix[slots],
                query.astype(np.float16),
                2 * k,
                "ip",
                exact=True,
                threads=1,
            )
            slots = slots[np.asarray(shortlist.keys, dtype=np.int64)]
        scores = self._matrix[slots].astype(np.float32) @ query
        ids = self._ids[slots]
        if slots.size > k:
            # Keep every id tied with the k-th score, so the id tie-break is exact.
            threshold = np.partition(scores, slots.size - k)[slots.size - k]
            mask = scores >= threshold
            ids, scores = ids[mask], scores[mask]
        order = np.lexsort((ids, -scores))[:k]
        return [(int(ids[i]), float(scores[i])) for i in order]

    # -- persistence ---------------------------------------------------------------------------

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the index to ``path`` atomically (a reader sees the old file or the new one).

        Layout: ``CTXWVEC1``, an 8-byte little-endian header length, a JSON header, the live ids
        (int64), their float16 vectors, then the serialised graph.
        """
        target = Path(path)
        temporary = target.with_name(f".{target.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        with self._lock:
            live = np.flatnonzero(self._ids >= 0)
            # usearch serialises to a bytearray; written as is (no second copy of ~1 KB a row).
            graph_bytes = self._ensure_graph().save()
            header = json.dumps(
                {
                    "format": _FORMAT,
                    "dim": self._dim,
                    "count": int(live.size),
                    "connectivity": self._connectivity,
                    "expansion_add": self._expansion_add,
                    "graph_bytes": len(graph_bytes),
                }
            ).encode()
            try:
                with open(temporary, "wb") as handle:
                    handle.write(_MAGIC + len(header).to_bytes(8, "little") + header)
                    handle.write(self._ids[live].astype("<i8").tobytes())
                    handle.write(self._matrix[live].astype("<f2").tobytes())
                    handle.write(graph_bytes)
                    handle.flush()
                    os.fsync(handle.fileno())
                os.replace(temporary, target)
            except OSError as exc:
                temporary.unlink(missing_ok=True)
                raise StoreError(
                    f"could not save the vector index to {target}: {exc}; check the directory "
                    "exists, is writable and has free space"
                ) from exc

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
        fix = "delete it to rebuild the index from the store"
        try:
            with open(source, "rb") as handle:
                if handle.read(len(_MAGIC)) != _MAGIC:
                    raise StoreError(f"{source} is not a ctxwarden vector index: {fix}")
                header = json.loads(handle.read(int.from_bytes(handle.read(8), "little")))
                if header.get("format") != _FORMAT:
                    raise StoreError(
                        f"{source} has vector index format {header.get('format')}, this version "
                        f"reads {_FORMAT}: {fix}"
                    )
                dim, count = int(header["dim"]), int(header["count"])
                ids = np.frombuffer(handle.read(8 * count), dtype="<i8").astype(np.int64)
                matrix = np.frombuffer(handle.read(2 * count * dim), dtype="<f2")
                graph_bytes = handle.read(int(header["graph_bytes"]))
        except OSError as exc:
            raise StoreError(f"could not read the vector index {source}: {exc}; {fix}") from exc
        except (ValueError, KeyError, TypeError) as exc:
            raise StoreError(f"{source} has a damaged header ({exc}): {fix}") from exc
        if (
            ids.size != count
            or matrix.size != count * dim
            or len(graph_bytes) != header["graph_bytes"]
        ):
            raise StoreError(f"{source} is truncated: {fix}")
        graph = _usearch().restore(graph_bytes)
        if graph is None or len(graph) != count or int(graph.ndim) != dim:
            raise StoreError(f"{source} holds a graph that does not match its vectors: {fix}")
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
