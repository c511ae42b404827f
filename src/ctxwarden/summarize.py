"""Structured, token-bounded summaries: the :class:`Summarizer` protocol and two summarisers.

A :class:`Summary` has the same fields whoever writes it: ``time_range``, ``key_entities``,
``main_events``, ``decisions``, ``open_loops``, ``spam_patterns`` and ``source_ids``. Its
:meth:`Summary.render` is the compact text that goes into a prompt, and a summariser's contract is
that this rendered text counts at most ``max_tokens`` with the tokenizer it is given. The summary,
its items and the protocol live in :mod:`ctxwarden.summary`, re-exported here.

- :class:`ExtractiveSummarizer` (offline default, no model) keeps the most informative sentences
  verbatim, each line citing its source message as ``[id]``.
- :class:`~ctxwarden.summarize_llm.LLMSummarizer` (in :mod:`ctxwarden.summarize_llm`) asks an
  OpenAI-compatible model for the JSON object under a schema, checks it against what this
  module's extractive summary keeps, and raises :class:`~ctxwarden.errors.SummarizeError`
  rather than ever returning a placeholder.

Provenance convention: ``source_ids`` lists every input the summary covers (spam included), in
input order. Lines of ``main_events``, ``decisions`` and ``open_loops`` may start with a citation
``[id]`` or ``[id1,id2]``; :func:`line_sources` reads it back.
"""

from __future__ import annotations

import copy
import itertools
import logging
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace

from ctxwarden.background import _STOPWORDS, _WORD, Background, _terms
from ctxwarden.errors import InputError, SummarizeError
from ctxwarden.sentences import fact_values, is_fact, split_sentences, words
from ctxwarden.summary import (
    _CITATION,
    LIST_FIELDS,
    Summarizer,
    Summary,
    SummaryItem,
    TokenCounter,
    _check_inputs,
    _source_ids,
    _time_range,
    line_sources,
    truncate_summary,
)
from ctxwarden.types import format_time

__all__ = [
    "LIST_FIELDS",
    "Background",
    "ExtractiveSummarizer",
    "Summarizer",
    "Summary",
    "SummaryItem",
    "TokenCounter",
    "cluster_facts",
    "dropped_sentences",
    "fact_tokens",
    "line_sources",
    "lost_facts",
    "novel_facts",
    "truncate_summary",
]

logger = logging.getLogger(__name__)


# ---------------------------------------------------------------------------- extractive

_ACKS = _STOPWORDS | {
    "+1",
    "ty",
    "np",
    "gm",
    "gn",
    "brb",
    "lgtm",
    "ack",
    "noted",
    "great",
    "agreed",
}
_URL = re.compile(r"https?://[^\s)>\]]+")
_VOLATILE = re.compile(r"\b[0-9a-f]{7,40}\b|\d+")
_DECISION = re.compile(
    r"\b(decided|decision|agreed|agree on|approved|we'll|we will|let's|lets go|going with|"
    r"go with|settled|chose|choosing|final|from now on|the plan is|plan is to|switch(?:ed|ing)? to|"
    r"moving to|moved to|chang(?:e|ed|ing) (?:it )?to|instead of|postponed?|pushed to|"
    r"cancel+ed|deadline|scheduled|is now|will be|starting (?:on|from|next)|new (?:date|time|"
    r"owner|price|limit|budget|version)|owner is|assigned to|taking over)\b",
    re.IGNORECASE,
)
_CHANGE = re.compile(
    r"\b(chang(?:e|ed|es)|mov(?:e|ed)|renam(?:e|ed)|updat(?:e|ed)|bump(?:ed)?|raised|lowered|"
    r"increas(?:e|ed)|decreas(?:e|ed)|replac(?:e|ed)|migrat(?:e|ed)|deployed|released|shipped|"
    r"merged|fixed|broke|broken|rolled back|reverted|outage|down|failing|blocked)\b",
    re.IGNORECASE,
)
_CAPITALISED = r"(?:[A-Z][A-Za-z0-9]*[a-z0-9][A-Za-z0-9]*|[A-Z]{2,}[0-9]*)"
_ENTITY = re.compile(
    rf"(?<![\w@#])(?:[@#][A-Za-z][\w.-]*|{_CAPITALISED}(?:[ -]{_CAPITALISED})*|v\d+(?:\.\d+)+)"
    r"(?![\w])"
)
_FIRST_PERSON = re.compile(r"\b(?:I|I'm|I've|I'll|I'd|my|mine|me)\b")
_AUTHOR_PREFIX = re.compile(r"^[\w.@-]+: ")
_SUMMARY_HEADERS = {
    "Events:": "main_events",
    "Decisions:": "decisions",
    "Open questions:": "open_loops",
    "Noise:": "spam_patterns",
}


