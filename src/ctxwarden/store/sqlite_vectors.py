"""Vectors for the SQLite backend: the ``memory_vectors`` table plus one HNSW index per model.

The table is the truth; the :class:`~ctxwarden.vectors.VectorIndex` is a cache of it, kept in
memory and persisted beside the database file (``<db>.vectors/<model>.idx`` with a small JSON
of the last change it holds). Every insert, replacement and delete of a vector (the cascade of a
memory's delete included) appends a row to ``vector_changes`` by trigger; before a search the
index replays the changes after the sequence number it last saw, so it is consistent with the
table through deletes and through writes of other processes. A missing, damaged or foreign
index file, or a log that no longer reaches back to the file's sequence number, makes the index
rebuild from the table.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sqlite3
import threading
from collections.abc import Callable, Hashable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt

from ctxwarden.errors import InputError, StoreError
from ctxwarden.vectors import VectorIndex

__all__ = ["VectorCache", "decode", "encode"]

log = logging.getLogger(__name__)

T = TypeVar("T")
Query = Callable[[str, Sequence[Any]], list[Any]]


def encode(vector: npt.NDArray[Any]) -> bytes:
    """A vector as stored: float16, little-endian."""
    return np.asarray(vector, dtype="<f2").tobytes()


def decode(blob: bytes, dim: int) -> npt.NDArray[np.float32]:
    """The float32 vector of a stored blob."""
    return np.frombuffer(blob, dtype="<f2", count=dim).astype(np.float32)


def _slug(model: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", model)[:120] or "model"


class _Entry:
    def __init__(self, index: VectorIndex | None, seq: int, saved_seq: int) -> None:
        self.index = index
        self.seq = seq
        self.saved_seq = saved_seq


class VectorCache:
    """The per-model indexes of one SQLite store (thread-safe; I/O through ``query``)."""

    def __init__(self, db_path: str, query: Query) -> None:
        self._dir = None if db_path == ":memory:" else Path(db_path + ".vectors")
        self._query = query
        self._entries: dict[str, _Entry] = {}
        self._lock = threading.RLock()

    def _paths(self, model: str) -> tuple[Path, Path] | None:
        if self._dir is None:
            return None
        base = self._dir / _slug(model)
        return base.with_suffix(".idx"), base.with_suffix(".json")

    def _last_seq(self, model: str) -> int:
        rows = self._query("SELECT max(seq) FROM vector_changes WHERE model = ?", (model,))
        return int(rows[0][0] or 0)

    def _first_seq(self, model: str) -> int:
        rows = self._query("SELECT min(seq) FROM vector_changes WHERE model = ?", (model,))
        return int(rows[0][0] or 0)

    def _load(self, model: str) -> _Entry:
        paths = self._paths(model)
        if paths is not None and paths[0].is_file() and paths[1].is_file():
            try:
                meta = json.loads(paths[1].read_text())
                seq = int(meta["seq"])
                if meta.get("model") != model:
                    raise StoreError("the index file belongs to another model")
                first = self._first_seq(model)
                # Changes after `seq` must all still be in the log (never pruned past it).
                if first and first > seq + 1:
                    raise StoreError("the change log no longer reaches back to the file")
                index = VectorIndex.load(paths[0])
                return _Entry(index, seq, seq)
            except (StoreError, ValueError, KeyError, TypeError, OSError) as exc:
                log.warning("vector index for %s is stale or damaged (%s): rebuilding", model, exc)
        return self._rebuild(model)

    def _rebuild(self, model: str) -> _Entry:
        seq = self._last_seq(model)
        index: VectorIndex | None = None
        last = -1
        while True:
            rows = self._query(
                "SELECT memory_rowid, dim, embedding FROM memory_vectors WHERE model = ? "
                "AND memory_rowid > ? ORDER BY memory_rowid LIMIT 20000",
                (model, last),
            )
            if not rows:
                break
            dim = int(rows[0][1])
            if index is None:
                index = VectorIndex(dim, threads=2)
            ids = [int(r[0]) for r in rows]
            matrix = np.vstack([decode(r[2], dim) for r in rows])
            index.add(ids, matrix)
            last = ids[-1]
        # saved_seq -1: a rebuilt index is worth saving even when the log is empty.
        return _Entry(index, seq, -1)

    def _entry(self, model: str) -> _Entry:
        with self._lock:
            entry = self._entries.get(model)
            if entry is None:
                entry = self._entries[model] = self._load(model)
            self._catch_up(model, entry)
            return entry

    def _catch_up(self, model: str, entry: _Entry) -> None:
        last = self._last_seq(model)
        if last <= entry.seq:
            if last < entry.seq:  # the log was reset (vectors dropped): start again
                fresh = self._rebuild(model)
                entry.index, entry.seq, entry.saved_seq = fresh.index, fresh.seq, -1
            return
        rows = self._query(
            "SELECT c.memory_rowid, v.dim, v.embedding FROM "
            "(SELECT DISTINCT memory_rowid FROM vector_changes WHERE model = ? AND seq > ? "
            "AND seq <= ?) c LEFT JOIN memory_vectors v "
            "ON v.memory_rowid = c.memory_rowid AND v.model = ?",
            (model, entry.seq, last, model),
        )
        gone = [int(r[0]) for r in rows if r[2] is None]
        present = [r for r in rows if r[2] is not None]
        if present and entry.index is None:
            entry.index = VectorIndex(int(present[0][1]), threads=2)
        if entry.index is not None:
            if gone:
                entry.index.remove(gone)
            if present:
                dim = entry.index.dim
                entry.index.add(
                    [int(r[0]) for r in present], np.vstack([decode(r[2], dim) for r in present])
                )
            if entry.index.removed_since_rebuild > max(1000, len(entry.index) // 5):
                entry.index.rebuild()
        entry.seq = last

    def search(
        self,
        model: str,
        vector: npt.NDArray[np.float32],
        k: int,
        *,
        allowed: set[int] | npt.NDArray[np.int64] | None = None,
        scope: Hashable | None = None,
    ) -> list[tuple[int, float]]:
        """The ``k`` nearest rowids of ``model``'s vectors (every tenant), best first
        (``scope`` names ``allowed``: see :meth:`VectorIndex.search`)."""
        entry = self._entry(model)
        if entry.index is None:
            return []
        if entry.index.dim != vector.shape[-1]:
            raise InputError(
                f"query vector has {vector.shape[-1]} dimensions, the {model!r} vectors "
                f"{entry.index.dim}: embed the query with the same embedder",
                field="vector",
            )
        return entry.index.search(vector, k, allowed=allowed, scope=scope)

    def forget(self, model: str) -> None:
        """Drop the cached index of ``model`` and its file (after its vectors were dropped)."""
        with self._lock:
            self._entries.pop(model, None)
            paths = self._paths(model)
            if paths is not None:
                for path in paths:
                    path.unlink(missing_ok=True)

    def save(self) -> None:
        """Persist every index that changed since it was loaded or saved."""
        if self._dir is None:
            return
        with self._lock:
            for model, entry in self._entries.items():
                if entry.index is None or entry.seq == entry.saved_seq:
                    continue
                paths = self._paths(model)
                assert paths is not None
                try:
                    self._dir.mkdir(parents=True, exist_ok=True)
                    entry.index.save(paths[0])
                    temporary = paths[1].with_name(paths[1].name + f".{os.getpid()}.tmp")
                    temporary.write_text(json.dumps({"model": model, "seq": entry.seq}))
                    os.replace(temporary, paths[1])
                    entry.saved_seq = entry.seq
                except (OSError, StoreError, sqlite3.Error) as exc:
                    log.warning("could not save the vector index of %s: %s", model, exc)
