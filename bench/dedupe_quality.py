"""Score de-duplication at ingest through the real Engine on a chatbench log.

    uv run python bench/dedupe_quality.py DATA_DIR [--scope channel_or_session|channel|session|all]
        [--show N] [--semantic [--thresholds 0.90,...]] [--messages N]

Reads ``messages.jsonl``, ``dups.jsonl`` and ``qa.jsonl`` from DATA_DIR, ingests the log oldest
first through ``Engine.ingest`` into a temporary SQLite file with the de-dup windows covering the
whole log, and scores the outcomes as issue 3 item 6 defines them:

- recall: the share of family members (each family's first aside) reported as a duplicate of a
  member of their own family;
- precision: among records reported as duplicates where the record or its target belongs to a
  family, the share whose target is in the record's own family;
- protected: messages named as evidence by any question that were folded into another message
  (must be 0);
- other: folds where neither record nor target is in any family (for information).

It also ingests the same log into a store without de-dup and prints both stores' size (memories
and SQLite file bytes). The data is read at run time only; nothing of it is kept.

``--semantic`` then embeds each de-duplicated store with the offline MiniLM embedder and runs
layer C (``Engine.dedupe_semantic``, window covering the whole log) once per threshold of
``--thresholds``, on a copy of the store each, and scores ingest folds plus semantic folds
together (``semantic`` = layer C folds, ``refused`` = candidates above the threshold that the
changed-fact guard refused).

``--messages N`` takes the first N events of the log only (families and evidence cut to them):
a quick run.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sqlite3
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ctxwarden import Engine
from ctxwarden.dedupe import DedupeConfig
from ctxwarden.engine import EngineConfig
from ctxwarden.semantic import SemanticConfig
from ctxwarden.types import IngestOutcome, IngestResult

BATCH = 500


def load(path: Path) -> list[dict[str, Any]]:
    with path.open(encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def ingest(
    messages: list[dict[str, Any]], directory: Path, name: str, config: DedupeConfig | None
) -> tuple[IngestResult, int, int, float]:
    """Ingest into ``directory/name``; returns outcomes, memories, file bytes, seconds."""
    path = directory / name
    outcomes = []
    start = time.perf_counter()
    with Engine.open(path, config=EngineConfig(dedupe=config)) as engine:
        for offset in range(0, len(messages), BATCH):
            outcomes.extend(engine.ingest(messages[offset : offset + BATCH]).outcomes)
        seconds = time.perf_counter() - start
        memories = engine.stats()["memories"]
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.execute("VACUUM")
    conn.close()
    size = path.stat().st_size
    return IngestResult(outcomes=tuple(outcomes)), memories, size, seconds


def score(
    messages: list[dict[str, Any]],
    family: dict[str, str],
    evidence: set[str],
    result: IngestResult,
) -> dict[str, Any]:
    folds = {
        o.id: (o.duplicate_of, o.status, o.reason or "")
        for o in result.outcomes
        if o.status in ("duplicate", "near_duplicate", "semantic_duplicate")
        and o.duplicate_of is not None
    }
    firsts: set[str] = set()
    seen: set[str] = set()
    for record in messages:
        fam = family.get(record["id"])
        if fam is not None and fam not in seen:
            seen.add(fam)
            firsts.add(record["id"])
    members = [m for m in family if m not in firsts]
    found = [m for m in members if m in folds and family.get(folds[m][0] or "") == family[m]]
    judged = [(r, t) for r, (t, _, _) in folds.items() if r in family or t in family]
    right = [(r, t) for r, t in judged if family.get(r) is not None and family.get(t) == family[r]]
    protected = sorted(r for r in folds if r in evidence)
    other = [(r, t) for r, (t, _, _) in folds.items() if r not in family and t not in family]
    return {
        "recall": len(found) / max(1, len(members)),
        "recall_n": f"{len(found)}/{len(members)}",
        "precision": len(right) / max(1, len(judged)),
        "precision_n": f"{len(right)}/{len(judged)}",
        "protected": protected,
        "other": len(other),
        "exact": sum(1 for _, s, _ in folds.values() if s == "duplicate"),
        "near": sum(1 for _, s, _ in folds.values() if s == "near_duplicate"),
        "reasons": Counter(reason.split(":")[0] for _, _, reason in folds.values()),
        "missed": [m for m in members if m not in set(found)],
        "wrong": [(r, t) for r, t in judged if (r, t) not in set(right)],
    }


def semantic(
    path: Path, thresholds: list[float], config: DedupeConfig
) -> list[tuple[float, list[IngestOutcome], int, int, float]]:
    """Embed the store at ``path`` once, then per threshold run layer C on a copy: the folds as
    outcomes, the guard's refusals, the memories left, and the seconds of the pass."""
    start = time.perf_counter()
    with Engine.open(path, config=EngineConfig(dedupe=config)) as engine:
        engine.embed_pending(64)
    print(f"embedded in {time.perf_counter() - start:.1f} s")
    runs = []
    for threshold in thresholds:
        copy = path.with_name(f"{path.stem}-{threshold}.db")
        for suffix in ("", ".vectors"):
            source = Path(str(path) + suffix)
            if source.is_dir():
                shutil.copytree(source, Path(str(copy) + suffix))
            elif source.exists():
                shutil.copy(source, Path(str(copy) + suffix))
        with Engine.open(copy, config=EngineConfig(dedupe=config)) as engine:
            start = time.perf_counter()
            report = engine.dedupe_semantic(
                config=SemanticConfig(threshold=threshold, window_seconds=math.inf)
            )
            seconds = time.perf_counter() - start
            memories = engine.stats()["memories"]
        outcomes = [
            IngestOutcome(
                id=f.id,
                status="semantic_duplicate",
                duplicate_of=f.into,
                reason=f"semantic: {f.score:.4f}",
            )
            for f in report.folds
        ]
        runs.append((threshold, outcomes, report.refused, memories, seconds))
    return runs


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("data_dir", type=Path)
    parser.add_argument(
        "--scope", choices=["channel_or_session", "channel", "session", "all"], default="all"
    )
    parser.add_argument("--show", type=int, default=5, help="print up to N misses and errors")
    parser.add_argument("--semantic", action="store_true", help="add layer C after embedding")
    parser.add_argument(
        "--thresholds", default="0.90,0.93,0.95,0.97,0.99", help="layer C cosines to try"
    )
    parser.add_argument("--messages", type=int, default=None, help="the first N events only")
    args = parser.parse_args(argv)
    messages = load(args.data_dir / "messages.jsonl")[: args.messages]
    by_id = {m["id"]: m for m in messages}
    family = {
        row["id"]: row["family"] for row in load(args.data_dir / "dups.jsonl") if row["id"] in by_id
    }
    evidence = {
        mid for row in load(args.data_dir / "qa.jsonl") for mid in row["evidence"] if mid in by_id
    }
    scopes = ["channel_or_session", "channel", "session"] if args.scope == "all" else [args.scope]

    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        plain = ingest(messages, directory, "plain.db", None)
        _, plain_memories, plain_bytes, plain_seconds = plain
        print(
            f"{len(messages)} messages, {len(family)} in spam families, "
            f"{len(evidence)} evidence messages; windows cover the whole log\n"
        )
        print(
            "| exact scope | recall | precision | protected | other folds | exact | near "
            "| memories | file bytes | vs no de-dup | ingest s |"
        )
        print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        print(
            f"| (no de-dup) | | | | | | | {plain_memories} | {plain_bytes:,} | 1.000 "
            f"| {plain_seconds:.2f} |"
        )
        details = []
        semantic_rows: list[Any] = []
        for scope in scopes:
            config = DedupeConfig(
                exact_ttl_seconds=math.inf, near_window_seconds=math.inf, exact_scope=scope
            )
            result, memories, size, seconds = ingest(messages, directory, f"{scope}.db", config)
            s = score(messages, family, evidence, result)
            details.append((scope, s))
            print(
                f"| {scope} | {s['recall']:.4f} ({s['recall_n']}) "
                f"| {s['precision']:.4f} ({s['precision_n']}) | {len(s['protected'])} "
                f"| {s['other']} | {s['exact']} | {s['near']} | {memories} | {size:,} "
                f"| {size / plain_bytes:.3f} | {seconds:.2f} |"
            )
            if args.semantic:
                thresholds = [float(t) for t in args.thresholds.split(",")]
                semantic_rows.append(
                    (scope, result, semantic(directory / f"{scope}.db", thresholds, config))
                )
        if semantic_rows:
            print(
                "\n| exact scope | layer C cosine | recall | precision | protected "
                "| other folds | semantic | refused by guard | memories | pass s |"
            )
            print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for scope, result, runs in semantic_rows:
            for threshold, folds, refused, memories, seconds in runs:
                both = IngestResult(outcomes=(*result.outcomes, *folds))
                s = score(messages, family, evidence, both)
                print(
                    f"| {scope} | {threshold:.3f} | {s['recall']:.4f} ({s['recall_n']}) "
                    f"| {s['precision']:.4f} ({s['precision_n']}) | {len(s['protected'])} "
                    f"| {s['other']} | {len(folds)} | {refused} | {memories} | {seconds:.2f} |"
                )
                if folds:
                    details.append((f"{scope} @ {threshold:.3f}", s))
                for fold in folds[: args.show]:
                    record = by_id[fold.id]
                    target = by_id.get(fold.duplicate_of or "", {})
                    print(
                        f"  {fold.reason} #{record['channel']} {record['content'][:60]!r} -> "
                        f"{str(target.get('content', ''))[:60]!r}"
                    )
    print("\ntargets: precision >= 0.99, recall >= 0.98, protected = 0")
    for scope, s in details:
        print(f"\n[{scope}] folds by reason: {dict(sorted(s['reasons'].items()))}")
        for m in s["missed"][: args.show]:
            r = by_id[m]
            print(f"  missed {m} #{r['channel']} {family[m]} {r['content'][:70]!r}")
        for r_id, t_id in s["wrong"][: args.show]:
            print(f"  wrong {r_id} {family.get(r_id)} -> {t_id} {family.get(t_id or '')}")
        for p in s["protected"][: args.show]:
            print(f"  PROTECTED FOLDED {p} {by_id[p]['content'][:70]!r}")


if __name__ == "__main__":
    main()
