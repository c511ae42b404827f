"""The composition root: one :class:`Engine` wires the store, tokenizers, budgets and de-dup.

>>> from ctxwarden import Engine
>>> with Engine.open(":memory:") as engine:
...     _ = engine.ingest([{"id": "m1", "session": "s", "content": "the deploy is at 10:30"}])
...     context = engine.assemble(session="s", query="when is the deploy?", model="gpt-4o")
>>> context.included
('m1',)

``Engine`` is a facade: it wires one service per flow (:mod:`ctxwarden.ingestion`,
:mod:`~ctxwarden.assembly`, :mod:`~ctxwarden.embedding`, :mod:`~ctxwarden.compaction`,
:mod:`~ctxwarden.erasure`, :mod:`~ctxwarden.expansion`, :mod:`~ctxwarden.scoped_reads`) and
delegates to them.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ctxwarden import compact as compaction
from ctxwarden.assembly import MAX_RELATED_CANDIDATES as MAX_RELATED_CANDIDATES
from ctxwarden.assembly import TYPICAL_LINE_TOKENS as TYPICAL_LINE_TOKENS
from ctxwarden.assembly import Assembly
from ctxwarden.assembly import related_candidates as related_candidates
from ctxwarden.backend import open_store
from ctxwarden.budget import BudgetPolicy
from ctxwarden.compaction import Compaction
from ctxwarden.counting import MemoryCounts
from ctxwarden.embed import Embedder
from ctxwarden.embedding import Embeddings
from ctxwarden.engine_config import DEFAULT_DEDUPE, EngineConfig
from ctxwarden.erasure import Erasure, ErasureFaces
from ctxwarden.errors import InputError
from ctxwarden.expansion import Expansion, ExpansionFaces
from ctxwarden.ingestion import CANDIDATE_CACHE_SIZE as CANDIDATE_CACHE_SIZE
from ctxwarden.ingestion import Ingestion
from ctxwarden.logwriter import LogCounters, LogWriter
from ctxwarden.models import default_registry
from ctxwarden.scheduler import Compactor
from ctxwarden.scoped_reads import ScopedReads
from ctxwarden.semantic import SemanticConfig, SemanticReport
from ctxwarden.store.base import Store, Version
from ctxwarden.summarize import Summarizer
from ctxwarden.types import Context, IngestOutcome, IngestResult, Record, Scope

__all__ = ["DEFAULT_DEDUPE", "Engine", "EngineConfig"]


class Engine(ScopedReads, ErasureFaces, ExpansionFaces):
    """The engine most users touch: ``ingest``, ``assemble``, ``get``, ``stats``.

    Open with :meth:`open`; close with :meth:`close` or use it as a context manager.
    ``engine.compactor`` (:class:`~ctxwarden.scheduler.Compactor`) runs compaction on a schedule
    (``config.compact_every``) and window summaries in the background.
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
        self.config = config = config or EngineConfig()
        self.clock = clock
        self.registry = registry = default_registry()
        for spec in config.models:
            registry.register(spec)
        self._log_writer = (
            LogWriter(store, capacity=config.inclusion_log_queue)
            if config.inclusion_log == "deferred"
            else None
        )
        # The tenants' authors: retrieval reads them, ingest keeps them current.
        authors: dict[str, tuple[float, list[str]]] = {}
        flush = self.flush_log
        self._counter = counter = MemoryCounts(store, config.count_cache_size)
        self._ingestion = ingestion = Ingestion(store, config, clock=clock, authors=authors)
        self._embeddings = Embeddings(
            store, config, clock=clock, embedder=embedder, flush_log=flush, forget=ingestion.forget
        )
        self._assembly = Assembly(
            store,
            config,
            clock=clock,
            registry=registry,
            counter=counter,
            embeddings=self._embeddings,
            authors=authors,
            log_writer=self._log_writer,
        )
        self._compaction = Compaction(
            store, config, clock=clock, registry=registry, counter=counter, flush_log=flush
        )
        self.compactor = Compactor(self._compaction, store, config, clock=clock)
        if config.compact_every is not None:
            self.compactor.start(config.compact_every)
        # Of stored rows: emptied by an erasure.
        caches = (ingestion.forget, counter.clear, self._embeddings.forget)
        self._erasure = Erasure(
            store, config, clock=clock, flush_log=flush, get=self.get, caches=caches
        )
        self._expansion = Expansion(
            store, config, clock=clock, registry=registry, get=self.get, ingest=self.ingest
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
        timeout = (config or EngineConfig()).store_timeout
        return cls(open_store(path, timeout=timeout), config=config, clock=clock, embedder=embedder)

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop the :attr:`compactor` (a run ends between clusters) and background embedding
        (finishing its batch), write the inclusion-log entries still queued
        (``inclusion_log="deferred"``) and close the store."""
        self.compactor.stop()
        self._embeddings.close()
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
        nothing in this batch (a proxy storing a conversation verbatim).

        All or nothing: if any record is invalid, :class:`InputError` names its line and field
        and nothing is written. A record whose id is a stored memory's and whose text differs is
        an edit (``edited``, see :meth:`update`); with the same text, or an id that was folded
        or compacted into another memory, it is a no-op (``known``).
        Messages go through the two de-dup layers (:mod:`ctxwarden.dedupe`,
        ``config.dedupe``): a verbatim repeat within the TTL (in its channel or session) is
        ``duplicate``; a repeat that differs only in formatting, or a bot's message that differs
        only in volatile values, within the window in its channel is ``near_duplicate``. Either
        folds into the stored aggregate: ``dup_count`` and ``last_seen_at`` are bumped, the
        record's id becomes an alias, and the aggregate keeps the newest member's content when
        its values differ (``latest_content``). Earlier records of the same batch count.
        """
        result, summarize, embed = self._ingestion.ingest(
            records, tenant=tenant, session=session, user=user, fold=fold
        )
        if self.config.window_summaries == "background":
            self.compactor.request_windows(summarize)  # ingest never waits on a summariser
        else:
            for tenant_name, session_name in summarize:
                self.summarize_session(
                    session_name, tenant=tenant_name, summarizer=self.config.summarizer
                )
        if self.config.edit_history == "erase" and result.counts["edited"]:
            self.store.scrub()  # the replaced text leaves the files too (as after a delete)
        if embed:
            self._embeddings.after_ingest(edited=result.counts["edited"] > 0)
        return result

    def update(
        self,
        id: str,
        content: str,
        *,
        tenant: str | None = None,
        user: str | None = None,
        session: str | None = None,
    ) -> IngestOutcome:
        """Replace the text of the memory ``id`` (an edit, as ingesting a known id with other
        text is): stored and indexed, counts and vector made again, the old text kept as a
        version (:meth:`versions`) or erased (``config.edit_history = "erase"``). ``edited``,
        or ``known`` for the same text. :class:`NotFound` if there is none (in the ``user`` or
        ``session`` named); :class:`InputError` naming ``id`` if it lives in another memory.

        >>> with Engine.open(":memory:") as engine:
        ...     _ = engine.ingest([{"id": "m1", "content": "deploy on Tuesday"}])
        ...     engine.update("m1", "deploy on Wednesday").status
        'edited'
        """
        tenant = tenant or self.config.tenant
        memory = self.get(id, tenant=tenant, user=user, session=session)
        if memory.id != id:
            raise InputError(
                f"{id!r} lives in memory {memory.id!r} (folded or compacted into it): update "
                f"{memory.id!r} or ingest a new record",
                field="id",
            )
        outcome = self._ingestion.update(memory, content)
        if outcome.status == "edited" and self.config.edit_history == "erase":
            self.store.scrub()  # the replaced text leaves the files too (as after a delete)
        if outcome.status == "edited" and self.config.embed != "off":
            self._embeddings.after_ingest(edited=True)
        return outcome

    def versions(self, id: str, *, tenant: str | None = None) -> list[Version]:
        """The texts edits replaced in the memory ``id``, oldest first (``[]`` for none)."""
        return self.store.versions(tenant or self.config.tenant, id)

    @property
    def embedder(self) -> Embedder:
        """The embedder (built from ``config.embedder`` on first use)."""
        return self._embeddings.embedder

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
        return self._embeddings.embed_pending(
            batch_size, reembed=reembed, limit=limit, progress=progress
        )

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
        return self._embeddings.dedupe_semantic(
            tenant=tenant, config=config, dry_run=dry_run, progress=progress
        )

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

        ``policy`` defaults to :attr:`EngineConfig.compact_policy`, else
        :class:`~ctxwarden.compact.CompactionPolicy`'s defaults.

        Token sizes are counted with ``model``'s tokenizer (default model by default), or
        ``tokenizer`` when named; ``embeddings`` (memory id to vector) enable topic clustering.
        """
        return self._compaction.compact_plan(
            policy=policy, tenant=tenant, model=model, embeddings=embeddings, tokenizer=tokenizer
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
        return self._compaction.compact(
            plan, summarizer=summarizer, policy=policy, tenant=tenant, progress=progress
        )

    def compact_preview(
        self, plan: compaction.CompactionPlan, *, summarizer: Summarizer | None = None
    ) -> tuple[compaction.ClusterSummary, ...]:
        """What each cluster of ``plan`` would become, writing nothing: the summary's text, its
        facts, the sentences it drops, or why the cluster is left alone (its summary would lose a
        fact). The default summariser is the extractive one.
        """
        return self._compaction.compact_preview(plan, summarizer=summarizer)

    def recent_capacity(
        self, *, model: str | None = None, tokenizer: str | None = None, window: int | None = None
    ) -> int:
        """Tokens the recent block gets for ``model`` when every block is full of material
        (``tokenizer`` / ``window`` override the registry's, as in :meth:`assemble`)."""
        return self._compaction.recent_capacity(model=model, tokenizer=tokenizer, window=window)

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
        return self._compaction.summarize_session(
            session,
            summarizer=summarizer,
            model=model,
            tenant=tenant,
            threshold=threshold,
            capacity=capacity,
            tokenizer=tokenizer,
            window=window,
        )

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
        registry says for it. ``query`` (the current turn) drives retrieval and is sent as the
        last user message. ``items`` fills caller-supplied blocks (e.g. ``{"scratch":
        ["..."]}``). Writes an inclusion-log row and bumps access stats unless
        ``log_inclusions`` is false: before returning, or with
        ``EngineConfig(inclusion_log="deferred")`` in a background thread (see :meth:`flush_log`).
        """
        return self._assembly.assemble(
            session=session,
            query=query,
            model=model,
            budget=budget,
            system=system,
            tools=tools,
            tenant=tenant,
            channel=channel,
            items=items,
            policy=policy,
            log_inclusions=log_inclusions,
            tokenizer=tokenizer,
            window=window,
            user=user,
            scope=scope,
        )
