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
from collections.abc import Callable, Iterable

import numpy as np
import numpy.typing as npt

from ctxwarden.embed import Embedder, get_embedder
from ctxwarden.engine_config import EngineConfig
from ctxwarden.errors import CtxwardenError, EmbedError, InputError
from ctxwarden.semantic import (
    MERGE_STATUS,
    SemanticConfig,
    SemanticFold,
    SemanticReport,
    fold_semantic,
)
from ctxwarden.store.base import Store
from ctxwarden.types import Memory

__all__ = ["Embeddings"]

log = logging.getLogger(__name__)


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

    def close(self) -> None:
        """Stop the background worker, if one runs, once it finishes its batch."""
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

    def after_ingest(self) -> None:
        """Embed what a batch stored: now (``embed="sync"``) or by waking the worker thread."""
        if self.config.embed == "sync":
            try:
                self.embed_pending(None, reembed=False, limit=None, progress=None)
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
                self.embed_pending(None, reembed=False, limit=None, progress=None)
            except CtxwardenError as exc:
                log.warning("background embedding stopped: %s", exc)
                return

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
