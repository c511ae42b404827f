"""Compaction: old, rarely used memories become structured summaries, leaving tombstones behind.

Same shape as a schema migration: :func:`plan` reads and decides (pure, no I/O), :func:`apply`
writes, one transaction per cluster.

Candidates are memories of kind ``message`` created more than ``older_than`` seconds ago,
not pinned, whose time-decayed access score ``sum exp(-(now - t_i) / tau)`` is under
``access_threshold`` and that no summary already cites. The store keeps the score as of its
last bump (``access_score`` at ``access_score_at``); :func:`decayed_score` brings it to ``now``.
Candidates are clustered by thread (session, channel, thread), then by time window, then by
topic when embeddings are given, and cut at ``max_cluster_tokens``.

:func:`apply` summarises each cluster outside any transaction (a model may be slow), then in one
transaction: re-checks that every original is still there (else the cluster is skipped as
stale), inserts the summary memory (kind ``summary``, content ``Summary.render()``, with
``source_ids`` and ``time_range``, FTS-indexed by trigger, token counts cached), and retires the
originals (:meth:`ctxwarden.store.base.Writer.retire`): their rows go (FTS by trigger, token
counts by cascade), their aliases now point at the summary (which records in its metadata,
``alias_sources``, the source each was folded into, so erasing one takes out that source's
lines only), and each gets a content-free tombstone, through which its own id resolves to the
summary. A crash at any point leaves
either the whole cluster done or none of it; running :func:`apply` again (with a fresh plan)
finishes the job. Summary ids are derived from the tenant and the source ids, so a retried
cluster gets the same id.

How ids stay accounted for: ``engine.get(old_id)`` returns the summary that absorbed ``old_id``,
and when a summary is in a context, ``Context.included`` lists the summary's id, whose
``source_ids`` name every original it stands for (the inclusion log keeps the summary id too).

>>> policy = CompactionPolicy(older_than=3600)
>>> plan([], now=0.0, policy=policy, tokens={}).clusters
()
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

import xxhash

from ctxwarden import render
from ctxwarden.background import TERMS_KEY, Background, term_corrections
from ctxwarden.cluster_summary import ClusterSummary, summarise_cluster, summary_limit
from ctxwarden.dedupe import exact_key
from ctxwarden.errors import ConfigError, NotFound
from ctxwarden.pack import PACK_FORMAT, PACK_FORMAT_KEY, pack
from ctxwarden.store.base import NewMemory, Store, TokenCount
from ctxwarden.summarize import (
    Summarizer,
    SummaryItem,
    TokenCounter,
    fact_tokens,
    lost_facts,
)
from ctxwarden.types import Memory

__all__ = [
    "Cluster",
    "ClusterSummary",
    "CompactionPlan",
    "CompactionPolicy",
    "CompactionResult",
    "apply",
    "decayed_score",
    "lost_facts",
    "plan",
    "preview",
    "summarise_cluster",
    "summary_id",
    "write_summary",
]

DAY = 86400.0


@dataclass(frozen=True, kw_only=True)
class CompactionPolicy:
    """What compaction takes and how it groups it. All times are seconds.

    - ``older_than``: only memories created before ``now - older_than`` (default 14 days).
    - ``access_threshold``: only memories whose decayed access score is below it (a memory used
      once a week ago scores ``exp(-1) = 0.37`` with the default ``tau``).
    - ``tau``: the decay time constant of the access score (default 7 days, the store's).
    - ``time_window``: a cluster spans at most this long (default one day).
    - ``max_cluster_tokens``: a cluster holds at most this many tokens of originals.
    - ``min_cluster_size``: smaller clusters are left alone (a summary of one message saves
      nothing).
    - ``summary_ratio``, ``min_summary_tokens``, ``max_summary_tokens``: the summary's token
      target is ``ratio x cluster tokens`` clamped to [min, max].
    - ``topic_threshold``: with embeddings, a memory joins a topic group when its cosine
      similarity to the group's first member is at least this.
    - ``max_summary_share``: a summary keeps at most this share of its cluster's tokens; a
      cluster whose facts need more is left alone (a summary that keeps more is not worth what
      it drops).
    - ``keep_originals``: ``"delete"`` (default) removes a cluster's originals when its summary
      is written; ``"archive"`` keeps them, compressed, in the store's archive for
      ``archive_days`` days (``Engine.expand(summary_id)`` gives them back; erasure removes
      them; expired ones go at the next compaction or ``Engine.purge_archive()``).
    - ``lossless_packs``, ``min_pack_saving``: a cluster whose facts need more than
      ``max_summary_share`` becomes a lossless pack (every message verbatim with its id, time
      and author, :mod:`ctxwarden.pack`) when that saves at least ``min_pack_saving`` of the
      cluster's estimated store bytes (rows, index entries; 0.3: the uncertainty of a byte
      estimate against page fill, see :mod:`ctxwarden.pack`); else it is left alone.

    >>> CompactionPolicy(older_than=-1)
    Traceback (most recent call last):
    ...
    ctxwarden.errors.ConfigError: compact.older_than: -1 must be zero or more (seconds)
    """

    older_than: float = 14 * DAY
    access_threshold: float = 0.5
    tau: float = 7 * DAY
    time_window: float = DAY
    max_cluster_tokens: int = 6000
    min_cluster_size: int = 2
    summary_ratio: float = 0.1
    min_summary_tokens: int = 64
    max_summary_tokens: int = 800
    topic_threshold: float = 0.35
    max_summary_share: float = 0.5
    keep_originals: Literal["delete", "archive"] = "delete"
    archive_days: float = 30.0
    lossless_packs: bool = True
    min_pack_saving: float = 0.3

    def __post_init__(self) -> None:
        def bad(name: str, rule: str) -> ConfigError:
            return ConfigError(f"compact.{name}: {getattr(self, name)} {rule}")

        for name in ("older_than", "access_threshold"):
            if not _number(getattr(self, name)) or getattr(self, name) < 0:
                raise bad(
                    name,
                    "must be zero or more" + (" (seconds)" if name != "access_threshold" else ""),
                )
        for name in ("tau", "time_window"):
            if not _number(getattr(self, name)) or getattr(self, name) <= 0:
                raise bad(name, "must be a positive number of seconds")
        for name in ("max_cluster_tokens", "min_summary_tokens", "max_summary_tokens"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise bad(name, "must be a positive whole number of tokens")
        if not isinstance(self.min_cluster_size, int) or self.min_cluster_size < 1:
            raise bad("min_cluster_size", "must be 1 or more")
        if not _number(self.summary_ratio) or not 0 < self.summary_ratio < 1:
            raise bad("summary_ratio", "must be between 0 and 1 (exclusive)")
        if not _number(self.max_summary_share) or not 0 < self.max_summary_share < 1:
            raise bad("max_summary_share", "must be between 0 and 1 (exclusive)")
        if self.max_summary_tokens < self.min_summary_tokens:
            raise bad(
                "max_summary_tokens", f"is below min_summary_tokens ({self.min_summary_tokens})"
            )
        if self.keep_originals not in ("delete", "archive"):
            raise ConfigError(
                f"compact.keep_originals: {self.keep_originals!r} is not 'delete' or 'archive'"
            )
        if not _number(self.archive_days) or self.archive_days <= 0:
            raise bad("archive_days", "must be a positive number of days")
        if not isinstance(self.lossless_packs, bool):
            raise bad("lossless_packs", "must be true or false")
        if not _number(self.min_pack_saving) or not 0 < self.min_pack_saving < 1:
            raise bad("min_pack_saving", "must be a share between 0 and 1 (exclusive)")
        if not _number(self.topic_threshold) or not -1 <= self.topic_threshold <= 1:
            raise bad("topic_threshold", "must be a cosine similarity in [-1, 1]")

    def target_tokens(self, cluster_tokens: int) -> int:
        """The summary's token target for a cluster of ``cluster_tokens``."""
        target = int(cluster_tokens * self.summary_ratio)
        return max(self.min_summary_tokens, min(self.max_summary_tokens, target))


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


