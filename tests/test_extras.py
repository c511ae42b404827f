"""Optional extras: a face whose extra is missing says which extra to install.

The missing packages are hidden in a subprocess (``sys.modules[name] = None`` makes both
``import name`` and ``importlib.util.find_spec(name)`` see no such module), so the real CLI and
the real ``ctxwarden.server`` package run as they would without the ``server`` extra.
tests/test_packaging.py checks the same on a wheel installed without extras.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from ctxwarden.errors import CtxwardenError, MissingExtraError
from ctxwarden.extras import EXTRAS, extra_for, require

_HIDE = "import sys\nfor name in {names!r}:\n    sys.modules[name] = None\n"


def _python(code: str, hidden: tuple[str, ...]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", _HIDE.format(names=hidden) + code],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_extra_for_names_the_extra_of_a_module() -> None:
    assert extra_for("fastapi") == "server"
    assert extra_for("uvicorn.config") == "server"
    assert extra_for("psycopg_pool") == "postgres"
    assert extra_for("numpy") is None
    assert extra_for(None) is None


def test_require_passes_when_installed_and_names_the_extra_when_not() -> None:
    require("server")  # the dev set-up installs every extra
    error = MissingExtraError("server", ["fastapi", "uvicorn"])
    assert isinstance(error, ImportError)
    assert isinstance(error, CtxwardenError)
    assert str(error) == (
        "this needs the 'server' extra (fastapi, uvicorn are missing): "
        "pip install 'ctxwarden[server]'"
    )
    assert error.name == "fastapi"


@pytest.mark.parametrize("module", ["ctxwarden.server.http", "ctxwarden.server.mcp"])
def test_importing_a_server_face_without_the_extra_names_it(module: str) -> None:
    code = (
        f"import ctxwarden\ntry:\n    import {module}\nexcept ImportError as exc:\n"
        "    print(type(exc).__name__, exc)\n"
    )
    result = _python(code, ("fastapi",))
    assert result.stdout.strip() == (
        "MissingExtraError this needs the 'server' extra (fastapi is missing): "
        "pip install 'ctxwarden[server]'"
    )


@pytest.mark.parametrize("command", ["serve", "proxy", "mcp"])
def test_the_cli_says_which_extra_to_install_in_one_line_exit_2(
    command: str, tmp_path: Path
) -> None:
    code = (
        "import sys\nfrom ctxwarden.cli import main\n"
        f"sys.argv = ['ctxwarden', '--db', {str(tmp_path / 'x.db')!r}, {command!r}"
        + (", '--upstream', 'http://127.0.0.1:9'" if command == "proxy" else "")
        + "]\nmain()\n"
    )
    result = _python(code, EXTRAS["server"])
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("error: this needs the 'server' extra (")
    assert lines[0].endswith("pip install 'ctxwarden[server]'")


def test_the_library_and_an_offline_command_work_without_the_server_extra(
    tmp_path: Path,
) -> None:
    code = (
        "import sys\nfrom ctxwarden import Engine\n"
        "with Engine.open(':memory:') as engine:\n"
        "    engine.ingest([{'id': 'a', 'session': 's', 'role': 'user', 'content': 'hello'}])\n"
        "    print(engine.assemble(session='s', budget=500).included)\n"
        "from ctxwarden.cli import main\n"
        f"sys.argv = ['ctxwarden', '--db', {str(tmp_path / 'y.db')!r}, 'stats', '--json']\n"
        "main()\n"
        "print(sorted(m for m in sys.modules if m.startswith('ctxwarden.server')))\n"
    )
    result = _python(code, EXTRAS["server"])
    assert result.returncode == 0, result.stderr
    lines = result.stdout.strip().splitlines()
    assert lines[0] == "('a',)"
    assert lines[-1] == "[]"
