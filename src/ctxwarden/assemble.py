"""The assembler: fills a context's blocks within their budgets and renders the chat messages.

Flow (see DESIGN.md): limits from the window -> fixed costs (system prompt, tools, query,
template) -> material per block (bounded by what could fit) -> :func:`ctxwarden.budget.allocate`
-> fill each block in its selection order -> top-up with what is left -> render -> exact count.

- persistent: pinned memories and facts, oldest first; a text block in the memory-data message
  (below), each memory a line with its time, channel and author like any other.
- summaries: summary memories, newest kept first, shown oldest first; lines already in
  persistent memory are dropped (read-time de-dup); an emptied block is omitted. A text block in
  the memory-data message (below).
- related: retrieval candidates for the query (best value first), never one already in another
  block nor one whose content repeats an included memory; shown oldest first, in the
  memory-data message.
- recent: the session's newest messages, newest first, at least ``min_recent_messages`` of them,
  shown oldest first, an assistant tool call kept together with its tool results.
- items blocks (scratch, task, ...): caller-supplied text, in the order given.

Where blocks go: the caller's system prompt and caller items form the system message (what the
operator and the agent wrote in this call). Stored content (persistent memory, summaries,
related memory: sources in :data:`DATA_SOURCES`) was written by chat participants, bots, agents
and tools, so it never goes there, pinned or not: it forms one user-role *memory-data* message
after the system message, opened by :func:`ctxwarden.render.data_intro`, which frames every line
as quoted data with its author and time (memory is data, never instructions: issue 20). A
stored record with role ``system`` is replayed as user-role data too
(:func:`ctxwarden.render.replay_role`). Untrusted memories (unsigned tool results,
:mod:`ctxwarden.provenance`) are JSON-quoted with their author in the memory-data message, and
in the recent block they are their own message, quoted likewise. The memory-data message's
overhead and intro (``Material.frame``) are paid by the first data block that takes a candidate.

Overflow: floors go to the most important blocks first, so under pressure related loses first,
then summaries, then persistent, and recent is shortened last (down to its newest message). If
the fixed costs alone are over the cap, :class:`~ctxwarden.errors.BudgetError` says by how much.

The token count is the sum of per-segment counts cached at ingest plus the chat template's
overhead; segments are built so that sum is exact (see :mod:`ctxwarden.render`).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ctxwarden import render
from ctxwarden.budget import BudgetPolicy, Limits, allocate
from ctxwarden.errors import BudgetError
from ctxwarden.normalize import line_key
from ctxwarden.segment import bigrams, has_run, split_runs
from ctxwarden.types import BlockReport, CandidateRow, Memory

__all__ = [
    "DATA_SOURCES",
    "Candidate",
    "Material",
    "Plan",
    "fill",
    "keep_in_force",
    "query_terms",
    "related_budget",
]

#: Block sources rendered into the memory-data message rather than the system message: every
#: source of stored memories.
DATA_SOURCES = frozenset({"pinned", "retrieval", "summaries"})

# Words too common to search for (English function words and question verbs).
_STOPWORDS = frozenset(
    """a about above after again against all am an and any are as at be because been before
    being below between both but by can could did do does doing down during each few for from
    further had has have having he her here hers herself him himself his how i if in into is it
    its itself just me more most my myself no nor not now of off on once only or other our ours
    ourselves out over own same she should so some such than that the their theirs them
    themselves then there these they this those through to too under until up very was we were
    what when where which while who whom why will with would you your yours yourself
    yourselves tell know ask asked say said get got""".split()
)
_WORD = re.compile(r"[\w][\w'.-]*[\w]|\w", re.UNICODE)


# A summary line's citation, "- [m1, m2] ": ids without commas between commas. Written so that
# every character has one way to match (no optional bullet between two ``\s*``, no comma in
# both the first id and the separator): linear in the line, where backtracking was quadratic.
_CITED = re.compile(r"^\s*(?:[-*•]\s*)?\[[^\[\]\s,]+(?:,\s*[^\[\]\s,]+)*\]\s*")
# The time an extractive line carries after its citation: "10:30 " or "03-14 10:30 ".
_STAMP = re.compile(r"^(?:\d\d-\d\d )?\d\d:\d\d ")


def _summary_line_keys(line: str) -> set[str]:
    """Keys under which a summary line may repeat a persistent memory: the line itself, and
    its text without the ``- [id]`` citation, the time and the ``author: `` prefix.

    >>> sorted(_summary_line_keys("- [m1] ana: standup is at 10:30"))
    ['[m1] ana: standup is at 10:30', 'ana: standup is at 10:30', 'standup is at 10:30']
    >>> sorted(_summary_line_keys("- [m1] 09:12 ana: standup is at 10:30"))[-1]
    'standup is at 10:30'
    """
    keys = {line_key(line)}
    body = _STAMP.sub("", _CITED.sub("", line, count=1), count=1)
    if body != line:
        keys.add(line_key(body))
        head, sep, rest = body.partition(": ")
        if sep and head and " " not in head.strip():
            keys.add(line_key(rest))
    return keys


def query_terms(query: str, *, limit: int = 12) -> list[str]:
    """The search terms of a query: words without stopwords, de-duplicated, in order.

    A run of a script written without spaces (Chinese, Japanese, Thai, ...) gives the
    character bigrams the index holds for it (:mod:`ctxwarden.segment`), up to
    ``BIGRAMS_PER_WORD`` times ``limit`` of them beside the ``limit`` words: a sentence of
    such text is one run of many bigrams, and the store keeps the rarest of the terms it is
    given (``choose_terms``), so cutting them at ``limit`` would keep only the run's first
    characters.

    >>> query_terms("What laptop does omar use for work?")
    ['laptop', 'omar', 'use', 'work']
    >>> query_terms("来週の会議はどこ? room B")
    ['来週', '週の', 'の会', '会議', '議は', 'room']

    Bigrams of hiragana alone are left out when the query has others (:func:`_kana_only`).
    """
    if not query.isascii() and has_run(query):
        return _terms_with_runs(query, limit)
    seen: dict[str, None] = {}
    for match in _WORD.finditer(query.casefold()):
        word = match.group().strip("'.-")
        if len(word) < 2 and not word.isdigit():
            continue
        if word in _STOPWORDS or word in seen:
            continue
        seen[word] = None
        if len(seen) >= limit:
            break
    return list(seen)


#: Bigrams a query may search per word it may (see :func:`query_terms`): a Japanese or Chinese
#: word is about two characters, so a sentence has about as many bigrams as characters, two
#: to three times its words; four leaves room for the bigrams that span word boundaries.
BIGRAMS_PER_WORD = 4


def _terms_with_runs(query: str, limit: int) -> list[str]:
    """:func:`query_terms` of a query holding runs: the words between runs as there, each
    run's bigrams in its place, each kind within its own bound."""
    seen: dict[str, None] = {}
    words = grams = 0
    for piece, is_run in split_runs(query.casefold()):
        if is_run:
            for gram in bigrams(piece):
                if grams < BIGRAMS_PER_WORD * limit and gram not in seen:
                    seen[gram] = None
                    grams += 1
            continue
        for match in _WORD.finditer(piece):
            word = match.group().strip("'.-")
            if (len(word) < 2 and not word.isdigit()) or word in _STOPWORDS or word in seen:
                continue
            if words < limit:
                seen[word] = None
                words += 1
    if any(not _kana_only(t) for t in seen if has_run(t)):
        return [t for t in seen if not _kana_only(t)]
    return list(seen)


