"""One-record (and few-record) ingest cost as the de-dup window fills, as a chat server sees it.

    uv run python bench/ingest_one.py [--sizes 2000,7000,20000,50000] [--calls 300] [--records 1]
                                      [--postgres | --dsn URL]

Like ``bench/serve.py``: 30 made-up words drawn Zipf-like (bench/chat_text.py), no channel (one
NULL channel), 50 sessions, each message arriving "now" (0.05 s apart), so the de-dup window
(1 h by default) holds the whole store up to ~72,000 messages. The store is filled in batches
of 1,000 to each size, then ``--calls`` calls of ``Engine.ingest`` with ``--records`` records
each (every fourth call repeats earlier messages verbatim, so folds are found too) are timed in
CPU time (``time.process_time``: the machine is shared). Prints CPU us per call and per record
at each size; it should stay flat.

``--postgres`` runs it on a throw-away embedded PostgreSQL (``--dsn``: on a given one) instead of
a SQLite file; the server's CPU is then in another process, so wall time per call is printed too.

Results: docs/benchmarks.md ("Ingest speed").
"""

from __future__ import annotations

import argparse
import contextlib
import random
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

import chat_text
from ctxwarden import Engine
from pg_embedded import pg_script

T0 = 1_800_000_000.0
WORDS = chat_text.vocabulary(np.random.default_rng(0))
WEIGHTS = chat_text.zipf_weights(len(WORDS)).tolist()


def message(rng: random.Random, number: int, at: float, sessions: int) -> dict[str, Any]:
    return {
        "id": f"m{number:08d}",
        "session": f"s{rng.randrange(sessions)}",
        "role": rng.choice(["user", "assistant"]),
        "content": " ".join(rng.choices(WORDS, WEIGHTS, k=30)),
        "created_at": at,
    }


@contextlib.contextmanager
def target(args: argparse.Namespace) -> Iterator[str]:
    """Where to ingest: a SQLite file, or a PostgreSQL URL (an embedded server if asked)."""
    with tempfile.TemporaryDirectory() as folder:
        if args.dsn:
            yield args.dsn
        elif args.postgres:
            script = pg_script()
            # Its own directory under /tmp: the server runs as the postgres user.
            base = Path(tempfile.mkdtemp(prefix="ctxwarden-bench-pg-"))
            try:
                yield script.start(base)
            finally:
                script.stop(base)
        else:
            yield str(Path(folder) / "b.db")


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="2000,7000,20000,50000")
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--records", type=int, default=1)
    parser.add_argument("--sessions", type=int, default=50)
    parser.add_argument("--postgres", action="store_true")
    parser.add_argument("--dsn")
    args = parser.parse_args(argv)
    sizes = sorted(int(s) for s in args.sizes.split(","))
    rng = random.Random(5)
    number = 0
    at = T0
    rows: list[tuple[int, float, float, int, int]] = []
    with target(args) as where, Engine.open(where) as engine:
        stored = 0
        recent: list[dict[str, Any]] = []
        for size in sizes:
            while stored < size:
                batch = []
                for _ in range(min(1000, size - stored)):
                    number += 1
                    at += 0.05
                    batch.append(message(rng, number, at, args.sessions))
                engine.ingest(batch)
                stored += len(batch)
                recent = batch[-200:]
            folds = 0
            began, wall = time.process_time(), time.perf_counter()
            for call in range(args.calls):
                records = []
                for _ in range(args.records):
                    number += 1
                    at += 0.05
                    if call % 4 == 3:
                        old = rng.choice(recent)
                        records.append({**old, "id": f"m{number:08d}", "created_at": at})
                    else:
                        records.append(message(rng, number, at, args.sessions))
                result = engine.ingest(records)
                folds += result.counts.get("duplicate", 0)
            spent, wall = time.process_time() - began, time.perf_counter() - wall
            stored += args.calls * args.records
            per_call = (spent / args.calls * 1e6, wall / args.calls * 1e6)
            rows.append((size, *per_call, folds, args.calls * args.records))
    print(f"\n{args.records} record(s) per call, {args.calls} calls per size, one NULL channel\n")
    print("| stored messages | CPU us per call | CPU us per record | wall us per call | folds |")
    print("|---:|---:|---:|---:|---:|")
    for size, per_call, wall_call, folds, records in rows:
        print(
            f"| {size:,} | {per_call:,.0f} | {per_call / args.records:,.0f} | {wall_call:,.0f} "
            f"| {folds}/{records} |"
        )


if __name__ == "__main__":
    main()
