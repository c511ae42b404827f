"""The assembly flow: limits -> blocks (pinned, summaries, related, recent, items) -> retrieve
-> fill -> render -> exact count -> inclusion log. The context of one turn.

:class:`Assembly` is the service behind :meth:`ctxwarden.engine.Engine.assemble`: it reads the
store (history pages, pinned memories, summaries, retrieval), gets token counts from the engine's
:class:`~ctxwarden.counting.MemoryCounts`, and hands the candidates to the pure planner
(:func:`ctxwarden.assemble.fill`); the rendering and counting of the final messages are here.
The history walk (:class:`~ctxwarden.recent_walk.RecentWalk`) is its own module.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

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
    related_budget,
    system_message_text,
    text_segments,
)
from ctxwarden.budget import BudgetPolicy
from ctxwarden.changes import in_force
from ctxwarden.counting import MemoryCounts
from ctxwarden.embed import Embedder
from ctxwarden.embedding import PENDING_COUNTED, Embeddings
from ctxwarden.engine_config import EngineConfig
from ctxwarden.errors import CtxwardenError, InputError, StoreUnavailable
from ctxwarden.focus import vector_text
from ctxwarden.logwriter import LogWriter
from ctxwarden.models import ModelRegistry
from ctxwarden.passages import summary_passages
from ctxwarden.provenance import is_untrusted
from ctxwarden.recent_walk import TYPICAL_LINE_TOKENS, RecentWalk
from ctxwarden.retrieve import RetrievalWeights, check_query_length, retrieve
from ctxwarden.scope import ReadScope
from ctxwarden.scope import resolve as resolve_scope
from ctxwarden.scoped_reads import store_scope
from ctxwarden.store.base import ContextLog, Inclusion, Store
from ctxwarden.summary import summary_excerpt
from ctxwarden.textcheck import check_json_text, check_text
from ctxwarden.types import CandidateReports, Context, Memory, Report, Scope

log = logging.getLogger(__name__)

__all__ = [
    "MAX_RELATED_CANDIDATES",
    "RRF_K_MAX",
    "RRF_K_MIN",
    "TYPICAL_LINE_TOKENS",
    "Assembly",
    "author_candidates",
    "fusion_k",
    "related_anchors",
    "related_candidates",
    "retrieval_sizes",
    "sized_weights",
]


@dataclasses.dataclass(eq=False)
class Assembly:
    """Assembles contexts from a store (see :mod:`ctxwarden.assembly`)."""

    store: Store
    config: EngineConfig
    clock: Callable[[], float]
    registry: ModelRegistry
    counter: MemoryCounts
    embeddings: Embeddings
    #: Each tenant's authors for retrieval (read at most once a minute; ingest adds new ones).
    authors: dict[str, tuple[float, list[str]]]
    log_writer: LogWriter | None

    @property
    def embedder(self) -> Embedder:
        """The embedding flow's embedder (built on first use: only when vectors are usable)."""
        return self.embeddings.embedder

    def assemble(
        self,
        *,
        session: str,
        query: str | None,
        model: str | None,
        budget: int | None,
        system: str | None,
        tools: Sequence[Mapping[str, Any]] | None,
        tenant: str | None,
        channel: str | None,
        items: Mapping[str, Sequence[str]] | None,
        policy: BudgetPolicy | None,
        log_inclusions: bool,
        tokenizer: str | None,
        window: int | None,
        user: str | None,
        scope: Scope | None,
    ) -> Context:
        """The context for one turn of ``session`` (see :meth:`Engine.assemble`)."""
        check_query_length(query, self.config.max_query_chars)
        _check_arguments(
            query=query, system=system, channel=channel, model=model, tokenizer=tokenizer
        )
        if tools:
            check_json_text(tools, "tools")
        if items:
            check_json_text(items, "items")
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
        lexical_only: tuple[str, ...] = ()
        sizes: dict[str, float] = {}  # how retrieval was sized (Report.retrieval)
        # The query's embedding runs in the embedding flow's query thread (onnxruntime releases
        # the GIL) while the history, pinned memory and summaries are read below.
        query_vector = (
            self.embeddings.embed_query_soon(
                _vector_text(self, tenant, query_text[: self.config.retrieval.query_chars])
            )
            if query_text and self.config.related_candidates and self.embeddings.may_search()
            else None
        )
        recent_walk = RecentWalk(
            self.store,
            self.counter,
            self.config.recent_page,
            tenant,
            session,
            channel,
            tok,
            fmt,
            user,
        )
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
        wanted = 0  # retrieval's candidates per search (none without a query)
        if query_text and self.config.related_candidates:
            related_tokens = related_budget(policy, material, available)
            line = recent_walk.typical_line()
            # The pool is sized by all of `available`, not the related budget: the related
            # block can get it all (top-up, a short history), and a pool sized by the related
            # budget lost a multi-hop question on chatbench-dev at 4k (docs/benchmarks.md).
            wanted = related_candidates(available, line, floor=self.config.related_candidates)
            sized = sized_weights(self.config.retrieval, wanted, related_tokens)
            sizes = retrieval_sizes(sized, related_tokens)
            lexical_only = self._catch_up(tenant, read_scope, notes)
            material.related = self._related(
                tenant, query_text, tok, notes, sized, store_scope(read_scope), query_vector
            )
        # One read of the supersession links of pins and related hits, after retrieval.
        notes.extend(
            in_force(
                self.store, tenant, query_text, material, lambda m: _entries(self.counter, m, tok)
            )
        )
        if query_text and material.related:  # a summary's lines compete as passages
            w = self.config.retrieval
            asked = query_text[: w.query_chars]
            material.related = summary_passages(
                material.related, asked, self.counter.text_counter(tok), w, limit=wanted
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
            system_cost = _block_message_cost(
                policy, plan, system_text, held, "system", system_prefix_tokens, tok, fmt
            )
            data_text, data_held = data_message_text(policy, plan)
            data_cost = _block_message_cost(
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
            lexical_only=lexical_only,
            retrieval=sizes,
        )
        context_id = uuid.uuid4().hex
        unwritten = recent_walk.flush_counts()
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
            if self.log_writer is not None:
                self.log_writer.submit(entry)
            else:
                try:
                    self.store.log_context(entry)
                except StoreUnavailable as exc:  # a read-only or full store: reads go on
                    unwritten = unwritten or exc
                    log.warning("inclusion log of context %s not written: %s", context_id, exc)
        if unwritten is not None:
            report = dataclasses.replace(
                report,
                notes=(*report.notes, f"store not written ({unwritten.cause}): {unwritten}"),
            )
        return Context(
            id=context_id,
            messages=tuple(messages),
            included=tuple(included),
            tokens=total,
            report=report,
        )

    def _line_candidates(
        self, memories: Sequence[Memory], tok: tokens.Tokenizer
    ) -> list[Candidate]:
        counts = self.counter.counts(memories, tok)
        out = []
        for memory in memories:
            text, cost = _line(memory, counts[memory.rowid].line, tok)
            out.append(
                Candidate(memories=(memory,), tokens=cost, text=text or render.line_text(memory))
            )
        return out

    def _catch_up(self, tenant: str, scope: ReadScope, notes: list[str]) -> tuple[str, ...]:
        """Embed the few memories still pending before retrieval (:meth:`Embeddings.catch_up`);
        the ids of those left, searched by words only, with a note."""
        try:
            pending, ids = self.embeddings.catch_up(tenant, store_scope(scope))
        except CtxwardenError as exc:  # no model, a remote embedder down: words only
            notes.append(f"pending memories not embedded ({exc}); they are found by words only")
            return ()
        if pending:
            more = "+" if pending >= PENDING_COUNTED else ""
            notes.append(
                f"{pending}{more} memories not embedded yet (assemble_embed_limit "
                f"{self.config.assemble_embed_limit}, assemble_embed_seconds "
                f"{self.config.assemble_embed_seconds:g}): searched by words only, "
                f"{len(ids)} of them in scope listed in lexical_only"
            )
        return ids

    def _related(
        self,
        tenant: str,
        query: str,
        tok: tokens.Tokenizer,
        notes: list[str],
        weights: RetrievalWeights,
        scope: ReadScope | None = None,
        early_vector: Callable[[], npt.NDArray[np.float32]] | None = None,
    ) -> list[Candidate]:
        """Hybrid retrieval (:mod:`ctxwarden.retrieve`) as related-block candidates, with the
        weights sized for this context (:func:`sized_weights`)."""
        query = query[: weights.query_chars]  # what retrieval reads, the embedder too
        usable, others = self.embeddings.vectors_usable()
        if others and not usable:
            notes.append(
                f"vectors of {', '.join(others)} ignored (this engine embeds with "
                f"{self.embedder.name}): run `ctxwarden embed --reembed` to use vectors again"
            )
        embedder_name = self.embedder.name

        def query_vector() -> npt.NDArray[np.float32] | None:
            # Called by retrieve after its lexical search: the embedding runs meanwhile.
            try:
                if early_vector is not None:
                    return early_vector()
                text = _vector_text(self, tenant, query)
                vector: npt.NDArray[np.float32] = self.embedder.embed([text])[0]
                return vector
            except CtxwardenError as exc:  # a remote embedder down: retrieve without vectors
                notes.append(f"query not embedded ({exc}); related memory found by words only")
                return None

        lines: dict[int, tuple[str, int, str]] = {}

        def cost(memories: Sequence[Memory]) -> dict[int, int]:
            # Only an aggregate's line is kept here (its volume note counted with it): the others
            # are written for the few candidates fill takes (_write_lines). The stored counts are
            # read too: the next turn's walk over recent history finds them cached.
            self.counter.counts(memories, tok)
            counts = self.counter.entries(memories, tok)
            for memory in memories:
                lines[memory.rowid] = _entry(memory, counts[memory.rowid], tok, query)
            return {rowid: line[1] for rowid, line in lines.items()}

        hits = retrieve(
            self.store,
            tenant=tenant,
            query=query,
            now=self.clock(),
            cost=cost,
            query_vector=query_vector if usable else None,
            model=embedder_name if usable else None,
            weights=weights,
            keep=lambda m: m.role != "tool" and not m.tool_calls,
            authors=self._authors(tenant) if usable else (),
            scope=scope,
        )
        candidates = []
        for hit in hits:
            text, line_tokens, group = lines[hit.memory.rowid]
            # Positional (memories, tokens, score, components, text): ~150 a turn, and keyword
            # arguments cost ~2.5x on CPython 3.11.
            cand = Candidate((hit.memory,), line_tokens, hit.score, hit.components, text)
            cand.group, cand.anchor = group, hit.anchor
            candidates.append(cand)
        return candidates

    def _authors(self, tenant: str) -> list[str]:
        return _tenant_authors(self.store, self.authors, tenant)


def _vector_text(assembly: Assembly, tenant: str, query: str) -> str:
    """What the query's vector is made of: the query less the names of the tenant's authors
    it names (:func:`~ctxwarden.focus.vector_text`), when ``name_free``."""
    if not assembly.config.retrieval.name_free:
        return query
    return vector_text(query, _tenant_authors(assembly.store, assembly.authors, tenant))


def _tenant_authors(
    store: Store, cache: dict[str, tuple[float, list[str]]], tenant: str
) -> list[str]:
    """The tenant's authors, read from the store at most once a minute (``cache``, shared
    with ingest, which adds new ones)."""
    cached = cache.get(tenant)
    if cached is None or time.monotonic() - cached[0] > 60.0:
        cached = (time.monotonic(), store.authors(tenant))
        cache[tenant] = cached
    return cached[1]


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


#: At most this many candidates per search, whatever the budget: retrieval's time grows with
#: the count, and 1,000 lines (~32k tokens) is more related memory than a turn needs.
MAX_RELATED_CANDIDATES = 1000


def _check_arguments(**texts: str | None) -> None:
    """Refuse a NUL or a lone surrogate in a text argument of assemble, naming it."""
    for name, text in texts.items():
        if text is not None:
            if not isinstance(text, str):
                raise InputError(f"expected a string, got {type(text).__name__}", field=name)
            check_text(text, name)


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
    candidates never shown). With ``floor`` 0 retrieval is off (0). Sizing it by the related
    block's budget alone (:func:`~ctxwarden.assemble.related_budget`, ~80 % of ``available``)
    was tried and lost evidence at 4k; the neighbour expansion is sized by that budget
    (:func:`related_anchors`).

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