def _kana_only(term: str) -> bool:
    """A bigram of hiragana alone: in Japanese, hiragana writes the grammar (particles,
    inflections, auxiliaries: ``について``, ``ました``) and ideographs or katakana the words, so
    such a bigram is what an English stopword is to a query that has other terms (a query of
    only hiragana still searches them). The index keeps them all."""
    return all("\u3041" <= char <= "\u309f" for char in term)


@dataclass(slots=True)
class Candidate:
    """One memory (or a tool-call group) offered to a block, with its token cost."""

    memories: tuple[Memory, ...]
    tokens: int
    score: float = 0.0
    components: dict[str, float] = field(default_factory=dict)
    text: str = ""
    #: A superseded memory kept for when its successor is not chosen (issue 19): the rowids
    #: of what follows it (any one taken leaves it out), the successor's id and the day it
    #: was superseded. Its text is dated; :func:`fill` decides.
    superseded: tuple[frozenset[int], str, str] | None = None
    #: The related block's group header this line goes under (its day and channel:
    #: :func:`~ctxwarden.render.group_header`; its text is then
    #: :func:`~ctxwarden.render.entry_text`), or "" for a line of its own. The first line of a
    #: group :func:`fill` takes pays for the header.
    group: str = ""
    #: One line of a summary shown as a passage of its own (:mod:`ctxwarden.passages`): the
    #: line's position in the summary's text plus one (0: the candidate is a whole memory).
    #: Fill takes several parts of one memory in one block, each once; they render in order.
    part: int = 0
    #: A retrieval neighbour's anchor (:attr:`ctxwarden.retrieve.Hit.anchor`: the rowid of the
    #: hit it is context for), -1 for none: :func:`fill` takes it only once its anchor is in
    #: the context, since a question without its answer (or the turn after a hit without the
    #: hit) tells the model nothing.
    anchor: int = -1

    @property
    def ids(self) -> tuple[str, ...]:
        return tuple(m.id for m in self.memories)

    @property
    def rowids(self) -> tuple[int, ...]:
        return tuple(m.rowid for m in self.memories)


