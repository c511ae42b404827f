"""How an engine behaves: :class:`EngineConfig` and its validation, and the de-dup default.

Re-exported by :mod:`ctxwarden.engine` (``from ctxwarden.engine import EngineConfig`` keeps
working); the engine's flow services (ingestion, assembly, embedding, compaction) each read the
fields they need.

>>> EngineConfig().embed
'background'
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ctxwarden.budget import BudgetPolicy, chat_policy
from ctxwarden.compact import CompactionPolicy
from ctxwarden.counts import COUNT_CACHE_SIZE
from ctxwarden.dedupe import DedupeConfig
from ctxwarden.errors import ConfigError
from ctxwarden.logwriter import DEFAULT_CAPACITY
from ctxwarden.models import ModelSpec
from ctxwarden.provenance import Verifier
from ctxwarden.retrieve import MAX_QUERY_CHARS, RetrievalWeights
from ctxwarden.semantic import SemanticConfig
from ctxwarden.store.sqlite_connection import STORE_TIMEOUT_SECONDS
from ctxwarden.summary import Summarizer

__all__ = ["CHANGE_WINDOW", "DEFAULT_DEDUPE", "STORE_TIMEOUT_SECONDS", "EngineConfig"]

#: The look-back of free-text change detection (the default): two weeks, in seconds.
CHANGE_WINDOW = 14 * 24 * 3600.0

#: The engine's de-dup default: layer A per channel and per session (the same message posted
#: into one channel from several sessions, or by one author into several channels of a session,
#: is one aggregate), both layers within an hour. See README.
DEFAULT_DEDUPE: DedupeConfig = DedupeConfig()


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
    #: When memories are embedded: ``"background"`` (the default: a worker thread embeds
    #: batches after ingest, so ingest never waits; the model loads in that thread on first
    #: use, so opening an engine stays fast), ``"sync"`` (right after each ingest commits) or
    #: ``"off"`` (only by :meth:`Engine.embed_pending` or ``ctxwarden embed``: no model is
    #: loaded, retrieval is by words unless vectors were made that way). Retrieval uses
    #: whatever vectors of ``embedder`` the store holds, whichever way they were made.
    embed: str = "background"
    #: The embedder's name for :func:`ctxwarden.embed.get_embedder` (``"minilm"``, offline).
    embedder: str = "minilm"
    #: With ``embed`` on: before retrieving for a query, :meth:`Engine.assemble` embeds up to
    #: this many memories still pending that the query's scope sees, so the turn searches
    #: them by meaning too (~5 ms a message with MiniLM on one core); those left over are
    #: searched by words only and listed in ``Report.lexical_only``. 0 never waits for the
    #: embedder.
    assemble_embed_limit: int = 32
    #: ... and spends at most this many seconds of the request on it: waiting for the
    #: embedding lock (the worker's batch), embedding (in slices of 8, the deadline looked at
    #: between two) and writing the vectors (tried once past the deadline; if other writers
    #: hold the store, the worker writes them later). 0 never waits. 0.25 s: about the
    #: count limit's worth of MiniLM on an idle core, a quarter of a 1 s request. A cold
    #: process's one-off model load comes before it and is not counted: the query's own
    #: embedding waits for it as well.
    assemble_embed_seconds: float = 0.25
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
    #: What an edit (a known id ingested again with other text, or ``Engine.update``) does
    #: with the text it replaces: ``"keep"`` it as a superseded version (``Engine.versions``)
    #: or ``"erase"`` it.
    edit_history: str = "keep"
    #: Free-text change detection at ingest (:mod:`ctxwarden.changes`): a message that changes
    #: an earlier one of the same session and channel ("moved to", "now X, not Y", a new value
    #: by the same author) supersedes it. The window it looks back over, in seconds:
    #: :data:`CHANGE_WINDOW` (two weeks) by default, 0 turns it off. On chatbench-dev it
    #: leaves evidence recall as it is off (97.3 / 99.1 / 100 / 100 % at 1k-8k tokens).
    change_window: float = CHANGE_WINDOW
    #: How long a call waits for the store's write lock (another process's or thread's
    #: transaction) before it fails with :class:`~ctxwarden.errors.StoreUnavailable`, in
    #: seconds (SQLite; :meth:`Engine.open` passes it to the store). The servers default to
    #: a few seconds (``Settings.store_timeout``) and answer 503 with ``Retry-After``.
    store_timeout: float = STORE_TIMEOUT_SECONDS
    #: Where ``auto_summarize``'s window summaries are made: ``"sync"`` (in :meth:`ingest`,
    #: before it returns) or ``"background"`` (ingest queues the session for a thread of the
    #: engine's :attr:`~Engine.compactor` and returns; nothing waits on the summariser).
    window_summaries: str = "sync"
    #: The summariser of window summaries and of scheduled compaction (default: extractive).
    summarizer: Summarizer | None = field(default=None, repr=False, compare=False)
    #: Seconds between scheduled compaction runs (:mod:`ctxwarden.scheduler`); None (the
    #: library's default) schedules none. ``ctxwarden serve`` defaults to 6 hours.
    compact_every: float | None = None
    #: What scheduled runs and :meth:`Engine.compact` / :meth:`Engine.compact_plan` without a
    #: ``policy`` compact (default :class:`~ctxwarden.compact.CompactionPolicy`).
    compact_policy: CompactionPolicy | None = None
    #: How long a SQLite compaction lease lasts unless renewed (after each cluster), in
    #: seconds: a killed compactor blocks others at most this long.
    compact_lease: float = 900.0

    def __post_init__(self) -> None:
        if self.edit_history not in ("keep", "erase"):
            raise ConfigError(f"edit_history: {self.edit_history!r} must be 'keep' or 'erase'")
        if not self.change_window >= 0:  # NaN fails too
            raise ConfigError(f"change_window: {self.change_window!r} must be 0 or more seconds")
        if self.dedupe is not None and not isinstance(self.dedupe, DedupeConfig):
            raise ConfigError(f"dedupe: expected a DedupeConfig, got {type(self.dedupe).__name__}")
        if self.embed not in ("off", "sync", "background"):
            raise ConfigError(f"embed: {self.embed!r} must be 'off', 'sync' or 'background'")
        if self.inclusion_log not in ("sync", "deferred"):
            raise ConfigError(f"inclusion_log: {self.inclusion_log!r} must be 'sync' or 'deferred'")
        if self.inclusion_log_queue < 1:
            raise ConfigError(f"inclusion_log_queue: {self.inclusion_log_queue} must be at least 1")
        if self.assemble_embed_limit < 0:
            raise ConfigError(
                f"assemble_embed_limit: {self.assemble_embed_limit} is negative; 0 never waits"
            )
        if not 0 <= self.assemble_embed_seconds < float("inf"):  # NaN fails too
            raise ConfigError(
                f"assemble_embed_seconds: {self.assemble_embed_seconds!r} must be 0 or more "
                "seconds (0 never waits)"
            )
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
        if not self.store_timeout > 0:
            raise ConfigError(f"store_timeout: {self.store_timeout} must be above 0 seconds")
        if self.recent_page < 1:
            raise ConfigError(f"recent_page: {self.recent_page} must be at least 1")
        if not 0 < self.window_threshold <= 1:
            raise ConfigError(
                f"window_threshold: {self.window_threshold} must be in (0, 1], e.g. 0.9"
            )
        if self.window_summaries not in ("sync", "background"):
            raise ConfigError(
                f"window_summaries: {self.window_summaries!r} must be 'sync' or 'background'"
            )
        if self.compact_every is not None and not self.compact_every > 0:
            raise ConfigError(
                f"compact_every: {self.compact_every} must be above 0 seconds, or None for off"
            )
        if not self.compact_lease > 0:
            raise ConfigError(f"compact_lease: {self.compact_lease} must be above 0 seconds")
        if self.max_window_summaries < 2:
            raise ConfigError(
                f"max_window_summaries: {self.max_window_summaries} must be at least 2"
            )