def related_anchors(expand: int, related: int) -> int:
    """How many of the best hits retrieval reads the neighbours of: ``expand`` (the
    configured :class:`~ctxwarden.retrieve.RetrievalWeights` field) per 1,000 tokens of the
    related block, rounded up, at least 1: a small block is not crowded with the neighbours of
    hits it has no room for, and an 8k block gets neighbours for as many hits as it can show.
    0 turns neighbours off.

    >>> related_anchors(8, 724), related_anchors(8, 1584), related_anchors(8, 6384)
    (6, 13, 52)
    """
    if expand <= 0:
        return 0
    return max(1, math.ceil(expand * max(0, related) / 1000))


def sized_weights(configured: RetrievalWeights, wanted: int, related: int) -> RetrievalWeights:
    """The configured weights sized for a context whose related block has ``related`` tokens:
    ``wanted`` candidates from each search (:func:`related_candidates`), neighbours around
    :func:`related_anchors` of the best hits, :func:`author_candidates` of each named author's
    own nearest turns, the fusion's ``rrf_k`` by :func:`fusion_k`."""
    return dataclasses.replace(
        configured,
        candidates=wanted,
        expand=related_anchors(configured.expand, related),
        author_candidates=author_candidates(configured.author_candidates, related),
        rrf_k=fusion_k(configured, related),
    )