@dataclass(slots=True)
class Material:
    """What the engine fetched for one assembly, per block, bounded by what could fit.

    ``recent`` is newest first (tool-call groups already joined); ``related`` best first;
    ``pinned`` and ``summaries`` oldest first; ``items`` per items-block name.
    ``count`` counts a text segment with the model's tokenizer (for headers and notes).
    ``frame`` is what the memory-data message costs before its blocks (message overhead and
    intro): paid once, by the first block of a source in :data:`DATA_SOURCES` that takes a
    candidate.
    """

    count: Callable[[str], int]
    frame: int = 0
    recent: list[Candidate] = field(default_factory=list)
    related: list[Candidate] = field(default_factory=list)
    pinned: list[Candidate] = field(default_factory=list)
    summaries: list[Candidate] = field(default_factory=list)
    items: dict[str, list[Candidate]] = field(default_factory=dict)
    #: Candidates left out before filling, as (block source, candidate, reason): superseded
    #: facts and pins (issue 19), reported in the first block of that source.
    withheld: list[tuple[str, Candidate, str]] = field(default_factory=list)


@dataclass(slots=True)
class Plan:
    """The outcome of filling: chosen candidates per block and the account of every decision."""

    chosen: dict[str, list[Candidate]]
    budgets: dict[str, int]
    used: dict[str, int]
    candidates: list[CandidateRow]
    notes: list[str]


def _source_of(policy: BudgetPolicy, material: Material, name: str) -> list[Candidate]:
    block = policy.block(name)
    assert block is not None
    if block.source == "recent":
        return material.recent
    if block.source == "retrieval":
        return material.related
    if block.source == "pinned":
        return material.pinned
    if block.source == "summaries":
        return material.summaries
    return material.items.get(name, [])


def related_budget(policy: BudgetPolicy, material: Material, available: int) -> int:
    """The tokens the policy's retrieval blocks would get if retrieval found more than fits:
    :func:`~ctxwarden.budget.allocate` over ``available`` with every other block's material
    (read before retrieval) as its demand. Retrieval sizes its pool and its neighbour
    expansion from it, so a larger related block is filled with the next-best hits.

    >>> from ctxwarden.budget import chat_policy
    >>> related_budget(chat_policy(), Material(count=len), 1000)
    1000
    """
    demand = {
        b.name: available
        if b.source == "retrieval"
        else sum(c.tokens for c in _source_of(policy, material, b.name))
        for b in policy.blocks
    }
    alloc = allocate(policy, available=available, demand=demand)
    return sum(alloc[b.name] for b in policy.blocks if b.source == "retrieval")


