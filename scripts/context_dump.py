"""Dump the assembled contexts of a fixed set of questions, to diff two checkouts' contexts.

Usage (from a checkout's root; the checkout's own ``src`` and ``bench`` are used)::

    PYTHONPATH=src python scripts/context_dump.py locomo OUT [--limit 20] [--db DB] [--data JSON]
    PYTHONPATH=src python scripts/context_dump.py store10k OUT [--db PRISTINE]
    diff <(main's OUT) <(branch's OUT)

``locomo``: bench/evidence_recall.py's run over ../shared/data/locomo-dev (default
configuration, ``embed`` sync, budgets 1k/2k/4k/8k, ``--limit`` questions a conversation), every
context written as JSON lines (question, budget, messages, included ids, tokens). ``--db``: a
store that run prepared (copied first, so every run starts from the same file; the
conversations' vectors are then not embedded again).

``store10k``: bench/query_latency.py's 10k-memory store (built at ``--db`` when missing, random
vectors under MiniLM's name; never assemble on that file itself, as every assembly's inclusion
log changes the access scores: it is copied), 80 questions (the first 20 at 1k, 2k and 8k, the
rest at 2k; 120 contexts) with the inclusion log on (each context's inclusions change the access
scores the next one sees, flushed before the next), the clock fixed. Session-scoped reads only:
a tenant-wide read's vector pool (an approximate index search over 10k random vectors) differed
between two runs of the same checkout.
A refactoring of assembly that must not change what is assembled diffs empty.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

from ctxwarden import Engine, EngineConfig


def _record(out: Any, label: dict[str, Any], context: Any) -> None:
    out.write(
        json.dumps(
            {
                **label,
                "tokens": context.tokens,
                "included": list(context.included),
                "messages": list(context.messages),
            },
            ensure_ascii=False,
            sort_keys=True,
        )
        + "\n"
    )


def locomo(out: Any, limit: int, db: str | None, data: Path | None) -> None:
    import evidence_recall as er

    seen: list[dict[str, Any]] = []
    original = Engine.assemble

    def recording(self: Engine, **kwargs: Any) -> Any:
        context = original(self, **kwargs)
        label = {k: kwargs.get(k) for k in ("tenant", "query", "budget")}
        seen.append(label)
        _record(out, label, context)
        return context

    Engine.assemble = recording  # type: ignore[method-assign]
    conversations = er.read(data or er.DEFAULT_DATA[0])
    with tempfile.TemporaryDirectory() as folder:
        path = str(Path(folder) / "store.db")
        if db is not None and not Path(db).exists():
            path = db  # prepared by this run (embedded once), copied by the next ones
        elif db is not None:
            shutil.copy(db, path)
            for suffix in ("-wal", "-shm"):
                if Path(db + suffix).exists():
                    shutil.copy(db + suffix, path + suffix)
            vectors = Path(db + ".vectors")
            if vectors.exists():
                shutil.copytree(vectors, path + ".vectors")
        er.run(
            conversations,
            budgets=[1000, 2000, 4000, 8000],
            model="gpt-4-turbo",
            limit=limit,
            db=path,
            embed="sync",
        )
    print(f"{len(seen)} contexts", file=sys.stderr)


def store10k(out: Any, db: str) -> None:
    import numpy as np

    from ctxwarden.embed import MiniLMEmbedder
    from query_latency import make_questions, make_records

    rng = random.Random(7)  # noqa: S311 (made-up bench data, as bench/query_latency.py)
    records = make_records(rng, 10000)
    questions = make_questions(rng, 80)
    embedder = MiniLMEmbedder()
    if not Path(db).exists():
        with Engine.open(db, config=EngineConfig(embed="off")) as engine:
            for start in range(0, 10000, 5000):
                engine.ingest(records[start : start + 5000])
            vectors = np.random.default_rng(7).standard_normal((10000, 384))
            vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
            rowids = [engine.get(r["id"]).rowid for r in records]
            engine.store.put_vectors(embedder.name, rowids, vectors.astype(np.float32))
    with tempfile.TemporaryDirectory() as folder:
        path = str(Path(folder) / "store.db")
        shutil.copy(db, path)
        for suffix in ("-wal", "-shm"):
            if Path(db + suffix).exists():
                shutil.copy(db + suffix, path + suffix)
        clock = 1_700_020_000.0
        with Engine.open(
            path, config=EngineConfig(), embedder=embedder, clock=lambda: clock
        ) as engine:
            for number, question in enumerate(questions):
                session = f"s{number % 4 * 5 + 3}"
                for budget in (1000, 2000, 8000) if number < 20 else (2000,):
                    context = engine.assemble(session=session, query=question, budget=budget)
                    engine.flush_log()  # the next context sees these inclusions, always
                    label = {"session": session, "query": question, "budget": budget}
                    _record(out, label, context)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("what", choices=("locomo", "store10k"))
    parser.add_argument("out", type=Path)
    parser.add_argument("--limit", type=int, default=20)
    parser.add_argument("--db", default=None)
    parser.add_argument(
        "--data", type=Path, default=None, help="locomo-dev.json (default: the bench's)"
    )
    args = parser.parse_args()
    with args.out.open("w") as out:
        if args.what == "locomo":
            locomo(out, args.limit, args.db, args.data)
        else:
            store10k(out, args.db or str(Path(tempfile.gettempdir()) / "prof10k.db"))


if __name__ == "__main__":
    main()
