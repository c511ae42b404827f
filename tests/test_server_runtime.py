"""What a serving process does before it opens its port (ctxwarden.server.runtime)."""

from __future__ import annotations

import gc
from pathlib import Path

from ctxwarden import Engine
from ctxwarden.server.runtime import prepare, settle_heap, warm_up


def test_warm_up_assembles_without_writing(tmp_path: Path) -> None:
    with Engine.open(tmp_path / "w.db") as engine:
        engine.ingest([{"role": "user", "content": "the deploy moved to friday", "session": "s"}])
        before = engine.stats()
        warm_up(engine)
        assert engine.stats() == before  # nothing logged, no access stats bumped
        counts = engine.store._query("SELECT count(*) FROM contexts", ())
        assert counts[0][0] == 0


def test_settle_heap_freezes_what_survives_a_collection() -> None:
    survivor = [[object()] for _ in range(100)]
    try:
        settle_heap()
        assert gc.get_freeze_count() >= len(survivor)
    finally:
        gc.unfreeze()


def test_prepare_on_an_empty_store(tmp_path: Path) -> None:
    with Engine.open(tmp_path / "p.db") as engine:
        try:
            prepare(engine)
        finally:
            gc.unfreeze()
        assert engine.stats()["memories"] == 0
