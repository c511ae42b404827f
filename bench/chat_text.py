"""Synthetic chat text for the benches: made-up words drawn Zipf-like, so common terms are common.

Real chat has a long tail: a few words are everywhere and most are rare, so a query's terms
each match a small share of the messages. Text drawn uniformly from a few dozen words is the
opposite (every term in half the store) and makes full-text search look far slower than it is.

    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> words = vocabulary(rng)
    >>> len(words), len(sentence(rng, words, zipf_weights(len(words)), words=5).split())
    (3000, 5)

Used by bench/retrieve.py and bench/serve.py (the same draws as retrieve.py always made, so a
store it kept is still the store it builds).
"""

from __future__ import annotations

import numpy as np

LETTERS = "abcdefghijklmnoprstuvwy"


def vocabulary(rng: np.random.Generator, size: int = 3000) -> list[str]:
    """``size`` distinct made-up words of 3 to 8 letters, sorted."""
    words: set[str] = set()
    while len(words) < size:
        words.add("".join(rng.choice(list(LETTERS), size=int(rng.integers(3, 9)))))
    return sorted(words)


def zipf_weights(size: int) -> np.ndarray:
    """Probabilities proportional to 1 / rank (Zipf's law with exponent 1)."""
    weights = 1.0 / np.arange(1, size + 1)
    return weights / weights.sum()


def sentence(
    rng: np.random.Generator, vocab: list[str], weights: np.ndarray, *, words: int | None = None
) -> str:
    """``words`` words (default: 6 to 29, uniformly) drawn from ``vocab`` with ``weights``."""
    count = int(rng.integers(6, 30)) if words is None else words
    return " ".join(rng.choice(vocab, size=count, p=weights))
