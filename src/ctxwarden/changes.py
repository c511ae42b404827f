"""Free-text change detection at ingest: the links a batch's messages make to what they change.

For each message a batch stores, :mod:`ctxwarden.validity` decides which earlier message of the
same place it supersedes (same tenant, session, channel and end user), among the last
:data:`CANDIDATES` messages of that place within ``EngineConfig.change_window`` seconds: the
messages the store held before the batch (one page read per place, only for places where a
message of the batch could change anything: one with a change cue or a value) and the batch's
own earlier messages. The links are written in the batch's transaction
(:meth:`~ctxwarden.store.base.Writer.supersede`); neither side is changed or folded.

Cost: one :meth:`~ctxwarden.store.base.Store.recent` page per place per batch, and per message
with a cue or a value a comparison of term sets with at most :data:`CANDIDATES` others.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

from ctxwarden.store.base import Store
from ctxwarden.types import Record
from ctxwarden.validity import Statement, analyse, common_terms, superseded

__all__ = ["CANDIDATES", "ChangeLinks"]

#: How many earlier messages of the same place a new one is compared with.
CANDIDATES = 64
#: Statements of stored messages kept between batches (by rowid), so the page of earlier
#: messages a batch reads is mostly analysed already (the previous batch's own messages).
_CACHE_SIZE = 4096

_Place = tuple[str, str, str | None, str | None]  # tenant, session, channel, end user


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
    _prior: dict[_Place, list[_Entry]] = field(default_factory=dict)
    _pending: dict[int, tuple[_Place, _Entry]] = field(default_factory=dict)
    _texts: dict[int, str] = field(default_factory=dict)
    _content: dict[int, str] = field(default_factory=dict)

    def read(self, records: Sequence[tuple[Record, float]]) -> None:
        """Analyse the batch's messages (``(record, created_at)`` in batch order) and read
        the earlier messages of each place where one of them may change something."""
        if self.window <= 0:
            return
        earliest: dict[_Place, float] = {}
        for order, (record, created_at) in enumerate(records):
            if not _eligible(record):
                continue
            # A bot's series of values ("build 41 passed", "build 42 passed") is a stream of
            # events, not a changing fact: a bot changes something only with a change cue.
            author = None if record.author_kind == "bot" else record.author
            statement = analyse(record.content, author=author)
            if statement.question:
                continue
            place = (record.tenant, record.session, record.channel, record.user)
            entry = _Entry(statement=statement, created_at=created_at, order=order)
            self._pending[order] = (place, entry)
            self._texts[order] = record.content
            if statement.cue or (statement.values and author is not None):
                earliest[place] = min(created_at, earliest.get(place, created_at))
        for place, first in earliest.items():
            tenant, session, channel, user = place
            page = self.store.recent(
                tenant, session, channel=channel, before=(first, -1), limit=CANDIDATES, user=user
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
                statement = cached[1]
                prior.append(_Entry(statement, m.created_at, -1 - i, m.rowid, m.id))
            prior.reverse()  # oldest first
            self._prior[place] = prior

    def stored(self, order: int, rowid: int, id: str) -> None:
        """The batch's message at ``order`` was stored at ``rowid`` with ``id``."""
        pending = self._pending.pop(order, None)
        if pending is None:
            return
        place, entry = pending
        entry.rowid, entry.id = rowid, id
        self._batch.setdefault(place, []).append(entry)
        self._content[rowid] = self._texts.pop(order)

    def remember(self) -> None:
        """Keep the batch's statements for the next batches (after the commit: a rolled-back
        batch's rowids may be reused)."""
        cache = self.cache
        for entries in self._batch.values():
            for entry in entries:
                cache[entry.rowid] = (self._content[entry.rowid], entry.statement)
        while len(cache) > _CACHE_SIZE:
            cache.popitem(last=False)

    def links(self) -> list[tuple[int, str, float]]:
        """``(superseded rowid, successor id, valid_until)`` for each change found."""
        out: list[tuple[int, str, float]] = []
        for place, prior in self._prior.items():
            batch = self._batch.get(place, [])
            timeline = sorted([*prior, *batch], key=lambda e: (e.created_at, e.order))
            # The place's vocabulary, once per batch (not per message: a batch of one place
            # would count it a thousand times).
            common = common_terms([e.statement for e in timeline])
            for index, entry in enumerate(timeline):
                new = entry.statement
                if entry.order < 0 or not (new.cue or (new.values and new.author is not None)):
                    continue
                earlier = [
                    e
                    for e in timeline[max(0, index - CANDIDATES) : index]
                    if e.created_at >= entry.created_at - self.window
                ]
                if not earlier:
                    continue
                statements = [e.statement for e in earlier]
                found = superseded(new, statements, common=common)
                if found is not None:
                    old = next(e for e in earlier if e.statement is found)
                    out.append((old.rowid, entry.id, entry.created_at))
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
