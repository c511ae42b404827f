"""Retention after compaction, measured on chatbench-dev.

    uv run python bench/retention.py /work/shared/data/chatbench-dev

Ingests ``messages.jsonl``, assembles a context per question of ``qa.jsonl`` at 4k tokens
(model gpt-4, cl100k) and counts the questions whose gold answer string is in the assembled
context (case-insensitive). Then compacts everything older than the last 7 days with the
extractive summariser, measures again, and compares the store's size (after FTS optimize and
VACUUM on both sides, so free pages do not count).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from ctxwarden import Engine
from ctxwarden.compact import CompactionPolicy
from ctxwarden.engine import EngineConfig
from ctxwarden.errors import StoreError
from ctxwarden.store.sqlite import SQLiteStore
from ctxwarden.tokens import get_tokenizer
from ctxwarden.types import parse_time

DAY = 86400.0


def _load(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]


def _retention(engine: Engine, qa: list[dict[str, Any]], session: str, budget: int) -> float:
    hits = 0
    for q in qa:
        context = engine.assemble(
            session=session, query=q["question"], model="gpt-4", budget=budget,
            log_inclusions=False, scope="tenant",  # the team's whole history is shared
        )  # fmt: skip
        text = "\n".join(str(m.get("content") or "") for m in context.messages).casefold()
        hits += str(q["answer"]).casefold() in text
    return hits / len(qa)


def _size(store: SQLiteStore) -> int:
    store.vacuum()
    return Path(store.path).stat().st_size


def _tombstone_bytes(store: SQLiteStore) -> int | None:
    """Bytes of the tombstones table and its index (None when SQLite lacks dbstat)."""
    try:
        rows = store._query(
            "SELECT sum(pgsize) FROM dbstat WHERE name IN ('tombstones', 'tombstones_summary')",
            (),
        )
    except StoreError:  # dbstat is a compile-time option
        return None
    return int(rows[0][0] or 0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data", type=Path, help="folder with messages.jsonl and qa.jsonl")
    parser.add_argument("--budget", type=int, default=4000)
    parser.add_argument("--keep-days", type=float, default=7.0)
    args = parser.parse_args()
    folder = args.data
    if not (folder / "messages.jsonl").is_file() and (folder / "chatbench-dev").is_dir():
        folder = folder / "chatbench-dev"
    messages = _load(folder / "messages.jsonl")
    qa = _load(folder / "qa.jsonl")
    now = max(parse_time(m["created_at"]) for m in messages) + 60
    session = messages[0]["session"]
    config = EngineConfig(default_model="gpt-4", tokenizers=("cl100k_base",))
    with (
        tempfile.TemporaryDirectory() as tmp,
        Engine.open(Path(tmp) / "bench.db", config=config, clock=lambda: now) as engine,
    ):
        store = engine.store
        assert isinstance(store, SQLiteStore)
        engine.ingest(messages)
        memories_before = engine.stats()["memories"]
        size_before = _size(store)
        before = _retention(engine, qa, session, args.budget)
        policy = CompactionPolicy(older_than=args.keep_days * DAY)
        t0 = time.perf_counter()
        plan = engine.compact_plan(policy=policy)
        result = engine.compact(plan)
        seconds = time.perf_counter() - t0
        memories_after = engine.stats()["memories"]
        size_after = _size(store)
        after = _retention(engine, qa, session, args.budget)
        tombstone_bytes = _tombstone_bytes(store)
        tok = get_tokenizer("cl100k_base")
        raw_tokens = sum(tok.count(str(m.get("content") or "")) for m in messages)
        summary_tokens = sum(tok.count(s.content) for s in store.summaries(config.tenant))
    print(
        f"chatbench-dev: {len(messages)} events, {len(qa)} questions, budget {args.budget} "
        f"tokens (gpt-4, cl100k); compacting all but the last {args.keep_days:g} days"
    )
    print()
    print("| | before | after | after / before |")
    print("|---|---:|---:|---:|")
    print(f"| answer string in context | {before:.1%} | {after:.1%} | {after / before:.1%} |")
    print(f"| memories | {memories_before} | {memories_after} | "
          f"{memories_after / memories_before:.1%} |")  # fmt: skip
    print(f"| store size (bytes, vacuumed) | {size_before:,} | {size_after:,} | "
          f"{size_after / size_before:.1%} |")  # fmt: skip
    if tombstone_bytes is not None:
        rest = size_after - tombstone_bytes
        print(f"| of which tombstones (table + index) | 0 | {tombstone_bytes:,} | |")
        print(f"| store size without tombstones | {size_before:,} | {rest:,} | "
              f"{rest / size_before:.1%} |")  # fmt: skip
    print()
    print(f"{result.compacted} memories in {len(plan.clusters)} clusters -> "
          f"{len(result.summaries)} summaries in {seconds:.1f} s; plan estimated "
          f"{plan.tokens_saved} of {plan.tokens} tokens saved; {result.left_alone} clusters "
          "left alone (their summary would lose a fact)")  # fmt: skip
    print(
        f"summary growth: {summary_tokens:,} summary tokens = "
        f"{summary_tokens / raw_tokens:.1%} of the raw log's {raw_tokens:,} (cl100k)"
    )
    ok_retention = after >= 0.95 * before
    ok_size = size_after <= 0.5 * size_before
    print(f"targets: retention >= 95% of before: {'met' if ok_retention else 'NOT met'}; "
          f"store size down >= 50%: {'met' if ok_size else 'NOT met'}")  # fmt: skip


if __name__ == "__main__":
    main()
