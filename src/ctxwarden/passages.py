"""A summary's lines as passages of the related block (issue 19).

A summary is one memory with many lines, found by retrieval because some of them match; shown
whole it crowds the block, cut to a fixed few lines it loses the line that answers. Here each
item line (``- [id] time author: text``) of a summary among the related candidates becomes a
candidate of its own, scored against the query with the signals retrieval gives a message:

- **terms**: BM25 over the item lines of all summaries in the candidate set (a term on most
  lines tells them apart no better than nothing; a rare one does), a query word of five or
  more letters also matching the words it begins (a crude stem: ``adopt`` finds ``adoption``;
  the same rule for every script, CJK by character pairs);
- **entities**: the share of the query's names, numbers and identifiers the line names
  verbatim (:func:`~ctxwarden.entities.entity_patterns`, retrieval's ``entity`` weight);
- **speaker**: the line's author is a person the query names (retrieval's ``author`` weight);
- **neighbours**: the line after a matching one (``neighbours``), the answers after a question
  by others until the asker speaks again (``answer``, ``neighbour_decay`` per turn), the line
  before (``neighbours``; ``answer`` when it is the question a matching line answers): a
  question's answer is often the next turn, with no word of the question.

A line's score is the summary's retrieval score times its share of the summary's best line,
and it is packed by value per token (``score / tokens ^ density``, as retrieval orders hits)
among the other candidates: a line that answers costs what its original did, the summary's
header is paid once, by the first of its lines the block takes (the candidates' ``group``),
and as many lines are shown as the budget holds. Lines that match nothing and neighbour
nothing are not offered (they would take the room recent history gets from a related block
with nothing left). A summary with no matching line stays one candidate, as retrieval made it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ctxwarden.assemble import _STOPWORDS, _WORD, Candidate, query_terms
from ctxwarden.entities import entity_patterns, entity_share
from ctxwarden.focus import asked_words, name_words, said_name
from ctxwarden.provenance import is_untrusted
from ctxwarden.retrieve import RetrievalWeights
from ctxwarden.segment import has_run

__all__ = ["summary_passages"]

# "- [m1,m2] " before a line's text, then an optional time ("09:30 " or "05-08 09:30 ").
_HEAD = re.compile(r"^- (?:\[[^\[\]\s]+(?:,\s*[^\[\]\s,]+)*\]\s*)?(?:(?:\d\d-\d\d )?\d\d:\d\d )?")
# The speaker: what precedes the first ": " of the rest, when it is short and has no ": ".
_SPEAKER = re.compile(r"^([^:\n]{1,64}?): ")
#: BM25's term saturation and length normalisation (the usual defaults; a line is short, so
#: the length term matters little).
_K1 = 1.2
_B = 0.75
#: A query word this long or longer also matches the words it begins, cut to this length at
#: least (or to all but its last three letters, whichever is longer).
_STEM = 5
_QUESTION_MARKS = ("?", "？")


@dataclass(slots=True)
class _Line:
    index: int  # the line's position in the summary's text
    text: str
    body: str  # the text after the citation and time
    said: str  # the body after its speaker
    speaker: str | None
    length: int  # the line's words, for BM25's length normalisation
    #: Its terms (:func:`_terms`), made only for a line holding some query term's letters.
    terms: frozenset[str] = frozenset()
    score: float = 0.0
    relevance: float = 0.0  # its fused rank over the best line's (recency scales with it)


def _parse(content: str) -> tuple[str, list[_Line]] | None:
    """The header and the item lines of a rendered summary (None without item lines)."""
    lines = content.splitlines()
    if len(lines) < 2:
        return None
    out = []
    for index, text in enumerate(lines):
        if not text.startswith("- "):
            continue
        body = text[_HEAD.match(text).end() :]  # type: ignore[union-attr]  # always matches
        who = _SPEAKER.match(body)
        speaker = who.group(1).strip() if who else None
        said = body[who.end() :] if who else body
        out.append(_Line(index, text, body, said, speaker, len(said.split())))
    if not out:
        return None
    return lines[0], out


def _terms(text: str) -> frozenset[str]:
    """The terms :func:`~ctxwarden.assemble.query_terms` finds in ``text`` (a set: the words
    of two or more characters or digits, less stopwords; a run of a script without spaces as
    its bigrams), without its per-word bound: a line's terms, made for hundreds of lines."""
    if not text.isascii() and has_run(text):
        return frozenset(query_terms(text, limit=256))
    found = {w for w in _WORD.findall(text.casefold()) if len(w) > 1 or w.isdigit()}
    return frozenset(found - _STOPWORDS)