def keep_in_force(
    material: Material,
    links: Mapping[int, tuple[str, float]],
    successors: Mapping[str, Candidate],
    *,
    history: bool,
) -> list[str]:
    """What is in force wins (issue 19): of the pinned and related candidates, those ``links``
    marks superseded (rowid -> successor's id, valid_until) give way to what follows them.

    A superseded pin is left out when its successor is in the context (its reason in the
    report), and kept dated (as below) when it is not. A superseded related hit's
    successor takes its place in the related order: moved up when it is there lower, put in
    from ``successors`` (the newest memory of the chain, by the successor id) when it is not
    in the context at all; the hit itself stays right behind it, dated ("(superseded on
    DATE)") and marked (:attr:`Candidate.superseded`), so :func:`fill` leaves it out when a
    successor is chosen and shows it, dated, when none is (no budget, another block): what
    retrieval found is never dropped only for being superseded, and never shown as current.
    When the query asks for ``history``, superseded hits stay in place, dated. Returns the
    notes for the report. Pure: reads only its arguments, changes ``material``.
    """
    notes: list[str] = []
    present = {m.id for c in (*material.pinned, *material.related)
               for m in c.memories}  # fmt: skip
    rowid_of = {m.id: m.rowid for c in (*material.pinned, *material.related)
                for m in c.memories}  # fmt: skip
    rowid_of.update({i: c.memories[0].rowid for i, c in successors.items()})
    by_rowid = {rowid: successor for rowid, (successor, _) in links.items()}

    def following(successor_id: str) -> frozenset[int]:
        """The rowids of the chain from ``successor_id`` on, as far as the context knows it."""
        out: set[int] = set()
        at: str | None = successor_id
        while at is not None and at in rowid_of and rowid_of[at] not in out:
            out.add(rowid_of[at])
            at = by_rowid.get(rowid_of[at])
        newest = successors.get(successor_id)
        if newest is not None:
            out.add(newest.memories[0].rowid)
        return frozenset(out)

    for source, kept in (("pinned", material.pinned), ("retrieval", material.related)):
        still: list[Candidate] = []
        placed: set[str] = set()
        for cand in kept:
            memory = cand.memories[0]
            link = links.get(memory.rowid) if len(cand.memories) == 1 else None
            if memory.id in placed:
                continue  # already moved up to the place of one it superseded
            if link is None:
                still.append(cand)
                continue
            successor_id, until = link
            day = time.strftime("%Y-%m-%d", time.gmtime(until))
            newest = successors.get(successor_id)
            if source == "retrieval":
                later = next(
                    (c for c in kept if c.memories[0].id == successor_id and c is not cand), None
                )
                if later is not None and later.memories[0].rowid in links:
                    later = None  # superseded too: its own successor moves up in its turn
                if later is not None and successor_id not in placed:
                    if later.score < cand.score:
                        later.score = cand.score
                    if all(c is not later for c in still):
                        still.append(later)
                    placed.add(successor_id)
                elif newest is not None and newest.memories[0].id not in present:
                    newest.score = cand.score
                    still.append(newest)
                    present.add(newest.memories[0].id)
                    placed.add(newest.memories[0].id)
                    notes.append(
                        f"related: {newest.memories[0].id} (in force) put in place of "
                        f"{memory.id}, superseded on {day}"
                    )
            if history or source == "retrieval" or successor_id not in present:
                text = (cand.text or _line_of(cand)).rstrip("\n")
                cand.text = f"{text} (superseded on {day})\n"
                cand.tokens = material.count(cand.text)
                still.append(cand)
                if history:
                    notes.append(
                        f"{memory.id}: shown as history, superseded by {successor_id} on {day} "
                        "(the query asks what was in force before)"
                    )
                else:
                    cand.superseded = (following(successor_id), successor_id, day)
                continue
            where = " (in this context)" if successor_id in present else ""
            material.withheld.append(
                (source, cand, f"superseded by {successor_id}{where} on {day}")
            )
        kept[:] = _behind_successors(still)
    return notes


def _line_of(cand: Candidate) -> str:
    """A one-memory candidate's line: under its group header, or with its day and channel."""
    memory = cand.memories[0]
    return render.entry_text(memory) if cand.group else render.line_text(memory)


def _behind_successors(cands: list[Candidate]) -> list[Candidate]:
    """``cands`` with each superseded one moved right behind the last of its successors
    there (a chain's oldest behind its newest), so fill decides on it after them."""
    out = [c for c in cands if c.superseded is None]
    for cand in (c for c in cands if c.superseded is not None):
        assert cand.superseded is not None
        after = cand.superseded[0]
        positions = [i for i, c in enumerate(out) if c.memories[0].rowid in after]
        out.insert(positions[-1] + 1 if positions else len(out), cand)
    return out


