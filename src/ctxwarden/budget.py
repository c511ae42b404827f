"""Token budgets: how a model's window is split between the blocks of a context.

A :class:`BudgetPolicy` is a small value object: named :class:`Block` s with a percentage share, a
floor and a hard cap, plus the response reserve and the safety margin that come off the window
before any block is filled. One policy works at 8k and at 256k because shares scale and floors and
caps bound them.

The rule for unused tokens (documented, and the one :func:`allocate` implements):

1. The cap is ``budget`` if given, else ``window - reserve - margin`` (and never more than that).
   Fixed costs (system prompt, tool schemas, the current query, the chat template's per-request
   tokens) come off first; what is left is *available*.
2. Floors: blocks in priority order (highest first) get ``min(floor, demand)`` while tokens last.
   So under pressure the least important blocks lose their floor first: that is the overflow
   order (related, then summaries, then persistent, recent last).
3. Shares, floors included: every block with a share is raised to one common level, getting
   ``share x level`` tokens or its floor, whichever is more, up to its cap and its demand; the
   level is the highest the available tokens allow. So a floor is part of a block's share, not
   added to it (recent gets its floor or its share, whichever is more), and what a block needs
   less than its share of stays with the others by their shares ("water-filling"). Zero-share
   blocks get what is left only when every block with a share has all it wants.
4. Ratios: where the policy says ``related >= 1.5 x recent`` and both still want more, tokens move
   from recent to related until the ratio holds (recent keeps its floor).

Percentages are of *available*; floors and caps are tokens.

>>> policy = chat_policy()
>>> alloc = allocate(policy, available=1000, demand={"related": 5000, "recent": 5000})
>>> alloc["related"] >= 1.5 * alloc["recent"]
True
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from ctxwarden.errors import BudgetError

__all__ = [
    "Block",
    "BudgetPolicy",
    "Limits",
    "allocate",
    "chat_policy",
    "policy_from_mapping",
    "preset",
    "research_policy",
]

Source = Literal["pinned", "summaries", "retrieval", "recent", "items"]
SOURCES: frozenset[str] = frozenset({"pinned", "summaries", "retrieval", "recent", "items"})


@dataclass(frozen=True, kw_only=True, slots=True)
class Block:
    """One block of a context.

    ``share`` is a percentage of the tokens available after fixed costs; ``floor`` tokens are
    guaranteed when the block has that much material and the budget allows; ``cap`` (tokens) is a
    hard ceiling. ``priority`` orders floors and overflow: higher is kept longer. ``source`` says
    where the material comes from: pinned memories, summaries, retrieval for the query, the
    session's recent history, or caller-supplied items for this block name.

    >>> Block(name="related", share=45, source="retrieval").share
    45
    """

    name: str
    share: float
    source: Source
    floor: int = 0
    cap: int | None = None
    priority: int = 50
    title: str | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class Limits:
    """The token limits of one context: the model's window and what comes off it."""

    window: int
    reserve: int
    margin: int
    cap: int