def _stem(term: str) -> str | None:
    """What of the query's ``term`` a word must begin with to stand for it: for a word of
    :data:`_STEM` or more letters, its first ``_STEM`` letters or all but its last three,
    whichever is longer; None for a shorter word, a number or a CJK pair (the word itself)."""
    if len(term) < _STEM or not term.isalnum() or term.isdigit():
        return None
    return term[: max(_STEM, len(term) - 3)]


def _matching(term: str, vocabulary: set[str]) -> frozenset[str]:
    """The words of ``vocabulary`` that stand for the query's ``term`` (:func:`_stem`)."""
    prefix = _stem(term)
    if prefix is None:
        return frozenset({term} & vocabulary)
    return frozenset(word for word in vocabulary if word.startswith(prefix))


def _bm25(lines: Sequence[_Line], wanted: dict[str, frozenset[str]]) -> list[_Line]:
    """The lines holding some of the wanted terms, best BM25 first (ties: text order); a term
    holds on a line when one of its matching words is there."""
    if not lines or not wanted:
        return []
    total = len(lines)
    average = sum(line.length for line in lines) / total or 1.0
    held = {t: sum(1 for line in lines if not line.terms.isdisjoint(m)) for t, m in wanted.items()}
    idf = {t: math.log(1.0 + (total - n + 0.5) / (n + 0.5)) for t, n in held.items() if n}
    scored = []
    for n, line in enumerate(lines):
        norm = _K1 * (1.0 - _B + _B * line.length / average)
        value = sum(v for t, v in idf.items() if not line.terms.isdisjoint(wanted[t]))
        if value > 0:
            scored.append((-value * (_K1 + 1.0) / (1.0 + norm), n, line))
    scored.sort(key=lambda item: (item[0], item[1]))
    return [line for _, _, line in scored]


def _asks(text: str) -> bool:
    return any(mark in text for mark in _QUESTION_MARKS)


def _spread(lines: Sequence[_Line], base: Sequence[float], w: RetrievalWeights) -> list[float]:
    """Each line's score with the share its neighbours give it, as retrieval's
    :func:`~ctxwarden.retrieve._relations` gives a hit's turns theirs: of the ``turns`` lines
    on either side, the speaker's own (the nearest ``neighbours``, further ones ``thread``,
    ``neighbour_decay`` less each), the answers of a question by others until the asker speaks
    again (``answer``), and the question a line answers (``answer``)."""
    out = list(base)
    decay = w.neighbour_decay
    reach = w.turns

    def give(j: int, weight: float, parent: float) -> None:
        if weight > 0 and weight * parent > out[j]:
            out[j] = weight * parent

    for i, line in enumerate(lines):
        own = base[i]
        if own <= 0:
            continue
        who = line.speaker
        before = lines[max(0, i - reach) : i][::-1]
        after = lines[i + 1 : i + 1 + reach]
        for step, side in ((-1, before), (1, after)):
            rank = 0
            for distance, turn in enumerate(side, start=1):
                if who is not None and turn.speaker != who:
                    continue
                give(i + step * distance, w.neighbours if rank == 0
                     else w.thread * decay ** (rank - 1), own)  # fmt: skip
                rank += 1
        if _asks(line.said):
            for rank, turn in enumerate(after):
                if who is not None and turn.speaker == who:
                    break  # the asker speaks again: what follows answers something else
                give(i + 1 + rank, w.answer * decay**rank, own)
        else:
            for distance, turn in enumerate(before, start=1):
                if who is None or turn.speaker != who:
                    if _asks(turn.said):
                        give(i - distance, w.answer, own)
                    break
    return out


