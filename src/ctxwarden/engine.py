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
import logging
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import xxhash

from ctxwarden import compact as compaction
from ctxwarden import render, tokens
from ctxwarden.assemble import (
    Candidate,
    Material,
    block_reports,
    fill,
    memory_message,
    query_terms,
    recent_messages,
    system_message_text,
)
from ctxwarden.budget import BudgetPolicy, allocate, chat_policy
from ctxwarden.dedupe import exact_key
from ctxwarden.errors import ConfigError, CtxwardenError, InputError
from ctxwarden.models import ModelSpec, default_registry
from ctxwarden.store.base import ContextLog, Inclusion, NewMemory, Store, TokenCount
from ctxwarden.store.sqlite import SQLiteStore
from ctxwarden.summarize import ExtractiveSummarizer, Summarizer, SummaryItem
from ctxwarden.types import (
    Context,
    IngestOutcome,
    IngestResult,
    Memory,
    Record,
    Report,
)

__all__ = ["Engine", "EngineConfig"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True, slots=True)
class EngineConfig:
    """How an engine behaves. Every field has a sensible default.

    ``tokenizers`` are counted at ingest (others are counted on first use and cached); by default
    the tokenizer of ``default_model``. ``exact_ttl_seconds`` is how long a verbatim repeat in a
    channel is folded into the first one.
    """

    default_model: str = "gpt-4o"
    tokenizers: tuple[str, ...] = ()
    policy: BudgetPolicy = field(default_factory=chat_policy)
    exact_ttl_seconds: float = 3600.0
    tenant: str = "default"
    models: tuple[ModelSpec, ...] = ()
    related_candidates: int = 100
    recent_page: int = 64
    auto_summarize: bool = False
    window_threshold: float = 0.9
    max_window_summaries: int = 8

    def __post_init__(self) -> None:
        if self.exact_ttl_seconds < 0:
            raise ConfigError(f"exact_ttl_seconds: {self.exact_ttl_seconds} is negative")
        if self.related_candidates < 0:
            raise ConfigError(f"related_candidates: {self.related_candidates} is negative")
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