@dataclass(frozen=True, kw_only=True)
class Cluster:
    """Memories that will become one summary."""

    tenant: str
    session: str
    channel: str | None
    thread_id: str | None
    ids: tuple[str, ...]
    content_hashes: tuple[str, ...]
    tokens: int
    target_tokens: int
    time_range: tuple[float, float]
    user: str | None = None
    #: What the originals' facts need in the summary on top of ``target_tokens`` (0 when the
    #: plan was made without a tokenizer to count them).
    fact_tokens: int = 0
    #: The cluster becomes a lossless pack of ``pack_tokens`` (:mod:`ctxwarden.pack`): its
    #: facts need more than a summary may keep, and packing saves enough of the store.
    lossless: bool = False
    pack_tokens: int = 0

    @property
    def size(self) -> int:
        """How many memories the cluster holds."""
        return len(self.ids)

    @property
    def tokens_saved(self) -> int:
        """Estimated tokens saved: the originals' tokens minus the summary's target (the
        policy's plus what the facts need), the most the summary may take; for a lossless
        pack, the originals' tokens minus the pack's (a pack saves store bytes, few tokens)."""
        if self.lossless:
            return self.tokens - self.pack_tokens
        return self.tokens - self.target_tokens - self.fact_tokens

    @property
    def summary_id(self) -> str:
        """The id the cluster's summary will get."""
        return summary_id(self.tenant, self.ids)


