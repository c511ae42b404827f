"""Times named in a query, resolved against the asking time: what "on 13 October", "last week of
May", "in 2022" or "yesterday" mean as spans of time. Pure: no I/O, no clock of its own.

A chat memory's text rarely carries its own date (its ``created_at`` does), so a question that
names a time ("what did Ana show Bo on October 13?") is answered by memories *of* that time,
not by memories that *say* it. :func:`time_spans` finds the expressions and resolves each to a
half-open span ``[start, end)`` of Unix seconds (UTC: a memory's time has no zone); retrieval
(:mod:`ctxwarden.retrieve`) then prefers memories created within a span.

Recognised, in English (the month and weekday names are the ``calendar`` module's):

- dates: ``2023-10-13``, ``13 October 2023``, ``13th of Oct``, ``October 13, 2023``,
  ``October 2023``, ``in May`` (a month name alone only after a preposition such as *in*,
  *during*, *since*, *of*, *early*, *late*, since "may" and "march" are verbs too), ``in 2022``;
  a date without a year is the latest such date not after the asking time;
- parts of a month: ``the first / second / third / fourth / last week of May``, ``early /
  mid / late May``;
- relative times: ``today``, ``tonight``, ``yesterday``, ``the day before yesterday``,
  ``last / this / past / previous week | weekend | month | year``, ``N days / weeks / months /
  years ago`` (digits or *a*, *one* ... *twelve*), ``last Monday``;
- anchors: ``the week / weekend / day / month before X``, ``before X``, ``after X`` / ``since X``
  (X a date). A relative time in a question that also names a date ("last week, as mentioned on
  6 November") is resolved against that date, not the asking time.

Parsing of the date text itself and month arithmetic are python-dateutil's (``parser.parse``
with the asking time as the default for missing fields, ``relativedelta``).

>>> from datetime import datetime, UTC
>>> now = datetime(2024, 1, 10, 12, tzinfo=UTC).timestamp()
>>> [(s.text, _day(s.start)) for s in time_spans("What did Ana do on 13 October?", now)]
[('13 October', '2023-10-13')]
>>> [(_day(s.start), _day(s.end)) for s in time_spans("Where was Bo the last week of May?", now)]
[('2023-05-25', '2023-06-01')]
"""

from __future__ import annotations

import calendar
import re
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta

from dateutil import parser as date_parser
from dateutil.relativedelta import relativedelta

__all__ = ["TimeSpan", "time_spans"]


@dataclass(frozen=True, slots=True)
class TimeSpan:
    """A span of time a query names: ``[start, end)`` in Unix seconds, and the words that name it.

    ``slack`` is how long after ``end`` a memory still counts as about this time, at half weight
    (people tell of a day or a month soon after it): see :meth:`match`.
    """

    start: float
    end: float
    text: str
    slack: float

    def match(self, at: float) -> float:
        """1.0 for a time within the span, 0.5 within ``slack`` after it, else 0.0.

        >>> TimeSpan(10.0, 20.0, "x", 5.0).match(12.0), TimeSpan(10.0, 20.0, "x", 5.0).match(22.0)
        (1.0, 0.5)
        """
        if self.start <= at < self.end:
            return 1.0
        if self.end <= at < self.end + self.slack:
            return 0.5
        return 0.0


_DAY_SECONDS = 86400.0
#: Only the query's first characters are read, and at most this many spans kept: a question
#: names a time or two, and a pasted megabyte must not cost a scan per span found.
MAX_CHARS = 4000
MAX_SPANS = 8
_MONTHS = {
    name.casefold(): number
    for number in range(1, 13)
    for name in (calendar.month_name[number], calendar.month_abbr[number])
}
_MONTHS["sept"] = 9
_MONTH = "|".join(sorted(_MONTHS, key=len, reverse=True))
_WEEKDAYS = {calendar.day_name[n].casefold(): n for n in range(7)}
_WEEKDAY = "|".join(_WEEKDAYS)
_NUMBERS = {
    "a": 1, "an": 1, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6,
    "seven": 7, "eight": 8, "nine": 9, "ten": 10, "eleven": 11, "twelve": 12,
}  # fmt: skip
_NUMBER = r"\d{1,3}|" + "|".join(_NUMBERS)
_ORDINALS = {"first": 0, "1st": 0, "second": 1, "2nd": 1, "third": 2, "3rd": 2, "fourth": 3,
             "4th": 3, "last": -1, "final": -1}  # fmt: skip
