"""Free-text change detection at ingest: the links a batch's messages make to what they change.

For each message a batch stores, :mod:`ctxwarden.validity` decides which earlier message of the
same place it supersedes (same tenant, session, channel and end user), among the last
:data:`CANDIDATES` messages of that place within ``EngineConfig.change_window`` seconds: the
last :data:`PRIOR_PAGE` messages the store held before the batch (one page read per place, only
for places where a message of the batch could change anything: one with a change cue, or a
value and a human author) and the batch's own earlier messages. The links are written in the
batch's transaction (:meth:`~ctxwarden.store.base.Writer.supersede`); neither side is changed
or folded.

Cost: one :meth:`~ctxwarden.store.base.Store.recent` page per place per batch, and per message
with a cue or a value a comparison with the earlier ones that share a subject term with it
(found through a term index of the place, not by comparing with every earlier message). A
message that can change nothing (:func:`~ctxwarden.validity.may_change`) is analysed only when
a message of its place can: where nothing changes, nothing is analysed or read.

At assembly, :func:`in_force` reads those links for the context's pins and related hits: the
newest successor takes a superseded hit's place, and the hit stays dated behind it, shown only
when no successor is chosen (or the question asks about history); a superseded pin leaves.
"""

from __future__ import annotations

import bisect
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from ctxwarden.assemble import Candidate, Material, keep_in_force
from ctxwarden.errors import NotFound
from ctxwarden.store.base import Store
from ctxwarden.types import Memory, Record
from ctxwarden.validity import Statement, analyse, asks_history, may_change, superseded

__all__ = ["CANDIDATES", "PRIOR_PAGE", "ChangeLinks", "in_force"]

#: How far back (in messages of the same place) a new one looks; it is compared only with
#: those that share a subject term with it (a term index, so the look-back costs little).
CANDIDATES = 400
#: How many earlier messages of a place a batch reads from the store (one page per place).
PRIOR_PAGE = 100
#: At most this many of the earlier messages sharing a term are compared (the newest).
_COMPARED = 24
#: Statements of stored messages kept between batches (by rowid), so the page of earlier
#: messages a batch reads is mostly analysed already (the previous batch's own messages).
_CACHE_SIZE = 4096

_Place = tuple[str, str, str | None, str | None]  # tenant, session, channel, end user
#: The statement of a message not analysed yet (:meth:`ChangeLinks.stored`).
_UNREAD = Statement(None, None, frozenset(), frozenset(), False, False, False)


@dataclass(slots=True)
class _Entry:
    statement: Statement
    created_at: float
    order: int
    rowid: int = -1
    id: str = ""


