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
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import xxhash

from ctxwarden import render, tokens
from ctxwarden.assemble import (
    Candidate,
    Material,
    Plan,
    block_reports,
    fill,
    memory_message,
    query_terms,
    recent_messages,
    system_message_text,
)
from ctxwarden.budget import BudgetPolicy, chat_policy
from ctxwarden.dedupe import exact_key
from ctxwarden.embed import Embedder, get_embedder
from ctxwarden.errors import ConfigError, CtxwardenError, EmbedError, InputError, NotFound
from ctxwarden.models import ModelSpec, default_registry
from ctxwarden.retrieve import RetrievalWeights, retrieve
from ctxwarden.store.base import ContextLog, Inclusion, NewMemory, Store, TokenCount
from ctxwarden.store.sqlite import SQLiteStore
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
    recent_page: int = 32
    #: When memories are embedded: ``"off"`` (only by :meth:`Engine.embed_pending` or
    #: ``ctxwarden embed``), ``"sync"`` (right after each ingest commits), ``"background"`` (a
    #: thread embeds batches after ingest; ingest never waits). Retrieval uses whatever vectors
    #: of ``embedder`` the store holds, whichever way they were made.
    embed: str = "off"
    #: The embedder's name for :func:`ctxwarden.embed.get_embedder` (``"minilm"``, offline).
    embedder: str = "minilm"
    embed_batch: int = 32
    retrieval: RetrievalWeights = field(default_factory=RetrievalWeights)

    def __post_init__(self) -> None:
        if self.embed not in ("off", "sync", "background"):
            raise ConfigError(f"embed: {self.embed!r} must be 'off', 'sync' or 'background'")
        if self.embed_batch < 1:
            raise ConfigError(f"embed_batch: {self.embed_batch} must be at least 1")
        if self.exact_ttl_seconds < 0:
            raise ConfigError(f"exact_ttl_seconds: {self.exact_ttl_seconds} is negative")
        if self.related_candidates < 0:
            raise ConfigError(f"related_candidates: {self.related_candidates} is negative")
        if self.recent_page < 1:
            raise ConfigError(f"recent_page: {self.recent_page} must be at least 1")


@dataclass(slots=True)
class _Prepared:
    record: Record
    id: str
    created_at: float
    content_hash: str