@dataclass(frozen=True, kw_only=True)
class CompactionPlan:
    """What :func:`apply` would do: clusters in order, and why other candidates stay
    (``skipped``: memories per reason; ``facts``: those in clusters whose facts would need more
    of the summary than ``max_summary_share`` allows, which :func:`apply` would leave alone)."""

    now: float
    policy: CompactionPolicy
    tokenizer: str
    clusters: tuple[Cluster, ...]
    considered: int = 0
    skipped: Mapping[str, int] = field(default_factory=dict)
    #: term frequencies over every candidate, which tell the extractive summariser what is news
    #: (:class:`~ctxwarden.summarize.Background`); :func:`apply` and :func:`preview` use this one
    background: Background | None = field(default=None, repr=False, compare=False)

    @property
    def memories(self) -> int:
        """Memories that would be compacted."""
        return sum(c.size for c in self.clusters)

    @property
    def tokens(self) -> int:
        """Tokens of the memories that would be compacted."""
        return sum(c.tokens for c in self.clusters)

    @property
    def tokens_saved(self) -> int:
        """Estimated tokens saved in all."""
        return sum(c.tokens_saved for c in self.clusters)

    def to_dict(self) -> dict[str, object]:
        """A JSON-ready view (for the CLI and the HTTP API)."""
        return {
            "now": self.now,
            "tokenizer": self.tokenizer,
            "considered": self.considered,
            "skipped": dict(self.skipped),
            "memories": self.memories,
            "tokens": self.tokens,
            "tokens_saved": self.tokens_saved,
            "keep_originals": self.policy.keep_originals,
            "clusters": [
                {
                    "summary_id": c.summary_id,
                    "session": c.session,
                    "channel": c.channel,
                    "thread_id": c.thread_id,
                    "size": c.size,
                    "tokens": c.tokens,
                    "tokens_saved": c.tokens_saved,
                    "lossless": c.lossless,
                    "time_range": list(c.time_range),
                    "ids": list(c.ids),
                }
                for c in self.clusters
            ],
        }


@dataclass(frozen=True, kw_only=True)
class CompactionResult:
    """What :func:`apply` did: ``archived`` of the ``compacted`` originals were kept in the
    archive (``keep_originals="archive"``); ``purged``: expired archived originals deleted
    (by :meth:`Engine.compact`, before it compacts)."""

    summaries: tuple[str, ...] = ()
    compacted: int = 0
    already_done: int = 0
    stale: int = 0
    left_alone: int = 0
    #: The compacted originals' tokens (as lines, the plan's sizes) minus their summaries'.
    tokens_saved: int = 0
    archived: int = 0
    purged: int = 0
    #: ``(summary_id, reason)`` of each cluster that got the extractive summary because the
    #: configured summariser failed or was rejected (see :func:`summarise_cluster`).
    fallbacks: tuple[tuple[str, str], ...] = ()


