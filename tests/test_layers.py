"""The layering contracts (pyproject.toml, [tool.importlinter]) hold on the source and catch a
deliberate violation: a copy of the package with one forbidden import fails them."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _lint_imports(source: Path) -> subprocess.CompletedProcess[str]:
    lint = Path(sys.executable).parent / "lint-imports"
    env = dict(os.environ, PYTHONPATH=str(source))  # this copy of ctxwarden, not the installed one
    return subprocess.run(
        [str(lint), "--no-cache", "--no-logo", str(ROOT / "pyproject.toml")],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip


def test_the_source_keeps_every_contract() -> None:
    result = _lint_imports(ROOT / "src")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


def test_a_store_import_in_the_pure_core_breaks_the_contracts(tmp_path: Path) -> None:
    shutil.copytree(ROOT / "src" / "ctxwarden", tmp_path / "ctxwarden")
    budget = tmp_path / "ctxwarden" / "budget.py"
    budget.write_text(budget.read_text(encoding="utf-8") + "\nimport ctxwarden.store\n")
    result = _lint_imports(tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "ctxwarden.budget is not allowed to import ctxwarden.store" in result.stdout
    assert "2 broken" in result.stdout  # the layers and the pure core


def test_a_server_import_below_the_faces_breaks_the_light_install(tmp_path: Path) -> None:
    shutil.copytree(ROOT / "src" / "ctxwarden", tmp_path / "ctxwarden")
    fold = tmp_path / "ctxwarden" / "fold.py"
    fold.write_text(fold.read_text(encoding="utf-8") + "\nimport fastapi\n")
    result = _lint_imports(tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "ctxwarden.fold is not allowed to import fastapi" in result.stdout