def retrieval_sizes(sized: RetrievalWeights, related: int) -> dict[str, float]:
    """What :func:`sized_weights` chose for a related block of ``related`` tokens, as the
    report shows it (:attr:`~ctxwarden.types.Report.retrieval`).

    >>> sizes = retrieval_sizes(sized_weights(RetrievalWeights(), 100, 724), 724)
    >>> sizes["related_tokens"], sizes["candidates"], sizes["anchors"], sizes["rrf_k"]
    (724, 100, 3, 5.068)
    """
    return {
        "related_tokens": related,
        "candidates": sized.candidates,
        "author_candidates": sized.author_candidates,
        "anchors": sized.expand,
        "rrf_k": round(sized.rrf_k, 3),
    }


#: Bounds of the sized ``rrf_k`` (:func:`fusion_k`).
RRF_K_MIN = 2.0
RRF_K_MAX = 60.0


def fusion_k(configured: RetrievalWeights, related: int) -> float:
    """The ``k`` of reciprocal rank fusion for a related block of ``related`` tokens:
    :attr:`~ctxwarden.retrieve.RetrievalWeights.rrf_k_per_thousand` per 1,000 tokens, within
    [:data:`RRF_K_MIN`, :data:`RRF_K_MAX`]; ``rrf_k`` itself when that is 0.

    ``k`` sets how much a list's top ranks count over agreement between lists: a hit ranked
    first by one search weighs ``(k + 10) / (k + 1)`` times one ranked tenth. A small block
    shows a score of lines and must take what some search is sure of (the rare word BM25 finds,
    the one nearest turn); a large block shows hundreds and is best filled by what several
    searches agree on further down. One ``k`` for all sizes served one size: on locomo-dev,
    ``k`` 5-10 found the most evidence at 1k and 20-40 at 4k-8k (docs/benchmarks.md).

    >>> w = RetrievalWeights()
    >>> [round(fusion_k(w, r), 1) for r in (724, 1584, 3184, 6384, 100_000)]
    [5.1, 11.1, 22.3, 44.7, 60.0]
    >>> fusion_k(RetrievalWeights(rrf_k_per_thousand=0), 724)
    20.0
    """
    if configured.rrf_k_per_thousand <= 0:
        return configured.rrf_k
    sized = configured.rrf_k_per_thousand * max(0, related) / 1000
    return min(RRF_K_MAX, max(RRF_K_MIN, sized))


