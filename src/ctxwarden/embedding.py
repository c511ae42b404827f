"""The embedding flow: embedding pending memories in batches (on demand, right after ingest, or
in a background worker thread), layer C of de-dup (semantic folds) over the vectors, and whether
retrieval may use the store's vectors.

:class:`Embeddings` is the service behind :meth:`ctxwarden.engine.Engine.embed_pending`,
:meth:`~ctxwarden.engine.Engine.dedupe_semantic` and ``EngineConfig(embed=...)``; assembly asks it
for the embedder and :meth:`Embeddings.vectors_usable`. The fold decisions are
:mod:`ctxwarden.semantic`'s.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import numpy.typing as npt

from ctxwarden.embed import Embedder, get_embedder
from ctxwarden.engine_config import EngineConfig
from ctxwarden.errors import EmbedError, InputError
from ctxwarden.scope import ReadScope, in_scope
from ctxwarden.semantic import (
    MERGE_STATUS,
    SemanticConfig,
    SemanticFold,
    SemanticReport,
    fold_semantic,
)
from ctxwarden.store.base import Store
from ctxwarden.types import Memory

__all__ = [
    "COALESCE_SECONDS",
    "LEXICAL_ONLY_LISTED",
    "PENDING_COUNTED",
    "QUERY_CACHE_SIZE",
    "Embeddings",
]

log = logging.getLogger(__name__)

#: At most this many ids of memories searched by words only are listed in a report.
LEXICAL_ONLY_LISTED = 50
#: Memories still pending are counted up to this many (the report says "at least").
PENDING_COUNTED = 1000
#: Query vectors kept per engine (1.5 KB each with MiniLM).
QUERY_CACHE_SIZE = 256
#: The worker waits this long after the ingest that woke it before embedding (seconds).
COALESCE_SECONDS = 0.05


#: Texts embedded between two looks at the stop flag.
_SLICE = 8


class _ClosingError(Exception):
    """The engine is closing: the batch being embedded is abandoned."""


class Embeddings:
    """Embeds a store's memories with one embedder, folds near-identical ones (layer C)."""

    def __init__(
        self,
        store: Store,
        config: EngineConfig,
        *,
        clock: Callable[[], float],
        embedder: Embedder | None,
        flush_log: Callable[[], None],
        forget: Callable[[], None],
    ) -> None:
        self.store = store
        self.config = config
        self.clock = clock
        self.flush_log = flush_log
        # Called after a semantic fold changed rows (the ingest flow's analysed aggregates).
        self._forget = forget
        self._embedder = embedder
        self._vector_state: tuple[bool, tuple[str, ...]] | None = None
        self._vector_state_at = 0.0
        self._embed_lock = threading.Lock()
        self._embed_wake = threading.Event()
        self._embed_stop = threading.Event()
        self._embed_thread: threading.Thread | None = None
        # What catch_up needs to look at: memories past rowid `_covered` (a complete pass left
        # nothing pending up to it), and only when ingest ran since a complete pass
        # (`_generation` counts this engine's ingests and edits, `_clean` is the count a
        # complete pass started at).
        # Dirty at open: memories a previous process left pending are looked for once.
        self._generation = 1
        self._query_lock = threading.Lock()
        self._query_pool: ThreadPoolExecutor | None = None
        self._query_cache: OrderedDict[tuple[str, str], npt.NDArray[np.float32]] = OrderedDict()
        self._clean = 0
        self._covered = 0

    def close(self) -> None:
        """Stop the background worker, if one runs, once it finishes its slice, and the
        query thread."""
        if self._query_pool is not None:
            self._query_pool.shutdown(wait=True)
            self._query_pool = None
        thread = self._embed_thread
        if thread is not None:
            self._embed_stop.set()
            self._embed_wake.set()
            thread.join()
            self._embed_thread = None

    @property
    def embedder(self) -> Embedder:
        """The embedder (built from ``config.embedder`` on first use)."""
        if self._embedder is None:
            self._embedder = get_embedder(self.config.embedder)
        return self._embedder

    def embed_pending(
        self,
        batch_size: int | None,
        *,
        reembed: bool,
        limit: int | None,
        progress: Callable[[int], None] | None,
    ) -> int:
        """Embed what has no vector of this embedder yet (see :meth:`Engine.embed_pending`)."""
        size = batch_size or self.config.embed_batch
        if size < 1:
            raise InputError(f"{size} must be at least 1", field="batch_size")
        model = self.embedder.name
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
            self._vector_state = None
        done, _ = self._embed_from(0, size, limit, progress)
        return done

    def _embed_from(
        self,
        after: int,
        size: int,
        limit: int | None,
        progress: Callable[[int], None] | None,
    ) -> tuple[int, bool]:
        """Embed pending memories after rowid ``after`` in batches of ``size``, at most
        ``limit``; (how many, whether none is left). The lock is held one batch at a time, so
        an assemble catching up waits for one batch of the worker, not for its whole backlog."""
        model = self.embedder.name
        generation = self._generation
        done = 0
        while limit is None or done < limit:
            want = size if limit is None else min(size, limit - done)
            with self._embed_lock:
                try:
                    rowids = self.store.embed_pending_batch(
                        model, self._embed_texts, after=after, limit=want
                    )
                except _ClosingError:
                    return done, False
                if rowids and self.config.semantic.enabled:
                    self._fold_semantic(self.store.memories_at(rowids), model)
            if rowids and (self._vector_state is None or not self._vector_state[0]):
                self._vector_state = None  # the first vectors of this model: usable now
            if not rowids:
                # Everything this engine ingested before `generation` has a vector now.
                self._covered = max(self._covered, after)
                self._clean = max(self._clean, generation)
                return done, True
            done += len(rowids)
            after = rowids[-1]
            if progress is not None:
                progress(done)
            if self._embed_stop.is_set():
                break
        return done, False

    def _embed_texts(self, texts: list[str]) -> npt.NDArray[np.float32]:
        # In slices, so close() waits for one slice (~80 ms of MiniLM), not a whole batch: a
        # stopped batch is abandoned before anything of it is stored.
        parts = []
        for start in range(0, len(texts), _SLICE):
            if self._embed_stop.is_set():
                raise _ClosingError
            parts.append(self.embedder.embed([t[:4000] for t in texts[start : start + _SLICE]]))
        return np.vstack(parts) if parts else self.embedder.embed([])

    def catch_up(self, tenant: str, scope: ReadScope | None) -> tuple[int, tuple[str, ...]]:
        """Before a query's retrieval: embed what this engine ingested that is still pending,
        at most ``config.assemble_embed_limit`` texts, so retrieval sees every memory ingested
        before it. Returns how many memories are still pending (0: none, whatever the
        scope) and the ids of those visible in ``scope`` (at most :data:`LEXICAL_ONLY_LISTED`),
        which are searched by words only. A no-op with ``embed="off"`` (vectors are then the
        caller's business) or when nothing was ingested since the last complete pass."""
        if self.config.embed == "off" or self._clean == self._generation:
            return 0, ()
        usable, others = self.vectors_usable()
        if others and not usable:
            return 0, ()  # another model's vectors: assembly notes it, nothing to catch up
        model = self.embedder.name
        cap = self.config.assemble_embed_limit
        if cap:
            _, exhausted = self._embed_from(
                self._covered, min(cap, self.config.embed_batch), cap, None
            )
            if exhausted:
                return 0, ()
        left = self.store.pending_embeddings(model, after=self._covered, limit=PENDING_COUNTED)
        if not left:
            return 0, ()
        if self.config.embed == "background":
            self._wake_worker()  # a backlog (a bulk ingest, a previous process's): embed it
        visible = [
            m.id
            for m in self.store.memories_at([r for r, _ in left[: LEXICAL_ONLY_LISTED * 4]])
            if m.tenant == tenant and in_scope(m, scope)
        ]
        return len(left), tuple(visible[:LEXICAL_ONLY_LISTED])

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
        tenant: str | None,
        config: SemanticConfig | None,
        dry_run: bool,
        progress: Callable[[int], None] | None,
    ) -> SemanticReport:
        """Layer C over a tenant's embedded memories (see :meth:`Engine.dedupe_semantic`)."""
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
            self._forget()
        return report

    def after_ingest(self, *, edited: bool = False) -> None:
        """Embed what a batch stored: now (``embed="sync"``) or by waking the worker thread.
        ``edited``: a memory's text changed, so a vector below the watermark is gone."""
        self._generation += 1
        if edited:
            self._covered = 0
        if self.config.embed == "sync":
            try:
                self._embed_new()
            except EmbedError as exc:
                log.warning("embedding skipped: %s", exc)
            return
        self._wake_worker()

    def _wake_worker(self) -> None:
        if self._embed_thread is None:
            self._embed_thread = threading.Thread(
                target=self._embed_loop, name="ctxwarden-embed", daemon=True
            )
            self._embed_thread.start()
        self._embed_wake.set()

    def forget(self) -> None:
        """After an erasure: a new memory may reuse a deleted one's rowid (SQLite takes
        ``max(rowid) + 1``), so the next pass starts from the first rowid again."""
        self._covered = 0
        self._generation += 1

    def _embed_new(self) -> None:
        """Embed what was ingested since the last complete pass (past the watermark)."""
        usable, others = self.vectors_usable()
        if others and not usable:
            raise EmbedError(
                f"the store holds vectors of {', '.join(map(repr, others))} but this engine "
                f"embeds with {self.embedder.name!r}: run `ctxwarden embed --reembed`"
            )
        self._embed_from(self._covered, self.config.embed_batch, None, None)

    def _embed_loop(self) -> None:
        while not self._embed_stop.is_set():
            self._embed_wake.wait()
            # Coalesce: the ingests of a burst are embedded together, in full batches.
            if self._embed_stop.wait(COALESCE_SECONDS):
                return
            self._embed_wake.clear()
            try:
                self._embed_new()
            except EmbedError as exc:  # no model, or another model's vectors: for good
                log.warning("background embedding stopped: %s", exc)
                return
            except Exception:  # the store busy or failing: the next ingest wakes it again
                log.exception("background embedding failed; tried again after the next ingest")

    def may_search(self) -> bool:
        """Whether a query is likely searched by vectors: this engine embeds, or the store
        has this embedder's vectors (worth starting the query's embedding early)."""
        return self.config.embed != "off" or self.vectors_usable()[0]

    def embed_query_soon(self, query: str) -> Callable[[], npt.NDArray[np.float32]]:
        """Start embedding ``query`` in the query thread; returns a function that waits for its
        vector (and raises what the embedder raised). The last :data:`QUERY_CACHE_SIZE`
        queries' vectors are kept: an agent's tool-call rounds send the same last message."""
        key = (self.embedder.name, query)
        with self._query_lock:
            cached = self._query_cache.get(key)
            if cached is not None:
                self._query_cache.move_to_end(key)
                return lambda: cached
            if self._query_pool is None:
                self._query_pool = ThreadPoolExecutor(1, thread_name_prefix="ctxwarden-query")
            future = self._query_pool.submit(self.embedder.embed, [query])

        def wait() -> npt.NDArray[np.float32]:
            vector: npt.NDArray[np.float32] = future.result()[0]
            with self._query_lock:
                self._query_cache[key] = vector
                while len(self._query_cache) > QUERY_CACHE_SIZE:
                    self._query_cache.popitem(last=False)
            return vector

        return wait

    def vectors_usable(self) -> tuple[bool, tuple[str, ...]]:
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
