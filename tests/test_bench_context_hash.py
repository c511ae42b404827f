"""The context-hash yardstick (bench/context_hash.py) is stable and sees a changed context."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from benchload import load_bench

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "data" / "locomo_mini.json"


def _bench() -> Any:
    return load_bench("context_hash", "context_hash")


def test_same_data_same_hashes_and_a_changed_message_moves_them() -> None:
    bench = _bench()
    first = bench.context_hashes(bench.read(FIXTURE), [60, 1000])
    again = bench.context_hashes(bench.read(FIXTURE), [60, 1000])
    assert first == again
    assert all(len(digest) == 64 for digest in first.values())
    # 60 tokens hold less of the conversation than 1,000: different contexts, different hashes.
    assert first[60] != first[1000]
    conversations = bench.read(FIXTURE)
    conversations[0].records[1]["content"] = "Congrats! What colour is her fur?"
    changed = bench.context_hashes(conversations, [60, 1000])
    assert changed[1000] != first[1000]


def test_main_prints_a_line_per_budget_and_a_total(capsys: Any) -> None:
    bench = _bench()
    bench.main([str(FIXTURE), "--budgets", "1000,2000"])
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[:2] for line in lines] == [
        ["locomo_mini", "1000"],
        ["locomo_mini", "2000"],
        ["total", lines[-1].split()[1]],
    ]
