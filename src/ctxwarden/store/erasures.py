"""Erasure's writes, shared by the SQL backends (the base of
:class:`~ctxwarden.store.writes.MemoryWrites`): deleting memories, sessions and tenants with
content-free tombstones, rewriting the summaries built from erased memories without the lines
that cite them, erasing ids compacted into a summary, and taking a session's folded records out
of other sessions' aggregates. Each erasure returns an
:class:`~ctxwarden.store.base.ErasureReceipt`.

Written with SQLite's ``?`` placeholders, as :mod:`ctxwarden.store.writes` is; the primitives
(:meth:`~ctxwarden.store.statements.StatementWrites._rows` and the rest) are each backend writer's.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from collections.abc import Collection, Sequence
from typing import Any

from ctxwarden.pack import PACK_FORMAT, PACK_FORMAT_KEY, unpack, without_lines
from ctxwarden.store.archive import ArchiveWrites
from ctxwarden.store.base import ErasureReceipt
from ctxwarden.store.reads import bigram_column
from ctxwarden.store.tombstones import Member, TombstoneWrites
from ctxwarden.summary import line_sources

__all__ = ["ErasureWrites", "without_sources"]

_HEADER = re.compile(r"^Summary of \d+ messages?")


def _metadata(value: Any) -> dict[str, Any]:
    """A memory's metadata column as a dict (``{}`` for none or unreadable)."""
    if isinstance(value, dict):
        return dict(value)
    try:
        loaded = json.loads(value) if value else {}
    except ValueError:
        return {}
    return loaded if isinstance(loaded, dict) else {}


def without_sources(content: str, erased: Collection[str], remaining: int) -> str | None:
    r"""A rendered summary (:meth:`ctxwarden.summary.Summary.render`) without the text of the
    ``erased`` sources: only item lines that cite sources, none of them erased, stay (an
    uncited line, the entities line included, cannot be told apart from an erased source's
    text), with their section titles; the header counts ``remaining`` sources. None when no
    item is left (the summary goes).

    >>> text = "Summary of 2 messages\nEntities: Ana\nEvents:\n- [m1] a\n- [m2] b"
    >>> print(without_sources(text, {"m2"}, 1))
    Summary of 1 message
    Events:
    - [m1] a
    >>> without_sources("free text about m1", {"m1"}, 0) is None
    True
    """
    lines = content.split("\n")
    out: list[str] = []
    title: str | None = None
    kept = 0
    for line in lines:
        if line.startswith("- "):
            cited = line_sources(line[2:])
            if cited and not any(c in erased for c in cited):
                if title is not None:
                    out.append(title)
                    title = None
                out.append(line)
                kept += 1
        elif line.endswith(":") and line[:-1].replace(" ", "").isalpha():
            title = line
        # anything else (the header, entities, free text) is dropped
    if not kept:
        return None
    header = _HEADER.match(lines[0])
    if header is not None:
        rest = lines[0][header.end() :]
        out.insert(0, f"Summary of {remaining} message{'' if remaining == 1 else 's'}{rest}")
    return "\n".join(out)


class _SessionUnfold(ArchiveWrites, TombstoneWrites):
    """Erasing a session from the aggregates of other sessions its records were folded into."""

    def _unfold_session(
        self,
        tenant: str,
        session: str,
        receipt: ErasureReceipt,
        *,
        deleted_at: float,
        reason: str,
    ) -> ErasureReceipt:
        """Take the records of ``session`` out of the aggregates of other sessions they were
        folded into: their aliases go (tombstoned), the aggregate's count drops, and its latest
        variant (which may be this session's text) is cleared, with the token counts cached
        for renderings of it."""
        folded = self._rows(
            "SELECT a.id, a.memory_rowid, m.id FROM aliases a JOIN memories m "
            "ON m.rowid = a.memory_rowid WHERE a.tenant = ? AND a.session = ? "
            "ORDER BY a.memory_rowid, a.id",
            (tenant, session),
        )
        if not folded:
            return receipt
        per_row: dict[int, int] = {}
        for _, rowid, _ in folded:
            per_row[int(rowid)] = per_row.get(int(rowid), 0) + 1
        hashes: dict[int, tuple[str, float]] = {}
        for chunk in self._chunks(sorted(per_row)):
            where, params = self._in(chunk)
            hashes.update(
                (int(r[0]), (str(r[1]), float(r[2])))
                for r in self._rows(
                    f"SELECT rowid, content_hash, created_at FROM memories WHERE rowid {where}",
                    params,
                )
            )
        self._tombstone_write(
            tenant,
            [
                Member(str(alias), hashes[int(r)][0], hashes[int(r)][1], hashes[int(r)][1])
                for alias, r, _ in folded
            ],
            deleted_at=deleted_at,
            summary_id=None,
            reason=reason,
        )
        self._run_many(
            "DELETE FROM aliases WHERE tenant = ? AND id = ?", [(tenant, a) for a, _, _ in folded]
        )
        self._run_many(
            "UPDATE memories SET dup_count = CASE WHEN dup_count > ? THEN dup_count - ? "
            "ELSE 1 END, latest_content = NULL WHERE rowid = ?",
            [(n, n, rowid) for rowid, n in per_row.items()],
        )
        self._run_many("DELETE FROM token_counts WHERE memory_rowid = ?", [(r,) for r in per_row])
        touched = list(dict.fromkeys(str(m) for _, _, m in folded))
        return dataclasses.replace(
            receipt,
            ids=tuple(dict.fromkeys([*receipt.ids, *(a for a, _, _ in folded)])),
            aggregates_touched=tuple(dict.fromkeys([*receipt.aggregates_touched, *touched])),
        )


