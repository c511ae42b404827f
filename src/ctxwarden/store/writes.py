"""Writes the SQL backends share: the statements of one write transaction written once.

Written with SQLite's ``?`` placeholders, as :mod:`ctxwarden.store.reads` is; a backend whose
driver wants another style (psycopg's ``%s``) converts them in :meth:`MemoryWrites._rows` and
:meth:`MemoryWrites._run`. None of these statements has a literal ``?`` or ``%``.

A backend supplies only what differs: how rows read before an update are locked
(:attr:`MemoryWrites._LOCK_ROWS`), how a list of values is matched (:meth:`MemoryWrites._in`:
SQLite binds each value, in chunks; PostgreSQL binds one array), which summaries cite an id (the
JSON functions differ), how an erased memory's tombstone is written, and what must happen before
a memory row is deleted (:meth:`MemoryWrites._before_delete`: SQLite indexes its queued rows for
full-text search, so the FTS delete trigger finds them).
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Sequence
from typing import Any

from ctxwarden.attachments import search_text
from ctxwarden.errors import StoreError
from ctxwarden.store.base import Edit, Edited
from ctxwarden.store.erasures import ErasureWrites, without_sources
from ctxwarden.store.reads import bigram_column
from ctxwarden.store.tombstones import Member

__all__ = [
    "ACCESS_TAU_SECONDS",
    "ACCESS_UPSERT",
    "MemoryWrites",
    "access_bump",
    "merge_plan",
    "without_sources",
]

#: Time constant of the decayed access score ``sum exp(-(now - t_i) / tau)``: a week.
ACCESS_TAU_SECONDS = 7 * 24 * 3600.0

#: The head of the access-stats upsert (migration 8's ``memory_access``), followed by a SELECT
#: or VALUES of (rowid, count, last access, score, score time, tokens) and an ON CONFLICT.
ACCESS_UPSERT = (
    "INSERT INTO memory_access (memory_rowid, access_count, last_accessed_at, access_score, "
    "access_score_at, included_tokens_total)"
)


def access_bump(greatest: str) -> str:
    """The ON CONFLICT of :data:`ACCESS_UPSERT` for one more inclusion (the inserted row is
    ``(rowid, 1, now, 1.0, now, tokens)``): count + 1, the decayed score brought to ``now``
    plus 1, tokens added up. ``greatest`` is the dialect's two-argument maximum."""
    return (
        "ON CONFLICT (memory_rowid) DO UPDATE SET "
        "access_count = memory_access.access_count + 1, "
        "last_accessed_at = excluded.last_accessed_at, "
        # The exponent is kept at -700 or above: PostgreSQL's exp raises an underflow error
        # past about -745 (a gap of ~14 years at a week's tau) where SQLite gives 0.
        f"access_score = memory_access.access_score * exp({greatest}(-700.0, -"
        f"{greatest}(0.0, excluded.access_score_at - coalesce(memory_access.access_score_at, "
        f"excluded.access_score_at)) / {ACCESS_TAU_SECONDS!r})) + 1.0, "
        "access_score_at = excluded.access_score_at, "
        "included_tokens_total = memory_access.included_tokens_total "
        "+ excluded.included_tokens_total"
    )


#: What :func:`merge_plan` reads of the two memories of a semantic merge (from the view
#: ``memory_rows``: the stats of a memory never included read as zero).
MERGE_COLUMNS = (
    "rowid, id, content, latest_content, dup_count, created_at, last_seen_at, access_count, "
    "last_accessed_at, access_score, access_score_at, included_tokens_total"
)
#: The aggregate's new fields, the parameters :func:`merge_plan` gives: the first three and
#: the rowid go to ``memories``, the access stats to ``memory_access`` (:data:`MERGE_ACCESS`).
MERGE_UPDATE = (
    "UPDATE memories SET dup_count = ?, last_seen_at = ?, latest_content = ? WHERE rowid = ?"
)
#: The aggregate's access stats: (rowid, count, last access, score, score time, tokens).
MERGE_ACCESS = (
    f"{ACCESS_UPSERT} VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (memory_rowid) DO UPDATE SET "
    "access_count = excluded.access_count, last_accessed_at = excluded.last_accessed_at, "
    "access_score = excluded.access_score, access_score_at = excluded.access_score_at, "
    "included_tokens_total = excluded.included_tokens_total"
)