def author_candidates(per_thousand: int, related: int) -> int:
    """How many of each named author's nearest turns retrieval reads (the ``author_vector``
    list): ``per_thousand`` (the configured
    :attr:`~ctxwarden.retrieve.RetrievalWeights.author_candidates`) per 1,000 tokens of the
    related block, rounded up, at least ``per_thousand``. A person's own turns are what a
    question about them asks for, and a large block has room for more of them than a 1k one:
    with 20 at every budget, the evidence that block left out at 8k (issue 18) sat at a median
    rank of 63 of that list, behind its cut. The floor keeps the small blocks as they were.

    >>> author_candidates(20, 724), author_candidates(20, 1584), author_candidates(20, 6384)
    (20, 32, 128)
    """
    if per_thousand <= 0:
        return per_thousand
    return max(per_thousand, math.ceil(per_thousand * max(0, related) / 1000))


def _costs(plan: Plan) -> dict[int, int]:
    costs: dict[int, int] = {}
    for cands in plan.chosen.values():
        for cand in cands:
            share = cand.tokens // max(1, len(cand.memories))
            for memory in cand.memories:  # a summary's lines (Candidate.part) add up
                costs[memory.rowid] = costs.get(memory.rowid, 0) + share
    return costs


def _line(
    memory: Memory, cached: int, tok: tokens.Tokenizer, query: str = "", *, grouped: bool = False
) -> tuple[str, int]:
    """A memory's related-block line and its cost; the line is "" (made later, when the
    candidate is taken: :func:`_write_lines`) unless it is an aggregate's, whose volume note must
    be counted with it, or a summary's: only its lines that match the query
    (:func:`~ctxwarden.summary.summary_excerpt`): retrieval orders it by about what a kept
    fact's original cost. Its lines are then offered as candidates of their own
    (:func:`~ctxwarden.passages.summary_passages`), the excerpt if none of them is."""
    if memory.kind == "summary" and query and not is_untrusted(memory.metadata):
        # (an untrusted one is quoted whole on its line, as render shows any untrusted text)
        excerpt = summary_excerpt(memory.content, query)
        if excerpt is not None:
            text = excerpt + "\n"
            return text, tok.count(text)
    if memory.dup_count > 1:
        text = render.entry_text(memory) if grouped else render.line_text(memory)
        text = (
            text[:-1]
            + render.volume_note(
                memory.dup_count,
                memory.created_at,
                memory.last_seen_at,
                memory.latest_content,
                untrusted=is_untrusted(memory.metadata),
            )
            + "\n"
        )
        return text, tok.count(text)
    return "", cached


