"""The documentation site: it builds with --strict (every link resolves), and its reference
pages are generated from the code, so every command, setting, record field and HTTP operation
appears there with what the code says about it."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import typer.main

from ctxwarden.cli import app
from ctxwarden.config import Settings
from ctxwarden.types import Record

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    target = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(target)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env=env,
    )
    assert result.returncode == 0, result.stderr
    return target


def _page(site: Path, name: str) -> str:
    return (site / "reference" / name / "index.html").read_text(encoding="utf-8")


def _commands(group: object, prefix: str) -> list[str]:
    found = []
    for name, command in getattr(group, "commands", {}).items():
        path = f"{prefix} {name}"
        found += _commands(command, path) if hasattr(command, "commands") else [path]
    return found


def test_the_cli_reference_has_every_command_and_option(site: Path) -> None:
    page = _page(site, "cli")
    root = typer.main.get_command(app)
    for path in _commands(root, "ctxwarden"):
        assert f"<code>{path}</code>" in page, path
    assert "--skip-bad-lines" in page
    assert "Skip invalid lines (listed) and ingest the rest." in page


def test_the_configuration_reference_has_every_setting(site: Path) -> None:
    page = _page(site, "configuration")
    for name in Settings.model_fields:
        assert f"<code>CTXWARDEN_{name.upper()}</code>" in page, name
    assert "~/.local/share/ctxwarden/ctxwarden.db" in page  # the default db, as --help says


def test_the_record_schema_has_every_field_with_a_description(site: Path) -> None:
    page = _page(site, "records")
    for item in dataclasses.fields(Record):
        assert f"<code>{item.name}</code>" in page, item.name
    for name in ("channel", "author_kind", "created_at", "thread_id", "reply_to", "metadata"):
        row = page.split(f"<td><code>{name}</code></td>", 1)[1].split("</tr>", 1)[0]
        assert row.count("<td>") == 3  # type, default, description
        assert row.rsplit("<td>", 1)[1].strip() != "</td>", name  # described


def test_the_http_reference_has_every_operation(site: Path) -> None:
    schema = json.loads((site / "openapi.json").read_text(encoding="utf-8"))
    page = _page(site, "http")
    for path, operations in schema["paths"].items():
        for method in operations:
            assert f"<code>{method.upper()} {path}</code>" in page, (method, path)
    assert "ContextResponse" in page
