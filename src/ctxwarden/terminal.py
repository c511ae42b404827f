"""What the command line shows besides its results: progress bars, input read line by line
with bad lines reported, JSON output, and one-line usage errors.

Progress bars go to stderr (stdout stays for results and ``--json``), with the total, the
rate, the elapsed time and the time remaining.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.panel import Panel
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    Task,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table
from rich.text import Text

from ctxwarden.errors import InputError
from ctxwarden.store.base import Store
from ctxwarden.types import Context, Record

__all__ = [
    "BadLine",
    "RateColumn",
    "SourceLine",
    "check_records",
    "count_pending",
    "echo_json",
    "parse_duration",
    "progress_bar",
    "read_lines",
    "read_text",
    "show_context",
]


class RateColumn(ProgressColumn):
    """Items per second, e.g. ``8,120 records/s``."""

    def __init__(self, unit: str) -> None:
        super().__init__()
        self.unit = unit

    def render(self, task: Task) -> Text:
        """The task's current speed (``?`` before rich has measured one)."""
        speed = task.finished_speed or task.speed
        shown = "?" if speed is None else f"{speed:,.0f}"
        # no_wrap: a narrow terminal must not push the unit onto a second line
        return Text(f"{shown} {self.unit}/s", style="progress.data.speed", no_wrap=True)


def progress_bar(label: str, unit: str, *, console: Console | None = None) -> Progress:
    """A bar on stderr: label, bar, done/total, rate, elapsed, time remaining."""
    return Progress(
        TextColumn(label),
        BarColumn(bar_width=24),  # room for the rate and ETA in an 80-column terminal
        MofNCompleteColumn(),
        RateColumn(unit),
        TimeElapsedColumn(),
        TextColumn("eta"),
        TimeRemainingColumn(),
        console=console or Console(stderr=True),
    )


def echo_json(data: Any, *, indent: int | None = 2) -> None:
    """Print ``data`` as JSON on stdout (non-ASCII kept)."""
    sys.stdout.write(json.dumps(data, ensure_ascii=False, indent=indent, default=str) + "\n")


def read_text(path: str) -> str:
    """A UTF-8 text file, or stdin for ``-``; a clear :class:`InputError` otherwise."""
    if path == "-":
        return sys.stdin.read()
    try:
        return Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise InputError(f"{path}: is a directory, not a file") from None
    except UnicodeDecodeError as exc:
        raise InputError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None


@dataclass(frozen=True)
class SourceLine:
    """One record of the input: its line (JSONL) or position (JSON array), and its data."""

    line: int
    data: Any


@dataclass(frozen=True)
class BadLine:
    """A line that could not be ingested, and why."""

    line: int
    field: str | None
    error: str

    def to_dict(self) -> dict[str, Any]:
        """The JSON form used by ``ingest --json`` and ``--skip-bad-lines``."""
        return {"line": self.line, "field": self.field, "error": self.error}


def read_lines(text: str) -> Iterator[SourceLine | BadLine]:
    """JSON Lines (one record a line) or a JSON array: each record or each bad line, in order.

    >>> [type(x).__name__ for x in read_lines('{"content": "a"}\\n{oops\\n')]
    ['SourceLine', 'BadLine']
    """
    stripped = text.lstrip()
    if stripped.startswith("["):
        try:
            data = json.loads(stripped)
        except json.JSONDecodeError as exc:
            raise InputError(
                f"not valid JSON: {exc.msg} (column {exc.colno})", line=exc.lineno
            ) from None
        if not isinstance(data, list):
            raise InputError("expected a JSON array of records")
        for index, item in enumerate(data, start=1):
            yield SourceLine(index, item)
        return
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            yield SourceLine(number, json.loads(line))
        except json.JSONDecodeError as exc:
            yield BadLine(number, None, f"not valid JSON: {exc.msg} (column {exc.colno})")


def check_records(
    items: Iterator[SourceLine | BadLine], defaults: dict[str, Any], *, skip_bad: bool
) -> tuple[list[SourceLine], list[BadLine]]:
    """The records that validate, and the bad lines (skipped only with ``skip_bad``; else the
    first bad line raises :class:`InputError` naming its line and field, before anything is
    written)."""
    good: list[SourceLine] = []
    bad: list[BadLine] = []
    for item in items:
        problem = item if isinstance(item, BadLine) else _problem(item, defaults)
        if problem is None:
            assert isinstance(item, SourceLine)
            good.append(item)
            continue
        if not skip_bad:
            raise InputError(
                f"{problem.error} (pass --skip-bad-lines to ingest the rest)",
                field=problem.field,
                line=problem.line,
            )
        bad.append(problem)
    return good, bad


def _problem(item: SourceLine, defaults: dict[str, Any]) -> BadLine | None:
    try:
        Record.from_mapping(item.data, line=item.line, defaults=defaults)
    except InputError as exc:
        return BadLine(item.line, exc.field, exc.reason)
    return None


def show_context(console: Console, context: Context) -> None:
    """Print a context's blocks and messages with rich."""
    report = context.report
    table = Table(
        title=(
            f"{report.model} ({report.tokenizer}{'' if report.exact else ', approximate'}): "
            f"{context.tokens} of {report.cap} tokens (window {report.window}, reserve "
            f"{report.reserve}, margin {report.margin})"
        )
    )
    for column in ("block", "budget", "used", "items"):
        table.add_column(column, justify="right" if column in {"budget", "used"} else "left")
    for name, cost in report.fixed.items():
        if cost:
            table.add_row(f"({name})", "fixed", str(cost), "")
    for block in report.blocks:
        items = ", ".join(block.items[:6]) + (" ..." if len(block.items) > 6 else "")
        table.add_row(block.name, str(block.budget), str(block.used), items)
    console.print(table)
    for message in context.messages:
        content = message.get("content") or json.dumps(message.get("tool_calls"))
        console.print(Panel(str(content), title=message["role"], title_align="left", expand=False))
    if report.retrieval:
        sizes = ", ".join(f"{name} {value:g}" for name, value in report.retrieval.items())
        console.print(f"[cyan]retrieval sized:[/] {sizes}")
    for note in report.notes:
        console.print(f"[yellow]note:[/] {note}")


def parse_duration(text: str) -> float:
    """Seconds in ``"14d"``, ``"36h"``, ``"90m"``, ``"30s"`` or a bare number of seconds.

    >>> parse_duration("14d")
    1209600.0
    """
    units = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
    raw = text.strip().lower()
    scale = units.get(raw[-1:])
    number = raw[:-1] if scale is not None else raw
    try:
        value = float(number) * (scale or 1.0)
    except ValueError:
        raise InputError(
            f"{text!r} is not a duration: write e.g. 14d, 36h or 90m", field="older_than"
        ) from None
    if value < 0:
        raise InputError(f"{text!r} is negative", field="older_than")
    return value


def count_pending(store: Store, model: str) -> int:
    """How many memories have no ``model`` vector (the embed bar's total): one pass of the
    store's own pending query, paged by rowid."""
    count, after = 0, 0
    while page := store.pending_embeddings(model, after=after, limit=10_000):
        count += len(page)
        after = page[-1][0]
    return count
