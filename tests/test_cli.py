"""The CLI end to end, as a user runs it (a real subprocess, a real database file)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest


def ctxwarden(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [sys.executable, "-m", "ctxwarden", *args],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    if check and result.returncode != 0:
        raise AssertionError(result.stderr)
    return result


def test_cli_on_chatbench(tmp_path: Path, chatbench: Path) -> None:
    db = str(tmp_path / "bench.db")
    report = tmp_path / "outcomes.jsonl"
    # --no-embed: 4,944 messages through MiniLM would be a minute of CPU; the embedding pass
    # of `ingest` has its own test below.
    out = ctxwarden(
        "--db", db, "ingest", str(chatbench / "messages.jsonl"), "--report", str(report),
        "--no-embed",
    )  # fmt: skip
    lines = (chatbench / "messages.jsonl").read_text(encoding="utf-8").splitlines()
    total = sum(1 for line in lines if line.strip())
    assert f"{total} records" in out.stdout
    outcomes = [json.loads(line) for line in report.read_text().splitlines()]
    assert len(outcomes) == total
    assert {o["status"] for o in outcomes} <= {"stored", "duplicate", "near_duplicate", "known"}
    again = ctxwarden("--db", db, "ingest", str(chatbench / "messages.jsonl"))
    assert f"{total} already known" in again.stdout

    question = json.loads((chatbench / "qa.jsonl").read_text(encoding="utf-8").splitlines()[0])
    result = ctxwarden(
        "--db", db, "assemble", "--session", "guild-1", "--query", question["question"],
        "--model", "gpt-4", "--budget", "2000", "--json",
    )  # fmt: skip
    context = json.loads(result.stdout)
    assert context["tokens"] <= 2000
    assert context["report"]["tokenizer"] == "cl100k_base"
    assert context["messages"][-1] == {"role": "user", "content": question["question"]}
    assert len(context["included"]) == len(set(context["included"])) > 10
    sized = context["report"]["retrieval"]
    assert sized["related_tokens"] > 0
    # The terminal form says the same: how retrieval was sized, on one line.
    shown = ctxwarden(
        "--db", db, "assemble", "--session", "guild-1", "--query", question["question"],
        "--model", "gpt-4", "--budget", "2000",
    ).stdout  # fmt: skip
    values = ", ".join(f"{name} {value:g}" for name, value in sized.items())
    assert f"retrieval sized: {values}" in " ".join(shown.split())  # wrapped at 80 columns

    stats = json.loads(ctxwarden("--db", db, "stats", "--json").stdout)
    assert stats["seen"] == total
    assert set(stats["channels"]) == {"random", "alerts", "dev", "general"}
    assert stats["contexts"] == 2
    table = ctxwarden("--db", db, "stats").stdout
    assert "folded" in table


def test_bad_input_is_one_line_and_exit_1(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"content": "ok"}\n{"content": "x", "role": "wizard"}\n')
    result = ctxwarden("--db", str(tmp_path / "x.db"), "ingest", str(bad), check=False)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        "error: line 2, field 'role': 'wizard' is not one of assistant, system, tool, user "
        "(pass --skip-bad-lines to ingest the rest)"
    ]
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"content": "ok"}\n{not json\n')
    result = ctxwarden("--db", str(tmp_path / "x.db"), "ingest", str(broken), check=False)
    assert result.returncode == 1
    assert result.stderr.startswith("error: line 2: not valid JSON")
    stats = json.loads(ctxwarden("--db", str(tmp_path / "x.db"), "stats", "--json").stdout)
    assert stats["memories"] == 0  # nothing written from either bad file


def test_any_model_works_and_bad_tokenizer_or_window_is_a_clear_error(tmp_path: Path) -> None:
    db = str(tmp_path / "x.db")
    # An unknown model is approximated, not refused, and the report says so.
    result = ctxwarden("--db", db, "assemble", "--session", "s", "--model", "nope-9", "--json")
    notes = json.loads(result.stdout)["report"]["notes"]
    assert any("'nope-9' is not in the registry" in n for n in notes)
    named = json.loads(
        ctxwarden(
            "--db", db, "assemble", "--session", "s", "--model", "nope-9", "--json",
            "--tokenizer", "o200k_base", "--window", "16384",
        ).stdout
    )  # fmt: skip
    assert named["report"]["tokenizer"] == "o200k_base"
    assert named["report"]["exact"] is True
    assert named["report"]["cap"] <= 16384
    bad = ctxwarden(
        "--db", db, "assemble", "--session", "s", "--tokenizer", "gpt-2000", check=False
    )
    assert bad.returncode == 1
    assert bad.stderr.startswith("error: field 'tokenizer': unknown tokenizer 'gpt-2000'")
    assert "o200k_base" in bad.stderr
    zero = ctxwarden("--db", db, "assemble", "--session", "s", "--window", "0", check=False)
    assert zero.returncode == 1
    assert zero.stderr.startswith("error: field 'window': must be a positive integer")


@pytest.mark.slow
def test_demo_runs() -> None:
    result = ctxwarden("demo")
    assert "recent" in result.stdout
    assert "persistent" in result.stdout
    # The standup time in force is shown; the one it superseded (d004) is no longer offered as
    # a related line (issue 19): it appears only as recent history, before its change.
    assert "standup is now at 10:30" in result.stdout
    related = next(line for line in result.stdout.splitlines() if line.startswith("│ related "))
    assert "d004" not in related


def test_cli_ingest_embeds_what_it_stored(tmp_path: Path) -> None:
    db = str(tmp_path / "db.sqlite")
    records = tmp_path / "r.jsonl"
    records.write_text(
        "\n".join(
            json.dumps({"id": f"m{i}", "session": "s", "content": f"note {i} about the garden"})
            for i in range(5)
        )
    )
    out = json.loads(ctxwarden("--db", db, "ingest", str(records), "--json").stdout)
    assert out["stored"] == out["embedded"] == 5
    again = ctxwarden("--db", db, "embed")
    assert "0 memories embedded" in again.stdout  # nothing left for the batch command
    more = tmp_path / "more.jsonl"
    more.write_text(json.dumps({"id": "x", "session": "s", "content": "a new note"}))
    plain = ctxwarden("--db", db, "ingest", str(more), "--no-embed")
    assert "embedded" not in plain.stdout
    assert "1 memories embedded" in ctxwarden("--db", db, "embed").stdout


def test_cli_embed_detects_a_model_change(tmp_path: Path) -> None:
    db = str(tmp_path / "db.sqlite")
    records = tmp_path / "r.jsonl"
    records.write_text(
        "\n".join(
            json.dumps({"id": f"m{i}", "session": "s", "content": f"note {i} about the garden"})
            for i in range(5)
        )
    )
    ctxwarden("--db", db, "ingest", str(records), "--no-embed")
    first = ctxwarden("--db", db, "embed", "--embedder", "minilm-static")
    assert "5 memories embedded" in first.stdout
    again = ctxwarden("--db", db, "embed", "--embedder", "minilm-static")
    assert "0 memories embedded" in again.stdout
    other = ctxwarden("--db", db, "embed", "--embedder", "minilm", check=False)
    assert other.returncode != 0
    assert "ctxwarden embed --reembed" in other.stdout + other.stderr
