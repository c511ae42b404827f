"""Memory rows by rowid on SQLite, through a cache of this process's recently read rows.

A retrieval reads the same rows again and again: the session's turns come back turn after turn
(as search hits, as neighbours, as vector hits), and at 10k memories the row reads by rowid
were ~260 rows and ~1.7 ms of an ``assemble`` (``bench/query_latency.py``, ~6 us a row in the
sqlite3 module). :class:`RowCache` keeps each row as its :class:`~ctxwarden.types.Memory` when
nothing in it can be changed in place (no tool calls, attachments or metadata: those are
dicts), the same object for every reader; any other as its raw row of :data:`MEMORY_COLUMNS`
(text, numbers and None), made into a new ``Memory`` for each reader. Search hits, neighbours,
:meth:`SQLiteRows.memories_at` and the recent history's pages (their rowids first) read
through it.

What keeps it true:

- **This connection's writes.** Temporary triggers (on this connection only, never in the file)
  call :meth:`RowCache.drop` for every row inserted, changed or deleted in ``memories``, whatever
  statement or write path made the change: ingest, duplicate bumps, edits, erasure, compaction.
  An erased row's text leaves the cache with the row. A change to ``memory_access`` (the view
  ``memory_rows`` joins it: the inclusion log bumps the stats of what it includes) writes the
  new stats into the cached row (:meth:`RowCache.access`); a deleted stats row drops it.
- **Other connections' writes** (another process, a CLI run beside a server): ``PRAGMA
  data_version`` changes when another connection commits; the cache is emptied then (and the
  triggers made again, should a migration there have rebuilt the table).
- **Transactions.** A row read while a transaction is open on this connection is not cached
  (a rollback would leave it untrue); a rollback empties the cache anyway.
- **Tenants and scopes.** The cache is keyed by rowid alone, under the reads' filters: every
  caller filters rows by tenant and scope after the read, as it did when the rows came from SQL.

It holds at most :data:`ROW_CACHE_ROWS` rows (the oldest cached dropped first), ~1 KB each.

The same triggers count the changes to ``memories`` and ``aliases`` (:attr:`RowCache.generation`,
which a changed alias bumps too): :meth:`SQLiteRows._remembered` keeps the results of reads of
those two tables alone (a session's rowids for its vector search, its rowid range for its word
search, the rowids around a neighbour read's anchor; rowids and counts, never text) while the
generation stays and no other connection commits.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from collections import OrderedDict
from collections.abc import Hashable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from ctxwarden.store.reads import MEMORY_COLUMNS, memory_of, recent_sql
from ctxwarden.types import Memory

__all__ = [
    "MEMO_ENTRIES",
    "MEMO_LARGEST",
    "MEMO_ROWS",
    "ROW_CACHE_ROWS",
    "RowCache",
    "SQLiteRows",
    "install_row_triggers",
]

#: The most memory rows :class:`RowCache` holds (~1 KB a chat message: ~10 MB).
ROW_CACHE_ROWS = 10_000
#: The most results :meth:`SQLiteRows._remembered` keeps, and the most rows they hold
#: together (emptied when either is passed; ~80 bytes a row: ~8 MB): a neighbour read's few
#: rowids, a session's rowids. A result of more than :data:`MEMO_LARGEST` rows is not kept.
MEMO_ENTRIES = 4096
MEMO_ROWS = 100_000
MEMO_LARGEST = 20_000

_DROP_FUNCTION = "ctxwarden_row_changed"
_ACCESS_FUNCTION = "ctxwarden_access_changed"
#: Where the access stats are in a row of MEMORY_COLUMNS (the columns memory_access gives).
_COLUMN_NAMES = [c.strip() for c in MEMORY_COLUMNS.split(",")]
_ACCESS_AT = _COLUMN_NAMES.index("access_count")
assert _COLUMN_NAMES[_ACCESS_AT : _ACCESS_AT + 4] == [
    "access_count", "last_accessed_at", "access_score", "included_tokens_total"
]  # fmt: skip
_ROW_COLUMNS = ", ".join("m." + c.strip() for c in MEMORY_COLUMNS.split(","))
#: The temporary triggers (name, statement): every change to a row of ``memory_rows``.
_TRIGGERS = (
    *(
        (
            f"ctxwarden_rows_memories_{event.lower()}",
            f"CREATE TEMP TRIGGER IF NOT EXISTS ctxwarden_rows_memories_{event.lower()} "
            f"AFTER {event} ON main.memories BEGIN SELECT {_DROP_FUNCTION}({row}.rowid); END",
        )
        for event, row in (("INSERT", "new"), ("UPDATE", "old"), ("DELETE", "old"))
    ),
    (
        "ctxwarden_rows_memories_rowid",
        # A changed rowid (never done by ctxwarden, but possible): the new one too.
        "CREATE TEMP TRIGGER IF NOT EXISTS ctxwarden_rows_memories_rowid AFTER UPDATE OF rowid "
        f"ON main.memories BEGIN SELECT {_DROP_FUNCTION}(new.rowid); END",
    ),
    *(
        (
            f"ctxwarden_rows_access_{event.lower()}",
            # The values memory_rows gives (its coalesce()s), written into the cached row.
            f"CREATE TEMP TRIGGER IF NOT EXISTS ctxwarden_rows_access_{event.lower()} "
            f"AFTER {event} ON main.memory_access BEGIN SELECT {_ACCESS_FUNCTION}("
            "new.memory_rowid, coalesce(new.access_count, 0), new.last_accessed_at, "
            "coalesce(new.access_score, 0.0), coalesce(new.included_tokens_total, 0)); END",
        )
        for event in ("INSERT", "UPDATE")
    ),
    *(
        (
            f"ctxwarden_rows_aliases_{event.lower()}",
            # Not a row of memory_rows, but what a neighbour read follows (see SQLiteRows).
            f"CREATE TEMP TRIGGER IF NOT EXISTS ctxwarden_rows_aliases_{event.lower()} "
            f"AFTER {event} ON main.aliases BEGIN SELECT {_DROP_FUNCTION}(NULL); END",
        )
        for event in ("INSERT", "UPDATE", "DELETE")
    ),
    (
        "ctxwarden_rows_access_delete",
        "CREATE TEMP TRIGGER IF NOT EXISTS ctxwarden_rows_access_delete AFTER DELETE ON "
        f"main.memory_access BEGIN SELECT {_DROP_FUNCTION}(old.memory_rowid); END",
    ),
    (
        "ctxwarden_rows_access_moved",
        "CREATE TEMP TRIGGER IF NOT EXISTS ctxwarden_rows_access_moved AFTER UPDATE OF "
        f"memory_rowid ON main.memory_access BEGIN SELECT {_DROP_FUNCTION}(old.memory_rowid); END",
    ),
)


class RowCache:
    """Rows of :data:`MEMORY_COLUMNS` (raw, or as their ``Memory``) by rowid, at most ``limit``
    (the oldest cached go first). Thread-safe.

    >>> cache = RowCache(limit=2)
    >>> cache.keep([(1, "a"), (2, "b"), (3, "c")])
    >>> cache.take([1, 2, 3])
    ({2: (2, 'b'), 3: (3, 'c')}, [1])
    >>> cache.drop(3)
    >>> cache.take([3])
    ({}, [3])
    """

    def __init__(self, limit: int = ROW_CACHE_ROWS) -> None:
        self.limit = limit
        #: Counts the changes to ``memories`` and ``aliases`` seen (and :meth:`clear`): equal
        #: generations, no row of either changed in between (access stats aside).
        self.generation = 0
        self._rows: OrderedDict[int, tuple[Any, ...]] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._rows)

    def take(self, rowids: Iterable[int]) -> tuple[dict[int, tuple[Any, ...]], list[int]]:
        """(the cached rows of ``rowids`` by rowid, the rowids not cached, in the given order)."""
        found: dict[int, tuple[Any, ...]] = {}
        missing: list[int] = []
        with self._lock:
            rows = self._rows
            for rowid in rowids:
                row = rows.get(rowid)
                if row is None:
                    missing.append(rowid)
                else:
                    found[rowid] = row
        return found, missing

    def keep(self, rows: Iterable[tuple[Any, ...]]) -> None:
        """Cache ``rows``: each a row of :data:`MEMORY_COLUMNS` (its rowid first), or the
        :class:`~ctxwarden.types.Memory` made of one when nothing in it can change (no
        tool calls, attachments or metadata: those are dicts)."""
        with self._lock:
            cached = self._rows
            for row in rows:
                cached[int(row[0])] = row
            while len(cached) > self.limit:
                cached.popitem(last=False)

    def drop(self, rowid: int | None) -> None:
        """Forget the row at ``rowid`` (called by the triggers for every changed row; None for
        a changed alias) and count a change."""
        with self._lock:
            self.generation += 1
            if rowid is not None:
                self._rows.pop(rowid, None)

    def access(
        self, rowid: int | None, count: int, last: float | None, score: float, tokens: int
    ) -> None:
        """Write new access stats into the cached row at ``rowid``, if any (called by the
        triggers on ``memory_access``: every inclusion log bumps the stats of the memories it
        includes, and dropping those rows would empty the cache of the rows used most)."""
        if rowid is not None:
            with self._lock:
                row = self._rows.get(rowid)
                if isinstance(row, Memory):
                    self._rows[rowid] = row._replace(
                        access_count=count,
                        last_accessed_at=last,
                        access_score=score,
                        included_tokens_total=tokens,
                    )
                elif row is not None:
                    self._rows[rowid] = (
                        *row[:_ACCESS_AT],
                        count,
                        last,
                        score,
                        tokens,
                        *row[_ACCESS_AT + 4 :],
                    )

    def clear(self) -> None:
        """Forget every row."""
        with self._lock:
            self.generation += 1
            self._rows.clear()


def install_row_triggers(conn: sqlite3.Connection, cache: RowCache) -> None:
    """Make the temporary triggers that keep ``cache`` true on ``conn`` (see the module
    docstring); idempotent. The tables must exist (after the migrations)."""
    conn.create_function(_DROP_FUNCTION, 1, cache.drop, deterministic=False)
    conn.create_function(_ACCESS_FUNCTION, 5, cache.access, deterministic=False)
    for _, statement in _TRIGGERS:
        conn.execute(statement)


class SQLiteRows:
    """Memory rows by rowid through the store's :class:`RowCache` (the store supplies
    :meth:`_query`, ``_conn``, ``_lock`` and ``_rows``, made by :meth:`_open_rows`)."""

    _conn: sqlite3.Connection
    _lock: threading.RLock
    _rows: RowCache
    _rows_version: int
    _memos: dict[Hashable, tuple[int, Any]]
    _memo_rows: int

    if TYPE_CHECKING:  # supplied by the store (a stub here would shadow it in its MRO)

        def _query(self, sql: str, params: Sequence[Any]) -> list[Any]: ...

    def _open_rows(self) -> None:
        """Start the cache and its triggers (once the connection is open and migrated)."""
        self._rows = RowCache()
        self._memos = {}
        self._memo_rows = 0
        install_row_triggers(self._conn, self._rows)
        self._rows_version = int(self._conn.execute("PRAGMA data_version").fetchone()[0])

    def _check_version(self) -> None:
        """Empty the cache if another connection committed since the last look (call with
        the store's lock held)."""
        version = int(self._query("PRAGMA data_version", ())[0][0])
        if version != self._rows_version:  # another connection committed: trust nothing
            self._rows.clear()
            if not self._conn.in_transaction:  # (a rollback would undo the triggers)
                install_row_triggers(self._conn, self._rows)
                self._rows_version = version

    def _remembered(self, sql: str, params: Sequence[Any]) -> Sequence[Any]:
        """The rows of ``sql``, a read of ``memories`` and ``aliases`` only (no access
        stats, no other table), kept while no row of either changes (the cache's generation)
        and no other connection commits: a session's rowids, its rowid range, a neighbour
        read's rowids come back turn after turn. At most :data:`MEMO_ENTRIES` kept; the rows
        are a tuple (never changed by a caller)."""
        return self._remembered_all([(sql, params)])[0]

    def _remembered_all(self, reads: Sequence[tuple[str, Sequence[Any]]]) -> list[Sequence[Any]]:
        """:meth:`_remembered` of each ``(sql, params)``, with one look for other connections'
        commits (a neighbour read runs one statement per anchor: 40 in a retrieval)."""
        out: list[Sequence[Any]] = []
        with self._lock:
            self._check_version()
            generation = self._rows.generation
            memos = self._memos
            for sql, params in reads:
                key = (sql, tuple(params))
                kept = memos.get(key)
                if kept is not None and kept[0] == generation:
                    out.append(kept[1])
                    continue
                rows = tuple(self._query(sql, params))
                if (
                    not self._conn.in_transaction
                    and self._rows.generation == generation
                    and len(rows) <= MEMO_LARGEST
                ):
                    if len(memos) >= MEMO_ENTRIES or self._memo_rows + len(rows) > MEMO_ROWS:
                        memos.clear()
                        self._memo_rows = 0
                    memos[key] = (generation, rows)
                    self._memo_rows += len(rows)
                out.append(rows)
        return out

    def _stored_at(self, rowids: Sequence[int]) -> dict[int, Memory]:
        """The memories at ``rowids`` that are stored, by rowid (any tenant: the caller
        filters), from the cache or else read in one statement. A memory with nothing that can
        change in place (:func:`_frozen`) is cached as it is, and the same object given to
        every reader; any other is made anew from its cached row each time."""
        with self._lock:
            self._check_version()
            cached, missing = self._rows.take(dict.fromkeys(int(r) for r in rowids))
            found: dict[int, Memory] = {
                rowid: value if isinstance(value, Memory) else memory_of(value)
                for rowid, value in cached.items()
            }
            if missing:
                rows = self._query(
                    f"SELECT {_ROW_COLUMNS} FROM json_each(?) j "
                    "JOIN memory_rows m ON m.rowid = j.value",
                    [json.dumps(missing, separators=(",", ":"))],
                )
                kept: list[tuple[Any, ...]] = []
                for row in rows:
                    memory = found[int(row[0])] = memory_of(row)
                    kept.append(memory if _frozen(memory) else row)
                if not self._conn.in_transaction:
                    self._rows.keep(kept)
            return found

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
        time: the page's rowids (an index range scan of ``memories``, kept while its rows do
        not change, :meth:`_remembered`), then their memories through the cache. Every turn
        reads the same newest pages (~50 rows at 10k memories in ``bench/query_latency.py``)."""
        page, params = recent_sql(
            tenant, session, channel=channel, before=before, limit=limit, user=user
        )
        with self._lock:  # (one page: no write of this process between its two reads)
            rowids = [
                int(r[0]) for r in self._remembered(f"SELECT rowid FROM memories {page}", params)
            ]
            found = self._stored_at(rowids) if rowids else {}
        if len(found) < len(rowids):  # another connection deleted one in between: one read
            return super().recent(  # type: ignore[misc,no-any-return]
                tenant, session, channel=channel, before=before, limit=limit, user=user
            )
        return [found[rowid] for rowid in rowids]

    def memories_at(self, rowids: Sequence[int]) -> list[Memory]:
        """The memories at these rowids (any tenant: maintenance after embedding), in rowid
        order; rowids no longer stored are left out."""
        found = self._stored_at(rowids)
        return [found[rowid] for rowid in sorted(found)]


def _frozen(memory: Memory) -> bool:
    """Whether nothing in ``memory`` can be changed in place (its tool calls, attachments and
    metadata are dicts; the rest strings, numbers and tuples of them)."""
    return (
        not memory.tool_calls
        and not memory.attachments
        and not memory.metadata
        and all(isinstance(source, str) for source in memory.source_ids)
    )
