"""Reads (and the insert row) the SQL backends share: the same SQL but for the placeholders.

Written with SQLite's ``?`` placeholders; a backend whose driver wants another style (psycopg's
``%s``) converts them in :meth:`MemoryReads._read`. None of these statements has a literal ``?``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Mapping, Sequence
from types import MappingProxyType
from typing import Any

from ctxwarden.attachments import search_text
from ctxwarden.errors import NotFound
from ctxwarden.scope import ReadScope
from ctxwarden.segment import bigram_text
from ctxwarden.store.base import ApiKey, ContextLog, Link, NewMemory, Tombstone, Version
from ctxwarden.store.tombstones import GROUP_COLUMNS, find_tombstones, tombstones_of
from ctxwarden.types import Memory

__all__ = [
    "API_KEY_COLUMNS",
    "MEMORY_COLUMNS",
    "MemoryReads",
    "api_key_of",
    "bigram_column",
    "memory_of",
    "memory_row",
    "recent_sql",
    "scope_sql",
]

_EMPTY: Mapping[str, Any] = MappingProxyType({})

MEMORY_COLUMNS = (
    "rowid, id, tenant, session, channel, author, author_kind, role, content, created_at, "
    "thread_id, reply_to, kind, pinned, name, tool_calls, tool_call_id, content_hash, dup_count, "
    "last_seen_at, access_count, last_accessed_at, access_score, included_tokens_total, "
    "source_ids, time_start, time_end, attachments, metadata, latest_content, end_user"
)


API_KEY_COLUMNS = "key_id, tenant, scopes, secret_hash, name, created_at, revoked_at"


def scope_sql(scope: ReadScope | None, alias: str = "") -> tuple[str, list[Any]]:
    """The ``AND ...`` filter of a read scope (``?`` placeholders) and its parameters; empty for
    the whole tenant. ``alias`` prefixes the columns (``"m."``).

    >>> scope_sql(ReadScope(kind="session", session="s1", user="u"))
    (' AND session = ? AND end_user = ?', ['s1', 'u'])
    """
    if scope is None:
        return "", []
    sql = ""
    params: list[Any] = []
    if scope.session is not None:
        sql += f" AND {alias}session = ?"
        params.append(scope.session)
    if scope.user is not None:
        sql += f" AND {alias}end_user = ?"
        params.append(scope.user)
    return sql, params


def recent_sql(
    tenant: str,
    session: str,
    *,
    channel: str | None,
    before: tuple[float, int] | None,
    limit: int,
    user: str | None,
) -> tuple[str, list[Any]]:
    """The ``WHERE ... ORDER BY ... LIMIT ?`` of a page of :meth:`MemoryReads.recent` (``?``
    placeholders; the columns of ``memories`` and of ``memory_rows`` alike) and its parameters.

    >>> recent_sql("t", "s", channel=None, before=(5.0, 9), limit=2, user="u")[1]
    ['t', 's', 'u', 5.0, 9, 2]
    """
    where = "tenant = ? AND session = ? AND kind = 'message'"
    params: list[Any] = [tenant, session]
    if channel is not None:
        where += " AND channel = ?"
        params.append(channel)
    if user is not None:
        where += " AND end_user = ?"
        params.append(user)
    if before is not None:
        where += " AND (created_at, rowid) < (?, ?)"
        params.extend(before)
    params.append(limit)
    return f"WHERE {where} ORDER BY created_at DESC, rowid DESC LIMIT ?", params


def memory_of(row: Sequence[Any]) -> Memory:
    """A :class:`Memory` from a row of :data:`MEMORY_COLUMNS`."""
    # Positional, in column order (the same order as Memory's fields up to access stats).
    (
        rowid, id_, tenant, session, channel, author, author_kind, role, content, created_at,
        thread_id, reply_to, kind, pinned, name, tool_calls, tool_call_id, content_hash, dup_count,
        last_seen_at, access_count, last_accessed_at, access_score, included_tokens_total,
        source_ids, time_start, time_end, attachments, metadata, latest_content, end_user,
    ) = row  # fmt: skip
    return Memory(
        rowid, id_, tenant, session, channel, author, author_kind, role, content, created_at,
        thread_id, reply_to, kind, bool(pinned), name,
        tuple(json.loads(tool_calls)) if tool_calls else (),
        tool_call_id, content_hash, dup_count, last_seen_at, access_count, last_accessed_at,
        access_score, included_tokens_total,
        tuple(json.loads(source_ids)) if source_ids else (),
        (time_start, time_end) if time_start is not None else None,
        tuple(json.loads(attachments)) if attachments else (),
        json.loads(metadata) if metadata else _EMPTY, latest_content, end_user,
    )  # fmt: skip


#: The columns of a ``contexts`` row (the inclusion log's header), in :func:`context_row` order.
CONTEXT_COLUMNS = "id, tenant, session, created_at, model, tokenizer, exact, cap, tokens, blocks"


def context_row(entry: ContextLog) -> tuple[Any, ...]:
    """The insert parameters of ``entry``'s ``contexts`` row (both backends' insert)."""
    return (
        entry.id,
        entry.tenant,
        entry.session,
        entry.created_at,
        entry.model,
        entry.tokenizer,
        entry.exact,
        entry.cap,
        entry.tokens,
        json.dumps(entry.blocks, separators=(",", ":")),
    )


def embedded_text(content: str, attachment_text: str | None) -> str:
    """The text a memory is embedded by: its content and its attachments' words (the column
    ``attachment_text``: :func:`ctxwarden.attachments.search_text`)."""
    return f"{content} {attachment_text}".strip() if attachment_text else content


def bigram_column(content: str, attachment_text: str | None) -> str | None:
    """The column ``bigram_text`` of a row (migration ``script_bigrams``): the character
    bigrams of its runs in scripts written without spaces, in the content and the attachment
    text (:func:`ctxwarden.segment.bigram_text`); None for a row without any.

    >>> bigram_column("会議は木曜", None), bigram_column("standup at 10", "notes.txt")
    ('会議 議は は木 木曜', None)
    """
    return bigram_text(f"{content} {attachment_text}" if attachment_text else content)


def memory_row(rowid: int | None, memory: NewMemory) -> tuple[Any, ...]:
    """The insert parameters of ``memory`` (the column order of both backends' insert)."""
    return (
        rowid,
        memory.id,
        memory.tenant,
        memory.session,
        memory.channel,
        memory.author,
        memory.author_kind,
        memory.role,
        memory.content,
        memory.created_at,
        memory.thread_id,
        memory.reply_to,
        memory.kind,
        memory.pinned,
        memory.name,
        json.dumps(list(memory.tool_calls)) if memory.tool_calls else None,
        memory.tool_call_id,
        json.dumps(list(memory.attachments)) if memory.attachments else None,
        json.dumps(dict(memory.metadata)) if memory.metadata else None,
        memory.content_hash,
        memory.near_key,
        memory.created_at,
        json.dumps(list(memory.source_ids)) if memory.source_ids else None,
        memory.time_range[0] if memory.time_range else None,
        memory.time_range[1] if memory.time_range else None,
        memory.user,
        search_text(memory.attachments) or None,
    )


def api_key_of(row: Sequence[Any]) -> ApiKey:
    """An :class:`ApiKey` from a row of :data:`API_KEY_COLUMNS`."""
    key_id, tenant, scopes, secret_hash, name, created_at, revoked_at = row
    return ApiKey(
        key_id=key_id,
        tenant=tenant,
        scopes=frozenset(scopes.split()),
        secret_hash=secret_hash,
        name=name,
        created_at=created_at,
        revoked_at=revoked_at,
    )


class MemoryReads:
    """Memory look-ups, history pages, pinned and summary memories, the inclusion log."""

    #: The predicate for pinned rows, as the backend's partial index is written.
    _PINNED = "pinned = 1"
    #: Makes an ORDER BY on text compare code points (SQLite's BINARY already does).
    _CODE_POINT_ORDER = ""

    def _read(self, sql: str, params: Sequence[Any]) -> list[Any]:
        """Run one read statement written with ``?`` placeholders."""
        raise NotImplementedError

    def get(self, tenant: str, id: str) -> Memory:
        """The memory with this id, or the aggregate it was folded into (alias), or the summary
        that absorbed it (tombstone)."""
        rows = self._read(
            f"SELECT {MEMORY_COLUMNS} FROM memory_rows WHERE tenant = ? AND id = ?", (tenant, id)
        )
        if not rows:
            rows = self._read(
                f"SELECT {MEMORY_COLUMNS} FROM memory_rows WHERE rowid = "
                "(SELECT memory_rowid FROM aliases WHERE tenant = ? AND id = ?)",
                (tenant, id),
            )
        if not rows:
            found = find_tombstones(self._read, tenant, [id]).get(id)
            if found is not None and found.summary_id is not None:
                rows = self._read(
                    f"SELECT {MEMORY_COLUMNS} FROM memory_rows WHERE tenant = ? AND id = ?",
                    (tenant, found.summary_id),
                )
        if not rows:
            raise NotFound(f"no memory with id {id!r} in tenant {tenant!r}")
        return memory_of(rows[0])

    def supersessions(self, tenant: str, rowids: Sequence[int]) -> dict[int, tuple[str, float]]:
        """Of these memories, those a newer one with the same key superseded: rowid ->
        (successor's id, valid_until)."""
        out: dict[int, tuple[str, float]] = {}
        for start in range(0, len(rowids), 400):
            chunk = list(rowids[start : start + 400])
            marks = ",".join("?" * len(chunk))
            # Driven by the rowids asked for (the key of supersessions), the tenant checked per
            # row: as a join, SQLite walked every memory of the tenant first, a cost that grew
            # with the store (0.8 ms at 7k memories against ~40 us for a page of 100 rowids).
            for rowid, successor, until in self._read(
                "SELECT s.memory_rowid, s.superseded_by, s.valid_until FROM supersessions s "
                f"WHERE s.memory_rowid IN ({marks}) "
                "AND (SELECT m.tenant FROM memories m WHERE m.rowid = s.memory_rowid) = ?",
                [*chunk, tenant],
            ):
                out[int(rowid)] = (str(successor), float(until))
        return out

    def versions(self, tenant: str, id: str) -> list[Version]:
        """The texts edits replaced in the memory with this own id, oldest first."""
        rows = self._read(
            "SELECT v.version, v.content, v.valid_from, v.valid_until FROM memory_versions v "
            "JOIN memories m ON m.rowid = v.memory_rowid WHERE m.tenant = ? AND m.id = ? "
            "ORDER BY v.version",
            (tenant, id),
        )
        return [
            Version(
                version=int(r[0]),
                content=str(r[1]),
                valid_from=float(r[2]),
                valid_until=float(r[3]),
            )
            for r in rows
        ]

    def recent(
        self,
        tenant: str,
        session: str,
        *,
        channel: str | None = None,
        before: tuple[float, int] | None = None,
        limit: int = 64,
        user: str | None = None,
    ) -> list[Memory]:
        """The session's messages (of end user ``user`` when given), newest first, a page at a
        time (index range scan)."""
        page, params = recent_sql(
            tenant, session, channel=channel, before=before, limit=limit, user=user
        )
        rows = self._read(f"SELECT {MEMORY_COLUMNS} FROM memory_rows {page}", params)
        return [memory_of(r) for r in rows]

    def pinned(
        self, tenant: str, *, session: str | None = None, scope: ReadScope | None = None
    ) -> list[Memory]:
        """Pinned memories and facts of the tenant visible in ``scope`` (every one when None),
        oldest first; ``session`` (older callers) is ``scope=ReadScope("session", session)``.

        A fact is visible where its memory is (its session, its end user). A pinned memory is
        visible where it was pinned for (``pin_scope``): its own session by default (NULL),
        its end user's sessions (``"user"``) or the whole tenant (``"tenant"``).
        """
        if scope is None and session is not None:
            scope = ReadScope(kind="session", session=session)
        extra, extra_params = scope_sql(scope)
        pin_extra, pin_params = "", list(extra_params)
        if extra:
            # Three indexed arms in effect: its scope, the user it was pinned for, the tenant.
            pin_extra = f" AND ((1 = 1{extra}) OR pin_scope = 'tenant'"
            if scope is not None and scope.user is not None:
                pin_extra += " OR (pin_scope = 'user' AND end_user = ?)"
                pin_params.append(scope.user)
            pin_extra += ")"
        # Two indexed branches rather than one OR, which would scan the tenant's memories.
        rows = self._read(
            f"SELECT {MEMORY_COLUMNS} FROM memory_rows WHERE tenant = ? AND {self._PINNED}"
            f"{pin_extra} UNION SELECT {MEMORY_COLUMNS} FROM memory_rows WHERE tenant = ? "
            f"AND kind = 'fact'{extra} ORDER BY 10, 1",
            [tenant, *pin_params, tenant, *extra_params],
        )
        return [memory_of(r) for r in rows]

    def summaries(
        self, tenant: str, *, session: str | None = None, scope: ReadScope | None = None
    ) -> list[Memory]:
        """Summary memories in ``scope`` (of ``session`` when given instead), oldest first."""
        if scope is None and session is not None:
            scope = ReadScope(kind="session", session=session)
        extra, params = scope_sql(scope)
        rows = self._read(
            f"SELECT {MEMORY_COLUMNS} FROM memory_rows WHERE tenant = ? AND kind = 'summary'"
            f"{extra} ORDER BY created_at, rowid",
            [tenant, *params],
        )
        return [memory_of(r) for r in rows]

    def inclusions(self, context_id: str) -> list[dict[str, Any]]:
        """The inclusion log of one context, in order."""
        rows = self._read(
            "SELECT i.memory_id, i.block, i.tokens FROM inclusions i JOIN contexts c "
            "ON c.rowid = i.context_rowid WHERE c.id = ? ORDER BY i.position",
            (context_id,),
        )
        return [{"memory_id": r[0], "block": r[1], "tokens": r[2]} for r in rows]

    def stats(self, tenant: str, *, scope: ReadScope | None = None) -> dict[str, Any]:
        """Per-channel counts: records seen, memories stored, duplicates folded (exact, near
        and semantic layers apart); the top families by count. Only memories in ``scope``
        (the whole tenant when None) are counted, and contexts of its sessions."""
        extra, extra_params = scope_sql(scope)
        m_extra, _ = scope_sql(scope, "m.")
        channels: dict[str, dict[str, int]] = {}
        for channel, memories, seen in self._read(
            "SELECT coalesce(channel, ''), count(*), sum(dup_count) FROM memories "
            f"WHERE tenant = ?{extra} GROUP BY 1",
            [tenant, *extra_params],
        ):
            channels[channel] = {
                "memories": int(memories),
                "seen": int(seen),
                "folded": int(seen) - int(memories),
                "exact": 0,
                "near": 0,
                "semantic": 0,
            }
        for channel, status, count in self._read(
            "SELECT coalesce(m.channel, ''), a.status, count(*) FROM aliases a "
            f"JOIN memories m ON m.rowid = a.memory_rowid WHERE a.tenant = ?{m_extra} "
            "GROUP BY 1, 2",
            [tenant, *extra_params],
        ):
            layer = {
                "duplicate": "exact",
                "near_duplicate": "near",
                "semantic_duplicate": "semantic",
            }.get(status)
            if layer is not None and channel in channels:
                channels[channel][layer] += int(count)
        rows = self._read(
            "SELECT id, channel, author, dup_count, substr(content, 1, 120), "
            "substr(latest_content, 1, 120), rowid, kind FROM memories "
            f"WHERE tenant = ?{extra} AND dup_count > 1 ORDER BY dup_count DESC, rowid "
            "LIMIT 10",
            [tenant, *extra_params],
        )
        # A summary's text as shown (a lossless pack is stored without its ids and times).
        shown = {
            m.rowid: m.content[:120]
            for m in self.memories_at([int(r[6]) for r in rows if r[7] == "summary"])
        }
        top = [
            {
                "id": r[0],
                "channel": r[1],
                "author": r[2],
                "count": r[3],
                "content": shown.get(int(r[6]), r[4]),
                "latest": r[5],
            }
            for r in rows
        ]
        if scope is not None and scope.session is not None:
            contexts = self._read(
                "SELECT count(*) FROM contexts WHERE tenant = ? AND session = ?",
                (tenant, scope.session),
            )[0][0]
        elif scope is not None and scope.user is not None:
            # The inclusion log has no end user: the contexts of the user's sessions.
            contexts = self._read(
                "SELECT count(*) FROM contexts WHERE tenant = ? AND session IN "
                "(SELECT session FROM memories WHERE tenant = ? AND end_user = ?)",
                (tenant, tenant, scope.user),
            )[0][0]
        else:
            contexts = self._read("SELECT count(*) FROM contexts WHERE tenant = ?", (tenant,))[0][0]
        channels = dict(sorted(channels.items()))  # code-point order on every backend
        memories = sum(c["memories"] for c in channels.values())
        seen = sum(c["seen"] for c in channels.values())
        return {
            "memories": memories,
            "seen": seen,
            "folded": seen - memories,
            "exact": sum(c["exact"] for c in channels.values()),
            "near": sum(c["near"] for c in channels.values()),
            "semantic": sum(c["semantic"] for c in channels.values()),
            "contexts": int(contexts),
            "channels": channels,
            "top_families": top,
        }

    def memories_at(self, rowids: Sequence[int]) -> list[Memory]:
        """The memories at these rowids (any tenant: maintenance after embedding), in rowid
        order; rowids no longer stored are left out."""
        out: list[Memory] = []
        ids = sorted({int(r) for r in rowids})
        for start in range(0, len(ids), 500):
            chunk = ids[start : start + 500]
            rows = self._read(
                f"SELECT {MEMORY_COLUMNS} FROM memory_rows WHERE rowid IN "
                f"({','.join('?' * len(chunk))}) ORDER BY rowid",
                chunk,
            )
            out.extend(memory_of(r) for r in rows)
        return out

    def neighbours(
        self,
        tenant: str,
        anchors: Sequence[Memory],
        *,
        turns: int = 3,
        replies: int = 4,
        scope: ReadScope | None = None,
        known: Mapping[int, Memory] | None = None,
    ) -> list[Link]:
        """The conversation around each anchor (see :meth:`Store.neighbours`): a ``UNION ALL``
        of small index range scans (``memories_channel_recent``, ``memories_thread``,
        ``memories_reply``, the ``(tenant, id)`` key), each bounded by its own ``LIMIT``, so a
        message with thousands of replies costs ``replies`` rows. One statement for every
        anchor, or one per 40 (SQLite allows 500 terms in a compound SELECT): a server
        backend's one round trip. ``known`` is not used (every row comes in that statement);
        SQLite reads neighbours its own way
        (:class:`~ctxwarden.store.sqlite_neighbours.SQLiteNeighbours`)."""
        per_anchor = [_neighbour_branches(tenant, a, turns, replies) for a in anchors]
        size = 40
        links: list[Link] = []
        for start in range(0, len(anchors), size):
            group = range(start, min(start + size, len(anchors)))
            sql, params = _neighbour_statement(tenant, [per_anchor[i] for i in group], scope=scope)
            if not sql:
                continue
            for row in self._read(sql, params):
                memory, index = memory_of(row[2:]), group[int(row[0])]
                if memory.rowid != anchors[index].rowid:
                    links.append(Link(index, str(row[1]), memory))
        return links

    def compaction_candidates(
        self, tenant: str, *, created_before: float
    ) -> list[tuple[Memory, float | None]]:
        """Unpinned messages created and last seen before ``created_before``, oldest first."""
        rows = self._read(
            f"SELECT {MEMORY_COLUMNS}, access_score_at FROM memory_rows WHERE tenant = ? "
            f"AND kind = 'message' AND NOT ({self._PINNED}) AND created_at < ? "
            "AND last_seen_at < ? ORDER BY created_at, rowid",
            (tenant, created_before, created_before),
        )
        return [(memory_of(r[:-1]), r[-1]) for r in rows]

    def tombstones(self, tenant: str, *, summary_id: str | None = None) -> list[Tombstone]:
        """Tombstones of ``tenant`` (pointing at ``summary_id`` when given), by id (code
        points)."""
        params: list[Any] = [tenant]
        extra = ""
        if summary_id is not None:
            extra = " AND summary_id = ?"
            params.append(summary_id)
        rows = self._read(
            f"SELECT {GROUP_COLUMNS} FROM tombstone_groups WHERE tenant = ?{extra}", params
        )
        found = sorted(tombstones_of(rows), key=lambda f: (f.member.id, f.grp))
        # one per id (a writer keeps it so; the newest group wins should two hold one)
        return list({f.member.id: f.tombstone() for f in found}.values())

    def api_key(self, key_id: str) -> ApiKey | None:
        """The key with this id, or None."""
        rows = self._read(
            f"SELECT {API_KEY_COLUMNS} FROM api_keys WHERE key_id = ?",
            (key_id,),
        )
        return api_key_of(rows[0]) if rows else None

    def api_keys(self, tenant: str | None = None) -> list[ApiKey]:
        """Keys of ``tenant`` (all when None), oldest first."""
        where, params = ("WHERE tenant = ?", (tenant,)) if tenant is not None else ("", ())
        rows = self._read(
            f"SELECT {API_KEY_COLUMNS} FROM api_keys {where} ORDER BY created_at, key_id",
            params,
        )
        return [api_key_of(r) for r in rows]

    def authors(self, tenant: str) -> list[str]:
        """The distinct authors of ``tenant``'s memories, sorted by code point (in Python: an
        ``ORDER BY`` would follow PostgreSQL's collation, so the backends could disagree)."""
        rows = self._read(
            "SELECT DISTINCT author FROM memories WHERE tenant = ? AND author IS NOT NULL",
            (tenant,),
        )
        return sorted(str(r[0]) for r in rows)

    def iter_memories(self, tenant: str) -> Iterator[Memory]:
        """Every memory of ``tenant``, oldest first, a page at a time."""
        last: tuple[float, int] = (-math.inf, -1)
        while True:
            rows = self._read(
                f"SELECT {MEMORY_COLUMNS} FROM memory_rows WHERE tenant = ? "
                "AND (created_at, rowid) > (?, ?) ORDER BY created_at, rowid LIMIT 500",
                (tenant, *last),
            )
            if not rows:
                return
            for row in rows:
                yield memory_of(row)
            last = (rows[-1][9], rows[-1][0])


_FORWARD, _BACKWARD = "created_at, rowid", "created_at DESC, rowid DESC"


def _neighbour_statement(
    tenant: str,
    anchors: Sequence[list[tuple[str, str, list[Any], str, int]]],
    *,
    scope: ReadScope | None = None,
    columns: str = MEMORY_COLUMNS,
    rows: str = "memory_rows",
) -> tuple[str, list[Any]]:
    """One ``UNION ALL`` of these anchors' branches (:func:`_neighbour_branches`), each row led
    by its anchor's position in ``anchors`` and its relation; ("", []) without branches. Each
    branch is filtered by ``scope`` before its limit (a thread shared with other sessions).
    ``columns`` of ``rows`` (a memory row by default; ``"rowid"`` of ``memories`` for the
    rowids alone)."""
    branches: list[str] = []
    params: list[Any] = []
    scope_filter, scope_params = scope_sql(scope)
    for number, branch_list in enumerate(anchors):
        for relation, where, args, order, limit in branch_list:
            # Literal position and relation (ints and fixed words, never user text).
            alias = f"b{len(branches)}"
            branches.append(
                f"SELECT {number} AS anchor, '{relation}' AS relation, {alias}.* FROM "
                f"(SELECT {columns} FROM {rows} WHERE tenant = ? AND {where}"
                f"{scope_filter} ORDER BY {order} LIMIT {int(limit)}) AS {alias}"
            )
            params.extend((tenant, *args, *scope_params))
    return " UNION ALL ".join(branches), params


def _neighbour_branches(
    tenant: str, anchor: Memory, turns: int, replies: int
) -> list[tuple[str, str, list[Any], str, int]]:
    """The branches of :meth:`MemoryReads.neighbours` for one anchor, in order: (relation,
    condition, its parameters, order, limit). The text depends only on the anchor's shape
    (thread, channel, reply) and the limits, never on its values."""
    out: list[tuple[str, str, list[Any], str, int]] = []
    at = [anchor.created_at, anchor.rowid]
    in_thread = anchor.thread_id is not None and anchor.thread_id != anchor.id
    place_args: list[Any]
    if in_thread:
        place, place_args = "thread_id = ?", [anchor.thread_id]
    elif anchor.channel is None:
        place, place_args = "session = ? AND channel IS NULL", [anchor.session]
    else:
        place, place_args = "session = ? AND channel = ?", [anchor.session, anchor.channel]
    if turns > 0:
        out.append(("before", f"{place} AND kind = 'message' AND (created_at, rowid) < (?, ?)",
                    [*place_args, *at], _BACKWARD, turns))  # fmt: skip
        out.append(("after", f"{place} AND kind = 'message' AND (created_at, rowid) > (?, ?)",
                    [*place_args, *at], _FORWARD, turns))  # fmt: skip
    if anchor.reply_to is not None:
        out.append(("parent", "id = ?", [anchor.reply_to], "rowid", 1))
        alias = "rowid = (SELECT memory_rowid FROM aliases WHERE tenant = ? AND id = ?)"
        out.append(("parent", alias, [tenant, anchor.reply_to], "rowid", 1))
        if replies > 0:
            out.append(("sibling", "reply_to = ? AND kind = 'message' AND rowid <> ?",
                        [anchor.reply_to, anchor.rowid], _FORWARD, replies))  # fmt: skip
    if in_thread and anchor.thread_id != anchor.reply_to:
        out.append(("root", "id = ?", [anchor.thread_id], "rowid", 1))
    if replies > 0:
        out.append(("reply", "reply_to = ? AND kind = 'message'", [anchor.id], _FORWARD, replies))
        if not in_thread:
            out.append(("reply", "thread_id = ? AND kind = 'message'", [anchor.id], _FORWARD,
                        replies))  # fmt: skip
    return out
