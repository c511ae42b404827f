"""The composition root: one :class:`Engine` wires the store, tokenizers, budgets and de-dup.

>>> from ctxwarden import Engine
>>> with Engine.open(":memory:") as engine:
...     _ = engine.ingest([{"id": "m1", "session": "s", "content": "the deploy is at 10:30"}])
...     context = engine.assemble(session="s", query="when is the deploy?", model="gpt-4o")
>>> context.included
('m1',)
"""

from __future__ import annotations

import dataclasses
import gc
import json
import logging
import math
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import xxhash

from ctxwarden import compact as compaction
from ctxwarden import render, tokens
from ctxwarden.assemble import (
    DATA_SOURCES,
    Candidate,
    Material,
    Plan,
    block_reports,
    data_message_text,
    fill,
    memory_message,
    recent_messages,
    system_message_text,
    text_segments,
)
from ctxwarden.budget import BudgetPolicy, allocate, chat_policy
from ctxwarden.counts import COUNT_CACHE_SIZE, CountCache
from ctxwarden.dedupe import (
    DedupeCandidate,
    DedupeConfig,
    conversation_near_key,
    exact_key,
    exact_scopes,
    scope_kinds,
    unfoldable_hash,
)
from ctxwarden.embed import Embedder, get_embedder
from ctxwarden.errors import (
    ConfigError,
    ConflictError,
    CtxwardenError,
    EmbedError,
    InputError,
    NotFound,
)
from ctxwarden.fold import NEAR_CANDIDATES, Aggregate, Analysed, FoldIndex
from ctxwarden.logwriter import DEFAULT_CAPACITY, LogCounters, LogWriter
from ctxwarden.models import ModelSpec, default_registry
from ctxwarden.provenance import (
    PROVENANCE_KEY,
    SIGNATURE_KEY,
    Verdict,
    Verifier,
    claims_tool_result,
    is_untrusted,
)
from ctxwarden.retrieve import MAX_QUERY_CHARS, RetrievalWeights, check_query_length, retrieve
from ctxwarden.scope import ReadScope
from ctxwarden.scope import resolve as resolve_scope
from ctxwarden.scoped_reads import ScopedReads, store_scope
from ctxwarden.semantic import (
    MERGE_STATUS,
    SemanticConfig,
    SemanticFold,
    SemanticReport,
    fold_semantic,
)
from ctxwarden.store.base import (
    AggregateUpdate,
    Alias,
    ContextLog,
    Inclusion,
    Store,
    TokenCount,
    Writer,
)
from ctxwarden.store.sqlite import SQLiteStore
from ctxwarden.summarize import ExtractiveSummarizer, Summarizer, SummaryItem
from ctxwarden.types import (
    CandidateReports,
    Context,
    IngestOutcome,
    IngestResult,
    IngestStatus,
    Memory,
    Record,
    Report,
    Scope,
    check_scope_name,
)

__all__ = ["DEFAULT_DEDUPE", "Engine", "EngineConfig"]

log = logging.getLogger(__name__)

#: The engine's de-dup default: layer A per channel and per session (the same message posted
#: into one channel from several sessions, or by one author into several channels of a session,
#: is one aggregate), both layers within an hour. See README.
DEFAULT_DEDUPE: DedupeConfig = DedupeConfig()

#: Attempts at a write transaction that deadlocks with another process's writer (PostgreSQL).
_WRITE_ATTEMPTS = 5

#: Bound of the in-process cache of analysed aggregates (rowid -> candidate).
CANDIDATE_CACHE_SIZE = 65536


@dataclass(frozen=True, kw_only=True, slots=True)
class EngineConfig:
    """How an engine behaves. Every field has a sensible default.

    ``tokenizers`` are counted at ingest; by default none are: a memory's counts for a tokenizer
    are computed the first time assembly, compaction or summarising needs them, and cached (so
    ingest spends no time in a tokenizer, and assembly counts only what it looks at, once).
    ``dedupe`` sets the de-dup layers at ingest (TTL and scope of exact repeats, window of near
    repeats); see :class:`~ctxwarden.dedupe.DedupeConfig`
    and :data:`DEFAULT_DEDUPE`; ``None`` stores every record (no de-dup). ``verifier`` checks
    the signatures of tool results (:mod:`ctxwarden.provenance`); without one every record that
    claims to be a tool result is stored as untrusted.
    """

    default_model: str = "gpt-4o"
    tokenizers: tuple[str, ...] = ()
    policy: BudgetPolicy = field(default_factory=chat_policy)
    dedupe: DedupeConfig | None = DEFAULT_DEDUPE
    tenant: str = "default"
    models: tuple[ModelSpec, ...] = ()
    related_candidates: int = 70
    recent_page: int = 32
    verifier: Verifier | None = field(default=None, repr=False, compare=False)
    auto_summarize: bool = False
    window_threshold: float = 0.9
    max_window_summaries: int = 8
    #: When memories are embedded: ``"off"`` (only by :meth:`Engine.embed_pending` or
    #: ``ctxwarden embed``), ``"sync"`` (right after each ingest commits), ``"background"`` (a
    #: thread embeds batches after ingest; ingest never waits). Retrieval uses whatever vectors
    #: of ``embedder`` the store holds, whichever way they were made.
    embed: str = "off"
    #: The embedder's name for :func:`ctxwarden.embed.get_embedder` (``"minilm"``, offline).
    embedder: str = "minilm"
    embed_batch: int = 32
    retrieval: RetrievalWeights = field(default_factory=RetrievalWeights)
    #: Layer C of de-dup (:mod:`ctxwarden.semantic`): with ``semantic.enabled`` each embedding
    #: batch is followed by a pass that folds near-identical embeddings (off by default).
    semantic: SemanticConfig = field(default_factory=SemanticConfig)
    #: Bound of the in-process cache of token counts (:mod:`ctxwarden.counts`; ~300 bytes an
    #: entry, so ~20 MB at the default): assembly asks the store only for counts it lacks.
    count_cache_size: int = COUNT_CACHE_SIZE
    #: How :meth:`Engine.assemble` writes its inclusion-log entry and access bumps: ``"sync"``
    #: (before it returns) or ``"deferred"`` (queued for a background thread, written in
    #: batches; every engine method that reads or erases the log or the access stats waits for
    #: what was queued before it; see :mod:`ctxwarden.logwriter`). The servers default to
    #: ``"deferred"``, the library to ``"sync"`` (no thread an in-process user did not ask for).
    inclusion_log: str = "sync"
    #: With ``"deferred"``: entries that may wait; when full, ``assemble`` writes its own.
    inclusion_log_queue: int = DEFAULT_CAPACITY
    #: The longest query ``assemble`` and ``search`` take (characters); longer is an
    #: :class:`InputError` naming ``query``. Retrieval reads only ``retrieval.query_chars``.
    max_query_chars: int = MAX_QUERY_CHARS

    def __post_init__(self) -> None:
        if self.dedupe is not None and not isinstance(self.dedupe, DedupeConfig):
            raise ConfigError(f"dedupe: expected a DedupeConfig, got {type(self.dedupe).__name__}")
        if self.embed not in ("off", "sync", "background"):
            raise ConfigError(f"embed: {self.embed!r} must be 'off', 'sync' or 'background'")
        if self.inclusion_log not in ("sync", "deferred"):
            raise ConfigError(f"inclusion_log: {self.inclusion_log!r} must be 'sync' or 'deferred'")
        if self.inclusion_log_queue < 1:
            raise ConfigError(f"inclusion_log_queue: {self.inclusion_log_queue} must be at least 1")
        if self.embed_batch < 1:
            raise ConfigError(f"embed_batch: {self.embed_batch} must be at least 1")
        if not isinstance(self.semantic, SemanticConfig):
            raise ConfigError(
                f"semantic: expected a SemanticConfig, got {type(self.semantic).__name__}"
            )
        if self.related_candidates < 0:
            raise ConfigError(f"related_candidates: {self.related_candidates} is negative")
        if self.count_cache_size < 0:
            raise ConfigError(
                f"count_cache_size: {self.count_cache_size} is negative; 0 turns the cache off"
            )
        if self.max_query_chars < 1:
            raise ConfigError(f"max_query_chars: {self.max_query_chars} must be at least 1")
        if self.recent_page < 1:
            raise ConfigError(f"recent_page: {self.recent_page} must be at least 1")
        if not 0 < self.window_threshold <= 1:
            raise ConfigError(
                f"window_threshold: {self.window_threshold} must be in (0, 1], e.g. 0.9"
            )
        if self.max_window_summaries < 2:
            raise ConfigError(
                f"max_window_summaries: {self.max_window_summaries} must be at least 2"
            )


@dataclass(slots=True)
class _Prepared:
    record: Record
    id: str
    created_at: float
    content_hash: str
    candidate: DedupeCandidate | None  # None: not subject to de-dup (tool calls, facts...)


