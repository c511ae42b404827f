"""The ingest flow: validate -> provenance -> prepare (ids, hashes, de-dup keys) -> prefetch the
fold targets -> fold or write, in one transaction per batch.

:class:`Ingestion` is the service :meth:`ctxwarden.engine.Engine.ingest` delegates to. It owns
the in-process cache of analysed aggregates (layer B's normalised old memories); what comes
after a batch is written (sliding-window summaries, queueing for embedding) the engine wires.
The fold decisions themselves are pure (:mod:`ctxwarden.dedupe`, :mod:`ctxwarden.fold`).
"""

from __future__ import annotations

import dataclasses
import gc
import json
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import xxhash

from ctxwarden import render, tokens
from ctxwarden.attachments import search_text
from ctxwarden.changes import ChangeLinks
from ctxwarden.dedupe import (
    UNFOLDABLE,
    DedupeCandidate,
    DedupeConfig,
    conversation_near_key,
    exact_key,
    exact_scopes,
    scope_kinds,
    unfoldable_hash,
)
from ctxwarden.engine_config import DEFAULT_DEDUPE, EngineConfig
from ctxwarden.errors import ConflictError, InputError, StoreError
from ctxwarden.fold import NEAR_CANDIDATES, Aggregate, Analysed, FoldIndex
from ctxwarden.provenance import (
    PROVENANCE_KEY,
    SIGNATURE_KEY,
    Verdict,
    Verifier,
    claims_tool_result,
    is_untrusted,
)
from ctxwarden.store.base import (
    AggregateUpdate,
    Alias,
    Edit,
    Edited,
    Store,
    TokenCount,
    Writer,
)
from ctxwarden.types import (
    IngestOutcome,
    IngestResult,
    IngestStatus,
    Memory,
    Record,
    check_scope_name,
)
from ctxwarden.validity import Statement

__all__ = ["CANDIDATE_CACHE_SIZE", "Ingestion"]

#: Attempts at a write transaction that deadlocks with another process's writer (PostgreSQL).
_WRITE_ATTEMPTS = 5

#: Bound of the in-process cache of analysed aggregates (rowid -> candidate).
CANDIDATE_CACHE_SIZE = 65536

log = logging.getLogger(__name__)


@dataclass(slots=True)
class _Prepared:
    record: Record
    id: str
    created_at: float
    content_hash: str
    candidate: DedupeCandidate | None  # None: not subject to de-dup (tool calls, facts...)


def _dedupable(record: Record) -> bool:
    # Untrusted records never fold into (or become) an aggregate a trusted record may join.
    # An agent's own turns and tool results are a transcript: a repeated "continue" or an
    # identical tool output is a real turn of it, never a duplicate (issue 16).
    return (
        record.kind == "message"
        and not record.tool_calls
        and record.role not in _TRANSCRIPT_ROLES
        and not is_untrusted(record.metadata)
    )


#: Roles whose records no de-dup layer folds (an agent's transcript).
_TRANSCRIPT_ROLES = frozenset({"assistant", "tool"})


#: The provenance reason of a ``kind="summary"`` record sent to ingest.
_INGESTED_SUMMARY = "a summary sent to ingest, not written by the engine's compaction"


def _with_provenance(record: Record, verifier: Verifier | None) -> Record:
    """The record with the engine's provenance verdict in its metadata.

    A caller can never set the verdict itself: a ``provenance`` key it sends is dropped. A record
    claiming to be a tool result is checked against its signature (which is then dropped); a
    ``kind="summary"`` record is marked untrusted (rendered quoted, never line by line).
    """
    claims = claims_tool_result(record.role, record.author_kind)
    summary = record.kind == "summary"
    if not claims and not summary and PROVENANCE_KEY not in record.metadata:
        return record
    metadata = {k: v for k, v in record.metadata.items() if k != PROVENANCE_KEY}
    if summary:
        # The engine's own summaries are written by compaction, not ingested; their lines are
        # rendered as they are (each `- [id] author: text`). One sent to ingest is someone's
        # text claiming that form, so it is data: quoted whole, like an unsigned tool result.
        metadata.pop(SIGNATURE_KEY, None)
        verdict = Verdict(trusted=False, reason=_INGESTED_SUMMARY)
        metadata[PROVENANCE_KEY] = verdict.to_metadata()
    elif claims:
        signature = metadata.pop(SIGNATURE_KEY, None)
        if verifier is None:
            verdict = Verdict(trusted=False, reason="no tool key configured for this tenant")
        else:
            verdict = verifier.check(
                tenant=record.tenant,
                session=record.session,
                tool=record.name,
                call_id=record.tool_call_id,
                content=record.content,
                signature=signature,
            )
        metadata[PROVENANCE_KEY] = verdict.to_metadata()
    return dataclasses.replace(record, metadata=metadata)


