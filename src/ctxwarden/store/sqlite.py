"""The SQLite backend: the embedded default.

WAL journal (readers never block the writer), ``synchronous=NORMAL`` (durable across process
crashes; a power loss may drop the last commits but never corrupts), foreign keys on, a busy
timeout instead of "database is locked" errors, FTS5 for lexical search. One connection per
store object, guarded by a lock, so a store may be shared between threads.
"""

from __future__ import annotations

import json
import math
import sqlite3
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ctxwarden.errors import NotFound, StoreError
from ctxwarden.store import migrations
from ctxwarden.store.base import ContextLog, NewMemory, TokenCount, Tombstone
from ctxwarden.types import Memory

__all__ = ["ACCESS_TAU_SECONDS", "SQLiteStore"]

#: Time constant of the decayed access score ``sum exp(-(now - t_i) / tau)``: a week.
ACCESS_TAU_SECONDS = 7 * 24 * 3600.0

_MEMORY_COLUMNS = (
    "rowid, id, tenant, session, channel, author, author_kind, role, content, created_at, "
    "thread_id, reply_to, kind, pinned, name, tool_calls, tool_call_id, content_hash, dup_count, "
    "last_seen_at, access_count, last_accessed_at, access_score, included_tokens_total, "
    "source_ids, time_start, time_end, attachments, metadata"
)


def _memory(row: sqlite3.Row | tuple[Any, ...]) -> Memory:
    (
        rowid, id_, tenant, session, channel, author, author_kind, role, content, created_at,
        thread_id, reply_to, kind, pinned, name, tool_calls, tool_call_id, content_hash, dup_count,
        last_seen_at, access_count, last_accessed_at, access_score, included_tokens_total,
        source_ids, time_start, time_end, attachments, metadata,
    ) = row  # fmt: skip
    return Memory(
        rowid=rowid,
        id=id_,
        tenant=tenant,
        session=session,
        channel=channel,
        author=author,
        author_kind=author_kind,
        role=role,
        content=content,
        created_at=created_at,
        thread_id=thread_id,
        reply_to=reply_to,
        kind=kind,
        pinned=bool(pinned),
        name=name,
        tool_calls=tuple(json.loads(tool_calls)) if tool_calls else (),
        tool_call_id=tool_call_id,
        content_hash=content_hash,
        dup_count=dup_count,
        last_seen_at=last_seen_at,
        access_count=access_count,
        last_accessed_at=last_accessed_at,
        access_score=access_score,
        included_tokens_total=included_tokens_total,
        source_ids=tuple(json.loads(source_ids)) if source_ids else (),
        time_range=(time_start, time_end) if time_start is not None else None,
        attachments=tuple(json.loads(attachments)) if attachments else (),
        metadata=json.loads(metadata) if metadata else {},
    )