def summary_passages(
    related: list[Candidate],
    query: str,
    count: Callable[[str], int],
    weights: RetrievalWeights,
    *,
    limit: int | None = None,
) -> list[Candidate]:
    """``related`` (in retrieval's value-per-token order) with each trusted summary's item
    lines as candidates of their own, scored for ``query`` and merged in by value per token
    (see the module docstring); ``count`` counts a text's tokens. Without a summary among them
    the list is returned as it is.

    At most ``limit`` lines are offered, the best (assembly passes the count of candidates
    it asks retrieval for). Each line's candidate holds the summary's memory, its
    :attr:`Candidate.part` is the line's position in the summary (so fill takes several lines
    of one summary, and they are shown in their order), its group header the summary's header
    line.
    """
    found: list[tuple[int, str, list[_Line]]] = []
    for position, cand in enumerate(related):
        memory = cand.memories[0]
        if (
            memory.kind != "summary"
            or len(cand.memories) != 1
            or cand.superseded is not None
            or is_untrusted(memory.metadata)
        ):
            continue
        parsed = _parse(memory.content)
        if parsed is not None:
            found.append((position, *parsed))
    if not found:
        return related
    terms = query_terms(query)
    if not terms:
        return related
    every = [line for _, _, lines in found for line in lines]
    # Only a line holding some term's letters (or its stem's) can hold the term: the others'
    # words are not read (a summary has dozens of lines, and most match nothing).
    needles = {_stem(t) or t for t in terms}
    for line in every:
        said = line.said.casefold()
        if any(needle in said for needle in needles):
            line.terms = _terms(line.said)
    vocabulary = set().union(*(line.terms for line in every))
    matches = {t: _matching(t, vocabulary) for t in terms}
    words = asked_words(query)
    speakers = {line.speaker for line in every if line.speaker is not None}
    named = {s for s in speakers if said_name(s, words)}
    name_terms = frozenset().union(*(name_words(s) for s in named)) & words
    fused = [0.0] * len(every)
    k = weights.rrf_k
    # Two ranked lists fused by rank, as retrieval fuses its searches: every line by its
    # words, and the named people's own lines by the words that are not their names.
    searches = [(weights.lexical, every, matches)]
    if named and weights.speaker > 0:
        own = [line for line in every if line.speaker in named]
        rest = {t: m for t, m in matches.items() if t not in name_terms}
        searches.append((weights.speaker, own, rest))
    at = {id(line): n for n, line in enumerate(every)}
    for weight, lines, wanted in searches:
        for rank, line in enumerate(_bm25(lines, wanted), start=1):
            fused[at[id(line)]] += weight / (k + rank)
    best = max(fused)
    if best <= 0:
        return related
    entities = entity_patterns(query, limit=weights.max_entities)
    for n, line in enumerate(every):
        relevance = fused[n] / best
        if relevance <= 0:
            continue
        line.relevance = relevance
        boost = 1.0 + (weights.author if line.speaker in named else 0.0)
        if entities:
            boost += weights.entity * entity_share(entities, line.said)
        line.score = relevance * boost

    offered: list[tuple[float, int, int, _Line]] = []  # (score, summary, line index, line)
    for n, (position, _, lines) in enumerate(found):
        got = related[position].components.get
        # What the summary's time gives each of its lines, as retrieval gives a message (its
        # recency in proportion to the line's relevance).
        recency = weights.recency * got("recency", 0.0)
        extra = weights.access * got("access", 0.0) + weights.in_time * got("when", 0.0)
        scores = _spread(lines, [line.score + recency * line.relevance + extra if line.score
                                 else 0.0 for line in lines], weights)  # fmt: skip
        offered.extend(
            (v, n, line.index, line) for line, v in zip(lines, scores, strict=True) if v > 0
        )
    if limit is not None and len(offered) > limit:
        # The best ``limit`` lines (retrieval's candidate count): no more could fit, and each
        # one offered is counted with the model's tokenizer.
        offered = sorted(offered, key=lambda o: (-o[0], o[1], o[2]))[: max(1, limit)]
    replaced: dict[int, list[Candidate]] = {}
    for value, n, index, line in sorted(offered, key=lambda o: (o[1], o[2])):
        position, header, _ = found[n]
        cand = related[position]
        text = line.text + "\n"
        tokens = max(1, count(text))
        components = {
            **cand.components,
            "line": line.score,
            "score": value,
            "density": value / math.pow(tokens, weights.density),
        }
        replaced.setdefault(position, []).append(
            Candidate(
                cand.memories, tokens, value, components, text, None, header + "\n", index + 1
            )
        )
    if not replaced:
        return related
    out: list[Candidate] = []
    lines_in = sorted(
        (c for parts in replaced.values() for c in parts),
        key=lambda c: (-c.components["density"], c.part),
    )
    seen: set[str] = set()  # a line two summaries hold is offered once, by the better
    unique = []
    for line_cand in lines_in:
        if line_cand.text not in seen:
            seen.add(line_cand.text)
            unique.append(line_cand)
    kept = [c for position, c in enumerate(related) if position not in replaced]
    # A merge of two lists each in value-per-token order (ties: retrieval's hits first).
    j = 0
    for cand in kept:
        value = _density(cand, weights)
        while j < len(unique) and unique[j].components["density"] > value:
            out.append(unique[j])
            j += 1
        out.append(cand)
    out.extend(unique[j:])
    return out


def _density(cand: Candidate, weights: RetrievalWeights) -> float:
    value = cand.components.get("density")
    if value is not None:
        return value
    return cand.score / math.pow(max(1, cand.tokens), weights.density)