@dataclass
class _Sentence:
    index: int  # position in input order, the tie-break everywhere
    item: int
    text: str
    section: str
    score: float = 0.0
    cost: int = 0
    fact: bool = False
    #: the fact's values (:func:`ctxwarden.sentences.fact_values`), normalised
    values: frozenset[str] = frozenset()
    #: holds a term no other message of the batch has (new information, not a stock phrase)
    rare: bool = True


def _spam_key(content: str) -> str:
    text = _URL.sub(lambda m: m.group().split("?")[0], content.lower())
    return " ".join(_VOLATILE.sub("#", text).split())


def _values(text: str) -> frozenset[str]:
    return frozenset(" ".join(v.split()).casefold() for v in fact_values(text))


def novel_facts(
    facts: Sequence[tuple[str, str, tuple[str, ...]]],
) -> list[tuple[str, str, tuple[str, ...]]]:
    """The facts a summary must hold for every value of ``facts`` to be in it: in order, each
    fact that brings a value no earlier kept fact has. A sentence whose every value is already
    kept ("+1", a name said again) adds nothing a question could find.

    >>> novel_facts([("m1", "Demo on Friday.", ("Friday",)), ("m2", "ok Friday", ("Friday",))])
    [('m1', 'Demo on Friday.', ('Friday',))]
    """
    seen: set[str] = set()
    out = []
    for fact in facts:
        values = {" ".join(v.split()).casefold() for v in fact[2]}
        if values - seen:
            out.append(fact)
            seen |= values
    return out


def _is_chatter(text: str) -> bool:
    found = words(text)
    if len(found) < 2 and len(text.strip()) <= 2:
        return True  # "+1", "ok", "k": a reaction, whatever it is made of
    return not is_fact(text) and (len(found) < 2 or all(w in _ACKS for w in found))