_ORDINAL = "|".join(_ORDINALS)
_DAYNUM = r"(?:[12]\d|3[01]|0?[1-9])(?:st|nd|rd|th)?"
_YEAR = r"(?:1[89]|2\d)\d\d"

# A date: day month [year], month day [year], ISO. Month [year]. A year after a preposition.
_DATE = (
    rf"(?P<iso>{_YEAR}-[01]\d-[0-3]\d)"
    rf"|(?P<dmy>{_DAYNUM}(?:\s+of)?\s+(?:{_MONTH})\.?(?:,?\s*{_YEAR})?)"
    rf"|(?P<mdy>(?:{_MONTH})\.?\s+{_DAYNUM}(?![\d:])(?:,?\s*{_YEAR})?)"
    rf"|(?P<my>(?:{_MONTH})\.?,?\s+{_YEAR})"
)
_LEAD = (
    r"in|during|since|of|until|till|by|before|after|from|through|throughout|around|this|last|next"
)
_PATTERNS: list[tuple[str, re.Pattern[str]]] = [
    (
        "part",
        re.compile(
            rf"\b(?:the\s+)?(?P<ord>{_ORDINAL})\s+week\s+of\s+(?P<month>{_MONTH})\b\.?"
            rf"(?:,?\s*(?P<year>{_YEAR}))?",
            re.IGNORECASE,
        ),
    ),
    (
        "third",
        re.compile(
            rf"\b(?P<third>early|mid|late)[\s-]+(?P<month>{_MONTH})\b\.?"
            rf"(?:,?\s*(?P<year>{_YEAR}))?",
            re.IGNORECASE,
        ),
    ),
    (
        "anchored",
        re.compile(
            rf"\b(?:the\s+)?(?:(?P<unit>day|week|weekend|month)\s+)?(?P<rel>before|after|since)\s+"
            rf"(?P<date>{_DATE})",
            re.IGNORECASE,
        ),
    ),
    ("date", re.compile(rf"\b(?:{_DATE})\b", re.IGNORECASE)),
    (
        "month",
        re.compile(
            rf"\b(?:{_LEAD})\s+(?:the\s+month\s+of\s+)?(?P<month>{_MONTH})\b(?!\s*\d)",
            re.IGNORECASE,
        ),
    ),
    ("year", re.compile(rf"\b(?:{_LEAD}|year)\s+(?:of\s+)?(?P<year>{_YEAR})\b", re.IGNORECASE)),
    (
        "ago",
        re.compile(
            rf"\b(?P<count>{_NUMBER})\s+(?P<unit>day|week|month|year)s?\s+ago\b", re.IGNORECASE
        ),
    ),
    (
        "relative",
        re.compile(
            r"\b(?:(?P<today>today|tonight|this\s+morning|this\s+evening)"
            r"|(?P<before_yesterday>the\s+day\s+before\s+yesterday)|(?P<yesterday>yesterday)"
            r"|(?P<which>last|this|past|previous)\s+(?P<unit>week|weekend|month|year))\b",
            re.IGNORECASE,
        ),
    ),
    ("weekday", re.compile(rf"\b(?:last|on|this)\s+(?P<weekday>{_WEEKDAY})\b", re.IGNORECASE)),
]


def _day(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).date().isoformat()


def _ts(day: date) -> float:
    return datetime(day.year, day.month, day.day, tzinfo=UTC).timestamp()


