"""The archive of compacted originals (migration ``archive``), shared by the SQL backends.

With ``CompactionPolicy(keep_originals="archive")`` the rows a summary replaces are kept,
before they are deleted, in ``archived_memories``: one row per summary, its originals' columns
(:data:`~ctxwarden.store.reads.MEMORY_COLUMNS`) as one zlib-compressed JSON array (a cluster
of short messages compresses about three times better together than one by one), with the
summary's session and the time they expire. :meth:`ArchiveReads.archived` gives them back as
:class:`~ctxwarden.types.Memory` values until then; the writer's
:meth:`ArchiveWrites.purge_archive` deletes the expired ones, and erasure rewrites a summary's
archive without the records it erases, or deletes it with the summary
(:meth:`ArchiveWrites._erase_archived`), so an erased text leaves the archive too.

Written with SQLite's ``?`` placeholders, as :mod:`ctxwarden.store.writes` is.

>>> blob = encode_rows([(1, "m1", "t")])
>>> decode_rows(blob, CODEC)
[[1, 'm1', 't']]
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Collection, Sequence
from typing import Any

from ctxwarden.errors import StoreError
from ctxwarden.store.reads import MEMORY_COLUMNS, memory_of
from ctxwarden.store.statements import StatementWrites
from ctxwarden.types import Memory

__all__ = ["CODEC", "ArchiveReads", "ArchiveWrites", "decode_rows", "encode_rows"]

#: How ``archived_memories.record`` is compressed (stdlib zlib; zstd is not in Python 3.11's
#: standard library, and the column names the codec so another can be added).
CODEC = "zlib"


def encode_rows(rows: Sequence[Sequence[Any]]) -> bytes:
    """Memory rows (:data:`MEMORY_COLUMNS`) as compressed JSON."""
    text = json.dumps([list(r) for r in rows], separators=(",", ":"), ensure_ascii=False)
    return zlib.compress(text.encode("utf-8", "surrogatepass"), 9)


def decode_rows(blob: bytes | memoryview, codec: str) -> list[list[Any]]:
    """The rows :func:`encode_rows` compressed; :class:`StoreError` for an unknown codec."""
    if codec != CODEC:
        raise StoreError(f"archived_memories: unknown codec {codec!r}: upgrade ctxwarden")
    return [
        list(r) for r in json.loads(zlib.decompress(bytes(blob)).decode("utf-8", "surrogatepass"))
    ]


class ArchiveReads:
    """The archive's read (mixed into each backend's store)."""

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
        found = [memory_of(r) for codec, record in rows for r in decode_rows(record, codec)]
        return sorted(found, key=lambda m: (m.created_at, m.rowid))


class ArchiveWrites(StatementWrites):
    """The archive's writes (the base of :class:`~ctxwarden.store.erasures.ErasureWrites`)."""

    def _archive_read(self, tenant: str, rowids: Sequence[int]) -> list[Any]:
        """The rows at ``rowids`` (at most a chunk) as the archive keeps them."""
        where, params = self._in(rowids)
        return self._rows(
            f"SELECT {MEMORY_COLUMNS} FROM memory_rows WHERE tenant = ? AND rowid {where} "
            "ORDER BY rowid",
            [tenant, *params],
        )

    def _archive_write(
        self,
        tenant: str,
        summary_id: str,
        rows: Sequence[Sequence[Any]],
        *,
        session: str,
        archived_at: float,
        expires_at: float,
    ) -> None:
        """Keep ``rows`` (read by :meth:`_archive_read`) as the originals of ``summary_id``,
        with those it already keeps."""
        old = self._rows(
            "SELECT codec, record FROM archived_memories WHERE tenant = ? AND summary_id = ?",
            (tenant, summary_id),
        )
        kept = [r for codec, record in old for r in decode_rows(record, codec)]
        ids = {r[1] for r in rows}
        merged = [*(r for r in kept if r[1] not in ids), *rows]
        self._run(
            "DELETE FROM archived_memories WHERE tenant = ? AND summary_id = ?",
            (tenant, summary_id),
        )
        self._run(
            "INSERT INTO archived_memories (tenant, summary_id, session, archived_at, "
            "expires_at, originals, codec, record) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (tenant, summary_id, session, archived_at, expires_at, len(merged), CODEC,
             encode_rows(merged)),
        )  # fmt: skip

    def purge_archive(self, now: float) -> int:
        """Delete every archived original that expired by ``now``; how many."""
        found = self._rows(
            "SELECT coalesce(sum(originals), 0) FROM archived_memories WHERE expires_at <= ?",
            (now,),
        )
        count = int(found[0][0])
        if count:
            self._run("DELETE FROM archived_memories WHERE expires_at <= ?", (now,))
        return count

    def _erase_archived(
        self, tenant: str, summaries: Collection[str], gone: Collection[str]
    ) -> None:
        """Erase from the archive: the originals of the ``summaries`` that lose ids (rewritten
        without the records of ``gone``), and the whole archive of every id in ``gone`` that
        is a summary, with, transitively, the archives of summaries archived in it."""
        gone = set(gone)
        for summary_id in sorted(set(summaries) - gone):
            rows = self._rows(
                "SELECT session, archived_at, expires_at, codec, record FROM archived_memories "
                "WHERE tenant = ? AND summary_id = ?",
                (tenant, summary_id),
            )
            if not rows:
                continue
            session, archived_at, expires_at, codec, record = rows[0]
            kept = [r for r in decode_rows(record, codec) if r[1] not in gone]
            self._run(
                "DELETE FROM archived_memories WHERE tenant = ? AND summary_id = ?",
                (tenant, summary_id),
            )
            if kept:
                self._archive_write(
                    tenant, summary_id, kept, session=str(session),
                    archived_at=float(archived_at), expires_at=float(expires_at),
                )  # fmt: skip
        frontier = sorted(gone)
        seen = set(frontier)
        while frontier:
            inner: list[str] = []
            for chunk in self._chunks(frontier):
                where, params = self._in(chunk)
                for codec, record in self._rows(
                    "SELECT codec, record FROM archived_memories WHERE tenant = ? "
                    f"AND summary_id {where}",
                    [tenant, *params],
                ):
                    inner.extend(
                        str(r[1]) for r in decode_rows(record, codec) if r[12] == "summary"
                    )
                self._run(
                    f"DELETE FROM archived_memories WHERE tenant = ? AND summary_id {where}",
                    [tenant, *params],
                )
            frontier = [i for i in dict.fromkeys(inner) if i not in seen]
            seen.update(frontier)
