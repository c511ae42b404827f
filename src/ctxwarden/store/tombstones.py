"""Tombstones kept as groups (SQLite migration 21, PostgreSQL migration 19,
``tombstone_groups``), shared by the SQL backends.

A compacted memory used to leave a row of its own in ``tombstones``, ~95 value bytes, most of
them (tenant, summary, deletion time, reason) the same for every id one summary retired. Now
the ids retired together (by one summary, or by one erasure) are one row of
``tombstone_groups``: the shared values once, and ``record``: the members, each
``[id, content_hash]`` plus its time range when it has one (``[.., start]`` when it ended when it
started, ``[.., start, end]`` otherwise), sorted by id, as one zlib-compressed JSON array (the
archive's codec, :mod:`ctxwarden.store.archive`; ids of one conversation share their prefixes
and compress well). ``time_start`` / ``time_end`` of the group are the members' earliest start
and latest end (history reads them without decoding).

Finding the tombstone of one id needs an index on ids: ``tombstone_keys`` holds, per member,
(``key``, ``grp``): ``key`` is a 32-bit hash of (tenant, id) (:func:`id_key`), the group's rowid
beside it, ~12 bytes a member in SQLite against ~30 for a (tenant, id) key. The hash only narrows
the search: a lookup decodes the groups the keys name and keeps the members whose id (and
group tenant) match, so a collision costs a decoded group, never a wrong answer.

Every id has at most one tombstone per tenant: writing one first takes the id out of the group
that held it (:meth:`TombstoneWrites._tombstone_discard`: the group is rewritten without it, or
deleted when it was the last), so erasing one compacted id leaves the other members of its
group as they were. A group holds at most :data:`GROUP_LIMIT` members, so such a rewrite stays
small whatever the erasure or the migration that made the group.

Written with SQLite's ``?`` placeholders, as :mod:`ctxwarden.store.writes` is.

>>> members = [Member("m2", "ab", 1.0, 1.0), Member("m1", "cd", None, None)]
>>> decode_members(encode_members(members), CODEC) == sorted(members, key=lambda m: m.id)
True
"""

from __future__ import annotations

import hashlib
import json
import zlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from ctxwarden.errors import StoreError
from ctxwarden.store.base import Tombstone
from ctxwarden.store.statements import StatementWrites

__all__ = [
    "CODEC",
    "GROUP_LIMIT",
    "Found",
    "Member",
    "TombstoneWrites",
    "decode_members",
    "encode_members",
    "find_tombstones",
    "id_key",
    "tombstones_of",
]

#: How ``tombstone_groups.record`` is compressed (as ``archived_memories.record`` is).
CODEC = "zlib"

#: Members per group at most. Taking one id out of a group rewrites the group, so this bounds
#: that write (an erasure of many memories or the migration of old per-id rows makes groups of
#: any size otherwise); compaction's clusters stay far below it.
GROUP_LIMIT = 512

#: Keys per ``IN`` list (SQLite binds each value).
_CHUNK = 400


class Member(NamedTuple):
    """One id of a group: its content hash and time range (None when it had none)."""

    id: str
    content_hash: str
    time_start: float | None
    time_end: float | None


@dataclass(frozen=True, slots=True)
class Found:
    """A member with the group that holds it."""

    grp: int
    tenant: str
    summary_id: str | None
    deleted_at: float
    reason: str
    member: Member

    def tombstone(self) -> Tombstone:
        """As the :class:`~ctxwarden.store.base.Tombstone` the store returns."""
        m = self.member
        return Tombstone(
            tenant=self.tenant,
            id=m.id,
            deleted_at=self.deleted_at,
            summary_id=self.summary_id,
            content_hash=m.content_hash,
            time_range=None
            if m.time_start is None
            else (m.time_start, m.time_end if m.time_end is not None else m.time_start),
            reason=self.reason,
        )


