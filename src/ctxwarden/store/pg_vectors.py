"""Vectors on PostgreSQL: ``memory_vectors`` (pgvector) with an HNSW index, searched in SQL.

:class:`PostgresVectors` is the vector half of :class:`~ctxwarden.store.postgres.PostgresStore`
(its ``put_vectors``, ``vector_search`` and the rest of the vector methods of the protocol), a
mixin over the store's pool, :meth:`write` and :meth:`_query`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any

import numpy as np
import numpy.typing as npt
import psycopg
from psycopg_pool import ConnectionPool

from ctxwarden.errors import InputError
from ctxwarden.scope import ReadScope
from ctxwarden.store.pg_writer import Conn, _PostgresWriter, store_failure
from ctxwarden.store.reads import MEMORY_COLUMNS, embedded_text, memory_of, scope_sql
from ctxwarden.types import Memory

__all__ = ["PostgresVectors"]


class PostgresVectors:
    """The store's vectors (the store supplies its connection pool, :meth:`write` (a writer
    whose ``_conn`` is the transaction's connection), :meth:`_query` and :meth:`_check_open`)."""

    _pool: ConnectionPool[Conn]
    timeout: float

    def write(self, *, wait: float | None = None) -> AbstractContextManager[_PostgresWriter]:
        raise NotImplementedError

    def _query(self, sql: str, params: Sequence[Any] | Mapping[str, Any]) -> list[tuple[Any, ...]]:
        raise NotImplementedError

    def _check_open(self) -> None:
        raise NotImplementedError

    def put_vectors(
        self,
        model: str,
        rowids: Sequence[int],
        vectors: npt.NDArray[np.float32],
        *,
        wait: float | None = None,
    ) -> int:
        """Store one vector per rowid under ``model`` in ``memory_vectors`` (pgvector);
        ``wait``: the longest wait for a connection and each lock (None: the store's)."""
        matrix = np.asarray(vectors, dtype=np.float32)
        if matrix.ndim != 2 or matrix.shape[0] != len(rowids):
            raise InputError(
                f"{len(rowids)} rowids but vectors of shape {matrix.shape}: pass one row each",
                field="vectors",
            )
        if not rowids:
            return 0
        if matrix.shape[1] != _VECTOR_DIM:
            raise InputError(
                f"the PostgreSQL schema keeps {_VECTOR_DIM}-d vectors, these are "
                f"{matrix.shape[1]}-d: use a {_VECTOR_DIM}-d embedder (the default 'minilm')",
                field="vectors",
            )
        rows = [(int(r), model, _literal(v)) for r, v in zip(rowids, matrix, strict=True)]
        with self.write(wait=wait) as writer:
            stored = 0
            for row in rows:
                cursor = writer._conn.execute(
                    "INSERT INTO memory_vectors (memory_rowid, model, embedding) "
                    "SELECT %s, %s, %s::vector FROM memories WHERE rowid = %s "
                    "ON CONFLICT (memory_rowid, model) "
                    "DO UPDATE SET embedding = excluded.embedding",
                    (*row, row[0]),
                )
                stored += max(0, cursor.rowcount)
        return stored

    def pending_embeddings(
        self, model: str, *, after: int = 0, limit: int = 256
    ) -> list[tuple[int, str]]:
        """Memories with text and no ``model`` vector, ``(rowid, content)``, rowid > ``after``."""
        rows = self._query(
            "SELECT m.rowid, m.content, m.attachment_text FROM memories m WHERE m.rowid > %s "
            "AND (m.content <> '' OR m.attachment_text IS NOT NULL) "
            "AND m.role <> 'tool' AND NOT EXISTS (SELECT 1 FROM memory_vectors v "
            "WHERE v.memory_rowid = m.rowid AND v.model = %s) ORDER BY m.rowid LIMIT %s",
            (after, model, limit),
        )
        return [(int(r[0]), embedded_text(str(r[1]), r[2])) for r in rows]

    def embed_pending_batch(
        self,
        model: str,
        embed: Callable[[list[str]], npt.NDArray[np.float32]],
        *,
        after: int = 0,
        limit: int = 32,
    ) -> list[int]:
        """Claim up to ``limit`` pending memories, embed them and store their vectors in one
        transaction (see the protocol). A claim is a transaction-scoped advisory lock per
        memory: servers sharing the database skip each other's claims instead of waiting, and
        no row is locked, so an ingest that bumps a memory being embedded never waits."""
        with self.write() as writer:
            conn = writer._conn
            # The volatile lock call is evaluated row by row as the outer LIMIT pulls, so a
            # caller claims at most `limit`; the inner pool leaves room to skip others' claims.
            rows = conn.execute(
                "SELECT c.rowid, c.content, c.attachment_text FROM (SELECT m.rowid, m.content, "
                "m.attachment_text FROM memories m WHERE m.rowid > %s "
                "AND (m.content <> '' OR m.attachment_text IS NOT NULL) "
                "AND m.role <> 'tool' AND NOT EXISTS "
                "(SELECT 1 FROM memory_vectors v WHERE v.memory_rowid = m.rowid "
                "AND v.model = %s) ORDER BY m.rowid LIMIT %s) c "
                "WHERE pg_try_advisory_xact_lock(hashtext(%s), "
                "((c.rowid %% 4294967296) - 2147483648)::int) ORDER BY c.rowid LIMIT %s",
                (after, model, limit * 4, _claim_space(model), limit),
            ).fetchall()
            if not rows:
                return []
            # A claim whose holder committed between this statement's snapshot and the lock
            # has its vector now: a new statement sees it (READ COMMITTED).
            done = {
                int(r[0])
                for r in conn.execute(
                    "SELECT memory_rowid FROM memory_vectors WHERE model = %s "
                    "AND memory_rowid = ANY(%s)",
                    (model, [int(r[0]) for r in rows]),
                )
            }
            # the text pending_embeddings gives: the content and its attachments' words
            claimed = [
                (int(r[0]), embedded_text(str(r[1]), r[2])) for r in rows if int(r[0]) not in done
            ]
            if not claimed:
                return []
            matrix = np.asarray(embed([text for _, text in claimed]), dtype=np.float32)
            if matrix.ndim != 2 or matrix.shape != (len(claimed), _VECTOR_DIM):
                raise InputError(
                    f"the embedder gave vectors of shape {matrix.shape} for {len(claimed)} texts; "
                    f"the PostgreSQL schema keeps {_VECTOR_DIM}-d vectors",
                    field="vectors",
                )
            for (rowid, _), vector in zip(claimed, matrix, strict=True):
                # FOR KEY SHARE: a memory erased meanwhile (its delete committed after this
                # statement's snapshot) is re-checked once the delete is done and skipped,
                # instead of failing the vector's foreign key.
                conn.execute(
                    "INSERT INTO memory_vectors (memory_rowid, model, embedding) "
                    "SELECT %s, %s, %s::vector FROM memories WHERE rowid = %s FOR KEY SHARE "
                    "ON CONFLICT (memory_rowid, model) "
                    "DO UPDATE SET embedding = excluded.embedding",
                    (rowid, model, _literal(vector), rowid),
                )
        return [rowid for rowid, _ in claimed]

    def vector_models(self) -> dict[str, int]:
        """How many vectors each embedding model has in the store."""
        rows = self._query(
            "SELECT model, count(*) FROM memory_vectors GROUP BY model ORDER BY model", ()
        )
        return {str(m): int(n) for m, n in rows}

    def drop_vectors(self, model: str) -> int:
        """Delete every vector of ``model``; returns how many."""
        with self.write() as writer:
            cursor = writer._conn.execute("DELETE FROM memory_vectors WHERE model = %s", (model,))
            return max(0, cursor.rowcount)

    def vector_search(
        self,
        tenant: str,
        model: str,
        vector: npt.NDArray[np.float32],
        *,
        k: int = 100,
        session: str | None = None,
        author: str | None = None,
        scope: ReadScope | None = None,
    ) -> list[tuple[Memory, float]]:
        """The memories nearest ``vector`` (:meth:`_nearest`)."""
        return self._nearest(
            tenant, model, vector, k=k, session=session, author=author, scope=scope
        )

    def vector_nearest(
        self,
        tenant: str,
        model: str,
        vector: npt.NDArray[np.float32],
        *,
        k: int = 100,
        author: str | None = None,
        scope: ReadScope | None = None,
    ) -> list[tuple[int, float]]:
        """:meth:`vector_search`'s rowids and cosines, no memory read."""
        return self._nearest(
            tenant, model, vector, k=k, author=author, scope=scope, rowids_only=True
        )

    def _nearest(
        self,
        tenant: str,
        model: str,
        vector: npt.NDArray[np.float32],
        *,
        k: int,
        session: str | None = None,
        author: str | None = None,
        scope: ReadScope | None = None,
        rowids_only: bool = False,
    ) -> list[tuple[Any, float]]:
        """pgvector cosine ``<=>`` over the HNSW index, filtered by tenant (session, author):
        the memories (their rowids when ``rowids_only``) and their cosines, best first.

        A read scope narrower than the tenant (a session's, an end user's rows) is searched
        exactly over its rows (a materialised set of rowids first): the HNSW iterative scan
        stops after ``hnsw.max_scan_tuples`` and could return fewer than ``k`` of them.
        """
        query = np.asarray(vector, dtype=np.float32).reshape(-1)
        if k < 1:
            return []
        if query.shape[0] != _VECTOR_DIM:
            raise InputError(
                f"query vector has {query.shape[0]} dimensions, the store keeps {_VECTOR_DIM}: "
                "embed the query with the store's embedder",
                field="vector",
            )
        literal = _literal(query)
        extra = " AND m.session = %s" if session is not None else ""
        params: list[Any] = [literal, model, tenant]
        if session is not None:
            params.append(session)
        if author is not None:
            extra += " AND m.author = %s"
            params.append(author)
        params.extend([literal, k])
        cols = (
            "m.rowid"
            if rowids_only
            else ", ".join("m." + c.strip() for c in MEMORY_COLUMNS.split(","))
        )
        rows_of = "memories" if rowids_only else "memory_rows"
        read_filter, read_params = scope_sql(scope)
        if read_filter:
            extra += read_filter.replace("?", "%s")
            narrowed = extra.replace("m.", "")
            rows = self._query(
                f"WITH s AS MATERIALIZED (SELECT rowid FROM memories WHERE tenant = %s"
                f"{narrowed}) SELECT {cols}, 1 - (v.embedding <=> %s::vector) AS score "
                "FROM s JOIN memory_vectors v ON v.memory_rowid = s.rowid AND v.model = %s "
                f"JOIN {rows_of} m ON m.rowid = s.rowid "
                "ORDER BY v.embedding <=> %s::vector, m.rowid LIMIT %s",
                [tenant, *params[3:-2], *read_params, literal, model, literal, k],
            )
            return _found(rows, rowids_only)
        self._check_open()
        try:
            with self._pool.connection() as conn, conn.transaction():
                # Iterative scans keep looking past other tenants' rows until k are found.
                conn.execute("SET LOCAL hnsw.ef_search = 200")
                conn.execute("SET LOCAL hnsw.iterative_scan = relaxed_order")
                rows = conn.execute(
                    f"SELECT {cols}, 1 - (v.embedding <=> %s::vector) AS score "
                    f"FROM memory_vectors v JOIN {rows_of} m ON m.rowid = v.memory_rowid "
                    f"WHERE v.model = %s AND m.tenant = %s{extra} "
                    "ORDER BY v.embedding <=> %s::vector, m.rowid LIMIT %s",
                    params,
                ).fetchall()
        except psycopg.Error as exc:
            raise store_failure(exc, "vector search", self.timeout) from exc
        return _found(rows, rowids_only)

    def vector_window(
        self,
        tenant: str,
        model: str,
        *,
        channel: str | None,
        author: str | None,
        seen_since: float,
        created_until: float,
    ) -> list[tuple[Memory, npt.NDArray[np.float32]]]:
        """Messages of ``tenant`` in ``channel`` by ``author`` in layer C's window, with their
        ``model`` vector, oldest first."""
        cols = ", ".join("m." + c.strip() for c in MEMORY_COLUMNS.split(","))
        rows = self._query(
            f"SELECT {cols}, v.embedding::text FROM memory_rows m JOIN memory_vectors v "
            "ON v.memory_rowid = m.rowid AND v.model = %s WHERE m.tenant = %s "
            "AND m.author IS NOT DISTINCT FROM %s AND m.channel IS NOT DISTINCT FROM %s "
            "AND m.kind = 'message' AND m.last_seen_at >= %s AND m.created_at <= %s "
            "ORDER BY m.created_at, m.rowid",
            (model, tenant, author, channel, seen_since, created_until),
        )
        return [(memory_of(r[:-1]), np.array(json.loads(r[-1]), dtype=np.float32)) for r in rows]


