"""Named, versioned schema migrations for the PostgreSQL backend.

The same contract as :mod:`ctxwarden.store.migrations` (SQLite): numbered, named migrations,
``plan()`` reads only, ``apply()`` runs each pending migration in its own transaction. The version
lives in the table ``ctxwarden_schema`` (one row per applied migration). ``apply()`` takes a
transaction-scoped advisory lock first, so several servers starting at once migrate once.

The tables mirror the SQLite schema, with these PostgreSQL counterparts:

- ``memories.content_tsv``: a stored generated ``tsvector`` (``english`` configuration: Snowball
  stemming and stop words) with a GIN index, in place of FTS5.
- ``exact_heads``: one row per ``(tenant, channel, content_hash)`` pointing at the newest memory
  with that content; ingest claims it with ``INSERT ... ON CONFLICT DO UPDATE``, so two servers
  ingesting the same message at the same moment fold it into one memory (no lost update, no
  application lock).
- ``exact_heads.scope`` (migration 3, ``dedupe``): the layer-A scope key, ``channel:<name>`` or
  ``session:<name>`` per the engine's ``exact_scope``; heads are a race guard only, so migration 3
  empties the table rather than rewriting it. Migration 3 also adds ``memories.latest_content`` and
  the indexes of :mod:`ctxwarden.store.migrations`' migration 3.
- ``memory_vectors``: a ``vector(384)`` per memory and embedding model, with an HNSW index
  (cosine), ready for the embedder.
- Migration 4 (``compaction``) drops ``tombstones_summary``, as SQLite's migration 4 does (the
  same lookups, the same trade: summaries of summaries scan the tenant's tombstones).
- ``api_keys`` (migration ``pg_api_keys``): the servers' API keys, as on SQLite (tenant, scopes,
  a SHA-256 of the secret only), so ``ctxwarden serve --db postgresql://...`` checks keys.
- Migration 8 (``access_stats``): the access stats move to ``memory_access`` and whole-memory reads
  go through the view ``memory_rows``, as SQLite's migration 8 (the old columns dropped: in
  PostgreSQL a catalogue change, no rewrite).
- Migration 9 (``inclusions_unindexed``) drops ``inclusions_memory``, as SQLite's migration 9.
- Migration 10 (``end_user``) adds ``memories.end_user`` and ``memories_user``, as SQLite's
  migration 11, and recreates ``memory_rows`` (its ``m.*`` was expanded at creation).
- Migration 11 (``memory_as_data``) drops cached token counts, as SQLite's migration 12.
- Migration 12 (``memory_versions``) adds ``memory_versions`` (texts an edit replaced), as
  SQLite's migration 13.
- Migration 13 (``fact_keys``) adds ``memories.fact_key`` and ``supersessions``, as SQLite's
  migration 14.
- Migration 15 (``archive``) adds ``archived_memories`` (compaction's originals kept compressed,
  ``record`` a ``bytea``), as SQLite's migration 16.
- Migration 16 (``attachment_search``) makes attachments searchable, as SQLite's migration 18:
  ``memories.attachment_text`` holds each attachment's name and caption, ``content_tsv`` is
  regenerated over the content and it, and the token counts of rows with attachments are
  dropped. ``memory_rows`` is recreated (its ``m.*`` named the old column).
- Migration 18 (``script_bigrams``) makes text in scripts written without spaces searchable, as
  SQLite's migration 20: ``memories.bigram_text`` (the character bigrams of such runs,
  :func:`ctxwarden.segment.bigram_text`; NULL for rows without any) enters ``content_tsv``,
  filled for older rows in Python. The ``english`` configuration indexes the bigrams as they
  are: its stemmer and stop words touch ASCII words only, so one configuration serves both
  (a query's bigrams pass through it unchanged too).
- Migration 19 (``tombstone_groups``) replaces ``tombstones`` by ``tombstone_groups`` and
  ``tombstone_keys``, as SQLite's migration 21 (:mod:`ctxwarden.store.tombstones`), moving the
  old rows into groups.
- Migration 20 (``quoted_breaks``) drops the cached token counts whose quoted rendering now
  escapes more line breaks, as SQLite's migration 22.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ctxwarden.segment import bigram_text
from ctxwarden.store import tombstone_migration

if TYPE_CHECKING:
    import psycopg

__all__ = ["MIGRATIONS", "Migration", "apply", "current_version", "plan"]

#: Key of the advisory lock that serialises concurrent migrators.
_LOCK_KEY = 0x637478776172  # "ctxwar"


@dataclass(frozen=True, kw_only=True, slots=True)
class Migration:
    """One schema step: its version, a name, the statements it runs, and then (in the same
    transaction) ``fill``: a step in Python, for values SQL cannot compute."""

    version: int
    name: str
    statements: tuple[str, ...]
    fill: Callable[[psycopg.Connection[tuple[object, ...]]], None] | None = None


def _fill_tombstone_groups(conn: psycopg.Connection[tuple[object, ...]]) -> None:
    """Migration 19's fill: the per-id tombstones as groups."""
    tombstone_migration.fill_groups(lambda sql, params: conn.execute(sql, params), "%s")