def merge_plan(
    source: Sequence[Any], target: Sequence[Any], latest_content: str | None
) -> tuple[Any, ...]:
    """The parameters of :data:`MERGE_UPDATE` folding row ``source`` into row ``target`` (rows
    of :data:`MERGE_COLUMNS`): counts add up, times take the later, ``latest_content`` is the
    caller's when ``source`` was seen last (else the target's stays), and the decayed access
    scores add up at the later of their two times.

    >>> source = (2, "b", "hi", None, 1, 10.0, 30.0, 0, None, 0.0, None, 0)
    >>> target = (1, "a", "hi", None, 2, 5.0, 20.0, 1, 25.0, 1.0, 25.0, 7)
    >>> merge_plan(source, target, "hi!")
    (3, 30.0, 'hi!', 1, 25.0, 1.0, 25.0, 7, 1)
    """
    (_, _, _, _, s_dups, _, s_seen, s_access, s_accessed, s_score, s_at,
     s_tokens) = source  # fmt: skip
    (t_rowid, _, _, t_latest, t_dups, _, t_seen, t_access, t_accessed, t_score, t_at,
     t_tokens) = target  # fmt: skip
    latest = latest_content if s_seen > t_seen else t_latest
    accessed = max((t for t in (s_accessed, t_accessed) if t is not None), default=None)
    score_at = max((t for t in (s_at, t_at) if t is not None), default=None)
    score = 0.0
    for value, at in ((s_score, s_at), (t_score, t_at)):
        if value:
            elapsed = max(0.0, (score_at or 0.0) - (at if at is not None else score_at or 0.0))
            score += float(value) * math.exp(-elapsed / ACCESS_TAU_SECONDS)
    return (
        int(s_dups) + int(t_dups),
        max(s_seen, t_seen),
        latest,
        int(s_access) + int(t_access),
        accessed,
        score,
        score_at,
        int(s_tokens) + int(t_tokens),
        t_rowid,
    )


