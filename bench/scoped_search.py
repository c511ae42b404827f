"""Cost of a read scoped to a session or an end user against the whole tenant (SQLite).

Usage::

    uv run python bench/scoped_search.py [--messages 100000] [--layout live|interleaved]
        [--runs 20] [--embed off|sync|background]

Stores ``--messages`` synthetic chat messages (12 words from a 3,000-word vocabulary, 30 %
common words), each with a session and an end user, then times ``store.search`` (limit 70) and
``Engine.assemble`` (budget 4,000, no embedder) for the newest session's user in each scope.
``live``: sessions of 200 messages, 20 running at a time (a session spans ~4,000 rows of the
store, as a live conversation does); ``interleaved``: 500 sessions round-robin over the whole
store (the worst case: every session spans it). ``--embed`` sets ``EngineConfig.embed``
(default: the config's).
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from ctxwarden import Engine
from ctxwarden.assemble import query_terms
from ctxwarden.engine import EngineConfig
from ctxwarden.scope import ReadScope

QUERY = "when is the next deploy of the build release"


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--layout", choices=["live", "interleaved"], default="live")
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument(
        "--embed", choices=["off", "sync", "background"], default=None, help="EngineConfig.embed"
    )
    args = parser.parse_args(argv)
    rng = random.Random(7)
    words = [f"w{i}" for i in range(3000)]
    common = ["deploy", "release", "the", "build", "lunch", "meeting"]

    def text() -> str:
        return " ".join(
            rng.choice(common) if rng.random() < 0.3 else rng.choice(words) for _ in range(12)
        )

    def session_of(i: int) -> int:
        if args.layout == "interleaved":
            return i % 500
        return i // 4000 * 20 + i % 20

    config = EngineConfig() if args.embed is None else EngineConfig(embed=args.embed)
    with (
        tempfile.TemporaryDirectory() as folder,
        Engine.open(Path(folder) / "b.db", config=config) as engine,
    ):
        rows = [
            {"id": f"m{i}", "session": f"s{session_of(i)}", "user": f"u{session_of(i) % 500}",
             "content": text(), "created_at": 1e9 + i}
            for i in range(args.messages)
        ]  # fmt: skip
        for start in range(0, len(rows), 5000):
            engine.ingest(rows[start : start + 5000], fold=False)
        session, user = rows[-1]["session"], rows[-1]["user"]
        terms = query_terms(QUERY)
        print(f"{args.messages} messages, layout {args.layout}, {args.runs} runs each")
        for label, scope in (
            ("tenant", None),
            ("session", ReadScope("session", session, user)),
            ("user", ReadScope("user", user=user)),
        ):
            engine.store.search("default", terms, limit=70, scope=scope)
            began = time.perf_counter()
            for _ in range(args.runs):
                hits = engine.store.search("default", terms, limit=70, scope=scope)
            spent = (time.perf_counter() - began) / args.runs * 1000
            print(f"search   {label:8} {len(hits):3} hits {spent:7.2f} ms")
        engine.assemble(session=session, query=QUERY, budget=4000, log_inclusions=False)  # warm
        for scope_name in ("session", "user", "tenant"):
            began = time.perf_counter()
            for _ in range(args.runs):
                engine.assemble(session=session, user=user, query=QUERY, budget=4000,
                                log_inclusions=False, scope=scope_name)  # type: ignore[arg-type]  # fmt: skip
            spent = (time.perf_counter() - began) / args.runs * 1000
            print(f"assemble {scope_name:8}          {spent:7.2f} ms")


if __name__ == "__main__":
    main()
