"""What a MiniLM-L6 cross-encoder would cost per ``assemble``: the shipped MiniLM-L6 int8 model
(the architecture of ``ms-marco-MiniLM-L-6-v2``) run over query+candidate pairs.

Usage::

    uv run python bench/rerank_cost.py [--pairs 10,20,50] [--questions 20]

No registry package ships cross-encoder weights that load offline (README, design notes), so
this measures the cost such a reranker would add, not its quality: for each of the first
``--questions`` questions of locomo-dev's first conversation, one batch of ``n`` pairs
``"question [SEP] turn"`` is encoded, and the p50 per batch is printed.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Sequence
from pathlib import Path

from ctxwarden.embed import MiniLMEmbedder

_PARENTS = Path(__file__).resolve().parents[2:]
DATA = next(
    (p / "shared" / "data" for p in _PARENTS if (p / "shared").exists()),
    Path("../shared/data"),
)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path, default=DATA / "locomo-dev" / "locomo-dev.json")
    parser.add_argument("--pairs", default="10,20,50")
    parser.add_argument("--questions", type=int, default=20)
    args = parser.parse_args(argv)
    sample = json.loads(args.data.read_text(encoding="utf-8"))[0]
    turns = [
        str(turn["text"])
        for key, value in sample["conversation"].items()
        if key.startswith("session_") and isinstance(value, list)
        for turn in value
    ]
    questions = [str(item["question"]) for item in sample["qa"]][: args.questions]
    model = MiniLMEmbedder()
    model.embed(["warm up"])
    for count in (int(n) for n in args.pairs.split(",")):
        seconds = []
        for number, question in enumerate(questions):
            pairs = [
                f"{question} [SEP] {turns[(number * 7 + j) % len(turns)]}" for j in range(count)
            ]
            started = time.perf_counter()
            model.embed(pairs)
            seconds.append(time.perf_counter() - started)
        print(f"{count} pairs: p50 {1000 * statistics.median(seconds):.1f} ms")


if __name__ == "__main__":
    main()