class ExtractiveSummarizer:
    """The offline default: the most informative sentences, verbatim, within the token target.

    Scoring (per sentence, deterministic): the rarity of its terms within the batch (TF-IDF),
    plus bonuses for decision language, change language, numbers, named entities, questions
    no later message answered and first-person statements with a name or number in them (facts
    about people); word pairs that recur in ``boilerplate_repeats`` or more messages of the
    batch (stock phrases, templates) cost score, as do bot authors; one-word chatter and
    sentences scoring under ``min_score`` are never chosen. Messages repeated at
    least ``spam_min_repeats`` times (after masking numbers, hashes and URL query strings) become
    ``spam_patterns`` lines (``"deploybot x37, last: <the last one verbatim>"``), not events.
    Sentences are cut at ``. ! ?`` and at CJK ``。！？``
    (:func:`ctxwarden.sentences.split_sentences`).
    Facts come first: every sentence that :func:`ctxwarden.sentences.is_fact` finds a fact in (a
    number, date or time, a name, a quoted value, an open question; whole sentences of scripts
    without case) is kept verbatim (shortened only past four times ``max_sentence_tokens``) as
    long as the facts fit ``max_tokens``;
    the rest is filled by score per token. Lines are rendered in input order as
    ``[id] HH:MM author: text`` (the date too when the items span several UTC days;
    ``cite_sources=False`` leaves out the ``[id]``).
    """

    def __init__(
        self,
        *,
        cite_sources: bool = True,
        spam_min_repeats: int = 3,
        max_sentence_tokens: int = 80,
        max_entities: int = 12,
        entity_share: float = 0.12,
        spam_share: float = 0.2,
        min_score: float = 0.3,
        boilerplate_repeats: int = 3,
        background: Background | None = None,
    ) -> None:
        if spam_min_repeats < 2:
            raise InputError("must be 2 or more", field="spam_min_repeats")
        if max_sentence_tokens < 8:
            raise InputError("must be 8 or more", field="max_sentence_tokens")
        self.cite_sources = cite_sources
        self.spam_min_repeats = spam_min_repeats
        self.max_sentence_tokens = max_sentence_tokens
        self.max_entities = max_entities
        self.entity_share = entity_share
        self.spam_share = spam_share
        self.min_score = min_score
        self.boilerplate_repeats = boilerplate_repeats
        self.background = background if background is not None and background.measured else None

    def with_background(self, background: Background | None) -> ExtractiveSummarizer:
        """A copy that judges what is news against ``background`` (see :class:`Background`)."""
        out = copy.copy(self)
        out.background = background if background is not None and background.measured else None
        return out

    def summarize(
        self, items: Sequence[SummaryItem], *, max_tokens: int, tokenizer: TokenCounter
    ) -> Summary:
        """Summarise ``items``; the rendered result counts at most ``max_tokens``."""
        _check_inputs(items, max_tokens)
        base = Summary(time_range=_time_range(items), source_ids=_source_ids(items))
        header_cost = tokenizer.count(base.render())
        if header_cost > max_tokens:
            raise SummarizeError(
                f"max_tokens={max_tokens} cannot hold even the summary header "
                f"({header_cost} tokens); raise max_tokens"
            )
        spam_items, spam_lines = self._spam(items)
        sentences, carried_spam = self._sentences(items, spam_items)
        spam_lines = carried_spam + spam_lines
        budget = max_tokens - header_cost
        entities = _fit(
            self._entities(items, spam_items, sentences),
            budget * self.entity_share,
            tokenizer,
            ", ",
        )
        spam = _fit(spam_lines, budget * self.spam_share, tokenizer, "\n- ")
        times = [item.created_at for item in items if item.created_at is not None]
        one_day = bool(times) and format_time(min(times))[:10] == format_time(max(times))[:10]
        # The header states the minute exactly when every item is in one: no line needs it.
        one_minute = (
            len(times) == len(items)
            and len({format_time(t, precision="minutes") for t in times}) == 1
        )
        heads = [self._head(item, one_day, one_minute) for item in items]
        self._score(items, sentences, tokenizer, heads)
        summary = replace(base, key_entities=tuple(entities), spam_patterns=tuple(spam))
        used = tokenizer.count(summary.render())
        chosen = _choose(sentences, max_tokens - used - 6, self.min_score)
        while True:
            summary = _with_sections(summary, items, chosen, heads)
            # An entity a line already names is said once, in its line.
            shown = "\n".join(
                [*summary.main_events, *summary.decisions, *summary.open_loops, *spam]
            ).casefold()
            named = tuple(e for e in entities if e.casefold() not in shown)
            summary = replace(summary, key_entities=named)
            if tokenizer.count(summary.render()) <= max_tokens:
                return summary
            if chosen:
                # The per-line costs are estimates (line joins, section titles): drop the
                # weakest choice (a fact last) and count again.
                weakest = min(chosen, key=lambda s: (s.fact, s.score / math.sqrt(s.cost), -s.index))
                chosen = [s for s in chosen if s is not weakest]
            else:
                return truncate_summary(summary, max_tokens=max_tokens, tokenizer=tokenizer)

    # -- steps

    def facts(self, items: Sequence[SummaryItem]) -> list[tuple[str, str, tuple[str, ...]]]:
        """The facts of ``items`` this summariser keeps, as ``(id, sentence, values)``.

        Every sentence (or line of an earlier summary) with a fact
        (:func:`ctxwarden.sentences.fact_values`) except those of repeated messages, which
        become noise lines (a bot's alerts that differ only in counters and times).

        >>> ExtractiveSummarizer().facts([SummaryItem(id="m1", content="ok. Demo at 10:00.")])
        [('m1', 'Demo at 10:00.', ('10:00',))]
        """
        spam, _ = self._spam(items)
        sentences, _ = self._sentences(items, spam)
        out = []
        for sentence in sentences:
            text = _CITATION.sub("", sentence.text)
            if self.background is None:
                values = fact_values(text) if sentence.fact else ()
            else:
                folded = " ".join(text.split()).casefold()
                values = tuple(sorted(sentence.values, key=lambda v: (folded.find(v), v)))
            if values:
                out.append((items[sentence.item].id, text, values))
        return out

    def _spam(self, items: Sequence[SummaryItem]) -> tuple[set[int], list[str]]:
        groups: dict[str, list[int]] = {}
        for position, item in enumerate(items):
            if item.kind != "summary":
                groups.setdefault(_spam_key(item.content), []).append(position)
        spam: set[int] = set()
        lines: list[tuple[int, int, str]] = []
        for members in groups.values():
            bot = all(items[m].author_kind in ("bot", "tool") for m in members)
            if len(members) < self.spam_min_repeats and not (bot and len(members) >= 2):
                continue
            spam.update(members)
            last = items[members[-1]]
            authors = list(dict.fromkeys(items[m].author or "?" for m in members))
            who = ", ".join(authors[:2]) + (" and others" if len(authors) > 2 else "")
            text = " ".join(last.content.split())
            if len(text) > 100:
                text = text[:97] + "..."
            lines.append((-len(members), members[0], f"{who} x{len(members)}, last: {text}"))
        for author, members in self._templated(items, spam).items():
            spam.update(members)
            text = " ".join(items[members[-1]].content.split())
            if len(text) > 100:
                text = text[:97] + "..."
            lines.append((-len(members), members[0], f"{author} x{len(members)}, last: {text}"))
        return spam, [line for _, _, line in sorted(lines)]

    def _templated(self, items: Sequence[SummaryItem], spam: set[int]) -> dict[str, list[int]]:
        """A bot's messages written from one template with other values filled in ("Deploy
        #N of X to Y succeeded"), by author: messages of a bot or tool at least half of whose
        word pairs (numbers masked) recur in ``boilerplate_repeats`` or more of that author's
        messages, when there are that many such messages."""
        pairs_of: dict[int, set[tuple[str, str]]] = {}
        counts: dict[tuple[str, tuple[str, str]], int] = {}
        for position, item in enumerate(items):
            if (
                position in spam
                or item.kind == "summary"
                or item.author_kind not in ("bot", "tool")
            ):
                continue
            found = set(itertools.pairwise(_WORD.findall(_VOLATILE.sub("0", item.content.lower()))))
            pairs_of[position] = found
            for pair in found:
                key = (item.author or "?", pair)
                counts[key] = counts.get(key, 0) + 1
        out: dict[str, list[int]] = {}
        for position, found in pairs_of.items():
            author = items[position].author or "?"
            common = sum(counts[(author, p)] >= self.boilerplate_repeats for p in found)
            if found and common * 2 >= len(found):
                out.setdefault(author, []).append(position)
        return {a: m for a, m in out.items() if len(m) >= self.boilerplate_repeats}

    def _sentences(
        self, items: Sequence[SummaryItem], spam: set[int]
    ) -> tuple[list[_Sentence], list[str]]:
        out: list[_Sentence] = []
        carried_spam: list[str] = []
        for position, item in enumerate(items):
            if position in spam:
                continue
            if item.kind == "summary":
                section = "main_events"
                for raw in item.content.splitlines():
                    line = raw.strip()
                    if line in _SUMMARY_HEADERS:
                        section = _SUMMARY_HEADERS[line]
                    elif line.startswith(("Summary of ", "Entities: ")) or not line:
                        continue
                    else:
                        # An earlier summary's line keeps its own citation and time.
                        text = line.removeprefix("- ").strip()
                        if section == "spam_patterns":
                            carried_spam.append(_CITATION.sub("", text))
                        elif text:
                            values = _values(_CITATION.sub("", text))
                            sentence = _Sentence(len(out), position, text, section)
                            sentence.fact, sentence.values = bool(values), values
                            out.append(sentence)
                continue
            for text in split_sentences(item.content):
                if not _is_chatter(text):
                    sentence = _Sentence(len(out), position, text, "main_events")
                    sentence.values = _values(text)
                    sentence.fact = bool(sentence.values)
                    out.append(sentence)
        # A question someone answered is not a fact of its own (its answer is): only the
        # values it names are.
        for index in _answered_questions(items, out, {}):
            sentence = out[index]
            if sentence.values == _values(sentence.text) and len(sentence.values) == 1:
                (only,) = sentence.values
                if only == " ".join(sentence.text.split()).casefold():
                    sentence.fact, sentence.values = False, frozenset()
        if self.background is not None:
            # Beyond the cluster: a value every other message of the corpus names (a template's
            # acronym, a running topic) is no news; a question of stock words neither.
            # And a word the corpus rarely says ("allergic to almonds") is what a question would
            # ask for, fact-shaped or not: it is a value of its sentence.
            news, common = self.background.news, self.background.common
            for sentence in out:
                if items[sentence.item].kind != "summary":
                    kept = {v for v in sentence.values if news(v) or not _terms(v)}
                    kept.update(t for t in _terms(sentence.text) if not common(t))
                    sentence.values, sentence.fact = frozenset(kept), bool(kept)
        return out, carried_spam

    def _entities(
        self, items: Sequence[SummaryItem], spam: set[int], sentences: list[_Sentence]
    ) -> list[str]:
        counts: dict[str, int] = {}

        def add(name: str) -> None:
            counts[name] = counts.get(name, 0) + 1

        for position, item in enumerate(items):
            if position in spam:
                continue
            if item.author and item.author_kind == "human":
                add(item.author)
            if item.kind == "summary":
                for line in item.content.splitlines():
                    if line.startswith("Entities: "):
                        for name in line[len("Entities: ") :].split(", "):
                            add(name)
        for sentence in sentences:
            text = _AUTHOR_PREFIX.sub("", sentence.text)
            for match in _ENTITY.finditer(text):
                name = match.group()
                # A capitalised first word is usually just the start of a sentence.
                if match.start() == 0 and " " not in name and name[1:].islower():
                    continue
                if name.lower() not in _STOPWORDS:
                    add(name)
        ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
        return [name for name, _ in ranked[: self.max_entities]]

    def _score(
        self,
        items: Sequence[SummaryItem],
        sentences: list[_Sentence],
        tokenizer: TokenCounter,
        heads: Sequence[str],
    ) -> None:
        documents = max(1, len({s.item for s in sentences}))
        frequency: dict[str, int] = {}
        per_item: dict[int, set[str]] = {}
        for sentence in sentences:
            per_item.setdefault(sentence.item, set()).update(_terms(sentence.text))
        for terms in per_item.values():
            for term in terms:
                frequency[term] = frequency.get(term, 0) + 1
        # Phrase-level rarity: word pairs that recur across several messages of the batch
        # ("anyone else seeing this", a bot's template) carry little information.
        pair_items: dict[tuple[str, str], set[int]] = {}
        for sentence in sentences:
            words = _WORD.findall(sentence.text.lower())
            for pair in itertools.pairwise(words):
                pair_items.setdefault(pair, set()).add(sentence.item)
        answered = _answered_questions(items, sentences, per_item)
        infos = []
        for sentence in sentences:
            unique = dict.fromkeys(_terms(sentence.text))
            infos.append(sum(math.log((1 + documents) / (1 + frequency[t])) + 1 for t in unique))
        top = max(infos, default=1.0) or 1.0
        for sentence, info in zip(sentences, infos, strict=True):
            if self.background is not None:
                sentence.rare = self.background.news(sentence.text)
            else:
                sentence.rare = any(frequency[t] == 1 for t in _terms(sentence.text))
            item = items[sentence.item]
            text = sentence.text
            score = info / top
            fresh = item.kind != "summary"  # lines of a summary keep the section they had
            if _DECISION.search(text):
                score += 2.0
                if fresh and sentence.section == "main_events":
                    sentence.section = "decisions"
            if _CHANGE.search(text):
                score += 0.6
            words = _WORD.findall(text.lower())
            pairs = list(itertools.pairwise(words))
            if pairs:
                common = sum(len(pair_items[p]) >= self.boilerplate_repeats for p in pairs)
                score -= 2.0 * common / len(pairs)
            if _FIRST_PERSON.search(text) and (_ENTITY.search(text) or re.search(r"\d", text)):
                score += 0.6  # someone saying something specific about themselves: a fact
            if re.search(r"\d", text):
                score += 0.6
            score += 0.3 * min(3, len(_ENTITY.findall(text)))
            asks = text.rstrip().endswith(("?", "？", "؟"))
            if fresh and asks and sentence.section == "main_events":
                if sentence.index in answered:
                    score -= 0.3
                else:
                    score += 1.2
                    sentence.section = "open_loops"
            if item.author_kind in ("bot", "tool"):
                score -= 0.5
            if len(unique_terms := _terms(text)) < 3:
                score -= 0.8 if unique_terms else 1.5
            # A fact is kept whole unless it is very long (a pasted log).
            limit = self.max_sentence_tokens * (4 if sentence.fact else 1)
            sentence.text = _shorten(text, tokenizer, limit)
            sentence.score = max(score, 0.01)
            sentence.cost = tokenizer.count(heads[sentence.item] + sentence.text) + 2

    def _head(self, item: SummaryItem, one_day: bool, one_minute: bool = False) -> str:
        """``[id] time author: `` before a message's sentence (the time without its date when
        the whole summary is one UTC day, which its header names; no time when it is all one
        minute, which the header states); nothing before a line of an earlier summary, which
        carries its own."""
        if item.kind == "summary":
            return ""
        cite = f"[{item.id}] " if self.cite_sources else ""
        when = ""
        if item.created_at is not None and not one_minute:
            stamp = format_time(item.created_at, precision="minutes")
            when = (stamp[11:16] if one_day else stamp[5:16].replace("T", " ")) + " "
        who = f"{item.author}: " if item.author else ""
        return f"{cite}{when}{who}"