@dataclass(slots=True)
class ChangeLinks:
    """One batch's change detection: :meth:`read` before the write transaction,
    :meth:`stored` for each message written, :meth:`links` at the end."""

    store: Store
    window: float
    #: The engine's cache of analysed statements by rowid (shared by its batches).
    cache: OrderedDict[int, tuple[str, Statement]] = field(default_factory=OrderedDict)
    _batch: dict[_Place, list[_Entry]] = field(default_factory=dict)
    _pending: dict[int, tuple[_Place, float, str, str | None]] = field(default_factory=dict)
    _content: dict[int, str] = field(default_factory=dict)
    _changing: set[_Place] = field(default_factory=set)
    #: Rowids of the batch's messages not analysed yet, with their authors.
    _deferred: dict[int, str | None] = field(default_factory=dict)

    def read(self, records: Sequence[tuple[Record, float]]) -> None:
        """Note the batch's conversational messages (``(record, created_at)`` in batch
        order); they are analysed when stored (a folded duplicate never is)."""
        if self.window <= 0:
            return
        for order, (record, created_at) in enumerate(records):
            if _eligible(record):
                # A bot's series of values ("build 41 passed", "build 42 passed") is a stream
                # of events, not a changing fact: a bot changes something only with a cue.
                author = None if record.author_kind == "bot" else record.author
                place = (record.tenant, record.session, record.channel, record.user)
                self._pending[order] = (place, created_at, record.content, author)

    def stored(self, order: int, rowid: int, id: str) -> None:
        """The batch's message at ``order`` was stored at ``rowid`` with ``id``."""
        pending = self._pending.pop(order, None)
        if pending is None:
            return
        place, created_at, text, author = pending
        if place not in self._changing and not may_change(text, author=author):
            # It can change nothing: analysed only if a message of its place can (links).
            self._deferred[rowid] = author
            self._batch.setdefault(place, []).append(_Entry(_UNREAD, created_at, order, rowid, id))
            self._content[rowid] = text
            return
        statement = analyse(text, author=author)
        if statement.question:
            return
        self._batch.setdefault(place, []).append(_Entry(statement, created_at, order, rowid, id))
        self._content[rowid] = text
        if statement.cue or (statement.values and author is not None):
            self._changing.add(place)

    def _analysed(self, place: _Place) -> list[_Entry]:
        """The place's batch messages, each analysed (questions left out)."""
        entries = self._batch[place]
        deferred = self._deferred
        if not any(e.rowid in deferred for e in entries):
            return entries
        out = []
        for entry in entries:
            if entry.rowid in deferred:
                author = deferred.pop(entry.rowid)
                entry.statement = analyse(self._content[entry.rowid], author=author)
                if entry.statement.question:
                    continue
            out.append(entry)
        self._batch[place] = out
        return out

    def _prior(self, place: _Place, first: float) -> list[_Entry]:
        """The place's messages before ``first`` (committed before the batch), oldest first:
        one page, analysed from the cache where it can."""
        tenant, session, channel, user = place
        page = self.store.recent(
            tenant, session, channel=channel, before=(first, -1), limit=PRIOR_PAGE, user=user
        )
        prior = []
        for i, m in enumerate(page):
            if m.role not in ("user", "assistant") or m.tool_calls:
                continue
            if m.created_at < first - self.window:
                break  # newest first: the rest are older still
            cached = self.cache.get(m.rowid)
            if cached is None or cached[0] != m.content:  # an edit changes the text
                author = None if m.author_kind == "bot" else m.author
                cached = (m.content, analyse(m.content, author=author))
            prior.append(_Entry(cached[1], m.created_at, -1 - i, m.rowid, m.id))
        prior.reverse()
        return prior

    def remember(self) -> None:
        """Keep the batch's statements for the next batches (after the commit: a rolled-back
        batch's rowids may be reused)."""
        cache = self.cache
        for entries in self._batch.values():
            for entry in entries:
                if entry.statement is not _UNREAD:  # never analysed: its place changed nothing
                    cache[entry.rowid] = (self._content[entry.rowid], entry.statement)
        while len(cache) > _CACHE_SIZE:
            cache.popitem(last=False)

    def links(self) -> list[tuple[int, str, float]]:
        """``(superseded rowid, successor id, valid_until)`` for each change found."""
        out: list[tuple[int, str, float]] = []
        for place in sorted(self._changing, key=str):
            batch = self._analysed(place)
            prior = self._prior(place, min(e.created_at for e in batch))
            timeline = sorted([*prior, *batch], key=lambda e: (e.created_at, e.order))
            # What a later message changed already is not in force: never changed again (the
            # chain goes on from its successor). One read for the page's links.
            done = set(self.store.supersessions(place[0], [e.rowid for e in prior]))
            # Term -> positions in the timeline (ascending): a message is compared only with
            # the newest earlier ones that share a term with it (and its author's last, for a
            # retraction). A term more than a third of the place's messages hold is its
            # vocabulary ("deploy note 7: shard7 green" a hundred times), not a subject.
            postings: dict[str, list[int]] = {}
            for index, entry in enumerate(timeline):
                for term in entry.statement.terms:
                    if term in postings:
                        postings[term].append(index)
                    else:
                        postings[term] = [index]
            common = frozenset(
                t
                for t, js in postings.items()
                if len(timeline) >= 6 and len(js) * 3 > len(timeline)
            )
            last_of: dict[str | None, int] = {}
            times = [e.created_at for e in timeline]
            authors = [e.statement.author for e in timeline]
            rowids = [e.rowid for e in timeline]
            for index, entry in enumerate(timeline):
                new = entry.statement
                if entry.order >= 0 and (new.cue or (new.values and new.author is not None)):
                    near: set[int] = set()
                    for term in new.terms - common:
                        js = postings[term]
                        end = bisect.bisect_left(js, index)
                        near.update(js[max(0, end - _COMPARED) : end])  # one C call
                    own = last_of.get(new.author) if new.retracts else None
                    if own is not None:
                        near.add(own)
                    # The look-back: the last CANDIDATES messages within the window. The
                    # timeline is in time order, so both bounds are one position (and cutting
                    # the window before taking the newest few is the same as after).
                    since = bisect.bisect_left(times, entry.created_at - self.window)
                    low = max(index - CANDIDATES, since)
                    author = new.author
                    kept = [
                        j
                        for j in near
                        if j >= low
                        and (new.cue or authors[j] == author)  # else only its author's own
                        and rowids[j] not in done
                    ]
                    if kept:
                        kept.sort()
                        # The newest few that share a term: the value in force is the last stated.
                        earlier = [timeline[j] for j in kept[-_COMPARED:]]
                        statements = [e.statement for e in earlier]
                        found = superseded(new, statements, common=common)
                        if found is not None:
                            old = next(e for e in earlier if e.statement is found)
                            out.append((old.rowid, entry.id, entry.created_at))
                            done.add(old.rowid)
                if new.author is not None and new.values:
                    last_of[new.author] = index
        return out


