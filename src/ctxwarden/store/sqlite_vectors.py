"""Vectors for the SQLite backend: the ``memory_vectors`` table plus one HNSW index per model.

The table is the truth; the :class:`~ctxwarden.vectors.VectorIndex` is a cache of it, kept in
memory and persisted beside the database file (``<db>.vectors/<model>.idx`` with a small JSON
of the last change it holds). Every insert, replacement and delete of a vector (the cascade of a
memory's delete included) appends a row to ``vector_changes`` by trigger; before a search the
index replays the changes after the sequence number it last saw, so it is consistent with the
table through deletes and through writes of other processes. A missing, damaged or foreign
index file, or a log that no longer reaches back to the file's sequence number, makes the index
rebuild from the table.

:class:`SQLiteVectors` is the vector half of :class:`~ctxwarden.store.sqlite.SQLiteStore` (the
store's ``put_vectors``, ``vector_search`` and the rest of the vector methods of the protocol),
a mixin over the store's connection, lock and :class:`VectorCache`.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sqlite3
import threading
from collections.abc import Callable, Hashable, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
import numpy.typing as npt

from ctxwarden.errors import InputError, StoreError
from ctxwarden.scope import ReadScope
from ctxwarden.store.reads import MEMORY_COLUMNS, embedded_text, memory_of, scope_sql
from ctxwarden.types import Memory
from ctxwarden.vectors import VectorIndex

__all__ = ["SQLiteVectors", "VectorCache", "decode", "encode"]

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
            index.add(*_directed(ids, matrix))
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
                    *_directed(
                        [int(r[0]) for r in present],
                        np.vstack([decode(r[2], dim) for r in present]),
                    )
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

    def persist_deletions(self) -> None:
        """Bring every index loaded or on disk up to the table and save it, so vectors deleted
        from the table leave the ``.vectors`` files now, not at close (erasure and compaction
        call this through the store's scrub). An index neither loaded nor saved has nothing to
        scrub and is not built."""
        names = set(self._entries)
        if self._dir is not None and self._dir.is_dir():
            for meta in self._dir.glob("*.json"):
                try:
                    names.add(str(json.loads(meta.read_text())["model"]))
                except (OSError, ValueError, KeyError, TypeError):
                    continue  # a damaged file is rebuilt on its next load
        with self._lock:
            for model in sorted(names):
                self._entry(model)
            self.save()

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


class SQLiteVectors:
    """The store's vectors: ``memory_vectors`` rows written in the store's transactions,
    searched through its :class:`VectorCache` (the store supplies the connection, its lock,
    :meth:`write`, :meth:`_query`, the cache and the author-scope caches, created empty)."""

    _conn: sqlite3.Connection
    _lock: threading.RLock
    _vectors: VectorCache
    _scope_cache: dict[tuple[str, str], npt.NDArray[np.int64]]
    _scope_stamp: dict[tuple[str, str], tuple[int, int]]

    def write(self, *, wait: float | None = None) -> AbstractContextManager[Any]:
        raise NotImplementedError

    def _query(self, sql: str, params: Sequence[Any]) -> list[Any]:
        raise NotImplementedError

    def _check_open(self) -> None:
        raise NotImplementedError

    if TYPE_CHECKING:  # supplied by the store (SQLiteRows: a stub here would shadow it)

        def _remembered(self, sql: str, params: Sequence[Any]) -> Sequence[Any]: ...

    def put_vectors(
        self,
        model: str,
        rowids: Sequence[int],
        vectors: npt.NDArray[np.float32],
        *,
        wait: float | None = None,
    ) -> int:
        """Store one vector per rowid under ``model`` (replacing any); returns how many were kept.

        Rows deleted meanwhile are skipped. ``wait``: the longest wait for the write lock
        (seconds; None: the store's timeout), past it ``StoreUnavailable`` and nothing stored.
        :class:`InputError` if the shape is wrong or the length differs from the vectors
        already stored for ``model``.
        """
        matrix = np.asarray(vectors, dtype=np.float32)
        if matrix.ndim != 2 or matrix.shape[0] != len(rowids):
            raise InputError(
                f"{len(rowids)} rowids but vectors of shape {matrix.shape}: pass one row each",
                field="vectors",
            )
        if not rowids:
            return 0
        dim = int(matrix.shape[1])
        known = self._query("SELECT dim FROM memory_vectors WHERE model = ? LIMIT 1", (model,))
        if known and int(known[0][0]) != dim:
            raise InputError(
                f"model {model!r} has {known[0][0]}-d vectors in the store, these are {dim}-d: "
                "one model name must always give vectors of one length",
                field="vectors",
            )
        with self.write(wait=wait):
            live: set[int] = set()
            ids = [int(r) for r in rowids]
            for start in range(0, len(ids), 500):
                chunk = ids[start : start + 500]
                marks = ",".join("?" * len(chunk))
                live.update(
                    int(r[0])
                    for r in self._conn.execute(
                        f"SELECT rowid FROM memories WHERE rowid IN ({marks})", chunk
                    )
                )
            rows = [
                (r, model, dim, encode(v)) for r, v in zip(ids, matrix, strict=True) if r in live
            ]
            self._conn.executemany(
                "INSERT OR REPLACE INTO memory_vectors (memory_rowid, model, dim, embedding) "
                "VALUES (?, ?, ?, ?)",
                rows,
            )
        return len(rows)

    def pending_embeddings(
        self, model: str, *, after: int = 0, limit: int = 256
    ) -> list[tuple[int, str]]:
        """Memories with text and no ``model`` vector, as ``(rowid, content)``, rowid > ``after``.

        Tool results are left out (retrieval never offers them). Every tenant: embedding is
        maintenance, not a read on a tenant's behalf.
        """
        rows = self._query(
            "SELECT m.rowid, m.content, m.attachment_text FROM memories m WHERE m.rowid > ? "
            "AND (m.content != '' OR m.attachment_text IS NOT NULL) "
            "AND m.role != 'tool' AND NOT EXISTS (SELECT 1 FROM memory_vectors v "
            "WHERE v.memory_rowid = m.rowid AND v.model = ?) ORDER BY m.rowid LIMIT ?",
            (after, model, limit),
        )
        return [(int(r[0]), embedded_text(str(r[1]), r[2])) for r in rows]

    def embed_pending_batch(
        self,
        model: str,
        embed: Callable[[list[str]], npt.NDArray[np.float32]],
        *,
        after: int = 0,
        limit: int = 32,
    ) -> list[int]:
        """Embed and store up to ``limit`` pending memories (see the protocol). No lock is
        held while ``embed`` runs: ingest goes on meanwhile."""
        pending = self.pending_embeddings(model, after=after, limit=limit)
        if not pending:
            return []
        rowids = [r for r, _ in pending]
        self.put_vectors(model, rowids, embed([text for _, text in pending]))
        return rowids

    def vector_models(self) -> dict[str, int]:
        """How many vectors each embedding model has in the store."""
        rows = self._query(
            "SELECT model, count(*) FROM memory_vectors GROUP BY model ORDER BY model", ()
        )
        return {str(m): int(n) for m, n in rows}

    def drop_vectors(self, model: str) -> int:
        """Delete every vector of ``model`` (before re-embedding); returns how many."""
        with self.write():
            cursor = self._conn.execute("DELETE FROM memory_vectors WHERE model = ?", (model,))
            self._conn.execute("DELETE FROM vector_changes WHERE model = ?", (model,))
            count = cursor.rowcount
        self._vectors.forget(model)
        return count

    def vector_search(
        self,
        tenant: str,
        model: str,
        vector: npt.NDArray[np.float32],
        *,
        k: int = 100,
        session: str | None = None,
        author: str | None = None,
        scope: ReadScope | None = None,
    ) -> list[tuple[Memory, float]]:
        """The ``k`` memories of ``tenant`` (and ``session``, ``author``, ``scope``) nearest
        ``vector`` (:meth:`_nearest`)."""
        return self._nearest(
            tenant, model, vector, k=k, session=session, author=author, scope=scope
        )

    def vector_nearest(
        self,
        tenant: str,
        model: str,
        vector: npt.NDArray[np.float32],
        *,
        k: int = 100,
        author: str | None = None,
        scope: ReadScope | None = None,
    ) -> list[tuple[int, float]]:
        """:meth:`vector_search`'s rowids and cosines, no memory read (~10 us a row)."""
        return self._nearest(
            tenant, model, vector, k=k, author=author, scope=scope, rowids_only=True
        )

    def _nearest(
        self,
        tenant: str,
        model: str,
        vector: npt.NDArray[np.float32],
        *,
        k: int,
        session: str | None = None,
        author: str | None = None,
        scope: ReadScope | None = None,
        rowids_only: bool = False,
    ) -> list[tuple[Any, float]]:
        """The ``k`` memories (their rowids when ``rowids_only``) of ``tenant`` (and
        ``session``, ``author``, ``scope``) nearest ``vector``, with their cosines.

        An ``author`` scope is searched exactly over that author's rows, and so is a read
        scope narrower than the tenant (a session's or an end user's rows): an index search
        filtered afterwards could return fewer than ``k`` of them.

        The index holds every tenant's vectors; the tenant filter runs in the query that reads
        the rows, widening the search until ``k`` are found or the index is exhausted.
        """
        if k < 1:
            return []
        query = np.asarray(vector, dtype=np.float32).reshape(-1)
        want = k
        where = "tenant = ?" + (" AND session = ?" if session is not None else "")
        params: list[Any] = [tenant] + ([session] if session is not None else [])
        read_filter, read_params = scope_sql(scope)
        where += read_filter
        params += read_params
        allowed: set[int] | npt.NDArray[np.int64] | None = None
        named: tuple[str, str, str] | None = None
        if read_filter and author is None:
            # (The scope's rowids: the same turn after turn while its rows do not change.)
            allowed = {
                int(r[0])
                for r in self._remembered(f"SELECT rowid FROM memories WHERE {where}", params)
            }
            if not allowed:
                return []
        if author is not None:
            if session is None and not read_filter:
                allowed = self._author_rows(tenant, author)
                # Named: the index keeps the author's int8 rows in one block (no gather).
                named = ("author", tenant, author)
            else:
                allowed = {
                    int(r[0])
                    for r in self._remembered(
                        f"SELECT rowid FROM memories WHERE {where} AND author = ?",
                        [*params, author],
                    )
                }
            if not len(allowed):
                return []
            # Re-checked as the rows are read (a rowid freed and reused by another author).
            where += " AND author = ?"
            params.append(author)
        # "+" keeps the planner on the rowid look-ups (not a scan of a tenant index).
        plus = re.sub(r"\b(tenant|session|end_user|author) =", r"+\1 =", where)
        read = "rowid FROM memories" if rowids_only else f"{MEMORY_COLUMNS} FROM memory_rows"
        while True:
            hits = self._vectors.search(model, query, want, allowed=allowed, scope=named)
            if not hits:
                return []
            score = dict(hits)
            found: list[tuple[Any, float]] = []
            ids = list(score)
            if rowids_only and allowed is not None and named is None:
                # The allowed rowids were read from the table by this call's filter: no
                # second look (~1.5 us a rowid); a caller reads the memories it uses. The
                # index's order is already (-cosine, rowid).
                return [(int(r), c) for r, c in hits][:k]
            for start in range(0, len(ids), 500):
                chunk = ids[start : start + 500]
                marks = ",".join("?" * len(chunk))
                for row in self._query(
                    f"SELECT {read} WHERE rowid IN ({marks}) AND {plus}",
                    [*chunk, *params],
                ):
                    rowid = int(row[0])
                    found.append((rowid if rowids_only else memory_of(row), score[rowid]))
            if len(found) >= k or len(hits) < want or want >= 100_000:
                if rowids_only:
                    found.sort(key=lambda pair: (-pair[1], pair[0]))
                else:
                    found.sort(key=lambda pair: (-pair[1], pair[0].rowid))
                return found[:k]
            want *= 8

    def _author_rows(self, tenant: str, author: str) -> npt.NDArray[np.int64]:
        """The rowids of ``author``'s memories in ``tenant``, ascending (cached per author).

        A cached scope is returned as it is while nothing was written since it was last checked
        (:meth:`_change_stamp`); an author not cached is read at once. A cached one is then
        checked against the author's row count and highest rowid (one count over the
        ``memories_author`` index, in C, ~1.5 ms for 25k rows); new rows are read alone when
        the rows above the cached highest make up the difference, everything is read again
        otherwise (deletes).
        """
        key = (tenant, author)
        with self._lock:
            stamp = self._change_stamp()
            cached = self._scope_cache.get(key)
            if cached is not None and self._scope_stamp.get(key) == stamp:
                return cached
            if cached is None:
                # Nothing to check against: read the rows at once (the count costs as much).
                rows = self._author_rowids(tenant, author, -1)
                if rows.size:
                    self._remember_scope(key, rows, stamp)
                return rows
            count, high = self._query(
                "SELECT count(*), max(rowid) FROM memories WHERE author = ? AND tenant = ?",
                (author, tenant),
            )[0]
            if not count:
                self._scope_cache.pop(key, None)
                self._scope_stamp.pop(key, None)
                return np.zeros(0, dtype=np.int64)
            if len(cached) == count and int(cached[-1]) == high:
                self._scope_stamp[key] = stamp
                return cached
            last = int(cached[-1]) if len(cached) else -1
            if high <= last:
                cached, last = np.zeros(0, dtype=np.int64), -1
            rows = np.concatenate([cached, self._author_rowids(tenant, author, last)])
            if len(rows) != count:  # rows below the cached highest went: read them all again
                rows = self._author_rowids(tenant, author, -1)
            self._remember_scope(key, rows, stamp)
            return rows

    def _remember_scope(
        self, key: tuple[str, str], rows: npt.NDArray[np.int64], stamp: tuple[int, int]
    ) -> None:
        if len(self._scope_cache) >= 256 and key not in self._scope_cache:
            self._scope_cache.clear()
            self._scope_stamp.clear()
        self._scope_cache[key] = rows
        self._scope_stamp[key] = stamp

    def _author_rowids(self, tenant: str, author: str, above: int) -> npt.NDArray[np.int64]:
        """``author``'s rowids above ``above``, ascending. One comma-separated string parsed by
        numpy: ~3 ms for 25k rows where fetching them as 25k Python rows costs ~10 ms."""
        text = self._query(
            "SELECT group_concat(rowid) FROM (SELECT rowid FROM memories WHERE author = ? "
            "AND tenant = ? AND rowid > ? ORDER BY rowid)",
            (author, tenant, above),
        )[0][0]
        if not text:
            return np.zeros(0, dtype=np.int64)
        # group_concat's order follows the subquery's in practice, not by contract: sort.
        return np.sort(np.fromstring(text, dtype=np.int64, sep=","))

    def _change_stamp(self) -> tuple[int, int]:
        """What changes whenever the database may have: ``PRAGMA data_version`` (commits of
        other connections) and this connection's ``total_changes`` (its own writes, rolled back
        ones too). Equal stamps: no row was written in between."""
        with self._lock:
            self._check_open()
            try:
                version = self._conn.execute("PRAGMA data_version").fetchone()[0]
            except sqlite3.DatabaseError as exc:
                raise StoreError(f"query failed: {exc}") from exc
            return int(version), self._conn.total_changes

    def vector_window(
        self,
        tenant: str,
        model: str,
        *,
        channel: str | None,
        author: str | None,
        seen_since: float,
        created_until: float,
    ) -> list[tuple[Memory, npt.NDArray[np.float32]]]:
        """Messages of ``tenant`` in ``channel`` by ``author`` last seen at or after
        ``seen_since`` and created at or before ``created_until``, with their ``model`` vector
        (those without one are left out), oldest first (layer C's window)."""
        cols = ", ".join("m." + c.strip() for c in MEMORY_COLUMNS.split(","))
        rows = self._query(
            f"SELECT {cols}, v.dim, v.embedding FROM memory_rows m JOIN memory_vectors v "
            "ON v.memory_rowid = m.rowid AND v.model = ? WHERE m.author IS ? AND m.tenant = ? "
            "AND m.channel IS ? AND m.kind = 'message' AND m.last_seen_at >= ? "
            "AND m.created_at <= ? ORDER BY m.created_at, m.rowid",
            (model, author, tenant, channel, seen_since, created_until),
        )
        return [(memory_of(r[:-2]), decode(r[-1], int(r[-2]))) for r in rows]


def _directed(
    ids: list[int], matrix: npt.NDArray[np.float32]
) -> tuple[list[int], npt.NDArray[np.float32]]:
    """The rows that have a direction: an all-zero vector (a text of no token the embedder
    knows, e.g. the static model's) is kept in the table, so its memory is not embedded again,
    but left out of the index: it is similar to nothing."""
    norms = np.linalg.norm(matrix, axis=1)
    keep = np.isfinite(norms) & (norms > 0)
    if keep.all():
        return ids, matrix
    return [i for i, k in zip(ids, keep, strict=True) if k], matrix[keep]