# ---------------------------------------------------------------------------- fact checks


def _normal(text: str) -> str:
    return " ".join(text.split()).casefold()


def _item_sentences(item: SummaryItem) -> list[str]:
    if item.kind != "summary":
        return split_sentences(item.content)
    lines = (line.strip().removeprefix("- ") for line in item.content.splitlines()[1:])
    return [line for line in lines if line and not line.endswith(":")]


def cluster_facts(
    items: Sequence[SummaryItem], background: Background | None = None
) -> list[tuple[str, str, tuple[str, ...]]]:
    """The facts of ``items`` as ``(id, sentence, values)`` (:meth:`ExtractiveSummarizer.facts`,
    judged against ``background`` when given)."""
    return ExtractiveSummarizer(background=background).facts(items)


def lost_facts(
    items: Sequence[SummaryItem], text: str, background: Background | None = None
) -> list[tuple[str, str]]:
    """The fact sentences of ``items`` whose values (numbers, times, names, quoted values; a
    question or a caseless-script sentence as a whole) are not all in ``text``, as
    ``(id, sentence)``: what a question about them could no longer find. Repeated messages
    (a bot's alerts) are noise, not facts (:meth:`ExtractiveSummarizer.facts`); with a
    ``background``, values the corpus names everywhere are no facts either.

    >>> items = [SummaryItem(id="m1", content="Demo moved to Thursday 10:00.")]
    >>> lost_facts(items, "[m1] demo moved to Thursday 10:00.")
    []
    >>> lost_facts(items, "demo moved")
    [('m1', 'Demo moved to Thursday 10:00.')]
    """
    have = _normal(text)
    return [
        (id_, sentence)
        for id_, sentence, values in cluster_facts(items, background)
        if not all(_normal(v) in have for v in values)
    ]