def _fill_bigrams(conn: psycopg.Connection[tuple[object, ...]]) -> None:
    """Migration 18's fill: ``bigram_text`` of the older rows that hold a character outside
    ASCII (only those can have any); ``content_tsv`` follows as a generated column."""
    last = 0
    while rows := conn.execute(
        "SELECT rowid, content, attachment_text FROM memories WHERE rowid > %s AND "
        "(octet_length(content) <> char_length(content) "
        "OR octet_length(attachment_text) <> char_length(attachment_text)) "
        "ORDER BY rowid LIMIT 2000",
        (last,),
    ).fetchall():
        last = int(rows[-1][0])  # type: ignore[call-overload]
        found = []
        for rowid, content, attachments in rows:
            bigrams = bigram_text(f"{content} {attachments}" if attachments else str(content))
            if bigrams is not None:
                found.append((bigrams, rowid))
        with conn.cursor() as cursor:
            cursor.executemany("UPDATE memories SET bigram_text = %s WHERE rowid = %s", found)


MIGRATIONS: tuple[Migration, ...] = (
    Migration(
        version=1,
        name="initial",
        statements=(
            """
            CREATE TABLE memories (
                rowid BIGSERIAL PRIMARY KEY,
                id TEXT NOT NULL,
                tenant TEXT NOT NULL,
                session TEXT NOT NULL,
                channel TEXT,
                author TEXT,
                author_kind TEXT NOT NULL,
                role TEXT NOT NULL,
                content TEXT NOT NULL,
                created_at DOUBLE PRECISION NOT NULL,
                thread_id TEXT,
                reply_to TEXT,
                kind TEXT NOT NULL,
                pinned BOOLEAN NOT NULL DEFAULT FALSE,
                name TEXT,
                tool_calls TEXT,
                tool_call_id TEXT,
                attachments TEXT,
                metadata TEXT,
                content_hash TEXT NOT NULL,
                near_key TEXT,
                dup_count INTEGER NOT NULL DEFAULT 1,
                last_seen_at DOUBLE PRECISION NOT NULL,
                access_count INTEGER NOT NULL DEFAULT 0,
                last_accessed_at DOUBLE PRECISION,
                access_score DOUBLE PRECISION NOT NULL DEFAULT 0,
                access_score_at DOUBLE PRECISION,
                included_tokens_total BIGINT NOT NULL DEFAULT 0,
                source_ids TEXT,
                time_start DOUBLE PRECISION,
                time_end DOUBLE PRECISION,
                content_tsv TSVECTOR GENERATED ALWAYS AS (to_tsvector('english', content)) STORED,
                UNIQUE (tenant, id)
            )
            """,
            "CREATE INDEX memories_recent ON memories (tenant, session, kind, created_at, rowid)",
            """CREATE INDEX memories_channel_recent
               ON memories (tenant, session, channel, kind, created_at, rowid)""",
            """CREATE INDEX memories_exact
               ON memories (tenant, channel, content_hash, last_seen_at)""",
            "CREATE INDEX memories_kind ON memories (tenant, kind, created_at)",
            "CREATE INDEX memories_pinned ON memories (tenant, pinned) WHERE pinned",
            "CREATE INDEX memories_tenant_order ON memories (tenant, created_at, rowid)",
            "CREATE INDEX memories_fts ON memories USING GIN (content_tsv)",
            """
            CREATE TABLE aliases (
                tenant TEXT NOT NULL,
                id TEXT NOT NULL,
                memory_rowid BIGINT NOT NULL REFERENCES memories (rowid) ON DELETE CASCADE,
                status TEXT NOT NULL,
                created_at DOUBLE PRECISION NOT NULL,
                PRIMARY KEY (tenant, id)
            )
            """,
            "CREATE INDEX aliases_memory ON aliases (memory_rowid)",
            """
            CREATE TABLE exact_heads (
                tenant TEXT NOT NULL,
                channel TEXT,
                content_hash TEXT NOT NULL,
                memory_rowid BIGINT NOT NULL REFERENCES memories (rowid)
                    ON DELETE CASCADE DEFERRABLE INITIALLY DEFERRED,
                last_seen_at DOUBLE PRECISION NOT NULL,
                UNIQUE NULLS NOT DISTINCT (tenant, channel, content_hash)
            )
            """,
            "CREATE INDEX exact_heads_memory ON exact_heads (memory_rowid)",
            """
            CREATE TABLE token_counts (
                memory_rowid BIGINT NOT NULL REFERENCES memories (rowid) ON DELETE CASCADE,
                tokenizer TEXT NOT NULL,
                message INTEGER NOT NULL,
                line INTEGER NOT NULL,
                PRIMARY KEY (memory_rowid, tokenizer)
            )
            """,
            """
            CREATE TABLE contexts (
                rowid BIGSERIAL PRIMARY KEY,
                id TEXT NOT NULL UNIQUE,
                tenant TEXT NOT NULL,
                session TEXT NOT NULL,
                created_at DOUBLE PRECISION NOT NULL,
                model TEXT NOT NULL,
                tokenizer TEXT NOT NULL,
                exact BOOLEAN NOT NULL,
                cap INTEGER NOT NULL,
                tokens INTEGER NOT NULL,
                blocks TEXT NOT NULL
            )
            """,
            "CREATE INDEX contexts_session ON contexts (tenant, session, created_at)",
            """
            CREATE TABLE inclusions (
                context_rowid BIGINT NOT NULL REFERENCES contexts (rowid) ON DELETE CASCADE,
                position INTEGER NOT NULL,
                memory_id TEXT NOT NULL,
                block TEXT NOT NULL,
                tokens INTEGER NOT NULL,
                PRIMARY KEY (context_rowid, position)
            )
            """,
            "CREATE INDEX inclusions_memory ON inclusions (memory_id)",
            """
            CREATE TABLE tombstones (
                tenant TEXT NOT NULL,
                id TEXT NOT NULL,
                deleted_at DOUBLE PRECISION NOT NULL,
                summary_id TEXT,
                content_hash TEXT NOT NULL,
                time_start DOUBLE PRECISION,
                time_end DOUBLE PRECISION,
                reason TEXT NOT NULL,
                PRIMARY KEY (tenant, id)
            )
            """,
            "CREATE INDEX tombstones_summary ON tombstones (tenant, summary_id)",
        ),
    ),
    Migration(
        version=2,
        name="vectors",
        statements=(
            "CREATE EXTENSION IF NOT EXISTS vector",
            """
            CREATE TABLE memory_vectors (
                memory_rowid BIGINT NOT NULL REFERENCES memories (rowid) ON DELETE CASCADE,
                model TEXT NOT NULL,
                embedding vector(384) NOT NULL,
                PRIMARY KEY (memory_rowid, model)
            )
            """,
            """CREATE INDEX memory_vectors_hnsw ON memory_vectors
               USING hnsw (embedding vector_cosine_ops) WITH (m = 16, ef_construction = 64)""",
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
            "DELETE FROM exact_heads",
            "ALTER TABLE exact_heads RENAME COLUMN channel TO scope",
        ),
    ),
    Migration(
        version=4,
        name="compaction",
        statements=("DROP INDEX tombstones_summary",),
    ),
    Migration(
        version=5,
        name="pg_api_keys",
        statements=(
            """
            CREATE TABLE api_keys (
                key_id TEXT PRIMARY KEY,
                tenant TEXT NOT NULL,
                scopes TEXT NOT NULL,
                secret_hash TEXT NOT NULL,
                name TEXT,
                created_at DOUBLE PRECISION NOT NULL,
                revoked_at DOUBLE PRECISION
            )
            """,
            "CREATE INDEX api_keys_tenant ON api_keys (tenant)",
        ),
    ),
    Migration(
        version=6,
        name="retrieve_author_index",
        statements=("CREATE INDEX memories_author ON memories (tenant, author)",),
    ),
    Migration(
        version=7,
        name="neighbour_indexes",
        statements=(
            # Retrieval's neighbour expansion (``Store.neighbours``): see SQLite migration 7.
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
            # See SQLite migration 8: one narrow row per memory ever included, upserted by the
            # inclusion log, in place of an update of the wide memories row.
            """
            CREATE TABLE memory_access (
                memory_rowid BIGINT PRIMARY KEY REFERENCES memories (rowid) ON DELETE CASCADE,
                access_count INTEGER NOT NULL,
                last_accessed_at DOUBLE PRECISION,
                access_score DOUBLE PRECISION NOT NULL,
                access_score_at DOUBLE PRECISION,
                included_tokens_total BIGINT NOT NULL
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
            """ALTER TABLE memories DROP COLUMN access_count, DROP COLUMN last_accessed_at,
               DROP COLUMN access_score, DROP COLUMN access_score_at,
               DROP COLUMN included_tokens_total""",
            # PostgreSQL expands m.* when the view is created: a migration that adds a column
            # to memories recreates the view (CREATE OR REPLACE VIEW may append columns).
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
            # See SQLite migration 9: no query reads inclusions by memory id.
            "DROP INDEX IF EXISTS inclusions_memory",
        ),
    ),
    Migration(
        version=10,
        name="end_user",
        statements=(
            # See SQLite migration 11. ``user`` is a reserved word here, hence ``end_user``.
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
            "UPDATE memories SET pin_scope = 'tenant' WHERE pinned",
            """CREATE INDEX memories_user
               ON memories (tenant, end_user, kind, created_at, rowid)
               WHERE end_user IS NOT NULL""",
            # The view expanded m.* when it was created, and the new column would have to come
            # before its access columns: CREATE OR REPLACE cannot do that.
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
        version=11,
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
        version=12,
        name="memory_versions",
        statements=(
            """
            CREATE TABLE memory_versions (
                memory_rowid BIGINT NOT NULL REFERENCES memories (rowid) ON DELETE CASCADE,
                version INTEGER NOT NULL,
                content TEXT NOT NULL,
                content_hash TEXT NOT NULL,
                valid_from DOUBLE PRECISION NOT NULL,
                valid_until DOUBLE PRECISION NOT NULL,
                PRIMARY KEY (memory_rowid, version)
            )
            """,
        ),
    ),
    Migration(
        version=13,
        name="fact_keys",
        statements=(
            "ALTER TABLE memories ADD COLUMN fact_key TEXT",
            """CREATE INDEX memories_fact_key ON memories (tenant, fact_key)
               WHERE fact_key IS NOT NULL""",
            """
            CREATE TABLE supersessions (
                memory_rowid BIGINT PRIMARY KEY REFERENCES memories (rowid) ON DELETE CASCADE,
                superseded_by TEXT NOT NULL,
                valid_until DOUBLE PRECISION NOT NULL
            )
            """,
        ),
    ),
    Migration(
        version=14,
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
        version=15,
        name="archive",
        statements=(
            # Compaction's originals kept compressed for a while (keep_originals="archive").
            """
            CREATE TABLE archived_memories (
                tenant TEXT NOT NULL,
                summary_id TEXT NOT NULL,
                session TEXT NOT NULL,
                archived_at DOUBLE PRECISION NOT NULL,
                expires_at DOUBLE PRECISION NOT NULL,
                originals INTEGER NOT NULL,
                codec TEXT NOT NULL,
                record BYTEA NOT NULL,
                PRIMARY KEY (tenant, summary_id)
            )
            """,
            "CREATE INDEX archived_session ON archived_memories (tenant, session)",
            "CREATE INDEX archived_expiry ON archived_memories (expires_at)",
        ),
    ),
    Migration(
        version=16,
        name="attachment_search",
        statements=(
            # See SQLite's migration 18: the words of a row's attachments, written by ingest.
            "ALTER TABLE memories ADD COLUMN attachment_text TEXT",
            """
            UPDATE memories SET attachment_text = (
                SELECT string_agg(btrim(concat_ws(' ', translate(a ->> 'name', '._-/', '    '),
                                                  a ->> 'caption')), ' ' ORDER BY n)
                FROM jsonb_array_elements(attachments::jsonb) WITH ORDINALITY AS t (a, n)
                WHERE jsonb_typeof(a) = 'object'
            ) WHERE attachments IS NOT NULL
            """,
            # The view expanded m.* (content_tsv included) when it was created.
            "DROP VIEW memory_rows",
            "ALTER TABLE memories DROP COLUMN content_tsv",
            """
            ALTER TABLE memories ADD COLUMN content_tsv TSVECTOR GENERATED ALWAYS AS (
                to_tsvector('english', content || ' ' || coalesce(attachment_text, ''))
            ) STORED
            """,
            "CREATE INDEX memories_fts ON memories USING GIN (content_tsv)",
            """
            CREATE VIEW memory_rows AS SELECT m.*,
                coalesce(a.access_count, 0) AS access_count,
                a.last_accessed_at AS last_accessed_at,
                coalesce(a.access_score, 0.0) AS access_score,
                a.access_score_at AS access_score_at,
                coalesce(a.included_tokens_total, 0) AS included_tokens_total
            FROM memories m LEFT JOIN memory_access a ON a.memory_rowid = m.rowid
            """,
            # Attachments are now rendered after the content: their rows' cached counts are stale.
            "DELETE FROM token_counts WHERE memory_rowid IN "
            "(SELECT rowid FROM memories WHERE attachments IS NOT NULL)",
        ),
    ),
    Migration(
        version=18,
        name="script_bigrams",
        statements=(
            # See SQLite's migration 20: the bigrams of runs in scripts written without
            # spaces, written by the writers, filled for older rows by _fill_bigrams.
            "ALTER TABLE memories ADD COLUMN bigram_text TEXT",
            "DROP VIEW memory_rows",
            "ALTER TABLE memories DROP COLUMN content_tsv",
            """
            ALTER TABLE memories ADD COLUMN content_tsv TSVECTOR GENERATED ALWAYS AS (
                to_tsvector('english', content || ' ' || coalesce(attachment_text, '') || ' '
                            || coalesce(bigram_text, ''))
            ) STORED
            """,
            "CREATE INDEX memories_fts ON memories USING GIN (content_tsv)",
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
        fill=_fill_bigrams,
    ),
    Migration(
        version=19,
        name="tombstone_groups",
        statements=tombstone_migration.PG_STATEMENTS,
        fill=_fill_tombstone_groups,
    ),
    Migration(
        version=20,
        name="quoted_breaks",
        statements=(
            # See SQLite's migration 22: quoted text now escapes every line break, so the
            # counts of rows with U+0085/U+2028/U+2029 in their content, or any break in their
            # author, are stale.
            "DELETE FROM token_counts WHERE memory_rowid IN (SELECT rowid FROM memories WHERE "
            + " OR ".join(f"strpos(content, chr({c})) > 0" for c in (133, 8232, 8233))
            + " OR "
            + " OR ".join(
                f"strpos(author, chr({c})) > 0"
                for c in (10, 13, 11, 12, 28, 29, 30, 133, 8232, 8233)
            )
            + ")",
        ),
    ),
)

_VERSION_TABLE = """
CREATE TABLE IF NOT EXISTS ctxwarden_schema (
    version INTEGER PRIMARY KEY,
    name TEXT NOT NULL,
    applied_at TIMESTAMPTZ NOT NULL DEFAULT now()
)
"""


def current_version(conn: psycopg.Connection[tuple[object, ...]]) -> int:
    """The highest schema version recorded in the database (0 for an empty one)."""
    row = conn.execute("SELECT to_regclass('ctxwarden_schema') IS NOT NULL").fetchone()
    if not row or not row[0]:
        return 0
    row = conn.execute("SELECT coalesce(max(version), 0) FROM ctxwarden_schema").fetchone()
    return int(row[0]) if row else 0  # type: ignore[call-overload]


def plan(conn: psycopg.Connection[tuple[object, ...]]) -> list[Migration]:
    """The migrations not yet applied, in order. Reads only."""
    version = current_version(conn)
    return [m for m in MIGRATIONS if m.version > version]


def apply(
    conn: psycopg.Connection[tuple[object, ...]], *, below: int | None = None
) -> list[Migration]:
    """Apply pending migrations, each in one transaction; returns what was applied.

    ``conn`` must be in autocommit mode; each migration opens its own transaction. ``below``
    stops before that version (a schema as an older release left it, for migration tests).
    """
    done: list[Migration] = []
    for migration in MIGRATIONS:
        if below is not None and migration.version >= below:
            break
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (_LOCK_KEY,))
            conn.execute(_VERSION_TABLE)
            if current_version(conn) >= migration.version:
                continue
            for statement in migration.statements:
                conn.execute(statement)  # fixed text, no user input
            if migration.fill is not None:
                migration.fill(conn)
            conn.execute(
                "INSERT INTO ctxwarden_schema (version, name) VALUES (%s, %s)",
                (migration.version, migration.name),
            )
        done.append(migration)
    return done