def decayed_score(score: float, score_at: float | None, now: float, tau: float) -> float:
    """``score`` (as of ``score_at``) decayed to ``now``: ``score * exp(-(now - at) / tau)``.

    >>> round(decayed_score(1.0, 0.0, 7.0, 7.0), 4)
    0.3679
    """
    if score <= 0 or score_at is None:
        return max(0.0, score)
    return score * math.exp(-max(0.0, now - score_at) / tau)


def summary_id(tenant: str, ids: Sequence[str]) -> str:
    """The deterministic id of a summary of ``ids`` (a retried cluster gets the same id)."""
    digest = xxhash.xxh3_64_hexdigest("\x00".join([tenant, *ids]).encode("utf-8", "surrogatepass"))
    return f"s-{digest}"


def plan(
    memories: Iterable[Memory],
    *,
    now: float,
    policy: CompactionPolicy,
    tokens: Mapping[int, int],
    score_times: Mapping[int, float | None] | None = None,
    referenced: Collection[str] = (),
    embeddings: Mapping[str, Sequence[float]] | None = None,
    tokenizer: str = "",
    counter: TokenCounter | None = None,
    summaries: Iterable[Memory] = (),
) -> CompactionPlan:
    """Decide what to compact. Pure: reads only its arguments.

    ``memories`` are the store's candidates (any order); ``tokens`` maps rowid to the memory's
    line tokens; ``score_times`` maps rowid to when its access score was last updated;
    ``referenced`` holds ids that existing summaries cite; ``embeddings`` (id to vector) turns on
    topic clustering. With ``counter`` (the tokenizer named ``tokenizer``) each cluster's
    target includes what its facts need, and a cluster whose facts need more than the policy
    lets a summary keep is left out of the plan (``skipped["facts"]``), as :func:`apply` would
    leave it alone: the plan's numbers are then what :func:`apply` does (unless a summary
    loses a fact even so, which only summarising tells), or it becomes a lossless pack
    (``Cluster.lossless``, see ``CompactionPolicy.lossless_packs``).

    ``summaries`` (the tenant's summaries) count in the background as the messages they stand
    for (:class:`~ctxwarden.background.Background`), so a run resumed after a crash, or a
    second run, judges each remaining cluster against what the first run did.
    """
    cutoff = now - policy.older_than
    times = score_times or {}
    skipped = {
        "too_new": 0, "accessed": 0, "pinned_or_fact": 0, "summarised": 0, "small": 0, "facts": 0
    }  # fmt: skip
    chosen: list[Memory] = []
    considered = 0
    for memory in memories:
        considered += 1
        if memory.kind != "message" or memory.pinned:
            skipped["pinned_or_fact"] += 1
        elif memory.created_at >= cutoff or memory.last_seen_at >= cutoff:
            skipped["too_new"] += 1
        elif memory.id in referenced:
            skipped["summarised"] += 1
        elif (
            decayed_score(memory.access_score, times.get(memory.rowid), now, policy.tau)
            >= policy.access_threshold
        ):
            skipped["accessed"] += 1
        else:
            chosen.append(memory)
    background = Background.of((SummaryItem.of(m).content for m in chosen), summaries)
    threads: dict[tuple[str, str, str | None, str | None, str | None], list[Memory]] = {}
    for memory in chosen:
        # The end user too: a summary must not mix two users' lines (it is read in their scope).
        key = (memory.tenant, memory.session, memory.channel, memory.thread_id, memory.user)
        threads.setdefault(key, []).append(memory)
    clusters: list[Cluster] = []
    for key in sorted(threads, key=lambda k: tuple("" if p is None else p for p in k)):
        members = sorted(threads[key], key=lambda m: (m.created_at, m.rowid))
        for window in _windows(members, policy.time_window):
            for group in _topics(window, embeddings, policy.topic_threshold):
                for part in _cut(group, tokens, policy.max_cluster_tokens):
                    cluster = _cluster(part, tokens, policy)
                    if cluster.size < policy.min_cluster_size or cluster.tokens_saved <= 0:
                        skipped["small"] += cluster.size
                        continue
                    counted: Cluster | None = cluster
                    if counter is not None:
                        counted = _with_facts(cluster, part, counter, policy, background)
                    if counted is None:
                        skipped["facts"] += cluster.size
                        continue
                    clusters.append(counted)
    return CompactionPlan(
        now=now,
        policy=policy,
        tokenizer=tokenizer,
        clusters=tuple(clusters),
        considered=considered,
        skipped=skipped,
        background=background,
    )


