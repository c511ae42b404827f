"""Shared fixtures."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from ctxwarden.engine import Engine

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "chatbench-dev"


class Clock:
    """A clock the test moves by hand."""

    def __init__(self, now: float = 1_800_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def engine(clock: Clock) -> Iterator[Engine]:
    with Engine.open(":memory:", clock=clock) as engine:
        yield engine


@pytest.fixture
def chatbench() -> Path:
    if not (DATA / "messages.jsonl").is_file():
        pytest.skip(f"development data not found at {DATA}")
    return DATA