class Engine:
    """The engine most users touch: ``ingest``, ``assemble``, ``get``, ``stats``.

    Open with :meth:`open`; close with :meth:`close` or use it as a context manager.
    """

    def __init__(
        self,
        store: Store,
        *,
        config: EngineConfig | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.config = config or EngineConfig()
        self.clock = clock
        self.registry = default_registry()
        for spec in self.config.models:
            self.registry.register(spec)

    @classmethod
    def open(
        cls,
        path: str | Path,
        *,
        config: EngineConfig | None = None,
        clock: Callable[[], float] = time.time,
    ) -> Engine:
        """Open (creating if needed) the store at ``path``: a file path or ``":memory:"``."""
        text = str(path)
        if text.startswith(("postgresql://", "postgres://")):
            raise ConfigError(
                "db: PostgreSQL is not available in this version; use a SQLite file path"
            )
        return cls(SQLiteStore(text), config=config, clock=clock)

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the store."""
        self.store.close()

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
    ) -> IngestResult:
        """Validate and store records; one outcome per record, in order.

        All or nothing: if any record is invalid, :class:`InputError` names its line and field
        and nothing is written. A record whose id is already known is a no-op (``known``); a
        verbatim repeat in the same channel within the TTL is folded into the first
        (``duplicate``): its ``dup_count`` and ``last_seen_at`` are bumped and the repeat's id
        becomes an alias of it.
        """
        defaults: dict[str, Any] = {}
        if tenant is not None:
            defaults["tenant"] = tenant
        elif self.config.tenant != "default":
            defaults["tenant"] = self.config.tenant
        if session is not None:
            defaults["session"] = session
        now = self.clock()
        prepared: list[_Prepared] = []
        for number, raw in enumerate(records, start=1):
            if isinstance(raw, Record):
                record = dataclasses.replace(raw, **defaults) if defaults else raw
            else:
                record = Record.from_mapping(raw, line=number, defaults=defaults)
            created = record.created_at if record.created_at is not None else now
            record_id = record.id or _derive_id(record, created)
            prepared.append(
                _Prepared(
                    record=record,
                    id=record_id,
                    created_at=created,
                    content_hash=exact_key(
                        author=record.author, content=record.content, attachments=record.attachments
                    ),
                )
            )
        tokenizers = self._ingest_tokenizers()
        outcomes: list[IngestOutcome] = []
        ttl = self.config.exact_ttl_seconds
        with self.store.write() as writer:
            for item in prepared:
                record = item.record
                existing = writer.resolve(record.tenant, item.id)
                if existing is not None:
                    outcomes.append(
                        IngestOutcome(
                            id=item.id,
                            status="known",
                            duplicate_of=existing if existing != item.id else None,
                        )
                    )
                    continue
                if record.kind == "message" and ttl > 0 and not record.tool_calls:
                    hit = writer.find_exact(
                        record.tenant, record.channel, item.content_hash, item.created_at - ttl
                    )
                    if hit is not None:
                        writer.fold(
                            hit[0], alias=item.id, status="duplicate", seen_at=item.created_at
                        )
                        outcomes.append(
                            IngestOutcome(
                                id=item.id,
                                status="duplicate",
                                duplicate_of=hit[1],
                                reason="verbatim repeat within the channel's TTL",
                            )
                        )
                        continue
                rowid = writer.insert(_new_memory(item))
                memory_view = {
                    "role": record.role,
                    "author": record.author,
                    "content": record.content,
                    "kind": record.kind,
                    "created_at": item.created_at,
                    "channel": record.channel,
                }
                message_text = render.message_text(memory_view)
                line_text = render.line_text(memory_view)
                writer.put_token_counts(
                    [
                        TokenCount(
                            rowid=rowid,
                            tokenizer=tok.name,
                            message=tok.count(message_text),
                            line=tok.count(line_text),
                        )
                        for tok in tokenizers
                    ]
                )
                outcomes.append(IngestOutcome(id=item.id, status="stored"))
        result = IngestResult(outcomes=tuple(outcomes))
        if self.config.auto_summarize:
            touched = {
                (item.record.tenant, item.record.session)
                for item, outcome in zip(prepared, outcomes, strict=True)
                if outcome.status == "stored"
            }
            for tenant_name, session_name in sorted(touched):
                self.summarize_session(session_name, tenant=tenant_name)
        return result

    # -- reads -------------------------------------------------------------------------------

    def get(self, id: str, *, tenant: str | None = None) -> Memory:
        """The memory with caller id ``id``, or the aggregate it was folded into."""
        return self.store.get(tenant or self.config.tenant, id)

    def stats(self, *, tenant: str | None = None) -> dict[str, Any]:
        """Counts per channel: records seen, memories stored, duplicates folded; top families."""
        return self.store.stats(tenant or self.config.tenant)

    # -- compaction and sliding-window summaries -------------------------------------------

    def compact_plan(
        self,
        *,
        policy: compaction.CompactionPolicy | None = None,
        tenant: str | None = None,
        model: str | None = None,
        embeddings: Mapping[str, Sequence[float]] | None = None,
    ) -> compaction.CompactionPlan:
        """What :meth:`compact` would do now (reads only). See :mod:`ctxwarden.compact`.

        Token sizes are counted with ``model``'s tokenizer (default model by default);
        ``embeddings`` (memory id to vector) enable topic clustering.
        """
        tenant = tenant or self.config.tenant
        policy = policy or compaction.CompactionPolicy()
        tok = tokens.get_tokenizer(
            self.registry.resolve(model or self.config.default_model).tokenizer
        )
        now = self.clock()
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

    def recent_capacity(self, *, model: str | None = None) -> int:
        """Tokens the recent block gets for ``model`` when every block is full of material."""
        spec = self.registry.resolve(model or self.config.default_model)
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
    ) -> list[str]:
        """Sliding window: summarise the oldest unsummarised history of ``session`` when it
        passes ``threshold`` (default ``config.window_threshold``, 90 %) of the recent block's
        capacity (``capacity``, default :meth:`recent_capacity` for ``model``).

        The oldest messages are summarised until the unsummarised rest is at most half the
        capacity; they stay stored (retrieval still finds them) while the summary shows in the
        summaries block. When a session has more than ``config.max_window_summaries`` window
        summaries, the oldest half are summarised into one (summary of summaries) and retired
        with tombstones. Returns the ids of summaries written (none when under the threshold).
        """
        tenant = tenant or self.config.tenant
        summarizer = summarizer or ExtractiveSummarizer()
        spec = self.registry.resolve(model or self.config.default_model)
        tok = tokens.get_tokenizer(spec.tokenizer)
        fmt = tokens.get_chat_format(spec.chat_format, tok)
        capacity = capacity if capacity is not None else self.recent_capacity(model=spec.name)
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
            counts[m.rowid].message + fmt.message_overhead(m.role, name=m.name) for m in pending
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
    ) -> Context:
        """Assemble the context for one turn of ``session``.

        ``budget`` caps the prompt's tokens (chat template and tools included); without it the
        cap is the model's window minus the response reserve and the safety margin. ``query``
        (the current turn) drives retrieval and is sent as the last user message. ``items``
        fills caller-supplied blocks (e.g. ``{"scratch": ["..."]}``). Writes an inclusion-log row
        and bumps access stats unless ``log_inclusions`` is false.
        """
        tenant = tenant or self.config.tenant
        policy = policy or self.config.policy
        model_name = model or self.config.default_model
        spec = self.registry.resolve(model_name)
        tok = tokens.get_tokenizer(spec.tokenizer)
        fmt = tokens.get_chat_format(spec.chat_format, tok)
        limits = policy.limits(window=spec.window, budget=budget, max_output=spec.max_output)
        tool_list = [dict(t) for t in tools or ()]
        notes: list[str] = []
        if not tok.exact:
            notes.append(
                f"tokenizer {tok.name} is an approximation for {spec.name}: counts include its "
                "safety factor"
            )
        query_text = query.strip() if query else None
        recent_walk = _RecentWalk(self, tenant, session, channel, tok, fmt)
        newest = recent_walk.peek_newest()
        query_in_history = (
            query_text is not None
            and newest is not None
            and newest.role == "user"
            and newest.content == query_text
        )

        fixed_parts = {
            "template": max(
                fmt.request_overhead(has_system=True), fmt.request_overhead(has_system=False)
            ),
            "system": fmt.message_overhead("system")
            + (tok.count(render.system_prefix(system)) if system else 0),
            "tools": fmt.tools_tokens(tok, tool_list) if tool_list else 0,
            "query": (
                tok.count(query_text) + fmt.message_overhead("user")
                if query_text and not query_in_history
                else 0
            ),
        }
        fixed = sum(fixed_parts.values())
        available = max(0, limits.cap - fixed)

        material = Material(count=tok.count)
        material.recent = recent_walk.take(available)
        if query_text and self.config.related_candidates:
            material.related = self._related(tenant, query_text, tok)
        pinned = self.store.pinned(tenant)
        material.pinned = self._line_candidates(pinned, tok)
        material.summaries = self._line_candidates(
            self.store.summaries(tenant, session=session), tok
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
        notes.extend(plan.notes)

        messages: list[dict[str, Any]] = []
        included: list[str] = []
        inclusions: list[Inclusion] = []
        total = 0
        system_text, held = system_message_text(policy, plan, system)
        has_system = system_text is not None
        if has_system:
            assert system_text is not None
            messages.append({"role": "system", "content": system_text})
            total += fmt.message_overhead("system")
            if system:
                total += tok.count(render.system_prefix(system)) if held else tok.count(system)
            for block in policy.blocks:
                if block.source == "recent" or not plan.chosen[block.name]:
                    continue
                total += tok.count(render.block_header(block.title or block.name))
                total += sum(c.tokens for c in plan.chosen[block.name])
        for name, memory in held:
            if memory.rowid >= 0:
                included.append(memory.id)
                inclusions.append(Inclusion(rowid=memory.rowid, id=memory.id, block=name, tokens=0))
        for name, cand in recent_messages(plan, policy):
            total += cand.tokens
            for memory, text in zip(cand.memories, cand.text.split("\x00"), strict=True):
                messages.append(memory_message(memory, text))
                included.append(memory.id)
                inclusions.append(Inclusion(rowid=memory.rowid, id=memory.id, block=name, tokens=0))
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
            Inclusion(rowid=i.rowid, id=i.id, block=i.block, tokens=costs.get(i.rowid, 0))
            for i in inclusions
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
            candidates=tuple(plan.candidates),
            notes=tuple(notes),
        )
        context_id = uuid.uuid4().hex
        recent_walk.flush_counts()
        if log_inclusions:
            self.store.log_context(
                ContextLog(
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
            )
        return Context(
            id=context_id,
            messages=tuple(messages),
            included=tuple(included),
            tokens=total,
            report=report,
        )

    def _counts(self, memories: Sequence[Memory], tok: tokens.Tokenizer) -> dict[int, TokenCount]:
        """Cached counts for these memories, counting (and caching) the missing ones."""
        counts = self.store.token_counts([m.rowid for m in memories], tok.name)
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
        return counts

    def _line_candidates(
        self, memories: Sequence[Memory], tok: tokens.Tokenizer
    ) -> list[Candidate]:
        counts = self._counts(memories, tok)
        out = []
        for memory in memories:
            text, cost = _line(memory, counts[memory.rowid].line, tok)
            out.append(Candidate(memories=(memory,), tokens=cost, text=text))
        return out

    def _related(self, tenant: str, query: str, tok: tokens.Tokenizer) -> list[Candidate]:
        terms = query_terms(query)
        hits = self.store.search(tenant, terms, limit=self.config.related_candidates)
        hits = [(m, s) for m, s in hits if m.role != "tool" and not m.tool_calls]
        counts = self._counts([m for m, _ in hits], tok)
        top = max((s for _, s in hits), default=1.0) or 1.0
        out = []
        for memory, score in hits:
            text, cost = _line(memory, counts[memory.rowid].line, tok)
            out.append(
                Candidate(
                    memories=(memory,),
                    tokens=cost,
                    score=score / top,
                    components={"bm25": score},
                    text=text,
                )
            )
        return out


def _costs(plan: Any) -> dict[int, int]:
    costs: dict[int, int] = {}
    for cands in plan.chosen.values():
        for cand in cands:
            share = cand.tokens // max(1, len(cand.memories))
            for memory in cand.memories:
                costs[memory.rowid] = share
    return costs


def _line(memory: Memory, cached: int, tok: tokens.Tokenizer) -> tuple[str, int]:
    text = render.line_text(memory)
    if memory.dup_count > 1:
        text = (
            text[:-1]
            + render.volume_note(memory.dup_count, memory.created_at, memory.last_seen_at)
            + "\n"
        )
        return text, tok.count(text)
    return text, cached


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
    ) -> None:
        self.engine = engine
        self.tenant = tenant
        self.session = session
        self.channel = channel
        self.tok = tok
        self.fmt = fmt
        self._first_page: list[Memory] | None = None
        self._fresh: list[TokenCount] = []

    def _pages(self) -> Iterator[list[Memory]]:
        store = self.engine.store
        page_size = self.engine.config.recent_page
        page = self._first_page
        if page is None:
            page = store.recent(self.tenant, self.session, channel=self.channel, limit=page_size)
        while page:
            yield page
            if len(page) < page_size:
                return
            last = page[-1]
            page = store.recent(
                self.tenant,
                self.session,
                channel=self.channel,
                before=(last.created_at, last.rowid),
                limit=page_size,
            )

    def peek_newest(self) -> Memory | None:
        if self._first_page is None:
            self._first_page = self.engine.store.recent(
                self.tenant,
                self.session,
                channel=self.channel,
                limit=self.engine.config.recent_page,
            )
        return self._first_page[0] if self._first_page else None

    def take(self, available: int) -> list[Candidate]:
        """Units newest first until their cost passes ``available`` (or history ends)."""
        units: list[Candidate] = []
        total = 0
        pending: list[Memory] = []  # tool results waiting for the call that made them
        for page in self._pages():
            counts = self.engine.store.token_counts([m.rowid for m in page], self.tok.name)
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
        return units

    def _unit(self, group: Sequence[Memory], counts: Mapping[int, TokenCount]) -> Candidate:
        texts = []
        cost = 0
        for memory in group:
            text = render.message_text(memory)
            if memory.dup_count > 1:
                text += render.volume_note(memory.dup_count, memory.created_at, memory.last_seen_at)
            texts.append(text)
            cached = counts.get(memory.rowid)
            if memory.tool_calls or memory.role == "tool" or memory.dup_count > 1 or cached is None:
                message = memory_message(memory, text)
                cost += tokens.count_messages(
                    self.tok, self.fmt, [message]
                ) - self.fmt.request_overhead(has_system=False)
                if cached is None:
                    self._fresh.append(
                        TokenCount(
                            rowid=memory.rowid,
                            tokenizer=self.tok.name,
                            message=self.tok.count(render.message_text(memory)),
                            line=self.tok.count(render.line_text(memory)),
                        )
                    )
            else:
                cost += cached.message + self.fmt.message_overhead(memory.role, name=memory.name)
        return Candidate(memories=tuple(group), tokens=cost, text="\x00".join(texts))

    def flush_counts(self) -> None:
        if self._fresh:
            self.engine.store.put_token_counts(self._fresh)
            self._fresh = []


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


def _new_memory(item: _Prepared) -> NewMemory:
    r = item.record
    return NewMemory(
        id=item.id,
        tenant=r.tenant,
        session=r.session,
        channel=r.channel,
        author=r.author,
        author_kind=r.author_kind,
        role=r.role,
        content=r.content,
        created_at=item.created_at,
        thread_id=r.thread_id,
        reply_to=r.reply_to,
        kind=r.kind,
        pinned=r.pinned,
        name=r.name,
        tool_calls=r.tool_calls,
        tool_call_id=r.tool_call_id,
        attachments=r.attachments,
        metadata=r.metadata,
        content_hash=item.content_hash,
    )
