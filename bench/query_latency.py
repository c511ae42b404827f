"""Where the time of ``assemble`` with a query goes at 10k memories: the query's embedding, the
rest of assembly, and the whole, in wall time and in this process's CPU time.

    PYTHONPATH=src python bench/query_latency.py [--memories 10000] [--runs 100] [--budget 2000]

The store holds ``--memories`` chat messages in 20 sessions (40 words each from a small
vocabulary, as bench/assemble.py) with a vector each. The stored vectors are random unit vectors
under MiniLM's names, not MiniLM's own (embedding 10k messages costs ~1 CPU-minute and the
search's cost does not depend on their values); every query is embedded by the real MiniLM, on
int8 activations (the default) and, side by side, on the float path (``minilm-l6-int8@1``).
Each run asks a different question (no query-cache hits) unless ``--repeat`` is given, which asks
each question twice in a row (an agent's tool-call rounds re-send the same last user message).
"CPU" is ``time.process_time`` (every thread of the process: the query's embedding in the
query thread counts), "caller CPU" is ``time.thread_time`` of the calling thread (the critical
path when the query thread has a core of its own); both are comparable on a loaded machine
where wall time is not.
"""

from __future__ import annotations

import argparse
import contextlib
import random
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from ctxwarden import Engine, EngineConfig
from ctxwarden.embed import MiniLMEmbedder, StaticEmbedder

WORDS = (
    "the deploy release standup review branch merge ticket customer budget design meeting "
    "schedule laptop coffee lunch weekend plan report bug fix test pipeline server database "
    "query index cache token memory context agent model prompt window latency metric alert "
    "team office remote travel invoice price contract launch roadmap sprint retro demo"
).split()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--memories", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--budget", type=int, default=2000)
    parser.add_argument("--repeat", action="store_true", help="ask each question twice")
    args = parser.parse_args()
    rng = random.Random(7)
    records = make_records(rng, args.memories)
    questions = make_questions(rng, args.runs)
    if args.repeat:
        questions = [q for q in questions[: args.runs // 2] for _ in range(2)]
    embedder = MiniLMEmbedder()  # the default: int8 activations (minilm-l6-int8@2)
    float_path = MiniLMEmbedder(activations="float")  # the model as shipped (@1), side by side
    for model in (embedder, float_path):
        model.embed(["warm up"])
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "bench.db"
        with Engine.open(path, config=EngineConfig(embed="off")) as engine:
            for start in range(0, len(records), 5000):
                engine.ingest(records[start : start + 5000])
            vectors = np.random.default_rng(7).standard_normal((len(records), 384))
            vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
            rowids = [engine.get(r["id"]).rowid for r in records]  # type: ignore[arg-type]
            for model in (embedder, float_path):
                engine.store.put_vectors(model.name, rowids, vectors.astype(np.float32))
        rows = []
        for label, model in (
            ("query embedding alone (MiniLM, int8: the default)", embedder),
            ("query embedding alone (MiniLM, float: minilm-l6-int8@1)", float_path),
        ):
            embed_wall, embed_cpu = [], []
            for question in questions:
                wall, cpu = time.perf_counter(), time.process_time()
                model.embed([question])
                embed_wall.append(time.perf_counter() - wall)
                embed_cpu.append(time.process_time() - cpu)
            rows.append((label, embed_wall, embed_cpu, embed_cpu))
        # Words only: an engine embedding with another model reads none of the stored vectors.
        # The two MiniLM engines are open together, each on its own copy of the store (one's
        # inclusion log would otherwise expire the other's caches), and take turns on each
        # question, which goes first alternating: neither gains from the order.
        twin = Path(folder) / "twin.db"
        shutil.copyfile(path, twin)
        engines = [
            ("assemble, words only (no vector read)", EngineConfig(embed="off"), StaticEmbedder()),
            ("assemble with the query embedded (default config)", EngineConfig(), embedder),
            ("assemble, query embedded on the float path (@1)", EngineConfig(), float_path),
        ]
        for group, paths in ((engines[:1], [path]), (engines[1:], [path, twin])):
            with contextlib.ExitStack() as stack:
                opened = [
                    (label, model, stack.enter_context(Engine.open(at, config=c, embedder=model)))
                    for (label, c, model), at in zip(group, paths, strict=True)
                ]
                for question in questions[:5]:  # warm: counts cached, index loaded
                    for _, _, engine in opened:
                        engine.assemble(session="s3", query=question + " warm", budget=args.budget)
                samples: list[tuple[list[float], list[float], list[float]]] = [
                    ([], [], []) for _ in opened
                ]
                contexts: list[Any] = [None] * len(opened)
                for number, question in enumerate(questions):
                    turn = list(range(len(opened)))
                    for index in turn[number % len(turn) :] + turn[: number % len(turn)]:
                        engine = opened[index][2]
                        walls, cpus, own = samples[index]
                        wall, cpu = time.perf_counter(), time.process_time()
                        mine = time.thread_time()
                        contexts[index] = engine.assemble(
                            session="s3", query=question, budget=args.budget
                        )
                        own.append(time.thread_time() - mine)
                        walls.append(time.perf_counter() - wall)
                        cpus.append(time.process_time() - cpu)
                for (label, model, _), context, (walls, cpus, own) in zip(
                    opened, contexts, samples, strict=True
                ):
                    vector = any("vector" in c.components for c in context.report.candidates)
                    usable = not isinstance(model, StaticEmbedder)
                    assert vector == usable, "vectors were (not) used as configured"
                    rows.append((label, walls, cpus, own))
    print(f"\n{args.memories:,} memories, budget {args.budget}, {len(questions)} questions")
    print("| what | wall p50 | wall p95 | CPU p50 | CPU p95 | caller CPU p50 |")
    print("|---|---:|---:|---:|---:|---:|")
    for label, walls, cpus, own in rows:
        print(
            f"| {label} | {_ms(walls, 0.5)} | {_ms(walls, 0.95)} | {_ms(cpus, 0.5)} "
            f"| {_ms(cpus, 0.95)} | {_ms(own, 0.5)} |"
        )


def make_records(rng: random.Random, n: int) -> list[dict[str, Any]]:
    """``n`` chat messages in 20 sessions, 40 words each from :data:`WORDS`."""
    return [
        {
            "id": f"m{i}",
            "session": f"s{i % 20}",
            "author": rng.choice(["ana", "bo", "cy", "dee"]),
            "content": " ".join(rng.choice(WORDS) for _ in range(40)),
            "created_at": 1_700_000_000 + i,
        }
        for i in range(n)
    ]


def make_questions(rng: random.Random, n: int) -> list[str]:
    """``n`` different questions naming an author and two words of :data:`WORDS`."""
    return [
        f"what did {rng.choice(['ana', 'bo', 'cy'])} say about the {rng.choice(WORDS)} "
        f"and the {rng.choice(WORDS)} {i}?"
        for i in range(n)
    ]


def _ms(samples: list[float], q: float) -> str:
    ordered = sorted(samples)
    if q == 0.5:
        return f"{1000 * statistics.median(ordered):.1f} ms"
    return f"{1000 * ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]:.1f} ms"


if __name__ == "__main__":
    main()
