"""The names of people and things a query holds, and how many of them a text names verbatim:
retrieval's ``entity`` signal (:mod:`ctxwarden.retrieve`) and the summary passages' one
(:mod:`ctxwarden.passages`). Pure.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Sequence
from typing import NamedTuple

from ctxwarden.assemble import _STOPWORDS as _STOP

__all__ = ["EntityPattern", "entities", "entity_patterns", "entity_share"]

# Names of people and things in a query: runs of capitalised words not opening a sentence
# ("Lake Tahoe"), acronyms ("SSO"), words with digits ("v2.3", "p99", "10gb"), numbers of two
# or more digits, code identifiers (snake_case, camelCase, dotted.names, paths), quoted text.
_QUOTED = re.compile(r"[\"`\u201c]([^\"`\u201d]{2,60})[\"`\u201d]")
_TOKEN = re.compile(r"[\w][\w.\-/:@#+]*[\w+#]|\w", re.UNICODE)
_SENTENCE_ENDS = frozenset(".!?:;")


def entities(query: str) -> list[str]:
    """The query's names of people and things, as phrases (see the comment above). Pure.

    >>> entities("Did Ana move the deploy to Lake Tahoe after the v2.3 SSO outage?")
    ['Ana', 'Lake Tahoe', 'v2.3', 'SSO']
    """
    found: dict[str, str] = {}

    def add(phrase: str) -> None:
        phrase = phrase.strip(".-/:")
        if phrase:
            found.setdefault(phrase.casefold(), phrase)

    for match in _QUOTED.finditer(query):
        if len(match.group(1).split()) <= 5:
            add(match.group(1))
    run: list[str] = []
    # Whether a token opens a sentence: the last non-space character before it ends one. Only
    # the gap since the previous token is looked at (a token never ends in ".!?:;"), so the
    # scan is linear in the query: rescanning the text before every token was quadratic.
    previous_end = -1  # no token yet
    for match in _TOKEN.finditer(query):
        token = match.group()
        start = match.start()
        gap = query[max(previous_end, 0) : start].rstrip()
        opens = start == 0 or (gap[-1:] in _SENTENCE_ENDS if gap else False)
        previous_end = match.end()
        has_digit = any(c.isdigit() for c in token)
        code = (
            "_" in token
            or any(c in token[1:-1] for c in "./:@#")
            or any(a.islower() and b.isupper() for a, b in itertools.pairwise(token))
        )
        acronym = len(token) > 1 and token.isupper() and token.isalpha()
        capital = token[:1].isupper() and token[1:2].islower()
        if capital and not opens and token.casefold() not in _STOP:
            run.append(token)
            continue
        if run:
            add(" ".join(run))
            run = []
        if acronym or code or (has_digit and (len(token) > 1 or not token.isdigit())):
            add(token)
    if run:
        add(" ".join(run))
    return list(found.values())


class EntityPattern(NamedTuple):
    """One entity of a query: its case-insensitive, whole-word ``pattern``, and for an ASCII
    entity its lower-cased ``words`` (each must be in a text the pattern can match)."""

    pattern: re.Pattern[str]
    words: tuple[str, ...] | None

    def search(self, text: str) -> re.Match[str] | None:
        return self.pattern.search(text)


def entity_patterns(query: str, *, limit: int = 32) -> list[EntityPattern]:
    """One case-insensitive, whole-word pattern per entity of the query, the first ``limit``
    (each is searched in every candidate: the bound keeps that cost independent of the query)."""
    patterns = []
    for entity in entities(query)[:limit]:
        parts = entity.split()
        body = r"\s+".join(re.escape(part) for part in parts)
        pattern = re.compile(rf"(?<!\w){body}(?!\w)", re.IGNORECASE)
        words = tuple(part.lower() for part in parts) if entity.isascii() else None
        patterns.append(EntityPattern(pattern, words))
    return patterns


def entity_share(patterns: Sequence[EntityPattern], text: str) -> float:
    """The share of the query's entities that ``text`` names verbatim.

    An ASCII entity is looked for in an ASCII text only if each of its words is in the
    lower-cased text: a case-insensitive match of ASCII in ASCII needs that, and a pattern's
    search (~7-14 us in a 40-word message: the look-behind is tried at every position) costs
    ~10 times the check. The same share as searching every pattern.

    >>> entity_share(entity_patterns("Was Lake Tahoe in the v2.3 notes?"), "lake  tahoe, v2")
    0.5
    """
    if not patterns:
        return 0.0
    folded = text.lower() if text.isascii() else None
    found = 0
    for pattern, words in patterns:
        if folded is not None and words is not None and not all(w in folded for w in words):
            continue
        if pattern.search(text):
            found += 1
    return found / len(patterns)
