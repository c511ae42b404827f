"""How closely PostgreSQL's lexical ranking follows SQLite's FTS5 BM25, question by question.

    python bench/lexical_agreement.py DATA [--dsn postgresql://...] [--k 20] [--limit N]
        [--conversations N]
    python bench/lexical_agreement.py --scale 1000000 [--dsn postgresql://...]

``DATA`` is a chatbench directory or a LoCoMo file (the readers of evidence_recall.py). Both
backends ingest the same records through the engine (same de-dup, each conversation its own
tenant); for every question, ``store.search(tenant, query_terms(question), limit=k)`` runs on
both and the two top-k lists of memory ids are compared:

- **overlap@k**: ``|A & B| / min(k, max(|A|, |B|))`` (1.0 when both lists hold the same ids);
- **top-1**: the share of questions whose best hit is the same memory;
- **Spearman**: rank correlation of the ids the two lists share (questions with >= 3 shared);
- **evidence@k**: the share of each question's evidence ids in A and in B (what the ranking is
  for).

``--limit N`` asks the first N questions of each conversation, ``--conversations N`` reads only
the first N conversations (a quick run).

``--scale ROWS`` instead fills the PostgreSQL store with ROWS synthetic 12-word messages (in
SQL: a vocabulary of 5,000 words drawn with a Zipf-like skew, so a few words are in most rows)
and prints search latency, p50 / max of 20 runs, for queries of rare, common and mixed words.

Without ``--dsn`` it starts a throw-away PostgreSQL 18 + pgvector (scripts/pg.py); with one, it
uses that database as is (give a fresh schema: ``?options=-c%20search_path%3Dname``).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ctxwarden.assemble import query_terms
from ctxwarden.engine import Engine, EngineConfig
from ctxwarden.errors import NotFound
from evidence_recall import read
from pg_embedded import pg_script


def spearman(a: Sequence[str], b: Sequence[str]) -> float | None:
    """Spearman's rho of the ids in both lists (ranked within each list); None under 3."""
    shared = [x for x in a if x in set(b)]
    n = len(shared)
    if n < 3:
        return None
    rank_a = {x: i for i, x in enumerate(shared)}
    rank_b = {x: i for i, x in enumerate(y for y in b if y in rank_a)}
    d2 = sum((rank_a[x] - rank_b[x]) ** 2 for x in shared)
    return 1.0 - 6.0 * d2 / (n * (n * n - 1))


def run(
    data: Path, dsn: str, k: int, limit: int | None, conversations: int | None = None
) -> dict[str, float]:
    config = EngineConfig(default_model="gpt-4")
    clock = [0.0]
    overlaps: list[float] = []
    top1: list[float] = []
    rhos: list[float] = []
    evidence: dict[str, list[float]] = {"sqlite": [], "postgres": []}
    with (
        Engine.open(":memory:", config=config, clock=lambda: clock[0]) as lite,
        Engine.open(dsn, config=config, clock=lambda: clock[0]) as pg,
    ):
        for conversation in read(data)[:conversations]:
            tenant = conversation.name
            for engine in (lite, pg):
                engine.ingest(conversation.records, tenant=tenant)
            questions = conversation.questions[:limit] if limit else conversation.questions
            for question in questions:
                terms = query_terms(question.question)
                a = [m.id for m, _ in lite.store.search(tenant, terms, limit=k)]
                b = [m.id for m, _ in pg.store.search(tenant, terms, limit=k)]
                if a or b:
                    overlaps.append(len(set(a) & set(b)) / min(k, max(len(a), len(b))))
                    top1.append(float(bool(a) and bool(b) and a[0] == b[0]))
                rho = spearman(a, b)
                if rho is not None:
                    rhos.append(rho)
                for name, engine, hits in (("sqlite", lite, a), ("postgres", pg, b)):
                    wanted = set()
                    for id_ in question.evidence:
                        try:
                            wanted.add(engine.get(id_, tenant=tenant).id)
                        except NotFound:
                            wanted.add(id_)
                    if wanted:
                        evidence[name].append(len(wanted & set(hits)) / len(wanted))
    return {
        "questions": float(len(overlaps)),
        f"overlap@{k}": statistics.fmean(overlaps) if overlaps else 0.0,
        "top-1 same": statistics.fmean(top1) if top1 else 0.0,
        "Spearman (shared ids)": statistics.fmean(rhos) if rhos else float("nan"),
        f"evidence@{k} SQLite": statistics.fmean(evidence["sqlite"] or [0.0]),
        f"evidence@{k} PostgreSQL": statistics.fmean(evidence["postgres"] or [0.0]),
    }


