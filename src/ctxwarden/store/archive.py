"""The archive of compacted originals (migration ``archive``), shared by the SQL backends.

With ``CompactionPolicy(keep_originals="archive")`` a retired memory's row is kept, before it
is deleted, in ``archived_memories``: its columns (:data:`~ctxwarden.store.reads.MEMORY_COLUMNS`)
as one zlib-compressed JSON array, with the summary that replaced it, its session and end user,
and the time it expires. :meth:`ArchiveReads.archived` gives the originals of a summary back as
:class:`~ctxwarden.types.Memory` values while they have not expired; the writer's
:meth:`ArchiveWrites.purge_archive` deletes the expired ones, and erasure deletes the archived
rows of what it erases (:meth:`ArchiveWrites._erase_archived`), so an erased text leaves the
archive too.

Written with SQLite's ``?`` placeholders, as :mod:`ctxwarden.store.writes` is.

>>> blob = encode_row((1, "m1", "t"))
>>> decode_row(blob, CODEC)
[1, 'm1', 't']
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Iterator, Sequence
from typing import Any

from ctxwarden.errors import StoreError
from ctxwarden.store.reads import MEMORY_COLUMNS, memory_of
from ctxwarden.types import Memory

__all__ = ["CODEC", "ArchiveReads", "ArchiveWrites", "decode_row", "encode_row"]

#: How ``archived_memories.record`` is compressed (stdlib zlib; zstd is not in Python 3.11's
#: standard library, and the column names the codec so another can be added).
CODEC = "zlib"


def encode_row(row: Sequence[Any]) -> bytes:
    """A memory row (:data:`MEMORY_COLUMNS`) as compressed JSON."""
    return zlib.compress(
        json.dumps(list(row), separators=(",", ":"), ensure_ascii=False).encode(), 6
    )


def decode_row(blob: bytes | memoryview, codec: str) -> list[Any]:
    """The row :func:`encode_row` compressed; :class:`StoreError` for an unknown codec."""
    if codec != CODEC:
        raise StoreError(f"archived_memories: unknown codec {codec!r}: upgrade ctxwarden")
    return list(json.loads(zlib.decompress(bytes(blob))))


class ArchiveReads:
    """The archive's read (mixed into :class:`~ctxwarden.store.reads.MemoryReads`)."""

    def _read(self, sql: str, params: Sequence[Any]) -> list[Any]:
        raise NotImplementedError

    def archived(self, tenant: str, summary_id: str, *, now: float) -> list[Memory]:
        """The originals compacted into ``summary_id`` and archived, not expired at ``now``,
        oldest first (``[]`` for none)."""
        rows = self._read(
            "SELECT codec, record FROM archived_memories WHERE tenant = ? AND summary_id = ? "
            "AND expires_at > ?",
            (tenant, summary_id, now),
        )
        found = [memory_of(decode_row(record, codec)) for codec, record in rows]
        return sorted(found, key=lambda m: (m.created_at, m.rowid))


class ArchiveWrites:
    """The archive's writes (mixed into :class:`~ctxwarden.store.writes.MemoryWrites`)."""

    def _rows(self, sql: str, params: Sequence[Any]) -> list[Any]:
        raise NotImplementedError

    def _run(self, sql: str, params: Sequence[Any]) -> None:
        raise NotImplementedError

    def _run_many(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        raise NotImplementedError

    def _in(self, values: Sequence[Any]) -> tuple[str, list[Any]]:
        raise NotImplementedError

    def _chunks(self, values: Sequence[Any]) -> Iterator[list[Any]]:
        raise NotImplementedError

    def _archive_rows(
        self,
        tenant: str,
        rowids: Sequence[int],
        *,
        summary_id: str,
        archived_at: float,
        expires_at: float,
    ) -> None:
        """Keep the memories at ``rowids`` (at most a chunk) in the archive, about to be
        retired into ``summary_id``."""
        where, params = self._in(rowids)
        rows = self._rows(
            f"SELECT {MEMORY_COLUMNS} FROM memory_rows WHERE tenant = ? AND rowid {where}",
            [tenant, *params],
        )
        self._run_many(
            "INSERT INTO archived_memories (tenant, id, summary_id, session, end_user, "
            "archived_at, expires_at, codec, record) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) "
            "ON CONFLICT (tenant, id) DO UPDATE SET summary_id = excluded.summary_id, "
            "session = excluded.session, end_user = excluded.end_user, "
            "archived_at = excluded.archived_at, expires_at = excluded.expires_at, "
            "codec = excluded.codec, record = excluded.record",
            [
                (tenant, r[1], summary_id, r[3], r[30], archived_at, expires_at, CODEC, blob)
                for r in rows
                for blob in (encode_row(r),)
            ],
        )

    def purge_archive(self, now: float) -> int:
        """Delete every archived original that expired by ``now``; how many."""
        found = self._rows("SELECT count(*) FROM archived_memories WHERE expires_at <= ?", (now,))
        count = int(found[0][0])
        if count:
            self._run("DELETE FROM archived_memories WHERE expires_at <= ?", (now,))
        return count

    def _erase_archived(self, tenant: str, ids: Sequence[str]) -> int:
        """Delete the archived originals with these ids and those archived under them as
        summaries, transitively (a summary compacted into another keeps its own originals
        under its id); how many."""
        erased = 0
        frontier = list(dict.fromkeys(ids))
        seen = set(frontier)
        while frontier:
            found: list[str] = []
            for chunk in self._chunks(frontier):
                where, params = self._in(chunk)
                rows = self._rows(
                    "SELECT id FROM archived_memories WHERE tenant = ? "
                    f"AND (id {where} OR summary_id {where})",
                    [tenant, *params, *params],
                )
                found.extend(str(r[0]) for r in rows)
                self._run(
                    "DELETE FROM archived_memories WHERE tenant = ? "
                    f"AND (id {where} OR summary_id {where})",
                    [tenant, *params, *params],
                )
                erased += len(rows)
            frontier = [i for i in dict.fromkeys(found) if i not in seen]
            seen.update(frontier)
        return erased