def _header_cost(policy: BudgetPolicy, material: Material, name: str) -> int:
    block = policy.block(name)
    assert block is not None
    if block.source == "recent":
        return 0
    return material.count(render.block_header(block.title or block.name))


def fill(policy: BudgetPolicy, limits: Limits, *, fixed: int, material: Material) -> Plan:
    """Choose what goes in each block. Pure: reads only ``material``.

    ``fixed`` is the cost of what is always sent (system prompt, tools, query, template).
    """
    available = limits.cap - fixed
    if available < 0:
        raise BudgetError(
            f"budget: the system prompt, tools and query take {fixed} tokens, over the cap of "
            f"{limits.cap} (window {limits.window}, reserve {limits.reserve}, margin "
            f"{limits.margin}); shorten them or raise the budget"
        )
    names = [b.name for b in policy.blocks]
    reports: list[CandidateRow] = []
    notes: list[str] = []
    for kind, withheld, reason in material.withheld:
        into = next((b.name for b in policy.blocks if b.source == kind), kind)
        reports.append(_report(withheld, into, False, reason))

    # Read-time de-dup of summaries against persistent memory, line by line.
    persistent_keys = {
        line_key(m.content)
        for block in policy.blocks
        if block.source == "pinned"
        for c in _source_of(policy, material, block.name)
        for m in c.memories
    }
    if persistent_keys:
        kept = []
        for cand in material.summaries:
            lines = [ln for ln in cand.text.splitlines() if ln.strip()]
            remaining = [ln for ln in lines if not _summary_line_keys(ln) & persistent_keys]
            if len(remaining) == len(lines):
                kept.append(cand)
                continue
            dropped = len(lines) - len(remaining)
            if not remaining:
                reports.append(
                    _report(cand, "summaries", False, "every line already in persistent")
                )
                continue
            text = "\n".join(remaining) + "\n"
            kept.append(
                Candidate(
                    memories=cand.memories,
                    tokens=material.count(text),
                    score=cand.score,
                    text=text,
                )
            )
            notes.append(f"summary {cand.ids[0]}: {dropped} line(s) already in persistent dropped")
        material.summaries = kept

    headers: dict[str, int] = {}  # each block's header cost, counted once (not at every take)

    def header_cost(name: str) -> int:
        if name not in headers:
            headers[name] = _header_cost(policy, material, name)
        return headers[name]

    demand = {}
    for name in names:
        source = _source_of(policy, material, name)
        total = sum(c.tokens for c in source)
        data = any(b.name == name and b.source in DATA_SOURCES for b in policy.blocks)
        frame = material.frame if data else 0
        demand[name] = total + (header_cost(name) + frame if total else 0)
    budgets = allocate(policy, available=available, demand=demand)

    chosen: dict[str, list[Candidate]] = {name: [] for name in names}
    used = dict.fromkeys(names, 0)
    taken_rows: set[int] = set()
    taken_hashes: set[str] = set()
    part_rows: dict[int, str] = {}  # the block that took lines of a summary (Candidate.part)
    # Per block, the source indices not decided yet, in source order: a pass walks only these
    # (the top-up pass offers again what the first one skipped).
    pending: dict[str, list[int]] = {
        name: list(range(len(_source_of(policy, material, name)))) for name in names
    }
    data_started = False  # some data block took a candidate: the memory-data frame is paid
    opened: dict[str, set[str]] = {name: set() for name in names}  # group headers paid, by block
    group_costs: dict[str, int] = {}

    def take(name: str, limit: int, *, top_up: bool) -> None:
        nonlocal data_started
        block = policy.block(name)
        assert block is not None
        source = _source_of(policy, material, name)
        header = header_cost(name)
        is_data = block.source in DATA_SOURCES
        is_recent = block.source == "recent"
        min_units = policy.min_recent_messages if is_recent else 0
        why_fits = "top-up with tokens other blocks left" if top_up else "fits"
        taken = chosen[name]
        left: list[int] = []
        indices = pending[name]
        for position, index in enumerate(indices):
            cand = source[index]
            memories = cand.memories
            part = cand.part
            if part:  # a line of a summary: other lines of it in this block are no repeat
                owner = part_rows.get(memories[0].rowid)
                if owner != name and (owner is not None or memories[0].rowid in taken_rows):
                    reports.append(_report(cand, name, False, "already in another block"))
                    continue
            elif (
                memories[0].rowid in taken_rows
                if len(memories) == 1
                else any(m.rowid in taken_rows for m in memories)
            ):
                reports.append(_report(cand, name, False, "already in another block"))
                continue
            if cand.anchor >= 0 and cand.anchor not in taken_rows:
                left.append(index)  # its anchor may still come (the top-up), else reported
                continue
            if cand.superseded is not None and not cand.superseded[0].isdisjoint(taken_rows):
                _, successor, day = cand.superseded
                reason = f"superseded by {successor} (in this context) on {day}"
                reports.append(_report(cand, name, False, reason))
                continue
            if (
                not is_recent
                and not part
                and (
                    memories[0].content_hash in taken_hashes
                    if len(memories) == 1
                    else any(m.content_hash in taken_hashes for m in memories)
                )
            ):
                reports.append(_report(cand, name, False, "repeats content already included"))
                continue
            cost = cand.tokens + (header if not taken else 0)
            if is_data and not data_started:
                cost += material.frame
            group = cand.group
            opens = 0  # the group header this line is the first to need
            if group and group not in opened[name]:
                opens = group_costs.get(group, -1)
                if opens < 0:
                    opens = group_costs[group] = material.count(group)
                cost += opens
            forced = len(taken) < min_units
            if used[name] + cost > limit and not (
                forced and sum(used.values()) + cost <= available
            ):
                if is_recent:
                    # Recent is contiguous: stop at the first unit that does not fit.
                    left.extend(indices[position:])
                    break
                # Skip it: a smaller, lower-scoring one may still fit.
                left.append(index)
                continue
            taken.append(cand)
            used[name] += cost
            if opens:
                opened[name].add(group)
                cand.tokens += opens  # the header is reported with the line that opened it
            if is_data:
                data_started = True
            taken_rows.update(m.rowid for m in memories)
            if part:
                part_rows[memories[0].rowid] = name
            taken_hashes.update(m.content_hash for m in memories)
            why = "minimum recent messages" if forced and used[name] > limit else why_fits
            if cand.superseded is not None:
                _, successor, day = cand.superseded
                why += f", dated: superseded by {successor} on {day}, which is not in this context"
            reports.append(_report(cand, name, True, why))
        pending[name] = left

    order = sorted(policy.blocks, key=lambda b: (-b.priority, names.index(b.name)))
    for block in order:
        take(block.name, budgets[block.name], top_up=False)
    # Top-up: what blocks left unused is offered again, retrieval blocks first (the related
    # block's leftover becomes recent history only when retrieval has nothing left that fits),
    # then the others, most important first.
    for block in sorted(order, key=lambda b: b.source != "retrieval"):
        spare = available - sum(used.values())
        if spare <= 0:
            break
        take(block.name, used[block.name] + spare, top_up=True)
    for name in names:
        source = _source_of(policy, material, name)
        spec = policy.block(name)
        assert spec is not None
        left_out = pending[name]
        why = (
            "older than the block's budget reaches"
            if spec.source == "recent"
            else "over the block's budget"
        )
        for i in left_out:
            cand = source[i]
            alone = cand.anchor >= 0 and cand.anchor not in taken_rows
            reports.append(_report(cand, name, False, _ALONE if alone else why))
        if left_out and not chosen[name]:
            notes.append(f"{name}: no room for any of {len(left_out)} candidate(s) (overflow)")
    return Plan(chosen=chosen, budgets=budgets, used=used, candidates=reports, notes=notes)