class MemoryWrites(ErasureWrites):
    """Pins, deletions, compaction's retirements and semantic merges of one write transaction
    (mixed into each backend's writer)."""

    #: Appended to a SELECT (after its ``ORDER BY rowid``) that reads rows the transaction then
    #: updates: PostgreSQL locks them in rowid order, so two writers never deadlock (SQLite's
    #: BEGIN IMMEDIATE already makes the writer the only one).
    _LOCK_ROWS = ""

    def edit(self, edit: Edit, *, edited_at: float, keep: bool) -> Edited | str | None:
        """Replace the text of the memory ``edit.id`` (see :meth:`.Writer.edit`)."""
        # SQLite: the FTS update trigger removes the old text's entry, which must exist.
        self._before_delete()
        rows = self._rows(
            "SELECT rowid, content, content_hash, created_at, role, author, kind, channel, "
            f"attachments, source_ids, metadata FROM memories WHERE tenant = ? AND id = ?"
            f"{self._LOCK_ROWS}",
            (edit.tenant, edit.id),
        )
        if not rows:
            return None
        rowid, content, content_hash, created_at, role, author, kind, channel, stored = rows[0][:9]
        # A stored pack's text as reads show it: what the edit replaces (and its version keeps).
        content = self._shown_text(edit.tenant, content, rows[0][9], rows[0][10])
        attachments = json.dumps(list(edit.attachments)) if edit.attachments else None
        attachment_text = search_text(edit.attachments) or None
        if content == edit.content and stored == attachments:
            return "unchanged"
        version: int | None = None
        if keep:
            last = self._rows(
                "SELECT version, valid_until FROM memory_versions WHERE memory_rowid = ? "
                "ORDER BY version DESC LIMIT 1",
                (rowid,),
            )
            version = int(last[0][0]) + 1 if last else 1
            valid_from = float(last[0][1]) if last else float(created_at)
            self._run(
                "INSERT INTO memory_versions (memory_rowid, version, content, content_hash, "
                "valid_from, valid_until) VALUES (?, ?, ?, ?, ?, ?)",
                (rowid, version, content, content_hash, valid_from, max(valid_from, edited_at)),
            )
        self._run(
            "UPDATE memories SET content = ?, content_hash = ?, near_key = ?, metadata = ?, "
            "attachments = ?, attachment_text = ?, bigram_text = ?, latest_content = NULL "
            "WHERE rowid = ?",
            (
                edit.content,
                edit.content_hash,
                edit.near_key,
                json.dumps(dict(edit.metadata)) if edit.metadata else None,
                attachments,
                attachment_text,
                bigram_column(edit.content, attachment_text),
                rowid,
            ),
        )
        # Counted again by the caller; embedded again as pending (the vector_changes
        # trigger tells the in-memory index).
        self._run("DELETE FROM token_counts WHERE memory_rowid = ?", (rowid,))
        self._run("DELETE FROM memory_vectors WHERE memory_rowid = ?", (rowid,))
        return Edited(
            rowid=int(rowid),
            role=str(role),
            author=author,
            kind=str(kind),
            created_at=float(created_at),
            channel=channel,
            version=version,
        )

    def set_key(self, tenant: str, rowid: int, key: str, *, user: str | None) -> list[str]:
        """Give the memory at ``rowid`` the subject ``key`` and re-link the memories with that
        key (of ``user``, in ``tenant``): each but the newest is superseded by the next newer
        one. The ids superseded now."""
        self._run("UPDATE memories SET fact_key = ? WHERE rowid = ?", (key, rowid))
        return self._relink(tenant, key, user or "")

    def supersede(self, links: Sequence[tuple[int, str, float]]) -> None:
        """Record that each memory at ``rowid`` was superseded by the memory ``id`` at
        ``valid_until`` (free-text change detection, :mod:`ctxwarden.validity`); a memory
        already superseded keeps its first link."""
        if links:
            self._run_many(
                "INSERT INTO supersessions (memory_rowid, superseded_by, valid_until) "
                "VALUES (?, ?, ?) ON CONFLICT (memory_rowid) DO NOTHING",
                list(links),
            )

    def _relink(self, tenant: str, key: str, user: str) -> list[str]:
        """Link the memories with ``key`` of end user ``user`` (``""``: none) into one chain,
        each but the newest superseded by the next; the ids superseded."""
        chain = self._rows(
            "SELECT rowid, id, created_at FROM memories WHERE tenant = ? AND fact_key = ? "
            "AND coalesce(end_user, '') = ? ORDER BY created_at, rowid",
            (tenant, key, user),
        )
        rowids = [int(r[0]) for r in chain]
        for chunk in self._chunks(rowids):
            where, params = self._in(chunk)
            self._run(f"DELETE FROM supersessions WHERE memory_rowid {where}", params)
        links = [
            (int(older[0]), str(newer[1]), float(newer[2]))
            for older, newer in itertools.pairwise(chain)
        ]
        if links:
            self._run_many(
                "INSERT INTO supersessions (memory_rowid, superseded_by, valid_until) "
                "VALUES (?, ?, ?)",
                links,
            )
        return [str(r[1]) for r in chain[:-1]]

    def set_pinned(self, tenant: str, id: str, pinned: bool, *, scope: str | None = None) -> bool:
        """Pin or unpin the memory holding ``id``, visible in ``scope`` (``"user"``,
        ``"tenant"``; None or ``"session"``: its own session); False if there is none."""
        rowid = self._rowid(tenant, id)
        if rowid is None:
            return False
        pin_scope = scope if pinned and scope in ("user", "tenant") else None
        self._run(
            "UPDATE memories SET pinned = ?, pin_scope = ? WHERE rowid = ? AND tenant = ?",
            (bool(pinned), pin_scope, rowid, tenant),
        )
        return True

    def retire(
        self,
        tenant: str,
        ids: Sequence[str],
        *,
        summary_rowid: int,
        deleted_at: float,
        reason: str,
        archive_until: float | None = None,
    ) -> int:
        """Replace the memories ``ids`` by the summary at ``summary_rowid`` (compaction; see
        :meth:`Store.retire`), archived until ``archive_until`` when given; how many were
        retired."""
        self._before_delete()
        found = self._rows(
            "SELECT id, session FROM memories WHERE rowid = ? AND tenant = ?",
            (summary_rowid, tenant),
        )
        if not found:
            raise StoreError(f"retire: no summary with rowid {summary_rowid} in {tenant!r}")
        summary_id = str(found[0][0])
        archive: list[Any] = []  # the originals' rows, kept when archive_until is given
        retired = 0
        summaries: list[str] = []
        moved: dict[str, str] = {}
        retired_members: list[Member] = []  # one tombstone group for the summary
        for chunk in self._chunks(list(dict.fromkeys(ids))):
            where, params = self._in(chunk)
            # Locked in rowid order (as log_context does), so writers never deadlock here.
            rows = self._rows(
                "SELECT rowid, id, content_hash, created_at, last_seen_at, time_start, time_end, "
                f"kind FROM memories WHERE tenant = ? AND id {where} AND rowid <> ? "
                f"ORDER BY rowid{self._LOCK_ROWS}",
                [tenant, *params, summary_rowid],
            )
            if not rows:
                continue
            summaries.extend(r[1] for r in rows if r[7] == "summary")
            at, at_params = self._in([r[0] for r in rows])
            # Which source each alias was folded into, kept with the summary: erasing the alias
            # then takes out that source's lines only (ErasureWrites.erase_id).
            moved.update(
                (str(alias), str(source))
                for alias, source in self._rows(
                    "SELECT a.id, m.id FROM aliases a JOIN memories m ON m.rowid = a.memory_rowid "
                    f"WHERE a.memory_rowid {at}",
                    at_params,
                )
            )
            if archive_until is not None:
                archive.extend(self._archive_read(tenant, [r[0] for r in rows]))
            # Aliases first: deleting the rows would cascade them away.
            self._run(
                f"UPDATE aliases SET memory_rowid = ? WHERE memory_rowid {at}",
                [summary_rowid, *at_params],
            )
            # The id itself resolves through its tombstone (no alias row: that would repeat it).
            retired_members.extend(
                Member(
                    str(id_),
                    str(content_hash),
                    start if start is not None else created,
                    end if end is not None else last_seen,
                )
                for _, id_, content_hash, created, last_seen, start, end, _ in rows
            )
            self._run(f"DELETE FROM memories WHERE rowid {at}", at_params)
            retired += len(rows)
        self._tombstone_write(
            tenant, retired_members, deleted_at=deleted_at, summary_id=summary_id, reason=reason
        )
        if archive:
            self._archive_write(
                tenant, summary_id, archive, session=str(found[0][1]),
                archived_at=deleted_at, expires_at=float(archive_until or deleted_at),
            )  # fmt: skip
        for chunk in self._chunks(summaries):
            # Summaries of summaries: the tombstones that named a retired summary now name
            # this one (tombstone_groups_summary: one entry per group, not per id).
            where, params = self._in(chunk)
            self._run(
                "UPDATE tombstone_groups SET summary_id = ? WHERE tenant = ? "
                f"AND summary_id {where}",
                [summary_id, tenant, *params],
            )
        if moved:
            self._note_alias_sources(summary_rowid, moved)
        return retired

    def merge(
        self,
        tenant: str,
        id: str,
        *,
        into: str,
        merged_at: float,
        status: str,
        latest_content: str | None,
    ) -> bool:
        """Fold memory ``id`` into memory ``into`` (see :meth:`Store.merge`): the aggregate's
        counts and access stats add up, ``id`` and its aliases become aliases of ``into``, the
        row of ``id`` goes. False (nothing written) when either is missing or they are one."""
        if id == into:
            return False
        self._before_delete()
        # The memory rows locked first (PostgreSQL cannot lock through the view's outer join;
        # log_context takes a key-share lock on them, so the stats read next stay put).
        locked = self._rows(
            "SELECT rowid FROM memories WHERE tenant = ? AND id IN (?, ?) "
            f"ORDER BY rowid{self._LOCK_ROWS}",
            (tenant, id, into),
        )
        if len(locked) < 2:
            return False
        rows = {
            r[1]: r
            for r in self._rows(
                f"SELECT {MERGE_COLUMNS} FROM memory_rows WHERE tenant = ? AND id IN (?, ?)",
                (tenant, id, into),
            )
        }
        if id not in rows or into not in rows:
            return False
        plan = merge_plan(rows[id], rows[into], latest_content)
        self._run(MERGE_UPDATE, (*plan[:3], plan[-1]))
        source_rowid, target_rowid = rows[id][0], rows[into][0]
        count, accessed, score, _, tokens = rows[id][7:12]
        if count or accessed is not None or score or tokens:  # else the aggregate's stay
            self._run(MERGE_ACCESS, (target_rowid, *plan[3:8]))
        # Aliases first: deleting the row would cascade them away.
        self._run(
            "UPDATE aliases SET memory_rowid = ? WHERE memory_rowid = ?",
            (target_rowid, source_rowid),
        )
        # Token counts, vectors, access stats (and PostgreSQL's exact heads) go by ON DELETE
        # CASCADE; the FTS entry by SQLite's trigger (PostgreSQL's tsvector lives in the row).
        self._run("DELETE FROM memories WHERE rowid = ?", (source_rowid,))
        self._run(
            "INSERT INTO aliases (tenant, id, memory_rowid, status, created_at) "
            "VALUES (?, ?, ?, ?, ?)",
            (tenant, id, target_rowid, status, merged_at),
        )
        return True
