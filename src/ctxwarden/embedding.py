"""The embedding flow: embedding pending memories in batches (on demand, right after ingest, or
in a background worker thread), layer C of de-dup (semantic folds) over the vectors, and whether
retrieval may use the store's vectors.

:class:`Embeddings` is the service behind :meth:`ctxwarden.engine.Engine.embed_pending`,
:meth:`~ctxwarden.engine.Engine.dedupe_semantic` and ``EngineConfig(embed=...)``; assembly asks it
for the embedder and :meth:`Embeddings.vectors_usable`. The fold decisions are
:mod:`ctxwarden.semantic`'s.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import numpy.typing as npt

from ctxwarden.embed import Embedder, get_embedder, load_model
from ctxwarden.engine_config import EngineConfig
from ctxwarden.errors import EmbedError, InputError, StoreUnavailable
from ctxwarden.scope import ReadScope, in_scope
from ctxwarden.semantic import (
    MERGE_STATUS,
    SemanticConfig,
    SemanticFold,
    SemanticReport,
    fold_semantic,
    for_model,
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


#: Texts embedded between two looks at the stop flag (or at a catch-up's deadline).
_SLICE = 8
#: How much nicer than its process the background worker's model runs (Linux, where a
#: thread's nice value is its own): under CPU pressure request threads, and the query's
#: embedding, run first; the worker takes what is left (it only makes retrieval by meaning
#: arrive sooner). Beside two library writers on a loaded 2-core machine a request waited for
#: the CPU behind three processes' embedding workers (bench/reliability.py, contention). Only
#: the model runs there (a thread of its own): the worker's store writes hold the store's lock,
#: which requests wait for, so they keep the process's priority (no priority inversion).
WORKER_NICENESS = 10


class _ClosingError(Exception):
    """The engine is closing: the batch being embedded is abandoned."""


def fold_in_store(
    store: Store,
    memories: Iterable[Memory],
    model: str,
    config: SemanticConfig,
    *,
    clock: Callable[[], float],
    flush_log: Callable[[], None],
    dry_run: bool,
    progress: Callable[[int], None] | None,
) -> SemanticReport:
    """Layer C over ``memories`` with the store's vectors of ``model``: each memory against the
    earlier ones of its channel and author in the window; a fold merges (unless ``dry_run``).
    A ``config`` without a threshold folds at the line measured for ``model``
    (:func:`~ctxwarden.semantic.for_model`)."""

    def window(memory: Memory, since: float) -> list[tuple[Memory, npt.NDArray[np.float32]]]:
        return store.vector_window(
            memory.tenant,
            model,
            channel=memory.channel,
            author=memory.author,
            seen_since=since,
            created_until=memory.created_at,
        )

    def merge(fold: SemanticFold) -> bool:
        flush_log()  # the merge adds up both memories' access stats
        with store.write() as writer:
            return writer.merge(
                fold.tenant,
                fold.id,
                into=fold.into,
                merged_at=clock(),
                status=MERGE_STATUS,
                latest_content=fold.latest_content,
            )

    return fold_semantic(
        memories,
        window,
        for_model(config, model),
        merge=None if dry_run else merge,
        progress=progress,
    )


class QueryVectors:
    """The query thread and the vectors of the last :data:`QUERY_CACHE_SIZE` queries: an
    agent's tool-call rounds send the same last message."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None
        self._cache: OrderedDict[tuple[str, str], npt.NDArray[np.float32]] = OrderedDict()

    def close(self) -> None:
        """Stop the query thread (a later :meth:`soon` starts another)."""
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)

    def soon(self, embedder: Embedder, query: str) -> Callable[[], npt.NDArray[np.float32]]:
        """Start embedding ``query`` in the query thread; returns a function that waits for its
        vector (and raises what the embedder raised)."""
        key = (embedder.name, query)
        with self._lock:
            cached = self._cache.get(key)
            if cached is not None:
                self._cache.move_to_end(key)
                return lambda: cached
            if self._pool is None:
                self._pool = ThreadPoolExecutor(1, thread_name_prefix="ctxwarden-query")
            future = self._pool.submit(embedder.embed, [query])

        def wait() -> npt.NDArray[np.float32]:
            vector: npt.NDArray[np.float32] = future.result()[0]
            with self._lock:
                self._cache[key] = vector
                while len(self._cache) > QUERY_CACHE_SIZE:
                    self._cache.popitem(last=False)
            return vector

        return wait


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
        self._queries = QueryVectors()
        self._model_pool: ThreadPoolExecutor | None = None  # the worker's model, niced
        self._clean = 0
        self._covered = 0
        # What a catch-up could not finish on the request path, for the worker: vectors the
        # store was too busy to take, and rowids layer C has not looked at.
        self._unsaved_lock = threading.Lock()
        self._unsaved: list[tuple[str, list[int], npt.NDArray[np.float32]]] = []
        self._unfolded: list[int] = []

    def close(self) -> None:
        """Stop the background worker, if one runs, once it finishes its slice, and the
        query thread."""
        self._queries.close()
        thread = self._embed_thread
        if thread is not None:
            self._embed_stop.set()
            self._embed_wake.set()
            thread.join()
            self._embed_thread = None
        if self._model_pool is not None:
            self._model_pool.shutdown(wait=True)
            self._model_pool = None

    @property
    def embedder(self) -> Embedder:
        """The embedder (built from ``config.embedder`` on first use)."""
        if self._embedder is None:
            # "minilm" goes on with the MiniLM variant a store was embedded with.
            self._embedder = get_embedder(self.config.embedder, stored=self.store.vector_models())
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
        embed: Callable[[list[str]], npt.NDArray[np.float32]] = self.embedder.embed
        if threading.current_thread() is self._embed_thread:
            if self._model_pool is None:
                self._model_pool = ThreadPoolExecutor(
                    1,
                    thread_name_prefix="ctxwarden-embed-model",
                    initializer=_lower_priority,
                    initargs=(WORKER_NICENESS,),
                )
            pool = self._model_pool

            def embed(batch: list[str]) -> npt.NDArray[np.float32]:
                return pool.submit(self.embedder.embed, batch).result()

        parts = []
        for start in range(0, len(texts), _SLICE):
            if self._embed_stop.is_set():
                raise _ClosingError
            parts.append(embed([t[:4000] for t in texts[start : start + _SLICE]]))
        return np.vstack(parts) if parts else self.embedder.embed([])

    def catch_up(self, tenant: str, scope: ReadScope | None) -> tuple[int, tuple[str, ...]]:
        """Before a query's retrieval: embed the memories still pending that ``tenant`` and
        ``scope`` can see (those the query searches), so retrieval sees every memory ingested
        before it; at most ``config.assemble_embed_limit`` texts and
        ``config.assemble_embed_seconds`` of the request's time. Returns how many memories are
        still pending (0: none, whatever the scope) and the ids of those visible in ``scope``
        (at most :data:`LEXICAL_ONLY_LISTED`), which are searched by words only. A no-op with
        ``embed="off"`` (vectors are then the caller's business) or when nothing was ingested
        since the last complete pass.

        Bounded by time, not only by count (issue 20): texts are embedded in slices of
        :data:`_SLICE` with a look at the deadline between two, and the vectors are written
        only if the store's write lock comes within what is left of the bound (at least one
        try). Vectors the store could not take now are handed to the worker thread, which
        writes them off the request path; this turn searches those memories by words. The
        worker's embedding lock is not waited for: the worker holds it for whole batches (and
        their writes, which wait for other processes' writers), in rowid order from its
        watermark, while a catch-up takes only the query's own pending memories, usually the
        newest. One embedded by both at once costs one more embedding; the second vector
        replaces an identical first."""
        if self.config.embed == "off" or self._clean == self._generation:
            return 0, ()
        usable, others = self.vectors_usable()
        if others and not usable:
            return 0, ()  # another model's vectors: assembly notes it, nothing to catch up
        model = self.embedder.name
        cap, seconds = self.config.assemble_embed_limit, self.config.assemble_embed_seconds
        deadline = time.monotonic() + seconds
        left, visible = self._pending(model, tenant, scope)
        if visible and cap and seconds:
            # A cold process loads the model first (~0.3-0.9 s for MiniLM), which the query's
            # own embedding waits for too: the bound is on embedding work, so the load's time
            # is not counted in it (else a new process's first turn searched by words what it
            # had just ingested).
            loading = time.monotonic()
            load_model(self.embedder)
            deadline += time.monotonic() - loading
            texts = dict(left)
            done = self._embed_rows(
                model, [(m.rowid, texts[m.rowid]) for m in visible][:cap], deadline
            )
            left = [(r, t) for r, t in left if r not in done]
            visible = [m for m in visible if m.rowid not in done]
        if not left:
            return 0, ()
        if self.config.embed == "background":
            self._wake_worker()  # a backlog (a bulk ingest, a previous process's): embed it
        return len(left), tuple(m.id for m in visible[:LEXICAL_ONLY_LISTED])

    def _pending(
        self, model: str, tenant: str, scope: ReadScope | None
    ) -> tuple[list[tuple[int, str]], list[Memory]]:
        """The memories still pending past the watermark (rowid, text; at most
        :data:`PENDING_COUNTED`) and those of them ``tenant`` and ``scope`` see (among the
        first ``4 * LEXICAL_ONLY_LISTED``). None pending: this engine's ingests so far are all
        embedded (the next catch-up is a no-op until the next ingest)."""
        generation = self._generation
        left = self.store.pending_embeddings(model, after=self._covered, limit=PENDING_COUNTED)
        if not left:
            self._clean = max(self._clean, generation)
            return [], []
        visible = [
            m
            for m in self.store.memories_at([r for r, _ in left[: LEXICAL_ONLY_LISTED * 4]])
            if m.tenant == tenant and in_scope(m, scope)
        ]
        return left, visible

    def _embed_rows(self, model: str, rows: list[tuple[int, str]], deadline: float) -> set[int]:
        """Embed ``rows`` (rowid, text) slice by slice until ``deadline`` and store their
        vectors if the write lock comes before it (else the worker stores them); the rowids
        now searchable by vector."""
        rowids: list[int] = []
        parts: list[npt.NDArray[np.float32]] = []
        for start in range(0, len(rows), _SLICE):
            if time.monotonic() >= deadline:
                break
            chunk = rows[start : start + _SLICE]
            parts.append(self.embedder.embed([text[:4000] for _, text in chunk]))
            rowids.extend(r for r, _ in chunk)
        if not rowids:
            return set()
        vectors = np.vstack(parts)
        try:
            self.store.put_vectors(
                model, rowids, vectors, wait=max(0.0, deadline - time.monotonic())
            )
        except StoreUnavailable as exc:  # another writer holds the file: the worker writes them
            log.info("caught-up vectors left to the worker: %s", exc)
            with self._unsaved_lock:
                self._unsaved.append((model, rowids, vectors))
            if self.config.embed == "background":
                self._wake_worker()  # with "sync" the next ingest's pass writes them
            return set()
        if self._vector_state is None or not self._vector_state[0]:
            self._vector_state = None  # the first vectors of this model: usable now
        if self.config.semantic.enabled:
            with self._unsaved_lock:
                self._unfolded.extend(rowids)  # folds write too: the worker makes them
            if self.config.embed == "background":
                self._wake_worker()
        return set(rowids)

    def _save_handed_over(self) -> None:
        """Write the vectors a catch-up could not (the store was busy) and fold what catch-ups
        embedded (layer C), in the worker or the next pass; called holding the embedding lock."""
        with self._unsaved_lock:
            unsaved, self._unsaved = self._unsaved, []
            unfolded, self._unfolded = self._unfolded, []
        try:
            for model, rowids, vectors in unsaved:
                self.store.put_vectors(model, rowids, vectors)
                unfolded.extend(rowids)
        except BaseException:
            with self._unsaved_lock:  # kept for the next try
                self._unsaved[:0] = unsaved
            raise
        if unfolded and self.config.semantic.enabled:
            self._fold_semantic(self.store.memories_at(sorted(unfolded)), self.embedder.name)

    def _fold_semantic(
        self,
        memories: Iterable[Memory],
        model: str,
        *,
        config: SemanticConfig | None = None,
        dry_run: bool = False,
        progress: Callable[[int], None] | None = None,
    ) -> SemanticReport:
        report = fold_in_store(
            self.store,
            memories,
            model,
            config or self.config.semantic,
            clock=self.clock,
            flush_log=self.flush_log,
            dry_run=dry_run,
            progress=progress,
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
            self._drop_handed_over()  # a vector made for the text an edit replaced
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
        self._drop_handed_over()  # vectors of erased rows: their rowids may be reused

    def _drop_handed_over(self) -> None:
        with self._unsaved_lock:
            self._unsaved, self._unfolded = [], []

    def _embed_new(self) -> None:
        """Embed what was ingested since the last complete pass (past the watermark)."""
        usable, others = self.vectors_usable()
        if others and not usable:
            raise EmbedError(
                f"the store holds vectors of {', '.join(map(repr, others))} but this engine "
                f"embeds with {self.embedder.name!r}: run `ctxwarden embed --reembed`"
            )
        if self._unsaved or self._unfolded:
            with self._embed_lock:
                self._save_handed_over()
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
        """Start embedding ``query`` in the query thread (:class:`QueryVectors`)."""
        return self._queries.soon(self.embedder, query)

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


def _lower_priority(by: int) -> None:
    """Make the calling thread ``by`` nicer (Linux: ``setpriority`` on a thread id applies to
    that thread only; elsewhere it would renice the process, so nothing is done)."""
    if not sys.platform.startswith("linux"):
        return
    tid = threading.get_native_id()
    with contextlib.suppress(OSError):  # not permitted, or no such call: run as is
        os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + by))
