"""Named, versioned schema migrations for the SQLite backend.

The schema is a contract: each migration has a number and a name, ``plan()`` lists what is
pending without writing, ``apply()`` runs the pending ones, each in its own transaction, and
records the version in ``PRAGMA user_version``. The tables (the DESIGN.md data model):

- ``memories``: one row per stored memory (messages, summaries, facts, pinned notes), with the
  caller's id kept (unique per tenant), aggregate fields (``dup_count``, ``last_seen_at``), access
  fields and summary provenance (``source_ids``, ``time_start``/``time_end``).
- ``aliases``: ids of records folded into an aggregate (and of compacted memories), so a lookup by
  any id the caller ever sent finds where its content lives.
- ``memories_fts``: FTS5 over content (external content, kept in step by triggers).
- ``token_counts``: per memory and tokenizer, the tokens of its rendered message and line,
  counted once.
- ``contexts`` and ``inclusions``: the inclusion log.
- ``tombstones``: content-free records of deleted memories.
- ``api_keys`` (migration ``serve_api_keys``): API keys of the servers, each with a tenant and
  scopes; only a SHA-256 of the secret is kept.

Migration 3 (``dedupe``) adds ``memories.latest_content`` (the newest folded member's content when
its values differ from the aggregate's, so the model sees the value now in force; its time is
``last_seen_at``), the layer-B index ``memories_near`` on (tenant, channel, near_key,
last_seen_at) and ``memories_exact_session`` on (tenant, session, content_hash, last_seen_at) for
``exact_scope = "session"``, and drops the row-level ``memories_fts_insert`` trigger: the
SQLite writer indexes the rows it inserted in one statement when its transaction commits (the
update and delete triggers stay).

Migration 4 (``compaction``) drops ``tombstones_summary``: compaction leaves one tombstone per
original, and that index was ~40 % of their bytes. The lookup it served (tombstones naming a
given summary) is needed only when summaries are themselves summarised (sliding-window merges),
which then scan the tenant's tombstones once per merge.

Migration 5 (``vectors``) adds:

- ``memory_vectors`` (migration ``vectors``): one embedding per memory and embedding model
  (float16 little-endian bytes, its length in ``dim``), removed with its memory by cascade; the
  model's name is kept so vectors of different models are never mixed.
- ``vector_changes`` (migration ``vectors``): an append-only log of which memory's vector of which
  model changed (filled by triggers, cascades included). The in-memory HNSW index replays it from
  the sequence number it last saw, so it stays consistent through deletes and through writes by
  other processes.

Migration 6 (``ingest_indexes``) rebuilds the de-dup lookup indexes ``memories_exact``,
``memories_exact_session`` and ``memories_near`` with ``last_seen_at`` before the key: keyed by a
hash first, every new row landed on a random leaf page of each, and ingest slowed as the store
grew; time first, new rows append and a lookup reads the window's index entries.

Migration 7 (``neighbour_indexes``) adds ``memories_reply`` and ``memories_thread`` (partial) for
retrieval's neighbour expansion.

Migration 8 (``access_stats``) moves the access stats (``access_count``, ``last_accessed_at``,
``access_score`` and its time ``access_score_at``, ``included_tokens_total``) out of ``memories``
into ``memory_access``, one narrow row per memory ever included in a context (keyed by its
rowid, removed with it by cascade), copying the existing stats and dropping the old columns. The
inclusion log upserts these rows instead of rewriting ~100 wide memory rows per context. Reads of
whole memories select from the view ``memory_rows``: ``memories`` LEFT JOINed with
``memory_access``, a memory never included reading as zero (``m.*``: SQLite expands it when the
schema is read, so later columns of ``memories`` appear in the view).

Migration 9 (``inclusions_unindexed``) drops ``inclusions_memory``: no query reads the inclusion
log by memory id, and the index's random inserts were most of the pages each context's log wrote.

Migration 10 (``dedupe_buckets``) rebuilds ``memories_exact``, ``memories_exact_session`` and
``memories_near`` once more, keyed by (tenant, channel or session, the 5-minute bucket of
``last_seen_at`` (``CAST(last_seen_at / 300 AS INTEGER)``), key): new rows still land in the
newest bucket of their channel or session (writes stay local, as with migration 6), and a
lookup of a few keys probes each bucket of the window for each key (a dozen index seeks for a
1-hour window) instead of reading every index entry of the window.
Migration 11 (``end_user``) adds ``memories.end_user`` (the record's ``user``: the end user a
memory belongs to, NULL for none) and ``memories_user`` on (tenant, end_user, kind, created_at,
rowid) for reads scoped to an end user, ``memories.pin_scope`` (where a pin shows; pins made
before become tenant pins, as they were shown), marks messages no record may fold into (an
agent's turns, tool calls and results, untrusted records: ``content_hash`` prefixed with
``dedupe.UNFOLDABLE``), and recreates ``memory_rows``.

Migration 13 (``memory_versions``) adds ``memory_versions``: the text an edit replaced (a known
id ingested again with other content, or ``Engine.update``), one row per superseded version
numbered from 1, with the time it was in force from (``valid_from``: the memory's creation or
the previous edit) and until (``valid_until``: the edit); removed with its memory by cascade.
``EngineConfig.edit_history = "erase"`` keeps none.

Migration 14 (``fact_keys``) adds ``memories.fact_key`` (a fact's or pin's subject,
``Record.key``) with ``memories_fact_key``, and ``supersessions``: for each memory a newer one
with the same key (tenant and end user) replaced, the successor's id and ``valid_until`` (the
successor's time); removed with the memory by cascade.

Migration 16 (``archive``) adds ``archived_memories``: with
``CompactionPolicy(keep_originals="archive")`` compaction keeps the originals it retires into
one summary here, one row per summary: their records (the columns of ``memory_rows``) as one
zlib-compressed JSON array (``codec``, ``record``; a cluster compresses about three times
better than its messages one by one), how many (``originals``), the summary's session (erasure
by session) and the time they expire (``expires_at``: the retention in days after compaction;
purged by the next compaction or ``Engine.purge_archive``). Erasure rewrites a row without the
records it erases, or deletes it with its summary.
Migration 18 (``attachment_search``) makes attachments searchable: ``memories.attachment_text``
holds each attachment's name and caption (:func:`ctxwarden.attachments.search_text`, written
by ingest, filled here for older rows), ``memories_fts`` is rebuilt with it as a second column
(its triggers take both columns out and put them back), and the token counts of rows with
attachments are dropped (they are now rendered after the content; each is counted again when
assembly needs it).

Migration 20 (``script_bigrams``) makes text in scripts written without spaces searchable
(Chinese, Japanese, Korean, Thai, Lao, Khmer, Myanmar): ``memories.bigram_text`` holds the
character bigrams of such runs in the content and the attachment text
(:func:`ctxwarden.segment.bigram_text`, NULL for rows without any; written by the store's
writers, filled here for older rows), and ``memories_fts`` is rebuilt with it as a third
column (its triggers take the three columns out and put them back).

Migration 21 (``tombstone_groups``) replaces ``tombstones`` (a row per retired id) by
``tombstone_groups`` (a row per set of ids retired together: one summary's, one erasure's) and
``tombstone_keys`` (a 32-bit hash of each id, to find its group); the old rows are moved into
groups and the table dropped (:mod:`ctxwarden.store.tombstones`,
:mod:`ctxwarden.store.tombstone_migration`).

Migration 22 (``quoted_breaks``) drops the cached token counts of the rows whose rendering
changed when quoted text began to escape every line break (U+0085, U+2028 and U+2029 in quoted
content; an untrusted author holding any line break): content holding one of the three, an
author holding any (each is counted again when assembly needs it).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from dataclasses import dataclass

from ctxwarden.segment import bigram_text
from ctxwarden.store import tombstone_migration

__all__ = ["MIGRATIONS", "Migration", "apply", "plan"]


@dataclass(frozen=True, kw_only=True, slots=True)
class Migration:
    """One schema step: its version, a name, the statements it runs, and then (in the same
    transaction) ``fill``: a step in Python, for values SQL cannot compute."""

    version: int
    name: str
    statements: tuple[str, ...]
    fill: Callable[[sqlite3.Connection], None] | None = None


#: Migration 14 (``fact_keys``).
_FACT_KEYS = (
    # A fact's or pin's subject: a newer memory with the same key (tenant, end user) supersedes.
    "ALTER TABLE memories ADD COLUMN fact_key TEXT",
    "CREATE INDEX memories_fact_key ON memories (tenant, fact_key) WHERE fact_key IS NOT NULL",
    # One row per superseded memory: its successor's id and when it stopped being in force.
    """
    CREATE TABLE supersessions (
        memory_rowid INTEGER PRIMARY KEY REFERENCES memories (rowid) ON DELETE CASCADE,
        superseded_by TEXT NOT NULL,
        valid_until REAL NOT NULL
    )
    """,
)

#: Migration 18 (``attachment_search``).
_ATTACHMENT_SEARCH = (
    # The words of a row's attachments that search reads (attachments.search_text: each one's
    # name and caption, space-separated), written by ingest; filled here for the rows before.
    "ALTER TABLE memories ADD COLUMN attachment_text TEXT",
    """
    UPDATE memories SET attachment_text = (
        SELECT group_concat(trim(coalesce(replace(replace(replace(replace(
                   json_extract(a.value, '$.name'), '.', ' '), '_', ' '), '-', ' '), '/', ' '),
                   '') || ' ' || coalesce(json_extract(a.value, '$.caption'), '')), ' ')
        FROM json_each(memories.attachments) a WHERE a.type = 'object'
    ) WHERE attachments IS NOT NULL
    """,
    "DROP TRIGGER memories_fts_delete",
    "DROP TRIGGER memories_fts_update",
    "DROP TABLE memories_fts",
    """
    CREATE VIRTUAL TABLE memories_fts USING fts5 (
        content, attachment_text, content='memories', content_rowid='rowid',
        tokenize='porter unicode61 remove_diacritics 2'
    )
    """,
    "INSERT INTO memories_fts (memories_fts) VALUES ('rebuild')",
    """
    CREATE TRIGGER memories_fts_delete AFTER DELETE ON memories BEGIN
        INSERT INTO memories_fts (memories_fts, rowid, content, attachment_text)
        VALUES ('delete', old.rowid, old.content, old.attachment_text);
    END
    """,
    """
    CREATE TRIGGER memories_fts_update AFTER UPDATE OF content, attachment_text ON memories
    BEGIN
        INSERT INTO memories_fts (memories_fts, rowid, content, attachment_text)
        VALUES ('delete', old.rowid, old.content, old.attachment_text);
        INSERT INTO memories_fts (rowid, content, attachment_text)
        VALUES (new.rowid, new.content, new.attachment_text);
    END
    """,
    # Attachments are now rendered after the content: their rows' cached counts are stale.
    "DELETE FROM token_counts WHERE memory_rowid IN "
    "(SELECT rowid FROM memories WHERE attachments IS NOT NULL)",
)

#: The line breaks :meth:`str.splitlines` knows, as SQL ``char()`` code points.
_BREAK_CODES = (10, 13, 11, 12, 28, 29, 30, 133, 8232, 8233)

#: Migration 22 (``quoted_breaks``): the rows whose quoted rendering now escapes more breaks.
_QUOTED_BREAKS = (
    "DELETE FROM token_counts WHERE memory_rowid IN (SELECT rowid FROM memories WHERE "
    + " OR ".join(f"instr(content, char({c})) > 0" for c in (133, 8232, 8233))
    + " OR "
    + " OR ".join(f"instr(author, char({c})) > 0" for c in _BREAK_CODES)
    + ")",
)

#: Migration 20 (``script_bigrams``).
_SCRIPT_BIGRAMS = (
    # The bigrams of runs in scripts written without spaces (ctxwarden.segment), NULL for rows
    # without any (most): written by the writers, filled for older rows by _fill_bigrams.
    "ALTER TABLE memories ADD COLUMN bigram_text TEXT",
    "DROP TRIGGER memories_fts_delete",
    "DROP TRIGGER memories_fts_update",
    "DROP TABLE memories_fts",
)
#: ... and after the fill (no trigger sees it), the index over the three columns.
_SCRIPT_BIGRAMS_INDEX = (
    """
    CREATE VIRTUAL TABLE memories_fts USING fts5 (
        content, attachment_text, bigram_text, content='memories', content_rowid='rowid',
        tokenize='porter unicode61 remove_diacritics 2'
    )
    """,
    """
    CREATE TRIGGER memories_fts_delete AFTER DELETE ON memories BEGIN
        INSERT INTO memories_fts (memories_fts, rowid, content, attachment_text, bigram_text)
        VALUES ('delete', old.rowid, old.content, old.attachment_text, old.bigram_text);
    END
    """,
    """
    CREATE TRIGGER memories_fts_update AFTER UPDATE OF content, attachment_text, bigram_text
    ON memories BEGIN
        INSERT INTO memories_fts (memories_fts, rowid, content, attachment_text, bigram_text)
        VALUES ('delete', old.rowid, old.content, old.attachment_text, old.bigram_text);
        INSERT INTO memories_fts (rowid, content, attachment_text, bigram_text)
        VALUES (new.rowid, new.content, new.attachment_text, new.bigram_text);
    END
    """,
    "INSERT INTO memories_fts (memories_fts) VALUES ('rebuild')",
)


def _fill_tombstone_groups(conn: sqlite3.Connection) -> None:
    tombstone_migration.fill_groups(conn.execute, "?")


def _fill_bigrams(conn: sqlite3.Connection) -> None:
    """Migration 20's fill: ``bigram_text`` of the rows before it (the old index and its
    triggers are gone), then the index over the three columns, built from every row once."""
    last = 0
    while rows := conn.execute(
        "SELECT rowid, content, attachment_text FROM memories WHERE rowid > ? "
        "ORDER BY rowid LIMIT 2000",
        (last,),
    ).fetchall():
        last = int(rows[-1][0])
        found = []
        for rowid, content, attachments in rows:
            bigrams = bigram_text(f"{content} {attachments}" if attachments else content)
            if bigrams is not None:
                found.append((bigrams, rowid))
        conn.executemany("UPDATE memories SET bigram_text = ? WHERE rowid = ?", found)
    for statement in _SCRIPT_BIGRAMS_INDEX:
        conn.execute(statement)


MIGRATIONS: tuple[Migration, ...] = (
    Migration(
        version=1,
        name="initial",
        statements=(
            """
            CREATE TABLE memories (
                rowid INTEGER PRIMARY KEY,
                id TEXT NOT NULL,
                tenant TEXT NOT NULL,
                session TEXT NOT NULL,
                channel TEXT,
                author TEXT,
                author_kind TEXT NOT NULL,
                role TEXT NOT NULL,
                content TEXT NOT NULL,
                created_at REAL NOT NULL,
                thread_id TEXT,
                reply_to TEXT,
                kind TEXT NOT NULL,
                pinned INTEGER NOT NULL DEFAULT 0,
                name TEXT,
                tool_calls TEXT,
                tool_call_id TEXT,
                attachments TEXT,
                metadata TEXT,
                content_hash TEXT NOT NULL,
                near_key TEXT,
                dup_count INTEGER NOT NULL DEFAULT 1,
                last_seen_at REAL NOT NULL,
                access_count INTEGER NOT NULL DEFAULT 0,
                last_accessed_at REAL,
                access_score REAL NOT NULL DEFAULT 0,
                access_score_at REAL,
                included_tokens_total INTEGER NOT NULL DEFAULT 0,
                source_ids TEXT,
                time_start REAL,
                time_end REAL,
                UNIQUE (tenant, id)
            )
            """,
            "CREATE INDEX memories_recent ON memories (tenant, session, kind, created_at, rowid)",
            """CREATE INDEX memories_channel_recent
               ON memories (tenant, session, channel, kind, created_at, rowid)""",
            """CREATE INDEX memories_exact
               ON memories (tenant, channel, content_hash, last_seen_at)""",
            "CREATE INDEX memories_kind ON memories (tenant, kind, created_at)",
            "CREATE INDEX memories_pinned ON memories (tenant, pinned) WHERE pinned = 1",
            """
            CREATE TABLE aliases (
                tenant TEXT NOT NULL,
                id TEXT NOT NULL,
                memory_rowid INTEGER NOT NULL REFERENCES memories (rowid) ON DELETE CASCADE,
                status TEXT NOT NULL,
                created_at REAL NOT NULL,
                PRIMARY KEY (tenant, id)
            ) WITHOUT ROWID
            """,
            "CREATE INDEX aliases_memory ON aliases (memory_rowid)",
            """
            CREATE VIRTUAL TABLE memories_fts USING fts5 (
                content, content='memories', content_rowid='rowid',
                tokenize='porter unicode61 remove_diacritics 2'
            )
            """,
            """
            CREATE TRIGGER memories_fts_insert AFTER INSERT ON memories BEGIN
                INSERT INTO memories_fts (rowid, content) VALUES (new.rowid, new.content);
            END
            """,
            """
            CREATE TRIGGER memories_fts_delete AFTER DELETE ON memories BEGIN
                INSERT INTO memories_fts (memories_fts, rowid, content)
                VALUES ('delete', old.rowid, old.content);
            END
            """,
            """
            CREATE TRIGGER memories_fts_update AFTER UPDATE OF content ON memories BEGIN
                INSERT INTO memories_fts (memories_fts, rowid, content)
                VALUES ('delete', old.rowid, old.content);
                INSERT INTO memories_fts (rowid, content) VALUES (new.rowid, new.content);
            END
            """,
            """
            CREATE TABLE token_counts (
                memory_rowid INTEGER NOT NULL REFERENCES memories (rowid) ON DELETE CASCADE,
                tokenizer TEXT NOT NULL,
                message INTEGER NOT NULL,
                line INTEGER NOT NULL,
                PRIMARY KEY (memory_rowid, tokenizer)
            ) WITHOUT ROWID
            """,
            """
            CREATE TABLE contexts (
                rowid INTEGER PRIMARY KEY,
                id TEXT NOT NULL UNIQUE,
                tenant TEXT NOT NULL,
                session TEXT NOT NULL,
                created_at REAL NOT NULL,
                model TEXT NOT NULL,
                tokenizer TEXT NOT NULL,
                exact INTEGER NOT NULL,
                cap INTEGER NOT NULL,
                tokens INTEGER NOT NULL,
                blocks TEXT NOT NULL
            )
            """,
            "CREATE INDEX contexts_session ON contexts (tenant, session, created_at)",
            """
            CREATE TABLE inclusions (
                context_rowid INTEGER NOT NULL REFERENCES contexts (rowid) ON DELETE CASCADE,
                position INTEGER NOT NULL,
                memory_id TEXT NOT NULL,
                block TEXT NOT NULL,
                tokens INTEGER NOT NULL,
                PRIMARY KEY (context_rowid, position)
            ) WITHOUT ROWID
            """,
            "CREATE INDEX inclusions_memory ON inclusions (memory_id)",
            """
            CREATE TABLE tombstones (
                tenant TEXT NOT NULL,
                id TEXT NOT NULL,
                deleted_at REAL NOT NULL,
                summary_id TEXT,
                content_hash TEXT NOT NULL,
                time_start REAL,
                time_end REAL,
                reason TEXT NOT NULL,
                PRIMARY KEY (tenant, id)
            ) WITHOUT ROWID
            """,
            "CREATE INDEX tombstones_summary ON tombstones (tenant, summary_id)",
        ),
    ),
    Migration(
        version=2,
        name="serve_api_keys",
        statements=(
            """
            CREATE TABLE api_keys (
                key_id TEXT PRIMARY KEY,
                tenant TEXT NOT NULL,
                scopes TEXT NOT NULL,
                secret_hash TEXT NOT NULL,
                name TEXT,
                created_at REAL NOT NULL,
                revoked_at REAL
            ) WITHOUT ROWID
            """,
            "CREATE INDEX api_keys_tenant ON api_keys (tenant)",
        ),
    ),
    Migration(
        version=3,
        name="dedupe",
        statements=(
            "ALTER TABLE memories ADD COLUMN latest_content TEXT",
            """CREATE INDEX memories_near
               ON memories (tenant, channel, near_key, last_seen_at) WHERE near_key IS NOT NULL""",
            """CREATE INDEX memories_exact_session
               ON memories (tenant, session, content_hash, last_seen_at)""",
            # New rows reach the full-text index once per write transaction (the writer's
            # commit), not row by row: a row-level trigger costs ~2.5x the CPU at ingest.
            "DROP TRIGGER memories_fts_insert",
        ),
    ),
    Migration(
        version=4,
        name="compaction",
        statements=("DROP INDEX tombstones_summary",),
    ),
    Migration(
        version=5,
        name="vectors",
        statements=(
            """
            CREATE TABLE memory_vectors (
                memory_rowid INTEGER NOT NULL REFERENCES memories (rowid) ON DELETE CASCADE,
                model TEXT NOT NULL,
                dim INTEGER NOT NULL,
                embedding BLOB NOT NULL,
                PRIMARY KEY (memory_rowid, model)
            ) WITHOUT ROWID
            """,
            "CREATE INDEX memory_vectors_model ON memory_vectors (model, memory_rowid)",
            """
            CREATE TABLE vector_changes (
                seq INTEGER PRIMARY KEY AUTOINCREMENT,
                model TEXT NOT NULL,
                memory_rowid INTEGER NOT NULL
            )
            """,
            "CREATE INDEX vector_changes_model ON vector_changes (model, seq)",
            # Retrieval scopes vector search to an author named in the query.
            # (author, tenant): led by author so that no "tenant = ?" query picks it by mistake.
            "CREATE INDEX memories_author ON memories (author, tenant)",
            """
            CREATE TRIGGER memory_vectors_insert AFTER INSERT ON memory_vectors BEGIN
                INSERT INTO vector_changes (model, memory_rowid)
                VALUES (new.model, new.memory_rowid);
            END
            """,
            """
            CREATE TRIGGER memory_vectors_update AFTER UPDATE ON memory_vectors BEGIN
                INSERT INTO vector_changes (model, memory_rowid)
                VALUES (new.model, new.memory_rowid);
            END
            """,
            """
            CREATE TRIGGER memory_vectors_delete AFTER DELETE ON memory_vectors BEGIN
                INSERT INTO vector_changes (model, memory_rowid)
                VALUES (old.model, old.memory_rowid);
            END
            """,
        ),
    ),
    Migration(
        version=6,
        name="ingest_indexes",
        statements=(
            # The de-dup lookups' indexes, time before key: keyed by a hash first, each new row
            # landed on a random leaf page, so a 1,000-row transaction dirtied ~1,000 pages per
            # index and ingest slowed as the store grew (29 -> 60 us per row from 0 to 100k rows
            # in SQLite alone). Time first, rows append at the end of their channel or session;
            # a lookup (``find_targets``: key IN (...) AND last_seen_at >= since) reads the
            # window's index entries and tests the key there, before touching any row. Same
            # names, so ``INDEXED BY`` in the queries is unchanged.
            "DROP INDEX memories_exact",
            """CREATE INDEX memories_exact
               ON memories (tenant, channel, last_seen_at, content_hash)""",
            "DROP INDEX memories_exact_session",
            """CREATE INDEX memories_exact_session
               ON memories (tenant, session, last_seen_at, content_hash)""",
            "DROP INDEX memories_near",
            """CREATE INDEX memories_near
               ON memories (tenant, channel, last_seen_at, near_key) WHERE near_key IS NOT NULL""",
        ),
    ),
    Migration(
        version=7,
        name="neighbour_indexes",
        statements=(
            # Retrieval's neighbour expansion (``Store.neighbours``): a hit's replies, its
            # siblings and the turns of its thread, each an index range scan in time order.
            # Partial: most chat messages reply to nothing and start no thread.
            """CREATE INDEX memories_reply ON memories (tenant, reply_to, kind, created_at, rowid)
               WHERE reply_to IS NOT NULL""",
            """CREATE INDEX memories_thread
               ON memories (tenant, thread_id, kind, created_at, rowid)
               WHERE thread_id IS NOT NULL""",
        ),
    ),
    Migration(
        version=8,
        name="access_stats",
        statements=(
            # Every assemble bumps the access stats of the ~100 memories it included: in the
            # wide memories row (content and ~30 columns) that rewrote ~100 scattered ~500-byte
            # rows per context. Here one ~40-byte row per memory ever included, keyed by its
            # rowid, removed with its memory by cascade.
            """
            CREATE TABLE memory_access (
                memory_rowid INTEGER PRIMARY KEY REFERENCES memories (rowid) ON DELETE CASCADE,
                access_count INTEGER NOT NULL,
                last_accessed_at REAL,
                access_score REAL NOT NULL,
                access_score_at REAL,
                included_tokens_total INTEGER NOT NULL
            )
            """,
            """
            INSERT INTO memory_access (memory_rowid, access_count, last_accessed_at,
                access_score, access_score_at, included_tokens_total)
            SELECT rowid, access_count, last_accessed_at, access_score, access_score_at,
                included_tokens_total FROM memories
            WHERE access_count <> 0 OR access_score <> 0 OR included_tokens_total <> 0
                OR last_accessed_at IS NOT NULL OR access_score_at IS NOT NULL
            """,
            # Dropped, not left unused: a stray read of a frozen copy would look plausible;
            # a read of a missing column fails. (A one-time rewrite of the table, ~1 s per
            # 100k rows.)
            "ALTER TABLE memories DROP COLUMN access_count",
            "ALTER TABLE memories DROP COLUMN last_accessed_at",
            "ALTER TABLE memories DROP COLUMN access_score",
            "ALTER TABLE memories DROP COLUMN access_score_at",
            "ALTER TABLE memories DROP COLUMN included_tokens_total",
            # What reads of whole memories select from: the row with its stats (none: zero).
            """
            CREATE VIEW memory_rows AS SELECT m.*,
                coalesce(a.access_count, 0) AS access_count,
                a.last_accessed_at AS last_accessed_at,
                coalesce(a.access_score, 0.0) AS access_score,
                a.access_score_at AS access_score_at,
                coalesce(a.included_tokens_total, 0) AS included_tokens_total
            FROM memories m LEFT JOIN memory_access a ON a.memory_rowid = m.rowid
            """,
        ),
    ),
    Migration(
        version=9,
        name="inclusions_unindexed",
        statements=(
            # No query looks inclusions up by memory id (a context's log is read by its
            # context; a memory's use is in memory_access), and its ~100 random inserts per
            # context were most of the pages an inclusion log's commit wrote.
            "DROP INDEX IF EXISTS inclusions_memory",
        ),
    ),
    Migration(
        version=10,
        name="dedupe_buckets",
        statements=(
            # Migration 6's time-first indexes made a lookup read every index entry of the
            # window: in a busy channel (or a chat server's one NULL channel) the window is
            # the whole store, and a one-record ingest cost ~0.2 us per stored message. Here
            # the time is cut to 5-minute buckets and the key follows: a batch's rows still
            # append to the newest bucket of their scope (a 1,000-row batch dirties a few
            # leaf pages, not one per row), and a lookup of few keys seeks (bucket, key) for
            # each bucket of the window (``find_targets`` chooses; many keys still scan the
            # window's entries). The bucket replaces ``last_seen_at`` (a smaller entry); the
            # row itself is read only for a key match. ``_BUCKET`` in store/sqlite.py must
            # be this expression, character for character, for the planner to use it.
            "DROP INDEX memories_exact",
            """CREATE INDEX memories_exact
               ON memories (tenant, channel, CAST(last_seen_at / 300 AS INTEGER), content_hash)""",
            "DROP INDEX memories_exact_session",
            """CREATE INDEX memories_exact_session
               ON memories (tenant, session, CAST(last_seen_at / 300 AS INTEGER), content_hash)""",
            "DROP INDEX memories_near",
            """CREATE INDEX memories_near
               ON memories (tenant, channel, CAST(last_seen_at / 300 AS INTEGER), near_key)
               WHERE near_key IS NOT NULL""",
        ),
    ),
    Migration(
        version=11,
        name="end_user",
        statements=(
            # NULL for every memory stored before: they belong to no end user, so a read
            # scoped to a user never sees them, and session and tenant reads do as before.
            "ALTER TABLE memories ADD COLUMN end_user TEXT",
            # Where a pinned memory is visible: NULL its own session, 'user' its end user's
            # sessions, 'tenant' everywhere. Pins made before were visible tenant-wide.
            "ALTER TABLE memories ADD COLUMN pin_scope TEXT",
            # Messages no record may fold into (dedupe.UNFOLDABLE): an agent's turns, tool
            # calls and results, untrusted records; ingest marks them so from now on.
            """UPDATE memories SET content_hash = '~' || content_hash
               WHERE kind = 'message' AND content_hash NOT LIKE '~%'
               AND (role IN ('assistant', 'tool') OR tool_calls IS NOT NULL
                    OR metadata LIKE '%"trusted": false%')""",
            "UPDATE memories SET pin_scope = 'tenant' WHERE pinned = 1",
            # scope="user" reads (history, pinned, summaries, stats) seek by end user.
            """CREATE INDEX memories_user
               ON memories (tenant, end_user, kind, created_at, rowid)
               WHERE end_user IS NOT NULL""",
            # Recreated so that the view's m.* surely lists the new column.
            "DROP VIEW memory_rows",
            """
            CREATE VIEW memory_rows AS SELECT m.*,
                coalesce(a.access_count, 0) AS access_count,
                a.last_accessed_at AS last_accessed_at,
                coalesce(a.access_score, 0.0) AS access_score,
                a.access_score_at AS access_score_at,
                coalesce(a.included_tokens_total, 0) AS included_tokens_total
            FROM memories m LEFT JOIN memory_access a ON a.memory_rowid = m.rowid
            """,
        ),
    ),
    Migration(
        version=12,
        name="memory_as_data",
        statements=(
            # Pins and facts are rendered like other memories (time, channel, author), text
            # with line breaks is JSON-quoted and stored system records are quoted as data
            # (issue 20): counts cached for the old renderings are wrong, so they go; each is
            # counted again the first time assembly needs it.
            "DELETE FROM token_counts",
        ),
    ),
    Migration(
        version=13,
        name="memory_versions",
        statements=(
            # The texts an edit replaced (issue 19): one row per superseded version, removed
            # with its memory (erasure, compaction) by cascade.
            """
            CREATE TABLE memory_versions (
                memory_rowid INTEGER NOT NULL REFERENCES memories (rowid) ON DELETE CASCADE,
                version INTEGER NOT NULL,
                content TEXT NOT NULL,
                content_hash TEXT NOT NULL,
                valid_from REAL NOT NULL,
                valid_until REAL NOT NULL,
                PRIMARY KEY (memory_rowid, version)
            ) WITHOUT ROWID
            """,
        ),
    ),
    Migration(
        version=14,
        name="fact_keys",
        statements=_FACT_KEYS,
    ),
    Migration(
        version=15,
        name="alias_session",
        statements=(
            # The session a folded record came from, so erasing that session takes the record
            # out of an aggregate of another session (issue 20). NULL for aliases stored before
            # and for those of compaction and semantic merges.
            "ALTER TABLE aliases ADD COLUMN session TEXT",
            "CREATE INDEX aliases_session ON aliases (tenant, session) WHERE session IS NOT NULL",
        ),
    ),
    Migration(
        version=16,
        name="archive",
        statements=(
            # Compaction's originals kept compressed for a while (keep_originals="archive").
            """
            CREATE TABLE archived_memories (
                tenant TEXT NOT NULL,
                summary_id TEXT NOT NULL,
                session TEXT NOT NULL,
                archived_at REAL NOT NULL,
                expires_at REAL NOT NULL,
                originals INTEGER NOT NULL,
                codec TEXT NOT NULL,
                record BLOB NOT NULL,
                PRIMARY KEY (tenant, summary_id)
            )
            """,
            "CREATE INDEX archived_session ON archived_memories (tenant, session)",
            "CREATE INDEX archived_expiry ON archived_memories (expires_at)",
        ),
    ),
    Migration(
        version=17,
        name="compaction_lease",
        statements=(
            # One background compactor at a time across the processes sharing the file (issue
            # 19): the holder's id and when its lease runs out, so a killed holder's lease
            # lapses instead of blocking compaction for good.
            """
            CREATE TABLE leases (
                name TEXT PRIMARY KEY,
                owner TEXT NOT NULL,
                acquired_at REAL NOT NULL,
                expires_at REAL NOT NULL
            ) WITHOUT ROWID
            """,
        ),
    ),
    Migration(
        version=18,
        name="attachment_search",
        statements=_ATTACHMENT_SEARCH,
    ),
    Migration(
        version=20,
        name="script_bigrams",
        statements=_SCRIPT_BIGRAMS,
        fill=_fill_bigrams,
    ),
    Migration(
        version=21,
        name="tombstone_groups",
        statements=tombstone_migration.SQLITE_STATEMENTS,
        fill=_fill_tombstone_groups,
    ),
    Migration(version=22, name="quoted_breaks", statements=_QUOTED_BREAKS),
)


def current_version(conn: sqlite3.Connection) -> int:
    """The schema version recorded in the database."""
    return int(conn.execute("PRAGMA user_version").fetchone()[0])


def plan(conn: sqlite3.Connection) -> list[Migration]:
    """The migrations not yet applied, in order. Reads only."""
    version = current_version(conn)
    return [m for m in MIGRATIONS if m.version > version]


def apply(conn: sqlite3.Connection) -> list[Migration]:
    """Apply pending migrations, each in one transaction; returns what was applied."""
    done = []
    for migration in plan(conn):
        conn.execute("BEGIN IMMEDIATE")
        try:
            for statement in migration.statements:
                conn.execute(statement)
            if migration.fill is not None:
                migration.fill(conn)
            conn.execute(f"PRAGMA user_version = {int(migration.version)}")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")
        done.append(migration)
    return done