def dropped_sentences(items: Sequence[SummaryItem], text: str) -> list[tuple[str, str]]:
    """The sentences of ``items`` (or lines of earlier summaries) not in ``text`` verbatim, as
    ``(id, sentence)``: what ``compact --plan`` says a summary drops."""
    have = _normal(text)
    return [
        (item.id, sentence)
        for item in items
        for sentence in _item_sentences(item)
        if _normal(sentence) not in have
    ]


def fact_tokens(
    items: Sequence[SummaryItem], tokenizer: TokenCounter, background: Background | None = None
) -> int:
    """Tokens the fact lines need: each sentence, its ``[id] HH:MM author:`` and the header."""
    facts = novel_facts(cluster_facts(items, background))
    if not facts:
        return 0
    authors = {item.id: item.author or "" for item in items}
    text = "\n".join(f"- [{i}] 00:00 {authors[i]}: {s}" for i, s, _ in facts)
    return tokenizer.count(text) + 24


def _fit(values: list[str], budget: float, tokenizer: TokenCounter, joiner: str) -> list[str]:
    kept: list[str] = []
    for value in values:
        if tokenizer.count(joiner.join([*kept, value])) > budget:
            break
        kept.append(value)
    return kept


def _answered_questions(
    items: Sequence[SummaryItem], sentences: list[_Sentence], terms: dict[int, set[str]]
) -> set[int]:
    """Questions a later message by someone else in the same channel (or thread) answers:
    one of the next eight there that shares a term with the question."""
    answered: set[int] = set()
    for sentence in sentences:
        if not sentence.text.rstrip().endswith(("?", "？", "؟")):
            continue
        asked = items[sentence.item]
        words = set(_terms(sentence.text))
        seen = 0
        for later in range(sentence.item + 1, len(items)):
            other = items[later]
            same_place = (
                other.thread_id == asked.thread_id
                if asked.thread_id is not None
                else other.channel == asked.channel
            )
            if not same_place or other.author == asked.author:
                continue
            seen += 1
            reply_terms = terms.get(later, set(_terms(other.content)))
            if words & reply_terms or (asked.author and asked.author in other.content):
                answered.add(sentence.index)
                break
            if seen >= 8:
                break
    return answered


