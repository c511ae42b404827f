"""Rendering details that must not drift: the minute stamp of a line, the related block's
grouped lines."""

from __future__ import annotations

import time

from hypothesis import given
from hypothesis import strategies as st

from ctxwarden import render


@given(st.floats(min_value=-2e9, max_value=4e9, allow_nan=False))
def test_minute_stamp_equals_strftime_of_gmtime(seconds: float) -> None:
    # The cached minute names the same minute as formatting the instant itself.
    assert render._minute(seconds) == time.strftime("%Y-%m-%d %H:%M", time.gmtime(seconds))


_TEXT = st.text(st.characters(exclude_characters="\x00"), min_size=1, max_size=60)


@given(
    content=_TEXT,
    author=st.one_of(st.none(), _TEXT),
    channel=st.one_of(st.none(), _TEXT),
    seconds=st.floats(min_value=0, max_value=4e9, allow_nan=False),
    # not "system": a stored system record's JSON quoting leaves U+0085/U+2028/U+2029 as they
    # are (in line_text too; fixing it changes counts stored at ingest: reported, issue 18)
    role=st.sampled_from(["user", "assistant"]),
)
def test_a_grouped_line_is_one_line_under_a_one_line_header(
    content: str, author: str | None, channel: str | None, seconds: float, role: str
) -> None:
    # Whatever a memory holds, its related-block line is one line that starts with its time
    # of day (so no text can forge a header or another speaker's line), and its header is one
    # line naming its day and channel; the full line is the same with both in its stamp.
    memory = {"content": content, "author": author, "channel": channel, "role": role,
              "created_at": seconds}  # fmt: skip
    entry, header = render.entry_text(memory), render.group_header(memory)
    day, minute = render._minute(seconds).split(" ")
    assert entry.splitlines() == [entry[:-1]]
    assert header.splitlines() == [header[:-1]]
    assert entry.startswith(f"{minute} ")
    where = f" #{render.one_line(channel)}" if channel else ""
    assert header == f"[{day}{where}]\n"
    assert render.line_text(memory) == f"[{day} {minute}{where}]{entry[len(minute) :]}"


def test_a_summary_is_not_grouped() -> None:
    summary = {"content": "Summary of 3 messages\n[h1] 08:00 ana: x", "kind": "summary",
               "created_at": 0.0}  # fmt: skip
    assert render.group_header(summary) == ""
    assert render.entry_text(summary) == render.line_text(summary)
