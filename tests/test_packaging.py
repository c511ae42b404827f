"""Installable as documented. `uv build` makes the sdist and, from it, the wheel; the wheel is
installed into fresh virtualenvs with no dev dependencies and run as a user would:

- without extras (installs light): the library and the CLI's offline commands work, and a server
  face or a framework adapter names the extra it needs;
- with every extra, on Python 3.11, 3.12 and 3.13: `ctxwarden demo` runs and every adapter
  imports against its framework.

Offline: versions are pinned to uv.lock's through a constraints file and uv installs with
`--offline` from its cache, which `python3 dev.py test` filled (`uv sync` for this interpreter;
a throwaway install per other interpreter, named in CTXWARDEN_PYTHONS). An interpreter that is
not here skips, or fails when CTXWARDEN_REQUIRE_PYTHONS=1 (CI).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SERVER_MODULES = ("fastapi", "starlette", "uvicorn", "mcp", "prometheus_client", "fastapi_offline")
# adapter module -> (its extra, the framework's distribution)
ADAPTERS = {
    "langchain": ("langchain", "langchain-core"),
    "langgraph": ("langgraph", "langgraph"),
    "llamaindex": ("llamaindex", "llama-index-core"),
    "openai_agents": ("agents", "openai-agents"),
}
# files a user's install needs that are not Python modules
PACKAGE_DATA = (
    "ctxwarden/data/demo.jsonl",
    "ctxwarden/data/ui/index.html",
    "ctxwarden/data/ui/app.js",
    "ctxwarden/data/ui/app.css",
)


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


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The sdist and the wheel built from it (`uv build`'s default), built once."""
    out = tmp_path_factory.mktemp("dist")
    _ok(_run(_uv(), "build", "--out-dir", out, ROOT))
    [sdist] = out.glob("ctxwarden-*.tar.gz")
    [wheel] = out.glob("ctxwarden-*.whl")
    return sdist, wheel


@pytest.fixture(scope="module")
def constraints(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """uv.lock's versions as a constraints file."""
    path = tmp_path_factory.mktemp("constraints") / "constraints.txt"
    _ok(_run(_uv(), "export", "--frozen", "--all-extras", "--no-hashes", "--no-emit-project",
             "--quiet", "-o", path))  # fmt: skip
    return path


def _fresh_venv(where: Path, python: str | Path, *requirements: str | Path, c: Path) -> Path:
    uv = _uv()
    _ok(_run(uv, "venv", "--quiet", where, "--python", python))
    installed = where / "bin" / "python"
    result = _run(uv, "pip", "install", "--quiet", "--offline", "--python", installed,
                  *requirements, "-c", c)  # fmt: skip
    assert result.returncode == 0, (
        "installing offline from uv's cache failed (python3 dev.py test fills it): "
        + result.stdout
        + result.stderr
    )
    return installed


def _python(version: str) -> str:
    """The interpreter for `version`: this one, or one of CTXWARDEN_PYTHONS."""
    if version == f"{sys.version_info[0]}.{sys.version_info[1]}":
        return sys.executable
    probe = "import sys; print('%d.%d' % sys.version_info[:2])"
    for candidate in filter(None, os.environ.get("CTXWARDEN_PYTHONS", "").split(os.pathsep)):
        ran = _run(candidate, "-c", probe)
        if ran.returncode == 0 and ran.stdout.strip() == version:
            return candidate
    reason = f"no Python {version} in CTXWARDEN_PYTHONS (python3 dev.py test finds one)"
    if os.environ.get("CTXWARDEN_REQUIRE_PYTHONS") == "1":
        pytest.fail(f"CTXWARDEN_REQUIRE_PYTHONS=1 but {reason}")
    pytest.skip(reason)


@pytest.mark.slow
def test_the_sdist_and_the_wheel_carry_the_package(dist: tuple[Path, Path]) -> None:
    sdist, wheel = dist
    with tarfile.open(sdist) as archive:
        in_sdist = set(archive.getnames())
    prefix = sdist.name.removesuffix(".tar.gz")
    for name in ("pyproject.toml", "README.md", "uv.lock", *(f"src/{f}" for f in PACKAGE_DATA)):
        assert f"{prefix}/{name}" in in_sdist, name
    with zipfile.ZipFile(wheel) as archive:
        in_wheel = set(archive.namelist())
    for name in PACKAGE_DATA:
        assert name in in_wheel, name
    sources = {p.relative_to(ROOT / "src").as_posix() for p in (ROOT / "src").rglob("*.py")}
    assert sources <= in_wheel, sorted(sources - in_wheel)
    assert not any(name.startswith(("tests/", "ctxwarden/tests")) for name in in_wheel)


@pytest.mark.slow
def test_the_wheel_without_extras(
    tmp_path: Path, dist: tuple[Path, Path], constraints: Path
) -> None:
    _sdist, wheel = dist
    venv = tmp_path / "venv"
    python = _fresh_venv(venv, sys.executable, wheel, c=constraints)

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
    for module, (extra, _framework) in ADAPTERS.items():
        refused = _run(python, "-c", f"import ctxwarden.adapters.{module}", cwd=tmp_path)
        assert refused.returncode == 1
        last = refused.stderr.strip().splitlines()[-1]
        assert last.startswith(f"ctxwarden.errors.MissingExtraError: this needs the '{extra}'")
    _ok(_run(python, "-c", "from ctxwarden.adapters import Conversation", cwd=tmp_path))


@pytest.mark.slow
@pytest.mark.parametrize("version", ["3.11", "3.12", "3.13"])
def test_the_wheel_with_every_extra(
    version: str, tmp_path: Path, dist: tuple[Path, Path], constraints: Path
) -> None:
    python = _python(version)
    _sdist, wheel = dist
    extras = ",".join(["server", *sorted({extra for extra, _ in ADAPTERS.values()})])
    venv = tmp_path / "venv"
    installed = _fresh_venv(venv, python, f"ctxwarden[{extras}] @ {wheel.as_uri()}", c=constraints)

    probe = (
        "import sys, importlib, importlib.metadata as m, importlib.util, ctxwarden\n"
        "print('%d.%d' % sys.version_info[:2])\n"
        "print(ctxwarden.__file__)\n"
        f"for module, (_extra, framework) in {ADAPTERS!r}.items():\n"
        "    adapter = importlib.import_module('ctxwarden.adapters.' + module)\n"
        "    names = [n for n in adapter.__all__ if hasattr(adapter, n)]\n"
        "    print(module, framework, m.version(framework), len(names), len(adapter.__all__))\n"
        "import ctxwarden.server.http\n"
        "print('dev', [d for d in ('pytest', 'mypy', 'ruff') if importlib.util.find_spec(d)])\n"
    )
    lines = _ok(_run(installed, "-c", probe, cwd=tmp_path)).splitlines()
    assert lines[0] == version
    assert Path(lines[1]).is_relative_to(venv)
    for line, module in zip(lines[2:6], ADAPTERS, strict=True):
        name, framework, framework_version, present, exported = line.split()
        assert (name, framework) == (module, ADAPTERS[module][1])
        assert framework_version[0].isdigit()
        assert present == exported != "0"  # every public name of the adapter is there
    assert lines[6] == "dev []"  # no dev dependencies came along

    demo = _ok(_run(venv / "bin" / "ctxwarden", "--db", tmp_path / "demo.db", "demo", cwd=tmp_path))
    assert "user" in demo
