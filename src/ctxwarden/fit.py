"""Which parts of a client's conversation go upstream: :class:`Unit`, :class:`Fitted`, :func:`fit`.

PROVISIONAL COPY on branch ``apis``: the interface is the one fixed in the team's fit interface
(owned by branch ``proxy``); this file stands in until that branch's ``fit.py`` is merged, and
is replaced by it then.

Pure: no I/O. Each wire format's adapter turns a request into units with their token costs;
:func:`fit` chooses; the adapter renders the kept originals.

>>> units = [Unit(start=0, stop=1, tokens=10, kind="system"),
...          Unit(start=1, stop=3, tokens=50, kind="turn"),
...          Unit(start=3, stop=4, tokens=20, kind="turn")]
>>> fit(units, cap=100, fixed=5).unchanged
True
>>> fit(units, cap=60, fixed=5).keep
(0, 2)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from ctxwarden.errors import BudgetError

__all__ = ["Fitted", "Unit", "fit"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Unit:
    """An atomic run of the conversation, kept or dropped whole.

    ``start``/``stop``: its items in the client's list; ``tokens``: their cost as sent;
    ``kind``: ``"system"`` (a leading system/developer message) or ``"turn"`` (a user message
    and everything up to the next user message that starts a turn).
    """

    start: int
    stop: int
    tokens: int
    kind: Literal["system", "turn"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Fitted:
    """What :func:`fit` chose: indices into the units, the total, and why."""

    keep: tuple[int, ...]
    dropped: tuple[int, ...]
    tokens: int
    unchanged: bool
    notes: tuple[str, ...]


def fit(
    units: Sequence[Unit],
    *,
    cap: int,
    fixed: int,
    memory_tokens: int = 0,
    keep_fraction: float = 0.6,
) -> Fitted:
    """Keep everything if it fits ``cap``; else the system units and the last turn always, and
    older turns dropped oldest first, cut at multiples of ``(1 - keep_fraction) * cap`` of the
    conversation's own prefix so the next request of a growing conversation cuts at the same place.

    Raises :class:`BudgetError` when the always-kept part alone exceeds ``cap``.
    """
    total = fixed + memory_tokens + sum(u.tokens for u in units)
    everything = tuple(range(len(units)))
    if total <= cap:
        return Fitted(keep=everything, dropped=(), tokens=total, unchanged=True, notes=())
    turns = [i for i, u in enumerate(units) if u.kind == "turn"]
    always = {i for i, u in enumerate(units) if u.kind == "system"}
    if turns:
        always.add(turns[-1])
    floor = fixed + memory_tokens + sum(units[i].tokens for i in always)
    if floor > cap:
        raise BudgetError(
            f"the conversation does not fit: the system part and the newest turn take {floor} "
            f"tokens (fixed {fixed}, memory {memory_tokens}) against a cap of {cap}; shorten "
            "the newest turn or use a model with a larger window"
        )
    droppable = turns[:-1]
    step = max(1, int((1.0 - keep_fraction) * cap))
    # cumulative cost of the droppable turns, oldest first: a pure function of the prefix
    cumulative: list[int] = []
    running = 0
    for i in droppable:
        running += units[i].tokens
        cumulative.append(running)
    rest = total
    cut = 0  # number of droppable turns dropped
    k = 1
    while rest > cap:
        threshold = k * step
        cut = next((n + 1 for n, c in enumerate(cumulative) if c >= threshold), len(droppable))
        rest = total - (cumulative[cut - 1] if cut else 0)
        k += 1
    dropped = tuple(droppable[:cut])
    keep = tuple(i for i in everything if i not in set(dropped))
    notes = (
        f"dropped the {cut} oldest turn(s) ({total - rest} tokens) to fit {total} tokens "
        f"into a cap of {cap}",
    )
    return Fitted(keep=keep, dropped=dropped, tokens=rest, unchanged=False, notes=notes)
