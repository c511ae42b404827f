"""`pip install ctxwarden` installs light: the wheel without extras gives the library and the CLI's
offline commands, and a server face names the extra it needs.

Builds the wheel with uv, installs it into a fresh virtualenv without extras (versions pinned to
uv.lock's through a constraints file; uv reads them from its cache, which `uv sync` filled, and
fetches from PyPI only what the cache lacks), then runs the installed package as a user would.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SERVER_MODULES = ("fastapi", "starlette", "uvicorn", "mcp", "prometheus_client", "fastapi_offline")


def _uv() -> str:
    beside = Path(sys.executable).parent / "uv"
    found = str(beside) if beside.exists() else shutil.which("uv")
    if found is None:
        pytest.fail("uv is not installed (the dev group pins it): run python3 dev.py test")
    return found


def _run(*args: str | Path, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, UV_PYTHON_DOWNLOADS="never")
    for name in ("VIRTUAL_ENV", "PYTHONPATH", "UV_PROJECT_ENVIRONMENT"):
        env.pop(name, None)  # the fresh venv must see only what it installed
    return subprocess.run(
        [str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True,
        timeout=300, check=False,
    )  # fmt: skip


def _ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


@pytest.mark.slow
def test_the_wheel_without_extras(tmp_path: Path) -> None:
    uv = _uv()
    dist = tmp_path / "dist"
    _ok(_run(uv, "build", "--wheel", "--out-dir", dist, ROOT))
    [wheel] = dist.glob("ctxwarden-*.whl")
    constraints = tmp_path / "constraints.txt"
    _ok(_run(uv, "export", "--frozen", "--all-extras", "--no-hashes", "--no-emit-project",
             "--quiet", "-o", constraints))  # fmt: skip
    venv = tmp_path / "venv"
    _ok(_run(uv, "venv", "--quiet", venv, "--python", sys.executable))
    python = venv / "bin" / "python"
    _ok(_run(uv, "pip", "install", "--quiet", "--python", python, wheel, "-c", constraints))

    probe = (
        "import importlib.util, ctxwarden\n"
        "print(ctxwarden.__file__)\n"
        f"print([m for m in {SERVER_MODULES!r} if importlib.util.find_spec(m)])\n"
    )
    where, server_modules = _ok(_run(python, "-c", probe, cwd=tmp_path)).splitlines()
    assert Path(where).is_relative_to(venv)  # the installed wheel, not the source tree
    assert server_modules == "[]"

    cli = venv / "bin" / "ctxwarden"
    db = tmp_path / "demo.db"
    demo = _ok(_run(cli, "--db", db, "demo", cwd=tmp_path))
    assert "user" in demo

    for command in ("serve", "proxy", "mcp"):
        failed = _run(cli, "--db", db, command, cwd=tmp_path)
        assert failed.returncode == 2, failed.stdout + failed.stderr
        assert len(failed.stderr.strip().splitlines()) == 1
        assert "pip install 'ctxwarden[server]'" in failed.stderr

    face = "import ctxwarden.server.http"
    refused = _run(python, "-c", face, cwd=tmp_path)
    assert refused.returncode == 1
    assert refused.stderr.strip().splitlines()[-1] == (
        "ctxwarden.errors.MissingExtraError: this needs the 'server' extra "
        "(fastapi, starlette, uvicorn, mcp, prometheus_client, fastapi_offline are missing): "
        "pip install 'ctxwarden[server]'"
    )
    # Each framework adapter names its extra, and the adapters' core needs none.
    adapters = {"langchain": "langchain", "langgraph": "langgraph", "llamaindex": "llamaindex"}
    adapters["openai_agents"] = "agents"
    for module, extra in adapters.items():
        refused = _run(python, "-c", f"import ctxwarden.adapters.{module}", cwd=tmp_path)
        assert refused.returncode == 1
        last = refused.stderr.strip().splitlines()[-1]
        assert last.startswith(f"ctxwarden.errors.MissingExtraError: this needs the '{extra}'")
    _ok(_run(python, "-c", "from ctxwarden.adapters import Conversation", cwd=tmp_path))