#: Why a retrieval neighbour was left out when its anchor was (:attr:`Candidate.anchor`).
_ALONE = "neighbour of a hit that is not in this context"


def _report(cand: Candidate, block: str, included: bool, reason: str) -> CandidateRow:
    memories = cand.memories
    return (
        memories[0].id if len(memories) == 1 else ",".join(m.id for m in memories),
        block,
        included,
        reason,
        cand.tokens,
        cand.score if cand.components or cand.score else None,
        cand.components,
    )


def block_reports(policy: BudgetPolicy, plan: Plan) -> tuple[BlockReport, ...]:
    """One :class:`BlockReport` per block of the policy."""
    return tuple(
        BlockReport(
            name=b.name,
            budget=plan.budgets[b.name],
            used=plan.used[b.name],
            items=tuple(i for c in plan.chosen[b.name] for i in c.ids),
        )
        for b in policy.blocks
    )


def text_segments(
    policy: BudgetPolicy, plan: Plan, *, data: bool
) -> tuple[list[str], list[tuple[str, Memory]]]:
    """The segments (block headers and candidate texts) of the system message's blocks
    (``data`` false) or of the memory-data message's (``data`` true), in rendered order, and
    the memories they hold."""
    parts: list[str] = []
    held: list[tuple[str, Memory]] = []
    lines_of: set[int] = set()  # summaries some of whose lines are held
    for block in policy.blocks:
        if block.source == "recent" or not plan.chosen[block.name]:
            continue
        if (block.source in DATA_SOURCES) != data:
            continue
        parts.append(render.block_header(block.title or block.name))
        cands = plan.chosen[block.name]
        if block.source in DATA_SOURCES:
            cands = sorted(
                cands, key=lambda c: (c.memories[0].created_at, c.memories[0].rowid, c.part)
            )
        for header, unit in _grouped(cands):
            if header:
                parts.append(header)
            for cand in unit:
                parts.append(cand.text)
                if cand.part:  # a summary's line: the summary is held once
                    if cand.memories[0].rowid in lines_of:
                        continue
                    lines_of.add(cand.memories[0].rowid)
                held.extend((block.name, m) for m in cand.memories)
    return parts, held


