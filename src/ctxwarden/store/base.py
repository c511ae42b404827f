"""The ``Store`` protocol: what every storage backend (SQLite, PostgreSQL) provides.

The engine holds the logic (de-duplication decisions, assembly, compaction planning); a store
only keeps and finds rows, transactionally. Writes go through a :class:`Writer` obtained from
``store.write()``, a unit of work that commits on success and rolls back on any error, so a bad
batch leaves the store as it was.

Every read takes a ``tenant`` and filters by it in the query itself (rule 6).

Semantic de-dup (``ctxwarden.semantic``) added ``Writer.merge`` (fold a stored memory into
another, erasing its text), ``Store.memories_at`` and ``Store.vector_window``.

Compaction (``ctxwarden.compact``) added four methods; a backend implements them so that a
cluster's summary, deletions and tombstones commit together:

- ``Writer.retire(tenant, ids, summary_rowid=, deleted_at=, reason=)``: delete memories from
  every table and index, re-point their aliases and old tombstones to the summary, write one
  content-free :class:`Tombstone` each; ``get``/``resolve`` of a retired id then follow its
  tombstone to the summary.
- ``Store.compaction_candidates(tenant, created_before=)``: old unpinned messages with the time
  of their access score (the score itself decays from then; the planner brings it to now).
- ``Store.tombstones(tenant, summary_id=None)``: read tombstones back.
- ``Store.vacuum()``: reclaim the space of what compaction deleted.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

from ctxwarden._fastinit import fast_init
from ctxwarden.errors import StoreError
from ctxwarden.scope import ReadScope
from ctxwarden.types import Memory

__all__ = [
    "AggregateUpdate",
    "Alias",
    "ApiKey",
    "ContextLog",
    "Edit",
    "Edited",
    "ErasureReceipt",
    "FoldTarget",
    "Inclusion",
    "KeyStore",
    "Link",
    "Maintenance",
    "NewMemory",
    "Store",
    "TokenCount",
    "Tombstone",
    "Version",
    "Writer",
    "scrub_until_done",
]


@dataclass(frozen=True, kw_only=True)
class ErasureReceipt:
    """What one erasure removed: the ``ids`` that no longer resolve (memories, their aliases,
    ids compacted into a summary, summaries removed because nothing of theirs was left), the
    summaries rewritten without the erased sources' lines, the aggregates whose folded
    duplicates went with them, and how many stored vectors were deleted.

    >>> ErasureReceipt(ids=("m1",), vectors=1).ids
    ('m1',)
    """

    ids: tuple[str, ...] = ()
    summaries_rewritten: tuple[str, ...] = ()
    summaries_removed: tuple[str, ...] = ()
    aggregates_touched: tuple[str, ...] = ()
    vectors: int = 0
    #: The rows deleted (the store's own keys; for caches and vector indexes).
    rowids: tuple[int, ...] = ()

    def to_json(self) -> dict[str, Any]:
        """The receipt as JSON (``rowids`` left out: they are the store's internals)."""
        return {
            "ids": list(self.ids),
            "summaries_rewritten": list(self.summaries_rewritten),
            "summaries_removed": list(self.summaries_removed),
            "aggregates_touched": list(self.aggregates_touched),
            "vectors": self.vectors,
        }


@fast_init
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
    user: str | None = None


@fast_init
@dataclass(frozen=True, kw_only=True, slots=True)
class FoldTarget:
    """A stored memory that a new record may fold into: what the de-dup rule compares.

    ``latest_content`` is the newest folded member's content when it differs in values from
    ``content`` (None otherwise); its time is ``last_seen_at``.
    """

    rowid: int
    id: str
    tenant: str
    session: str
    channel: str | None
    author: str | None
    author_kind: str
    content: str
    latest_content: str | None
    attachments: Sequence[Mapping[str, Any]]
    created_at: float
    content_hash: str
    near_key: str | None
    dup_count: int
    last_seen_at: float
    user: str | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class AggregateUpdate:
    """How a batch changed an aggregate: ``folded`` is added to ``dup_count`` (an increment, safe
    across processes); ``last_seen_at`` and ``latest_content`` apply when they are at least as new
    as the stored ones."""

    rowid: int
    folded: int
    last_seen_at: float
    latest_content: str | None


@fast_init
@dataclass(frozen=True, kw_only=True, slots=True)
class Alias:
    """An id folded into (or compacted into) the memory at ``rowid``."""

    tenant: str
    id: str
    rowid: int
    status: str
    created_at: float
    #: The session the folded record came from (erasing it takes the record out again).
    session: str | None = None


@fast_init  # an assemble reads a few hundred (~0.5 us each, against ~0.7)
@dataclass(frozen=True, kw_only=True, slots=True)
class TokenCount:
    """Tokens of one memory under one tokenizer: as a chat message and as a rendered line."""

    rowid: int
    tokenizer: str
    message: int
    line: int


@dataclass(frozen=True, kw_only=True, slots=True)
class Edit:
    """New text for a stored memory (:meth:`Writer.edit`): its content and the de-dup keys and
    metadata that go with it."""

    tenant: str
    id: str
    content: str
    content_hash: str
    near_key: str | None
    metadata: Mapping[str, Any]
    attachments: tuple[Mapping[str, Any], ...] = ()


@dataclass(frozen=True, kw_only=True, slots=True)
class Edited:
    """What :meth:`Writer.edit` changed: the row and the fields a rendering of it needs."""

    rowid: int
    role: str
    author: str | None
    kind: str
    created_at: float
    channel: str | None
    #: The number of the superseded version kept (None when ``keep`` was false).
    version: int | None


@dataclass(frozen=True, kw_only=True, slots=True)
class Version:
    """A text an edit replaced (:meth:`Store.versions`), in force from ``valid_from`` until
    ``valid_until``."""

    version: int
    content: str
    valid_from: float
    valid_until: float

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {
            "version": self.version,
            "content": self.content,
            "valid_from": self.valid_from,
            "valid_until": self.valid_until,
        }


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
class Maintenance(Protocol):
    """What a background compactor needs of a store (a separate seam from :class:`Store`): a
    lease that lets one compactor run at a time across every process and server sharing the
    store, and the tenants to visit.

    SQLite keeps the lease as a row (owner, expiry): a holder that dies without releasing it
    blocks others until it expires. PostgreSQL holds a session advisory lock on a connection of
    its own, which the server lets go when the holder's connection ends.
    """

    def acquire_lease(self, name: str, owner: str, *, now: float, ttl: float) -> str | None:
        """Take the lease ``name`` for ``owner`` until ``now + ttl`` (or extend it when
        ``owner`` holds it already). None when taken; else who holds it (nothing changed)."""

    def release_lease(self, name: str, owner: str) -> None:
        """Give the lease up if ``owner`` holds it (a no-op otherwise)."""

    def tenants(self) -> list[str]:
        """Every tenant with stored memories, sorted."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Tombstone:
    """What is left of a deleted memory: no content, never retrieved (compaction adds these)."""

    tenant: str
    id: str
    deleted_at: float
    summary_id: str | None
    content_hash: str
    time_range: tuple[float, float] | None
    reason: str


@runtime_checkable
class Writer(Protocol):
    """A unit of work: every call runs in one transaction that commits at the end."""

    def resolve(self, tenant: str, id: str) -> str | None:
        """The id of the memory that ``id`` lives in now (itself, its aggregate, the summary
        that absorbed it), or None."""

    def resolve_many(self, tenant: str, ids: Sequence[str]) -> dict[str, str]:
        """:meth:`resolve` for many ids at once; unknown ids are left out."""

    def find_targets(
        self,
        tenant: str,
        *,
        exact_scope: str,
        exact: Sequence[tuple[str | None, str]],
        exact_since: float,
        near: Sequence[tuple[str | None, str]],
        near_since: float,
        near_limit: int | None = None,
    ) -> list[FoldTarget]:
        """Every message that a batch's records may fold into, in indexed lookups: those whose
        (session or channel, per ``exact_scope``; content_hash) is in ``exact`` and were last seen
        at or after ``exact_since``, and those whose (channel, near_key) is in ``near`` and were
        last seen at or after ``near_since`` (only the newest ``near_limit`` of each (channel,
        near_key) when given: a person's messages that differ in values share a near key and
        never fold, and would otherwise all be read). Each memory at most once, in no particular
        order."""

    def update_aggregates(self, updates: Sequence[AggregateUpdate]) -> None:
        """Add ``folded`` to dup_count; take last_seen_at and latest_content when newer."""

    def add_aliases(self, aliases: Sequence[Alias]) -> list[str]:
        """Record ids that now live in another memory; returns the ids not added because another
        writer stored them (as a memory or an alias) since :meth:`resolve_many`."""

    def insert(self, memory: NewMemory) -> int:
        """Insert a memory and index it; returns its rowid."""

    def insert_or_fold(
        self, memory: NewMemory, *, heads: Sequence[str] = (), since: float = 0.0
    ) -> tuple[str, int, str]:
        """Insert ``memory`` unless another writer got there first; ``(status, rowid, id)``.

        The caller decided to store ``memory`` from :meth:`find_targets` and :meth:`resolve_many`
        within this transaction. A writer in another process may have committed since: then the
        status is ``known`` (its caller id was stored meanwhile; ``id`` is where it lives) or,
        when ``heads`` names layer-A scopes (``"channel:dev"``, ``"session:s1"``),
        ``duplicate``: a verbatim copy with the same ``content_hash`` in one of those scopes,
        last seen at or after ``since``, was committed, and ``memory`` was folded into it (alias
        and ``dup_count`` included). Otherwise ``stored``, and ``memory`` is the head of each
        scope. Backends whose writers are serialised (SQLite) always store.
        """

    def insert_row_or_fold(
        self, values: tuple[Any, ...], *, heads: Sequence[str] = (), since: float = 0.0
    ) -> tuple[str, int, str]:
        """:meth:`insert_or_fold` for a memory given as its insert values after the rowid
        (``memory_row(None, memory)[1:]``, see :mod:`ctxwarden.store.reads`): ingest builds
        that tuple directly rather than a :class:`NewMemory` and then its row."""

    def put_token_counts(self, counts: Sequence[TokenCount]) -> None:
        """Store token counts (replacing any for the same memory and tokenizer)."""

    def edit(self, edit: Edit, *, edited_at: float, keep: bool) -> Edited | str | None:
        """Replace the text of the memory whose own id is ``edit.id`` (issue 19).

        In this transaction: the old text becomes a row of ``memory_versions`` when ``keep``
        (else it is gone), content, hash, near key, metadata and attachments take the new values
        (``latest_content`` is cleared), the full-text entry follows, its token counts and
        vectors are dropped (the caller counts again; embedding finds it pending). Returns
        :class:`Edited`; ``"unchanged"`` when the text and attachments are the same; ``None``
        when ``edit.id`` is not a memory of its own in ``edit.tenant`` (unknown, an alias or
        compacted).
        """

    def set_key(self, tenant: str, rowid: int, key: str, *, user: str | None) -> list[str]:
        """Give the memory at ``rowid`` the subject ``key``; of ``tenant``'s memories with that
        key and end user ``user``, each but the newest (by created_at, then rowid) is then
        superseded by the next (:meth:`Store.supersessions`). The ids superseded."""

    def supersede(self, links: Sequence[tuple[int, str, float]]) -> None:
        """Link each ``(rowid, successor id, valid_until)``: the memory at ``rowid`` was
        superseded by a later message that changed it (:mod:`ctxwarden.validity`); one already
        superseded keeps its link. Neither side is changed otherwise."""

    def set_pinned(self, tenant: str, id: str, pinned: bool, *, scope: str | None = None) -> bool:
        """Pin or unpin the memory ``id`` lives in; False if there is none in ``tenant``.

        ``scope``: where the pin is visible (:meth:`Store.pinned`): None or ``"session"`` its
        own session, ``"user"`` its end user's sessions, ``"tenant"`` every read of the tenant.
        """

    def delete(self, tenant: str, id: str, *, deleted_at: float, reason: str) -> bool:
        """Delete the memory ``id`` lives in (row, aliases, FTS entry, token counts, vectors) and
        every summary whose ``source_ids`` name it (transitively), each leaving a content-free
        tombstone; False if there is none in ``tenant``."""

    def erase_id(
        self, tenant: str, id: str, *, deleted_at: float, reason: str
    ) -> ErasureReceipt | None:
        """:meth:`delete`, with a receipt; also erases an id compacted into a summary (its
        tombstone names the summary): every summary citing an erased id is rewritten without
        the lines that cite it, or removed (with a tombstone) when no cited line is left. A
        compacted id goes with the aliases compaction moved from it onto its summary, and such
        an alias's id erases that compacted id (not the whole summary).
        None if ``id`` is neither stored, an alias nor compacted in ``tenant``."""

    def erase_session(
        self, tenant: str, session: str, *, deleted_at: float, reason: str
    ) -> ErasureReceipt:
        """:meth:`delete_session` with a receipt."""

    def erase_tenant(self, tenant: str, *, deleted_at: float, reason: str) -> ErasureReceipt:
        """:meth:`delete_tenant` with a receipt."""

    def delete_session(
        self, tenant: str, session: str, *, deleted_at: float, reason: str
    ) -> list[int]:
        """:meth:`delete` every memory of ``session`` (and the summaries built from them), and
        the session's inclusion log; the rowids removed."""

    def delete_tenant(self, tenant: str, *, deleted_at: float, reason: str) -> list[int]:
        """:meth:`delete` every memory of ``tenant`` and its inclusion log; the rowids removed.
        Tombstones remain; the tenant's API keys are revoked (``revoked_at = deleted_at``) in
        the same transaction."""

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
        """Replace the memories ``ids`` by the summary at ``summary_rowid`` (compaction).

        With ``archive_until`` each row is first kept, compressed, in the archive
        (:meth:`Store.archived` reads it back) until that time.

        For each id that is a memory of its own: its aliases are re-pointed to the summary (the
        summary's metadata records, as ``alias_sources``, alias id -> that id) and the id
        itself resolves through its tombstone (``get`` and ``resolve`` follow
        ``tombstone.summary_id``), so lookups by any old id find the summary; tombstones that
        named it as their summary now name the summary (summaries of summaries); one content-free
        :class:`Tombstone` is written (``time_range`` = created_at .. last_seen_at, or the
        memory's own time_range) and the row is deleted from every table and index.
        Returns how many were retired; ids that are not memories are left alone.
        """

    def purge_archive(self, now: float) -> int:
        """Delete the archived originals that expired by ``now``; how many."""

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
        """Fold the stored memory ``id`` into the memory ``into`` (semantic de-dup, layer C).

        In this transaction: ``into``'s ``dup_count``, ``access_count`` and
        ``included_tokens_total`` grow by ``id``'s, ``last_seen_at`` and ``last_accessed_at``
        take the later, the decayed access scores add up, and when ``id`` was seen after
        ``into``, ``into``'s ``latest_content`` becomes ``latest_content`` (the caller decides:
        the newer member's text when its values differ, as layer B keeps it; else None);
        ``id``'s aliases are re-pointed to ``into`` and ``id`` itself becomes an alias with
        ``status``; ``id``'s row leaves every table and index (token counts, vectors,
        full-text), as :meth:`delete` would, so ``get``/``resolve`` of ``id`` find ``into``.
        False (nothing changed) unless both are memories of their own in ``tenant`` and differ.
        """


@dataclass(frozen=True, slots=True)
class Link:
    """A memory next to an anchor in its conversation (:meth:`Store.neighbours`).

    ``relation``: ``"before"`` / ``"after"`` (the nearest turns in the anchor's thread, or in
    its session and channel when it is in no thread), ``"parent"`` (the message it replies to),
    ``"root"`` (its thread's first message), ``"reply"`` (a message replying to it or in the
    thread it starts), ``"sibling"`` (another reply to its parent).
    """

    anchor: int  # index into the anchors asked for
    relation: str
    memory: Memory


@runtime_checkable
class Store(Protocol):
    """A storage backend. Implementations: ``SQLiteStore``, ``PostgresStore``."""

    def write(self) -> AbstractContextManager[Writer]:
        """A transaction for writes; rolls back if the block raises."""

    def get(self, tenant: str, id: str) -> Memory:
        """The memory with caller id ``id`` (or the aggregate it was folded into, or the summary
        its tombstone names); NotFound."""

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
        """The session's messages (of end user ``user`` when given) newest first, strictly
        before ``(created_at, rowid)``."""

    def pinned(
        self, tenant: str, *, session: str | None = None, scope: ReadScope | None = None
    ) -> list[Memory]:
        """Pinned memories and facts visible in ``scope`` (all of the tenant's when None),
        oldest first: a fact where its memory is, a pin where it was pinned for."""

    def summaries(
        self, tenant: str, *, session: str | None = None, scope: ReadScope | None = None
    ) -> list[Memory]:
        """Summary memories in ``scope`` (or of ``session``), oldest first."""

    def search(
        self,
        tenant: str,
        terms: Sequence[str],
        *,
        limit: int = 100,
        require: Collection[str] = (),
        known: Mapping[int, Memory] | None = None,
        scope: ReadScope | None = None,
    ) -> list[tuple[Memory, float]]:
        """Full-text candidates for ``terms`` (any of them), best first, with a positive score.

        Only memories in ``scope`` (the whole tenant when None), filtered in the query: the
        ``limit`` best of the scope, never fewer because other scopes matched better.

        With ``require`` (some of ``terms``), nothing is searched (``[]``) unless one of them is
        among the terms worth searching (too common ones are left out): a bridge hop on a
        hit's new words whose every new word is too common would repeat the main search.
        ``known``: memories of ``tenant`` read earlier in the same retrieval, by rowid; a
        backend may return these instead of reading their rows again (the same results)."""

    def supersessions(self, tenant: str, rowids: Sequence[int]) -> dict[int, tuple[str, float]]:
        """Of the memories at ``rowids``, those superseded by a newer one with the same key:
        rowid -> (the successor's id, the time it stopped being in force)."""

    def archived(self, tenant: str, summary_id: str, *, now: float) -> list[Memory]:
        """The originals compacted into ``summary_id`` and archived
        (``keep_originals="archive"``), not expired at ``now``, oldest first; ``[]`` for none.
        Erasure removes an erased memory's archived copy with it."""

    def versions(self, tenant: str, id: str) -> list[Version]:
        """The texts edits replaced in the memory ``id`` lives in, oldest first (``[]`` for
        none, or for no such memory)."""

    def token_counts(self, rowids: Sequence[int], tokenizer: str) -> dict[int, TokenCount]:
        """Cached token counts for these memories under ``tokenizer`` (missing ones left out)."""

    def put_token_counts(self, counts: Sequence[TokenCount], *, wait: float | None = None) -> None:
        """Cache token counts computed outside ingest (a model's first use of a tokenizer).

        ``wait``: the longest wait for the write lock, in seconds (None: the store's timeout;
        never longer); past it :class:`~ctxwarden.errors.StoreUnavailable` (``locked``) and
        nothing is stored. Assembly passes a short one: a cache write is not worth a request
        waiting behind another process's writers."""

    def log_context(self, entry: ContextLog) -> None:
        """Write the inclusion log row and bump access stats of every included memory."""

    def log_contexts(self, entries: Sequence[ContextLog]) -> None:
        """:meth:`log_context` of each entry in order, in one transaction: all are written or
        none (an error rolls the whole list back and is raised). The engine's background log
        writer (``EngineConfig(inclusion_log="deferred")``) writes its batches with it."""

    def inclusions(self, context_id: str) -> list[dict[str, Any]]:
        """The inclusion log of one context: ``[{memory_id, block, tokens}]`` in order."""

    def stats(self, tenant: str, *, scope: ReadScope | None = None) -> dict[str, Any]:
        """Counts for ``ctxwarden stats``: per channel ``seen``, ``memories``, ``folded``,
        ``exact`` and ``near`` (folds by layer); totals; ``top_families``. Only memories in
        ``scope`` count (the whole tenant when None)."""

    def compaction_candidates(
        self, tenant: str, *, created_before: float
    ) -> list[tuple[Memory, float | None]]:
        """Unpinned ``message`` memories created and last seen before ``created_before``, with
        the time their ``access_score`` was last updated (None if never), for compaction."""

    def tombstones(self, tenant: str, *, summary_id: str | None = None) -> list[Tombstone]:
        """Tombstones of a tenant (those pointing at ``summary_id`` when given), by id."""

    def vacuum(self, *, full: bool = False) -> None:
        """Reclaim the space of deleted rows (after compaction): SQLite merges FTS segments
        and VACUUMs (the file is rewritten and shrinks, ``full`` or not); PostgreSQL runs
        ``VACUUM (ANALYZE)`` (space reusable, the deleted rows' bytes stay in the pages until
        overwritten) or, ``full``, ``VACUUM (FULL, ANALYZE)`` of the whole database (every
        table rewritten into new files, the old ones removed; it locks each table while it
        runs: a maintenance window)."""

    def iter_memories(self, tenant: str) -> Iterator[Memory]:
        """Every memory of a tenant, oldest first (exports, maintenance)."""

    def close(self) -> None:
        """Release connections. Idempotent."""

    def scrub(self) -> None:
        """After deletes: make the deleted text unrecoverable from the backend's files where the
        backend can (SQLite: drop deleted terms from the FTS index, save the vector index files
        without deleted vectors, checkpoint and truncate the WAL). Raises
        :class:`~ctxwarden.errors.StoreError` when it could not finish yet: callers that have
        committed an erasure retry (:func:`scrub_until_done`)."""

    # -- vectors (added on branch ``retrieve``) ----------------------------------------------

    def put_vectors(
        self,
        model: str,
        rowids: Sequence[int],
        vectors: npt.NDArray[np.float32],
        *,
        wait: float | None = None,
    ) -> int:
        """Store one embedding per memory under the embedding ``model``'s name (replacing any).

        Memories deleted meanwhile are skipped; returns how many were stored. A model's vectors
        all have one length (:class:`~ctxwarden.errors.InputError` otherwise). ``wait`` bounds
        the wait for the write lock as in :meth:`put_token_counts`.
        """

    def pending_embeddings(
        self, model: str, *, after: int = 0, limit: int = 256
    ) -> list[tuple[int, str]]:
        """Up to ``limit`` memories (every tenant) with text or attachments and no ``model``
        vector, as ``(rowid, text)`` in rowid order after ``after``: the text is the content
        and its attachments' words (``reads.embedded_text``). Tool results are left out."""

    def embed_pending_batch(
        self,
        model: str,
        embed: Callable[[list[str]], npt.NDArray[np.float32]],
        *,
        after: int = 0,
        limit: int = 32,
    ) -> list[int]:
        """Embed up to ``limit`` memories that :meth:`pending_embeddings` lists after ``after``:
        ``embed`` gets their texts and returns one vector each, stored under ``model``. Returns
        the rowids stored, in rowid order (``[]``: nothing left to claim).

        Several processes may share a store: a memory one of them is embedding is skipped by
        the others, so each pending memory is embedded once (PostgreSQL: a transaction-scoped
        advisory lock per memory, taken with ``pg_try_advisory_xact_lock`` and held while
        ``embed`` runs; no row lock, so ingest and access bumps never wait for an embedder).
        An embedded SQLite store has one writer process in practice: a second one may embed a
        memory twice, which only costs time (the second vector replaces the first)."""

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
        scope: ReadScope | None = None,
    ) -> list[tuple[Memory, float]]:
        """The ``k`` memories of ``tenant`` (and ``session``, and ``author``, and ``scope``)
        whose ``model`` vectors are nearest ``vector``: ``(memory, cosine)``, best first, ties
        by rowid. Only ``model``'s vectors are searched, never another model's. Tenant- and
        scope-filtered in the query (rule 6); ``k`` are returned whenever the scope holds ``k``
        vectors (a backend whose index cannot filter searches the scope's rows exactly)."""

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
        """:meth:`vector_search` as ``(rowid, cosine)`` pairs, the same in the same order,
        without reading the memories: a caller that needs the cosines of many and the
        memories of a few reads those (:meth:`memories_at`; a row read costs ~10 us)."""

    def authors(self, tenant: str) -> list[str]:
        """The distinct authors of ``tenant``'s memories, sorted (to match names in a query)."""

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
        """The conversation around each anchor, in indexed statements: up to ``turns``
        ``message`` memories before and after it in its place (its thread when it replies in
        one, else its session and channel), its parent (through an alias if the parent was
        folded) and thread root, and the first ``replies`` replies to it and to its parent
        (siblings). An anchor is never its own neighbour; a memory may come in several links.
        Only memories in ``scope`` (the tenant's when None), filtered before each limit.
        Memories in ``known`` (this tenant's, by rowid, read earlier by the caller) need not be
        read again: a backend may return those objects."""

    # -- semantic de-dup (ctxwarden.semantic) ------------------------------------------------

    def memories_at(self, rowids: Sequence[int]) -> list[Memory]:
        """The memories at these rowids, any tenant (maintenance after embedding), by rowid;
        rowids no longer stored are left out."""

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
        """``message`` memories of ``tenant`` with this ``channel`` and ``author`` (None matches
        None) last seen at or after ``seen_since`` and created at or before ``created_until``,
        each with its ``model`` vector (memories without one are left out), oldest first."""


