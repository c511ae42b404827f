"""What is news beyond one cluster: how many messages of a tenant's memory hold each term, the
same before, during and after compaction.

:class:`Background` counts, for each term, the messages that hold it: the candidates a
compaction run takes, and the messages earlier compactions turned into summaries. A summary
counts as the messages it stands for (``len(source_ids)`` documents), each with the terms of
the lines that cite it (:func:`summary_documents`), corrected by the counts its metadata keeps
(``"terms"``, written by :func:`term_corrections`) for what its text no longer says. So a run
cut short and resumed, or a second run after the first, counts what the uncut run counted, and
every remaining cluster is judged against the same background.

What the corrections keep, and why it is enough: for each term the background calls *common*
(said in ``limit`` or more messages), the exact difference between how many of the summary's
sources said it and how many of its lines show it (a dropped stock phrase, a bot's repeated
alert). A term that is not common needs no correction: an extractive summary's or a pack's lines
show a source's own words (after the line's citation, time and author), so what they keep of it
can only be less than its sources said, and it stays under ``limit``. Common terms are stock
words by definition (each in at least the square root of the corpus's messages), so a
summary's metadata holds no rare word, and nothing of an erased source's text outlives the
lines erasure takes out of the summary. (A model's summary may paraphrase: a rare word it adds
is counted as its lines show it.)
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field

from ctxwarden.sentences import cjk_bigrams, words
from ctxwarden.types import Memory

__all__ = [
    "TERMS_KEY",
    "Background",
    "read_corrections",
    "summary_documents",
    "summary_terms",
    "term_corrections",
    "terms",
]

_STOPWORD_TEXT = """
    a an the and or but if then else of to in on at by for with from into onto over under
    about as is are was were be been being am do does did done have has had having i me my we
    us our you your he him his she her it its they them their this that these those there here
    what which who whom whose when where why how all any both each few more most other some such
    no nor not only own same so than too very can could should would will shall may might must
    just also still yet again ever even now up down out off once via per get got go going went
    ok okay yeah yes yep hi hey hello thanks thank thx please pls lol haha nice cool sure"""
_STOPWORDS = frozenset(_STOPWORD_TEXT.split())
_WORD = re.compile(r"[a-z][a-z0-9_'./-]*[a-z0-9]|[a-z]|\d[\d.,:%/-]*")
#: A summary line's citation, time (``HH:MM`` or ``MM-DD HH:MM``) and author (see
#: ``ExtractiveSummarizer._head``); what is left is its source's text.
_CITED_LINE = re.compile(r"^- \[([^\[\]\s]+(?:,\s*[^\[\]\s,]+)*)\]\s*")
_TIME = re.compile(r"^(?:\d\d-\d\d )?\d\d:\d\d ")
_AUTHOR = re.compile(r"^[^\s:][^:\n]{0,63}: ")
#: A noise line: ``who xN, last: <the last message>`` (``ExtractiveSummarizer._spam``).
_NOISE = re.compile(r"^- .{1,120}? x(\d+), last: (.*)$")
#: The metadata key of a summary's corrections.
TERMS_KEY = "terms"


def terms(text: str) -> list[str]:
    """The terms of ``text`` the background counts: Latin-script words that are not stop
    words, words of other cased or spaced scripts, and CJK character pairs.

    >>> terms("The demo moved to Friday")
    ['demo', 'moved', 'friday']
    """
    latin = [t for t in _WORD.findall(text.lower()) if t not in _STOPWORDS]
    other = [w for w in words(text) if not w.isascii() and len(w) > 1]
    return latin + other + cjk_bigrams(text)


_terms = terms


def summary_documents(text: str) -> dict[str, set[str]]:
    r"""The terms of a rendered summary's cited lines, per cited id (each line's citation,
    time and author taken off): what the summary still says of each source.

    >>> found = summary_documents("Summary of 1 message\nEvents:\n- [m1] 10:00 ana: demo on Friday")
    >>> {id_: sorted(terms) for id_, terms in found.items()}
    {'m1': ['demo', 'friday']}
    """
    out: dict[str, set[str]] = {}
    for line in text.splitlines():
        match = _CITED_LINE.match(line)
        if match is None:
            continue
        rest = _AUTHOR.sub("", _TIME.sub("", line[match.end() :], count=1), count=1)
        found = set(terms(rest))
        for id_ in (part.strip() for part in match.group(1).split(",")):
            out.setdefault(id_, set()).update(found)
    return out


def summary_terms(text: str, sources: Collection[str]) -> Counter[str]:
    r"""How many messages of ``sources`` a rendered summary still shows holding each term:
    its cited lines per source (:func:`summary_documents`), and each noise line's last
    message counted as many times as the line says it was repeated (its words; a number,
    which differs between repeats, once).

    >>> sorted(summary_terms("Noise:\n- bot x3, last: build 17 failed", ["a", "b", "c"]).items())
    [('17', 1), ('build', 3), ('failed', 3)]
    """
    out: Counter[str] = Counter()
    for id_, found in summary_documents(text).items():
        if id_ in sources:
            out.update(found)
    for line in text.splitlines():
        match = _NOISE.match(line)
        if match is not None:
            times = min(int(match.group(1)), len(sources))
            for term in set(terms(match.group(2))):
                out[term] += 1 if any(c.isdigit() for c in term) else times
    return out


def term_corrections(sources: Mapping[str, str], text: str, background: Background) -> str:
    """What a summary's metadata keeps (``"terms"``) so that the :class:`Background` counts
    what its ``sources`` (id -> text, attachments' text included) said, for every term
    ``background`` calls common (see the module doc).

    The corrections are written ``term count`` pairs, space-separated, in term order (a term
    holds no whitespace): about nine bytes a term, where a JSON object takes thirteen.

    >>> bg = Background(documents=4, frequency={"deploy": 3, "api": 1})
    >>> term_corrections({"m1": "deploy of api", "m2": "ok"}, "- [m1] 10:00 bo: api", bg)
    'deploy 1'
    """
    said: Counter[str] = Counter()
    for source in sources.values():
        said.update(set(terms(source)))
    kept = summary_terms(text, sources.keys())
    out = []
    for term in sorted(said.keys() | kept.keys()):
        difference = said[term] - kept[term]
        if difference and background.common(term):
            out.append(f"{term} {difference}")
    return " ".join(out)


def read_corrections(value: object) -> dict[str, int]:
    """The corrections :func:`term_corrections` wrote (empty for anything else).

    >>> read_corrections("deploy 1 api -2")
    {'deploy': 1, 'api': -2}
    """
    if not isinstance(value, str):
        return {}
    parts = value.split()
    out = {}
    for term, count in zip(parts[::2], parts[1::2], strict=False):
        try:
            out[term] = int(count)
        except ValueError:
            continue
    return out


@dataclass(frozen=True)
class Background:
    """How many messages of a corpus hold each term: what tells a stock phrase from news
    beyond one cluster.

    A term is *common* when at least ``limit`` messages hold it: the square root of the
    corpus's size, at least ``floor``. A name said in one message of a thousand is news; a word
    in one of every thirty (a template's "PR", a channel's running topic) is not: the square
    root grows with the corpus as a topic's share of it does not, so the rule holds from
    hundreds of messages to many thousands without a constant tuned to one size. Below
    ``min_documents`` rarity says nothing (in a small corpus nearly every word is in few
    messages): such a background is not used (:attr:`measured` is false) and summaries go by
    the fact signals of :func:`ctxwarden.sentences.fact_values` alone.

    >>> bg = Background.of(["deploy of api", "deploy of web", "deploy of db", "I grew up in Ghent"])
    >>> bg.limit, bg.common("deploy"), bg.common("ghent"), bg.measured
    (3, True, False, False)
    """

    documents: int
    frequency: Mapping[str, int] = field(default_factory=dict)
    floor: int = 3
    min_documents: int = 200

    @property
    def measured(self) -> bool:
        """Whether the corpus is big enough for rarity to mean something."""
        return self.documents >= self.min_documents

    @classmethod
    def of(cls, texts: Iterable[str], summaries: Iterable[Memory] = ()) -> Background:
        """Count, for each term, the texts that hold it, and the messages ``summaries`` stand
        for (those that keep corrections, see the module doc; others are not counted)."""
        frequency: Counter[str] = Counter()
        documents = 0
        for text in texts:
            documents += 1
            frequency.update(set(terms(text)))
        for summary in summaries:
            corrections = summary.metadata.get(TERMS_KEY)
            if summary.kind != "summary" or not isinstance(corrections, str):
                continue
            documents += len(summary.source_ids)
            frequency.update(summary_terms(summary.content, set(summary.source_ids)))
            for term, count in read_corrections(corrections).items():
                frequency[term] += count
        return cls(documents=documents, frequency={t: n for t, n in frequency.items() if n > 0})

    @property
    def limit(self) -> int:
        """Messages a term must be in to be common."""
        return max(self.floor, math.ceil(math.sqrt(self.documents)))

    def common(self, term: str) -> bool:
        """Whether ``term`` is in ``limit`` or more messages of the corpus."""
        return self.frequency.get(term, 0) >= self.limit

    def news(self, text: str) -> bool:
        """Whether ``text`` holds a term that is not common (new information)."""
        return any(not self.common(t) for t in terms(text))