@dataclass(frozen=True, kw_only=True, slots=True)
class BudgetPolicy:
    """How a context's tokens are split.

    ``reserve_share`` percent of the window (bounded by ``reserve_min`` and ``reserve_max``) is kept
    for the model's reply; ``margin_share`` percent (at least ``margin_min`` tokens) is a safety
    margin. ``min_recent_messages`` newest messages are kept even past the recent block's share
    (they are the conversation). ``ratios`` holds rules ``(a, b, k)``: block ``a`` gets at least
    ``k`` times block ``b`` when both have more material than they were given.
    """

    name: str = "custom"
    blocks: tuple[Block, ...]
    reserve_share: float = 10.0
    reserve_min: int = 256
    reserve_max: int = 8192
    margin_share: float = 1.0
    margin_min: int = 16
    min_recent_messages: int = 2
    ratios: tuple[tuple[str, str, float], ...] = ()
    extra: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise :class:`BudgetError` naming the first invalid field."""
        if not self.blocks:
            raise BudgetError("budget.blocks: a policy needs at least one block")
        seen: set[str] = set()
        total = 0.0
        for block in self.blocks:
            where = f"budget.blocks[{block.name}]"
            if not block.name or not block.name.replace("_", "").replace("-", "").isalnum():
                raise BudgetError(f"{where}.name: use letters, digits, '_' or '-'")
            if block.name in seen:
                raise BudgetError(f"{where}.name: defined twice")
            seen.add(block.name)
            if block.source not in SOURCES:
                raise BudgetError(
                    f"{where}.source: {block.source!r} is not one of {', '.join(sorted(SOURCES))}"
                )
            if not 0 <= block.share <= 100:
                raise BudgetError(f"{where}.share: {block.share} must be between 0 and 100")
            if block.floor < 0:
                raise BudgetError(f"{where}.floor: {block.floor} is negative")
            if block.cap is not None:
                if block.cap < 0:
                    raise BudgetError(f"{where}.cap: {block.cap} is negative")
                if block.cap < block.floor:
                    raise BudgetError(
                        f"{where}.cap: {block.cap} is below the floor ({block.floor})"
                    )
            total += block.share
        if total > 100.0 + 1e-9:
            raise BudgetError(f"budget.blocks: shares add up to {total:g} %, over 100 %")
        for name in ("reserve_share", "margin_share"):
            value = getattr(self, name)
            if not 0 <= value < 100:
                raise BudgetError(f"budget.{name}: {value} must be at least 0 and below 100")
        for name in ("reserve_min", "reserve_max", "margin_min", "min_recent_messages"):
            if getattr(self, name) < 0:
                raise BudgetError(f"budget.{name}: {getattr(self, name)} is negative")
        if self.reserve_max < self.reserve_min:
            raise BudgetError(
                f"budget.reserve_max: {self.reserve_max} is below reserve_min ({self.reserve_min})"
            )
        for a, b, k in self.ratios:
            if a not in seen or b not in seen:
                raise BudgetError(f"budget.ratios: ({a}, {b}) names a block the policy lacks")
            if k <= 0:
                raise BudgetError(f"budget.ratios: factor {k} for ({a}, {b}) must be positive")

    def block(self, name: str) -> Block | None:
        """The block called ``name``, if any."""
        return next((b for b in self.blocks if b.name == name), None)

    def limits(
        self, *, window: int, budget: int | None = None, max_output: int | None = None
    ) -> Limits:
        """The cap for a model with ``window`` tokens, and optionally a caller's ``budget``.

        The reserve is ``reserve_share`` of the window within [reserve_min, reserve_max] (and no
        more than the model's ``max_output`` when known). Raises :class:`BudgetError` when the
        reserve and margin leave nothing, or ``budget`` is not positive.

        >>> chat_policy().limits(window=8192)
        Limits(window=8192, reserve=819, margin=81, cap=7292)
        """
        if window <= 0:
            raise BudgetError(f"budget.window: {window} must be positive")
        reserve = int(window * self.reserve_share / 100)
        reserve = max(self.reserve_min, min(self.reserve_max, reserve))
        if max_output is not None and max_output > 0:
            reserve = min(reserve, max_output)
        margin = max(self.margin_min, int(window * self.margin_share / 100))
        if reserve >= window:
            raise BudgetError(
                f"budget.reserve: {reserve} tokens is not below the window ({window}); "
                "lower reserve_min or reserve_share"
            )
        cap = window - reserve - margin
        if cap <= 0:
            raise BudgetError(
                f"budget.margin: reserve ({reserve}) and margin ({margin}) leave no room "
                f"in a window of {window}"
            )
        if budget is not None:
            if budget <= 0:
                raise BudgetError(f"budget: {budget} must be a positive number of tokens")
            cap = min(cap, budget)
        return Limits(window=window, reserve=reserve, margin=margin, cap=cap)


def allocate(policy: BudgetPolicy, *, available: int, demand: Mapping[str, int]) -> dict[str, int]:
    """Split ``available`` tokens between the policy's blocks by the documented rule.

    ``demand`` is how many tokens of material each block has (missing means none). Pure: the
    same inputs give the same split. Never gives a block more than its demand or its cap, and
    never more than ``available`` in all.

    >>> allocate(chat_policy(), available=100, demand={"recent": 30, "related": 1000})
    {'persistent': 0, 'summaries': 0, 'related': 70, 'recent': 30, 'scratch': 0}
    """
    available = max(0, available)
    limit = {
        b.name: max(0, min(demand.get(b.name, 0), b.cap if b.cap is not None else 1 << 62))
        for b in policy.blocks
    }
    alloc = dict.fromkeys(limit, 0)
    floors = dict.fromkeys(limit, 0)
    left = available
    # 2. Floors, most important first: the least important lose theirs first under pressure.
    for block in sorted(policy.blocks, key=lambda b: (-b.priority, _index(policy, b.name))):
        give = min(block.floor, limit[block.name], left)
        alloc[block.name] += give
        floors[block.name] = give
        left -= give
    # 3. Shares, floors included: every block with a share is raised to one common level,
    # ``min(limit, max(floor given, share * level))``, the highest level the tokens allow. A
    # block's floor counts toward its share (recent gets 160 tokens or its share of the window,
    # whichever is more; not 160 plus a share of the rest), and what a block cannot use (no
    # demand, or its cap) stays with the others by their shares ("water-filling").
    shares = {b.name: b.share for b in policy.blocks}
    sharing = [n for n in alloc if shares[n] > 0 and alloc[n] < limit[n]]
    if sharing and left > 0:

        def extra(level: float) -> int:
            return sum(max(0, min(limit[n], int(shares[n] * level)) - alloc[n]) for n in sharing)

        low, high = 0.0, max(limit[n] / shares[n] for n in sharing) + 1.0
        if extra(high) <= left:
            low = high
        else:
            for _ in range(64):
                middle = (low + high) / 2
                if extra(middle) <= left:
                    low = middle
                else:
                    high = middle
        for name in sharing:
            give = max(0, min(limit[name], int(shares[name] * low)) - alloc[name])
            alloc[name] += give
            left -= give
        # Rounding leaves a few tokens: one block at a time, most important first.
        for name in _by_priority(policy, sharing):
            give = min(limit[name] - alloc[name], left)
            alloc[name] += give
            left -= give
    if left > 0:
        # Only zero-share blocks want more: give them what is left, in priority order.
        for name in _by_priority(policy, [n for n in alloc if alloc[n] < limit[n]]):
            give = min(limit[name] - alloc[name], left)
            alloc[name] += give
            left -= give
    # 4. Ratio rules: a >= k * b when both still want more; b keeps its floor.
    for a, b, k in policy.ratios:
        if alloc[a] < limit[a] and alloc[b] < limit[b] and alloc[a] < k * alloc[b]:
            total = alloc[a] + alloc[b]
            target_b = max(int(total / (1 + k)), min(floors[b], alloc[b]))
            target_a = min(limit[a], total - target_b)
            alloc[b] = total - target_a
            alloc[a] = target_a
    return alloc


def _index(policy: BudgetPolicy, name: str) -> int:
    return next(i for i, b in enumerate(policy.blocks) if b.name == name)


def _by_priority(policy: BudgetPolicy, names: Iterable[str]) -> list[str]:
    wanted = set(names)
    return [
        b.name
        for b in sorted(policy.blocks, key=lambda b: (-b.priority, _index(policy, b.name)))
        if b.name in wanted
    ]


def chat_policy(**overrides: Any) -> BudgetPolicy:
    """The chat agent's policy: persistent, summaries, related, recent, scratch.

    The system prompt is a fixed cost, not a block. Recent history gets 15 % (its floor of 160
    tokens at small budgets, four chat turns of ~40 tokens: the newest turns stay), related
    memory 60 %: the question is answered from related memory far more often than from the last
    few turns (issue 18: at 2k, 39 % of the budget on the newest turns held 2 % of the
    evidence), and the seeds keep recent at 12-22 % of the context. With history and related
    memory alone recent holds 20 % (15 of 75) from a 1k budget on: the floor is below that
    share there (256, until issue 18's second pass, made it 26 % of a 1k budget, over the
    seeds' 22 %). Related gets at least 1.5x recent when both have more material than fits;
    recent keeps at least two messages and is shortened last.
    """
    fields: dict[str, Any] = {
        "name": "chat",
        "blocks": (
            Block(
                name="persistent",
                share=10,
                source="pinned",
                floor=256,
                priority=80,
                title="Persistent memory",
            ),
            Block(
                name="summaries",
                share=10,
                source="summaries",
                priority=60,
                title="Summaries of earlier conversation",
            ),
            Block(
                name="related",
                share=60,
                source="retrieval",
                priority=40,
                title="Related earlier messages",
            ),
            Block(name="recent", share=15, source="recent", floor=160, priority=90),
            Block(name="scratch", share=5, source="items", priority=30, title="Scratch"),
        ),
        "ratios": (("related", "recent", 1.5),),
    }
    fields.update(overrides)
    return BudgetPolicy(**fields)


def research_policy(**overrides: Any) -> BudgetPolicy:
    """The research agent's policy: task, subtask, checkpoints, findings, history, rag, url_refs.

    ``task``, ``subtask``, ``checkpoints`` and ``url_refs`` are caller-supplied items; findings
    are pinned memories (facts); history is the session's recent turns; rag is retrieval.
    """
    fields: dict[str, Any] = {
        "name": "research",
        "blocks": (
            Block(name="task", share=5, source="items", floor=64, priority=95, title="Task"),
            Block(
                name="subtask",
                share=5,
                source="items",
                floor=64,
                priority=92,
                title="Current subtask",
            ),
            Block(name="checkpoints", share=10, source="items", priority=70, title="Checkpoints"),
            Block(name="findings", share=20, source="pinned", priority=75, title="Findings"),
            Block(name="history", share=25, source="recent", floor=256, priority=90),
            Block(
                name="rag", share=30, source="retrieval", priority=40, title="Retrieved material"
            ),
            Block(name="url_refs", share=5, source="items", priority=30, title="References"),
        ),
    }
    fields.update(overrides)
    return BudgetPolicy(**fields)


_PRESETS = {"chat": chat_policy, "research": research_policy}


def preset(name: str) -> BudgetPolicy:
    """A named preset policy (``chat`` or ``research``)."""
    try:
        return _PRESETS[name]()
    except KeyError:
        raise BudgetError(
            f"budget.preset: {name!r} is unknown; use one of {', '.join(sorted(_PRESETS))}"
        ) from None


def policy_from_mapping(data: Mapping[str, Any]) -> BudgetPolicy:
    """Build a policy from config (e.g. a TOML table), validating every field.

    ``{"preset": "chat", "reserve_share": 5}`` starts from a preset; ``blocks`` replaces the
    preset's blocks with a list of ``{name, share, source, floor, cap, priority, title}``.
    """
    if not isinstance(data, Mapping):
        raise BudgetError("budget: expected a table of settings")
    values = dict(data)
    base = preset(str(values.pop("preset", "chat")))
    fields: dict[str, Any] = {
        "name": values.pop("name", base.name),
        "blocks": base.blocks,
        "ratios": base.ratios,
    }
    if "blocks" in values:
        raw = values.pop("blocks")
        if not isinstance(raw, list):
            raise BudgetError("budget.blocks: expected a list of blocks")
        blocks = []
        for index, item in enumerate(raw):
            if not isinstance(item, Mapping):
                raise BudgetError(f"budget.blocks[{index}]: expected a table")
            unknown = set(item) - {"name", "share", "source", "floor", "cap", "priority", "title"}
            if unknown:
                raise BudgetError(f"budget.blocks[{index}].{sorted(unknown)[0]}: unknown field")
            try:
                blocks.append(Block(**item))
            except TypeError as exc:
                raise BudgetError(f"budget.blocks[{index}]: {exc}") from None
        fields["blocks"] = tuple(blocks)
        fields["ratios"] = tuple(r for r in base.ratios if {r[0], r[1]} <= {b.name for b in blocks})
    if "ratios" in values:
        fields["ratios"] = tuple(tuple(r) for r in values.pop("ratios"))
    allowed = {
        "reserve_share",
        "reserve_min",
        "reserve_max",
        "margin_share",
        "margin_min",
        "min_recent_messages",
    }
    for key, value in values.items():
        if key not in allowed:
            raise BudgetError(f"budget.{key}: unknown field")
        if not isinstance(value, int | float) or isinstance(value, bool):
            raise BudgetError(f"budget.{key}: expected a number, got {value!r}")
        fields[key] = value
    return BudgetPolicy(**fields)
