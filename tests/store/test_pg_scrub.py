"""PostgreSQL after an erasure: the deleted text stays in the table's data files (a dead row,
until its page is overwritten); ``vacuum(full=True)`` (``ctxwarden scrub --full``) rewrites the
tables, and the text is then in none of the files of the memories table, its TOAST table or its
indexes. (The WAL still holds it until its segments are recycled: docs/postgres.md.)"""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest

from ctxwarden import Engine

pytestmark = pytest.mark.postgres

CANARY = "zqxcanaryvowelless"


def _canary_bytes(dsn: str) -> int:
    """Occurrences of the canary in the files of ``memories``, its TOAST table and indexes,
    after a checkpoint wrote every dirty page."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CHECKPOINT")
        (data,) = conn.execute("SHOW data_directory").fetchone()  # type: ignore[misc]
        rows = conn.execute(
            "SELECT pg_relation_filepath(c.oid) FROM pg_class c "
            "WHERE c.oid = 'memories'::regclass "
            "OR c.oid = (SELECT reltoastrelid FROM pg_class WHERE oid = 'memories'::regclass) "
            "OR c.oid IN (SELECT indexrelid FROM pg_index WHERE indrelid = 'memories'::regclass)"
        ).fetchall()
    found = 0
    for (relative,) in rows:
        if relative is None:
            continue
        base = Path(data) / relative
        for part in [base, *sorted(base.parent.glob(base.name + ".*"))]:
            if part.exists():
                found += part.read_bytes().count(CANARY.encode())
    return found


def test_vacuum_full_removes_deleted_text_from_the_data_files(pg_schema_dsn: str) -> None:
    with Engine.open(pg_schema_dsn) as engine:
        engine.ingest(
            [{"id": "secret", "content": f"the code word is {CANARY} keep it"}]
            + [{"id": f"m{i}", "content": f"ordinary message number {i}"} for i in range(50)],
            session="s",
        )
        engine.delete("secret")
        assert _canary_bytes(pg_schema_dsn) > 0  # deleted, yet still in the files
        engine.store.vacuum(full=True)
        assert _canary_bytes(pg_schema_dsn) == 0
        assert len(engine.search("ordinary message", limit=100)) == 50  # the rest is whole