class ErasureWrites(_SessionUnfold):
    """The erasures of one write transaction (mixed into each backend's writer)."""

    def _summaries_citing(self, tenant: str, ids: Sequence[str]) -> list[int]:
        """The rowids of ``tenant``'s summaries whose ``source_ids`` name any of ``ids``."""
        raise NotImplementedError

    def _tombstone_erased(
        self,
        tenant: str,
        rowids: Sequence[int],
        summaries: Collection[int],
        *,
        deleted_at: float,
        reason: str,
    ) -> None:
        """Write (or overwrite, every column) the tombstones of the memories at ``rowids`` (at
        most :attr:`_CHUNK`), about to be erased: no summary, their hash and time range,
        ``reason`` (with a note for those in ``summaries``, erased as built from erased
        memories)."""
        noted = [r for r in rowids if r in summaries]
        plain = [r for r in rowids if r not in summaries]
        for group, why in ((plain, reason), (noted, f"{reason} (summary of erased memories)")):
            if not group:
                continue
            where, params = self._in(group)
            rows = self._rows(
                "SELECT id, content_hash, time_start, time_end FROM memories WHERE tenant = ? "
                f"AND rowid {where}",
                [tenant, *params],
            )
            self._tombstone_write(
                tenant,
                [Member(str(r[0]), str(r[1]), r[2], r[3]) for r in rows],
                deleted_at=deleted_at,
                summary_id=None,
                reason=why,
            )

    def _before_delete(self) -> None:
        """Called before memory rows are deleted (nothing to do unless a backend says)."""

    def _relink(self, tenant: str, key: str, user: str) -> list[str]:
        """Re-link the keyed facts ``key`` of ``user`` after some were erased (the writes
        class that holds the fact keys provides it)."""
        raise NotImplementedError

    def _rowid(self, tenant: str, id: str) -> int | None:
        """The row that holds ``id`` (its own or as an alias), or None."""
        rows = self._rows(
            "SELECT rowid FROM memories WHERE tenant = ? AND id = ? UNION ALL "
            "SELECT memory_rowid FROM aliases WHERE tenant = ? AND id = ? LIMIT 1",
            (tenant, id, tenant, id),
        )
        return int(rows[0][0]) if rows else None

    def _note_alias_sources(self, summary_rowid: int, moved: dict[str, str]) -> None:
        """Record in the summary's metadata (``alias_sources``: alias id -> source id) which
        source each alias compaction moved onto it was folded into."""
        rows = self._rows("SELECT metadata FROM memories WHERE rowid = ?", (summary_rowid,))
        metadata = _metadata(rows[0][0]) if rows else {}
        known = metadata.get("alias_sources")
        metadata["alias_sources"] = {**(known if isinstance(known, dict) else {}), **moved}
        self._run(
            "UPDATE memories SET metadata = ? WHERE rowid = ?",
            (json.dumps(metadata), summary_rowid),
        )

    def _alias_source(self, tenant: str, id: str, rowid: int) -> str | None:
        """When ``id`` is an alias compaction moved onto the summary at ``rowid``: the source it
        was folded into (recorded by :meth:`_note_alias_sources`); else None."""
        rows = self._rows(
            "SELECT id, kind, metadata FROM memories WHERE rowid = ? AND tenant = ?",
            (rowid, tenant),
        )
        if not rows or rows[0][0] == id or rows[0][1] != "summary":
            return None
        sources = _metadata(rows[0][2]).get("alias_sources")
        source = sources.get(id) if isinstance(sources, dict) else None
        return str(source) if source is not None else None

    def delete(self, tenant: str, id: str, *, deleted_at: float, reason: str) -> bool:
        """Erase the memory holding ``id`` (see :meth:`erase_id`); False if there is none."""
        return self.erase_id(tenant, id, deleted_at=deleted_at, reason=reason) is not None

    def erase_id(
        self, tenant: str, id: str, *, deleted_at: float, reason: str
    ) -> ErasureReceipt | None:
        """Erase ``id``: the memory holding it (its own id or an alias), or, when it was
        compacted, its lines in the summary its tombstone names; None if it is none of these."""
        rowid = self._rowid(tenant, id)
        if rowid is not None:
            source = self._alias_source(tenant, id, rowid)
            if source is None:
                return self.erase_receipt(tenant, [rowid], deleted_at=deleted_at, reason=reason)
            # A repeat of a memory that compaction moved onto a summary: its text is that
            # source's, so the source goes as an erased compacted id does (below).
            id = source
        found = self._tombstone_find(tenant, [id]).get(id)
        if found is None or found.summary_id is None:
            return None
        # Compacted: the id itself goes (out of its summary's tombstone group, into one that
        # names no summary), and its text with the summary lines that cite it; so do the
        # repeats folded into it, which compaction moved onto the summary (their text is its).
        holder = self._rows(
            "SELECT rowid, source_ids, metadata FROM memories WHERE tenant = ? AND id = ?",
            (tenant, found.summary_id),
        )
        repeats = self._repeats_of(tenant, id, holder[0] if holder else None)
        self._run_many(
            "DELETE FROM aliases WHERE tenant = ? AND id = ?", [(tenant, a) for a in repeats]
        )
        member = found.member
        self._tombstone_write(
            tenant,
            [member, *(member._replace(id=alias) for alias in repeats)],
            deleted_at=deleted_at,
            summary_id=None,
            reason=reason,
        )
        if holder and id not in json.loads(holder[0][1] or "[]"):
            # Compacted into a summary that was compacted in turn: which of the summary's lines
            # came through the erased one is unknown, so the summary goes whole.
            return self.erase_receipt(
                tenant, [int(holder[0][0])], deleted_at=deleted_at, reason=reason,
                ids=[id, *repeats],
            )  # fmt: skip
        return self.erase_receipt(
            tenant, [], deleted_at=deleted_at, reason=reason, ids=[id, *repeats]
        )

    def _repeats_of(self, tenant: str, source: str, holder: Sequence[Any] | None) -> list[str]:
        """The aliases on the summary ``holder`` (rowid, source_ids, metadata) that were folded
        into ``source`` before compaction moved them there."""
        if holder is None:
            return []
        sources = _metadata(holder[2]).get("alias_sources")
        if not isinstance(sources, dict):
            return []
        named = sorted(alias for alias, of in sources.items() if of == source)
        out: list[str] = []
        for chunk in self._chunks(named):
            where, params = self._in(chunk)
            out.extend(
                str(r[0])
                for r in self._rows(
                    f"SELECT id FROM aliases WHERE tenant = ? AND memory_rowid = ? AND id {where} "
                    "ORDER BY id",
                    [tenant, int(holder[0]), *params],
                )
            )
        return out

    def erase(
        self, tenant: str, rowids: Sequence[int], *, deleted_at: float, reason: str
    ) -> list[int]:
        """Delete these memories (see :meth:`erase_receipt`); the rowids removed."""
        receipt = self.erase_receipt(tenant, rowids, deleted_at=deleted_at, reason=reason)
        return list(receipt.rowids)

    def erase_receipt(
        self,
        tenant: str,
        rowids: Sequence[int],
        *,
        deleted_at: float,
        reason: str,
        ids: Sequence[str] = (),
    ) -> ErasureReceipt:
        """Delete these memories (and erase ``ids``, compacted ones, too), each leaving a
        content-free tombstone, and every summary built from them (transitively) loses the
        lines that cite them: rewritten, or removed when no cited line is left."""
        self._before_delete()
        doomed = set(rowids)
        erased_ids = [*ids, *self._ids_of(tenant, sorted(doomed))]
        aggregates = [
            r[0]
            for chunk in self._chunks(sorted(doomed))
            for r in self._rows(
                f"SELECT id FROM memories WHERE tenant = ? AND rowid {self._in(chunk)[0]} "
                "AND dup_count > 1 ORDER BY rowid",
                [tenant, *self._in(chunk)[1]],
            )
        ]
        removed: set[int] = set()
        rewritten: dict[int, str] = {}
        gone = set(erased_ids)  # ids whose text must leave every summary
        frontier = list(gone)
        citing: set[str] = set()  # summaries whose archived originals may hold erased ids
        while frontier:
            cited = self._summaries_citing(tenant, frontier)
            citing.update(self._ids_of(tenant, cited))
            found = [r for r in cited if r not in doomed and r not in removed]
            frontier = []
            for rowid in found:
                row = self._rows(
                    "SELECT id, content, source_ids, metadata FROM memories WHERE rowid = ?",
                    (rowid,),
                )[0]
                sources = [str(s) for s in json.loads(row[2] or "[]")]
                shown: str | None = None
                if _metadata(row[3]).get(PACK_FORMAT_KEY) == PACK_FORMAT:
                    # A stored pack: line n is source n's (ctxwarden.pack); its hash is of
                    # the text as shown, times included, as compaction's is.
                    content, kept_sources = without_lines(str(row[1]), sources, gone)
                    if content is not None:
                        times = self._source_times(tenant, kept_sources)
                        shown = unpack(content, kept_sources, times)
                else:
                    kept_sources = [s for s in sources if s not in gone]
                    content = without_sources(str(row[1]), gone, len(kept_sources))
                if content is None or not kept_sources:
                    removed.add(rowid)
                    rewritten.pop(rowid, None)
                    summary_ids = self._ids_of(tenant, [rowid])
                    gone.update(summary_ids)
                    frontier.extend(summary_ids)
                elif content != row[1] or kept_sources != sources:
                    self._rewrite_summary(rowid, content, kept_sources, shown=shown)
                    rewritten[rowid] = str(row[0])
                    # A summary of this summary may quote the dropped lines: its lines citing
                    # this one go too (the id stays: the summary does).
                    gone.add(str(row[0]))
                    frontier.append(str(row[0]))
        everything = doomed | removed
        ordered = sorted(everything)
        vectors = 0
        removed_ids = self._ids_of(tenant, sorted(removed))
        summaries_removed = [
            r[0]
            for chunk in self._chunks(ordered)
            for r in self._rows(
                f"SELECT id FROM memories WHERE tenant = ? AND rowid {self._in(chunk)[0]} "
                "AND kind = 'summary' ORDER BY rowid",
                [tenant, *self._in(chunk)[1]],
            )
        ]
        keyed: set[tuple[str, str]] = set()
        for chunk in self._chunks(ordered):
            self._tombstone_erased(tenant, chunk, removed, deleted_at=deleted_at, reason=reason)
            where, params = self._in(chunk)
            keyed.update(
                (str(k), str(u))
                for k, u in self._rows(
                    "SELECT fact_key, coalesce(end_user, '') FROM memories WHERE tenant = ? "
                    f"AND fact_key IS NOT NULL AND rowid {where}",
                    [tenant, *params],
                )
            )
            vectors += int(
                self._rows(
                    f"SELECT count(*) FROM memory_vectors WHERE memory_rowid {where}", params
                )[0][0]
            )
            # Aliases, token counts, vectors and access stats go by ON DELETE CASCADE; SQLite's
            # FTS entries by its trigger (PostgreSQL's tsvector lives in the row).
            self._run(f"DELETE FROM memories WHERE tenant = ? AND rowid {where}", [tenant, *params])
        for key, user in sorted(keyed):
            self._relink(tenant, key, user)  # an erased value no longer supersedes anything
        # The archived originals of what was erased go too: out of the archives of the
        # summaries that cited them, and whole with an erased summary.
        self._erase_archived(tenant, citing, [*erased_ids, *removed_ids, *summaries_removed])
        vectors += len(rewritten)  # a rewritten summary's vector (of its old text) went too
        return ErasureReceipt(
            ids=tuple(dict.fromkeys([*erased_ids, *removed_ids])),
            summaries_rewritten=tuple(rewritten[r] for r in sorted(rewritten)),
            summaries_removed=tuple(summaries_removed),
            aggregates_touched=tuple(aggregates),
            vectors=vectors,
            rowids=tuple(ordered),
        )

    def _shown_text(self, tenant: str, content: str, source_ids: Any, metadata: Any) -> str:
        """A row's ``content`` as reads show it: a stored pack (:mod:`ctxwarden.pack`)
        rendered with its ids and times, any other text as it is."""
        if _metadata(metadata).get(PACK_FORMAT_KEY) != PACK_FORMAT:
            return content
        sources = [str(s) for s in json.loads(source_ids or "[]")]
        return unpack(content, sources, self._source_times(tenant, sources))

    def _source_times(self, tenant: str, ids: Sequence[str]) -> dict[str, float]:
        """The creation time of each of ``ids`` (compacted), from its tombstone."""
        return {
            i: f.member.time_start
            for i, f in self._tombstone_find(tenant, ids).items()
            if f.member.time_start is not None
        }

    def _rewrite_summary(
        self, rowid: int, content: str, sources: Sequence[str], *, shown: str | None = None
    ) -> None:
        """Replace a summary's text and sources; what was derived from its old text (token
        counts, its vector) goes, to be computed again from the new. Its search bigrams are
        those of the new text: the erased text's must leave the index too. Its hash is of
        ``shown`` when given (a stored pack's text as reads show it)."""
        attached = self._rows("SELECT attachment_text FROM memories WHERE rowid = ?", (rowid,))
        self._run(
            "UPDATE memories SET content = ?, latest_content = NULL, source_ids = ?, "
            "content_hash = ?, bigram_text = ? WHERE rowid = ?",
            (
                content,
                json.dumps(list(sources)),
                "summary-" + hashlib.sha256((shown or content).encode()).hexdigest()[:32],
                bigram_column(content, attached[0][0] if attached else None),
                rowid,
            ),
        )
        self._run("DELETE FROM token_counts WHERE memory_rowid = ?", (rowid,))
        self._run("DELETE FROM memory_vectors WHERE memory_rowid = ?", (rowid,))

    def _ids_of(self, tenant: str, rowids: Sequence[int]) -> list[str]:
        """Every id that lives in these rows: their own and their aliases."""
        out: list[str] = []
        for chunk in self._chunks(rowids):
            where, params = self._in(chunk)
            out.extend(
                r[0]
                for r in self._rows(
                    f"SELECT id FROM memories WHERE tenant = ? AND rowid {where} UNION ALL "
                    f"SELECT id FROM aliases WHERE tenant = ? AND memory_rowid {where}",
                    [tenant, *params, tenant, *params],
                )
            )
        return out

    def erase_session(
        self, tenant: str, session: str, *, deleted_at: float, reason: str
    ) -> ErasureReceipt:
        """Erase every memory of ``session`` and its inclusion logs, with a receipt."""
        rowids = [
            int(r[0])
            for r in self._rows(
                "SELECT rowid FROM memories WHERE tenant = ? AND session = ?", (tenant, session)
            )
        ]
        receipt = self.erase_receipt(tenant, rowids, deleted_at=deleted_at, reason=reason)
        receipt = self._unfold_session(
            tenant, session, receipt, deleted_at=deleted_at, reason=reason
        )
        self._run(
            "DELETE FROM archived_memories WHERE tenant = ? AND session = ?", (tenant, session)
        )
        self._run("DELETE FROM contexts WHERE tenant = ? AND session = ?", (tenant, session))
        return receipt

    def delete_session(
        self, tenant: str, session: str, *, deleted_at: float, reason: str
    ) -> list[int]:
        """Erase every memory of ``session`` and its inclusion logs; the rowids removed."""
        receipt = self.erase_session(tenant, session, deleted_at=deleted_at, reason=reason)
        return list(receipt.rowids)

    def erase_tenant(self, tenant: str, *, deleted_at: float, reason: str) -> ErasureReceipt:
        """Erase every memory of ``tenant`` and its inclusion logs, and revoke its API keys,
        with a receipt."""
        rowids = [
            int(r[0]) for r in self._rows("SELECT rowid FROM memories WHERE tenant = ?", (tenant,))
        ]
        receipt = self.erase_receipt(tenant, rowids, deleted_at=deleted_at, reason=reason)
        self._run("DELETE FROM archived_memories WHERE tenant = ?", (tenant,))
        self._run("DELETE FROM contexts WHERE tenant = ?", (tenant,))
        # A deleted tenant's API keys must stop working in the same transaction.
        self._run(
            "UPDATE api_keys SET revoked_at = ? WHERE tenant = ? AND revoked_at IS NULL",
            (deleted_at, tenant),
        )
        return receipt

    def delete_tenant(self, tenant: str, *, deleted_at: float, reason: str) -> list[int]:
        """Erase every memory of ``tenant`` and its inclusion logs, and revoke its API keys;
        the rowids removed."""
        receipt = self.erase_tenant(tenant, deleted_at=deleted_at, reason=reason)
        return list(receipt.rowids)
