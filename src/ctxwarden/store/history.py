"""Read-only history queries for the dashboard: the store's health over time and one memory's
history, as far as the store records them.

The store keeps no snapshots of its counts, so the series are rebuilt from the times every row
already carries: ``memories.created_at`` (kept memories by kind), ``tombstone_groups``
(``time_start`` for when a retired memory began, ``deleted_at`` for when it went; a group whose
members began in different buckets is decoded), ``aliases.created_at`` (each
repeat folded, by layer), ``token_counts`` joined to their memories (tokens by channel, for one
tokenizer) and the inclusion log (``contexts.created_at``: how often each channel's memories were
put into a context). Every query groups in SQL by a time bucket, so a page reads a few hundred
rows however large the store is.

Functions, not :class:`~ctxwarden.store.base.Store` methods: they take a SQL store (SQLite or
PostgreSQL: both read through ``MemoryReads._read`` with ``?`` placeholders, and the SQL below is
common to both) and never write.

>>> from ctxwarden.store.sqlite import SQLiteStore
>>> store = SQLiteStore(":memory:")
>>> health(store, "default")["memories"]["now"]
0
>>> store.close()
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any

from ctxwarden.errors import InputError
from ctxwarden.scope import ReadScope
from ctxwarden.store.reads import MemoryReads, scope_sql
from ctxwarden.store.tombstones import GROUP_COLUMNS, find_tombstones, tombstones_of
from ctxwarden.types import format_time

__all__ = ["BUCKET_WIDTHS", "LAYERS", "health", "memory_history"]

#: Bucket widths in seconds, the first that gives at most ``buckets`` buckets is used.
BUCKET_WIDTHS = (60, 300, 900, 3600, 3 * 3600, 6 * 3600, 86400, 7 * 86400, 30 * 86400)
#: Alias status -> de-dup layer (the layers :meth:`Store.stats` counts).
LAYERS = {"duplicate": "exact", "near_duplicate": "near", "semantic_duplicate": "semantic"}
#: A memory's history reads the inclusion log of at most this many of the tenant's newest
#: contexts (the log has no index by memory id: its totals are in the memory's access stats).
RECENT_CONTEXTS = 2000


def _reads(store: object) -> MemoryReads:
    if not isinstance(store, MemoryReads):
        raise InputError(
            f"store: {type(store).__name__} keeps no SQL history: use SQLiteStore or PostgresStore",
            field="store",
        )
    return store


def _bucket(column: str) -> str:
    # CAST truncates in SQLite and rounds in PostgreSQL: the difference is under one second at
    # a bucket's edge. The offset keeps the value non-negative, so truncation is floor.
    return f"CAST({column} - ? AS INTEGER) / ?"


def _span(reads: MemoryReads, tenant: str, scope_filter: str, params: list[Any]) -> list[float]:
    times: list[float] = []
    for sql, args in (
        (f"SELECT min(created_at), max(created_at) FROM memories WHERE tenant = ?{scope_filter}",
         [tenant, *params]),
        ("SELECT min(coalesce(time_start, deleted_at)), max(deleted_at) FROM tombstone_groups "
         "WHERE tenant = ?", [tenant]),
        ("SELECT min(created_at), max(created_at) FROM aliases WHERE tenant = ?", [tenant]),
        ("SELECT min(created_at), max(created_at) FROM contexts WHERE tenant = ?", [tenant]),
    ):  # fmt: skip
        for row in reads._read(sql, args):
            times.extend(float(t) for t in row if t is not None)
    return times


def _grid(times: list[float], buckets: int) -> tuple[int, int, int]:
    """(start, width, count): aligned buckets covering ``times``."""
    if not times:
        return 0, BUCKET_WIDTHS[0], 0
    low, high = min(times), max(times)
    for width in (*BUCKET_WIDTHS, None):
        if width is None:  # longer than the widest bucket allows: widen to fit
            width = max(BUCKET_WIDTHS[-1], math.ceil((high - low + 1) / buckets))
        start = int(low // width) * width
        count = int((high - start) // width) + 1
        if count <= buckets:
            return start, width, count
    raise AssertionError("unreachable")  # pragma: no cover


def _series(count: int) -> list[int]:
    return [0] * count


def health(
    store: object,
    tenant: str,
    *,
    session: str | None = None,
    buckets: int = 48,
    tokenizer: str | None = None,
    top: int = 10,
) -> dict[str, Any]:
    """The store's health over time in ``tenant`` (one ``session`` when given).

    Returns the time grid (``start``, ``width`` seconds, ``times``: each bucket's start as ISO
    8601) and, per bucket: ``memories`` (``alive`` at the bucket's end, ``new`` by kind,
    ``retired`` by reason), ``folds`` by layer, ``tokens`` by channel (``tokenizer``: the
    newest context's when not given; only memories counted with it), ``compactions`` (each
    summary with the records it replaced and the tokens before and after, when recorded),
    ``heat`` (inclusions per channel and bucket, contexts per bucket) and the ``hottest``
    memories by access count.

    >>> from ctxwarden.store.sqlite import SQLiteStore
    >>> store = SQLiteStore(":memory:")
    >>> sorted(health(store, "default"))  # doctest: +NORMALIZE_WHITESPACE
    ['buckets', 'compactions', 'folds', 'heat', 'hottest', 'memories', 'session', 'start',
     'times', 'tokens', 'width']
    >>> store.close()
    """
    if not 1 <= buckets <= 500:
        raise InputError(f"buckets: {buckets} must be between 1 and 500", field="buckets")
    reads = _reads(store)
    scope_filter, scope_params = scope_sql(_session_scope(session))
    m_filter, _ = scope_sql(_session_scope(session), "m.")
    start, width, count = _grid(_span(reads, tenant, scope_filter, scope_params), buckets)
    grid = [start, width]

    def index(value: Any) -> int:
        return min(max(int(value), 0), max(count - 1, 0))

    new: dict[str, list[int]] = {}
    created = _series(count)
    for bucket, kind, n in reads._read(
        f"SELECT {_bucket('created_at')}, kind, count(*) FROM memories "
        f"WHERE tenant = ?{scope_filter} GROUP BY 1, 2",
        [*grid, tenant, *scope_params],
    ):
        new.setdefault(str(kind), _series(count))[index(bucket)] += int(n)
        created[index(bucket)] += int(n)
    # Retired memories (compacted or erased) lived from their start to their deletion.
    retired: dict[str, list[int]] = {}
    began = _series(count)
    ended = _series(count)
    tomb_filter, tomb_params = _tombstone_scope(session)
    # A group whose members all began in one bucket counts in SQL; the others (erasures,
    # groups across a bucket's edge) are decoded, each member counted where it began.
    one_bucket = (
        f"(t.time_start IS NULL OR (t.summary_id IS NOT NULL "
        f"AND {_bucket('t.time_start')} = {_bucket('t.time_end')}))"
    )
    retirements = [
        (first, gone, reason, int(n))
        for first, gone, reason, n in reads._read(
            f"SELECT {_bucket('coalesce(t.time_start, t.deleted_at)')}, "
            f"{_bucket('t.deleted_at')}, t.reason, sum(t.members) FROM tombstone_groups t "
            f"WHERE t.tenant = ?{tomb_filter} AND {one_bucket} GROUP BY 1, 2, 3",
            [*grid, *grid, tenant, *tomb_params, *grid, *grid],
        )
    ]
    for found in tombstones_of(
        reads._read(
            f"SELECT {', '.join('t.' + c for c in GROUP_COLUMNS.split(', '))} "
            f"FROM tombstone_groups t WHERE t.tenant = ?{tomb_filter} AND NOT {one_bucket}",
            [tenant, *tomb_params, *grid, *grid],
        )
    ):
        began_at = found.member.time_start
        first = int((began_at if began_at is not None else found.deleted_at) - start) // width
        retirements.append((first, int(found.deleted_at - start) // width, found.reason, 1))
    for first, gone, reason, n in retirements:
        retired.setdefault(str(reason), _series(count))[index(gone)] += n
        began[index(first)] += n
        ended[index(gone)] += n
    alive, total = _series(count), 0
    for i in range(count):
        total += created[i] + began[i] - ended[i]
        alive[i] = total

    folds = {layer: _series(count) for layer in ("exact", "near", "semantic")}
    for bucket, status, n in reads._read(
        f"SELECT {_bucket('a.created_at')}, a.status, count(*) FROM aliases a "
        f"JOIN memories m ON m.rowid = a.memory_rowid WHERE a.tenant = ?{m_filter} GROUP BY 1, 2",
        [*grid, tenant, *scope_params],
    ):
        layer = LAYERS.get(str(status))
        if layer is not None:
            folds[layer][index(bucket)] += int(n)

    if tokenizer is None:
        tokenizer = _newest_tokenizer(reads, tenant)
    tokens: dict[str, list[int]] = {}
    counted = 0
    if tokenizer is not None:
        for bucket, channel, n, memories in reads._read(
            f"SELECT {_bucket('m.created_at')}, coalesce(m.channel, ''), sum(t.message), "
            "count(*) FROM token_counts t JOIN memories m ON m.rowid = t.memory_rowid "
            f"WHERE m.tenant = ? AND t.tokenizer = ?{m_filter} GROUP BY 1, 2",
            [*grid, tenant, tokenizer, *scope_params],
        ):
            tokens.setdefault(str(channel), _series(count))[index(bucket)] += int(n)
            counted += int(memories)

    context_filter = " AND c.session = ?" if session is not None else ""
    context_params = [session] if session is not None else []
    contexts = _series(count)
    context_tokens = _series(count)
    for bucket, n, used in reads._read(
        f"SELECT {_bucket('c.created_at')}, count(*), sum(c.tokens) FROM contexts c "
        f"WHERE c.tenant = ?{context_filter} GROUP BY 1",
        [*grid, tenant, *context_params],
    ):
        contexts[index(bucket)] += int(n)
        context_tokens[index(bucket)] += int(used)
    heat: dict[str, list[int]] = {}
    for bucket, channel, n in reads._read(
        f"SELECT {_bucket('c.created_at')}, coalesce(m.channel, ''), count(*) FROM inclusions i "
        "JOIN contexts c ON c.rowid = i.context_rowid "
        "JOIN memories m ON m.tenant = c.tenant AND m.id = i.memory_id "
        f"WHERE c.tenant = ?{context_filter} GROUP BY 1, 2",
        [*grid, tenant, *context_params],
    ):
        heat.setdefault(str(channel), _series(count))[index(bucket)] += int(n)
    rows = reads._read(
        "SELECT id, channel, kind, access_count, access_score, last_accessed_at, "
        f"substr(content, 1, 120), rowid FROM memory_rows WHERE tenant = ?{scope_filter} "
        "AND access_count > 0 ORDER BY access_count DESC, rowid LIMIT ?",
        [tenant, *scope_params, top],
    )
    # A summary's text as shown (a lossless pack is stored without its ids and times).
    shown = {
        m.rowid: m.content[:120]
        for m in reads.memories_at([int(r[7]) for r in rows if r[2] == "summary"])
    }
    hottest = [
        {
            "id": r[0],
            "channel": r[1],
            "kind": r[2],
            "access_count": int(r[3]),
            "access_score": float(r[4]),
            "last_accessed_at": format_time(r[5]) if r[5] is not None else None,
            "content": shown.get(int(r[7]), r[6]),
        }
        for r in rows
    ]
    return {
        "session": session,
        "start": format_time(start) if count else None,
        "width": width,
        "buckets": count,
        "times": [format_time(start + i * width) for i in range(count)],
        "memories": {"now": total, "alive": alive, "new": new, "retired": retired},
        "folds": folds,
        "tokens": {"tokenizer": tokenizer, "memories_counted": counted, "by_channel": tokens},
        "compactions": _compactions(reads, tenant, session, tokenizer),
        "heat": {"contexts": contexts, "context_tokens": context_tokens, "by_channel": heat},
        "hottest": hottest,
    }


def _session_scope(session: str | None) -> ReadScope | None:
    if session is None:
        return None
    return ReadScope(kind="session", session=session)


def _tombstone_scope(session: str | None) -> tuple[str, list[Any]]:
    # A tombstone has no session of its own: a compacted memory's is its summary's (an erased
    # memory without a summary is then left out).
    if session is None:
        return "", []
    return (
        " AND t.summary_id IN (SELECT id FROM memories WHERE tenant = t.tenant AND session = ?)",
        [session],
    )


def _newest_tokenizer(reads: MemoryReads, tenant: str) -> str | None:
    rows = reads._read(
        "SELECT tokenizer FROM contexts WHERE tenant = ? ORDER BY created_at DESC, rowid DESC "
        "LIMIT 1",
        [tenant],
    )
    if rows:
        return str(rows[0][0])
    rows = reads._read(
        "SELECT t.tokenizer FROM token_counts t JOIN memories m ON m.rowid = t.memory_rowid "
        "WHERE m.tenant = ? LIMIT 1",
        [tenant],
    )
    return str(rows[0][0]) if rows else None


def _compactions(
    reads: MemoryReads, tenant: str, session: str | None, tokenizer: str | None, limit: int = 50
) -> list[dict[str, Any]]:
    """Each summary that retired memories, newest first: how many records it replaced, their
    time range, and the tokens before (the sources' count as lines, the size compaction plans
    with, which it records in the summary's metadata) and after (the summary's own line count),
    both for ``tokenizer``; None where not recorded (summaries written before it was)."""
    tomb_filter, tomb_params = _tombstone_scope(session)
    rows = reads._read(
        "SELECT t.summary_id, sum(t.members), max(t.deleted_at), min(t.time_start), "
        "max(t.time_end), min(t.reason) FROM tombstone_groups t "
        f"WHERE t.tenant = ? AND t.summary_id IS NOT NULL{tomb_filter} "
        "GROUP BY t.summary_id ORDER BY 3 DESC, 1 LIMIT ?",
        [tenant, *tomb_params, limit],
    )
    ids = [str(r[0]) for r in rows]
    details: dict[str, tuple[Any, ...]] = {}
    for chunk in _chunks(ids):
        marks = ", ".join("?" for _ in chunk)
        for row in reads._read(
            "SELECT m.id, m.session, m.channel, m.metadata, "
            "(SELECT t.line FROM token_counts t WHERE t.memory_rowid = m.rowid "
            "AND t.tokenizer = ?) FROM memories m "
            f"WHERE m.tenant = ? AND m.id IN ({marks})",
            [tokenizer, tenant, *chunk],
        ):
            details[str(row[0])] = row
    out = []
    for summary_id, retired, deleted_at, first, last, reason in rows:
        _id, session_of, channel, metadata, after = details.get(
            str(summary_id), (summary_id, None, None, None, None)
        )
        before = _source_tokens(metadata, tokenizer)
        out.append(
            {
                "summary_id": summary_id,
                "session": session_of,
                "channel": channel,
                "retired": int(retired),
                "reason": reason,
                "compacted_at": format_time(deleted_at),
                "time_range": _range(first, last),
                "tokens_before": before,
                "tokens_after": int(after) if after is not None else None,
                "tokens_saved": before - int(after)
                if before is not None and after is not None
                else None,
            }
        )
    return out


def _source_tokens(metadata: Any, tokenizer: str | None) -> int | None:
    if metadata is None or tokenizer is None:
        return None
    try:
        recorded = json.loads(metadata) if isinstance(metadata, str) else metadata
    except ValueError:
        return None
    counts = recorded.get("source_tokens") if isinstance(recorded, dict) else None
    value = counts.get(tokenizer) if isinstance(counts, dict) else None
    return int(value) if isinstance(value, int) else None


def _range(first: Any, last: Any) -> list[str] | None:
    if first is None or last is None:
        return None
    return [format_time(first), format_time(last)]


def _chunks(ids: Sequence[str], size: int = 500) -> list[Sequence[str]]:
    return [ids[i : i + size] for i in range(0, len(ids), size)]


def memory_history(store: object, tenant: str, id: str) -> dict[str, Any]:
    """One memory's history in ``tenant``: the memory ``id`` resolves to (itself, the aggregate
    it was folded into, or the summary that absorbed it) and how it got there; the repeats
    folded into it (id, layer, time); its tombstone when ``id`` itself was retired; for a summary,
    the tombstones of its sources; and the contexts that included it (among the tenant's
    newest :data:`RECENT_CONTEXTS`); the texts edits replaced (``versions``: each old text, in
    force from ``valid_from`` until it was replaced at ``valid_until`` by ``replaced_by``, the
    next version's text or the current one) and the supersession links (``superseded_by``: the
    newer memory that replaced it, None while it is in force; ``supersedes``: the memories it
    replaced; each with the id, that memory's creation time, ``valid_until`` and a ``reason``).
    Versions and links are the resolved memory's (an aggregate's for a folded id); a retired id
    has none (they went with its memory).

    Raises :class:`~ctxwarden.errors.NotFound` when nothing in the tenant has that id.
    """
    reads = _reads(store)
    memory = reads.get(tenant, id)
    own = find_tombstones(reads._read, tenant, [id]).get(id)
    tombstone_rows = (
        [(own.deleted_at, own.summary_id, own.reason, own.member.time_start,
          own.member.time_end)]
        if own is not None
        else []
    )  # fmt: skip
    alias_rows = reads._read(
        "SELECT a.id, a.status, a.created_at FROM aliases a "
        "JOIN memories m ON m.rowid = a.memory_rowid WHERE m.tenant = ? AND m.id = ? "
        "ORDER BY a.created_at, a.id",
        [tenant, memory.id],
    )
    if memory.id == id:
        found_as = "memory"
    elif tombstone_rows:
        found_as = "retired"
    else:
        found_as = "folded"
    tombstone = None
    if tombstone_rows:
        deleted_at, summary_id, reason, first, last = tombstone_rows[0]
        tombstone = {
            "id": id,
            "deleted_at": format_time(deleted_at),
            "summary_id": summary_id,
            "reason": reason,
            "time_range": _range(first, last),
        }
    retired = reads.tombstones(tenant, summary_id=memory.id) if memory.kind == "summary" else []
    sources = [
        {
            "id": t.id,
            "deleted_at": format_time(t.deleted_at),
            "reason": t.reason,
            "time_range": [format_time(x) for x in t.time_range] if t.time_range else None,
        }
        for t in retired
    ]
    inclusions = [
        {
            "context_id": r[0],
            "created_at": format_time(r[1]),
            "session": r[2],
            "model": r[3],
            "block": r[4],
            "tokens": int(r[5]),
        }
        for r in reads._read(
            "SELECT c.id, c.created_at, c.session, c.model, i.block, i.tokens FROM inclusions i "
            "JOIN contexts c ON c.rowid = i.context_rowid WHERE i.memory_id = ? AND c.rowid IN "
            "(SELECT rowid FROM contexts WHERE tenant = ? ORDER BY rowid DESC LIMIT ?) "
            "ORDER BY c.created_at DESC, c.rowid DESC",
            [memory.id, tenant, RECENT_CONTEXTS],
        )
    ]
    if tombstone is None:
        versions = _versions(reads, tenant, memory.id, memory.content)
        superseded_by, supersedes = _links(reads, tenant, memory.id)
    else:
        versions, superseded_by, supersedes = [], None, []
    if tombstone is not None:
        # a retired id: its own life (from its tombstone), then the summary's use
        began = tombstone["time_range"][0] if tombstone["time_range"] else tombstone["deleted_at"]
        events = [
            {"at": began, "event": "created", "id": id},
            {"at": tombstone["deleted_at"], "event": "retired", "id": memory.id},
        ]
    else:
        events = [{"at": format_time(memory.created_at), "event": "created", "id": memory.id}]
        events += [
            {"at": format_time(r[2]), "event": LAYERS.get(str(r[1]), str(r[1])), "id": r[0]}
            for r in alias_rows
        ]
        events += [
            {"at": s["deleted_at"], "event": "source retired", "id": s["id"]} for s in sources
        ]
    events += [{"at": v["valid_until"], "event": "edited", "id": memory.id} for v in versions]
    if superseded_by is not None:
        events.append(
            {"at": superseded_by["valid_until"], "event": "superseded", "id": superseded_by["id"]}
        )
    events += [{"at": s["valid_until"], "event": "supersedes", "id": s["id"]} for s in supersedes]
    events += [
        {"at": i["created_at"], "event": f"included ({i['block']})", "id": i["context_id"]}
        for i in inclusions
    ]
    events.sort(key=lambda e: (e["at"] or "", e["event"], e["id"]))
    return {
        "asked": id,
        "found_as": found_as,
        "memory": memory.to_dict(),
        "access": {
            "access_count": memory.access_count,
            "access_score": memory.access_score,
            "last_accessed_at": format_time(memory.last_accessed_at)
            if memory.last_accessed_at is not None
            else None,
            "included_tokens_total": memory.included_tokens_total,
        },
        "folded": [
            {"id": r[0], "layer": LAYERS.get(str(r[1]), str(r[1])), "at": format_time(r[2])}
            for r in alias_rows
        ],
        "tombstone": tombstone,
        "sources": sources,
        "inclusions": inclusions,
        "versions": versions,
        "superseded_by": superseded_by,
        "supersedes": supersedes,
        "events": events,
    }


def _versions(reads: MemoryReads, tenant: str, id: str, current: str) -> list[dict[str, Any]]:
    """The texts edits replaced in the memory ``id``, oldest first, each with what replaced it
    (the next version's text, the current text for the last)."""
    found = reads.versions(tenant, id)
    after = [v.content for v in found[1:]] + [current] if found else []
    return [
        {
            "version": v.version,
            "content": v.content,
            "valid_from": format_time(v.valid_from),
            "valid_until": format_time(v.valid_until),
            "replaced_by": replaced_by,
        }
        for v, replaced_by in zip(found, after, strict=True)
    ]


def _reason(key: Any, other_key: Any) -> str:
    # The supersessions table records no reason: a link between two memories with one subject
    # (Record.key) is that key's; any other is a change found in the text.
    if key is not None and key == other_key:
        return f"same key {key!r}"
    return "changed by a later record"


def _links(
    reads: MemoryReads, tenant: str, id: str
) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    """The memory ``id``'s supersession links: the newer memory that replaced it (None while it
    is in force) and those it replaced, oldest first."""

    def link(row: tuple[Any, ...]) -> dict[str, Any]:
        other, created_at, until, key, other_key = row
        return {
            "id": other,
            "created_at": format_time(created_at) if created_at is not None else None,
            "valid_until": format_time(until),
            "reason": _reason(key, other_key),
        }

    newer = reads._read(
        "SELECT s.superseded_by, n.created_at, s.valid_until, m.fact_key, n.fact_key "
        "FROM supersessions s JOIN memories m ON m.rowid = s.memory_rowid "
        "LEFT JOIN memories n ON n.tenant = m.tenant AND n.id = s.superseded_by "
        "WHERE m.tenant = ? AND m.id = ?",
        [tenant, id],
    )
    # no index on superseded_by: the table holds one row per superseded memory, few per tenant
    older = reads._read(
        "SELECT m.id, m.created_at, s.valid_until, m.fact_key, n.fact_key "
        "FROM supersessions s JOIN memories m ON m.rowid = s.memory_rowid "
        "JOIN memories n ON n.tenant = m.tenant AND n.id = s.superseded_by "
        "WHERE s.superseded_by = ? AND m.tenant = ? ORDER BY m.created_at, m.id",
        [id, tenant],
    )
    return (link(newer[0]) if newer else None), [link(r) for r in older]
