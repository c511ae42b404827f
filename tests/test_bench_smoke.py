"""Every bench keeps running: each one's ``main`` at a tiny size prints its table.

The assertions are on what the table says (its header, a row per size, counts that follow from
the inputs), never on timings. bench/chat_text.py, crashkit.py and pg_embedded.py are helpers:
they run here through the benches that use them (retrieve and serve, reliability's own smoke
test, ingest_one --postgres). Benches that read the development data find ../shared/data as
bench/evidence_recall.py does (beside the checkout or beside a parent of it) and skip without it,
as the ``chatbench`` fixture does.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import numpy as np
import pytest

from benchload import load_bench

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
SHARED = next(
    (p / "shared" / "data" for p in ROOT.parents if (p / "shared" / "data").is_dir()), None
)


def _data(relative: str) -> Path:
    path = SHARED / relative if SHARED is not None else None
    if path is None or not path.exists():
        pytest.skip(f"development data not found: ../shared/data/{relative}")
    return path


def _rows(out: str) -> list[list[str]]:
    """The cells of every markdown table line printed (header and separator included)."""
    return [
        [cell.strip() for cell in line.strip().strip("|").split("|")]
        for line in out.splitlines()
        if line.startswith("|")
    ]


def _run(capsys: pytest.CaptureFixture[str], script: str, words: str, *extra: object) -> str:
    """``bench/<script>.py``'s ``main`` on ``words`` (split at spaces) and then ``extra`` (paths,
    DSNs: kept whole); what it printed."""
    # backends under its own name: its spawned ingest processes import it as `backends`
    name = script if script == "backends" else f"bench_smoke_{script}"
    load_bench(script, name).main([*words.split(), *map(str, extra)])
    return capsys.readouterr().out


def _children_import_this_source(monkeypatch: pytest.MonkeyPatch) -> None:
    """Child processes a bench starts import this checkout's ``src``, not an installed copy."""
    paths = [str(SRC), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(paths))


def test_access(capsys: pytest.CaptureFixture[str]) -> None:
    out = _run(capsys, "access", "--memories 200 --contexts 20 --included 10 --reads 5")
    assert out.startswith("200 memories, 20 contexts of 10 inclusions")
    rows = {row[0]: row[1] for row in _rows(out)}
    assert rows["measure"] == "value"
    for name in (
        "log_context CPU ms, mean",
        "WAL pages written per context",
        "memories_at(10 rowids) CPU us, p50",
        "get CPU us, p50",
        "recent CPU us, mean",
    ):
        assert float(rows[name]) >= 0
    assert float(rows["WAL pages written per context"]) > 0  # every logged context commits


def test_agentfit(capsys: pytest.CaptureFixture[str]) -> None:
    rows = _rows(_run(capsys, "agentfit", "--items 40 --repeat 2"))
    assert rows[0] == ["API", "items", "first request (ms CPU)", "later requests, median (ms CPU)"]
    assert [row[:2] for row in rows[2:]] == [["Responses", "40"], ["Messages", "40"]]


def test_assemble_beside_langchain(capsys: pytest.CaptureFixture[str]) -> None:
    argv = "--budget 500 --runs 2 --sizes 50,120"
    rows = _rows(_run(capsys, "assemble", argv))
    assert rows[0][:4] == ["messages", "ctxwarden p50", "ctxwarden p99", "tokens used"]
    assert [row[0] for row in rows[2:]] == ["50", "120"]
    for row in rows[2:]:
        assert 0 < int(row[3]) <= 500  # the context stays within its budget
        assert row[-1].endswith("msg/s")


def test_ingest(capsys: pytest.CaptureFixture[str]) -> None:
    out = _run(capsys, "ingest", "--messages 300 --batch 100")
    outcomes = re.search(r"outcomes: (\d+) stored, (\d+) exact, (\d+) near", out)
    assert outcomes is not None
    assert sum(int(n) for n in outcomes.groups()) == 299  # the first message is the warm-up
    assert int(outcomes[2]) + int(outcomes[3]) > 0  # the synthetic log repeats itself
    rows = _rows(out)
    assert rows[0] == ["slice", "wall us per message", "CPU us per message"]
    assert [row[0] for row in rows[2:]] == ["0k-300"]