@contextmanager
def collections_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector for a block (a no-op if it is already off).

    Process-wide while the block runs (one ingest batch or one proxy request, tens of
    milliseconds): objects other threads drop meanwhile are freed by reference counting as
    always; only cycles wait for the next collection.
    """
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


class _Edits:
    """Edits of stored memories (:meth:`Engine.update`, and ingest of a known id with new
    text): the part of :class:`Ingestion` that replaces a text in place."""

    store: Store
    config: EngineConfig
    clock: Callable[[], float]
    _analysed: OrderedDict[int, Analysed]
    _edited: list[int]

    def update(self, memory: Memory, content: Any) -> IngestOutcome:
        """Replace the text of the stored ``memory`` (:meth:`Engine.update`); ``edited``, or
        ``known`` when ``content`` is its text already."""
        record = _record_of(memory, content)
        # A tool result's verdict is made again for the new text (unsigned: untrusted).
        record = _with_provenance(record, self.config.verifier)
        foldable = self.config.dedupe is not None and not memory.content_hash.startswith(UNFOLDABLE)
        item = _prepare(record, self.clock(), fold=foldable)
        tokenizers = tuple(tokens.get_tokenizer(n) for n in self.config.tokenizers)
        # Counted before the write transaction, from the memory's own fields (see _edit).
        view = _view(record, memory.created_at)
        measured = _measure(view, tokenizers) if tokenizers else None
        counts: list[TokenCount] = []
        late: list[tuple[int, dict[str, Any]]] = []
        self._edited.clear()
        with self.store.write() as writer:
            outcome = self._edit(writer, item, counts, (view, measured), late)
            if counts:
                writer.put_token_counts(counts)
        self._count_late(late, tokenizers)
        for rowid in self._edited:
            self._analysed.pop(rowid, None)
        self._edited.clear()
        return outcome

    def _count_late(
        self, late: Sequence[tuple[int, Mapping[str, Any]]], tokenizers: Sequence[tokens.Tokenizer]
    ) -> None:
        """Count and cache, after the write committed, what :meth:`_edit` could not use its
        counts made beforehand for; a failure leaves them to be counted on first use."""
        if not late or not tokenizers:
            return
        counts = [c for rowid, view in late for c in _counted(rowid, view, tokenizers)]
        try:
            self.store.put_token_counts(counts)
        except StoreError as exc:
            log.warning("token counts of edited memories not cached (counted on use): %s", exc)

    def _edit(
        self,
        writer: Writer,
        item: _Prepared,
        counts: list[TokenCount],
        measured: tuple[Mapping[str, Any], Sequence[tuple[str, int, int]] | None],
        late: list[tuple[int, dict[str, Any]]],
    ) -> IngestOutcome:
        """Replace the stored text of ``item``'s id by its own (``known`` if it is the same).

        ``measured``: the fields the caller counted tokens of before the transaction, and the
        counts (None when no tokenizer counts at ingest). They are the edited memory's when its
        stored role, author, kind, time and channel are those fields; otherwise the memory is
        added to ``late``, counted after the commit: no text is counted while the write lock is
        held."""
        record = item.record
        candidate = item.candidate
        edited = writer.edit(
            Edit(
                tenant=record.tenant,
                id=item.id,
                content=record.content,
                content_hash=item.content_hash,
                near_key=candidate.near_key if candidate is not None else None,
                metadata=record.metadata,
                attachments=record.attachments,
            ),
            edited_at=self.clock(),
            keep=self.config.edit_history == "keep",
        )
        if not isinstance(edited, Edited):
            return IngestOutcome(id=item.id, status="known")
        self._edited.append(edited.rowid)
        counted_view, counted = measured
        if counted is not None:
            view = {
                "role": edited.role,
                "author": edited.author,
                "content": record.content,
                "kind": edited.kind,
                "created_at": edited.created_at,
                "channel": edited.channel,
                "metadata": record.metadata,
                "attachments": record.attachments,
            }
            if view == counted_view:
                counts.extend(
                    TokenCount(rowid=edited.rowid, tokenizer=name, message=message, line=line)
                    for name, message, line in counted
                )
            else:
                late.append((edited.rowid, view))
        reason = (
            f"text replaced; the old one kept as version {edited.version}"
            if edited.version is not None
            else "text replaced; the old one erased"
        )
        return IngestOutcome(id=item.id, status="edited", reason=reason)


class Ingestion(_Edits):
    """Validates, folds and writes batches of records (:meth:`Engine.ingest`'s flow)."""

    def __init__(
        self,
        store: Store,
        config: EngineConfig,
        *,
        clock: Callable[[], float],
        authors: dict[str, tuple[float, list[str]]],
    ) -> None:
        self.store = store
        self.config = config
        self.clock = clock
        # Retrieval's cache of each tenant's authors (the assembly flow's), kept current here.
        self._author_cache = authors
        # Analysed aggregates by rowid, so layer B does not re-normalise old memories; entries
        # are checked against the row's id and last_seen_at before use.
        self._analysed: OrderedDict[int, Analysed] = OrderedDict()
        # Rowids whose text an edit replaced in the batch being written (their analysed
        # aggregates are stale once it commits).
        self._edited: list[int] = []
        # Analysed statements of stored messages for change detection (ctxwarden.changes).
        self._statements: OrderedDict[int, tuple[str, Statement]] = OrderedDict()

    def forget(self) -> None:
        """Drop the analysed aggregates (after an erasure or a semantic fold changed rows)."""
        self._analysed.clear()
        self._statements.clear()

    def ingest(
        self,
        records: Iterable[Record | Mapping[str, Any]],
        *,
        tenant: str | None,
        session: str | None,
        user: str | None,
        fold: bool,
    ) -> tuple[IngestResult, list[tuple[str, str]], bool]:
        """Ingest one batch (see :meth:`Engine.ingest`); the result, the (tenant, session) pairs
        to summarise now (``config.auto_summarize``) and whether there is anything to embed."""
        # A batch's objects all stay reachable until it is written, so a garbage collection
        # during it frees nothing and only walks them again (~5 us per message, see
        # bench/ingest.py): collections wait until the batch is decided and written.
        with collections_paused():
            prepared, outcomes = self._ingest_batch(
                records, tenant=tenant, session=session, user=user, fold=fold
            )
            result = IngestResult(outcomes=tuple(outcomes))
            touched: set[tuple[str, str]] = set()
            if self.config.auto_summarize:
                touched = {
                    (item.record.tenant, item.record.session)
                    for item, outcome in zip(prepared, outcomes, strict=True)
                    if outcome.status == "stored"
                }
            # Keep the author cache of retrieval current (empty until a retrieval filled it).
            for item in prepared if self._author_cache else ():
                cached = self._author_cache.get(item.record.tenant)
                if (
                    cached is not None
                    and item.record.author
                    and item.record.author not in cached[1]
                ):
                    cached[1].append(item.record.author)
            embed = self.config.embed != "off" and any(
                o.status in ("stored", "edited") for o in outcomes
            )
            # Dropped before collections resume, so the next one need not walk them.
            del prepared, outcomes
        return result, sorted(touched), embed

    def _ingest_batch(
        self,
        records: Iterable[Record | Mapping[str, Any]],
        *,
        tenant: str | None,
        session: str | None,
        user: str | None = None,
        fold: bool = True,
    ) -> tuple[list[_Prepared], list[IngestOutcome]]:
        """Validate, decide and write one batch; its prepared records and their outcomes."""
        if not isinstance(fold, bool):
            raise InputError(f"expected true or false, got {fold!r}", field="fold")
        defaults: dict[str, Any] = {}
        if tenant is not None:
            defaults["tenant"] = tenant
        elif self.config.tenant != "default":
            defaults["tenant"] = self.config.tenant
        if session is not None:
            defaults["session"] = check_scope_name(session, "session")
        if user is not None:
            defaults["user"] = check_scope_name(user, "user")
        now = self.clock()
        verifier = self.config.verifier
        # Bound once: this loop runs per record (see bench/ingest.py).
        from_mapping, prepare = Record.from_mapping, _prepare
        prepared: list[_Prepared] = []
        add = prepared.append
        for number, raw in enumerate(records, start=1):
            if isinstance(raw, Record):
                record = dataclasses.replace(raw, **defaults) if defaults else raw
                # Built directly, the dataclass checked nothing: the names scope every read.
                if record.user is not None:
                    check_scope_name(record.user, "user", line=number)
                check_scope_name(record.session, "session", line=number)
            else:
                record = from_mapping(raw, line=number, defaults=defaults)
            record = _with_provenance(record, verifier)
            add(prepare(record, now, fold=fold))
        for attempt in range(_WRITE_ATTEMPTS):
            self._edited.clear()
            try:
                outcomes, index = self._write_batch(prepared)
                break
            except ConflictError:
                # A deadlock with another process's writer (PostgreSQL): nothing was written;
                # decide again from what is committed now.
                if attempt == _WRITE_ATTEMPTS - 1:
                    raise
                time.sleep(0.01 * 2**attempt)
        # Only after the commit: a rolled-back batch's rowids may be reused.
        cache = self._analysed
        for rowid in self._edited:
            cache.pop(rowid, None)
        self._edited.clear()
        fresh: dict[int, Analysed] = {}
        index.analysed(fresh)
        for rowid, analysed in fresh.items():
            if rowid in cache:
                cache.move_to_end(rowid)
            cache[rowid] = analysed  # a new key goes to the end
        while len(cache) > CANDIDATE_CACHE_SIZE:
            cache.popitem(last=False)
        if cache and prepared and self.config.dedupe is not None:
            # Aggregates last seen before both windows of the newest record can no longer be
            # folded into by records arriving in order: drop them, so the cache holds one window
            # of traffic rather than growing with the store (its objects cost every full
            # garbage collection). A late record re-analyses its target on a miss.
            dedupe = self.config.dedupe
            horizon = max(item.created_at for item in prepared) - max(
                dedupe.exact_ttl_seconds, dedupe.near_window_seconds
            )
            stale: list[int] = []
            for rowid, oldest in cache.items():
                if oldest.seen_at >= horizon:
                    break
                stale.append(rowid)
            for rowid in stale:
                del cache[rowid]
        return prepared, outcomes

    def _write_batch(self, prepared: Sequence[_Prepared]) -> tuple[list[IngestOutcome], FoldIndex]:
        """Decide and write one validated batch in one transaction; the outcomes, and the fold
        index (whose analysed aggregates the caller caches once the batch is committed)."""
        # Only explicitly configured tokenizers count at ingest; the rest count on first use.
        tokenizers = tuple(tokens.get_tokenizer(n) for n in self.config.tokenizers)
        # Counted before the write transaction (the write lock is not held while text is
        # counted); a record that folds or is known wastes its count, which costs no lock.
        views = [_view(item.record, item.created_at) for item in prepared] if tokenizers else []
        measured = [_measure(view, tokenizers) for view in views]
        late: list[tuple[int, dict[str, Any]]] = []
        outcomes: list[IngestOutcome] = []
        counts: list[TokenCount] = []
        aliases: list[Alias] = []
        folded_into: dict[tuple[str, str], tuple[int, Aggregate]] = {}
        by_tenant: dict[str, list[_Prepared]] = {}
        for item in prepared:
            by_tenant.setdefault(item.record.tenant, []).append(item)
        config = self.config.dedupe
        index = FoldIndex(config or DEFAULT_DEDUPE, cache=self._analysed)
        heads_of: dict[tuple[str, str | None, str | None], tuple[str, ...]] = {}
        changes = ChangeLinks(self.store, self.config.change_window, cache=self._statements)
        changes.read([(item.record, item.created_at) for item in prepared])
        with self.store.write() as writer:
            known: dict[tuple[str, str], str] = {}
            for tenant_name, items in by_tenant.items():
                resolved = writer.resolve_many(tenant_name, [item.id for item in items])
                for id_, where in resolved.items():
                    known[(tenant_name, id_)] = where
                if config is not None:
                    _prefetch(writer, tenant_name, items, config, index)
            # Bound once: this loop runs per record (see bench/ingest.py).
            find, fold, add = index.find, index.fold, index.add
            insert = writer.insert_row_or_fold
            add_outcome = outcomes.append
            exact_ttl = config.exact_ttl_seconds if config is not None else 0.0
            for position, item in enumerate(prepared):
                record = item.record
                item_id = item.id
                key = (record.tenant, item_id)
                existing = known.get(key)
                if existing == item_id:
                    # The id is a memory of its own: other text is an edit (issue 19).
                    before = (views[position], measured[position]) if tokenizers else ({}, None)
                    add_outcome(self._edit(writer, item, counts, before, late))
                    continue
                if existing is not None:
                    add_outcome(
                        IngestOutcome(
                            id=item_id,
                            status="known",
                            duplicate_of=existing if existing != item_id else None,
                        )
                    )
                    continue
                candidate = item.candidate if config is not None else None
                if candidate is not None:
                    found = find(
                        candidate,
                        tenant=record.tenant,
                        session=record.session,
                        channel=record.channel,
                        user=record.user,
                    )
                    if found is not None:
                        aggregate, decision, first_values = found
                        fold(aggregate, candidate, record.content, first_values)
                        status: IngestStatus = (
                            "duplicate" if decision.layer == "exact" else "near_duplicate"
                        )
                        aliases.append(
                            Alias(
                                tenant=record.tenant,
                                id=item_id,
                                rowid=aggregate.rowid,
                                status=status,
                                created_at=item.created_at,
                                session=record.session,
                            )
                        )
                        known[key] = aggregate.id
                        folded_into[key] = (len(outcomes), aggregate)
                        add_outcome(
                            IngestOutcome(
                                id=item_id,
                                status=status,
                                duplicate_of=aggregate.id,
                                reason=decision.reason,
                            )
                        )
                        continue
                    scope = (record.session, record.channel, record.user)
                    heads = heads_of.get(scope)
                    if heads is None:
                        assert config is not None
                        heads = heads_of[scope] = tuple(
                            _head(kind, value, record.user)
                            for kind, value in exact_scopes(
                                config, session=record.session, channel=record.channel
                            )
                        )
                    since = item.created_at - exact_ttl
                else:
                    heads, since = (), item.created_at
                # A concurrent writer (PostgreSQL) may have committed a verbatim copy since the
                # targets were read: the store folds into it then, or reports the id as known.
                stored, rowid, target = insert(_memory_values(item), heads=heads, since=since)
                if stored != "stored":
                    known[key] = target
                    add_outcome(
                        IngestOutcome(
                            id=item_id,
                            status="duplicate" if stored == "duplicate" else "known",
                            duplicate_of=target if target != item_id else None,
                            reason="verbatim copy committed by a concurrent writer"
                            if stored == "duplicate"
                            else None,
                        )
                    )
                    continue
                known[key] = item_id
                changes.stored(position, rowid, item_id)
                if record.key is not None:
                    writer.set_key(record.tenant, rowid, record.key, user=record.user)
                if candidate is not None:
                    add(
                        Aggregate.new(
                            rowid=rowid,
                            id=item_id,
                            tenant=record.tenant,
                            session=record.session,
                            channel=record.channel,
                            content=record.content,
                            candidate=candidate,
                            attachments=record.attachments,
                            user=record.user,
                        )
                    )
                if tokenizers:
                    counts.extend(
                        TokenCount(rowid=rowid, tokenizer=name, message=message, line=line)
                        for name, message, line in measured[position]
                    )
                add_outcome(IngestOutcome(id=item_id, status="stored"))
            if aliases:
                # Another writer (PostgreSQL) stored some of these ids meanwhile: known, not folds.
                for taken in writer.add_aliases(aliases):
                    for alias in aliases:
                        if alias.id == taken:
                            position, aggregate = folded_into[(alias.tenant, alias.id)]
                            aggregate.folded -= 1
                            aggregate.dup_count -= 1
                            owner = writer.resolve(alias.tenant, alias.id)
                            outcomes[position] = IngestOutcome(
                                id=alias.id,
                                status="known",
                                duplicate_of=owner if owner not in (None, alias.id) else None,
                            )
            changed = [a for a in index.changed() if a.folded]
            if changed:
                writer.update_aggregates(
                    [
                        AggregateUpdate(
                            rowid=a.rowid,
                            folded=a.folded,
                            last_seen_at=a.last_seen_at,
                            latest_content=a.latest_content,
                        )
                        for a in changed
                    ]
                )
            if counts:
                writer.put_token_counts(counts)
            writer.supersede(changes.links())
        changes.remember()  # after the commit: a rolled-back batch's rowids may be reused
        self._count_late(late, tokenizers)
        return outcomes, index


def _prepare(record: Record, now: float, *, fold: bool) -> _Prepared:
    """A validated record's id, time, content hash and de-dup candidate."""
    build = DedupeCandidate.build
    created = record.created_at
    if created is None:
        created = now
    record_id = record.id or _derive_id(record, created)
    if fold and _dedupable(record):
        candidate: DedupeCandidate | None = build(
            author=record.author,
            author_kind=record.author_kind,
            content=record.content,
            attachments=record.attachments,
            created_at=created,
        )
        assert candidate is not None
        content_hash = candidate.exact_key
        if record.channel is None and candidate.near_key is not None:
            # Layer B's index is keyed by (channel, near key): a channel-less record's
            # key names its conversation, so it finds only its own session's messages.
            candidate = dataclasses.replace(
                candidate,
                near_key=conversation_near_key(
                    candidate.near_key, session=record.session, user=record.user
                ),
            )
    else:
        candidate = None
        content_hash = exact_key(
            author=record.author, content=record.content, attachments=record.attachments
        )
        if record.kind == "message":
            # Never a layer-A target either: a later record must not fold into it.
            content_hash = unfoldable_hash(content_hash)
    return _Prepared(record, record_id, created, content_hash, candidate)


def _record_of(memory: Memory, content: Any) -> Record:
    """The record of a stored memory with the text ``content``."""
    # Validated as ingest validates a record's text (the error names ``content``).
    checked = Record.from_mapping({"content": content, "role": memory.role})
    return Record(
        id=memory.id,
        content=checked.content,
        role=memory.role,
        tenant=memory.tenant,
        session=memory.session,
        user=memory.user,
        channel=memory.channel,
        author=memory.author,
        author_kind=memory.author_kind,
        created_at=memory.created_at,
        thread_id=memory.thread_id,
        reply_to=memory.reply_to,
        kind=memory.kind,
        pinned=memory.pinned,
        name=memory.name,
        tool_calls=memory.tool_calls,
        tool_call_id=memory.tool_call_id,
        attachments=memory.attachments,
        metadata=dict(memory.metadata),
    )


def _view(record: Record, created_at: float) -> dict[str, Any]:
    """The fields of a memory of ``record`` that its rendered message and line show."""
    return {
        "role": record.role,
        "author": record.author,
        "content": record.content,
        "kind": record.kind,
        "created_at": created_at,
        "channel": record.channel,
        "metadata": record.metadata,
        "attachments": record.attachments,
    }


def _measure(
    view: Mapping[str, Any], tokenizers: Sequence[tokens.Tokenizer]
) -> list[tuple[str, int, int]]:
    """Per tokenizer: its name and the token counts of the memory's message and line."""
    message_text = render.message_text(view)
    line_text = render.line_text(view)
    return [(tok.name, tok.count(message_text), tok.count(line_text)) for tok in tokenizers]


def _counted(
    rowid: int, view: Mapping[str, Any], tokenizers: Sequence[tokens.Tokenizer]
) -> Iterator[TokenCount]:
    """The token counts of a memory (its fields ``view``) under each tokenizer."""
    for name, message, line in _measure(view, tokenizers):
        yield TokenCount(rowid=rowid, tokenizer=name, message=message, line=line)


def _prefetch(
    writer: Writer,
    tenant: str,
    items: Sequence[_Prepared],
    config: DedupeConfig,
    index: FoldIndex,
) -> None:
    """Load every stored message the batch's records of ``tenant`` may fold into."""
    # Channel-less records are looked up in their session whatever the config says.
    kinds = dict.fromkeys([*scope_kinds(config), "session"])
    exact: dict[str, list[tuple[str | None, str]]] = {kind: [] for kind in kinds}
    by_channel = exact.get("channel")
    by_session = exact.get("session")
    scoped_by_session = "session" in scope_kinds(config)
    near: list[tuple[str | None, str]] = []
    use_near = config.near
    oldest = None
    for item in items:
        candidate = item.candidate
        if candidate is None:
            continue
        record = item.record
        key = candidate.exact_key
        if record.channel is None:
            assert by_session is not None
            by_session.append((record.session, key))
        else:
            if by_channel is not None:
                by_channel.append((record.channel, key))
            if scoped_by_session:
                assert by_session is not None
                by_session.append((record.session, key))
        if use_near and candidate.near_key is not None:
            near.append((record.channel, candidate.near_key))
        if oldest is None or item.created_at < oldest:
            oldest = item.created_at
    if oldest is None:
        return
    # One lookup per scope kind (channel, session); the near keys ride with the first.
    for number, (scope, pairs) in enumerate(exact.items()):
        if not pairs and not (number == 0 and near):
            continue
        for target in writer.find_targets(
            tenant,
            exact_scope=scope,
            exact=pairs,
            exact_since=oldest - config.exact_ttl_seconds,
            near=near if number == 0 else (),
            near_since=oldest - config.near_window_seconds,
            # FoldIndex.find tries the newest NEAR_CANDIDATES of a near key, no more.
            near_limit=NEAR_CANDIDATES,
        ):
            index.add(Aggregate.of(target))


def _head(kind: str, value: str | None, user: str | None) -> str:
    """The layer-A race-guard scope key (``Writer.insert_or_fold``'s ``heads``): a session's
    names its end user too, as a channel-less record folds only within its conversation."""
    if kind == "session" and user is not None:
        return f"session:{len(user)}:{user}:{value or ''}"
    return f"{kind}:{value or ''}"


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


def _memory_values(item: _Prepared) -> tuple[Any, ...]:
    """The insert values of a stored record, ``memory_row(None, memory)[1:]`` of its
    :class:`NewMemory` built directly (one tuple per record rather than a NewMemory and then its
    row)."""
    r = item.record
    created = item.created_at
    candidate = item.candidate
    return (
        item.id, r.tenant, r.session, r.channel, r.author, r.author_kind, r.role, r.content,
        created, r.thread_id, r.reply_to, r.kind, r.pinned, r.name,
        json.dumps(list(r.tool_calls)) if r.tool_calls else None,
        r.tool_call_id,
        json.dumps(list(r.attachments)) if r.attachments else None,
        json.dumps(dict(r.metadata)) if r.metadata else None,
        item.content_hash,
        candidate.near_key if candidate is not None else None,
        created, None, None, None, r.user, search_text(r.attachments) or None,
    )  # fmt: skip
