"""One cluster's summary, or why it is left alone: :func:`summarise_cluster` and its
:class:`ClusterSummary` (split from :mod:`ctxwarden.compact`, which plans and applies).

A cluster gets the configured summariser's summary when its facts fit what a summary may keep
(checked by :func:`~ctxwarden.summarize.lost_facts`, falling back to the extractive summary),
else, when the policy allows lossless packs, a :func:`ctxwarden.pack.pack` that keeps every
message verbatim, when that saves enough of the store; else it is left alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from ctxwarden.background import Background
from ctxwarden.errors import SummarizeError
from ctxwarden.pack import pack
from ctxwarden.summarize import (
    ExtractiveSummarizer,
    Summarizer,
    SummaryItem,
    TokenCounter,
    cluster_facts,
    dropped_sentences,
    fact_tokens,
    lost_facts,
)
from ctxwarden.types import Memory

__all__ = ["ClusterSummary", "summarise_cluster", "summary_limit"]


class ClusterShape(Protocol):
    """What :func:`summarise_cluster` reads of a :class:`ctxwarden.compact.Cluster`."""

    @property
    def summary_id(self) -> str: ...

    @property
    def tokens(self) -> int: ...

    @property
    def target_tokens(self) -> int: ...


def summary_limit(cluster: ClusterShape, max_tokens: int | None, max_share: float) -> int:
    """The most a summary of ``cluster`` may take (see :func:`summarise_cluster`)."""
    return min(int(cluster.tokens * max_share), max_tokens or cluster.tokens)


@dataclass(frozen=True, kw_only=True)
class ClusterSummary:
    """What a cluster's summary would be: its text (None when the cluster is left alone), the
    facts of its originals, the fact sentences it would lose and every sentence it drops, as
    ``(id, sentence)``. ``reason`` says why a cluster is left alone; ``fallback`` why it got
    the extractive summary instead of the configured summariser's (empty when it did not)."""

    summary_id: str
    text: str | None
    tokens: int
    facts: int
    lost: tuple[tuple[str, str], ...] = ()
    dropped: tuple[tuple[str, str], ...] = ()
    reason: str = ""
    fallback: str = ""
    #: A lossless pack (:mod:`ctxwarden.pack`): every message verbatim; ``saving`` is the share
    #: of the cluster's estimated store bytes it saves.
    lossless: bool = False
    saving: float = 0.0
    #: What the store keeps of a lossless pack's text (:attr:`ctxwarden.pack.Pack.stored`:
    #: its lines without ids and times); None: the text itself.
    stored: str | None = None

    def to_dict(self) -> dict[str, object]:
        """A JSON-ready view."""
        return {
            "summary_id": self.summary_id,
            "text": self.text,
            "tokens": self.tokens,
            "facts": self.facts,
            "lost": [list(pair) for pair in self.lost],
            "dropped": [list(pair) for pair in self.dropped],
            "reason": self.reason,
            "fallback": self.fallback,
            "lossless": self.lossless,
            "saving": round(self.saving, 4),
        }