def _postgres_store(dsn: str) -> Store:
    try:
        from ctxwarden.store.postgres import PostgresStore
    except ImportError as exc:
        raise ConfigError(
            f"db: a postgresql:// URL needs the PostgreSQL driver ({exc.name} is missing); "
            "install it with: pip install 'ctxwarden[postgres]'"
        ) from exc
    return PostgresStore(dsn)


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
        embedder: Embedder | None = None,
    ) -> None:
        self.store = store
        self.config = config or EngineConfig()
        self.clock = clock
        self.registry = default_registry()
        for spec in self.config.models:
            self.registry.register(spec)
        self._embedder = embedder
        self._vector_state: tuple[bool, tuple[str, ...]] | None = None
        self._vector_state_at = 0.0
        self._author_cache: dict[str, tuple[float, list[str]]] = {}
        self._embed_lock = threading.Lock()
        self._embed_wake = threading.Event()
        self._embed_stop = threading.Event()
        self._embed_thread: threading.Thread | None = None

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
        """Stop background embedding (finishing its batch) and close the store."""
        thread = self._embed_thread
        if thread is not None:
            self._embed_stop.set()
            self._embed_wake.set()
            thread.join()
            self._embed_thread = None
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
                since = None
                if record.kind == "message" and ttl > 0 and not record.tool_calls:
                    since = item.created_at - ttl
                status, rowid, target = writer.insert_or_fold(_new_memory(item), since=since)
                if status == "duplicate":
                    outcomes.append(
                        IngestOutcome(
                            id=item.id,
                            status="duplicate",
                            duplicate_of=target,
                            reason="verbatim repeat within the channel's TTL",
                        )
                    )
                    continue
                if status == "known":
                    outcomes.append(
                        IngestOutcome(
                            id=item.id,
                            status="known",
                            duplicate_of=target if target != item.id else None,
                        )
                    )
                    continue
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
        for item in prepared:  # keep the author cache of retrieval current
            cached = self._author_cache.get(item.record.tenant)
            if cached is not None and item.record.author and item.record.author not in cached[1]:
                cached[1].append(item.record.author)
        if self.config.embed != "off" and any(o.status == "stored" for o in outcomes):
            self._after_ingest()
        return result

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
                if progress is not None:
                    progress(done)
                if self._embed_stop.is_set():
                    break
            self._vector_state = None
            return done

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

    # -- reads -------------------------------------------------------------------------------

    def get(self, id: str, *, tenant: str | None = None) -> Memory:
        """The memory with caller id ``id``, or the aggregate it was folded into."""
        return self.store.get(tenant or self.config.tenant, id)

    def stats(self, *, tenant: str | None = None) -> dict[str, Any]:
        """Counts per channel: records seen, memories stored, duplicates folded; top families."""
        return self.store.stats(tenant or self.config.tenant)

    def search(
        self, query: str, *, tenant: str | None = None, limit: int = 20
    ) -> list[tuple[Memory, float]]:
        """Full-text search of the tenant's memories for ``query``'s terms, best first."""
        if limit < 1:
            raise InputError(f"{limit} must be at least 1", field="limit")
        terms = query_terms(query)
        return self.store.search(tenant or self.config.tenant, terms, limit=limit)

    def pin(self, id: str, *, pinned: bool = True, tenant: str | None = None) -> Memory:
        """Pin (or with ``pinned=False`` unpin) a memory; returns it. :class:`NotFound` if none."""
        tenant = tenant or self.config.tenant
        with self.store.write() as writer:
            found = writer.set_pinned(tenant, id, pinned)
        if not found:
            raise NotFound(f"no memory with id {id!r} in tenant {tenant!r}: check the id")
        return self.store.get(tenant, id)

    def delete(self, id: str, *, tenant: str | None = None, reason: str = "deleted") -> None:
        """Delete a memory, leaving a content-free tombstone. :class:`NotFound` if none."""
        tenant = tenant or self.config.tenant
        with self.store.write() as writer:
            found = writer.delete(tenant, id, deleted_at=self.clock(), reason=reason)
        if not found:
            raise NotFound(f"no memory with id {id!r} in tenant {tenant!r}: check the id")

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

        material = Material(count=tok.count)
        material.recent = recent_walk.take(available)
        if query_text and self.config.related_candidates:
            material.related = self._related(tenant, query_text, tok, notes, available)
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
                total += system_prefix_tokens if held else tok.count(system)
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

    def _related(
        self, tenant: str, query: str, tok: tokens.Tokenizer, notes: list[str], available: int
    ) -> list[Candidate]:
        """Hybrid retrieval (:mod:`ctxwarden.retrieve`) as related-block candidates.

        A larger budget asks for more candidates (about one per 16 tokens available, at most
        1,000), so a big related block is filled with the next-best hits rather than left empty.
        """
        wanted = max(self.config.related_candidates, min(1000, available // 16))
        weights = dataclasses.replace(self.config.retrieval, candidates=wanted)
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
        )
        return [
            Candidate(
                memories=(hit.memory,),
                tokens=lines[hit.memory.rowid][1],
                score=hit.score,
                components=hit.components,
                text=lines[hit.memory.rowid][0],
            )
            for hit in hits
        ]


def _costs(plan: Plan) -> dict[int, int]:
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

    def _page(self, before: tuple[float, int] | None, limit: int) -> list[Memory]:
        return self.engine.store.recent(
            self.tenant, self.session, channel=self.channel, before=before, limit=limit
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
            if len(page) < limit:
                break
            average = max(1.0, total / max(1, len(units)))
            limit = max(16, min(2000, int((available - total) / average * 1.2) + 8))
            last = page[-1]
            page = self._page((last.created_at, last.rowid), limit)
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