def _span(start: date, end: date, text: str) -> TimeSpan:
    """Days ``[start, end)``, with half the span (at least a day, at most 30) as slack."""
    days = (end - start).days
    return TimeSpan(_ts(start), _ts(end), text, _DAY_SECONDS * min(30, max(1, days // 2)))


def _latest(month: int, day: int, year: int | None, anchor: date) -> date | None:
    """The date, its year the given one or the latest that puts it not after ``anchor``."""
    if year is not None:
        try:
            return date(year, month, day)
        except ValueError:
            return None
    for candidate_year in (anchor.year, anchor.year - 1):
        try:
            found = date(candidate_year, month, day)
        except ValueError:
            continue
        if found <= anchor:
            return found
    return None


def _parse_date(text: str, anchor: date) -> tuple[date, str] | None:
    """A date expression (a ``_DATE`` match) as its first day and grain ("day" or "month")."""
    has_year = re.search(rf"\b{_YEAR}\b", text) is not None
    has_day = re.search(rf"(?<![\d-]){_DAYNUM}(?![\d])", re.sub(_YEAR, "", text)) is not None
    default = datetime(anchor.year, anchor.month, 1)
    try:
        parsed = date_parser.parse(text, default=default, fuzzy=True).date()
    except (ValueError, OverflowError):
        return None
    grain = "day" if has_day or re.fullmatch(rf"{_YEAR}-[01]\d-[0-3]\d", text) else "month"
    first = parsed if grain == "day" else parsed.replace(day=1)
    if not has_year:
        latest = _latest(first.month, first.day, None, anchor)
        if latest is None:
            return None
        first = latest
    return first, grain


def _date_span(text: str, anchor: date) -> TimeSpan | None:
    parsed = _parse_date(text, anchor)
    if parsed is None:
        return None
    first, grain = parsed
    end = first + (timedelta(days=1) if grain == "day" else relativedelta(months=1))
    return _span(first, end, text)


def _month_first(name: str, year: str | None, anchor: date) -> date | None:
    month = _MONTHS[name.casefold().rstrip(".")]
    return _latest(month, 1, int(year) if year else None, anchor)


def _resolve(kind: str, match: re.Match[str], anchor: date) -> TimeSpan | None:
    text = match.group().strip()
    if kind == "date":
        return _date_span(text, anchor)
    if kind == "part":
        first = _month_first(match["month"], match["year"], anchor)
        if first is None:
            return None
        end_of_month = first + relativedelta(months=1)
        index = _ORDINALS[match["ord"].casefold()]
        start = end_of_month - timedelta(days=7) if index < 0 else first + timedelta(weeks=index)
        return _span(start, min(end_of_month, start + timedelta(days=7)), text)
    if kind == "third":
        first = _month_first(match["month"], match["year"], anchor)
        if first is None:
            return None
        offset = {"early": 0, "mid": 10, "late": 20}[match["third"].casefold()]
        end = first + relativedelta(months=1) if offset == 20 else first + timedelta(offset + 10)
        return _span(first + timedelta(days=offset), end, text)
    if kind == "anchored":
        base = _date_span(match["date"], anchor)
        if base is None:
            return None
        start = datetime.fromtimestamp(base.start, UTC).date()
        end = datetime.fromtimestamp(base.end, UTC).date()
        length = {"day": 1, "week": 7, "weekend": 3, "month": 31}.get(
            (match["unit"] or "week").casefold(), 7
        )
        if match["rel"].casefold() == "before":
            return _span(start - timedelta(days=length), start, text)
        return _span(start, end + timedelta(days=length), text)
    if kind == "month":
        if not match["month"][:1].isupper():  # "in may" is a verb more often than a month
            return None
        first = _month_first(match["month"], None, anchor)
        return None if first is None else _span(first, first + relativedelta(months=1), text)
    if kind == "year":
        year = int(match["year"])
        return _span(date(year, 1, 1), date(year + 1, 1, 1), text)
    if kind == "ago":
        count = match["count"].casefold()
        number = _NUMBERS.get(count) or int(count)
        unit = match["unit"].casefold()
        delta = relativedelta(**{f"{unit}s": number})
        center = anchor - delta
        half = {"day": 1, "week": 4, "month": 15, "year": 183}[unit]
        return _span(center - timedelta(days=half), center + timedelta(days=half), text)
    if kind == "weekday":
        target = _WEEKDAYS[match["weekday"].casefold()]
        back = (anchor.weekday() - target) % 7 or 7
        day = anchor - timedelta(days=back)
        return _span(day, day + timedelta(days=1), text)
    return _relative(match, anchor, text)


def _relative(match: re.Match[str], anchor: date, text: str) -> TimeSpan | None:
    if match["today"]:
        return _span(anchor, anchor + timedelta(days=1), text)
    if match["yesterday"]:
        return _span(anchor - timedelta(days=1), anchor, text)
    if match["before_yesterday"]:
        return _span(anchor - timedelta(days=2), anchor - timedelta(days=1), text)
    which, unit = match["which"].casefold(), match["unit"].casefold()
    this = which == "this"
    if unit == "week":
        monday = anchor - timedelta(days=anchor.weekday())
        if this:
            return _span(monday, anchor + timedelta(days=1), text)
        if which == "past":
            return _span(anchor - timedelta(days=7), anchor + timedelta(days=1), text)
        return _span(monday - timedelta(days=7), monday, text)
    if unit == "weekend":
        saturday = anchor - timedelta(days=(anchor.weekday() - 5) % 7)
        if this and anchor.weekday() >= 5:
            return _span(saturday, saturday + timedelta(days=2), text)
        if saturday >= anchor:
            saturday -= timedelta(days=7)
        return _span(saturday, saturday + timedelta(days=2), text)
    if unit == "month":
        first = anchor.replace(day=1)
        if this:
            return _span(first, anchor + timedelta(days=1), text)
        if which == "past":
            return _span(anchor - timedelta(days=30), anchor + timedelta(days=1), text)
        return _span(first - relativedelta(months=1), first, text)
    january = date(anchor.year, 1, 1)
    if this:
        return _span(january, anchor + timedelta(days=1), text)
    if which == "past":
        return _span(anchor - timedelta(days=365), anchor + timedelta(days=1), text)
    return _span(date(anchor.year - 1, 1, 1), january, text)


def time_spans(query: str, now: float) -> list[TimeSpan]:
    """The spans of time ``query`` names, resolved against ``now`` (the asking time, Unix
    seconds, UTC), in the order the query names them; ``[]`` when it names none.

    Only the first :data:`MAX_CHARS` characters are read and the first :data:`MAX_SPANS` spans
    kept. Each stretch of the query is read once, the most specific pattern first ("the last week of
    May" is not also "May"). Relative times ("last week") are resolved against the first full
    date the query names, when it names one, else against ``now``.

    >>> from datetime import datetime, UTC
    >>> now = datetime(2023, 11, 20, tzinfo=UTC).timestamp()
    >>> [s.text for s in time_spans("What happened last week, as mentioned on 6 November?", now)]
    ['last week', '6 November']
    >>> time_spans("May I ask what you think?", now)
    []
    """
    query = query[:MAX_CHARS]
    if not query or not any(c.isalnum() for c in query):
        return []
    today = datetime.fromtimestamp(now, UTC).date()
    taken: list[tuple[int, int]] = []
    found: list[tuple[int, str, re.Match[str]]] = []
    for kind, pattern in _PATTERNS:
        for match in pattern.finditer(query):
            start, end = match.span()
            if any(start < e and s < end for s, e in taken):
                continue
            taken.append((start, end))
            found.append((start, kind, match))
            if len(found) >= 4 * MAX_SPANS:  # bounds the overlap checks above
                break
    found.sort(key=lambda item: item[0])
    anchor = today
    for _, kind, match in found:
        if kind == "date":
            parsed = _parse_date(match.group().strip(), today)
            if parsed is not None and parsed[1] == "day":
                anchor = parsed[0]
                break
    spans: list[TimeSpan] = []
    for _, kind, match in found:
        if len(spans) >= MAX_SPANS:
            break
        relative = kind in ("ago", "relative", "weekday")
        span = _resolve(kind, match, anchor if relative else today)
        if span is not None and span.start < span.end:
            spans.append(span)
    return spans
