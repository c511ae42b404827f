"""What a summary is, whoever writes it: :class:`Summary`, its items, the :class:`Summarizer`.

A :class:`Summary` has the fields ``time_range``, ``key_entities``, ``main_events``,
``decisions``, ``open_loops``, ``spam_patterns`` and ``source_ids``. Its :meth:`Summary.render`
is the compact text that goes into a prompt, and a summariser's contract is that this rendered
text counts at most ``max_tokens`` with the tokenizer it is given. The summarisers themselves
are in :mod:`ctxwarden.summarize`, which re-exports everything public here.

Provenance convention: ``source_ids`` lists every input the summary covers (spam included), in
input order. Lines of ``main_events``, ``decisions`` and ``open_loops`` may start with a citation
``[id]`` or ``[id1,id2]``; :func:`line_sources` reads it back.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, fields, replace
from typing import Any, Protocol, runtime_checkable

from ctxwarden.attachments import with_note
from ctxwarden.errors import InputError, SummarizeError
from ctxwarden.sentences import cjk_bigrams, words
from ctxwarden.types import format_time, parse_time

__all__ = [
    "LIST_FIELDS",
    "Summarizer",
    "Summary",
    "SummaryItem",
    "TokenCounter",
    "line_sources",
    "summary_excerpt",
    "truncate_summary",
]

#: The list fields of a summary, in render order.
LIST_FIELDS = ("key_entities", "main_events", "decisions", "open_loops", "spam_patterns")
_SECTION_TITLES = {
    "main_events": "Events:",
    "decisions": "Decisions:",
    "open_loops": "Open questions:",
    "spam_patterns": "Noise:",
}
_CITATION = re.compile(r"^\[([^\[\]\s]+(?:,\s*[^\[\]\s,]+)*)\]\s*")


class TokenCounter(Protocol):
    """Anything that counts tokens; :class:`ctxwarden.tokens.Tokenizer` is one."""

    def count(self, text: str) -> int:
        """The number of tokens in ``text``."""
        ...


@dataclass(frozen=True, kw_only=True)
class SummaryItem:
    """One input to a summariser: a stored message or an earlier summary.

    ``created_at`` is epoch seconds (UTC), as :class:`ctxwarden.types.Memory` keeps it;
    ``author_kind`` is ``human``, ``bot``, ``agent`` or ``tool``; ``kind`` is ``summary`` for
    the rendered text of an earlier summary (summaries of summaries), else ``message``.
    :meth:`of` copies these attributes from any object that has them (a ``Memory``).
    """

    id: str
    content: str
    author: str | None = None
    author_kind: str = "human"
    channel: str | None = None
    created_at: float | None = None
    kind: str = "message"
    thread_id: str | None = None

    @classmethod
    def of(cls, source: Any) -> SummaryItem:
        """Build an item from any object with the same attribute names (e.g. a Memory).

        A source's ``attachments`` follow its content as they do in a prompt
        (:func:`ctxwarden.attachments.with_note`): what only an image's caption or a file's
        name says is the message's too, so a summary keeps it (or its loss is seen) like any
        other sentence.

        >>> from types import SimpleNamespace
        >>> image = {"kind": "image", "caption": "the whiteboard: launch on 3 May"}
        >>> SummaryItem.of(SimpleNamespace(id="m1", content="look", attachments=[image])).content
        'look [image: the whiteboard: launch on 3 May]'
        """
        item = cls(
            **{f.name: getattr(source, f.name) for f in fields(cls) if hasattr(source, f.name)}
        )
        attachments = getattr(source, "attachments", None)
        if attachments:
            item = replace(item, content=with_note(item.content, attachments))
        return item


def line_sources(line: str) -> tuple[str, ...]:
    """The source ids a summary line cites (``"[m1,m2] text"`` gives ``("m1", "m2")``).

    >>> line_sources("[m1,m2] alice: moved to Friday")
    ('m1', 'm2')
    >>> line_sources("no citation")
    ()
    """
    match = _CITATION.match(line)
    if match is None:
        return ()
    return tuple(part.strip() for part in match.group(1).split(","))


def _line_terms(text: str) -> set[str]:
    """Words of two or more letters (a CJK run gives its character pairs instead)."""
    return {w for w in words(text) if len(w) > 1} | set(cjk_bigrams(text))


def summary_excerpt(content: str, query: str, *, max_lines: int = 6) -> str | None:
    r"""The lines of a rendered summary that answer ``query``: its header line, then at most
    ``max_lines`` of its item lines that share a term with the query, in their order; None when
    no line does (the caller shows the summary whole).

    A summary is one memory with many lines, found by retrieval because some line matches; the
    matching lines cost what their originals did, the rest of the summary is noise to this
    query. A query term counts only when fewer than half of the summary's lines hold it (a word
    on every line, like a common function word, tells lines apart no better than nothing); a
    line's score is the sum of its terms' rarity among the lines, the best lines are kept.
    No word list: the same rule for every language (CJK by character pairs).

    >>> text = "Summary of 3 messages\nEvents:\n- [m1] ana: demo on Friday\n- [m2] bo: lunch"
    >>> print(summary_excerpt(text, "when is the demo?"))
    Summary of 3 messages
    - [m1] ana: demo on Friday
    """
    lines = content.splitlines()
    if not lines:
        return None
    items = [(n, line) for n, line in enumerate(lines) if line.startswith("- ")]
    wanted = _line_terms(query)
    if not items or not wanted:
        return None
    holding: dict[str, list[int]] = {}
    for n, line in items:
        for term in _line_terms(_CITATION.sub("", line[2:])) & wanted:
            holding.setdefault(term, []).append(n)
    scores: dict[int, float] = {}
    for found in holding.values():
        if len(found) * 2 > len(items) and len(items) > 2:
            continue
        weight = 1.0 / len(found)
        for n in found:
            scores[n] = scores.get(n, 0.0) + weight
    if not scores:
        return None
    best = sorted(scores, key=lambda n: (-scores[n], n))[:max_lines]
    return "\n".join([lines[0], *(lines[n] for n in sorted(best))])


def _field_strings(data: Mapping[str, Any], name: str) -> tuple[str, ...]:
    value = data.get(name, [])
    if value is None:
        return ()
    if not isinstance(value, list | tuple):
        raise InputError(f"must be a list of strings, got {type(value).__name__}", field=name)
    out = []
    for index, item in enumerate(value):
        if not isinstance(item, str):
            raise InputError(
                f"must be a string, got {type(item).__name__}", field=f"{name}[{index}]"
            )
        text = " ".join(item.split())
        if text:
            out.append(text)
    return tuple(out)


def _time_bound(value: Any, name: str) -> str:
    if not isinstance(value, str | int | float) or isinstance(value, bool):
        raise InputError("must be an ISO 8601 time", field=name)
    try:
        return format_time(parse_time(value, field_name=name))
    except InputError:
        raise
    except (ValueError, OverflowError, OSError) as exc:
        raise InputError(f"not a usable time: {exc}", field=name) from exc


@dataclass(frozen=True, kw_only=True)
class Summary:
    """A structured summary. Lists are tuples; ``time_range`` is ISO 8601 UTC (start, end).

    >>> s = Summary(main_events=("[m1] alice: release moved to Friday",), source_ids=("m1",))
    >>> print(s.render())
    Summary of 1 message
    Events:
    - [m1] alice: release moved to Friday
    """

    time_range: tuple[str, str] | None = None
    key_entities: tuple[str, ...] = ()
    main_events: tuple[str, ...] = ()
    decisions: tuple[str, ...] = ()
    open_loops: tuple[str, ...] = ()
    spam_patterns: tuple[str, ...] = ()
    source_ids: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        """The JSON object (``time_range`` as ``{"start", "end"}`` or null)."""
        out: dict[str, Any] = {
            "time_range": None
            if self.time_range is None
            else {"start": self.time_range[0], "end": self.time_range[1]}
        }
        for name in (*LIST_FIELDS, "source_ids"):
            out[name] = list(getattr(self, name))
        return out

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> Summary:
        """Validate and build a summary; raises :class:`InputError` naming the bad field.

        ``time_range`` may be null, ``{"start": ..., "end": ...}`` or ``[start, end]``; missing
        list fields are empty; unknown keys are an error (the format is a contract).
        """
        if not isinstance(data, Mapping):
            raise InputError("a summary must be a JSON object", field="summary")
        unknown = sorted(set(data) - {"time_range", "source_ids", *LIST_FIELDS})
        if unknown:
            raise InputError(f"unknown field(s) {', '.join(unknown)}", field=unknown[0])
        raw = data.get("time_range")
        time_range: tuple[str, str] | None
        if raw is None:
            time_range = None
        elif isinstance(raw, Mapping):
            time_range = (
                _time_bound(raw.get("start"), "time_range.start"),
                _time_bound(raw.get("end"), "time_range.end"),
            )
        elif isinstance(raw, list | tuple) and len(raw) == 2:
            time_range = (
                _time_bound(raw[0], "time_range.start"),
                _time_bound(raw[1], "time_range.end"),
            )
        else:
            raise InputError("must be {start, end}, [start, end] or null", field="time_range")
        if time_range is not None and parse_time(time_range[0]) > parse_time(time_range[1]):
            raise InputError("start is after end", field="time_range")
        lists = {name: _field_strings(data, name) for name in LIST_FIELDS}
        sources = tuple(dict.fromkeys(_field_strings(data, "source_ids")))
        return cls(time_range=time_range, source_ids=sources, **lists)

    def render(self) -> str:
        """Compact text lines for a prompt; empty sections are left out."""
        count = len(self.source_ids)
        header = f"Summary of {count} message{'' if count == 1 else 's'}"
        if self.time_range is not None:
            start, end = (t[:16].replace("T", " ") for t in self.time_range)
            if start == end:
                header += f", {start} UTC"
            elif start[:10] == end[:10]:
                header += f", {start}-{end[11:]} UTC"
            else:
                header += f", {start} to {end} UTC"
        lines = [header]
        if self.key_entities:
            lines.append("Entities: " + ", ".join(self.key_entities))
        for name, title in _SECTION_TITLES.items():
            items: tuple[str, ...] = getattr(self, name)
            if items:
                lines.append(title)
                lines.extend(f"- {item}" for item in items)
        return "\n".join(lines)


@runtime_checkable
class Summarizer(Protocol):
    """Writes a :class:`Summary` of items whose :meth:`Summary.render` fits ``max_tokens``.

    Contract: the result's ``render()`` counts at most ``max_tokens`` with ``tokenizer``;
    ``source_ids`` lists every item summarised; the same items give the same summary from a
    deterministic summariser; failure raises :class:`SummarizeError`, never a placeholder.
    An empty ``items`` is an :class:`InputError`.
    """

    def summarize(
        self, items: Sequence[SummaryItem], *, max_tokens: int, tokenizer: TokenCounter
    ) -> Summary:
        """Summarise ``items`` within ``max_tokens`` rendered tokens."""
        ...


def _check_inputs(items: Sequence[SummaryItem], max_tokens: int) -> None:
    if not items:
        raise InputError("nothing to summarise: pass at least one item", field="items")
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens <= 0:
        raise InputError(f"must be a positive integer, got {max_tokens!r}", field="max_tokens")
    for index, item in enumerate(items):
        if not isinstance(item.id, str) or not item.id:
            raise InputError("every item needs a non-empty string id", field=f"items[{index}].id")
        if not isinstance(item.content, str):
            raise InputError("content must be text", field=f"items[{index}].content")


def _time_range(items: Iterable[SummaryItem]) -> tuple[str, str] | None:
    times = [item.created_at for item in items if item.created_at is not None]
    if not times:
        return None
    return format_time(min(times)), format_time(max(times))


def _source_ids(items: Iterable[SummaryItem]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(item.id for item in items))


def truncate_summary(summary: Summary, *, max_tokens: int, tokenizer: TokenCounter) -> Summary:
    """Drop list items deterministically until ``summary.render()`` fits ``max_tokens``.

    The last item of the section with the most text goes first (ties: noise, entities, events,
    open questions, decisions), so no section is wiped while another is long. Raises
    :class:`SummarizeError` when even the bare header does not fit.
    """
    order = ("spam_patterns", "key_entities", "main_events", "open_loops", "decisions")
    current = summary
    while tokenizer.count(current.render()) > max_tokens:
        sizes = [
            (sum(len(s) for s in getattr(current, name)), -rank, name)
            for rank, name in enumerate(order)
        ]
        size, _, name = max(sizes)
        if size == 0:
            raise SummarizeError(
                f"max_tokens={max_tokens} cannot hold even the summary header "
                f"({tokenizer.count(current.render())} tokens); raise max_tokens"
            )
        current = replace(current, **{name: getattr(current, name)[:-1]})
    return current