class _SQLiteWriter:
    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn

    def resolve(self, tenant: str, id: str) -> str | None:
        row = self._conn.execute(
            "SELECT id FROM memories WHERE tenant = ? AND id = ?", (tenant, id)
        ).fetchone()
        if row:
            return str(row[0])
        row = self._conn.execute(
            "SELECT m.id FROM aliases a JOIN memories m ON m.rowid = a.memory_rowid "
            "WHERE a.tenant = ? AND a.id = ?",
            (tenant, id),
        ).fetchone()
        if row:
            return str(row[0])
        row = self._conn.execute(
            "SELECT m.id FROM tombstones t JOIN memories m "
            "ON m.tenant = t.tenant AND m.id = t.summary_id WHERE t.tenant = ? AND t.id = ?",
            (tenant, id),
        ).fetchone()
        return str(row[0]) if row else None

    def find_exact(
        self, tenant: str, channel: str | None, content_hash: str, since: float
    ) -> tuple[int, str] | None:
        row = self._conn.execute(
            "SELECT rowid, id FROM memories WHERE tenant = ? AND channel IS ? "
            "AND content_hash = ? AND last_seen_at >= ? ORDER BY last_seen_at DESC LIMIT 1",
            (tenant, channel, content_hash, since),
        ).fetchone()
        return (int(row[0]), str(row[1])) if row else None

    def insert(self, memory: NewMemory) -> int:
        cursor = self._conn.execute(
            "INSERT INTO memories (id, tenant, session, channel, author, author_kind, role, "
            "content, created_at, thread_id, reply_to, kind, pinned, name, tool_calls, "
            "tool_call_id, attachments, metadata, content_hash, near_key, last_seen_at, "
            "source_ids, time_start, time_end) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
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
                int(memory.pinned),
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
            ),
        )
        rowid = cursor.lastrowid
        assert rowid is not None
        return rowid

    def fold(self, rowid: int, *, alias: str, status: str, seen_at: float) -> None:
        self._conn.execute(
            "UPDATE memories SET dup_count = dup_count + 1, "
            "last_seen_at = max(last_seen_at, ?) WHERE rowid = ?",
            (seen_at, rowid),
        )
        tenant = self._conn.execute(
            "SELECT tenant FROM memories WHERE rowid = ?", (rowid,)
        ).fetchone()[0]
        self._conn.execute(
            "INSERT INTO aliases (tenant, id, memory_rowid, status, created_at) "
            "VALUES (?, ?, ?, ?, ?)",
            (tenant, alias, rowid, status, seen_at),
        )

    def put_token_counts(self, counts: Sequence[TokenCount]) -> None:
        self._conn.executemany(
            "INSERT OR REPLACE INTO token_counts (memory_rowid, tokenizer, message, line) "
            "VALUES (?, ?, ?, ?)",
            [(c.rowid, c.tokenizer, c.message, c.line) for c in counts],
        )

    def retire(
        self,
        tenant: str,
        ids: Sequence[str],
        *,
        summary_rowid: int,
        deleted_at: float,
        reason: str,
    ) -> int:
        summary_id = self._conn.execute(
            "SELECT id FROM memories WHERE rowid = ? AND tenant = ?", (summary_rowid, tenant)
        ).fetchone()
        if summary_id is None:
            raise StoreError(f"retire: no summary with rowid {summary_rowid} in {tenant!r}")
        retired = 0
        for id_ in ids:
            row = self._conn.execute(
                "SELECT rowid, content_hash, created_at, last_seen_at, time_start, time_end "
                "FROM memories WHERE tenant = ? AND id = ?",
                (tenant, id_),
            ).fetchone()
            if row is None or row[0] == summary_rowid:
                continue
            rowid, content_hash, created, last_seen, start, end = row
            # Aliases first: deleting the row would cascade them away.
            self._conn.execute(
                "UPDATE aliases SET memory_rowid = ? WHERE memory_rowid = ?", (summary_rowid, rowid)
            )
            # The id itself resolves through its tombstone (no alias row: that would repeat it).
            self._conn.execute(
                "UPDATE tombstones SET summary_id = ? WHERE tenant = ? AND summary_id = ?",
                (summary_id[0], tenant, id_),
            )
            self._conn.execute(
                "INSERT OR REPLACE INTO tombstones (tenant, id, deleted_at, summary_id, "
                "content_hash, time_start, time_end, reason) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    tenant,
                    id_,
                    deleted_at,
                    summary_id[0],
                    content_hash,
                    start if start is not None else created,
                    end if end is not None else last_seen,
                    reason,
                ),
            )
            self._conn.execute("DELETE FROM memories WHERE rowid = ?", (rowid,))
            retired += 1
        return retired