def _grouped(cands: Sequence[Candidate]) -> list[tuple[str, list[Candidate]]]:
    """``cands`` (in order) as units under one group header each: the lines of a group
    (:attr:`Candidate.group`) together, where its first line is; a line without a group is a
    unit of its own (header "")."""
    units: list[tuple[str, list[Candidate]]] = []
    at: dict[str, list[Candidate]] = {}
    for cand in cands:
        group = cand.group
        if not group:
            units.append(("", [cand]))
        elif group in at:
            at[group].append(cand)
        else:
            at[group] = [cand]
            units.append((group, at[group]))
    return units


def system_message_text(
    policy: BudgetPolicy, plan: Plan, system: str | None
) -> tuple[str | None, list[tuple[str, Memory]]]:
    """The system message (prompt plus persistent and items blocks) and the memories it holds,
    in order. Retrieved blocks are not in it: see :func:`data_message_text`."""
    parts, held = text_segments(policy, plan, data=False)
    if not parts:
        return system, held
    prefix = render.system_prefix(system) if system else ""
    return prefix + "".join(parts), held


def data_message_text(
    policy: BudgetPolicy, plan: Plan
) -> tuple[str | None, list[tuple[str, Memory]]]:
    """The memory-data message (intro plus summaries and related blocks) and the memories it
    holds, in order; None when no data block took anything."""
    parts, held = text_segments(policy, plan, data=True)
    if not parts:
        return None, held
    return render.data_intro() + "".join(parts), held


def recent_messages(plan: Plan, policy: BudgetPolicy) -> list[tuple[str, Candidate]]:
    """Recent-type blocks' candidates in chronological order."""
    out: list[tuple[str, Candidate]] = []
    for block in policy.blocks:
        if block.source == "recent":
            out.extend((block.name, c) for c in reversed(plan.chosen[block.name]))
    return out


def memory_message(memory: Memory, text: str) -> dict[str, Any]:
    """A stored memory as an OpenAI-style chat message (a stored ``system`` record as
    user-role data: :func:`ctxwarden.render.replay_role`)."""
    message: dict[str, Any] = {"role": render.replay_role(memory.role), "content": text}
    if memory.name:
        message["name"] = memory.name
    if memory.tool_calls:
        message["tool_calls"] = [dict(c) for c in memory.tool_calls]
        if not text:
            message["content"] = None
    if memory.tool_call_id:
        message["tool_call_id"] = memory.tool_call_id
    return message
