"""bench/facts.py runs tiny: the generated log, the judge and the table (issue 19)."""

from __future__ import annotations

from typing import Any

from benchload import load_bench


def _bench() -> Any:
    return load_bench("facts", "facts")


def test_the_log_is_seeded_and_holds_every_language() -> None:
    bench = _bench()
    records, asked = bench.generate(1, 2, 3)
    again, _ = bench.generate(1, 2, 3)
    assert records == again
    assert {s.language for s in asked} == {"en", "ja", "zh"}
    assert all(len(s.values) >= 2 for s in asked)
    times = [r["created_at"] for r in records]
    assert times == sorted(times)


def test_the_bench_runs_tiny(capsys: Any) -> None:
    bench = _bench()
    results = bench.main(["--sessions", "1", "--subjects", "2", "--seed", "3"])
    out = capsys.readouterr().out
    assert "| on | all | 6 |" in out
    # With detection, no superseded value is shown as current in the memory blocks.
    assert not any(stale for verdicts in results["on"].values() for _, stale in verdicts)