def summarise_cluster(
    cluster: ClusterShape,
    sources: Sequence[Memory],
    summarizer: Summarizer,
    tokenizer: TokenCounter,
    max_tokens: int | None = None,
    max_share: float = 0.5,
    background: Background | None = None,
    min_pack_saving: float | None = None,
) -> ClusterSummary:
    """The summary ``cluster`` gets, or why it is left alone.

    The token target is the policy's plus what every fact of the originals needs (see
    :func:`ctxwarden.sentences.fact_values`), up to ``max_tokens`` (a summary too big for a
    context's summaries or related block would never be shown) and half the cluster's tokens (a
    summary that keeps more is not worth what it drops; ``max_share``); a cluster whose facts
    need more is left alone. When the configured summariser fails (a
    :class:`~ctxwarden.errors.SummarizeError`: a timeout, a reply rejected after its retries) or
    its summary loses a fact (:func:`lost_facts`), the cluster gets the extractive summary and
    ``fallback`` says why; when that loses a fact too, the cluster is left alone.
    ``background`` (the plan's) tells facts from stock phrases beyond the cluster.

    A cluster that would be left alone gets a lossless pack instead (every message verbatim,
    :func:`ctxwarden.pack.pack`) when ``min_pack_saving`` is given and the pack saves at least
    that share of the cluster's estimated store bytes.
    """
    items = [SummaryItem.of(m) for m in sources]
    facts = len(cluster_facts(items, background))
    if isinstance(summarizer, ExtractiveSummarizer) and summarizer.background is None:
        summarizer = summarizer.with_background(background)
    # The facts come on top of the policy's target, which stays for the best of the rest.
    target = cluster.target_tokens + fact_tokens(items, tokenizer, background)
    limit = summary_limit(cluster, max_tokens, max_share)
    if target > limit:
        reason = f"its {facts} facts need {target} of its {cluster.tokens} tokens"
        return _packed(cluster, items, tokenizer, facts, min_pack_saving, reason) or ClusterSummary(
            summary_id=cluster.summary_id, text=None, tokens=0, facts=facts, reason=reason
        )
    fallback = ""
    extractive = isinstance(summarizer, ExtractiveSummarizer)
    try:
        text = summarizer.summarize(items, max_tokens=target, tokenizer=tokenizer).render()
        lost = lost_facts(items, text, background)
        if lost and not extractive:
            fallback = f"lost_facts: its summary lost {len(lost)} of {facts} facts"
    except SummarizeError as exc:
        if extractive:
            raise
        fallback = f"{exc.reason or 'failed'}: {exc}"
    if fallback:
        summarizer = ExtractiveSummarizer(background=background)
        text = summarizer.summarize(items, max_tokens=target, tokenizer=tokenizer).render()
        lost = lost_facts(items, text, background)
    for _ in range(2):
        # The fact estimate leaves out the entities line and section titles: grow the target
        # by what was lost, while the summary still saves tokens.
        if not lost or target >= limit:
            break
        missing = tokenizer.count("\n".join(f"- [{i}] 00:00 {s}" for i, s in lost))
        target = min(limit, int(target * 1.15) + missing)
        text = summarizer.summarize(items, max_tokens=target, tokenizer=tokenizer).render()
        lost = lost_facts(items, text, background)
    if lost:
        reason = f"a summary within {target} tokens would lose {len(lost)} of {facts} facts"
        packed = _packed(cluster, items, tokenizer, facts, min_pack_saving, reason, fallback)
        if packed is not None:
            return packed
        return ClusterSummary(
            summary_id=cluster.summary_id, text=None, tokens=0, facts=facts, lost=tuple(lost),
            dropped=tuple(dropped_sentences(items, text)),
            reason=reason, fallback=fallback,
        )  # fmt: skip
    return ClusterSummary(
        summary_id=cluster.summary_id, text=text, tokens=tokenizer.count(text), facts=facts,
        dropped=tuple(dropped_sentences(items, text)), fallback=fallback,
    )  # fmt: skip


def _packed(
    cluster: ClusterShape,
    items: Sequence[SummaryItem],
    tokenizer: TokenCounter,
    facts: int,
    min_saving: float | None,
    reason: str,
    fallback: str = "",
) -> ClusterSummary | None:
    """The cluster's lossless pack when it saves ``min_saving`` of the store, else None."""
    if min_saving is None:
        return None
    found = pack(items, tokenizer)
    if found is None or found.saving < min_saving:
        return None
    return ClusterSummary(
        summary_id=cluster.summary_id, text=found.text, tokens=found.tokens, facts=facts,
        reason=f"lossless pack: {reason}; every message kept, {found.saving:.0%} of the "
        "cluster's store bytes saved", fallback=fallback, lossless=True, saving=found.saving,
        stored=found.stored,
    )  # fmt: skip
