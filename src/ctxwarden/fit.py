"""Which parts of a client's conversation go upstream: the fitting core of every proxy API.

Pure: no I/O, no engine, no store. Each wire format (chat completions, Responses, Anthropic
Messages) has an adapter that groups the request into :class:`Unit` s (runs of messages that are
kept or dropped whole), counts them with the model's real tokenizer and chat format, and calls
:func:`fit`; the adapter then forwards the kept originals byte-for-byte.

The rules :func:`fit` keeps:

- everything fits (``fixed + sum(units) + memory_tokens <= cap``): everything is kept,
  ``unchanged=True``;
- otherwise the leading ``"system"`` units and the last unit (the newest user turn and all after
  it) are always kept, and older turns are dropped oldest first, in large steps: the cut is at
  the first turn boundary whose cumulative token count (of the turns between the system units
  and the last turn, counted from the oldest) reaches ``k * step`` with
  ``step = (1 - keep_fraction) * cap`` and the smallest ``k`` that fits. The cut points depend
  only on the conversation's own prefix and on ``cap``, so a conversation that grows by
  appending is cut at the same place on the next request, and providers' prompt caches see a
  prefix that only grows until the next large step;
- if the always-kept part alone exceeds the cap, :class:`~ctxwarden.errors.BudgetError` names
  the token counts (the proxy answers 400 ``context_length_exceeded``).

The retrieved-memory block is never a unit: an adapter inserts it as one message directly after
the leading system units and passes its tokens as ``memory_tokens``.

>>> units = [Unit(start=0, stop=1, tokens=10, kind="system"),
...          Unit(start=1, stop=3, tokens=50, kind="turn"),
...          Unit(start=3, stop=4, tokens=50, kind="turn"),
...          Unit(start=4, stop=6, tokens=30, kind="turn")]
>>> fit(units, cap=200, fixed=5).unchanged
True
>>> fit(units, cap=100, fixed=5).keep
(0, 2, 3)
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate
from operator import attrgetter
from typing import Literal

from ctxwarden.errors import BudgetError, ConfigError, InputError

__all__ = ["Fitted", "Lead", "Unit", "fit", "turn_spans"]

#: What starts a message's place in a conversation, for :func:`turn_spans`.
Lead = Literal["system", "user", "other"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Unit:
    """An atomic run of the conversation, kept or dropped whole.

    ``start``/``stop``: the indices of its first message (input item) in the client's list and
    one past its last. ``tokens``: the cost of those messages as sent, per-message template
    overhead included. ``kind``: ``"system"`` for a leading system/developer message (only
    leading ones), ``"turn"`` for a user message and everything after it up to the next user
    message that starts a new turn (so tool calls and their results share a unit); messages
    before the first user message form one turn of their own.
    """

    start: int
    stop: int
    tokens: int
    kind: Literal["system", "turn"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Fitted:
    """What :func:`fit` chose: indices into the units, ascending, and why.

    ``tokens`` is ``fixed`` + the kept units + ``memory_tokens``; ``unchanged`` is True when
    every unit is kept; ``notes`` say why (for the proxy's report).
    """

    keep: tuple[int, ...]
    dropped: tuple[int, ...]
    tokens: int
    unchanged: bool
    notes: tuple[str, ...]


_TOKENS = attrgetter("tokens")


def turn_spans(leads: Sequence[Lead]) -> list[tuple[int, int, Literal["system", "turn"]]]:
    """Group a conversation into ``(start, stop, kind)`` spans for :class:`Unit` s.

    ``leads[i]`` says what message ``i`` is: ``"system"`` (a system/developer message; only a
    leading run becomes ``"system"`` spans, one per message, later ones belong to their turn),
    ``"user"`` (a user message that starts a new turn) or ``"other"`` (anything that continues
    the current turn: assistant replies, tool calls, tool results, Anthropic's tool-result
    user messages).

    >>> turn_spans(["system", "user", "other", "other", "user", "other"])
    [(0, 1, 'system'), (1, 4, 'turn'), (4, 6, 'turn')]
    >>> turn_spans(["other", "user"])
    [(0, 1, 'turn'), (1, 2, 'turn')]
    """
    spans: list[tuple[int, int, Literal["system", "turn"]]] = []
    index = 0
    while index < len(leads) and leads[index] == "system":
        spans.append((index, index + 1, "system"))
        index += 1
    start = index
    for position in range(index + 1, len(leads)):
        if leads[position] == "user":
            spans.append((start, position, "turn"))
            start = position
    if start < len(leads):
        spans.append((start, len(leads), "turn"))
    return spans


def _check(tokens: Sequence[int], cap: int, fixed: int, memory: int, keep: float) -> None:
    if not 0.0 <= keep < 1.0 or math.isnan(keep):
        raise ConfigError(f"keep_fraction: {keep} must be at least 0 and below 1")
    for name, value in (("cap", cap), ("fixed", fixed), ("memory_tokens", memory)):
        if value < 0:
            raise InputError(f"{value} must not be negative", field=name)
    if tokens and min(tokens) < 0:
        index = next(i for i, count in enumerate(tokens) if count < 0)
        raise InputError(f"{tokens[index]} must not be negative", field=f"units[{index}].tokens")


def fit(
    units: Sequence[Unit],
    *,
    cap: int,
    fixed: int,
    memory_tokens: int = 0,
    keep_fraction: float = 0.6,
) -> Fitted:
    """Choose the units that go upstream within ``cap`` tokens (see the module's rules).

    ``fixed``: tokens sent whatever is chosen (request overhead, tool schemas, reply priming).
    ``memory_tokens``: the retrieved-memory block's tokens (0 without one). ``keep_fraction``:
    when trimming, the cut moves in steps of ``(1 - keep_fraction) * cap`` tokens, so about that
    much can be appended before the next cut.

    Linear in the number of units, with the sums done by C builtins (a 20,000-message
    conversation is about 10,000 units and is fitted on every request).
    """
    tokens = list(map(_TOKENS, units))
    _check(tokens, cap, fixed, memory_tokens, keep_fraction)
    total = fixed + memory_tokens + sum(tokens)
    if total <= cap:
        everything = tuple(range(len(units)))
        return Fitted(keep=everything, dropped=(), tokens=total, unchanged=True, notes=())
    lead = 0
    while lead < len(units) and units[lead].kind == "system":
        lead += 1
    last = len(units) - 1 if lead < len(units) else None
    system = sum(tokens[:lead])
    always = fixed + memory_tokens + system
    if last is not None:
        always += tokens[last]
    if always > cap:
        newest = tokens[last] if last is not None else 0
        raise BudgetError(
            f"the conversation needs at least {always} tokens but the cap is {cap}: system "
            f"{system}, newest turn {newest}, memory {memory_tokens}, fixed {fixed}; "
            "shorten the newest turn or the system prompt, or use a model with a larger window"
        )
    stop = last if last is not None else lead  # the middle turns are units[lead:stop]
    step = max(1.0, (1.0 - keep_fraction) * cap)
    # running[j]: the tokens of the oldest j + 1 middle turns
    running = list(accumulate(tokens[lead:stop]))
    middle_total = running[-1] if running else 0
    # Cut after the first middle turn whose running total reaches k * step, smallest k that
    # fits: a pure function of the prefix, so the next request of a growing conversation
    # finds the same cut points and only the chosen k can grow.
    k = 1
    cut = 0  # middle turns dropped
    while True:
        cut = min(bisect_left(running, k * step) + 1, len(running))
        dropped_tokens = running[cut - 1] if cut else 0
        if always + middle_total - dropped_tokens <= cap or cut == len(running):
            break
        k += 1
    dropped = tuple(range(lead, lead + cut))
    keep = (*range(lead), *range(lead + cut, stop), *([last] if last is not None else []))
    kept_tokens = always + middle_total - dropped_tokens
    notes = (
        f"dropped the {len(dropped)} oldest turn(s) ({dropped_tokens} tokens) to fit {total} "
        f"tokens into the cap of {cap}: cut at step {k} of {round(step)} tokens so later "
        "requests only append",
    )
    return Fitted(keep=keep, dropped=dropped, tokens=kept_tokens, unchanged=False, notes=notes)
