"""The ``Store`` protocol: what every storage backend (SQLite, PostgreSQL) provides.

The engine holds the logic (de-duplication decisions, assembly, compaction planning); a store
only keeps and finds rows, transactionally. Writes go through a :class:`Writer` obtained from
``store.write()``, a unit of work that commits on success and rolls back on any error, so a bad
batch leaves the store as it was.

Every read takes a ``tenant`` and filters by it in the query itself (rule 6).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

from ctxwarden.types import Memory

__all__ = [
    "ApiKey",
    "ContextLog",
    "Inclusion",
    "KeyStore",
    "NewMemory",
    "Store",
    "TokenCount",
    "Writer",
]


@dataclass(frozen=True, kw_only=True, slots=True)
class NewMemory:
    """A memory about to be inserted (ingest has validated it and made its keys)."""

    id: str
    tenant: str
    session: str
    channel: str | None
    author: str | None
    author_kind: str
    role: str
    content: str
    created_at: float
    thread_id: str | None
    reply_to: str | None
    kind: str
    pinned: bool
    name: str | None
    tool_calls: Sequence[Mapping[str, Any]]
    tool_call_id: str | None
    attachments: Sequence[Mapping[str, Any]]
    metadata: Mapping[str, Any]
    content_hash: str
    near_key: str | None = None
    source_ids: Sequence[str] = ()
    time_range: tuple[float, float] | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class TokenCount:
    """Tokens of one memory under one tokenizer: as a chat message and as a rendered line."""

    rowid: int
    tokenizer: str
    message: int
    line: int


@dataclass(frozen=True, kw_only=True, slots=True)
class Inclusion:
    """One memory in an assembled context: which block, what it cost."""

    rowid: int
    id: str
    block: str
    tokens: int


@dataclass(frozen=True, kw_only=True, slots=True)
class ContextLog:
    """One row of the inclusion log, and the access bumps it implies."""

    id: str
    tenant: str
    session: str
    created_at: float
    model: str
    tokenizer: str
    exact: bool
    cap: int
    tokens: int
    blocks: Mapping[str, Mapping[str, int]]
    inclusions: Sequence[Inclusion] = field(default_factory=tuple)


@dataclass(frozen=True, kw_only=True, slots=True)
class ApiKey:
    """An API key as stored: never the secret, only its hash."""

    key_id: str
    tenant: str
    scopes: frozenset[str]
    secret_hash: str
    name: str | None
    created_at: float
    revoked_at: float | None = None


@runtime_checkable
class KeyStore(Protocol):
    """Where the servers keep API keys (a separate seam from :class:`Store`)."""

    def put_api_key(self, key: ApiKey) -> None:
        """Insert a key; :class:`~ctxwarden.errors.ConflictError` if its id exists."""

    def api_key(self, key_id: str) -> ApiKey | None:
        """The key with this id (revoked ones included), or None."""

    def api_keys(self, tenant: str | None = None) -> list[ApiKey]:
        """Keys of ``tenant`` (every tenant when None), oldest first."""

    def revoke_api_key(self, key_id: str, at: float) -> bool:
        """Mark a key revoked; False if there is no such key."""


@runtime_checkable
class Writer(Protocol):
    """A unit of work: every call runs in one transaction that commits at the end."""

    def resolve(self, tenant: str, id: str) -> str | None:
        """The id of the memory that ``id`` lives in now (itself, its aggregate), or None."""

    def find_exact(
        self, tenant: str, channel: str | None, content_hash: str, since: float
    ) -> tuple[int, str] | None:
        """The newest memory in ``channel`` with ``content_hash`` seen at or after ``since``."""

    def insert(self, memory: NewMemory) -> int:
        """Insert a memory and index it; returns its rowid."""

    def insert_or_fold(self, memory: NewMemory, *, since: float | None) -> tuple[str, int, str]:
        """Store ``memory``, or fold it into the newest verbatim copy in its channel.

        ``since`` is the start of the de-duplication window (None: never fold). Returns
        ``(status, rowid, id)``: ``stored``; ``duplicate`` (folded into memory ``id``); ``known``
        (the caller id was stored meanwhile, by this or another writer). Safe when several
        processes ingest the same message at the same moment: exactly one stores it.
        """

    def fold(self, rowid: int, *, alias: str, status: str, seen_at: float) -> None:
        """Fold a duplicate into ``rowid``: bump dup_count and last_seen_at, keep the alias."""

    def put_token_counts(self, counts: Sequence[TokenCount]) -> None:
        """Store token counts (replacing any for the same memory and tokenizer)."""

    def set_pinned(self, tenant: str, id: str, pinned: bool) -> bool:
        """Pin or unpin the memory ``id`` lives in; False if there is none in ``tenant``."""

    def delete(self, tenant: str, id: str, *, deleted_at: float, reason: str) -> bool:
        """Delete the memory ``id`` lives in (row, aliases, FTS entry, token counts) and leave a
        content-free tombstone; False if there is none in ``tenant``."""


@runtime_checkable
class Store(Protocol):
    """A storage backend. Implementations: ``SQLiteStore``, ``PostgresStore``."""

    def write(self) -> AbstractContextManager[Writer]:
        """A transaction for writes; rolls back if the block raises."""

    def get(self, tenant: str, id: str) -> Memory:
        """The memory with caller id ``id`` (or the aggregate it was folded into); NotFound."""

    def recent(
        self,
        tenant: str,
        session: str,
        *,
        channel: str | None = None,
        before: tuple[float, int] | None = None,
        limit: int = 64,
    ) -> list[Memory]:
        """The session's messages newest first, strictly before ``(created_at, rowid)``."""

    def pinned(self, tenant: str, *, session: str | None = None) -> list[Memory]:
        """Pinned memories and facts, oldest first."""

    def summaries(self, tenant: str, *, session: str | None = None) -> list[Memory]:
        """Summary memories, oldest first."""

    def search(
        self, tenant: str, terms: Sequence[str], *, limit: int = 100
    ) -> list[tuple[Memory, float]]:
        """Full-text candidates for ``terms`` (any of them), best first, with a positive score."""

    def token_counts(self, rowids: Sequence[int], tokenizer: str) -> dict[int, TokenCount]:
        """Cached token counts for these memories under ``tokenizer`` (missing ones left out)."""

    def put_token_counts(self, counts: Sequence[TokenCount]) -> None:
        """Cache token counts computed outside ingest (a model's first use of a tokenizer)."""

    def log_context(self, entry: ContextLog) -> None:
        """Write the inclusion log row and bump access stats of every included memory."""

    def inclusions(self, context_id: str) -> list[dict[str, Any]]:
        """The inclusion log of one context: ``[{memory_id, block, tokens}]`` in order."""

    def stats(self, tenant: str) -> dict[str, Any]:
        """Counts for ``ctxwarden stats``: memories, folded duplicates, per channel."""

    def iter_memories(self, tenant: str) -> Iterator[Memory]:
        """Every memory of a tenant, oldest first (exports, maintenance)."""

    def close(self) -> None:
        """Release connections. Idempotent."""

    # -- vectors (added on branch ``retrieve``) ----------------------------------------------

    def put_vectors(
        self, model: str, rowids: Sequence[int], vectors: npt.NDArray[np.float32]
    ) -> int:
        """Store one embedding per memory under the embedding ``model``'s name (replacing any).

        Memories deleted meanwhile are skipped; returns how many were stored. A model's vectors
        all have one length (:class:`~ctxwarden.errors.InputError` otherwise).
        """

    def pending_embeddings(
        self, model: str, *, after: int = 0, limit: int = 256
    ) -> list[tuple[int, str]]:
        """Up to ``limit`` memories (every tenant) with text and no ``model`` vector, as
        ``(rowid, content)`` in rowid order after ``after``. Tool results are left out."""

    def vector_models(self) -> dict[str, int]:
        """How many vectors each embedding model has in the store (to detect a model change)."""

    def drop_vectors(self, model: str) -> int:
        """Delete every vector of ``model``; returns how many."""

    def vector_search(
        self,
        tenant: str,
        model: str,
        vector: npt.NDArray[np.float32],
        *,
        k: int = 100,
        session: str | None = None,
        author: str | None = None,
    ) -> list[tuple[Memory, float]]:
        """The ``k`` memories of ``tenant`` (and ``session``, and ``author``) whose ``model``
        vectors are nearest ``vector``: ``(memory, cosine)``, best first, ties by rowid. Only
        ``model``'s vectors are searched, never another model's. Tenant-filtered in the query
        (rule 6)."""

    def authors(self, tenant: str) -> list[str]:
        """The distinct authors of ``tenant``'s memories, sorted (to match names in a query)."""