def _entry(
    memory: Memory, cached: int, tok: tokens.Tokenizer, query: str = ""
) -> tuple[str, int, str]:
    """A memory's related-block line, its cost and its group header: :func:`_line` with the
    line under the header (:func:`~ctxwarden.render.entry_text`). A summary is not grouped:
    its lines carry their own times."""
    group = render.group_header(memory)
    return (*_line(memory, cached, tok, query, grouped=bool(group)), group)


def _entries(
    counter: MemoryCounts, memories: Sequence[Memory], tok: tokens.Tokenizer
) -> list[Candidate]:
    """Related-block candidates of ``memories`` (a related hit's successor), each under its
    group header."""
    counts = counter.entries(memories, tok)
    out = []
    for memory in memories:
        text, cost, group = _entry(memory, counts[memory.rowid], tok)
        out.append(
            Candidate(
                memories=(memory,), tokens=cost, text=text or render.entry_text(memory), group=group
            )
        )
    return out


def _write_lines(policy: BudgetPolicy, plan: Plan) -> None:
    """Give the related candidates fill took their line text (:func:`_line` leaves it out: most
    candidates are never taken, and writing every line was ~2 % of an assembly)."""
    for block in policy.blocks:
        if block.source == "retrieval":
            for cand in plan.chosen[block.name]:
                if not cand.text:
                    cand.text = render.entry_text(cand.memories[0])


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
