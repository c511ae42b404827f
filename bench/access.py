"""The inclusion log's access-stats write and the reads that join the stats back, on SQLite.

    uv run python bench/access.py [--memories 12000] [--contexts 300] [--included 100]
                                  [--reads 300]

Builds a temporary SQLite store (WAL) of ``--memories`` chat messages (~400 bytes of content
each, the serving bench's size), then

- logs ``--contexts`` contexts of ``--included`` memories each (drawn at random, as retrieval
  spreads its hits over the store) through ``SQLiteStore.log_context``: CPU per context, and the
  WAL pages each context's commit writes (counted from the WAL's size, checkpointed to zero
  every 20 contexts);
- reads whole memories: ``memories_at`` of ``--included`` random rowids, ``get`` of one id,
  ``recent`` (a page of 64): CPU per call. Since migration 8 these join ``memory_access``.

Only the store's public API is used, so the same script measures the code before migration 8
(run it with that checkout's ``src`` first on ``PYTHONPATH``). CPU time (``time.process_time``)
is the measure: the machine is shared.
"""

from __future__ import annotations

import argparse
import os
import random
import sqlite3
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from ctxwarden.store.base import ContextLog, Inclusion, NewMemory
from ctxwarden.store.sqlite import SQLiteStore

WORDS = (
    "deploy release standup review branch merge ticket customer budget design meeting schedule "
    "laptop coffee lunch weekend plan report bug fix test pipeline server database query index "
    "cache token memory context agent model prompt window latency metric alert"
).split()
#: WAL frame: a 24-byte header and one page; the file starts with a 32-byte header.
WAL_HEADER, FRAME_HEADER = 32, 24


def build(store: SQLiteStore, count: int, rng: random.Random) -> list[tuple[int, str]]:
    rows: list[tuple[int, str]] = []
    for start in range(0, count, 1000):
        with store.write() as writer:
            for n in range(start, min(count, start + 1000)):
                content = " ".join(rng.choices(WORDS, k=60))[:400]
                memory = NewMemory(
                    id=f"m{n}", tenant="t", session=f"s{n % 50}", channel="general",
                    author=f"user{n % 40}", author_kind="human", role="user", content=content,
                    created_at=1_700_000_000.0 + n, thread_id=None, reply_to=None,
                    kind="message", pinned=False, name=None, tool_calls=(), tool_call_id=None,
                    attachments=(), metadata={}, content_hash=f"h{n}", near_key=None,
                )  # fmt: skip
                rows.append((writer.insert(memory), memory.id))
    return rows


def wal_pages(path: Path) -> float:
    wal = Path(f"{path}-wal")
    size = wal.stat().st_size if wal.exists() else 0
    return max(0, size - WAL_HEADER) / (4096 + FRAME_HEADER)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--memories", type=int, default=12_000)
    parser.add_argument("--contexts", type=int, default=300)
    parser.add_argument("--included", type=int, default=100)
    parser.add_argument("--reads", type=int, default=300)
    args = parser.parse_args(argv)
    rng = random.Random(7)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "access.db"
        store = SQLiteStore(path)
        rows = build(store, args.memories, rng)
        side = sqlite3.connect(path, isolation_level=None)
        side.execute("PRAGMA wal_checkpoint(TRUNCATE)")

        log_cpu: list[float] = []
        pages = 0.0
        now = 1_700_100_000.0
        for n in range(args.contexts):
            if n % 20 == 0:
                pages += wal_pages(path)
                side.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            chosen = rng.sample(rows, args.included)
            entry = ContextLog(
                id=f"ctx{n}", tenant="t", session="s0", created_at=now + n, model="m",
                tokenizer="o200k_base", exact=True, cap=4000, tokens=40 * args.included,
                blocks={"related": {"budget": 4000, "used": 40 * args.included}},
                inclusions=[Inclusion(rowid=r, id=i, block="related", tokens=40)
                            for r, i in chosen],
            )  # fmt: skip
            started = time.process_time()
            store.log_context(entry)
            log_cpu.append(time.process_time() - started)
        pages += wal_pages(path)
        side.close()

        reads: dict[str, list[float]] = {"memories_at": [], "get": [], "recent": []}
        for _ in range(args.reads):
            chosen = rng.sample(rows, args.included)
            started = time.process_time()
            store.memories_at([r for r, _ in chosen])
            reads["memories_at"].append(time.process_time() - started)
            started = time.process_time()
            store.get("t", chosen[0][1])
            reads["get"].append(time.process_time() - started)
            started = time.process_time()
            store.recent("t", f"s{rng.randrange(50)}", limit=64)
            reads["recent"].append(time.process_time() - started)
        store.close()
        size = os.path.getsize(path)

    print(
        f"{args.memories} memories, {args.contexts} contexts of {args.included} inclusions, "
        f"store {size / 1e6:.1f} MB, load average {os.getloadavg()[0]:.2f}"
    )
    print()
    print("| measure | value |")
    print("|---|---:|")
    print(f"| log_context CPU ms, mean | {1000 * statistics.fmean(log_cpu):.3f} |")
    print(f"| log_context CPU ms, p50 | {1000 * statistics.median(log_cpu):.3f} |")
    print(f"| WAL pages written per context | {pages / args.contexts:.1f} |")
    for name, times in reads.items():
        label = f"{name}({args.included} rowids)" if name == "memories_at" else name
        print(f"| {label} CPU us, p50 | {1e6 * statistics.median(times):.0f} |")
        print(f"| {label} CPU us, mean | {1e6 * statistics.fmean(times):.0f} |")


if __name__ == "__main__":
    main()