def test_ingest_compare_runs_both_inits_in_fresh_processes(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # --compare runs `bench/ingest.py --plain-init` and the default, each in a fresh process
    _children_import_this_source(monkeypatch)
    out = _run(capsys, "ingest", "--compare 1 --messages 60 --batch 20")
    for variant in ("plain", "fast"):
        assert re.search(rf"^{variant}: [\d.]+ CPU us per message$", out, re.MULTILINE)
        assert re.search(rf"^{variant}: median [\d.]+ CPU us per message \(runs [\d.]+\)$", out,
                         re.MULTILINE)  # fmt: skip


def test_ingest_one(capsys: pytest.CaptureFixture[str]) -> None:
    argv = "--sizes 100,200 --calls 8 --sessions 5"
    rows = _rows(_run(capsys, "ingest_one", argv))
    assert rows[0][0] == "stored messages"
    assert rows[0][-1] == "folds"
    assert [row[0] for row in rows[2:]] == ["100", "200"]
    for row in rows[2:]:
        folds, calls = (int(n) for n in row[-1].split("/"))
        assert calls == 8
        assert 0 < folds <= 2  # calls 3 and 7 repeat an earlier message verbatim


@pytest.mark.postgres
def test_ingest_one_on_an_embedded_postgres(
    capsys: pytest.CaptureFixture[str], pg_dsn: str
) -> None:
    # --postgres starts its own server through bench/pg_embedded.py (pg_dsn: the same skip rule)
    argv = "--sizes 60 --calls 4 --sessions 3 --postgres"
    rows = _rows(_run(capsys, "ingest_one", argv))
    assert [row[0] for row in rows[2:]] == ["60"]
    assert rows[2][-1].endswith("/4")


def test_script_search(capsys: pytest.CaptureFixture[str]) -> None:
    out = _run(capsys, "script_search", "--distractors 5 --seed 1")
    assert out.startswith("145 messages, 5 distractors a language, seed 1")  # 5 x (24 + 5)
    rows = _rows(out)
    assert rows[0] == ["language", "questions", "hit@1", "recall@5"]
    assert [row[:2] for row in rows[2:]] == [
        [lang, "24"] for lang in ("en", "ja", "zh", "ko", "th")
    ]
    for row in rows[2:]:  # a question sharing a word with two messages finds one of them
        assert float(row[2].rstrip(" %")) > 0


def test_scoped_search(capsys: pytest.CaptureFixture[str]) -> None:
    out = _run(capsys, "scoped_search", "--messages 300 --runs 2 --embed off")
    assert out.startswith("300 messages, layout live, 2 runs each")
    hits = {m[1]: int(m[2]) for m in re.finditer(r"search +(\w+) +(\d+) hits", out)}
    assert set(hits) == {"tenant", "session", "user"}
    assert 0 < hits["session"] <= hits["user"] <= hits["tenant"] <= 70
    assert {m[1] for m in re.finditer(r"assemble (\w+) +[\d.]+ ms", out)} == {
        "session",
        "user",
        "tenant",
    }


def test_serve_over_loopback(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    _children_import_this_source(monkeypatch)  # the server is `python -m ctxwarden.cli`
    monkeypatch.setenv("CTXWARDEN_EMBED", "off")  # its Settings: words only, no model to load
    argv = "--requests 12 --saturation-requests 12 --connections 2 --seed 40 --sessions 3"
    out = _run(capsys, "serve", argv)
    assert out.count("12 requests in") == 2
    assert out.count("statuses {200: 12}") == 2  # both phases, no errors
    rows = re.findall(r"^(assemble|ingest|search) +(\d+) +(\d+) ", out, re.MULTILINE)
    assert len(rows) == 6
    assert all(errors == "0" for _, _, errors in rows)
    assert sum(int(count) for _, count, _ in rows) == 24


def test_schema_fuzz_against_a_served_store(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("schemathesis")
    _children_import_this_source(monkeypatch)  # the server is `python -m ctxwarden.cli`
    out = _run(capsys, "schema_fuzz", "--examples 4 --seed 3", "--operations=GET /v1/stats*")
    rows = _rows(out)
    assert rows[0] == [
        "operation", "cases", "5xx", "conformance failures", "unanswered", "slowest (s)"
    ]  # fmt: skip
    assert [row[0] for row in rows[2:]] == [
        "GET /v1/stats", "GET /v1/stats/history", "**all 2 operations**"
    ]  # fmt: skip
    for row in rows[2:]:
        assert 1 <= int(row[1]) <= (8 if row[0].startswith("**") else 4)
        assert row[2:5] == ["0", "0", "0"], out  # no 5xx, nothing off the schema, all answered


def test_serve_breakdown(capsys: pytest.CaptureFixture[str]) -> None:
    out = _run(capsys, "serve", "--breakdown 2 --seed 40 --sessions 3")
    assert out.startswith("assemble, CPU ms per call over 2 calls (40 messages stored")
    lines = {line[:36].strip(): float(line[36:]) for line in out.splitlines()[1:]}
    assert {"total", "recent (history walk, counts)", "inclusion log + access stats"} <= set(lines)
    assert lines["total"] > 0


def test_tokenizer_margin(capsys: pytest.CaptureFixture[str]) -> None:
    out = _run(capsys, "tokenizer_margin", "")
    lines = out.splitlines()
    assert lines[0].startswith("samples: english ")
    assert lines[2].split() == [
        "tokenizer",
        "english",
        "code",
        "json",
        "cjk",
        "emoji",
        "other-scripts",
    ]
    needed = {
        m[1]: float(m[2]) for m in re.finditer(r"^  (\S+) +([\d.]+) +[\d.]+$", out, re.MULTILINE)
    }
    assert {"cl100k_base", "llama3", "qwen", "mistral-tekken"} <= set(needed)
    assert all(value > 0 for value in needed.values())


def test_vectors_choice(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "1")  # what the bench sets on import, undone after
    argv = (
        "--sizes 300 --base 40 --queries 8 --ef 64 --candidates numpy,usearch-f16,hnswlib,ctxwarden"
    )
    out = _run(capsys, "vectors_choice", argv, "--cache", tmp_path)
    rows = {line[:22].strip(): line[22:].split() for line in out.splitlines()[2:]}
    assert rows["numpy"][0] == "300"
    assert rows["numpy"][4] == "1.000"  # exact search finds the exact top 50
    assert "ctxwarden ef=64" in rows
    # scopes of 3, 15, 60 and 150 rows (the first two smaller than k = 50)
    assert [rows[f"scope {share} ef=64"][0] for share in ("1%", "5%", "20%", "50%")] == [
        "3",
        "15",
        "60",
        "150",
    ]
    # a peer library that is not installed gets a row that says so
    assert "hnswlib ef=64" in rows or "not installed" in " ".join(rows["hnswlib"])


def test_vectors_choice_refuses_sizes_under_k(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        _run(capsys, "vectors_choice", "--sizes 40")
    assert "--sizes: each must be more than k=50" in capsys.readouterr().err


def test_retrieve(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    argv = "--n 300 --queries 4 --breakdown --exact-check --templates 12 --texts 8 --db"
    # its main() reads sys.argv (no argv parameter)
    monkeypatch.setattr("sys.argv", ["retrieve.py", *argv.split(), str(tmp_path / "r.db")])
    load_bench("retrieve", "bench_smoke_retrieve").main()
    out = capsys.readouterr().out
    assert "store of 300 memories ready" in out
    assert re.search(r"retrieve over 300 memories, 4 queries, CPU time .*: p50 [\d.]+ ms", out)
    assert re.search(r"lexical search: [\d.]+ ms CPU per query", out)
    assert re.search(r"vector search \(author\): [\d.]+ ms CPU per query \(4 calls\)", out)
    assert "author-scoped vector search against exact, 4 queries" in out
    assert len(re.findall(r"^embedder \S+: [\d,]+ messages/s wall", out, re.MULTILINE)) == 2


def test_embed_choice_with_a_static_variant(capsys: pytest.CaptureFixture[str]) -> None:
    vendored = SRC / "ctxwarden" / "data" / "embed" / "minilm-l6-static.npz"
    out = _run(capsys, "embed_choice", "--messages 16 --static", vendored)
    lines = out.splitlines()
    assert lines[0].split()[:4] == ["embedder", "dim", "top-1", "MRR"]
    rows = {line[:34].strip(): line[34:].split() for line in lines[1:]}
    int8, float_path = "minilm-l6-int8@2, int8 (1 thread)", "minilm-l6-int8@1, float (1 thread)"
    assert set(rows) == {int8, float_path, "minilm-static (vendored)", vendored.stem}
    assert rows[int8][0] == rows[float_path][0] == "384"
    # the vendored table loaded through --static ranks as the vendored embedder does
    assert rows[vendored.stem][:4] == rows["minilm-static (vendored)"][:4]


def test_distill_static(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    out_file = tmp_path / "table.npz"
    out = _run(capsys, "distill_static", "--tokens 64 --dims 16 --out", out_file)
    assert "token outputs: (64, 384)" in out
    assert f"wrote {out_file}" in out
    with np.load(out_file) as archive:
        assert archive["vectors"].shape == (64, 16)
        assert archive["vectors"].dtype == np.int8
        assert archive["scales"].shape == (64,)


# -- on the development data --------------------------------------------------------------------


def test_dedupe_explore(capsys: pytest.CaptureFixture[str]) -> None:
    data = _data("chatbench-dev")
    out = _run(capsys, "dedupe_explore", "--scope channel --show 1", data)
    assert re.search(r"^scope=channel  messages=\d+  stored=\d+  folded=\d+$", out, re.MULTILINE)
    for measure in ("recall", "precision"):
        found = re.search(rf"^{measure} +([\d.]+)  \(\d+/\d+\)$", out, re.MULTILINE)
        assert found is not None
        assert 0.0 <= float(found[1]) <= 1.0
    assert re.search(r"^DedupeCandidate.build: [\d.]+ us/message", out, re.MULTILINE)
    assert "simulated ingest (build + date parse + lookups + may_fold)" in out


def test_dedupe_quality_with_layer_c(capsys: pytest.CaptureFixture[str]) -> None:
    data = _data("chatbench-dev")
    argv = "--scope channel --show 1 --messages 300 --semantic --thresholds 0.95"
    out = _run(capsys, "dedupe_quality", argv, data)
    assert out.startswith("300 messages, ")
    rows = _rows(out)
    assert rows[0][:4] == ["exact scope", "recall", "precision", "protected"]
    assert rows[2][0] == "(no de-dup)"
    assert rows[2][7] == "300"  # every message stored
    channel = rows[3]
    assert channel[0] == "channel"
    assert 0 < int(channel[7]) < 300  # the spam folds
    semantic = [row for row in rows if row[:2] == ["channel", "0.950"]]
    assert len(semantic) == 1
    assert int(semantic[0][8]) <= int(channel[7])  # layer C only folds more


def test_retention_on_one_conversation(capsys: pytest.CaptureFixture[str]) -> None:
    data = _data("locomo-dev/locomo-dev.json")
    argv = "--conversations 1 --limit 6 --keep-sessions 1 --max-summary-share 0.95 --objects 2"
    argv += " --embed off"  # words only: embedding every turn would be most of the run
    out = _run(capsys, "retention", argv, data)
    assert re.search(r"^## locomo-dev: \d+ events in 1 tenant\(s\), 6 questions", out, re.MULTILINE)
    rows: dict[str, list[str]] = {}
    for row in _rows(out):  # the first table's rows (the second lists a table `memories` too)
        rows.setdefault(row[0], row[1:])
    assert "answer string in context" in rows
    before, after = (int(n) for n in rows["memories"][:2])
    # A LoCoMo session says something new in nearly every turn: its clusters may be left out
    # of the plan (their facts need more than the summary may take), never grown.
    assert after <= before
    assert re.search(r"^\d+ memories in \d+ clusters -> \d+ summaries", out, re.MULTILINE)
    assert "targets: retention >= 95% of before:" in out


def test_retention_on_chatbench(capsys: pytest.CaptureFixture[str]) -> None:
    data = _data("chatbench-dev")
    out = _run(capsys, "retention", "--limit 2 --objects 2 --embed off", data)
    assert re.search(r"^## chatbench-dev: \d+ events in 1 tenant\(s\), 2 questions", out, re.M)
    rows: dict[str, list[str]] = {}
    for row in _rows(out):
        rows.setdefault(row[0], row[1:])
    before, after = (int(n) for n in rows["memories"][:2])
    assert after < before  # compaction took the old days' clusters
    growth = re.search(r"= ([\d.]+)% of the raw log", out)
    assert growth is not None
    assert 0.0 < float(growth.group(1)) < 100.0


def test_store_bytes_on_one_conversation(capsys: pytest.CaptureFixture[str]) -> None:
    data = _data("locomo-dev/locomo-dev.json")
    out = _run(capsys, "store_bytes", "--conversations 1 --limit 3 --keep-sessions 1 --pack", data)
    assert re.search(r"^## locomo-dev: .*lossless packs", out, re.MULTILINE)
    rows = {row[0]: row[1:] for row in _rows(out)}
    size_before, size_after = (int(n.replace(",", "")) for n in rows["store bytes (vacuumed)"][:2])
    # Packing a session's turns into one row each removes rows: the store can only shrink.
    assert 0 < size_after < size_before
    # A pack keeps every sentence verbatim: the texts hold every answer they held before.
    in_store = rows["answer string in the store's texts"]
    assert float(in_store[1].rstrip("%")) >= float(in_store[0].rstrip("%"))
    # Every retired turn has a tombstone, in fewer groups than ids, and the column tables add up.
    for table in ("tombstone_groups", "tombstone_keys"):
        *columns, total = _rows(out.split(f"| {table}: column")[1].split("\n\n")[0])[1:]
        assert re.fullmatch(r"all \(0 -> [1-9][\d,]* rows\)", total[0])
        assert sum(int(r[2].replace(",", "")) for r in columns) == int(total[2].replace(",", ""))
    groups, keys = (
        int(found.replace(",", ""))
        for found in re.findall(r"^\| all \(0 -> ([\d,]+) rows\)", out, re.MULTILINE)
    )
    assert int(rows["tombstones: retired ids"][1].replace(",", "")) >= keys > groups
    # the layout before (a row per id) takes more pages than groups and keys together
    size = {k: int(v[1].replace(",", "")) for k, v in rows.items() if k.startswith("tombstones")}
    assert size["tombstones, layout before: a row per id"] > (
        size["tombstones: groups (one row per summary or erasure)"]
        + size["tombstones: keys (32-bit hash of each id -> group)"]
    )


@pytest.mark.postgres
def test_lexical_agreement(capsys: pytest.CaptureFixture[str], pg_schema_dsn: str) -> None:
    data = _data("locomo-dev/locomo-dev.json")
    argv = "--conversations 1 --limit 5 --k 5"
    out = _run(capsys, "lexical_agreement", argv, data, "--dsn", pg_schema_dsn)
    rows = {row[0]: row[1] for row in _rows(out)}
    assert rows["measure"] == "value"
    assert rows["questions"] == "5"
    assert 0.0 <= float(rows["overlap@5"]) <= 1.0
    assert 0.0 <= float(rows["evidence@5 PostgreSQL"]) <= 1.0


@pytest.mark.postgres
def test_lexical_agreement_at_scale(capsys: pytest.CaptureFixture[str], pg_schema_dsn: str) -> None:
    out = _run(capsys, "lexical_agreement", "--scale 300 --dsn", pg_schema_dsn)
    rows = _rows(out)
    assert rows[0] == ["query", "rows holding the words (capped)", "p50", "max"]
    assert [row[0] for row in rows[2:]] == [
        "1 rare word",
        "3 rare words",
        "2 common words",
        "4 common + 2 rare",
        "12 common words",
    ]
    for row in rows[2:]:  # how many of the 300 rows hold each word, "+"-joined
        assert all(0 <= int(count) <= 300 for count in row[1].split("+"))
    assert len(rows[-1][1].split("+")) == 12


@pytest.mark.postgres
def test_backends(capsys: pytest.CaptureFixture[str], pg_schema_dsn: str) -> None:
    argv = "--sizes 50 --runs 2 --procs 2 --per-proc 3 --singles 10"
    rows = _rows(_run(capsys, "backends", argv, "--dsn", pg_schema_dsn))
    assert rows[0] == ["measure", "SQLite (WAL, file)", "PostgreSQL 18 (loopback)"]
    assert [row[0] for row in rows[2:]] == [
        "ingest 50 (500/call)",
        "assemble at 50: p50 / p99",
        "assemble with a query at 50: p50 / p99",
        "ingest 1 record/call",
        "2 processes, 1 record/call",
    ]
    assert all(cell.endswith(("rec/s", "ms", "us")) for row in rows[2:] for cell in row[1:])


@pytest.mark.postgres
def test_pg_search_plans(capsys: pytest.CaptureFixture[str], pg_schema_dsn: str) -> None:
    rows = _rows(_run(capsys, "pg_search_plans", "--size 60 --queries 3 --runs 2", "--dsn",
                      pg_schema_dsn))  # fmt: skip
    assert rows[0] == ["statement", "p50"]
    assert [row[0] for row in rows[2:]] == [
        "word search at 60, as the store runs it (planned for its values)",
        "word search at 60, prepared, on the generic plan",
    ]
    assert all(row[1].endswith(("ms", "us")) for row in rows[2:])


# -- benches newer than this file's branch (main after the 'semantic' and 'attachments' merges) --


def _newer_bench(script: str) -> None:
    if not (ROOT / "bench" / f"{script}.py").is_file():
        pytest.skip(f"bench/{script}.py is not in this checkout (it came with a later merge)")


def test_query_latency(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    _newer_bench("query_latency")
    # its main() reads sys.argv (no argv parameter)
    argv = ["query_latency.py", "--memories", "200", "--runs", "3", "--budget", "500"]
    monkeypatch.setattr("sys.argv", argv)
    load_bench("query_latency", "bench_smoke_query_latency").main()
    out = capsys.readouterr().out
    assert "200 memories, budget 500, 3 questions" in out
    rows = _rows(out)
    assert rows[0][:3] == ["what", "wall p50", "wall p95"]
    assert [row[0] for row in rows[2:]] == [
        "query embedding alone (MiniLM, int8: the default)",
        "query embedding alone (MiniLM, float: minilm-l6-int8@1)",
        "assemble, words only (no vector read)",
        "assemble with the query embedded (default config)",
        "assemble, query embedded on the float path (@1)",
    ]


def test_rerank_cost(capsys: pytest.CaptureFixture[str]) -> None:
    _newer_bench("rerank_cost")
    data = _data("locomo-dev/locomo-dev.json")
    out = _run(capsys, "rerank_cost", "--pairs 3,5 --questions 2 --data", data)
    assert re.findall(r"^(\d+) pairs: p50 [\d.]+ ms$", out, re.MULTILINE) == ["3", "5"]
