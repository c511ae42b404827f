"""The reliability suite, bounded: SIGKILL during library ingest, of ``ctxwarden serve`` under
HTTP ingest and during ``compact --apply`` beside a writer (a few dozen kills in all), several
processes ingesting into one SQLite file, and the erasure greps. The scenarios are those of
bench/reliability.py (which runs them at full size and prints the table); here each runs small
and every count that must be zero is asserted zero.

After every kill the store is reopened (WAL recovery) and must pass ``PRAGMA integrity_check``
and FTS5's ``integrity-check`` against the content table, with every acknowledged record (a
committed ``ingest`` that returned, or an HTTP 200) present and as it was sent.
"""

from __future__ import annotations

import random
import re
from pathlib import Path
from typing import Any

import pytest

from benchload import load_bench
from test_compact_crash import _check as compaction_consistent


@pytest.fixture(scope="module")
def bench() -> Any:
    module = load_bench("reliability", "bench_reliability")
    module.warm()  # forked children inherit the loaded tokenizer
    return module


def _clean(bench: Any, row: Any) -> None:
    assert row.clean(), bench.table([row])


def test_sigkill_during_library_ingest(bench: Any, tmp_path: Path) -> None:
    row = bench.library_crash(tmp_path, 16, random.Random(1), window=0.4)
    assert row.kills == 16
    assert row.acknowledged > 16  # the kills landed after commits, not only during start-up
    _clean(bench, row)
    assert (row.lost, row.wrong, row.integrity_failures) == (0, 0, 0)


def test_sigkill_of_serve_under_http_ingest(bench: Any, tmp_path: Path) -> None:
    row = bench.serve_crash(tmp_path, 4, random.Random(2), window=0.8)
    assert row.kills == 4
    assert row.acknowledged >= 4  # each kill came after an acknowledged request
    _clean(bench, row)
    assert (row.lost, row.wrong, row.integrity_failures, row.server_errors) == (0, 0, 0, 0)


def test_sigkill_during_compact_apply_beside_a_writer(bench: Any, tmp_path: Path) -> None:
    row = bench.compact_crash(tmp_path, 6, random.Random(3), days=10)
    assert row.kills == 6
    assert row.acknowledged > 0  # the writer beside it committed while compaction ran
    _clean(bench, row)
    assert (row.half_applied, row.lost, row.integrity_failures) == (0, 0, 0)
    landed = re.search(r"(\d+) of 6 kills landed mid-way", " ".join(row.notes))
    assert landed is not None
    assert int(landed.group(1)) >= 2, row.notes  # killed between clusters, not before or after


def test_a_cut_compaction_is_consistent_by_the_older_check_too(bench: Any, tmp_path: Path) -> None:
    """The same kill, judged by tests/test_compact_crash.py's own check (summaries and
    tombstones in step, FTS rows = table rows) before the second compaction."""
    template, path = tmp_path / "template.db", tmp_path / "cut.db"
    clusters = bench.prepare_compaction(template, bench.time.time(), days=4)
    _, _, _acked = bench._compact_once(template, path, bench.time.time(), 7, clusters // 2, 0.0)
    done, _ = compaction_consistent(path)
    assert clusters // 2 <= done <= clusters


def test_processes_ingesting_into_one_file(bench: Any, tmp_path: Path) -> None:
    row = bench.concurrency(tmp_path, 4, 120)
    assert row.acknowledged == 4 * 120
    assert row.errors == 0, row.notes  # no "database is locked", nor anything else
    _clean(bench, row)


def test_serve_beside_library_writers_in_other_processes(bench: Any, tmp_path: Path) -> None:
    """No wall-clock bound here (the bench prints the slowest request): nothing acknowledged
    is lost and no request fails with 500 while other processes hold the write lock."""
    row = bench.contention(tmp_path, 4.0, 2, random.Random(4))
    over_http = re.search(r"([\d,]+) records acknowledged over HTTP", " ".join(row.notes))
    assert over_http is not None
    assert int(over_http.group(1).replace(",", "")) > 0
    assert row.acknowledged > int(over_http.group(1).replace(",", ""))  # the writers' too
    assert row.errors == 0, row.notes  # no client lost the server, no 4xx
    assert (row.lost, row.wrong, row.integrity_failures) == (0, 0, 0), row.notes
    assert not [n for n in row.notes if "'500'" in n], row.notes


@pytest.mark.parametrize("kind", ["memory", "alias", "session", "tenant"])
def test_erased_canary_text_leaves_the_files(bench: Any, tmp_path: Path, kind: str) -> None:
    row = bench.erasure(tmp_path, kind)
    assert not [n for n in row.notes if "text bytes" in n or "still finds" in n], row.notes


@pytest.mark.parametrize("kind", ["memory", "session"])
def test_erased_canary_vector_leaves_the_index_files(bench: Any, tmp_path: Path, kind: str) -> None:
    row = bench.erasure(tmp_path, kind)
    assert row.canary_bytes == 0, row.notes


def test_a_compacted_memory_can_be_erased(bench: Any, tmp_path: Path) -> None:
    row = bench.erasure(tmp_path, "compacted memory")
    assert row.canary_bytes == 0, row.notes


def test_compaction_removes_the_originals_text_from_the_files(bench: Any, tmp_path: Path) -> None:
    row = bench.erasure(tmp_path, "compaction")  # a summariser that keeps none of their text
    if [n for n in row.notes if "not compacted" in n]:
        pytest.fail("the canary's memory was not compacted: the run proves nothing")
    assert row.canary_bytes == 0, row.notes
