"""A week of the bundled demo team's chat, then a month's pause and a compaction: the store's
history that the dashboard's health and memory views are tested on.

Each day the demo records arrive again under new ids, an hour later than the day before; some
of them are verbatim repeats (folded by the exact layer) and some were reworded (folded by the
near layer, or stored). Contexts are assembled after each day with the engine's clock set to
that day, and thirty days later compaction (the offline extractive summariser) retires the
oldest days into summaries.
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from typing import Any

from ctxwarden import Engine
from ctxwarden.compact import CompactionPolicy
from ctxwarden.types import parse_time

DAY = 86400.0
DAYS = 7
QUERIES = ("When is the standup now?", "who owns the release checklist?", "is the build green?")


def demo_records() -> list[dict[str, Any]]:
    text = resources.files("ctxwarden").joinpath("data/demo.jsonl").read_text(encoding="utf-8")
    return [json.loads(line) for line in text.splitlines() if line.strip()]


class Clock:
    """The engine's clock, moved by the story."""

    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def tell(path: Path | str) -> tuple[Engine, Clock]:
    """An engine over ``path`` (a SQLite file or a PostgreSQL DSN) that has lived through the
    story (the caller closes it)."""
    records = demo_records()
    first = min(parse_time(r["created_at"]) for r in records)
    clock = Clock(first)
    engine = Engine.open(path, clock=clock)
    for day in range(DAYS):
        batch = []
        for record in records:
            if day and record["id"] in ("d000",):
                continue  # the pinned note arrives once
            shifted = dict(record)
            shifted["id"] = f"{record['id']}-{day}" if day else record["id"]
            at = parse_time(record["created_at"]) + day * (DAY + 3600)
            shifted["created_at"] = at
            batch.append(shifted)
        clock.now = first + day * (DAY + 3600)
        engine.ingest(batch)
        clock.now = first + day * (DAY + 3600) + 8 * 3600
        for query in QUERIES[: 1 + day % len(QUERIES)]:
            engine.assemble(session="team", query=query, model="gpt-4o", budget=400)
    clock.now = first + 30 * DAY
    # The demo chat is dense with facts: let a summary keep up to 95 % of its cluster.
    policy = CompactionPolicy(older_than=25 * DAY, min_cluster_size=2, max_summary_share=0.95)
    engine.compact(policy=policy)
    return engine, clock
