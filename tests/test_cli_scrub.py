"""``ctxwarden scrub``: the scrub every erasure runs, then a VACUUM (``--full`` rewrites
PostgreSQL's tables: tests/store/test_pg_scrub.py); on SQLite the file holds no erased text
after it."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from ctxwarden import Engine
from ctxwarden.cli import app

CANARY = "zqxcanaryvowelless"


def test_scrub_leaves_no_erased_text_in_the_files(tmp_path: Path) -> None:
    db = str(tmp_path / "store.db")
    with Engine.open(db) as engine:
        engine.ingest(
            [{"id": "secret", "content": f"the code word is {CANARY}"}]
            + [{"id": f"m{i}", "content": f"ordinary message number {i}"} for i in range(20)],
            session="s",
        )
        engine.delete("secret")
    before = Path(db).stat().st_size
    done = CliRunner().invoke(app, ["--db", db, "scrub", "--full"])
    assert done.exit_code == 0, done.output
    assert "scrubbed" in done.output
    for path in tmp_path.iterdir():
        if path.is_file():
            assert CANARY.encode() not in path.read_bytes(), path.name
    assert Path(db).stat().st_size <= before  # VACUUM rewrote it, no larger
    with Engine.open(db) as engine:
        assert len(engine.search("ordinary message", limit=50)) == 20
