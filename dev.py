#!/usr/bin/env python3
"""Set up and run ctxwarden's development tasks with nothing but python3.

    python3 dev.py demo    # create .venv from uv.lock if needed, then run `ctxwarden demo`
    python3 dev.py test    # the same set-up, then ruff, ruff format --check, mypy --strict, pytest
    python3 dev.py bench   # the benchmarks under bench/ (long)

The environment is exactly the lock file's (`uv sync --frozen`); uv itself is installed from PyPI
into the project's .venv at the version the lock pins.
"""

from __future__ import annotations

import os
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
BIN = VENV / ("Scripts" if os.name == "nt" else "bin")
UV_VERSION = "0.13.9"


def run(*args: str | Path, env: dict[str, str] | None = None) -> None:
    print("+", " ".join(str(a) for a in args), flush=True)
    code = subprocess.call([str(a) for a in args], cwd=ROOT, env=env)  # noqa: S603 - our own tools
    if code:
        sys.exit(code)


def setup() -> dict[str, str]:
    env = dict(os.environ, UV_PYTHON_DOWNLOADS="never", UV_PROJECT_ENVIRONMENT=str(VENV))
    if not (BIN / "python").exists():
        venv.EnvBuilder(with_pip=True).create(VENV)
    if not (BIN / "uv").exists():
        run(BIN / "python", "-m", "pip", "install", "--quiet", f"uv=={UV_VERSION}", env=env)
    run(BIN / "uv", "sync", "--frozen", "--quiet", "--python", BIN / "python", env=env)
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    env["VIRTUAL_ENV"] = str(VENV)
    return env


def main(argv: list[str]) -> None:
    task = argv[0] if argv else "test"
    rest = argv[1:]
    env = setup()
    if task == "demo":
        run(BIN / "ctxwarden", "demo", *rest, env=env)
    elif task == "test":
        run(BIN / "ruff", "check", ".", env=env)
        run(BIN / "ruff", "format", "--check", ".", env=env)
        run(BIN / "mypy", env=env)
        run(BIN / "python", "-m", "pytest", *rest, env=env)
    elif task == "bench":
        for script in sorted((ROOT / "bench").glob("*.py")):
            if not script.name.startswith("_"):
                run(BIN / "python", script, *rest, env=env)
    else:
        sys.exit(f"unknown task {task!r}: use demo, test or bench")


if __name__ == "__main__":
    main(sys.argv[1:])
