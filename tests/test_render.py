"""Rendering details that must not drift: the minute stamp of a line."""

from __future__ import annotations

import time

from hypothesis import given
from hypothesis import strategies as st

from ctxwarden import render


@given(st.floats(min_value=-2e9, max_value=4e9, allow_nan=False))
def test_minute_stamp_equals_strftime_of_gmtime(seconds: float) -> None:
    # The cached minute names the same minute as formatting the instant itself.
    assert render._minute(seconds) == time.strftime("%Y-%m-%d %H:%M", time.gmtime(seconds))