def _with_facts(
    cluster: Cluster,
    part: Sequence[Memory],
    counter: TokenCounter,
    policy: CompactionPolicy,
    background: Background | None = None,
) -> Cluster | None:
    """``cluster`` with what its facts need counted; None when that is more than a summary may
    take and a lossless pack would not save enough (:func:`summarise_cluster` would leave it
    alone)."""
    items = [SummaryItem.of(m) for m in part]
    needed = fact_tokens(items, counter, background)
    limit = summary_limit(cluster, policy.max_summary_tokens, policy.max_summary_share)
    if cluster.target_tokens + needed <= limit:
        return replace(cluster, fact_tokens=needed)
    packed = pack(items, counter) if policy.lossless_packs else None
    if packed is None or packed.saving < policy.min_pack_saving:
        return None
    return replace(cluster, lossless=True, pack_tokens=packed.tokens)


def _windows(members: list[Memory], window: float) -> Iterable[list[Memory]]:
    """Consecutive runs aligned to ``window`` boundaries (UTC days by default)."""
    current: list[Memory] = []
    bucket = None
    for memory in members:
        b = math.floor(memory.created_at / window)
        if current and b != bucket:
            yield current
            current = []
        bucket = b
        current.append(memory)
    if current:
        yield current


def _topics(
    members: list[Memory], embeddings: Mapping[str, Sequence[float]] | None, threshold: float
) -> list[list[Memory]]:
    """Greedy topic groups by cosine similarity to each group's first member; none without
    embeddings (the window stays one group)."""
    if not embeddings:
        return [members]
    groups: list[tuple[list[float], list[Memory]]] = []
    loose: list[Memory] = []
    for memory in members:
        vector = embeddings.get(memory.id)
        if vector is None:
            loose.append(memory)
            continue
        unit = _unit(vector)
        for head, group in groups:
            if sum(a * b for a, b in zip(head, unit, strict=False)) >= threshold:
                group.append(memory)
                break
        else:
            groups.append((unit, [memory]))
    out = [g for _, g in groups]
    if loose:
        out.append(loose)
    return out


def _unit(vector: Sequence[float]) -> list[float]:
    norm = math.sqrt(sum(x * x for x in vector)) or 1.0
    return [x / norm for x in vector]


def _cut(members: list[Memory], tokens: Mapping[int, int], limit: int) -> Iterable[list[Memory]]:
    part: list[Memory] = []
    total = 0
    for memory in members:
        cost = tokens.get(memory.rowid, 0)
        if part and total + cost > limit:
            yield part
            part, total = [], 0
        part.append(memory)
        total += cost
    if part:
        yield part


def _cluster(part: list[Memory], tokens: Mapping[int, int], policy: CompactionPolicy) -> Cluster:
    first = part[0]
    total = sum(tokens.get(m.rowid, 0) for m in part)
    return Cluster(
        tenant=first.tenant,
        session=first.session,
        channel=first.channel,
        thread_id=first.thread_id,
        ids=tuple(m.id for m in part),
        content_hashes=tuple(m.content_hash for m in part),
        tokens=total,
        target_tokens=policy.target_tokens(total),
        time_range=(min(m.created_at for m in part), max(m.last_seen_at for m in part)),
        user=first.user,
    )


