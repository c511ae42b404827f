"""bench/reliability.py at a tiny size: every scenario runs and the table has a line each."""

from __future__ import annotations

from typing import Any

import pytest

from benchload import load_bench


def _bench() -> Any:
    return load_bench("reliability", "bench_reliability_smoke")


def test_bench_reliability_prints_its_table(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--kills", "1", "--processes", "2", "--per-process", "20", "--compact-days", "3",
            "--contention-seconds", "1"]  # fmt: skip
    rows = _bench().main(argv)
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if line.startswith("| ")]
    header = [cell.strip() for cell in lines[0].strip("|").split("|")]
    assert header[:4] == ["scenario", "kills", "acknowledged", "lost"]
    assert {"integrity failures", "5xx", "canary bytes", "p99 (s)", "slowest (s)"} <= set(header)
    body = {line.split("|")[1].strip(): line for line in lines[1:]}
    # three crash scenarios, concurrency, contention, nine kinds of erasure
    assert len(body) == len(rows) == 3 + 1 + 1 + 9
    for row in rows[:3]:
        assert row.kills == 1
        assert (row.lost, row.wrong, row.integrity_failures) == (0, 0, 0), row.notes
        assert f"| {row.scenario} | 1 | {row.acknowledged:,} | 0 | 0 |" in body[row.scenario]
    assert rows[3].acknowledged == 40
    assert rows[4].acknowledged
    assert rows[4].slowest > 0
    assert rows[3].p99 is not None
    assert rows[4].p99 is not None
    assert 0 < rows[4].p99 <= rows[4].slowest
    assert any("requests over the server's store wait limit" in n for n in rows[4].notes)
    assert all(row.canary_bytes is not None for row in rows[5:])
    # compacted with keep_originals="archive", then erased: the archived record is gone too
    archived = [row for row in rows if row.scenario.startswith("erase: archived")]
    assert len(archived) == 3
    assert all(row.canary_bytes == 0 and not row.notes for row in archived), archived


def test_unknown_scenarios_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        _bench().main(["--scenarios", "library,nope"])
    assert "--scenarios: unknown nope" in capsys.readouterr().err