def _eligible(record: Record) -> bool:
    """A conversational message: what people and agents say, not tool traffic or facts
    (a fact changes by its key)."""
    return (
        record.kind == "message"
        and record.role in ("user", "assistant")
        and not record.tool_calls
        and isinstance(record.content, str)
    )


#: At most this many successors of superseded related hits are read per assembly, each chain
#: followed at most :data:`_MAX_CHAIN` links.
_MAX_SUCCESSORS = 16
_MAX_CHAIN = 8


def in_force(
    store: Store,
    tenant: str,
    query: str | None,
    material: Material,
    candidates: Callable[[Sequence[Memory]], list[Candidate]],
) -> list[str]:
    """Leave superseded pins out, date superseded related hits (shown only when no successor
    is chosen, or for a query about history), and put each related hit's successor in its
    place (:func:`keep_in_force`); the notes for
    the report. One store read for the links; a successor not in the context already is read
    with its own links (a chain is followed to its newest). ``candidates`` makes related-block
    candidates of memories."""
    single = [c.memories[0] for c in (*material.pinned, *material.related)
              if len(c.memories) == 1]  # fmt: skip
    links = store.supersessions(tenant, [m.rowid for m in single]) if single else {}
    if not links:
        return []
    # Recent history is not counted as present: it is walked past what its block takes, so a
    # successor there may not be in the context; put in related, fill skips it if recent has it.
    present = {m.id for c in (*material.pinned, *material.related)
               for m in c.memories}  # fmt: skip
    wanted = sorted(
        {
            links[c.memories[0].rowid][0]
            for c in material.related
            if len(c.memories) == 1
            and c.memories[0].rowid in links
            and c.memories[0].kind == "message"
        }
        - present
    )
    successors: dict[str, Candidate] = {}
    for successor_id in wanted[:_MAX_SUCCESSORS]:
        newest = _newest(store, tenant, successor_id)
        if newest is not None:
            successors[successor_id] = candidates([newest])[0]
        else:  # the successor was erased: what it changed is in force again
            links = {r: link for r, link in links.items() if link[0] != successor_id}
    history = query is not None and asks_history(query)
    return keep_in_force(material, links, successors, history=history)


def _newest(store: Store, tenant: str, id: str) -> Memory | None:
    """The memory ``id`` names, or the newest of the chain of successors it starts."""
    try:
        memory = store.get(tenant, id)
    except NotFound:
        return None
    for _ in range(_MAX_CHAIN):
        link = store.supersessions(tenant, [memory.rowid]).get(memory.rowid)
        if link is None:
            break
        try:
            memory = store.get(tenant, link[0])
        except NotFound:
            break
    return memory
