"""Layer C of de-duplication: fold stored memories whose embeddings are near-identical.

Layers A and B (:mod:`ctxwarden.dedupe`) decide at ingest, before a record is stored. An
embedding exists only after a memory is stored and embedded (off the ingest path, in batches),
so layer C folds an already-stored memory X into an older one Y with the store's
``Writer.merge``: Y's ``dup_count`` grows by X's, its ``last_seen_at`` and ``latest_content``
follow the newest, X's id and every alias of X now resolve to Y, and X's text leaves every table
and index (as a delete does); ``get(X.id)`` returns Y.

The decision (:func:`semantic_fold`) keeps every rule of layer B that does not depend on the
wording, and adds the similarity:

1. Same tenant, same channel, same author (the same words from two people are two reports), both
   dedupable (``kind = "message"``, not a tool call or result, not an assistant turn, not
   untrusted, not pinned). Without a channel: the same session and end user too (a channel-less
   message belongs to its own conversation).
2. X is newer than Y and arrived within ``window_seconds`` of Y's ``last_seen_at``.
3. Cosine of their embeddings at least ``threshold`` (default 0.98, see below).
4. The changed-fact guard (:func:`fact_guard`): what differs between the two texts must not be a
   fact. Differing volatile values (numbers, times, dates, amounts, weekdays, hashes) block the
   fold for a person and for a bot whose text speaks of a change (layer B's rules 5 and 6);
   a bot's texts must not differ in any word (a template's other word is another event); a
   person's word present in one text only blocks it when it is a negation, a change word, a month, a
   name (capitalised mid-sentence in the original), a symbol or emoji, or holds a digit, or
   when the other text has its prefixed opposite ("enable"/"disable"); a question never folds
   into a statement.

Why 0.98, measured (``bench/dedupe_quality.py DATA --semantic``, docs/benchmarks.md): on
MiniLM's int8 path (``minilm-l6-int8@2``, the default), reordered or re-asked repeats score 0.98+
("lunch at the usual place today" / "lunch today at the usual place" 0.984), reworded ones
0.95-0.99 ("can someone review my PR please" / "could someone please review my PR" 0.981),
changed decisions up to 0.955 ("standup is now at 8:15, not 9:45" / "... 10:30, not 8:15") and
chatter with a different tail up to 0.975 ("the new CI pipeline broke twice before noon" /
"..., ugh"), which the development log's ground truth counts as distinct messages. On that log
every in-channel family is already folded by layers A and B, so layer C can only add folds the
ground truth calls wrong: 1 at 0.97, none at 0.98 (protected evidence folded: 0 at every
threshold). The float path (``minilm-l6-int8@1``) scores the same pairs 0.005-0.01 higher
(0.993, 0.986, 0.962, 0.983) and folded 3 wrong at 0.98, none at 0.985: the default threshold
is the line of the model whose vectors are folded (:func:`fold_line`), 0.985 for that path
and any model not measured. The guard blocks differing values and
names whatever the score; the threshold is the line for what no token rule sees ("passed" /
"failed" 0.67, "blocked" / "unblocked" 0.86).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Final, Protocol

import numpy as np
import numpy.typing as npt

from ctxwarden.dedupe import BOT_CHANGE_WORDS, UNFOLDABLE, DedupeCandidate, skeleton
from ctxwarden.errors import ConfigError
from ctxwarden.normalize import canonical, mask_volatile_values
from ctxwarden.provenance import is_untrusted
from ctxwarden.types import Memory

__all__ = [
    "DEFAULT_LINE",
    "MERGE_STATUS",
    "SemanticConfig",
    "SemanticFold",
    "SemanticReport",
    "fact_guard",
    "fold_line",
    "fold_semantic",
    "for_model",
    "semantic_fold",
]

log = logging.getLogger(__name__)

#: The alias status of an id folded by layer C (``stats`` counts them as ``semantic``).
MERGE_STATUS: Final = "semantic_duplicate"

#: Words that turn a statement around or announce a change, whatever the embedding says.
NEGATIONS: Final[frozenset[str]] = frozenset(
    {
        "not", "no", "never", "t", "nt", "cannot", "cant", "won", "none", "nothing", "nobody",
        "without", "neither", "nor", "un", "dis", "stop", "stopped", "anymore", "yet",
    }
)  # fmt: skip

_MONTHS: Final[frozenset[str]] = frozenset(
    "january february march april may june july august september october november december "
    "jan feb mar apr jun jul aug sep sept oct nov dec".split()
)
#: "blocked"/"unblocked", "enable"/"disable": words that differ only by these prefixes.
_ANTONYM_PREFIXES: Final = ("un", "dis", "non", "in", "im", "de", "en")
_WORD_RE: Final = re.compile(r"[^\W_]+(?:['’][^\W_]+)*", re.UNICODE)
_SENTENCE_END: Final = frozenset(".!?:;\n")


def _positive(name: str, value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value):
        raise ConfigError(f"semantic.{name}: expected a number of seconds, got {value!r}")
    if value <= 0:
        raise ConfigError(f"semantic.{name}: {value!r} must be > 0 (use math.inf for no limit)")


@dataclass(frozen=True, slots=True, kw_only=True)
class SemanticConfig:
    """Settings of layer C.

    - ``enabled``: fold after each embedding batch of the engine (``Engine.embed_pending``, the
      background embedder). Off by default: a fold erases X's wording, and the development log
      holds no reworded families to show the gain, only the risk. ``ctxwarden dedupe
      --semantic`` runs it over a store whatever this says.
    - ``threshold``: the least cosine of the two embeddings. ``None`` (the default): the line
      measured for the model whose vectors are folded (:func:`fold_line`: 0.98 for MiniLM's
      int8 path, 0.985 otherwise; see the module docstring).
    - ``window_seconds``: how long after Y was last seen X may arrive (default 1 h, like layer B).
    - ``fold_bot_values``: a bot's differing volatile values fold (layer B's rule 6).

    >>> SemanticConfig(threshold=1.5)
    Traceback (most recent call last):
    ...
    ctxwarden.errors.ConfigError: semantic.threshold: 1.5 must be in (0, 1], e.g. 0.98 (a cosine)
    """

    enabled: bool = False
    threshold: float | None = None
    window_seconds: float = 3600.0
    fold_bot_values: bool = True

    def __post_init__(self) -> None:
        for name in ("enabled", "fold_bot_values"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(
                    f"semantic.{name}: expected true or false, got {getattr(self, name)!r}"
                )
        threshold = self.threshold
        if threshold is None:
            _positive("window_seconds", self.window_seconds)
            return
        if isinstance(threshold, bool) or not isinstance(threshold, int | float):
            raise ConfigError(f"semantic.threshold: expected a number, got {threshold!r}")
        if not 0 < threshold <= 1:
            raise ConfigError(
                f"semantic.threshold: {threshold!r} must be in (0, 1], e.g. 0.98 (a cosine)"
            )
        _positive("window_seconds", self.window_seconds)


#: The threshold measured per vector model (``bench/dedupe_quality.py``, docs/benchmarks.md):
#: MiniLM on int8 activations scores near-repeats 0.005-0.01 lower than its float path.
_MEASURED_LINES: Final = {"minilm-l6-int8@2": 0.98}
#: The line of any other model (measured on MiniLM's float path, ``minilm-l6-int8@1``).
DEFAULT_LINE: Final = 0.985


def fold_line(model: str | None) -> float:
    """The default threshold for vectors of ``model`` (its name, ``/t<n>`` suffix and all).

    >>> fold_line("minilm-l6-int8@2"), fold_line("minilm-l6-int8@1"), fold_line(None)
    (0.98, 0.985, 0.985)
    """
    base = (model or "").split("/", 1)[0]
    return _MEASURED_LINES.get(base, DEFAULT_LINE)


def for_model(config: SemanticConfig, model: str | None) -> SemanticConfig:
    """``config`` with its threshold set: its own, else :func:`fold_line` of ``model``."""
    if config.threshold is not None:
        return config
    return dataclasses.replace(config, threshold=fold_line(model))


def _line(config: SemanticConfig) -> float:
    return DEFAULT_LINE if config.threshold is None else config.threshold


@dataclass(frozen=True, slots=True, kw_only=True)
class SemanticFold:
    """One fold: memory ``id`` (rowid ``rowid``) into ``into`` at cosine ``score``."""

    tenant: str
    channel: str | None
    id: str
    rowid: int
    into: str
    into_rowid: int
    score: float
    content: str
    into_content: str
    #: What the aggregate shows as its newest value if this member was seen last: this
    #: member's newest text when its volatile values differ from the aggregate's, else None.
    latest_content: str | None


@dataclass(slots=True)
class SemanticReport:
    """What a pass did: memories looked at, folds made (or planned, in a dry run), and how many
    candidates above the threshold the guard refused."""

    examined: int = 0
    folds: list[SemanticFold] = field(default_factory=list)
    refused: int = 0


def dedupable(memory: Memory) -> bool:
    """Whether a stored memory may fold or be folded into (the ingest rule, plus not pinned)."""
    return (
        memory.kind == "message"
        and not memory.pinned
        and not memory.tool_calls
        and memory.role not in ("tool", "assistant")  # an agent's transcript never folds
        and not memory.content_hash.startswith(UNFOLDABLE)  # e.g. ingested with fold=False
        and memory.author_kind != "tool"
        and not is_untrusted(memory.metadata)
        and bool(memory.content.strip())
    )


def _names(text: str) -> set[str]:
    """Words capitalised in the middle of a sentence (names: "Ana", "Postgres", "A")."""
    names: set[str] = set()
    start = True
    position = 0
    for match in _WORD_RE.finditer(text):
        between = text[position : match.start()]
        if any(c in _SENTENCE_END for c in between):
            start = True
        word = match.group()
        if not start and word[:1].isupper():
            names.add(word.lower())
        start = False
        position = match.end()
    return names


def _words(text: str) -> tuple[set[str], tuple[str, ...], tuple[str, ...]]:
    masked, values = mask_volatile_values(canonical(text))
    tokens = skeleton(masked)
    return set(tokens), values, tokens


def _stems(word: str) -> set[str]:
    """The word and what is left of it without one of :data:`_ANTONYM_PREFIXES` (at least 3
    letters, so "in"/"un" alone or "dent"/"indent" noise stays rare)."""
    out = {word}
    for prefix in _ANTONYM_PREFIXES:
        if word.startswith(prefix) and len(word) - len(prefix) >= 3:
            out.add(word[len(prefix) :])
    return out


def _fact_word(token: str) -> bool:
    return (
        token in NEGATIONS
        or token in BOT_CHANGE_WORDS
        or token in _MONTHS
        or token.startswith("<")
        or any(c.isdigit() for c in token)
        or not any(c.isalnum() for c in token)  # symbols, emoji, "?"
        or token.startswith(("@", "#"))
    )


def fact_guard(new: str, old: str, *, author_kind: str, fold_bot_values: bool = True) -> str | None:
    """Why two texts must not fold whatever their embeddings say (``None``: nothing found).

    >>> fact_guard("standup is now at 10:30, not 8:15", "standup is now at 8:15, not 9:45",
    ...            author_kind="human")
    'values-differ: 10:30 8:15 / 8:15 9:45'
    >>> fact_guard("could someone review my PR", "can someone please review my PR",
    ...            author_kind="human") is None
    True
    """
    new_set, new_values, new_tokens = _words(new)
    old_set, old_values, old_tokens = _words(old)
    if sorted(new_values) != sorted(old_values):
        detail = f"{' '.join(new_values)} / {' '.join(old_values)}"
        if author_kind != "bot" or not fold_bot_values:
            return f"values-differ: {detail}"
        for tokens in (new_tokens, old_tokens):
            change = next((t for t in tokens if t in BOT_CHANGE_WORDS), None)
            if change is not None:
                return f"change-language ({change}): {detail}"
        if len(new_values) != len(old_values):
            return f"values-differ: {detail}"
    differing = new_set ^ old_set
    if differing and author_kind == "bot":
        # A bot's text is a template: another word is another event ("to staging" / "to
        # production"), as layer B, which folds a bot only on equal skeletons, holds.
        return f"bot-words-differ: {' '.join(sorted(differing))}"
    facts = sorted(t for t in differing if _fact_word(t))
    if facts:
        return f"words-differ: {' '.join(facts)}"
    stems: dict[str, str] = {}
    for word in sorted(differing):
        for stem in _stems(word):
            other = stems.setdefault(stem, word)
            if other != word:
                return f"opposites: {other} / {word}"
    names = _names(new) ^ _names(old)
    if names:
        return f"names-differ: {' '.join(sorted(names))}"
    return None


def semantic_fold(
    new: Memory,
    old: Memory,
    score: float,
    config: SemanticConfig,
) -> str | None:
    """Whether ``new`` may fold into ``old`` at cosine ``score``: ``None`` if it may, else why not.

    Pure: the rules of the module docstring (tenant, channel, author, kinds, window, threshold,
    :func:`fact_guard`).
    """
    if new.tenant != old.tenant:
        return "different-tenant"
    if new.channel != old.channel:
        return "different-channel"
    if new.channel is None and (new.session != old.session or new.user != old.user):
        # No channel: each session's (and end user's) own conversation (issue 16).
        return "different-conversation"
    if (new.author or "") != (old.author or ""):
        return "different-author"
    if new.rowid == old.rowid:
        return "same-memory"
    if not dedupable(new) or not dedupable(old):
        return "not-dedupable"
    if (new.created_at, new.rowid) < (old.created_at, old.rowid):
        return "newer-target"
    if new.created_at - old.last_seen_at > config.window_seconds:
        return "outside-window"
    if score < _line(config):
        return f"below-threshold: {score:.4f}"
    if (
        DedupeCandidate.build(
            author=new.author, author_kind=new.author_kind, content=new.content
        ).exact_key
        == DedupeCandidate.build(
            author=old.author, author_kind=old.author_kind, content=old.content
        ).exact_key
    ):
        return None
    return fact_guard(
        new.content,
        old.content,
        author_kind=new.author_kind if new.author_kind == old.author_kind else "human",
        fold_bot_values=config.fold_bot_values,
    )


def _values(memory: Memory, text: str) -> tuple[str, ...]:
    return DedupeCandidate.build(
        author=memory.author, author_kind=memory.author_kind, content=text
    ).values


def _latest(new: Memory, old: Memory) -> str | None:
    """Layer B's ``latest_content`` rule: the newest text, kept only when its values differ from
    the aggregate's own (the value now in force); a reworded text with the same values is not
    kept, so the folded wording leaves the store."""
    newest = new.latest_content if new.latest_content is not None else new.content
    return newest if _values(new, newest) != _values(old, old.content) else None


class _Window(Protocol):
    def __call__(
        self, memory: Memory, since: float
    ) -> list[tuple[Memory, npt.NDArray[np.float32]]]: ...


def fold_semantic(
    memories: Iterable[Memory],
    window: _Window,
    config: SemanticConfig,
    *,
    merge: Callable[[SemanticFold], bool] | None,
    progress: Callable[[int], None] | None = None,
) -> SemanticReport:
    """Fold each of ``memories`` (oldest first) into its best older neighbour, if any may.

    ``window(memory, since)`` returns the memories of ``memory``'s tenant, channel and author
    last seen at or after ``since`` and created no later than ``memory`` (itself included), each
    with its vector. ``merge`` writes one fold (None: a dry run, which remembers what it would
    have folded so the plan matches a real run). The best-scoring candidate that passes is taken;
    ties go to the oldest.
    """
    report = SemanticReport()
    gone: set[int] = set()
    for count, memory in enumerate(memories, 1):
        if progress is not None and count % 500 == 0:
            progress(count)
        if memory.rowid in gone or not dedupable(memory):
            continue
        report.examined += 1
        since = memory.created_at - config.window_seconds
        rows = [(m, v) for m, v in window(memory, since) if m.rowid not in gone]
        own = next((v for m, v in rows if m.rowid == memory.rowid), None)
        if own is None:
            continue  # not embedded (yet), or removed meanwhile
        older = [
            (m, v) for m, v in rows if (m.created_at, m.rowid) < (memory.created_at, memory.rowid)
        ]
        if not older:
            continue
        matrix = np.stack([v for _, v in older]).astype(np.float32)
        norms = np.linalg.norm(matrix, axis=1) * max(float(np.linalg.norm(own)), 1e-12)
        scores = (matrix @ own.astype(np.float32)) / np.maximum(norms, 1e-12)
        order = sorted(range(len(older)), key=lambda i: (-float(scores[i]), older[i][0].rowid))
        for i in order:
            score = float(scores[i])
            if score < _line(config):
                break
            target = older[i][0]
            why = semantic_fold(memory, target, score, config)
            if why is not None:
                report.refused += 1
                log.debug("semantic: %s not into %s: %s", memory.id, target.id, why)
                continue
            fold = SemanticFold(
                tenant=memory.tenant,
                channel=memory.channel,
                id=memory.id,
                rowid=memory.rowid,
                into=target.id,
                into_rowid=target.rowid,
                score=score,
                content=memory.content,
                into_content=target.content,
                latest_content=_latest(memory, target),
            )
            if merge is None or merge(fold):
                report.folds.append(fold)
                gone.add(memory.rowid)
            break
    return report


def families(folds: Sequence[SemanticFold], top: int = 10) -> list[tuple[str, int, str]]:
    """The largest folded families: ``(aggregate id, members folded, aggregate text)``."""
    root: dict[str, str] = {}
    text: dict[str, str] = {}
    for fold in folds:
        root[fold.id] = root.get(fold.into, fold.into)
        text.setdefault(root[fold.id], fold.into_content)
    counts: dict[str, int] = {}
    for target in root.values():
        counts[target] = counts.get(target, 0) + 1
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:top]
    return [(id_, n, text[id_]) for id_, n in ranked]