def id_key(tenant: str, id: str) -> int:
    """The 32-bit signed key of (``tenant``, ``id``) in ``tombstone_keys`` (BLAKE2b: stable
    across processes and versions, unlike Python's ``hash``).

    >>> id_key("t", "a") == id_key("t", "a") != id_key("u", "a")
    True
    """
    digest = hashlib.blake2b(
        f"{tenant}\x00{id}".encode("utf-8", "surrogatepass"), digest_size=4
    ).digest()
    return int.from_bytes(digest, "big", signed=True)


def encode_members(members: Iterable[Member]) -> bytes:
    """Members as compressed JSON, sorted by id (code points)."""
    rows: list[list[Any]] = []
    for m in sorted(members, key=lambda m: m.id):
        row: list[Any] = [m.id, m.content_hash]
        if m.time_start is not None:
            row.append(m.time_start)
            if m.time_end != m.time_start:
                row.append(m.time_end)
        rows.append(row)
    text = json.dumps(rows, separators=(",", ":"), ensure_ascii=False)
    return zlib.compress(text.encode("utf-8", "surrogatepass"), 9)


def decode_members(blob: bytes | memoryview, codec: str) -> list[Member]:
    """The members :func:`encode_members` compressed; :class:`StoreError` for an unknown
    codec."""
    if codec != CODEC:
        raise StoreError(f"tombstone_groups: unknown codec {codec!r}: upgrade ctxwarden")
    rows = json.loads(zlib.decompress(bytes(blob)).decode("utf-8", "surrogatepass"))
    out = []
    for row in rows:
        start = row[2] if len(row) > 2 else None
        end = row[3] if len(row) > 3 else start
        out.append(Member(str(row[0]), str(row[1]), start, end))
    return out


def time_span(members: Sequence[Member]) -> tuple[float | None, float | None]:
    """A group's ``time_start`` / ``time_end``: its members' earliest start, latest end."""
    starts = [m.time_start for m in members if m.time_start is not None]
    ends = [m.time_end for m in members if m.time_end is not None]
    return (min(starts) if starts else None, max(ends) if ends else None)


#: The columns :func:`find_tombstones` and :func:`tombstones_of` read, in order.
GROUP_COLUMNS = "grp, tenant, summary_id, deleted_at, reason, codec, record"


def _found(rows: Iterable[Sequence[Any]]) -> Iterable[Found]:
    for grp, tenant, summary_id, deleted_at, reason, codec, record in rows:
        for member in decode_members(record, codec):
            yield Found(int(grp), str(tenant), summary_id, float(deleted_at), str(reason), member)


def find_tombstones(
    read: Callable[[str, Sequence[Any]], list[Any]],
    tenant: str,
    ids: Iterable[str],
    *,
    lock: str = "",
) -> dict[str, Found]:
    """The tombstones of ``ids`` in ``tenant`` (ids without one left out), through
    ``tombstone_keys``; ``read`` runs a statement with ``?`` placeholders. ``lock`` ends the
    groups' SELECT (a writer's ``FOR UPDATE``)."""
    wanted = set(ids)
    keys = sorted({id_key(tenant, i) for i in wanted})
    groups: set[int] = set()
    for start in range(0, len(keys), _CHUNK):
        chunk = keys[start : start + _CHUNK]
        marks = ",".join("?" * len(chunk))
        groups.update(
            int(r[0]) for r in read(f"SELECT grp FROM tombstone_keys WHERE key IN ({marks})", chunk)
        )
    out: dict[str, Found] = {}
    ordered = sorted(groups)
    for start in range(0, len(ordered), _CHUNK):
        chunk = ordered[start : start + _CHUNK]
        marks = ",".join("?" * len(chunk))
        rows = read(
            f"SELECT {GROUP_COLUMNS} FROM tombstone_groups WHERE tenant = ? AND grp IN ({marks}) "
            f"ORDER BY grp{lock}",
            [tenant, *chunk],
        )
        out.update((f.member.id, f) for f in _found(rows) if f.member.id in wanted)
    return out


def tombstones_of(rows: Iterable[Sequence[Any]]) -> list[Found]:
    """Every member of the groups ``rows`` (:data:`GROUP_COLUMNS`)."""
    return list(_found(rows))


