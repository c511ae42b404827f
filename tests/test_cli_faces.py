"""The CLI's rough edges (issue 21): usage errors in one line with exit code 2, --version,
--json on every command that prints a result, progress bars with total, rate and ETA, and
ingest --skip-bad-lines with a report of what was skipped."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest
import typer
from rich.console import Console
from typer.testing import CliRunner

from ctxwarden import __version__
from ctxwarden.cli import app, main
from ctxwarden.terminal import progress_bar


def run_main(
    argv: list[str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> tuple[int, str, str]:
    """Run the real entry point in-process: (exit code, stdout, stderr)."""
    monkeypatch.setattr(sys, "argv", ["ctxwarden", *argv])
    code = 0
    try:
        main()
    except SystemExit as exc:
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--bogus"], "No such option: --bogus"),
        (["assemble", "--session", "s", "--budget", "abc"], "Invalid value for '--budget'"),
        (["assemble"], "Missing option '--session'"),
        (["ingest"], "Missing argument 'file'"),
        (["stats", "--jsn"], "No such option: --jsn"),
        (["nosuchcommand"], "No such command 'nosuchcommand'"),
        (["search", "x", "--scope", "planet"], "Invalid value for '--scope'"),
    ],
)
def test_usage_errors_are_one_line_and_exit_2(
    argv: list[str],
    needle: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    code, out, err = run_main(["--db", str(tmp_path / "x.db"), *argv], capsys, monkeypatch)
    assert code == 2
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("error: ")
    assert needle in lines[0]
    assert "--help" in lines[0]  # where to look next


def test_version_and_help(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    code, out, err = run_main(["--version"], capsys, monkeypatch)
    assert (code, out, err) == (0, f"ctxwarden {__version__}\n", "")
    code, out, _ = run_main(["stats", "--help"], capsys, monkeypatch)
    assert code == 0
    assert "--json" in out


def test_the_installed_entry_point_gives_one_line_and_exit_2(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "ctxwarden", "--db", str(tmp_path / "x.db"), "--budget", "abc"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 2
    assert len(result.stderr.strip().splitlines()) == 1
    assert "Traceback" not in result.stderr


def test_debug_still_shows_the_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(
        sys, "argv", ["ctxwarden", "--debug", "--db", str(tmp_path / "x.db"), "stats", "--jsn"]
    )
    with pytest.raises(typer.TyperException, match="No such option"):
        main()


def _write(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_ingest_skip_bad_lines_reports_them(tmp_path: Path) -> None:
    source = _write(
        tmp_path / "in.jsonl",
        [
            '{"id": "a", "session": "s", "content": "first"}',
            "{not json",
            '{"id": "b", "session": "s", "content": "second", "role": "wizard"}',
            '{"id": "c", "session": "s", "content": "third"}',
            '["not", "an", "object"]',
            '{"id": "d", "session": "s", "content": "fourth", "querry": 1}',
        ],
    )
    db = str(tmp_path / "x.db")
    runner = CliRunner()
    refused = runner.invoke(app, ["--db", db, "ingest", str(source)])
    assert refused.exit_code != 0  # without the flag the first bad line stops the file
    counted = runner.invoke(app, ["--db", db, "stats", "--json"])
    assert json.loads(counted.stdout)["memories"] == 0  # and nothing was written

    result = runner.invoke(app, ["--db", db, "ingest", str(source), "--skip-bad-lines", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["records"] == 2
    assert data["stored"] == 2
    assert [(s["line"], s["field"]) for s in data["skipped"]] == [
        (2, None),
        (3, "role"),
        (5, None),
        (6, "querry"),
    ]
    assert "not valid JSON" in data["skipped"][0]["error"]
    assert "wizard" in data["skipped"][1]["error"]
    # the plain form names what was skipped on stderr, the counts on stdout
    again = runner.invoke(app, ["--db", db, "ingest", str(source), "--skip-bad-lines"])
    assert again.exit_code == 0
    assert "2 records: 0 stored" in again.stdout
    assert "4 bad lines skipped" in again.stdout
    assert "skipped line 3, field 'role'" in again.stderr


def test_every_result_command_speaks_json(tmp_path: Path) -> None:
    db = str(tmp_path / "x.db")
    runner = CliRunner()
    source = _write(
        tmp_path / "in.jsonl",
        [
            json.dumps({"id": f"m{i}", "session": "s", "content": f"message number {i}"})
            for i in range(5)
        ],
    )

    def as_json(*argv: str) -> object:
        result = runner.invoke(app, ["--db", db, *argv, "--json"])
        assert result.exit_code == 0, result.output
        return json.loads(result.stdout)

    assert as_json("ingest", str(source))["stored"] == 5  # type: ignore[index]
    assert as_json("assemble", "--session", "s", "--query", "number")["tokens"] > 0  # type: ignore[index]
    assert as_json("stats")["memories"] == 5  # type: ignore[index]
    assert as_json("compact", "--plan")["memories"] == 0  # type: ignore[index]
    assert as_json("demo")["stored"] > 0  # type: ignore[index]
    created = as_json("keys", "create", "--tenant", "t", "--scope", "read")
    assert created["tenant"] == "t"  # type: ignore[index]
    listed = runner.invoke(app, ["--db", db, "keys", "list", "--json"])
    key_id = json.loads(listed.stdout.splitlines()[0])["key_id"]
    assert as_json("keys", "revoke", key_id) == {"revoked": key_id}
    hits = runner.invoke(app, ["--db", db, "search", "number", "--session", "s", "--json"])
    assert len([json.loads(line) for line in hits.stdout.splitlines()]) == 5


def test_progress_bars_show_total_rate_and_eta() -> None:
    buffer = io.StringIO()
    console = Console(file=buffer, force_terminal=True, width=120, color_system=None)
    with progress_bar("ingesting", "records", console=console) as progress:
        task = progress.add_task("ingest", total=3000)
        for _ in range(3):
            progress.advance(task, 1000)
    shown = [line for line in buffer.getvalue().splitlines() if "ingesting" in line]
    final = shown[-1]
    assert "ingesting" in final
    assert "3000/3000" in final
    assert "records/s" in final
    assert "eta" in final


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.parametrize("as_json", [False, True])
def test_serve_says_when_it_warms_up_and_when_it_is_ready(tmp_path: Path, as_json: bool) -> None:
    import httpx

    port = _free_port()
    argv = ["--db", str(tmp_path / "x.db"), "serve", "--no-auth", "--port", str(port)]
    process = subprocess.Popen(
        [sys.executable, "-m", "ctxwarden", *argv, *(["--json"] if as_json else [])],
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert process.stderr is not None
        first = process.stderr.readline()
        second = process.stderr.readline()
        if as_json:
            assert json.loads(first) == {"server": "serve", "event": "warming_up"}
            ready = json.loads(second)
            assert ready["event"] == "ready"
            assert ready["url"] == f"http://127.0.0.1:{port}"
            assert ready["warm_up_seconds"] >= 0
        else:
            assert first.startswith("ctxwarden serve: warming up")
            assert second.startswith(f"ctxwarden serve: ready on http://127.0.0.1:{port}")
        # ready means ready: the port answers at once
        assert httpx.get(f"http://127.0.0.1:{port}/health").json() == {"status": "ok"}
    finally:
        process.terminate()
        process.wait(timeout=30)
        if process.stderr is not None:
            process.stderr.close()
