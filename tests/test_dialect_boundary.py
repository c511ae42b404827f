"""SQL dialect code lives only in src/ctxwarden/store/: the rest of the library is backend-free."""

from __future__ import annotations

import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "ctxwarden"

DIALECT = re.compile(
    r"\b(CREATE\s+(TABLE|INDEX|TRIGGER|VIRTUAL|EXTENSION)|INSERT\s+(OR\s+\w+\s+)?INTO"
    r"|DELETE\s+FROM|UPDATE\s+\w+\s+SET|SELECT\s+.+\s+FROM|PRAGMA\s|ON\s+CONFLICT"
    r"|import\s+(sqlite3|psycopg\w*)|from\s+(sqlite3|psycopg\w*)\s+import)",
)


def test_no_dialect_code_outside_store() -> None:
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if "store" in path.relative_to(PACKAGE).parts[:1]:
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            if DIALECT.search(line):
                offenders.append(f"{path.relative_to(PACKAGE)}:{number}: {line.strip()}")
    assert offenders == []


def test_the_pattern_catches_dialect_code() -> None:
    for line in ("import sqlite3", "from psycopg import sql", "INSERT INTO memories (id)",
                 "x = 'CREATE TABLE t (a)'", "ON CONFLICT (id) DO NOTHING"):  # fmt: skip
        assert DIALECT.search(line), line
    assert not DIALECT.search("select the memories from the store")
