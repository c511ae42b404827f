"""The exact side copy of a :class:`~ctxwarden.vectors.VectorIndex`: slots, float16 and int8 rows.

The graph finds candidates; this copy scores them. :class:`SideCopy` keeps every live vector as
a float16 row (row ``slot`` holds the vector of id ``_ids[slot]``), maps ids to slots (a dense
numpy map while ids are small), keeps an int8 copy for the shortlist of large exhaustive passes
and the contiguous int8 blocks of named scopes with the log of changed ids that keeps them
current, and re-scores slots exactly (:meth:`SideCopy._rescore`). The reasons and the
measurements are in :mod:`ctxwarden.vectors`. Not thread-safe by itself: the index calls it
under its lock.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict, deque
from collections.abc import Hashable, Iterable
from typing import Any

import numpy as np
import numpy.typing as npt

from ctxwarden.errors import ConfigError

__all__ = ["SideCopy", "Vector"]

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

Vector = npt.NDArray[np.float32]


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


class SideCopy:
    """The float16 rows, the id -> slot maps, the int8 copy and the named scopes' blocks of a
    :class:`~ctxwarden.vectors.VectorIndex` of ``dim``-long vectors (its base class)."""

    def __init__(self, dim: int) -> None:
        self._dim = dim
        # Side copy: row `slot` of _matrix holds the vector of id _ids[slot] (-1: free slot).
        self._matrix = np.zeros((0, dim), dtype=np.float16)
        self._ids = np.zeros(0, dtype=np.int64)
        self._slot: dict[int, int] = {}
        # Vectorised id -> slot map while ids are small (SQLite rowids are): scope lookups then
        # run in numpy instead of a Python loop. None once an id is too large to index densely.
        self._dense: npt.NDArray[np.int32] | None = np.zeros(0, dtype=np.int32)
        self._free: list[int] = []
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
        # tolist: the same Python ints and floats as int() and float() of each, ~4x sooner
        return list(zip(ids[order].tolist(), scores[order].tolist(), strict=True))
