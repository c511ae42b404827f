"""What a query is about, beyond its words: the people it names, the times it names, and whether
it asks for a list. Pure; used by :mod:`ctxwarden.retrieve`.

- **People.** The authors among the retrieval candidates whose name the query says ("what did
  Ana paint?"). In a conversation, what a person did is mostly in their own turns; the other
  side's turns that address them by name ("Wow, Ana! ...") match the name's word but are only
  about them second-hand. Retrieval searches once more without the names' words among the
  named people's own turns (:func:`without_words`) and credits a person's own turn with the
  name it does not need to say (:func:`Focus.speaks`).
- **Times.** :func:`ctxwarden.timeref.time_spans`: "on 13 October", "last week of May", "in
  2022", resolved against the asking time; a memory created within one is preferred
  (:meth:`Focus.when`), since a chat turn's text rarely carries its own date.
- **Lists.** A question that asks for several things ("what books has Ana read?", "what do
  Ana and Bo both like?") is answered across many conversations, not by near-copies of one:
  :meth:`Focus.episode` keys a memory by its place and day so retrieval can spread picks over
  episodes (:attr:`Focus.listing` says how strongly). The cues are English grammar words
  (quantifiers, "both", "in common") and a plural noun after the question word, not topics.

>>> f = focus("What books has Ana read since last week?", now=0.0, authors=["Ana", "Bo"])
>>> sorted(f.people), f.listing, [s.text for s in f.spans]
(['Ana'], True, ['last week'])
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from ctxwarden.timeref import TimeSpan, time_spans
from ctxwarden.types import Memory

__all__ = [
    "ROLE_NAMES",
    "Focus",
    "asked_words",
    "focus",
    "name_words",
    "said_name",
    "vector_text",
    "without_words",
]

_WORDS = re.compile(r"\w+", re.UNICODE)
# "both", "in common", quantifiers and enumerations: grammar, not topics.
_LIST_CUES = re.compile(
    r"\b(?:both|in\s+common|all|every|each|list|various|several|how\s+many|kinds?\s+of"
    r"|types?\s+of|sorts?\s+of)\b",
    re.IGNORECASE,
)
# "What books has ...", "Which countries did ...": a question word, then a plural noun (a word
# ending in "s" but not "ss"/"us"/"is"), then an auxiliary verb.
_PLURAL_ASK = re.compile(
    r"\b(?:what|which)\s+(?:\w+\s+)?\w+(?<![sui])s\s+(?:has|have|had|do|does|did|are|were)\b",
    re.IGNORECASE,
)


#: The message roles of the chat APIs (OpenAI's, Anthropic's, Gemini's) and the MCP server's
#: note author: an author called by one is a role of a transcript, not a person, and a query
#: saying the word ("how do I add a user?") does not name it.
ROLE_NAMES = frozenset({"user", "assistant", "system", "developer", "tool", "function", "model",
                        "agent"})  # fmt: skip


def name_words(name: str) -> frozenset[str]:
    """The casefolded words of a name that could stand for it in a query ("Ana Li" -> ana, li);
    none for a role name (:data:`ROLE_NAMES`).

    >>> sorted(name_words("Ana Li")), name_words("assistant"), name_words(" User ")
    (['ana', 'li'], frozenset(), frozenset())
    """
    if name.strip().casefold() in ROLE_NAMES:
        return frozenset()
    return frozenset(p for p in _WORDS.findall(name.casefold()) if len(p) > 1)


def asked_words(query: str) -> frozenset[str]:
    """The casefolded words of ``query`` that can name someone (two characters or more): what
    :func:`said_name` is given, the same for every part of retrieval.

    >>> sorted(asked_words("Did Bo see Ana Li at 9?"))
    ['ana', 'at', 'bo', 'did', 'li', 'see']
    """
    return frozenset(w for w in _WORDS.findall(query.casefold()) if len(w) > 1)


def said_name(name: str, words: frozenset[str]) -> frozenset[str]:
    """The words of ``name`` among a query's casefolded ``words`` when they name it, else none.

    Each space-separated part of a name names it alone ("Li" names "Ana Li"), but of a part
    joined with punctuation (an identifier: ``langgraph-store``, ``ana@example.com``,
    ``build.bot``) only the first word does, or the whole part: its later words are kinds and
    domains ("store", "com", "bot"), and a query saying them is not about that author.

    >>> sorted(said_name("Ana Li", frozenset({"what", "did", "li", "say"})))
    ['li']
    >>> said_name("langgraph-store", frozenset({"the", "store"}))
    frozenset()
    >>> sorted(said_name("langgraph-store", frozenset({"langgraph", "store"})))
    ['langgraph', 'store']
    """
    parts = name_words(name)
    said = parts & words
    if not said or said == parts:
        return said
    firsts = {w[0] for w in (_WORDS.findall(t) for t in name.casefold().split()) if w}
    alone = {w for w in firsts if len(w) > 1}
    return said if said & alone else frozenset()


def without_words(terms: Iterable[str], words: Iterable[str]) -> list[str]:
    """``terms`` without those in ``words`` (order kept)."""
    drop = set(words)
    return [t for t in terms if t not in drop]


@dataclass(frozen=True, slots=True)
class Focus:
    """What :func:`focus` found in a query (see the module docstring)."""

    people: frozenset[str] = frozenset()
    spans: tuple[TimeSpan, ...] = ()
    listing: bool = False
    #: The words of the people's names and of the time expressions (left out of some searches).
    name_terms: frozenset[str] = frozenset()
    time_terms: frozenset[str] = frozenset()

    def speaks(self, memory: Memory) -> bool:
        """Whether ``memory`` is a named person's own (their words, not words about them)."""
        return memory.author is not None and memory.author in self.people

    def when(self, memory: Memory) -> float:
        """How well ``memory``'s time fits the named times: 1.0 within one, 0.5 just after one
        (:meth:`TimeSpan.match`), 0.0 otherwise or when the query names none."""
        best = 0.0
        for span in self.spans:
            best = max(best, span.match(memory.created_at))
        return best

    def episode(self, memory: Memory) -> tuple[str | None, str | None, int]:
        """The memory's place and day: picks from one episode crowd out others for a list."""
        return (memory.session, memory.channel, int(memory.created_at // 86400.0))


def focus(query: str, *, now: float, authors: Iterable[str | None]) -> Focus:
    """The people, times and list-ness of ``query`` (see the module docstring). ``authors``:
    the candidates' authors (any order, repeats fine), among which named people are found."""
    words = asked_words(query)
    people: set[str] = set()
    name_terms: set[str] = set()
    for author in set(authors):
        if not author:
            continue
        said = said_name(author, words)
        if said:
            people.add(author)
            name_terms |= said
    spans = tuple(time_spans(query, now))
    time_terms = frozenset(w for s in spans for w in _WORDS.findall(s.text.casefold()))
    listing = bool(_LIST_CUES.search(query) or _PLURAL_ASK.search(query))
    return Focus(
        people=frozenset(people),
        spans=spans,
        listing=listing,
        name_terms=frozenset(name_terms),
        time_terms=time_terms,
    )


def vector_text(query: str, authors: Sequence[str]) -> str:
    """The text a query's vector is made of: ``query`` less the words of the ``authors`` it
    names (at most 3, as the author-restricted searches; whole words, any case), or ``query``
    itself when it names none or is nothing but names.

    A name dominates the embedding of a short question: "What did Ana research?" was nearest
    to the other side's "Wow, Ana! ..." turns, not to what Ana said (docs/retrieval.md). The
    people's own turns are found by the author-restricted and speaker searches.

    >>> vector_text("What did Ana Li research?", ["Ana Li", "Bo"])
    'What did     research?'
    >>> vector_text("Ana?", ["Ana"])
    'Ana?'
    """
    asked = asked_words(query)
    named = [a for a in dict.fromkeys(authors) if a and said_name(a, asked)][:3]
    if not named:
        return query
    words = {p for name in named for p in name_words(name)}
    unnamed = _WORDS.sub(lambda m: " " if m.group().casefold() in words else m.group(), query)
    return unnamed if unnamed.strip(" ?!.,;:") else query