def _dedupable(record: Record) -> bool:
    # Untrusted records never fold into (or become) an aggregate a trusted record may join.
    # An agent's own turns and tool results are a transcript: a repeated "continue" or an
    # identical tool output is a real turn of it, never a duplicate (issue 16).
    return (
        record.kind == "message"
        and not record.tool_calls
        and record.role not in _TRANSCRIPT_ROLES
        and not is_untrusted(record.metadata)
    )


#: Roles whose records no de-dup layer folds (an agent's transcript).
_TRANSCRIPT_ROLES = frozenset({"assistant", "tool"})


def _with_provenance(record: Record, verifier: Verifier | None) -> Record:
    """The record with the engine's provenance verdict in its metadata.

    A caller can never set the verdict itself: a ``provenance`` key it sends is dropped. A record
    claiming to be a tool result is checked against its signature (which is then dropped).
    """
    claims = claims_tool_result(record.role, record.author_kind)
    if not claims and PROVENANCE_KEY not in record.metadata:
        return record
    metadata = {k: v for k, v in record.metadata.items() if k != PROVENANCE_KEY}
    if claims:
        signature = metadata.pop(SIGNATURE_KEY, None)
        if verifier is None:
            verdict = Verdict(trusted=False, reason="no tool key configured for this tenant")
        else:
            verdict = verifier.check(
                tenant=record.tenant,
                session=record.session,
                tool=record.name,
                call_id=record.tool_call_id,
                content=record.content,
                signature=signature,
            )
        metadata[PROVENANCE_KEY] = verdict.to_metadata()
    return dataclasses.replace(record, metadata=metadata)