def _shorten(text: str, tokenizer: TokenCounter, limit: int) -> str:
    cost = tokenizer.count(text)
    if cost <= limit:
        return text
    words = text.split()
    keep = max(1, int(len(words) * limit / cost))
    while keep > 1 and tokenizer.count(" ".join(words[:keep]) + " ...") > limit:
        keep -= max(1, keep // 8)
    return " ".join(words[:keep]) + " ..."


def _choose(sentences: list[_Sentence], budget: int, min_score: float) -> list[_Sentence]:
    """Every fact that fits first (best per token first), then the rest by score."""
    chosen: list[_Sentence] = []
    seen: set[str] = set()
    spent = 0
    ranked = sorted(sentences, key=lambda s: (not s.fact, -s.score / math.sqrt(s.cost), s.index))
    covered: set[str] = set()
    for sentence in ranked:
        key = " ".join(_terms(sentence.text)) or sentence.text
        # A fact whose every value is already kept is kept only on its merit as text.
        novel = sentence.fact and bool(sentence.values - covered)
        low = (sentence.score < min_score or not sentence.rare) and not novel
        if low or key in seen or spent + sentence.cost > budget:
            continue
        seen.add(key)
        chosen.append(sentence)
        covered |= sentence.values
        spent += sentence.cost
    return chosen


def _with_sections(
    summary: Summary,
    items: Sequence[SummaryItem],
    chosen: list[_Sentence],
    heads: Sequence[str],
) -> Summary:
    """Lines per section in input order; consecutive sentences of one item share a line."""
    sections: dict[str, list[str]] = {"main_events": [], "decisions": [], "open_loops": []}
    previous: tuple[str, int] | None = None
    for sentence in sorted(chosen, key=lambda s: s.index):
        lines = sections[sentence.section]
        merge = items[sentence.item].kind != "summary"
        if merge and previous == (sentence.section, sentence.item):
            glue = "" if lines[-1].endswith(("。", "！", "？")) else " "
            lines[-1] = f"{lines[-1]}{glue}{sentence.text}"
        else:
            lines.append(heads[sentence.item] + sentence.text)
        previous = (sentence.section, sentence.item)
    return replace(
        summary,
        main_events=tuple(sections["main_events"]),
        decisions=tuple(sections["decisions"]),
        open_loops=tuple(sections["open_loops"]),
    )