def write_summary(
    store: Store,
    *,
    tenant: str,
    session: str,
    channel: str | None,
    thread_id: str | None,
    sources: Sequence[Memory],
    content: str,
    id: str,
    tokenizers: Sequence[TokenCounter],
    reason: str,
    now: float,
    retire: bool = True,
    user: str | None = None,
    archive_until: float | None = None,
    metadata: Mapping[str, object] | None = None,
    stored: str | None = None,
) -> bool:
    """Write one summary memory and (``retire``) retire its sources, in one transaction.

    ``stored`` is what the store keeps instead of ``content`` when given (a lossless pack's
    lines without their ids and times, :mod:`ctxwarden.pack`; ``metadata`` then names its
    format and the store shows ``content`` again when read); ``content`` is what is counted.

    With ``archive_until`` the retired sources are kept in the store's archive until then;
    ``metadata`` goes into the summary's metadata beside ``reason`` and ``source_tokens``.
    Returns False, writing nothing, when the summary already exists, a source is no longer a
    memory of its own (``retire``: compacted meanwhile, the caller should plan again), or a
    source was erased meanwhile.
    """
    created = max(m.created_at for m in sources)
    # What the sources cost per tokenizer as lines (the size compaction plans with), kept with
    # the summary so "what compaction saved" can be shown after the sources (and their cached
    # counts) are gone.
    source_tokens = {
        getattr(tok, "name", "default"): sum(tok.count(render.line_text(m)) for m in sources)
        for tok in tokenizers
    }
    start = min(m.time_range[0] if m.time_range else m.created_at for m in sources)
    end = max(m.time_range[1] if m.time_range else m.last_seen_at for m in sources)
    new = NewMemory(
        id=id,
        tenant=tenant,
        session=session,
        channel=channel,
        author=None,
        author_kind="agent",
        role="system",
        content=content if stored is None else stored,
        created_at=created,
        thread_id=thread_id,
        reply_to=None,
        kind="summary",
        pinned=False,
        name=None,
        tool_calls=(),
        tool_call_id=None,
        attachments=(),
        metadata={**(metadata or {}), "reason": reason, "source_tokens": source_tokens},
        content_hash=exact_key(author=None, content=content, attachments=()),
        source_ids=tuple(m.id for m in sources),
        time_range=(start, end),
        user=user,
    )
    view = {"role": "system", "author": None, "content": content, "kind": "summary",
            "created_at": created, "channel": channel}  # fmt: skip
    message_text, line_text = render.message_text(view), render.line_text(view)
    with store.write() as writer:
        if writer.resolve(tenant, id) is not None:
            return False
        if retire and any(writer.resolve(tenant, m.id) != m.id for m in sources):
            return False
        # A source erased while its summary was being written (a window summary made in the
        # background) must not come back as the summary's text.
        if not retire and any(writer.resolve(tenant, m.id) is None for m in sources):
            return False
        rowid = writer.insert(new)
        writer.put_token_counts(
            [
                TokenCount(
                    rowid=rowid,
                    tokenizer=getattr(tok, "name", "default"),
                    message=tok.count(message_text),
                    line=tok.count(line_text),
                )
                for tok in tokenizers
            ]
        )
        if retire:
            writer.retire(
                tenant,
                [m.id for m in sources],
                summary_rowid=rowid,
                deleted_at=now,
                reason=reason,
                archive_until=archive_until,
            )
    return True


def _sources(store: Store, cluster: Cluster) -> tuple[list[Memory], str]:
    sources: list[Memory] = []
    for id_, content_hash in zip(cluster.ids, cluster.content_hashes, strict=True):
        try:
            memory = store.get(cluster.tenant, id_)
        except NotFound:  # compacted or deleted since the plan: stale
            return sources, "stale"
        if memory.id != id_ or memory.content_hash != content_hash:
            return sources, "already_done" if memory.id == cluster.summary_id else "stale"
        sources.append(memory)
    return sources, "compacted"


def _summarise(
    compaction: CompactionPlan,
    cluster: Cluster,
    sources: Sequence[Memory],
    summarizer: Summarizer,
    tokenizer: TokenCounter,
) -> ClusterSummary:
    policy = compaction.policy
    return summarise_cluster(
        cluster, sources, summarizer, tokenizer, policy.max_summary_tokens,
        policy.max_summary_share, compaction.background,
        policy.min_pack_saving if policy.lossless_packs else None,
    )  # fmt: skip


