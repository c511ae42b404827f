"""The compaction flow and sliding-window summaries: plan (reads) and apply (one transaction per
cluster) of :mod:`ctxwarden.compact`, and the summaries of a session's oldest history that keep
its recent block under the window.

:class:`Compaction` is the service behind :meth:`ctxwarden.engine.Engine.compact_plan`,
:meth:`~ctxwarden.engine.Engine.compact`, :meth:`~ctxwarden.engine.Engine.recent_capacity` and
:meth:`~ctxwarden.engine.Engine.summarize_session` (which ingest calls with
``EngineConfig(auto_summarize=True)``). Planning and clustering are :mod:`ctxwarden.compact`'s;
summaries are written by the configured :class:`~ctxwarden.summarize.Summarizer`.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from ctxwarden import compact as compaction
from ctxwarden import render, tokens
from ctxwarden.budget import allocate
from ctxwarden.counting import MemoryCounts
from ctxwarden.engine_config import EngineConfig
from ctxwarden.errors import NotFound, SummarizeError
from ctxwarden.models import ModelRegistry
from ctxwarden.store.base import Store, scrub_until_done
from ctxwarden.summarize import ExtractiveSummarizer, Summarizer, SummaryItem
from ctxwarden.types import Memory

logger = logging.getLogger(__name__)

__all__ = ["Compaction"]


@dataclass(eq=False)
class Compaction:
    """Compacts a store's old memories and summarises sessions' oldest history."""

    store: Store
    config: EngineConfig
    clock: Callable[[], float]
    registry: ModelRegistry
    counter: MemoryCounts
    flush_log: Callable[[], None]

    def compact_plan(
        self,
        *,
        policy: compaction.CompactionPolicy | None,
        tenant: str | None,
        model: str | None,
        embeddings: Mapping[str, Sequence[float]] | None,
        tokenizer: str | None,
    ) -> compaction.CompactionPlan:
        """What :meth:`compact` would do now, read only (see :meth:`Engine.compact_plan`)."""
        tenant = tenant or self.config.tenant
        policy = policy or self.config.compact_policy or compaction.CompactionPolicy()
        tok = tokens.get_tokenizer(
            self.registry.resolve(model or self.config.default_model, tokenizer=tokenizer).tokenizer
        )
        now = self.clock()
        self.flush_log()  # the access threshold reads the access stats
        rows = self.store.compaction_candidates(tenant, created_before=now - policy.older_than)
        memories = [m for m, _ in rows]
        counts = self.counter.counts(memories, tok)
        summaries = self.store.summaries(tenant)
        referenced = {sid for s in summaries for sid in s.source_ids}
        return compaction.plan(
            memories,
            now=now,
            policy=policy,
            tokens={rowid: c.line for rowid, c in counts.items()},
            score_times={m.rowid: at for m, at in rows},
            referenced=referenced,
            embeddings=embeddings,
            tokenizer=tok.name,
            counter=tok,
            summaries=summaries,
        )

    def compact(
        self,
        plan: compaction.CompactionPlan | None,
        *,
        summarizer: Summarizer | None,
        policy: compaction.CompactionPolicy | None,
        tenant: str | None,
        progress: Callable[[compaction.Cluster, str], None] | None,
        stop: Callable[[], bool] | None = None,
    ) -> compaction.CompactionResult:
        """Compact old, unused memories into summaries (see :meth:`Engine.compact`)."""
        # Archived originals past their retention go first (keep_originals="archive").
        with self.store.write() as writer:
            purged = writer.purge_archive(self.clock())
        plan = plan or self.compact_plan(
            policy=policy, tenant=tenant, model=None, embeddings=None, tokenizer=None
        )
        self.flush_log()  # bumps of a retired memory go to nothing once it is gone
        tok = (
            tokens.get_tokenizer(plan.tokenizer) if plan.tokenizer else self._ingest_tokenizers()[0]
        )
        result = compaction.apply(
            plan,
            summarizer or ExtractiveSummarizer(),
            store=self.store,
            tokenizer=tok,
            tokenizers=self._summary_tokenizers(tok),
            now=self.clock(),
            progress=progress,
            stop=stop,
        )
        # The originals' text leaves the files (FTS index pages, WAL frames, vector index
        # files) as part of apply, not at a later scrub; retried until done, as after a delete.
        scrub_until_done(self.store)
        return dataclasses.replace(result, purged=purged) if purged else result

    def compact_preview(
        self, plan: compaction.CompactionPlan, *, summarizer: Summarizer | None
    ) -> tuple[compaction.ClusterSummary, ...]:
        """Each cluster's summary text and what it drops, writing nothing."""
        tok = (
            tokens.get_tokenizer(plan.tokenizer) if plan.tokenizer else self._ingest_tokenizers()[0]
        )
        return compaction.preview(
            plan, summarizer or ExtractiveSummarizer(), store=self.store, tokenizer=tok
        )

    def _ingest_tokenizers(self) -> tuple[tokens.Tokenizer, ...]:
        names = self.config.tokenizers or (
            self.registry.resolve(self.config.default_model).tokenizer,
        )
        return tuple(tokens.get_tokenizer(n) for n in names)

    def _summary_tokenizers(self, tok: tokens.Tokenizer) -> tuple[tokens.Tokenizer, ...]:
        out = {t.name: t for t in self._ingest_tokenizers()}
        out.setdefault(tok.name, tok)
        return tuple(out.values())

    def recent_capacity(
        self, *, model: str | None, tokenizer: str | None, window: int | None
    ) -> int:
        """The recent block's tokens when every block is full (:meth:`Engine.recent_capacity`)."""
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
        summarizer: Summarizer | None,
        model: str | None,
        tenant: str | None,
        threshold: float | None,
        capacity: int | None,
        tokenizer: str | None,
        window: int | None,
    ) -> list[str]:
        """Sliding window over ``session`` (see :meth:`Engine.summarize_session`)."""
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
        counts = self.counter.counts(pending, tok)
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
            made = None
            if sources:
                made = self._write_window_summary(
                    tenant, session, sources, summarizer, tok, sum(costs[:cut]), retire=False
                )
            if made is not None:
                written.append(made)
                windows.append(self.store.get(tenant, made))
        if len(windows) > self.config.max_window_summaries:
            oldest = sorted(windows, key=lambda s: (s.created_at, s.rowid))
            merge = oldest[: len(oldest) // 2 + 1]
            cost = sum(self.counter.counts(merge, tok)[m.rowid].line for m in merge)
            made = self._write_window_summary(
                tenant, session, merge, summarizer, tok, cost, retire=True
            )
            if made is not None:
                written.append(made)
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
    ) -> str | None:
        """Summarise ``sources`` and write the summary; its id (also when it was there
        already), or None when nothing was written because a source went meanwhile."""
        ids = [m.id for m in sources]
        summary_id = compaction.summary_id(tenant, ids)
        # Messages shrink to a quarter; summaries, already dense, to a half.
        target = max(64, min(1024, cost // 2 if retire else cost // 4))
        items = [SummaryItem.of(m) for m in sources]
        try:
            summary = summarizer.summarize(items, max_tokens=target, tokenizer=tok)
        except SummarizeError as exc:
            if isinstance(summarizer, ExtractiveSummarizer):
                raise
            # A window summary is never skipped for a model's failure: the extractive one.
            logger.warning("window summary of %s falls back to extractive: %s", session, exc)
            summary = ExtractiveSummarizer().summarize(items, max_tokens=target, tokenizer=tok)
        channels = {m.channel for m in sources}
        # One end user's lines make their summary; a session shared by several makes one of
        # no user (read in session scope only).
        users = {m.user for m in sources}
        done = compaction.write_summary(
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
        if retire:
            scrub_until_done(self.store)  # the retired summaries' text leaves the files too
        if not done:
            try:
                self.store.get(tenant, summary_id)  # there already (written before)
            except NotFound:
                return None  # a source was erased meanwhile: nothing written
        return summary_id