class TombstoneWrites(StatementWrites):
    """Writing and rewriting tombstone groups (a base of the backends' writers)."""

    #: Ends a SELECT of rows about to be rewritten (PostgreSQL's writer: ``FOR UPDATE``).
    _LOCK_ROWS = ""

    def _tombstone_find(self, tenant: str, ids: Iterable[str]) -> dict[str, Found]:
        """:func:`find_tombstones` in this transaction, the groups locked."""
        return find_tombstones(self._rows, tenant, ids, lock=self._LOCK_ROWS)

    def _resolve_retired(self, tenant: str, ids: Iterable[str]) -> dict[str, str]:
        """Of ``ids``, those compacted into a summary that is stored: id -> summary id (a
        re-ingested compacted id is then ``known``, not new)."""
        named = {
            i: f.summary_id
            for i, f in find_tombstones(self._rows, tenant, ids).items()
            if f.summary_id is not None
        }
        stored: set[str] = set()
        for chunk in self._chunks(sorted(set(named.values()))):
            where, params = self._in(chunk)
            stored.update(
                str(r[0])
                for r in self._rows(
                    f"SELECT id FROM memories WHERE tenant = ? AND id {where}", [tenant, *params]
                )
            )
        return {i: s for i, s in named.items() if s in stored}

    def _tombstone_write(
        self,
        tenant: str,
        members: Iterable[Member],
        *,
        deleted_at: float,
        summary_id: str | None,
        reason: str,
    ) -> None:
        """Tombstone ``members`` (the last of one id wins): each id leaves the group that held
        it, then they are written as groups of at most :data:`GROUP_LIMIT`."""
        unique = list({m.id: m for m in members}.values())
        if not unique:
            return
        self._tombstone_discard(tenant, [m.id for m in unique])
        unique.sort(key=lambda m: m.id)
        for start in range(0, len(unique), GROUP_LIMIT):
            self._group_insert(
                tenant, unique[start : start + GROUP_LIMIT], deleted_at=deleted_at,
                summary_id=summary_id, reason=reason,
            )  # fmt: skip

    def _group_insert(
        self,
        tenant: str,
        members: Sequence[Member],
        *,
        deleted_at: float,
        summary_id: str | None,
        reason: str,
    ) -> None:
        first, last = time_span(members)
        rows = self._rows(
            "INSERT INTO tombstone_groups (tenant, summary_id, deleted_at, reason, time_start, "
            "time_end, members, codec, record) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) RETURNING grp",
            (tenant, summary_id, deleted_at, reason, first, last, len(members), CODEC,
             encode_members(members)),
        )  # fmt: skip
        grp = int(rows[0][0])
        keys = sorted({id_key(tenant, m.id) for m in members})
        self._run_many(
            "INSERT INTO tombstone_keys (key, grp) VALUES (?, ?)", [(k, grp) for k in keys]
        )

    def _tombstone_discard(self, tenant: str, ids: Sequence[str]) -> dict[str, Found]:
        """Take ``ids`` out of their groups (each rewritten without them, or deleted when
        none is left) with their keys; what they were."""
        found = self._tombstone_find(tenant, ids)
        by_group: dict[int, list[Found]] = {}
        for f in found.values():
            by_group.setdefault(f.grp, []).append(f)
        for grp in sorted(by_group):
            rows = self._rows("SELECT codec, record FROM tombstone_groups WHERE grp = ?", (grp,))
            gone = {f.member.id for f in by_group[grp]}
            kept = [m for m in decode_members(rows[0][1], rows[0][0]) if m.id not in gone]
            still = {id_key(tenant, m.id) for m in kept}
            dropped = sorted({id_key(tenant, i) for i in gone} - still)
            self._run_many(
                "DELETE FROM tombstone_keys WHERE key = ? AND grp = ?", [(k, grp) for k in dropped]
            )
            if not kept:
                self._run("DELETE FROM tombstone_groups WHERE grp = ?", (grp,))
                continue
            first, last = time_span(kept)
            self._run(
                "UPDATE tombstone_groups SET time_start = ?, time_end = ?, members = ?, "
                "codec = ?, record = ? WHERE grp = ?",
                (first, last, len(kept), CODEC, encode_members(kept), grp),
            )
        return found