_log = logging.getLogger(__name__)


def scrub_until_done(
    store: Store,
    *,
    attempts: int = 200,
    first_wait: float = 0.01,
    max_wait: float = 1.0,
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    """Run ``store.scrub()`` until it succeeds (a reader may keep SQLite's WAL from being
    truncated for a while): after an erasure has committed, its text must still leave the
    files, so a failed scrub is retried, waiting ``first_wait`` doubling up to ``max_wait``
    between attempts (~3 minutes of waits, plus each attempt's own wait for the lock), not
    reported as the erasure's failure. Returns the attempts taken;
    re-raises the last :class:`~ctxwarden.errors.StoreError` only when every one failed.

    >>> class Flaky:
    ...     calls = 0
    ...     def scrub(self):
    ...         self.calls += 1
    ...         if self.calls < 3:
    ...             raise StoreError("busy")
    >>> from ctxwarden.errors import StoreError
    >>> scrub_until_done(Flaky(), sleep=lambda s: None)  # type: ignore[arg-type]
    3
    """
    wait = first_wait
    for attempt in range(1, attempts + 1):
        try:
            store.scrub()
        except StoreError as exc:
            if attempt == attempts:
                raise
            _log.warning("scrub attempt %d failed (%s): retrying in %.2f s", attempt, exc, wait)
            sleep(wait)
            wait = min(max_wait, wait * 2)
        else:
            return attempt
    raise AssertionError("unreachable")  # pragma: no cover
