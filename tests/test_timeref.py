"""Times named in a query, resolved against the asking time (ctxwarden.timeref)."""

from __future__ import annotations

from datetime import UTC, date, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ctxwarden.timeref import MAX_SPANS, TimeSpan, time_spans

NOW = datetime(2024, 1, 10, 15, 30, tzinfo=UTC).timestamp()  # a Wednesday


def _days(query: str, now: float = NOW) -> list[tuple[str, date, date]]:
    return [
        (
            s.text,
            datetime.fromtimestamp(s.start, UTC).date(),
            datetime.fromtimestamp(s.end, UTC).date(),
        )
        for s in time_spans(query, now)
    ]


@pytest.mark.parametrize(
    ("query", "start", "end"),
    [
        ("what happened on 13 October 2022?", date(2022, 10, 13), date(2022, 10, 14)),
        ("what happened on October 13, 2022?", date(2022, 10, 13), date(2022, 10, 14)),
        ("what happened on the 13th of Oct?", date(2023, 10, 13), date(2023, 10, 14)),
        ("the deploy of 2023-02-28", date(2023, 2, 28), date(2023, 3, 1)),
        ("who joined in March 2021?", date(2021, 3, 1), date(2021, 4, 1)),
        ("who joined in March?", date(2023, 3, 1), date(2023, 4, 1)),  # the latest March
        ("who joined in January?", date(2024, 1, 1), date(2024, 2, 1)),  # this one: it began
        ("what changed in 2022", date(2022, 1, 1), date(2023, 1, 1)),
        ("the last week of May", date(2023, 5, 25), date(2023, 6, 1)),
        ("the first week of February", date(2023, 2, 1), date(2023, 2, 8)),
        ("late August", date(2023, 8, 21), date(2023, 9, 1)),
        ("what did we ship yesterday?", date(2024, 1, 9), date(2024, 1, 10)),
        ("what is on today?", date(2024, 1, 10), date(2024, 1, 11)),
        ("what broke last week?", date(2024, 1, 1), date(2024, 1, 8)),
        ("what broke last month?", date(2023, 12, 1), date(2024, 1, 1)),
        ("what broke last year?", date(2023, 1, 1), date(2024, 1, 1)),
        ("last weekend", date(2024, 1, 6), date(2024, 1, 8)),
        ("last Monday", date(2024, 1, 8), date(2024, 1, 9)),
        ("three days ago", date(2024, 1, 6), date(2024, 1, 8)),
        ("the week before 16 November 2023", date(2023, 11, 9), date(2023, 11, 16)),
    ],
)
def test_spans(query: str, start: date, end: date) -> None:
    [(_, got_start, got_end)] = _days(query)
    assert (got_start, got_end) == (start, end)


def test_no_time_named() -> None:
    assert time_spans("", NOW) == []
    assert time_spans("May I ask what you march for?", NOW) == []  # verbs, not months
    assert time_spans("what is on port 8080 and in room 12?", NOW) == []
    assert time_spans("what did ana say about the release?", NOW) == []


def test_relative_time_resolves_against_the_date_the_query_names() -> None:
    spans = _days("the writing issue last week, as mentioned on November 6, 2023")
    assert spans == [
        ("last week", date(2023, 10, 30), date(2023, 11, 6)),
        ("November 6, 2023", date(2023, 11, 6), date(2023, 11, 7)),
    ]


def test_match_is_full_within_half_just_after() -> None:
    span = TimeSpan(100.0, 200.0, "x", 50.0)
    assert [span.match(t) for t in (99.0, 100.0, 199.0, 200.0, 249.0, 250.0)] == [
        0.0, 1.0, 1.0, 0.5, 0.5, 0.0,
    ]  # fmt: skip


@given(st.text(max_size=200), st.floats(min_value=0, max_value=4e9))
def test_any_text_any_time_gives_ordered_spans(query: str, now: float) -> None:
    for span in time_spans(query, now):
        assert span.start < span.end
        assert span.text in query


def test_a_huge_query_is_read_in_its_first_characters_only() -> None:
    # Two million characters of dates: only the head is read, and few spans are kept (the
    # overlap check is quadratic in the matches, so an unbounded scan would not finish).
    spans = time_spans("in 2022 and on 3 May 2021, " * 80_000, NOW)
    assert 1 < len(spans) <= MAX_SPANS
    assert time_spans("x" * 5000 + " yesterday", NOW) == []  # past the head: not read