#: Length of ``memory_vectors.embedding`` in the PostgreSQL schema (migration ``vectors``).
_VECTOR_DIM = 384


def _claim_space(model: str) -> str:
    """What the first key of the advisory locks that claim memories for ``model`` is hashed
    from (``hashtext``; the second key is the memory's rowid folded into 32 bits; the
    migrations' and leases' one-key locks live in another space). Per model: a worker embedding
    a memory for one model never makes another model's worker skip it (a server switching
    models, or ``ctxwarden embed --model`` beside a running server)."""
    return f"ctxwarden.embed-claim.{model}"


def _literal(vector: npt.NDArray[np.float32]) -> str:
    return "[" + ",".join(f"{float(x):.7g}" for x in vector) + "]"


def _found(rows: Sequence[Sequence[Any]], rowids_only: bool) -> list[tuple[Any, float]]:
    """A vector search's rows as (memory or rowid, cosine), best first, ties by rowid."""
    if rowids_only:
        nearest = [(int(r[0]), float(r[-1])) for r in rows]
        nearest.sort(key=lambda pair: (-pair[1], pair[0]))
        return nearest
    found = [(memory_of(r[:-1]), float(r[-1])) for r in rows]
    found.sort(key=lambda pair: (-pair[1], pair[0].rowid))
    return found
