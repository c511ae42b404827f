"""Assembly latency at 1k, 10k and 100k messages beside LangChain's trim_messages.

    python bench/assemble.py [--budget 8000] [--runs 200]

Same messages (40 words each), same budget (the last ``budget`` tokens of history), same
tokenizer (o200k). ctxwarden assembles from its store with counts cached (by the warm-up) and writes
its inclusion log; LangChain trims an in-memory message list, once with
``count_tokens_approximately`` and once with a per-message tiktoken counter.
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from ctxwarden import Engine, tokens

WORDS = (
    "the deploy release standup review branch merge ticket customer budget design meeting "
    "schedule laptop coffee lunch weekend plan report bug fix test pipeline server database "
    "query index cache token memory context agent model prompt window latency metric alert "
    "team office remote travel invoice price contract launch roadmap sprint retro demo"
).split()


def history(n: int, seed: int = 7) -> list[dict[str, object]]:
    rng = random.Random(seed)
    return [
        {
            "id": f"m{i}",
            "session": f"s{n}",
            "author": rng.choice(["ana", "bo", "cy", "dee"]),
            "content": " ".join(rng.choice(WORDS) for _ in range(40)),
            "created_at": 1_700_000_000 + i,
        }
        for i in range(n)
    ]


def percentiles(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    p50 = statistics.median(ordered)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    return p50, p99


def timed(fn: Callable[[], object], runs: int) -> tuple[float, float]:
    fn()  # warm
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return percentiles(samples)


def fmt(seconds: float) -> str:
    if seconds < 1e-3:
        return f"{seconds * 1e6:.0f} us"
    if seconds < 1:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds:.2f} s"


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--budget", type=int, default=8000)
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--sizes", default="1000,10000,100000")
    args = parser.parse_args(argv)
    from langchain_core.messages import HumanMessage, trim_messages
    from langchain_core.messages.utils import count_tokens_approximately

    enc = tokens.get_tokenizer("o200k_base")

    def tiktoken_counter(messages: list[object]) -> int:
        return sum(enc.count(str(m.content)) + 3 for m in messages)  # type: ignore[attr-defined]

    rows = []
    with tempfile.TemporaryDirectory() as folder:
        engine = Engine.open(Path(folder) / "bench.db")
        for n in (int(s) for s in args.sizes.split(",")):
            records = history(n)
            start = time.perf_counter()
            for i in range(0, n, 5000):
                engine.ingest(records[i : i + 5000])
            ingest_s = time.perf_counter() - start
            session = f"s{n}"
            ours = timed(
                lambda session=session: engine.assemble(
                    session=session, model="gpt-4o", budget=args.budget
                ),
                args.runs,
            )
            context = engine.assemble(session=session, model="gpt-4o", budget=args.budget)
            lc_messages = [HumanMessage(content=f"{r['author']}: {r['content']}") for r in records]
            lc_runs = max(3, min(args.runs, int(20_000 / n)))
            approx = timed(
                lambda m=lc_messages: trim_messages(
                    m, max_tokens=args.budget, strategy="last",
                    token_counter=count_tokens_approximately,
                ),
                lc_runs,
            )  # fmt: skip
            per_message = timed(
                lambda m=lc_messages: trim_messages(
                    m, max_tokens=args.budget, strategy="last", token_counter=tiktoken_counter
                ),
                max(3, lc_runs // 5),
            )
            rows.append((n, ingest_s, ours, context.tokens, approx, per_message))
        engine.close()
    print(f"\nassemble latency, budget {args.budget} tokens (o200k), 40-word messages")
    print(
        "| messages | ctxwarden p50 | ctxwarden p99 | tokens used | LangChain approx p50 "
        "| p99 | LangChain tiktoken p50 | p99 | ctxwarden ingest |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for n, ingest_s, ours, used, approx, per_message in rows:
        print(
            f"| {n:,} | {fmt(ours[0])} | {fmt(ours[1])} | {used} | {fmt(approx[0])} "
            f"| {fmt(approx[1])} | {fmt(per_message[0])} | {fmt(per_message[1])} "
            f"| {n / ingest_s:,.0f} msg/s |"
        )
    base = rows[0][2][0]
    print(f"\nctxwarden p50 at {rows[-1][0]:,} vs {rows[0][0]:,}: {rows[-1][2][0] / base:.2f}x")


if __name__ == "__main__":
    main()