class SQLiteStore:
    """SQLite storage for ctxwarden. ``SQLiteStore(":memory:")`` for tests.

    >>> store = SQLiteStore(":memory:")
    >>> store.stats("default")["memories"]
    0
    """

    def __init__(self, path: str | Path) -> None:
        self.path = str(path)
        self._lock = threading.RLock()
        try:
            if self.path != ":memory:":
                Path(self.path).parent.mkdir(parents=True, exist_ok=True)
            self._conn = sqlite3.connect(
                self.path, isolation_level=None, check_same_thread=False, timeout=30.0
            )
            self._conn.execute("PRAGMA journal_mode = WAL")
            self._conn.execute("PRAGMA synchronous = NORMAL")
            self._conn.execute("PRAGMA foreign_keys = ON")
            self._conn.execute("PRAGMA busy_timeout = 30000")
            migrations.apply(self._conn)
        except sqlite3.DatabaseError as exc:
            raise StoreError(f"cannot open SQLite database {self.path}: {exc}") from exc
        self._closed = False

    # -- writes -----------------------------------------------------------------------------

    @contextmanager
    def write(self) -> Iterator[_SQLiteWriter]:
        """One write transaction (BEGIN IMMEDIATE ... COMMIT, ROLLBACK on error)."""
        with self._lock:
            self._check_open()
            try:
                self._conn.execute("BEGIN IMMEDIATE")
            except sqlite3.DatabaseError as exc:
                raise StoreError(f"cannot start a write transaction: {exc}") from exc
            try:
                yield _SQLiteWriter(self._conn)
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
            try:
                self._conn.execute("COMMIT")
            except sqlite3.DatabaseError as exc:
                self._conn.execute("ROLLBACK")
                raise StoreError(f"commit failed: {exc}") from exc

    def put_token_counts(self, counts: Sequence[TokenCount]) -> None:
        """Cache token counts computed after ingest."""
        if not counts:
            return
        with self.write() as writer:
            writer.put_token_counts(counts)

    def log_context(self, entry: ContextLog) -> None:
        """Write the inclusion log and bump access stats (count, time, decayed score, tokens)."""
        with self.write():
            cursor = self._conn.execute(
                "INSERT INTO contexts (id, tenant, session, created_at, model, tokenizer, exact, "
                "cap, tokens, blocks) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    entry.id,
                    entry.tenant,
                    entry.session,
                    entry.created_at,
                    entry.model,
                    entry.tokenizer,
                    int(entry.exact),
                    entry.cap,
                    entry.tokens,
                    json.dumps(entry.blocks, separators=(",", ":")),
                ),
            )
            context_rowid = cursor.lastrowid
            self._conn.executemany(
                "INSERT INTO inclusions (context_rowid, position, memory_id, block, tokens) "
                "VALUES (?, ?, ?, ?, ?)",
                [
                    (context_rowid, position, inc.id, inc.block, inc.tokens)
                    for position, inc in enumerate(entry.inclusions)
                ],
            )
            now = entry.created_at
            self._conn.executemany(
                "UPDATE memories SET access_count = access_count + 1, last_accessed_at = ?, "
                "access_score = access_score * exp(-max(0.0, ? - coalesce(access_score_at, ?)) "
                "/ ?) + 1.0, access_score_at = ?, "
                "included_tokens_total = included_tokens_total + ? WHERE rowid = ?",
                [
                    (now, now, now, ACCESS_TAU_SECONDS, now, inc.tokens, inc.rowid)
                    for inc in entry.inclusions
                ],
            )

    # -- reads ------------------------------------------------------------------------------

    def _query(self, sql: str, params: Sequence[Any]) -> list[Any]:
        with self._lock:
            self._check_open()
            try:
                return self._conn.execute(sql, params).fetchall()
            except sqlite3.DatabaseError as exc:
                raise StoreError(f"query failed: {exc}") from exc

    def get(self, tenant: str, id: str) -> Memory:
        """The memory with this id, or the aggregate it was folded into (alias), or the summary
        that absorbed it (tombstone)."""
        rows = self._query(
            f"SELECT {_MEMORY_COLUMNS} FROM memories WHERE tenant = ? AND id = ?", (tenant, id)
        )
        if not rows:
            rows = self._query(
                f"SELECT {_MEMORY_COLUMNS} FROM memories WHERE rowid = "
                "(SELECT memory_rowid FROM aliases WHERE tenant = ? AND id = ?)",
                (tenant, id),
            )
        if not rows:
            rows = self._query(
                f"SELECT {_MEMORY_COLUMNS} FROM memories WHERE tenant = ? AND id = "
                "(SELECT summary_id FROM tombstones WHERE tenant = ? AND id = ?)",
                (tenant, tenant, id),
            )
        if not rows:
            raise NotFound(f"no memory with id {id!r} in tenant {tenant!r}")
        return _memory(rows[0])

    def recent(
        self,
        tenant: str,
        session: str,
        *,
        channel: str | None = None,
        before: tuple[float, int] | None = None,
        limit: int = 64,
    ) -> list[Memory]:
        """The session's messages, newest first, a page at a time (index range scan)."""
        where = ["tenant = ?", "session = ?", "kind = 'message'"]
        params: list[Any] = [tenant, session]
        if channel is not None:
            where.append("channel = ?")
            params.append(channel)
        if before is not None:
            where.append("(created_at, rowid) < (?, ?)")
            params.extend(before)
        params.append(limit)
        rows = self._query(
            f"SELECT {_MEMORY_COLUMNS} FROM memories WHERE {' AND '.join(where)} "
            "ORDER BY created_at DESC, rowid DESC LIMIT ?",
            params,
        )
        return [_memory(r) for r in rows]

    def pinned(self, tenant: str, *, session: str | None = None) -> list[Memory]:
        """Pinned memories and facts of the tenant (and of ``session`` when given)."""
        params: list[Any] = [tenant]
        extra = ""
        if session is not None:
            extra = " AND session = ?"
            params.append(session)
        rows = self._query(
            f"SELECT {_MEMORY_COLUMNS} FROM memories WHERE tenant = ? "
            f"AND (pinned = 1 OR kind = 'fact'){extra} ORDER BY created_at, rowid",
            params,
        )
        return [_memory(r) for r in rows]

    def summaries(self, tenant: str, *, session: str | None = None) -> list[Memory]:
        """Summary memories, oldest first."""
        params: list[Any] = [tenant]
        extra = ""
        if session is not None:
            extra = " AND session = ?"
            params.append(session)
        rows = self._query(
            f"SELECT {_MEMORY_COLUMNS} FROM memories WHERE tenant = ? AND kind = 'summary'"
            f"{extra} ORDER BY created_at, rowid",
            params,
        )
        return [_memory(r) for r in rows]

    def search(
        self, tenant: str, terms: Sequence[str], *, limit: int = 100
    ) -> list[tuple[Memory, float]]:
        """FTS5 BM25 over content; any term may match. Scores are positive, higher is better."""
        if not terms:
            return []
        match = " OR ".join('"' + t.replace('"', '""') + '"' for t in terms)
        rows = self._query(
            f"SELECT {', '.join('m.' + c.strip() for c in _MEMORY_COLUMNS.split(','))}, "
            "bm25(memories_fts) AS rank FROM memories_fts JOIN memories m "
            "ON m.rowid = memories_fts.rowid WHERE memories_fts MATCH ? AND m.tenant = ? "
            "ORDER BY rank, m.rowid LIMIT ?",
            (match, tenant, limit),
        )
        return [(_memory(r[:-1]), -float(r[-1])) for r in rows]

    def token_counts(self, rowids: Sequence[int], tokenizer: str) -> dict[int, TokenCount]:
        """Cached counts for these rowids under ``tokenizer``."""
        out: dict[int, TokenCount] = {}
        ids = list(rowids)
        for start in range(0, len(ids), 500):
            chunk = ids[start : start + 500]
            marks = ",".join("?" * len(chunk))
            for rowid, message, line in self._query(
                f"SELECT memory_rowid, message, line FROM token_counts WHERE tokenizer = ? "
                f"AND memory_rowid IN ({marks})",
                [tokenizer, *chunk],
            ):
                out[rowid] = TokenCount(
                    rowid=rowid, tokenizer=tokenizer, message=message, line=line
                )
        return out

    def inclusions(self, context_id: str) -> list[dict[str, Any]]:
        """The inclusion log of one context, in order."""
        rows = self._query(
            "SELECT i.memory_id, i.block, i.tokens FROM inclusions i JOIN contexts c "
            "ON c.rowid = i.context_rowid WHERE c.id = ? ORDER BY i.position",
            (context_id,),
        )
        return [{"memory_id": r[0], "block": r[1], "tokens": r[2]} for r in rows]

    def stats(self, tenant: str) -> dict[str, Any]:
        """Per-channel counts: records seen, memories stored, duplicates folded."""
        channels: dict[str, dict[str, int]] = {}
        for channel, memories, seen in self._query(
            "SELECT coalesce(channel, ''), count(*), sum(dup_count) FROM memories "
            "WHERE tenant = ? GROUP BY 1 ORDER BY 1",
            (tenant,),
        ):
            channels[channel] = {
                "memories": memories,
                "seen": seen,
                "folded": seen - memories,
            }
        top = [
            {"id": r[0], "channel": r[1], "author": r[2], "count": r[3], "content": r[4]}
            for r in self._query(
                "SELECT id, channel, author, dup_count, substr(content, 1, 120) FROM memories "
                "WHERE tenant = ? AND dup_count > 1 ORDER BY dup_count DESC, rowid LIMIT 10",
                (tenant,),
            )
        ]
        contexts = self._query("SELECT count(*) FROM contexts WHERE tenant = ?", (tenant,))[0][0]
        memories = sum(c["memories"] for c in channels.values())
        seen = sum(c["seen"] for c in channels.values())
        return {
            "memories": memories,
            "seen": seen,
            "folded": seen - memories,
            "contexts": contexts,
            "channels": channels,
            "top_families": top,
        }

    def compaction_candidates(
        self, tenant: str, *, created_before: float
    ) -> list[tuple[Memory, float | None]]:
        """Unpinned messages created and last seen before ``created_before``, oldest first."""
        rows = self._query(
            f"SELECT {_MEMORY_COLUMNS}, access_score_at FROM memories WHERE tenant = ? "
            "AND kind = 'message' AND pinned = 0 AND created_at < ? AND last_seen_at < ? "
            "ORDER BY created_at, rowid",
            (tenant, created_before, created_before),
        )
        return [(_memory(r[:-1]), r[-1]) for r in rows]

    def tombstones(self, tenant: str, *, summary_id: str | None = None) -> list[Tombstone]:
        """Tombstones of ``tenant`` (pointing at ``summary_id`` when given), by id."""
        params: list[Any] = [tenant]
        extra = ""
        if summary_id is not None:
            extra = " AND summary_id = ?"
            params.append(summary_id)
        rows = self._query(
            "SELECT tenant, id, deleted_at, summary_id, content_hash, time_start, time_end, "
            f"reason FROM tombstones WHERE tenant = ?{extra} ORDER BY id",
            params,
        )
        return [
            Tombstone(
                tenant=r[0],
                id=r[1],
                deleted_at=r[2],
                summary_id=r[3],
                content_hash=r[4],
                time_range=(r[5], r[6]) if r[5] is not None else None,
                reason=r[7],
            )
            for r in rows
        ]

    def vacuum(self) -> None:
        """Reclaim space after compaction (SQLite-only maintenance, not in the protocol):
        merges FTS5 segments so deleted rows' tokens leave the index, then VACUUMs."""
        with self._lock:
            self._check_open()
            try:
                self._conn.execute("INSERT INTO memories_fts (memories_fts) VALUES ('optimize')")
                self._conn.execute("VACUUM")
                self._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            except sqlite3.DatabaseError as exc:
                raise StoreError(f"vacuum failed: {exc}") from exc

    def iter_memories(self, tenant: str) -> Iterator[Memory]:
        """Every memory of ``tenant``, oldest first, a page at a time."""
        last = (-math.inf, -1)
        while True:
            rows = self._query(
                f"SELECT {_MEMORY_COLUMNS} FROM memories WHERE tenant = ? "
                "AND (created_at, rowid) > (?, ?) ORDER BY created_at, rowid LIMIT 500",
                (tenant, *last),
            )
            if not rows:
                return
            for row in rows:
                yield _memory(row)
            last = (rows[-1][9], rows[-1][0])

    def integrity_check(self) -> str:
        """``PRAGMA integrity_check``'s answer ("ok" when sound)."""
        return str(self._query("PRAGMA integrity_check", ())[0][0])

    def close(self) -> None:
        """Close the connection. Idempotent."""
        with self._lock:
            if not self._closed:
                self._closed = True
                self._conn.close()

    def _check_open(self) -> None:
        if self._closed:
            raise StoreError("the store is closed; open a new one")
