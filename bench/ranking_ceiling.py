"""How much a better ranker could add to the related block with the signals retrieval has now.

    uv run python bench/evidence_recall.py --dump /tmp/candidates.jsonl
    uv run python bench/ranking_ceiling.py /tmp/candidates.jsonl [--budgets 1000,2000]

Reads the JSON lines of ``bench/evidence_recall.py --dump`` (every question's related
candidates with their score components, cost, whether they were included and whether they are
evidence) and prints, per data set and budget, the evidence recall of the questions not shown
apart (LoCoMo's categories 1-4):

- **engine**: what the engine's context held (any block), as the recall bench counts it;
- **packed**: the engine's scores packed again by this script's packer (best ``score /
  tokens^0.3`` first, into the tokens the engine's related block used; no group headers, no
  neighbour-after-anchor rule), the reference for the next two;
- **learned**: a logistic regression over the candidates' components, trained on the other
  conversations of the data set (leave one conversation out; a data set of one or two
  conversations, such as chatbench-dev, in five folds of its questions), packed by
  ``p / tokens^d`` for
  each ``--density`` ``d``: what re-weighting the signals the candidates carry could gain, in a
  form that generalises across conversations;
- **oracle**: the evidence among the candidates first (shortest first): the recall of a perfect
  ranker of these candidates. The rest is evidence no search found.

The features are made from whatever components the dump holds, so a new signal is measured by
adding it to the report's components and running both commands again: a signal the learned
ranker cannot use does not raise the learned row. Numpy only (no learning library): the
regression is fitted by full-batch gradient descent on standardised features with a small L2
penalty. It is a measuring instrument, not a ranker to ship.
"""

from __future__ import annotations

import argparse
import json
import math
from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

Row = dict[str, Any]
FloatArray = npt.NDArray[np.float64]

#: Offsets of the reciprocal-rank features of each list: a sharp and a flat one.
RANK_OFFSETS = (5.0, 20.0)


def read(path: Path) -> list[Row]:
    """The dump's lines that have candidates."""
    with path.open(encoding="utf-8") as lines:
        rows = [json.loads(line) for line in lines if line.strip()]
    return [row for row in rows if row["candidates"]]


def feature_names(rows: Sequence[Row]) -> list[str]:
    """Every component key of the dump, sorted: the features are made from these."""
    return sorted({key for row in rows for c in row["candidates"] for key in c["components"]})


def features(row: Row, names: Sequence[str]) -> FloatArray:
    """One matrix row per candidate. A list's rank (``*_rank``) gives ``1 / (offset + rank)``
    per :data:`RANK_OFFSETS` and a presence flag; a list's raw score (a key with a ``*_rank``
    sibling) is divided by the question's largest, so scores of different questions compare;
    any other component is taken as it is. Plus the log of the candidate's cost."""
    candidates = row["candidates"]
    ranked = {name[: -len("_rank")] for name in names if name.endswith("_rank")}
    largest = {
        name: max((abs(c["components"].get(name, 0.0)) for c in candidates), default=0.0) or 1.0
        for name in ranked
    }
    out = []
    for candidate in candidates:
        parts = candidate["components"]
        values: list[float] = []
        for name in names:
            value = parts.get(name)
            if name.endswith("_rank"):
                values.extend(1.0 / (o + value) if value else 0.0 for o in RANK_OFFSETS)
                values.append(1.0 if value else 0.0)
            elif name in ranked:
                values.append((value or 0.0) / largest[name])
            else:
                values.append(value or 0.0)
        values.append(math.log(max(1, candidate["tokens"])))
        out.append(values)
    return np.asarray(out, dtype=np.float64)


def fit(
    x: FloatArray, y: FloatArray, *, steps: int = 400, l2: float = 1e-3
) -> Callable[[FloatArray], FloatArray]:
    """A logistic regression of ``y`` on ``x`` (Adam on the mean log loss); the scoring
    function it gives (higher: more likely evidence)."""
    mean, std = x.mean(axis=0), x.std(axis=0)
    std[std == 0] = 1.0
    z = (x - mean) / std
    w = np.zeros(z.shape[1])
    b = 0.0
    m, v, mb, vb = np.zeros_like(w), np.zeros_like(w), 0.0, 0.0
    rate, beta1, beta2 = 0.05, 0.9, 0.999
    for step in range(1, steps + 1):
        p = 1.0 / (1.0 + np.exp(-(z @ w + b)))
        grad = z.T @ (p - y) / len(y) + l2 * w
        grad_b = float(np.mean(p - y))
        m = beta1 * m + (1 - beta1) * grad
        v = beta2 * v + (1 - beta2) * grad * grad
        mb = beta1 * mb + (1 - beta1) * grad_b
        vb = beta2 * vb + (1 - beta2) * grad_b * grad_b
        correction1, correction2 = 1 - beta1**step, 1 - beta2**step
        w -= rate * (m / correction1) / (np.sqrt(v / correction2) + 1e-8)
        b -= rate * (mb / correction1) / (math.sqrt(vb / correction2) + 1e-8)

    def score(matrix: FloatArray) -> FloatArray:
        return np.asarray(1.0 / (1.0 + np.exp(-(((matrix - mean) / std) @ w + b))))

    return score