@contextmanager
def _collections_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector for a block (a no-op if it is already off).

    Process-wide while the block runs (one ingest batch, tens of milliseconds): objects other
    threads drop meanwhile are freed by reference counting as always; only cycles wait for the
    next collection.
    """
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def _postgres_store(dsn: str) -> Store:
    try:
        from ctxwarden.store.postgres import PostgresStore
    except ImportError as exc:
        raise ConfigError(
            f"db: a postgresql:// URL needs the PostgreSQL driver ({exc.name} is missing); "
            "install it with: pip install 'ctxwarden[postgres]'"
        ) from exc
    return PostgresStore(dsn)


class Engine(ScopedReads):
    """The engine most users touch: ``ingest``, ``assemble``, ``get``, ``stats``.

    Open with :meth:`open`; close with :meth:`close` or use it as a context manager.
    """

    def __init__(
        self,
        store: Store,
        *,
        config: EngineConfig | None = None,
        clock: Callable[[], float] = time.time,
        embedder: Embedder | None = None,
    ) -> None:
        self.store = store
        self.config = config or EngineConfig()
        self.clock = clock
        self.registry = default_registry()
        for spec in self.config.models:
            self.registry.register(spec)
        # Analysed aggregates by rowid, so layer B does not re-normalise old memories; entries
        # are checked against the row's id and last_seen_at before use.
        self._analysed: OrderedDict[int, Analysed] = OrderedDict()
        # Token counts read or made here, checked against each memory's rendering inputs
        # (:mod:`ctxwarden.counts`): assembly asks the store only for the ones it lacks.
        self._token_counts = CountCache(self.config.count_cache_size)
        self._embedder = embedder
        self._vector_state: tuple[bool, tuple[str, ...]] | None = None
        self._vector_state_at = 0.0
        self._author_cache: dict[str, tuple[float, list[str]]] = {}
        self._embed_lock = threading.Lock()
        self._embed_wake = threading.Event()
        self._embed_stop = threading.Event()
        self._embed_thread: threading.Thread | None = None
        self._log_writer = (
            LogWriter(store, capacity=self.config.inclusion_log_queue)
            if self.config.inclusion_log == "deferred"
            else None
        )

    @classmethod
    def open(
        cls,
        path: str | Path,
        *,
        config: EngineConfig | None = None,
        clock: Callable[[], float] = time.time,
        embedder: Embedder | None = None,
    ) -> Engine:
        """Open (creating if needed) the store at ``path``.

        A file path, ``":memory:"``, or a ``postgresql://`` URL (needs ``ctxwarden[postgres]``).
        ``embedder`` overrides ``config.embedder`` (e.g. a fake in tests).
        """
        text = str(path)
        if text.startswith(("postgresql://", "postgres://")):
            return cls(_postgres_store(text), config=config, clock=clock, embedder=embedder)
        return cls(SQLiteStore(text), config=config, clock=clock, embedder=embedder)

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop background embedding (finishing its batch), write the inclusion-log entries
        still queued (``inclusion_log="deferred"``) and close the store."""
        thread = self._embed_thread
        if thread is not None:
            self._embed_stop.set()
            self._embed_wake.set()
            thread.join()
            self._embed_thread = None
        if self._log_writer is not None:
            self._log_writer.close()
        self.store.close()

    def flush_log(self) -> None:
        """Wait until every inclusion-log entry of the assembles that returned before this
        call is written (``inclusion_log="deferred"``; a no-op with ``"sync"``). The engine's
        own readers of the log and of access stats call it; call it before reading the store
        directly.

        >>> with Engine.open(":memory:", config=EngineConfig(inclusion_log="deferred")) as e:
        ...     context = e.assemble(session="s", query="hello")
        ...     e.flush_log()
        ...     e.inclusions(context.id)
        []
        """
        if self._log_writer is not None:
            self._log_writer.flush()

    def log_counters(self) -> LogCounters:
        """The background log writer's counts: entries pending, written, failed (each also
        logged), and written synchronously because its queue was full. All zero with
        ``inclusion_log="sync"``, where a failed write raises from :meth:`assemble`."""
        if self._log_writer is None:
            return LogCounters(pending=0, written=0, batches=0, failed=0, synchronous=0)
        return self._log_writer.counters()

    def inclusions(self, context_id: str) -> list[dict[str, Any]]:
        """The inclusion log of one assembled context (``Context.id``): ``[{memory_id,
        block, tokens}]`` in the order they were placed; ``[]`` if none was logged."""
        self.flush_log()
        return self.store.inclusions(context_id)

    # -- ingest ------------------------------------------------------------------------------

    def _ingest_tokenizers(self) -> tuple[tokens.Tokenizer, ...]:
        names = self.config.tokenizers or (
            self.registry.resolve(self.config.default_model).tokenizer,
        )
        return tuple(tokens.get_tokenizer(n) for n in names)

    def ingest(
        self,
        records: Iterable[Record | Mapping[str, Any]],
        *,
        tenant: str | None = None,
        session: str | None = None,
        user: str | None = None,
        fold: bool = True,
    ) -> IngestResult:
        """Validate and store records; one outcome per record, in order.

        ``session`` and ``user`` (the end user) fill records that name none. A record without a
        channel belongs to its own conversation: it folds only into its session's (and end
        user's) memories; records naming a channel fold across that channel's sessions.
        Records with role ``assistant`` or ``tool`` are never folded, and ``fold=False`` folds
        nothing in this batch (a proxy storing a conversation verbatim); a known id is still
        ``known``.

        All or nothing: if any record is invalid, :class:`InputError` names its line and field
        and nothing is written. A record whose id is already known is a no-op (``known``).
        Messages go through the two de-dup layers (:mod:`ctxwarden.dedupe`,
        ``config.dedupe``): a verbatim repeat within the TTL (in its channel or session) is
        ``duplicate``; a repeat that differs only in formatting, or a bot's message that differs
        only in volatile values, within the window in its channel is ``near_duplicate``. Either
        folds into the stored aggregate: ``dup_count`` and ``last_seen_at`` are bumped, the
        record's id becomes an alias, and the aggregate keeps the newest member's content when
        its values differ (``latest_content``). Earlier records of the same batch count.
        """
        # A batch's objects all stay reachable until it is written, so a garbage collection
        # during it frees nothing and only walks them again (~5 us per message, see
        # bench/ingest.py): collections wait until the batch is decided and written.
        with _collections_paused():
            prepared, outcomes = self._ingest_batch(
                records, tenant=tenant, session=session, user=user, fold=fold
            )
            result = IngestResult(outcomes=tuple(outcomes))
            touched: set[tuple[str, str]] = set()
            if self.config.auto_summarize:
                touched = {
                    (item.record.tenant, item.record.session)
                    for item, outcome in zip(prepared, outcomes, strict=True)
                    if outcome.status == "stored"
                }
            # Keep the author cache of retrieval current (empty until a retrieval filled it).
            for item in prepared if self._author_cache else ():
                cached = self._author_cache.get(item.record.tenant)
                if (
                    cached is not None
                    and item.record.author
                    and item.record.author not in cached[1]
                ):
                    cached[1].append(item.record.author)
            embed = self.config.embed != "off" and any(o.status == "stored" for o in outcomes)
            # Dropped before collections resume, so the next one need not walk them.
            del prepared, outcomes
        for tenant_name, session_name in sorted(touched):
            self.summarize_session(session_name, tenant=tenant_name)
        if embed:
            self._after_ingest()
        return result

    def _ingest_batch(
        self,
        records: Iterable[Record | Mapping[str, Any]],
        *,
        tenant: str | None,
        session: str | None,
        user: str | None = None,
        fold: bool = True,
    ) -> tuple[list[_Prepared], list[IngestOutcome]]:
        """Validate, decide and write one batch; its prepared records and their outcomes."""
        if not isinstance(fold, bool):
            raise InputError(f"expected true or false, got {fold!r}", field="fold")
        defaults: dict[str, Any] = {}
        if tenant is not None:
            defaults["tenant"] = tenant
        elif self.config.tenant != "default":
            defaults["tenant"] = self.config.tenant
        if session is not None:
            defaults["session"] = check_scope_name(session, "session")
        if user is not None:
            defaults["user"] = check_scope_name(user, "user")
        now = self.clock()
        verifier = self.config.verifier
        # Bound once: this loop runs per record (see bench/ingest.py).
        from_mapping, build = Record.from_mapping, DedupeCandidate.build
        prepared: list[_Prepared] = []
        add = prepared.append
        for number, raw in enumerate(records, start=1):
            if isinstance(raw, Record):
                record = dataclasses.replace(raw, **defaults) if defaults else raw
                # Built directly, the dataclass checked nothing: the names scope every read.
                if record.user is not None:
                    check_scope_name(record.user, "user", line=number)
                check_scope_name(record.session, "session", line=number)
            else:
                record = from_mapping(raw, line=number, defaults=defaults)
            record = _with_provenance(record, verifier)
            created = record.created_at
            if created is None:
                created = now
            record_id = record.id or _derive_id(record, created)
            if fold and _dedupable(record):
                candidate: DedupeCandidate | None = build(
                    author=record.author,
                    author_kind=record.author_kind,
                    content=record.content,
                    attachments=record.attachments,
                    created_at=created,
                )
                assert candidate is not None
                content_hash = candidate.exact_key
                if record.channel is None and candidate.near_key is not None:
                    # Layer B's index is keyed by (channel, near key): a channel-less record's
                    # key names its conversation, so it finds only its own session's messages.
                    candidate = dataclasses.replace(
                        candidate,
                        near_key=conversation_near_key(
                            candidate.near_key, session=record.session, user=record.user
                        ),
                    )
            else:
                candidate = None
                content_hash = exact_key(
                    author=record.author, content=record.content, attachments=record.attachments
                )
                if record.kind == "message":
                    # Never a layer-A target either: a later record must not fold into it.
                    content_hash = unfoldable_hash(content_hash)
            add(_Prepared(record, record_id, created, content_hash, candidate))
        for attempt in range(_WRITE_ATTEMPTS):
            try:
                outcomes, index = self._write_batch(prepared)
                break
            except ConflictError:
                # A deadlock with another process's writer (PostgreSQL): nothing was written;
                # decide again from what is committed now.
                if attempt == _WRITE_ATTEMPTS - 1:
                    raise
                time.sleep(0.01 * 2**attempt)
        # Only after the commit: a rolled-back batch's rowids may be reused.
        cache = self._analysed
        fresh: dict[int, Analysed] = {}
        index.analysed(fresh)
        for rowid, analysed in fresh.items():
            if rowid in cache:
                cache.move_to_end(rowid)
            cache[rowid] = analysed  # a new key goes to the end
        while len(cache) > CANDIDATE_CACHE_SIZE:
            cache.popitem(last=False)
        if cache and prepared and self.config.dedupe is not None:
            # Aggregates last seen before both windows of the newest record can no longer be
            # folded into by records arriving in order: drop them, so the cache holds one window
            # of traffic rather than growing with the store (its objects cost every full
            # garbage collection). A late record re-analyses its target on a miss.
            dedupe = self.config.dedupe
            horizon = max(item.created_at for item in prepared) - max(
                dedupe.exact_ttl_seconds, dedupe.near_window_seconds
            )
            stale: list[int] = []
            for rowid, oldest in cache.items():
                if oldest.seen_at >= horizon:
                    break
                stale.append(rowid)
            for rowid in stale:
                del cache[rowid]
        return prepared, outcomes

    def _write_batch(self, prepared: Sequence[_Prepared]) -> tuple[list[IngestOutcome], FoldIndex]:
        """Decide and write one validated batch in one transaction; the outcomes, and the fold
        index (whose analysed aggregates the caller caches once the batch is committed)."""
        # Only explicitly configured tokenizers count at ingest; the rest count on first use.
        tokenizers = tuple(tokens.get_tokenizer(n) for n in self.config.tokenizers)
        outcomes: list[IngestOutcome] = []
        counts: list[TokenCount] = []
        aliases: list[Alias] = []
        folded_into: dict[tuple[str, str], tuple[int, Aggregate]] = {}
        by_tenant: dict[str, list[_Prepared]] = {}
        for item in prepared:
            by_tenant.setdefault(item.record.tenant, []).append(item)
        config = self.config.dedupe
        index = FoldIndex(config or DEFAULT_DEDUPE, cache=self._analysed)
        heads_of: dict[tuple[str, str | None, str | None], tuple[str, ...]] = {}
        with self.store.write() as writer:
            known: dict[tuple[str, str], str] = {}
            for tenant_name, items in by_tenant.items():
                resolved = writer.resolve_many(tenant_name, [item.id for item in items])
                for id_, where in resolved.items():
                    known[(tenant_name, id_)] = where
                if config is not None:
                    self._prefetch(writer, tenant_name, items, config, index)
            # Bound once: this loop runs per record (see bench/ingest.py).
            find, fold, add = index.find, index.fold, index.add
            insert = writer.insert_row_or_fold
            add_outcome = outcomes.append
            exact_ttl = config.exact_ttl_seconds if config is not None else 0.0
            for item in prepared:
                record = item.record
                item_id = item.id
                key = (record.tenant, item_id)
                existing = known.get(key)
                if existing is not None:
                    add_outcome(
                        IngestOutcome(
                            id=item_id,
                            status="known",
                            duplicate_of=existing if existing != item_id else None,
                        )
                    )
                    continue
                candidate = item.candidate if config is not None else None
                if candidate is not None:
                    found = find(
                        candidate,
                        tenant=record.tenant,
                        session=record.session,
                        channel=record.channel,
                        user=record.user,
                    )
                    if found is not None:
                        aggregate, decision, first_values = found
                        fold(aggregate, candidate, record.content, first_values)
                        status: IngestStatus = (
                            "duplicate" if decision.layer == "exact" else "near_duplicate"
                        )
                        aliases.append(
                            Alias(
                                tenant=record.tenant,
                                id=item_id,
                                rowid=aggregate.rowid,
                                status=status,
                                created_at=item.created_at,
                            )
                        )
                        known[key] = aggregate.id
                        folded_into[key] = (len(outcomes), aggregate)
                        add_outcome(
                            IngestOutcome(
                                id=item_id,
                                status=status,
                                duplicate_of=aggregate.id,
                                reason=decision.reason,
                            )
                        )
                        continue
                    scope = (record.session, record.channel, record.user)
                    heads = heads_of.get(scope)
                    if heads is None:
                        assert config is not None
                        heads = heads_of[scope] = tuple(
                            _head(kind, value, record.user)
                            for kind, value in exact_scopes(
                                config, session=record.session, channel=record.channel
                            )
                        )
                    since = item.created_at - exact_ttl
                else:
                    heads, since = (), item.created_at
                # A concurrent writer (PostgreSQL) may have committed a verbatim copy since the
                # targets were read: the store folds into it then, or reports the id as known.
                stored, rowid, target = insert(_memory_values(item), heads=heads, since=since)
                if stored != "stored":
                    known[key] = target
                    add_outcome(
                        IngestOutcome(
                            id=item_id,
                            status="duplicate" if stored == "duplicate" else "known",
                            duplicate_of=target if target != item_id else None,
                            reason="verbatim copy committed by a concurrent writer"
                            if stored == "duplicate"
                            else None,
                        )
                    )
                    continue
                known[key] = item_id
                if candidate is not None:
                    add(
                        Aggregate.new(
                            rowid=rowid,
                            id=item_id,
                            tenant=record.tenant,
                            session=record.session,
                            channel=record.channel,
                            content=record.content,
                            candidate=candidate,
                            attachments=record.attachments,
                            user=record.user,
                        )
                    )
                if not tokenizers:
                    add_outcome(IngestOutcome(id=item_id, status="stored"))
                    continue
                memory_view = {
                    "role": record.role,
                    "author": record.author,
                    "content": record.content,
                    "kind": record.kind,
                    "created_at": item.created_at,
                    "channel": record.channel,
                    "metadata": record.metadata,
                }
                message_text = render.message_text(memory_view)
                line_text = render.line_text(memory_view)
                counts.extend(
                    TokenCount(
                        rowid=rowid,
                        tokenizer=tok.name,
                        message=tok.count(message_text),
                        line=tok.count(line_text),
                    )
                    for tok in tokenizers
                )
                add_outcome(IngestOutcome(id=item_id, status="stored"))
            if aliases:
                # Another writer (PostgreSQL) stored some of these ids meanwhile: known, not folds.
                for taken in writer.add_aliases(aliases):
                    for alias in aliases:
                        if alias.id == taken:
                            position, aggregate = folded_into[(alias.tenant, alias.id)]
                            aggregate.folded -= 1
                            aggregate.dup_count -= 1
                            owner = writer.resolve(alias.tenant, alias.id)
                            outcomes[position] = IngestOutcome(
                                id=alias.id,
                                status="known",
                                duplicate_of=owner if owner not in (None, alias.id) else None,
                            )
            changed = [a for a in index.changed() if a.folded]
            if changed:
                writer.update_aggregates(
                    [
                        AggregateUpdate(
                            rowid=a.rowid,
                            folded=a.folded,
                            last_seen_at=a.last_seen_at,
                            latest_content=a.latest_content,
                        )
                        for a in changed
                    ]
                )
            if counts:
                writer.put_token_counts(counts)
        return outcomes, index

    @staticmethod
    def _prefetch(
        writer: Writer,
        tenant: str,
        items: Sequence[_Prepared],
        config: DedupeConfig,
        index: FoldIndex,
    ) -> None:
        """Load every stored message the batch's records of ``tenant`` may fold into."""
        # Channel-less records are looked up in their session whatever the config says.
        kinds = dict.fromkeys([*scope_kinds(config), "session"])
        exact: dict[str, list[tuple[str | None, str]]] = {kind: [] for kind in kinds}
        by_channel = exact.get("channel")
        by_session = exact.get("session")
        scoped_by_session = "session" in scope_kinds(config)
        near: list[tuple[str | None, str]] = []
        use_near = config.near
        oldest = None
        for item in items:
            candidate = item.candidate
            if candidate is None:
                continue
            record = item.record
            key = candidate.exact_key
            if record.channel is None:
                assert by_session is not None
                by_session.append((record.session, key))
            else:
                if by_channel is not None:
                    by_channel.append((record.channel, key))
                if scoped_by_session:
                    assert by_session is not None
                    by_session.append((record.session, key))
            if use_near and candidate.near_key is not None:
                near.append((record.channel, candidate.near_key))
            if oldest is None or item.created_at < oldest:
                oldest = item.created_at
        if oldest is None:
            return
        # One lookup per scope kind (channel, session); the near keys ride with the first.
        for number, (scope, pairs) in enumerate(exact.items()):
            if not pairs and not (number == 0 and near):
                continue
            for target in writer.find_targets(
                tenant,
                exact_scope=scope,
                exact=pairs,
                exact_since=oldest - config.exact_ttl_seconds,
                near=near if number == 0 else (),
                near_since=oldest - config.near_window_seconds,
                # FoldIndex.find tries the newest NEAR_CANDIDATES of a near key, no more.
                near_limit=NEAR_CANDIDATES,
            ):
                index.add(Aggregate.of(target))

    # -- embeddings --------------------------------------------------------------------------

    @property
    def embedder(self) -> Embedder:
        """The embedder (built from ``config.embedder`` on first use)."""
        if self._embedder is None:
            self._embedder = get_embedder(self.config.embedder)
        return self._embedder

    def embed_pending(
        self,
        batch_size: int | None = None,
        *,
        reembed: bool = False,
        limit: int | None = None,
        progress: Callable[[int], None] | None = None,
    ) -> int:
        """Embed memories that have no vector of this engine's embedder yet; returns how many.

        Works in batches of ``batch_size`` (default ``config.embed_batch``), each stored in its
        own transaction, so it can be interrupted and resumed. If the store holds vectors of
        another embedding model, :class:`EmbedError` says so (vectors of two models are never
        mixed) unless ``reembed`` is true, which deletes them first. ``progress`` is called with
        the running count after each batch.
        """
        size = batch_size or self.config.embed_batch
        if size < 1:
            raise InputError(f"{size} must be at least 1", field="batch_size")
        embedder = self.embedder
        model = embedder.name
        with self._embed_lock:
            others = sorted(m for m in self.store.vector_models() if m != model)
            if others and not reembed:
                raise EmbedError(
                    f"the store holds vectors of {', '.join(map(repr, others))} but this engine "
                    f"embeds with {model!r}: run `ctxwarden embed --reembed` to replace them, or "
                    "configure the embedder they were made with"
                )
            for other in others:
                self.store.drop_vectors(other)
            done = 0
            after = 0
            while limit is None or done < limit:
                want = size if limit is None else min(size, limit - done)
                pending = self.store.pending_embeddings(model, after=after, limit=want)
                if not pending:
                    break
                vectors = embedder.embed([text[:4000] for _, text in pending])
                done += self.store.put_vectors(model, [r for r, _ in pending], vectors)
                after = pending[-1][0]
                if self.config.semantic.enabled:
                    self._fold_semantic(self.store.memories_at([r for r, _ in pending]), model)
                if progress is not None:
                    progress(done)
                if self._embed_stop.is_set():
                    break
            self._vector_state = None
            return done

    def _fold_semantic(
        self,
        memories: Iterable[Memory],
        model: str,
        *,
        config: SemanticConfig | None = None,
        dry_run: bool = False,
        progress: Callable[[int], None] | None = None,
    ) -> SemanticReport:
        config = config or self.config.semantic

        def window(memory: Memory, since: float) -> list[tuple[Memory, npt.NDArray[np.float32]]]:
            return self.store.vector_window(
                memory.tenant,
                model,
                channel=memory.channel,
                author=memory.author,
                seen_since=since,
                created_until=memory.created_at,
            )

        def merge(fold: SemanticFold) -> bool:
            self.flush_log()  # the merge adds up both memories' access stats
            with self.store.write() as writer:
                return writer.merge(
                    fold.tenant,
                    fold.id,
                    into=fold.into,
                    merged_at=self.clock(),
                    status=MERGE_STATUS,
                    latest_content=fold.latest_content,
                )

        report = fold_semantic(
            memories, window, config, merge=None if dry_run else merge, progress=progress
        )
        if report.folds and not dry_run:
            self._vector_state = None
            self.store.scrub()  # the folded texts leave the files too (as after a delete)
        return report

    def dedupe_semantic(
        self,
        *,
        tenant: str | None = None,
        config: SemanticConfig | None = None,
        dry_run: bool = False,
        progress: Callable[[int], None] | None = None,
    ) -> SemanticReport:
        """Run layer C of de-dup over a tenant's stored, embedded memories (oldest first).

        Each memory folds into its most similar older neighbour of the same channel and author
        within the window when :func:`ctxwarden.semantic.semantic_fold` allows it; ``dry_run``
        plans without writing. ``config`` defaults to ``config.semantic`` (its ``enabled`` is
        ignored here). Memories not embedded yet are skipped: run :meth:`embed_pending` first.
        Idempotent: a second run finds nothing more to fold.

        >>> with Engine.open(":memory:") as engine:
        ...     engine.dedupe_semantic().folds
        []
        """
        tenant = tenant or self.config.tenant
        model = self.embedder.name
        with self._embed_lock:
            report = self._fold_semantic(
                self.store.iter_memories(tenant),
                model,
                config=config,
                dry_run=dry_run,
                progress=progress,
            )
        if report.folds and not dry_run:
            self._analysed.clear()
        return report

    def _after_ingest(self) -> None:
        if self.config.embed == "sync":
            try:
                self.embed_pending()
            except EmbedError as exc:
                log.warning("embedding skipped: %s", exc)
            return
        if self._embed_thread is None:
            self._embed_thread = threading.Thread(
                target=self._embed_loop, name="ctxwarden-embed", daemon=True
            )
            self._embed_thread.start()
        self._embed_wake.set()

    def _embed_loop(self) -> None:
        while not self._embed_stop.is_set():
            self._embed_wake.wait()
            self._embed_wake.clear()
            if self._embed_stop.is_set():
                return
            try:
                self.embed_pending()
            except CtxwardenError as exc:
                log.warning("background embedding stopped: %s", exc)
                return

    def _authors(self, tenant: str) -> list[str]:
        """The tenant's authors, read from the store at most once a minute."""
        cached = self._author_cache.get(tenant)
        if cached is None or time.monotonic() - cached[0] > 60.0:
            cached = (time.monotonic(), self.store.authors(tenant))
            self._author_cache[tenant] = cached
        return cached[1]

    def _vectors_usable(self) -> tuple[bool, tuple[str, ...]]:
        """(the store has vectors of this engine's embedder, the other models it has)."""
        if self._vector_state is None or time.monotonic() - self._vector_state_at > 30.0:
            self._vector_state_at = time.monotonic()
            models = self.store.vector_models()
            if not models:
                self._vector_state = (False, ())
            else:
                name = self.embedder.name
                others = tuple(sorted(m for m in models if m != name))
                self._vector_state = (name in models, others)
        return self._vector_state

    def delete(
        self,
        id: str,
        *,
        tenant: str | None = None,
        reason: str = "deleted",
        user: str | None = None,
        session: str | None = None,
    ) -> None:
        """Erase a memory: its text leaves every table and index, and every summary built from
        it is removed too; content-free tombstones remain. :class:`NotFound` if none, or (with
        ``user`` or ``session``) if it is not that end user's or session's."""
        tenant = tenant or self.config.tenant
        if user is not None or session is not None:
            self.get(id, tenant=tenant, user=user, session=session)  # NotFound outside it
        self.flush_log()  # no entry of an earlier assemble may be written after the erasure
        with self.store.write() as writer:
            found = writer.delete(tenant, id, deleted_at=self.clock(), reason=reason)
        if not found:
            raise NotFound(f"no memory with id {id!r} in tenant {tenant!r}: check the id")
        self._analysed.clear()
        self._token_counts.clear()
        self.store.scrub()

    def delete_session(
        self, session: str, *, tenant: str | None = None, reason: str = "session deleted"
    ) -> int:
        """Erase every memory of ``session`` (and the summaries built from them) and its
        inclusion log, leaving tombstones; how many memories were removed."""
        tenant = tenant or self.config.tenant
        self.flush_log()  # no entry of an earlier assemble may be written after the erasure
        with self.store.write() as writer:
            erased = writer.delete_session(tenant, session, deleted_at=self.clock(), reason=reason)
        self._analysed.clear()
        self._token_counts.clear()
        self.store.scrub()
        return len(erased)

    def delete_tenant(self, *, tenant: str | None = None, reason: str = "tenant deleted") -> int:
        """Erase every memory of ``tenant`` and its inclusion log, leaving tombstones; how many
        memories were removed. Its API keys are revoked in the same transaction. Tool keys
        (``EngineConfig.verifier``) come from configuration: remove the tenant's there."""
        tenant = tenant or self.config.tenant
        self.flush_log()  # no entry of an earlier assemble may be written after the erasure
        with self.store.write() as writer:
            erased = writer.delete_tenant(tenant, deleted_at=self.clock(), reason=reason)
        self._analysed.clear()
        self._token_counts.clear()
        self.store.scrub()
        return len(erased)

    # -- compaction and sliding-window summaries -------------------------------------------

    def compact_plan(
        self,
        *,
        policy: compaction.CompactionPolicy | None = None,
        tenant: str | None = None,
        model: str | None = None,
        embeddings: Mapping[str, Sequence[float]] | None = None,
        tokenizer: str | None = None,
    ) -> compaction.CompactionPlan:
        """What :meth:`compact` would do now (reads only). See :mod:`ctxwarden.compact`.

        Token sizes are counted with ``model``'s tokenizer (default model by default), or
        ``tokenizer`` when named; ``embeddings`` (memory id to vector) enable topic clustering.
        """
        tenant = tenant or self.config.tenant
        policy = policy or compaction.CompactionPolicy()
        tok = tokens.get_tokenizer(
            self.registry.resolve(model or self.config.default_model, tokenizer=tokenizer).tokenizer
        )
        now = self.clock()
        self.flush_log()  # the access threshold reads the access stats
        rows = self.store.compaction_candidates(tenant, created_before=now - policy.older_than)
        memories = [m for m, _ in rows]
        counts = self._counts(memories, tok)
        referenced = {sid for s in self.store.summaries(tenant) for sid in s.source_ids}
        return compaction.plan(
            memories,
            now=now,
            policy=policy,
            tokens={rowid: c.line for rowid, c in counts.items()},
            score_times={m.rowid: at for m, at in rows},
            referenced=referenced,
            embeddings=embeddings,
            tokenizer=tok.name,
        )

    def compact(
        self,
        plan: compaction.CompactionPlan | None = None,
        *,
        summarizer: Summarizer | None = None,
        policy: compaction.CompactionPolicy | None = None,
        tenant: str | None = None,
        progress: Callable[[compaction.Cluster, str], None] | None = None,
    ) -> compaction.CompactionResult:
        """Compact old, unused memories into summaries (one transaction per cluster).

        Without ``plan``, plans first with ``policy``. The default summariser is the offline
        :class:`~ctxwarden.summarize.ExtractiveSummarizer`. Re-running is safe.
        """
        plan = plan or self.compact_plan(policy=policy, tenant=tenant)
        self.flush_log()  # bumps of a retired memory go to nothing once it is gone
        tok = (
            tokens.get_tokenizer(plan.tokenizer) if plan.tokenizer else self._ingest_tokenizers()[0]
        )
        return compaction.apply(
            plan,
            summarizer or ExtractiveSummarizer(),
            store=self.store,
            tokenizer=tok,
            tokenizers=self._summary_tokenizers(tok),
            now=self.clock(),
            progress=progress,
        )

    def _summary_tokenizers(self, tok: tokens.Tokenizer) -> tuple[tokens.Tokenizer, ...]:
        out = {t.name: t for t in self._ingest_tokenizers()}
        out.setdefault(tok.name, tok)
        return tuple(out.values())

    def recent_capacity(
        self, *, model: str | None = None, tokenizer: str | None = None, window: int | None = None
    ) -> int:
        """Tokens the recent block gets for ``model`` when every block is full of material
        (``tokenizer`` / ``window`` override the registry's, as in :meth:`assemble`)."""
        spec = self.registry.resolve(
            model or self.config.default_model, tokenizer=tokenizer, window=window
        )
        policy = self.config.policy
        limits = policy.limits(window=spec.window, max_output=spec.max_output)
        demand = {b.name: limits.cap for b in policy.blocks}
        alloc = allocate(policy, available=limits.cap, demand=demand)
        return sum(alloc[b.name] for b in policy.blocks if b.source == "recent")

    def summarize_session(
        self,
        session: str,
        *,
        summarizer: Summarizer | None = None,
        model: str | None = None,
        tenant: str | None = None,
        threshold: float | None = None,
        capacity: int | None = None,
        tokenizer: str | None = None,
        window: int | None = None,
    ) -> list[str]:
        """Sliding window: summarise the oldest unsummarised history of ``session`` when it
        passes ``threshold`` (default ``config.window_threshold``, 90 %) of the recent block's
        capacity (``capacity``, default :meth:`recent_capacity` for ``model``).

        The oldest messages are summarised until the unsummarised rest is at most half the
        capacity; they stay stored (retrieval still finds them) while the summary shows in the
        summaries block. When a session has more than ``config.max_window_summaries`` window
        summaries, the oldest half are summarised into one (summary of summaries) and retired
        with tombstones. Returns the ids of summaries written (none when under the threshold).
        ``tokenizer`` / ``window`` override the registry's, as in :meth:`assemble`.
        """
        tenant = tenant or self.config.tenant
        summarizer = summarizer or ExtractiveSummarizer()
        spec = self.registry.resolve(
            model or self.config.default_model, tokenizer=tokenizer, window=window
        )
        tok = tokens.get_tokenizer(spec.tokenizer)
        fmt = tokens.get_chat_format(spec.chat_format, tok)
        capacity = (
            capacity
            if capacity is not None
            else self.recent_capacity(
                model=model or self.config.default_model, tokenizer=tokenizer, window=window
            )
        )
        limit = (threshold if threshold is not None else self.config.window_threshold) * capacity
        windows = [
            s
            for s in self.store.summaries(tenant, session=session)
            if s.metadata.get("reason") == "window"
        ]
        covered_until = max((s.time_range[1] for s in windows if s.time_range), default=None)
        pending: list[Memory] = []
        before: tuple[float, int] | None = None
        page = self.config.recent_page
        while True:
            batch = self.store.recent(tenant, session, before=before, limit=page)
            fresh = [m for m in batch if covered_until is None or m.created_at > covered_until]
            pending.extend(fresh)
            if len(batch) < page or len(fresh) < len(batch):
                break
            before = (batch[-1].created_at, batch[-1].rowid)
        pending.reverse()  # oldest first
        counts = self._counts(pending, tok)
        costs = [
            counts[m.rowid].message + fmt.message_overhead(render.replay_role(m.role), name=m.name)
            for m in pending
        ]
        written: list[str] = []
        total = sum(costs)
        if pending and total > limit:
            keep = capacity / 2
            cut = 0
            while cut < len(pending) - 1 and total > keep:
                total -= costs[cut]
                cut += 1
            # Never split a tool call from its results.
            while cut < len(pending) and pending[cut].role == "tool":
                cut += 1
            sources = pending[:cut]
            if sources:
                written.append(
                    self._write_window_summary(
                        tenant, session, sources, summarizer, tok, sum(costs[:cut]), retire=False
                    )
                )
                windows.append(self.store.get(tenant, written[-1]))
        if len(windows) > self.config.max_window_summaries:
            oldest = sorted(windows, key=lambda s: (s.created_at, s.rowid))
            merge = oldest[: len(oldest) // 2 + 1]
            cost = sum(self._counts(merge, tok)[m.rowid].line for m in merge)
            written.append(
                self._write_window_summary(
                    tenant, session, merge, summarizer, tok, cost, retire=True
                )
            )
        return written

    def _write_window_summary(
        self,
        tenant: str,
        session: str,
        sources: Sequence[Memory],
        summarizer: Summarizer,
        tok: tokens.Tokenizer,
        cost: int,
        *,
        retire: bool,
    ) -> str:
        ids = [m.id for m in sources]
        summary_id = compaction.summary_id(tenant, ids)
        # Messages shrink to a quarter; summaries, already dense, to a half.
        target = max(64, min(1024, cost // 2 if retire else cost // 4))
        summary = summarizer.summarize(
            [SummaryItem.of(m) for m in sources], max_tokens=target, tokenizer=tok
        )
        channels = {m.channel for m in sources}
        # One end user's lines make their summary; a session shared by several makes one of
        # no user (read in session scope only).
        users = {m.user for m in sources}
        compaction.write_summary(
            self.store,
            tenant=tenant,
            session=session,
            channel=channels.pop() if len(channels) == 1 else None,
            thread_id=None,
            sources=sources,
            content=summary.render(),
            id=summary_id,
            tokenizers=self._summary_tokenizers(tok),
            reason="window",
            now=self.clock(),
            retire=retire,
            user=users.pop() if len(users) == 1 else None,
        )
        return summary_id

    # -- assemble ----------------------------------------------------------------------------

    def assemble(
        self,
        *,
        session: str,
        query: str | None = None,
        model: str | None = None,
        budget: int | None = None,
        system: str | None = None,
        tools: Sequence[Mapping[str, Any]] | None = None,
        tenant: str | None = None,
        channel: str | None = None,
        items: Mapping[str, Sequence[str]] | None = None,
        policy: BudgetPolicy | None = None,
        log_inclusions: bool = True,
        tokenizer: str | None = None,
        window: int | None = None,
        user: str | None = None,
        scope: Scope | None = None,
    ) -> Context:
        """Assemble the context for one turn of ``session`` (of end user ``user``).

        ``scope`` is what the related block, summaries and pinned memory may draw on:
        ``"session"`` (the default: this conversation only), ``"user"`` (the end user's
        sessions; needs ``user``) or ``"tenant"`` (everything of the tenant: a team's shared
        history). Recent history is always this session's (and this user's, when named).

        ``budget`` caps the prompt's tokens (chat template and tools included); without it the
        cap is the model's window minus the response reserve and the safety margin. Any
        ``model`` name works (:meth:`ModelRegistry.resolve`); ``tokenizer`` (a
        ``TOKENIZER_NAMES`` entry or ``gguf:<path>``) and ``window`` (tokens) override what the
        registry says for it. ``query``
        (the current turn) drives retrieval and is sent as the last user message. ``items``
        fills caller-supplied blocks (e.g. ``{"scratch": ["..."]}``). Writes an inclusion-log row
        and bumps access stats unless ``log_inclusions`` is false: before returning, or with
        ``EngineConfig(inclusion_log="deferred")`` in a background thread (see
        :meth:`flush_log`).
        """
        check_query_length(query, self.config.max_query_chars)
        tenant = tenant or self.config.tenant
        read_scope = resolve_scope(session=session, user=user, scope=scope)
        policy = policy or self.config.policy
        model_name = model or self.config.default_model
        spec = self.registry.resolve(model_name, tokenizer=tokenizer, window=window)
        tok = tokens.get_tokenizer(spec.tokenizer)
        fmt = tokens.get_chat_format(spec.chat_format, tok)
        limits = policy.limits(window=spec.window, budget=budget, max_output=spec.max_output)
        tool_list = [dict(t) for t in tools or ()]
        notes: list[str] = []
        if spec.notes and self.registry.lookup(model_name) is None:
            notes.append(spec.notes)  # what was assumed for a model the registry does not know
        if not tok.exact:
            notes.append(
                f"tokenizer {tok.name} is an approximation for {spec.name}: counts include its "
                "safety factor"
            )
        query_text = query.strip() if query else None
        recent_walk = _RecentWalk(self, tenant, session, channel, tok, fmt, user)
        newest = recent_walk.peek_newest()
        query_in_history = (
            query_text is not None
            and newest is not None
            and newest.role == "user"
            and newest.content == query_text
        )

        # Counted once per call: the fixed cost and the final total both use it.
        system_prefix_tokens = tok.count(render.system_prefix(system)) if system else 0
        fixed_parts = {
            "template": max(
                fmt.request_overhead(has_system=True), fmt.request_overhead(has_system=False)
            ),
            "system": fmt.message_overhead("system") + system_prefix_tokens,
            "tools": fmt.tools_tokens(tok, tool_list) if tool_list else 0,
            "query": (
                tok.count(query_text) + fmt.message_overhead("user")
                if query_text and not query_in_history
                else 0
            ),
        }
        fixed = sum(fixed_parts.values())
        available = max(0, limits.cap - fixed)

        data_intro_tokens = tok.count(render.data_intro())  # counted once, used twice
        material = Material(
            count=tok.count,
            frame=fmt.message_overhead(render.DATA_ROLE) + data_intro_tokens,
        )
        material.recent = recent_walk.take(available)
        if query_text and self.config.related_candidates:
            wanted = related_candidates(
                available, recent_walk.typical_line(), floor=self.config.related_candidates
            )
            material.related = self._related(
                tenant, query_text, tok, notes, wanted, store_scope(read_scope)
            )
        # Summaries, pins and facts stay within their conversation: the session's, or the
        # user's sessions'; a tenant-wide read still shows this session's (another's are not
        # its history), plus what was pinned for the tenant explicitly (issue 20).
        summary_scope = (
            ReadScope(kind="session", session=session, user=user)
            if read_scope.kind == "tenant"
            else read_scope
        )
        pinned = self.store.pinned(tenant, scope=store_scope(summary_scope))
        material.pinned = self._line_candidates(pinned, tok)
        material.summaries = self._line_candidates(
            self.store.summaries(tenant, scope=summary_scope), tok
        )
        for block in policy.blocks:
            if block.source == "items":
                texts = list((items or {}).get(block.name, ()))
                material.items[block.name] = [
                    _item_candidate(block.name, i, t, tok) for i, t in enumerate(texts)
                ]
        unknown = set(items or {}) - {b.name for b in policy.blocks if b.source == "items"}
        if unknown:
            raise InputError(
                f"no items block called {sorted(unknown)[0]!r} in policy {policy.name!r}",
                field="items",
            )

        plan = fill(policy, limits, fixed=fixed, material=material)
        _write_lines(policy, plan)
        notes.extend(plan.notes)

        messages: list[dict[str, Any]] = []
        included: list[str] = []
        logged: list[tuple[str, Memory]] = []  # (block, memory) of each Inclusion, made once below
        total = 0
        recent_cost = sum(c.tokens for _, c in recent_messages(plan, policy))
        others = fixed - fixed_parts["system"] - fixed_parts["template"]
        while True:
            system_text, held = system_message_text(policy, plan, system)
            system_cost = self._block_message_cost(
                policy, plan, system_text, held, "system", system_prefix_tokens, tok, fmt
            )
            data_text, data_held = data_message_text(policy, plan)
            data_cost = self._block_message_cost(
                policy, plan, data_text, data_held, render.DATA_ROLE, data_intro_tokens, tok, fmt
            )
            over = (
                fmt.request_overhead(has_system=system_text is not None)
                + system_cost
                + data_cost
                + recent_cost
                + others
                > limits.cap
            )
            blocks = [b for b in policy.blocks if b.source != "recent" and plan.chosen[b.name]]
            if not over or not blocks:
                break
            # Only a template that trims message text can push it past the plan (a message's
            # last line loses the newline it was counted with): give up that block's last line.
            plan.chosen[blocks[-1].name].pop()
            notes.append(
                f"{blocks[-1].name}: last line dropped, the template's trim made it longer"
            )
        has_system = system_text is not None
        if has_system:
            assert system_text is not None
            messages.append({"role": "system", "content": system_text})
            total += system_cost
        if data_text is not None:
            messages.append({"role": render.DATA_ROLE, "content": data_text})
            total += data_cost
        for name, memory in [*held, *data_held]:
            if memory.rowid >= 0:
                included.append(memory.id)
                logged.append((name, memory))
        for name, cand in recent_messages(plan, policy):
            total += cand.tokens
            for memory, text in zip(cand.memories, cand.text.split("\x00"), strict=True):
                messages.append(memory_message(memory, text))
                included.append(memory.id)
                logged.append((name, memory))
        if query_text and not query_in_history:
            messages.append({"role": "user", "content": query_text})
            total += fixed_parts["query"]
        total += fmt.request_overhead(has_system=has_system) + fixed_parts["tools"]
        if total > limits.cap:
            raise CtxwardenError(
                f"internal error: assembled {total} tokens over the cap of {limits.cap}; "
                "please report this with the inputs"
            )
        costs = _costs(plan)
        inclusions = [
            Inclusion(rowid=m.rowid, id=m.id, block=name, tokens=costs.get(m.rowid, 0))
            for name, m in logged
        ]
        report = Report(
            model=spec.name,
            tokenizer=tok.name,
            exact=tok.exact,
            window=limits.window,
            reserve=limits.reserve,
            margin=limits.margin,
            cap=limits.cap,
            tokens=total,
            fixed=fixed_parts,
            blocks=block_reports(policy, plan),
            candidates=CandidateReports(plan.candidates),
            notes=tuple(notes),
        )
        context_id = uuid.uuid4().hex
        recent_walk.flush_counts()
        if log_inclusions:
            entry = ContextLog(
                id=context_id,
                tenant=tenant,
                session=session,
                created_at=self.clock(),
                model=spec.name,
                tokenizer=tok.name,
                exact=tok.exact,
                cap=limits.cap,
                tokens=total,
                blocks={b.name: {"budget": b.budget, "used": b.used} for b in report.blocks},
                inclusions=[i for i in inclusions if i.rowid >= 0],
            )
            if self._log_writer is not None:
                self._log_writer.submit(entry)
            else:
                self.store.log_context(entry)
        return Context(
            id=context_id,
            messages=tuple(messages),
            included=tuple(included),
            tokens=total,
            report=report,
        )

    @staticmethod
    def _block_message_cost(
        policy: BudgetPolicy,
        plan: Plan,
        text: str | None,
        held: Sequence[tuple[str, Memory]],
        role: str,
        prefix_tokens: int,
        tok: tokens.Tokenizer,
        fmt: tokens.ChatFormat,
    ) -> int:
        """The exact cost of the system message (``role`` "system") or of the memory-data
        message (``render.DATA_ROLE``) whose ``text`` :mod:`ctxwarden.assemble` rendered.

        Block segments end in a newline before a non-space character, where BPE always splits,
        so their counts add up; a template that trims content (Llama 3, Gemma, Mistral) drops
        the last segment's newline, so that segment (which may span lines) alone is counted
        again without it.
        """
        if text is None:
            return 0
        if not held:  # the caller's system prompt alone
            return fmt.message_tokens(role, text)
        data = role != "system"
        cost = fmt.message_overhead(role) + prefix_tokens
        for block in policy.blocks:
            chosen = plan.chosen[block.name]
            if block.source == "recent" or not chosen or (block.source in DATA_SOURCES) != data:
                continue
            cost += tok.count(render.block_header(block.title or block.name))
            cost += sum(c.tokens for c in chosen)
        # the last segment, whole: a line may hold inner newlines ("0\n 0" is one memory)
        last = text_segments(policy, plan, data=data)[0][-1]
        trimmed = fmt.content_text(role, last)
        if trimmed != last:
            cost += tok.count(trimmed) - tok.count(last)
        return cost

    def _counts(self, memories: Sequence[Memory], tok: tokens.Tokenizer) -> dict[int, TokenCount]:
        """Counts for these memories by rowid: from the engine's count cache, else the store,
        else counted now (and stored); what came from the store or the tokenizer is cached."""
        counts = self._stored_counts(memories, tok.name)
        missing = [m for m in memories if m.rowid not in counts]
        if missing:
            fresh = [
                TokenCount(
                    rowid=m.rowid,
                    tokenizer=tok.name,
                    message=tok.count(render.message_text(m)),
                    line=tok.count(render.line_text(m)),
                )
                for m in missing
            ]
            self.store.put_token_counts(fresh)
            counts.update((c.rowid, c) for c in fresh)
            self._token_counts.fill(zip(missing, fresh, strict=True))
        return counts

    def _stored_counts(self, memories: Sequence[Memory], tokenizer: str) -> dict[int, TokenCount]:
        """The counts of these memories that the engine's count cache or the store holds, by
        rowid (what the store held is cached); memories neither holds are left out."""
        counts, unknown = self._token_counts.lookup(memories, tokenizer)
        if unknown:
            read = self.store.token_counts([m.rowid for m in unknown], tokenizer)
            counts.update(read)
            self._token_counts.fill((m, read[m.rowid]) for m in unknown if m.rowid in read)
        return counts

    def _line_candidates(
        self, memories: Sequence[Memory], tok: tokens.Tokenizer
    ) -> list[Candidate]:
        counts = self._counts(memories, tok)
        out = []
        for memory in memories:
            text, cost = _line(memory, counts[memory.rowid].line, tok)
            out.append(
                Candidate(memories=(memory,), tokens=cost, text=text or render.line_text(memory))
            )
        return out

    def _related(
        self,
        tenant: str,
        query: str,
        tok: tokens.Tokenizer,
        notes: list[str],
        wanted: int,
        scope: ReadScope | None = None,
    ) -> list[Candidate]:
        """Hybrid retrieval (:mod:`ctxwarden.retrieve`) as related-block candidates, ``wanted``
        from each search (:func:`related_candidates`)."""
        weights = dataclasses.replace(self.config.retrieval, candidates=wanted)
        query = query[: weights.query_chars]  # what retrieval reads, the embedder too
        usable, others = self._vectors_usable()
        if others and not usable:
            notes.append(
                f"vectors of {', '.join(others)} ignored (this engine embeds with "
                f"{self.embedder.name}): run `ctxwarden embed --reembed` to use vectors again"
            )
        query_vector = None
        if usable:
            try:
                query_vector = self.embedder.embed([query])[0]
            except CtxwardenError as exc:  # a remote embedder down: retrieve without vectors
                notes.append(f"query not embedded ({exc}); related memory found by words only")
                usable = False
        lines: dict[int, tuple[str, int]] = {}

        def cost(memories: Sequence[Memory]) -> dict[int, int]:
            # Only an aggregate's line is made here (its volume note is counted with it): the
            # others are written for the few candidates fill takes (_write_lines).
            counts = self._counts(memories, tok)
            for memory in memories:
                lines[memory.rowid] = _line(memory, counts[memory.rowid].line, tok)
            return {rowid: line[1] for rowid, line in lines.items()}

        hits = retrieve(
            self.store,
            tenant=tenant,
            query=query,
            now=self.clock(),
            cost=cost,
            query_vector=query_vector,
            model=self.embedder.name if usable else None,
            weights=weights,
            keep=lambda m: m.role != "tool" and not m.tool_calls,
            authors=self._authors(tenant) if usable else (),
            scope=scope,
        )
        candidates = []
        for hit in hits:
            text, line_tokens = lines[hit.memory.rowid]
            # Positional (memories, tokens, score, components, text): ~150 a turn, and keyword
            # arguments cost ~2.5x on CPython 3.11.
            candidates.append(
                Candidate((hit.memory,), line_tokens, hit.score, hit.components, text)
            )
        return candidates


#: The related-block line cost assumed before a session has history to measure: a chat line of
#: about 20 words with its ``[time] author:`` prefix.
TYPICAL_LINE_TOKENS = 32
#: At most this many candidates per search, whatever the budget: retrieval's time grows with
#: the count, and 1,000 lines (~32k tokens) is more related memory than a turn needs.
MAX_RELATED_CANDIDATES = 1000


def related_candidates(available: int, line_tokens: float, *, floor: int) -> int:
    """How many candidates to ask each retrieval search for: as many lines as the whole of
    ``available`` could hold at ``line_tokens`` a line, at least ``floor`` (the engine's
    ``related_candidates``) and at most :data:`MAX_RELATED_CANDIDATES`.

    The related block never holds more lines than that (it gets a share of ``available``, or
    all of it in the top-up), and each search (lexical, vector) asks for that many, so the
    union, bridge hits and neighbours leave spare candidates for lines skipped because they
    are already in recent history or repeat one. A larger budget or shorter lines ask for
    more, so a big related block is filled with the next-best hits rather than left empty;
    asking for more than can fit only costs retrieval time (scoring, MMR and line costs of
    candidates never shown). With ``floor`` 0 retrieval is off (0).

    >>> related_candidates(3900, 45.0, floor=100)  # budget 4,000: 87 lines fit
    100
    >>> related_candidates(15900, 30.0, floor=100)
    530
    >>> related_candidates(900_000, 30.0, floor=100)
    1000
    """
    if floor <= 0:
        return 0
    lines = math.ceil(available / max(1.0, line_tokens))
    return max(floor, min(MAX_RELATED_CANDIDATES, lines))


def _costs(plan: Plan) -> dict[int, int]:
    costs: dict[int, int] = {}
    for cands in plan.chosen.values():
        for cand in cands:
            share = cand.tokens // max(1, len(cand.memories))
            for memory in cand.memories:
                costs[memory.rowid] = share
    return costs


def _line(memory: Memory, cached: int, tok: tokens.Tokenizer) -> tuple[str, int]:
    """A memory's related-block line and its cost; the line is "" (made later, when the
    candidate is taken: :func:`_write_lines`) unless it is an aggregate's, whose volume note must
    be counted with it."""
    if memory.dup_count > 1:
        text = render.line_text(memory)
        text = (
            text[:-1]
            + render.volume_note(
                memory.dup_count, memory.created_at, memory.last_seen_at, memory.latest_content
            )
            + "\n"
        )
        return text, tok.count(text)
    return "", cached


def _write_lines(policy: BudgetPolicy, plan: Plan) -> None:
    """Give the related candidates fill took their line text (:func:`_line` leaves it out: most
    candidates are never taken, and writing every line was ~2 % of an assembly)."""
    for block in policy.blocks:
        if block.source == "retrieval":
            for cand in plan.chosen[block.name]:
                if not cand.text:
                    cand.text = render.line_text(cand.memories[0])


def _item_candidate(block: str, index: int, text: str, tok: tokens.Tokenizer) -> Candidate:
    if not isinstance(text, str):
        raise InputError(f"item {index} of block {block!r} is not a string", field="items")
    line = text.strip() + "\n"
    pseudo = Memory(
        rowid=-(index + 1), id=f"{block}:{index}", tenant="", session="", channel=None,
        author=None, author_kind="agent", role="user", content=text, created_at=0.0,
        thread_id=None, reply_to=None, kind="message", pinned=False, name=None, tool_calls=(),
        tool_call_id=None, content_hash=f"item:{block}:{index}", dup_count=1, last_seen_at=0.0,
        access_count=0, last_accessed_at=None, access_score=0.0, included_tokens_total=0,
    )  # fmt: skip
    return Candidate(memories=(pseudo,), tokens=tok.count(line), text=line)


class _RecentWalk:
    """Newest-first pages of a session's history, joined into units (tool call + results)."""

    def __init__(
        self,
        engine: Engine,
        tenant: str,
        session: str,
        channel: str | None,
        tok: tokens.Tokenizer,
        fmt: tokens.ChatFormat,
        user: str | None = None,
    ) -> None:
        self.engine = engine
        self.tenant = tenant
        self.session = session
        self.channel = channel
        self.user = user
        self.tok = tok
        self.fmt = fmt
        self._first_page: list[Memory] | None = None
        self._fresh: list[tuple[Memory, TokenCount]] = []
        self._line_tokens = 0  # line costs of the messages walked (for typical_line)
        self._lines = 0

    def _page(self, before: tuple[float, int] | None, limit: int) -> list[Memory]:
        return self.engine.store.recent(
            self.tenant,
            self.session,
            channel=self.channel,
            before=before,
            limit=limit,
            user=self.user,
        )

    def peek_newest(self) -> Memory | None:
        if self._first_page is None:
            self._first_page = self._page(None, self.engine.config.recent_page)
        return self._first_page[0] if self._first_page else None

    def take(self, available: int) -> list[Candidate]:
        """Units newest first until their cost passes ``available`` (or history ends).

        Pages are sized from the average cost seen so far, so a large budget costs a few
        queries, and a store's size never matters: each page is an index range scan.
        """
        units: list[Candidate] = []
        total = 0
        pending: list[Memory] = []  # tool results waiting for the call that made them
        self.peek_newest()
        page = self._first_page or []
        limit = self.engine.config.recent_page
        while page:
            counts = self._page_counts(page)
            for memory in page:
                if memory.role == "tool":
                    pending.insert(0, memory)
                    continue
                group = (memory, *pending) if memory.tool_calls and pending else (memory,)
                pending = []
                unit = self._unit(group, counts)
                units.append(unit)
                total += unit.tokens
                if total >= available:
                    return units
            if len(page) < limit:
                break
            average = max(1.0, total / max(1, len(units)))
            limit = max(16, min(2000, int((available - total) / average * 1.2) + 8))
            last = page[-1]
            page = self._page((last.created_at, last.rowid), limit)
        return units

    def _page_counts(self, page: Sequence[Memory]) -> dict[int, TokenCount]:
        """The counts of a page the engine's cache or the store holds (the rest are counted by
        :meth:`_unit`, stored by :meth:`flush_counts`)."""
        return self.engine._stored_counts(page, self.tok.name)

    def _unit(self, group: Sequence[Memory], counts: Mapping[int, TokenCount]) -> Candidate:
        texts = []
        cost = 0
        for memory in group:
            text = render.message_text(memory)
            if memory.dup_count > 1:
                text += render.volume_note(
                    memory.dup_count, memory.created_at, memory.last_seen_at, memory.latest_content
                )
            texts.append(text)
            cached = counts.get(memory.rowid)
            if cached is None:  # not counted yet (counts are made on first use): count, cache
                cached = TokenCount(
                    rowid=memory.rowid,
                    tokenizer=self.tok.name,
                    message=self.tok.count(render.message_text(memory)),
                    line=self.tok.count(render.line_text(memory)),
                )
                self._fresh.append((memory, cached))
            if memory.role != "tool" and not memory.tool_calls:  # never a related line
                self._line_tokens += cached.line
                self._lines += 1
            if memory.tool_calls or memory.role == "tool" or memory.dup_count > 1:
                message = memory_message(memory, text)
                cost += tokens.count_messages(
                    self.tok, self.fmt, [message]
                ) - self.fmt.request_overhead(has_system=False)
            else:
                role = render.replay_role(memory.role)
                cost += cached.message + self.fmt.message_overhead(role, name=memory.name)
        return Candidate(memories=tuple(group), tokens=cost, text="\x00".join(texts))

    def typical_line(self) -> float:
        """The mean related-block line cost of the messages :meth:`take` walked (this
        session's recent history, as far as the budget reaches; tool calls and results left
        out, as retrieval leaves them out), else :data:`TYPICAL_LINE_TOKENS`."""
        if not self._lines:
            return float(TYPICAL_LINE_TOKENS)
        return self._line_tokens / self._lines

    def flush_counts(self) -> None:
        """Store the counts made during the walk, then cache them (after the store has them,
        so a count the cache serves is one the store holds too)."""
        if self._fresh:
            self.engine.store.put_token_counts([count for _, count in self._fresh])
            self.engine._token_counts.fill(self._fresh)
            self._fresh = []


def _head(kind: str, value: str | None, user: str | None) -> str:
    """The layer-A race-guard scope key (``Writer.insert_or_fold``'s ``heads``): a session's
    names its end user too, as a channel-less record folds only within its conversation."""
    if kind == "session" and user is not None:
        return f"session:{len(user)}:{user}:{value or ''}"
    return f"{kind}:{value or ''}"


def _derive_id(record: Record, created: float) -> str:
    digest = xxhash.xxh3_64_hexdigest(
        "\x00".join(
            [
                record.tenant,
                record.session,
                record.channel or "",
                record.role,
                record.author or "",
                record.content,
                repr(created),
            ]
        ).encode("utf-8", "surrogatepass")
    )
    return f"{record.role[0]}-{digest}"


def _memory_values(item: _Prepared) -> tuple[Any, ...]:
    """The insert values of a stored record, ``memory_row(None, memory)[1:]`` of its
    :class:`NewMemory` built directly (one tuple per record rather than a NewMemory and then its
    row)."""
    r = item.record
    created = item.created_at
    candidate = item.candidate
    return (
        item.id, r.tenant, r.session, r.channel, r.author, r.author_kind, r.role, r.content,
        created, r.thread_id, r.reply_to, r.kind, r.pinned, r.name,
        json.dumps(list(r.tool_calls)) if r.tool_calls else None,
        r.tool_call_id,
        json.dumps(list(r.attachments)) if r.attachments else None,
        json.dumps(dict(r.metadata)) if r.metadata else None,
        item.content_hash,
        candidate.near_key if candidate is not None else None,
        created, None, None, None, r.user,
    )  # fmt: skip
