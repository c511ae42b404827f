"""Folding one ingest batch: the aggregates it may touch, held in memory while the batch is decided.

Pure and synchronous (the functional core of ingest's de-dup): the engine prefetches, in a few
indexed queries, every stored message that shares a layer-A or layer-B key with a record of the
batch (:class:`~ctxwarden.store.base.FoldTarget`), hands them to a :class:`FoldIndex`, and asks it
record by record (oldest first as given) whether the record folds and into which aggregate.
Stored records join the index at once, so later records of the same batch see them. At the end
the engine writes what changed (:meth:`FoldIndex.changed`) in one statement per table.

The decisions are :func:`~ctxwarden.dedupe.may_fold`'s; this module only reproduces the store's
lookups (newest sighting first, within the TTL or window) over the batch's own state.

>>> from ctxwarden.dedupe import DedupeCandidate, DedupeConfig
>>> index = FoldIndex(DedupeConfig(), cache={})
>>> def bot(text, at):
...     return DedupeCandidate.build(author="deploybot", author_kind="bot", content=text,
...                                  created_at=at)
>>> first = bot("Deploy #1 ok at 10:00", 0.0)
>>> index.add(Aggregate.new(rowid=1, id="m1", tenant="t", session="s", channel="ops",
...                         content="Deploy #1 ok at 10:00", candidate=first))
>>> hit = index.find(bot("Deploy #2 ok at 10:05", 300.0), tenant="t", session="s", channel="ops")
>>> hit[0].id, hit[1].reason
('m1', 'bot-volatile: <counter> <time>')
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from typing import Any

from ctxwarden._fastinit import fast_init
from ctxwarden.dedupe import DedupeCandidate, DedupeConfig, FoldDecision, may_fold, scope_kinds
from ctxwarden.store.base import FoldTarget

__all__ = ["NEAR_CANDIDATES", "Aggregate", "Analysed", "FoldIndex"]

#: How many aggregates sharing a near key layer B tries, most recently seen first.
NEAR_CANDIDATES = 4


@fast_init
@dataclass(frozen=True, slots=True)
class Analysed:
    """An aggregate as the rule sees it: its first member's slot values and its newest member's
    candidate (timed at the aggregate's ``last_seen_at``). Cached by rowid across batches and
    trusted only while ``id`` and ``seen_at`` match the row."""

    id: str
    seen_at: float
    first_values: tuple[str, ...]
    latest: DedupeCandidate


@dataclass(slots=True, kw_only=True)
class Aggregate:
    """A stored message as of this batch: its keys and the aggregate fields the batch changes."""

    rowid: int
    id: str
    tenant: str
    session: str
    channel: str | None
    author: str | None
    author_kind: str
    content: str
    attachments: Sequence[Mapping[str, Any]]
    created_at: float
    content_hash: str
    near_key: str | None
    dup_count: int
    last_seen_at: float
    latest_content: str | None
    analysed: Analysed | None = None
    changed: bool = False
    #: Records this batch folded in: the store adds it to ``dup_count`` (an increment, so that
    #: writers in other processes folding into the same aggregate lose no update).
    folded: int = 0
    #: The end user of its conversation (a channel-less message folds only within it).
    user: str | None = None

    @classmethod
    def of(cls, target: FoldTarget) -> Aggregate:
        """An aggregate from a prefetched row."""
        return cls(
            rowid=target.rowid,
            id=target.id,
            tenant=target.tenant,
            session=target.session,
            channel=target.channel,
            author=target.author,
            author_kind=target.author_kind,
            content=target.content,
            attachments=target.attachments,
            created_at=target.created_at,
            content_hash=target.content_hash,
            near_key=target.near_key,
            dup_count=target.dup_count,
            last_seen_at=target.last_seen_at,
            latest_content=target.latest_content,
            user=target.user,
        )

    @classmethod
    def new(
        cls,
        *,
        rowid: int,
        id: str,
        tenant: str,
        session: str,
        channel: str | None,
        content: str,
        candidate: DedupeCandidate,
        attachments: Sequence[Mapping[str, Any]] = (),
        user: str | None = None,
    ) -> Aggregate:
        """An aggregate for a record stored in this batch (``candidate.created_at`` set)."""
        created = candidate.created_at if candidate.created_at is not None else 0.0
        return cls(
            rowid=rowid,
            id=id,
            tenant=tenant,
            session=session,
            channel=channel,
            author=candidate.author,
            author_kind=candidate.author_kind,
            content=content,
            attachments=attachments,
            created_at=created,
            content_hash=candidate.exact_key,
            near_key=candidate.near_key,
            dup_count=1,
            last_seen_at=created,
            latest_content=None,
            analysed=Analysed(
                id=id, seen_at=created, first_values=candidate.values, latest=candidate
            ),
            user=user,
        )


class FoldIndex:
    """The batch's aggregates by layer-A key (per channel and/or session) and layer-B key (per
    channel). ``cache`` maps rowids to :class:`Analysed` from earlier batches (read only)."""

    def __init__(self, config: DedupeConfig, *, cache: Mapping[int, Analysed]) -> None:
        self.config = config
        self._cache = cache
        kinds = set(scope_kinds(config))
        self._by_channel = "channel" in kinds
        self._by_session = "session" in kinds
        # Layer A by (tenant, key) only: a key's bucket holds a handful of aggregates, and
        # testing their channel and session is cheaper than building a key per scope.
        self._exact: dict[tuple[str, str], list[Aggregate]] = {}
        self._near: dict[tuple[str, str | None, str], list[Aggregate]] = {}
        self._rows: dict[int, Aggregate] = {}
        self._changed: list[Aggregate] = []

    def add(self, aggregate: Aggregate) -> None:
        """Index a prefetched or newly stored aggregate (a rowid already indexed is ignored)."""
        rows = self._rows
        if aggregate.rowid in rows:
            return
        rows[aggregate.rowid] = aggregate
        key = (aggregate.tenant, aggregate.content_hash)
        bucket = self._exact.get(key)
        if bucket is None:
            self._exact[key] = [aggregate]
        else:
            bucket.append(aggregate)
        if aggregate.near_key is not None:
            near = (aggregate.tenant, aggregate.channel, aggregate.near_key)
            bucket = self._near.get(near)
            if bucket is None:
                self._near[near] = [aggregate]
            else:
                bucket.append(aggregate)

    def find(
        self,
        candidate: DedupeCandidate,
        *,
        tenant: str,
        session: str,
        channel: str | None,
        user: str | None = None,
    ) -> tuple[Aggregate, FoldDecision, tuple[str, ...]] | None:
        """The aggregate ``candidate`` folds into (layer A first, then B), the decision, and the
        aggregate's first member's values; None when it is to be stored."""
        config = self.config
        created = candidate.created_at if candidate.created_at is not None else 0.0
        bucket = self._exact.get((tenant, candidate.exact_key))
        if bucket:
            since = created - config.exact_ttl_seconds
            by_channel, by_session = self._by_channel, self._by_session
            if channel is None:
                # No channel: its own conversation only (dedupe.exact_scopes).
                hits = [
                    a
                    for a in bucket
                    if a.last_seen_at >= since and a.session == session and a.user == user
                ]
            else:
                hits = [
                    a
                    for a in bucket
                    if a.last_seen_at >= since
                    and (
                        (by_channel and a.channel == channel)
                        or (by_session and a.session == session and a.user == user)
                    )
                ]
            if hits:
                hit = max(hits, key=lambda a: (a.last_seen_at, a.rowid))
                # Equal exact keys mean equal (author, canonical text, attachments), and a
                # candidate is a function of those: the stored one differs only in its kind
                # and time.
                old = dataclasses.replace(
                    candidate, author_kind=hit.author_kind, created_at=hit.last_seen_at
                )
                decision = may_fold(candidate, old, config)
                if decision.fold:
                    return hit, decision, candidate.values
        if not config.near or candidate.near_key is None:
            return None
        found = self._near.get((tenant, channel, candidate.near_key))
        if not found:
            return None
        since = created - config.near_window_seconds
        near = [a for a in found if a.last_seen_at >= since]
        if len(near) > 1:
            near.sort(key=lambda a: (a.last_seen_at, a.rowid), reverse=True)
        for aggregate in near[:NEAR_CANDIDATES]:
            analysed = self._analyse(aggregate)
            decision = may_fold(candidate, analysed.latest, config)
            if decision.fold:
                return aggregate, decision, analysed.first_values
        return None

    def fold(
        self,
        aggregate: Aggregate,
        candidate: DedupeCandidate,
        content: str,
        first_values: tuple[str, ...],
    ) -> None:
        """Count ``candidate`` (whose text is ``content``) into ``aggregate``.

        The aggregate keeps the newest member's content only when it says other values than the
        first member (a price tick, a new counter), so the model sees the value now in force.
        """
        created = candidate.created_at if candidate.created_at is not None else 0.0
        aggregate.dup_count += 1
        aggregate.folded += 1
        if not aggregate.changed:
            aggregate.changed = True
            self._changed.append(aggregate)
        if created >= aggregate.last_seen_at:
            aggregate.latest_content = content if candidate.values != first_values else None
            aggregate.last_seen_at = created
            aggregate.analysed = Analysed(
                id=aggregate.id, seen_at=created, first_values=first_values, latest=candidate
            )
        # else: an older record arrived late; the newest member is unchanged.

    def changed(self) -> list[Aggregate]:
        """Aggregates whose dup_count, last_seen_at or latest_content this batch changed."""
        return sorted(self._changed, key=lambda a: a.rowid)

    def analysed(self, into: MutableMapping[int, Analysed]) -> None:
        """Copy every current analysis into ``into`` (the caller's cache, after commit)."""
        for rowid, aggregate in self._rows.items():
            if aggregate.analysed is not None:
                into[rowid] = aggregate.analysed

    def _analyse(self, aggregate: Aggregate) -> Analysed:
        current = aggregate.analysed
        if current is not None and current.seen_at == aggregate.last_seen_at:
            return current
        cached = self._cache.get(aggregate.rowid)
        if (
            cached is not None
            and cached.id == aggregate.id
            and cached.seen_at == aggregate.last_seen_at
        ):
            aggregate.analysed = cached
            return cached
        first = DedupeCandidate.build(
            author=aggregate.author,
            author_kind=aggregate.author_kind,
            content=aggregate.content,
            attachments=aggregate.attachments,
        )
        latest = first
        if aggregate.latest_content is not None:
            latest = DedupeCandidate.build(
                author=aggregate.author,
                author_kind=aggregate.author_kind,
                content=aggregate.latest_content,
                attachments=aggregate.attachments,
            )
        analysed = Analysed(
            id=aggregate.id,
            seen_at=aggregate.last_seen_at,
            first_values=first.values,
            # The stored near key, not the rebuilt one: a channel-less message's key names its
            # conversation (dedupe.conversation_near_key), which its text alone cannot give.
            latest=dataclasses.replace(
                latest,
                created_at=aggregate.last_seen_at,
                near_key=aggregate.near_key if latest.near_key is not None else None,
            ),
        )
        aggregate.analysed = analysed
        return analysed