def elsewhere(row: Row) -> set[str]:
    """The evidence the engine's context held outside the related block (recent history):
    there whatever the ranker, and not packed again."""
    return set(row["found"]) - {c["id"] for c in row["candidates"] if c["included"]}


def pack(row: Row, keys: Sequence[float], density: float) -> set[str]:
    """The candidates taken best ``key / tokens^density`` first into the tokens the engine's
    related block used, skipping what does not fit and what another block holds."""
    candidates = row["candidates"]
    room = sum(c["tokens"] for c in candidates if c["included"])
    held = elsewhere(row)
    order = sorted(
        range(len(candidates)),
        key=lambda i: (-keys[i] / max(1, candidates[i]["tokens"]) ** density, i),
    )
    used, taken = 0, set()
    for index in order:
        cost = candidates[index]["tokens"]
        if candidates[index]["id"] not in held and used + cost <= room:
            used += cost
            taken.add(candidates[index]["id"])
    return taken


def recall(row: Row, related: set[str]) -> float:
    """The question's recall with ``related`` as its related block (evidence the engine's
    context held in another block counts as found: :func:`elsewhere`)."""
    wanted = set(row["wanted"])
    return len(wanted & (related | elsewhere(row))) / len(wanted)


def fold_of(rows: Sequence[Row]) -> list[str]:
    """Each row's fold: its conversation when there are three or more (the ranker is judged on
    conversations it was not fitted on), else one of five folds of the questions."""
    conversations = {row["conversation"] for row in rows}
    if len(conversations) >= 3:
        return [row["conversation"] for row in rows]
    return [f"{row['conversation']}/{index % 5}" for index, row in enumerate(rows)]


def ceiling(rows: Sequence[Row], densities: Sequence[float]) -> list[tuple[str, float]]:
    """The rows of one data set and budget: (method, mean recall) in the order printed."""
    names = feature_names(rows)
    matrices = [features(row, names) for row in rows]
    labels = [np.asarray([c["evidence"] for c in row["candidates"]], dtype=np.float64)
              for row in rows]  # fmt: skip
    counted = [i for i, row in enumerate(rows) if not row["apart"]]
    out = [
        ("engine", float(np.mean([len(set(rows[i]["found"])) / len(rows[i]["wanted"])
                                  for i in counted]))),
        ("packed", float(np.mean([recall(rows[i], pack(rows[i], [c["score"] or 0.0
                                  for c in rows[i]["candidates"]], 0.3)) for i in counted]))),
    ]  # fmt: skip
    folds = fold_of(rows)
    scores: dict[int, FloatArray] = {}
    for held in sorted(set(folds)):
        train = [i for i, fold in enumerate(folds) if fold != held]
        if not train or not any(labels[i].any() for i in train):
            continue
        model = fit(np.vstack([matrices[i] for i in train]),
                    np.concatenate([labels[i] for i in train]))  # fmt: skip
        for i, fold in enumerate(folds):
            if fold == held:
                scores[i] = model(matrices[i])
    for density in densities:
        found = [recall(rows[i], pack(rows[i], list(scores[i]), density))
                 for i in counted if i in scores]  # fmt: skip
        out.append((f"learned, d = {density:g}", float(np.mean(found)) if found else math.nan))
    out.append(
        (
            "oracle",
            float(
                np.mean(
                    [
                        recall(
                            rows[i],
                            pack(
                                rows[i],
                                [1.0 if c["evidence"] else 0.0 for c in rows[i]["candidates"]],
                                1.0,
                            ),
                        )
                        for i in counted
                    ]
                )
            ),
        )
    )
    return out


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("dump", type=Path, help="bench/evidence_recall.py --dump's file")
    parser.add_argument("--budgets", default=None, help="e.g. 1000,2000 (default: all dumped)")
    parser.add_argument("--density", default="0.3,0.6,1.0", help="packing exponents tried")
    args = parser.parse_args(argv)
    rows = read(args.dump)
    densities = [float(d) for d in args.density.split(",")]
    wanted = {int(b) for b in args.budgets.split(",")} if args.budgets else None
    groups: dict[tuple[str, int], list[Row]] = defaultdict(list)
    for row in rows:
        if wanted is None or row["budget"] in wanted:
            groups[(row["data"], row["budget"])].append(row)
    for name in sorted({key[0] for key in groups}):
        budgets = sorted(b for n, b in groups if n == name)
        table = {b: ceiling(groups[(name, b)], densities) for b in budgets}
        questions = sum(not r["apart"] for r in groups[(name, budgets[0])])
        components = len(feature_names(groups[(name, budgets[0])]))
        print(f"\n{name}: evidence recall (%) of {questions} questions by ranker "
              f"(features from {components} score components)")  # fmt: skip
        print("| ranker | " + " | ".join(f"{b // 1000}k" if b % 1000 == 0 else str(b)
                                          for b in budgets) + " |")  # fmt: skip
        print("|---|" + "---:|" * len(budgets))
        for index, (method, _) in enumerate(table[budgets[0]]):
            cells = " | ".join(f"{100 * table[b][index][1]:.1f}" for b in budgets)
            print(f"| {method} | {cells} |")


if __name__ == "__main__":
    main()