_FILL = """
INSERT INTO memories (id, tenant, session, channel, author_kind, role, content, created_at, kind,
                      content_hash, last_seen_at)
SELECT 'x' || g, 'scale', 's', 'c', 'human', 'user', words, g, 'message', md5(words), g
FROM (SELECT g, (SELECT string_agg('w' || floor(power(random(), 3) * 5000)::int, ' ')
                 FROM generate_series(1, 12) WHERE g > 0) AS words
      FROM generate_series(1, %s) g) s
"""


def scale(dsn: str, rows: int) -> None:
    import psycopg

    from ctxwarden.store.postgres import PostgresStore

    store = PostgresStore(dsn)
    start = time.perf_counter()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(_FILL, (rows,))
        conn.execute("ANALYZE memories")
    print(f"# {rows:,} rows filled in {time.perf_counter() - start:.0f}s", file=sys.stderr)
    queries = {
        "1 rare word": ["w4990"],
        "3 rare words": ["w4990", "w4801", "w4650"],
        "2 common words": ["w0", "w1"],
        "4 common + 2 rare": ["w0", "w1", "w2", "w3", "w4990", "w4801"],
        "12 common words": [f"w{i}" for i in range(12)],
    }
    print(f"PostgreSQL search latency at {rows:,} rows (limit 100)")
    print("| query | rows holding the words (capped) | p50 | max |")
    print("|---|---:|---:|---:|")
    for name, terms in queries.items():
        times = []
        for _ in range(20):
            start = time.perf_counter()
            store.search("scale", terms, limit=100)
            times.append(time.perf_counter() - start)
        counts = store._lexical._term_rows(store._query, "scale", terms, 0.0, rows=rows, stamp=-1)
        held = "+".join(str(counts[t][0]) for t in terms)
        print(
            f"| {name} | {held} | {1000 * statistics.median(times):.1f} ms | "
            f"{1000 * max(times):.1f} ms |"
        )
    store.close()


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("data", type=Path, nargs="?")
    parser.add_argument("--scale", type=int, default=0, help="time searches at this many rows")
    parser.add_argument("--dsn", help="a PostgreSQL URL (default: start an embedded server)")
    parser.add_argument("--k", type=int, default=20)
    parser.add_argument("--limit", type=int, default=None, help="questions per conversation")
    parser.add_argument("--conversations", type=int, default=None, help="the first N only")
    args = parser.parse_args(argv)
    script = None
    dsn = args.dsn
    if dsn is None:
        script = pg_script()
        pg_dir = Path(tempfile.mkdtemp(prefix="ctxwarden-lexical-pg-"))
        dsn = script.start(pg_dir)
    try:
        if args.scale:
            scale(dsn, args.scale)
            return
        if args.data is None:
            parser.error("give DATA (a chatbench directory or LoCoMo file) or --scale ROWS")
        result = run(args.data, dsn, args.k, args.limit, args.conversations)
    finally:
        if script is not None:
            script.stop(pg_dir)
    print(f"lexical agreement, SQLite FTS5 BM25 vs PostgreSQL, top {args.k}, {args.data}")
    print("| measure | value |")
    print("|---|---:|")
    for key, value in result.items():
        print(f"| {key} | {value:.0f} |" if key == "questions" else f"| {key} | {value:.3f} |")


if __name__ == "__main__":
    main()
