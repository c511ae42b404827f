"""Measure the de-dup rule on a chatbench log without a store: quality and cost per message.

    uv run python bench/dedupe_explore.py [DATA_DIR] [--scope SCOPE] [--show N]

Simulates ingest oldest first with windows covering the whole log: each record is compared with
earlier *stored* records (exact key per channel, or per session with ``--scope session``; near key
per channel), exact first, then near; a fold points at the stored memory (the aggregate).
Scores against ``dups.jsonl`` and ``qa.jsonl`` as issue 3 item 6 defines:

- recall: share of family members (each family's first aside) reported as a duplicate of a
  member of their own family;
- precision: among records reported as duplicates where the record or its target is in a family,
  the share whose target is in the record's own family;
- protected: messages named as evidence in qa.jsonl that were folded (must be 0);
- other: folds where neither record nor target is in any family.

The data is read at run time only; nothing of it is kept.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from collections import defaultdict
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from ctxwarden.dedupe import DedupeCandidate, DedupeConfig, exact_scopes, may_fold

# How many earlier memories sharing a near key are tried, newest first (the store's LIMIT).
NEAR_CANDIDATES = 8


def load(path: Path) -> list[dict[str, Any]]:
    with path.open(encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def seconds(stamp: str) -> float:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def build(record: dict[str, Any]) -> DedupeCandidate:
    return DedupeCandidate.build(
        author=record.get("author"),
        author_kind=record.get("author_kind") or "human",
        content=record.get("content") or "",
        attachments=record.get("attachments"),
        created_at=seconds(record["created_at"]),
    )


def simulate(
    messages: list[dict[str, Any]], config: DedupeConfig
) -> tuple[dict[str, tuple[str, str, str]], int]:
    """Return {record id: (target id, layer, reason)} for folded records, and memories stored."""
    exact_index: dict[tuple[str, str], str] = {}
    near_index: dict[tuple[str, str], list[str]] = defaultdict(list)
    stored: dict[str, DedupeCandidate] = {}
    folds: dict[str, tuple[str, str, str]] = {}
    for record in messages:
        candidate = build(record)
        channel = record["channel"]
        scopes = [
            f"{kind}:{value}"
            for kind, value in exact_scopes(config, session=record["session"], channel=channel)
        ]
        target = next(
            (
                exact_index[(scope, candidate.exact_key)]
                for scope in scopes
                if (scope, candidate.exact_key) in exact_index
            ),
            None,
        )
        decision = None
        if target is not None:
            decision = may_fold(candidate, stored[target], config)
        if (decision is None or not decision.fold) and candidate.near_key is not None:
            for old_id in reversed(near_index[(channel, candidate.near_key)][-NEAR_CANDIDATES:]):
                decision = may_fold(candidate, stored[old_id], config)
                if decision.fold:
                    target = old_id
                    break
        if decision is not None and decision.fold and target is not None:
            folds[record["id"]] = (target, decision.layer or "", decision.reason)
            continue
        stored[record["id"]] = candidate
        for scope in scopes:
            exact_index.setdefault((scope, candidate.exact_key), record["id"])
        if candidate.near_key is not None:
            near_index[(channel, candidate.near_key)].append(record["id"])
    return folds, len(stored)


def score(data_dir: Path, config: DedupeConfig, show: int) -> None:
    messages = load(data_dir / "messages.jsonl")
    family = {row["id"]: row["family"] for row in load(data_dir / "dups.jsonl")}
    evidence = {mid for row in load(data_dir / "qa.jsonl") for mid in row["evidence"]}
    by_id = {record["id"]: record for record in messages}

    folds, stored = simulate(messages, config)

    firsts: set[str] = set()
    seen_families: set[str] = set()
    for record in messages:
        fam = family.get(record["id"])
        if fam is not None and fam not in seen_families:
            seen_families.add(fam)
            firsts.add(record["id"])
    members = [mid for mid in family if mid not in firsts]
    found = [m for m in members if m in folds and family.get(folds[m][0]) == family[m]]
    judged = [(r, t) for r, (t, _, _) in folds.items() if r in family or t in family]
    right = [(r, t) for r, t in judged if family.get(r) is not None and family.get(t) == family[r]]
    protected = sorted(r for r in folds if r in evidence)
    other = [(r, t) for r, (t, _, _) in folds.items() if r not in family and t not in family]

    print(
        f"scope={config.exact_scope}  messages={len(messages)}  "
        f"stored={stored}  folded={len(folds)}"
    )
    print(f"store size vs no de-dup: {stored}/{len(messages)} = {stored / len(messages):.3f}")
    print(f"recall    {len(found) / max(1, len(members)):.4f}  ({len(found)}/{len(members)})")
    print(f"precision {len(right) / max(1, len(judged)):.4f}  ({len(right)}/{len(judged)})")
    print(f"protected {len(protected)}  {protected[:10]}")
    print(f"other folds outside every family: {len(other)}")
    by_layer: dict[str, int] = defaultdict(int)
    for _, layer, reason in folds.values():
        by_layer[f"{layer}:{reason.split(':')[0]}"] += 1
    print("folds by layer/reason:", dict(sorted(by_layer.items())))
    missed = [m for m in members if m not in found]
    missed_kinds: dict[str, int] = defaultdict(int)
    for m in missed:
        missed_kinds[family[m].split(":")[0]] += 1
    print("missed by family kind:", dict(sorted(missed_kinds.items())))
    for m in missed[:show]:
        print("  missed", m, by_id[m]["channel"], family[m], repr(by_id[m]["content"][:90]))
    for r, t in [(r, t) for r, t in judged if (r, t) not in set(right)][:show]:
        print("  wrong", r, family.get(r), "->", t, family.get(t), repr(by_id[r]["content"][:70]))
    for r, t in other[:show]:
        print("  other", r, "->", t, repr(by_id[r]["content"][:70]), folds[r][2])


def speed(data_dir: Path, rounds: int = 5) -> None:
    """Cost per message: the analysis alone, and analysis plus in-memory lookups and decisions.

    CPU time of this process (time.process_time), best of ``rounds``: the machine is shared, and
    wall time mostly measures the neighbours.
    """
    messages = load(data_dir / "messages.jsonl")
    rows = [
        (m.get("author"), m.get("author_kind") or "human", m.get("content") or "") for m in messages
    ]
    best = math.inf
    for _ in range(rounds):
        start = time.process_time()
        for author, kind, content in rows:
            DedupeCandidate.build(author=author, author_kind=kind, content=content)
        best = min(best, time.process_time() - start)
    mean_chars = sum(len(c) for _, _, c in rows) / len(rows)
    print(
        f"DedupeCandidate.build: {best / len(rows) * 1e6:.2f} us/message "
        f"(best of {rounds}, {len(rows)} messages, mean {mean_chars:.0f} chars)"
    )
    by_kind: dict[str, list[tuple[str | None, str, str]]] = defaultdict(list)
    for row, message in zip(rows, messages, strict=True):
        by_kind[message.get("author") if message.get("author_kind") == "bot" else "people"].append(
            row
        )
    for name, group in sorted(by_kind.items()):
        best = math.inf
        for _ in range(rounds):
            start = time.process_time()
            for author, kind, content in group:
                DedupeCandidate.build(author=author, author_kind=kind, content=content)
            best = min(best, time.process_time() - start)
        print(f"  {name}: {best / len(group) * 1e6:.2f} us/message ({len(group)} messages)")
    config = DedupeConfig(exact_ttl_seconds=math.inf, near_window_seconds=math.inf)
    best = math.inf
    for _ in range(rounds):
        start = time.process_time()
        simulate(messages, config)
        best = min(best, time.process_time() - start)
    print(
        f"simulated ingest (build + date parse + lookups + may_fold): "
        f"{best / len(messages) * 1e6:.2f} us/message"
    )


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data_dir", nargs="?", default="/work/shared/data/chatbench-dev")
    parser.add_argument(
        "--scope", choices=("channel_or_session", "channel", "session"), default=None
    )
    parser.add_argument("--show", type=int, default=5)
    args = parser.parse_args(argv)
    data_dir = Path(args.data_dir)
    scopes = [args.scope] if args.scope else ["channel_or_session", "channel", "session"]
    for scope in scopes:
        config = DedupeConfig(
            exact_ttl_seconds=math.inf, near_window_seconds=math.inf, exact_scope=scope
        )
        score(data_dir, config, args.show)
        print()
    speed(data_dir)


if __name__ == "__main__":
    main()