def _metadata(
    compaction: CompactionPlan, sources: Sequence[Memory], summary: ClusterSummary
) -> dict[str, object]:
    """What a compaction summary keeps beside its text: the background's corrections (see
    :mod:`ctxwarden.background`) and whether it is a lossless pack."""
    out: dict[str, object] = {"lossless": True} if summary.lossless else {}
    if summary.lossless and summary.stored is not None:
        out[PACK_FORMAT_KEY] = PACK_FORMAT
    if compaction.background is not None and summary.text is not None:
        texts = {m.id: SummaryItem.of(m).content for m in sources}
        out[TERMS_KEY] = term_corrections(texts, summary.text, compaction.background)
    return out


def preview(
    compaction: CompactionPlan,
    summarizer: Summarizer,
    *,
    store: Store,
    tokenizer: TokenCounter,
) -> tuple[ClusterSummary, ...]:
    """What each cluster's summary would say and drop, writing nothing (``compact --plan``).

    Clusters whose originals changed since the plan are left out.
    """
    out = []
    for cluster in compaction.clusters:
        sources, outcome = _sources(store, cluster)
        if outcome == "compacted":
            out.append(_summarise(compaction, cluster, sources, summarizer, tokenizer))
    return tuple(out)


def apply(
    compaction: CompactionPlan,
    summarizer: Summarizer,
    *,
    store: Store,
    tokenizer: TokenCounter,
    tokenizers: Sequence[TokenCounter] = (),
    now: float | None = None,
    progress: Callable[[Cluster, str], None] | None = None,
    stop: Callable[[], bool] | None = None,
) -> CompactionResult:
    """Carry out a plan: per cluster, summarise, then one transaction (see the module doc).

    ``tokenizer`` bounds the summary's length; ``tokenizers`` are the ones whose counts are
    cached for the summary (default: ``tokenizer``). ``progress(cluster, outcome)`` is called
    after each cluster with ``"compacted"``, ``"already_done"``, ``"stale"`` or ``"left_alone"``
    (its summary would lose a fact: see :func:`summarise_cluster`).
    Safe to re-run: finished clusters are recognised and skipped. ``stop()`` is asked before
    each cluster; when true the run ends there (a shutdown: every cluster is whole or untouched).
    """
    counters = tuple(tokenizers) or (tokenizer,)
    when = compaction.now if now is None else now
    policy = compaction.policy
    archive_until = when + policy.archive_days * DAY if policy.keep_originals == "archive" else None
    written: list[str] = []
    fallbacks: list[tuple[str, str]] = []
    compacted = already = stale = left_alone = saved = 0
    for cluster in compaction.clusters:
        if stop is not None and stop():
            break
        sources, outcome = _sources(store, cluster)
        summary = None
        if outcome == "compacted":
            summary = _summarise(compaction, cluster, sources, summarizer, tokenizer)
            if summary.fallback:
                fallbacks.append((cluster.summary_id, summary.fallback))
            if summary.text is None:
                outcome = "left_alone"
        if outcome == "compacted" and summary is not None and summary.text is not None:
            done = write_summary(
                store,
                tenant=cluster.tenant,
                session=cluster.session,
                channel=cluster.channel,
                thread_id=cluster.thread_id,
                sources=sources,
                content=summary.text,
                id=cluster.summary_id,
                tokenizers=counters,
                reason="compacted",
                now=when,
                user=cluster.user,
                archive_until=archive_until,
                metadata=_metadata(compaction, sources, summary),
                stored=summary.stored if summary.lossless else None,
            )
            outcome = "compacted" if done else "stale"
        if outcome == "compacted":
            compacted += cluster.size
            written.append(cluster.summary_id)
            saved += cluster.tokens - (summary.tokens if summary is not None else 0)
        elif outcome == "already_done":
            already += 1
        elif outcome == "left_alone":
            left_alone += 1
        else:
            stale += 1
        if progress is not None:
            progress(cluster, outcome)
    return CompactionResult(
        summaries=tuple(written),
        compacted=compacted,
        already_done=already,
        stale=stale,
        left_alone=left_alone,
        tokens_saved=saved,
        archived=compacted if archive_until is not None else 0,
        fallbacks=tuple(fallbacks),
    )
