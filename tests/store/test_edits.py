"""Edits (issue 19, item 2): a known id with other text, and ``Engine.update``, on both backends."""

from __future__ import annotations

import numpy as np
import pytest

from ctxwarden.engine import Engine, EngineConfig
from ctxwarden.errors import InputError, NotFound
from ctxwarden.store.base import Store
from ctxwarden.tokens import get_tokenizer

OLD = "the event store goes on PostgreSQL 16"
NEW = "decision changed: the event store goes on SQLite after all, it is simpler to run"


def _engine(store: Store, **config: object) -> Engine:
    return Engine(store, config=EngineConfig(tokenizers=("cl100k_base",), **config))  # type: ignore[arg-type]


def _record(content: str, id: str = "m138") -> dict[str, object]:
    return {"id": id, "session": "s", "channel": "#dev", "author": "rosa", "content": content}


def test_reingesting_a_known_id_with_other_text_is_an_edit(store: Store) -> None:
    engine = _engine(store)
    engine.ingest([_record(OLD), _record("lunch at noon", id="m2")])
    before = store.token_counts([engine.get("m138").rowid], "cl100k_base")
    result = engine.ingest([_record(NEW)])
    assert [o.status for o in result.outcomes] == ["edited"]
    assert result.counts["edited"] == 1
    memory = engine.get("m138")
    assert memory.content == NEW
    assert engine.stats()["memories"] == 2  # replaced, not added
    # Indexed again: the new words are found, the old ones no longer are.
    assert [m.id for m, _ in engine.search("SQLite simpler", session="s")] == ["m138"]
    assert engine.search("PostgreSQL", session="s") == []
    # Counted again at ingest for the configured tokenizer.
    after = store.token_counts([memory.rowid], "cl100k_base")
    assert after[memory.rowid].message > before[memory.rowid].message
    # The old text is kept as version 1, in force from the creation until the edit.
    (version,) = engine.versions("m138")
    assert (version.version, version.content) == (1, OLD)
    assert version.valid_from == memory.created_at <= version.valid_until
    # The same text again is known; so is it in a later batch.
    assert engine.ingest([_record(NEW)]).outcomes[0].status == "known"
    assert len(engine.versions("m138")) == 1
    context = engine.assemble(session="s", query="where does the event store go?", model="gpt-4o")
    text = "\n".join(str(m["content"]) for m in context.messages)
    assert "SQLite" in text
    assert "PostgreSQL" not in text


def test_update_replaces_text_and_numbers_versions(store: Store) -> None:
    engine = _engine(store)
    engine.ingest([_record(OLD)])
    assert engine.update("m138", NEW).status == "edited"
    assert engine.update("m138", "the event store goes on DuckDB").status == "edited"
    assert engine.update("m138", "the event store goes on DuckDB").status == "known"
    versions = engine.versions("m138")
    assert [(v.version, v.content) for v in versions] == [(1, OLD), (2, NEW)]
    assert versions[0].valid_until == versions[1].valid_from
    assert engine.get("m138").content == "the event store goes on DuckDB"


def test_update_errors_leave_the_store_as_it_was(store: Store) -> None:
    engine = _engine(store)
    engine.ingest([_record(OLD), _record(OLD, id="m139")])  # m139 folds into m138
    assert engine.get("m139").id == "m138"
    with pytest.raises(NotFound):
        engine.update("nope", NEW)
    with pytest.raises(NotFound):
        engine.update("m138", NEW, session="other")  # outside the session named
    with pytest.raises(InputError) as folded:
        engine.update("m139", NEW)
    assert folded.value.field == "id"
    with pytest.raises(InputError) as bad:
        engine.update("m138", 42)  # type: ignore[arg-type]
    assert bad.value.field == "content"
    assert engine.get("m138").content == OLD
    assert engine.versions("m138") == []


def test_edit_history_erase_keeps_no_old_text(store: Store) -> None:
    engine = _engine(store, edit_history="erase")
    engine.ingest([_record(OLD)])
    outcome = engine.ingest([_record(NEW)]).outcomes[0]
    assert outcome.status == "edited"
    assert outcome.reason is not None
    assert "erased" in outcome.reason
    assert engine.versions("m138") == []
    assert engine.search("PostgreSQL", session="s") == []


def test_an_edit_drops_the_vector_so_it_is_embedded_again(store: Store) -> None:
    engine = _engine(store)
    engine.ingest([_record(OLD)])
    rowid = engine.get("m138").rowid
    store.put_vectors("fake", [rowid], np.ones((1, 384), dtype=np.float32))
    assert store.pending_embeddings("fake") == []
    engine.update("m138", NEW)
    assert store.pending_embeddings("fake") == [(rowid, NEW)]


def test_deleting_an_edited_memory_removes_its_versions(store: Store) -> None:
    engine = _engine(store)
    engine.ingest([_record(OLD), _record("other", id="m2")])
    engine.update("m138", NEW)
    engine.update("m2", "other, edited")
    engine.delete("m138")
    with store.write() as writer:
        left = writer._rows("SELECT content FROM memory_versions", ())  # type: ignore[attr-defined]
    assert [r[0] for r in left] == ["other"]


def test_edit_and_insert_of_one_id_in_one_batch(store: Store) -> None:
    engine = _engine(store)
    result = engine.ingest([_record(OLD), _record(NEW)])
    assert [o.status for o in result.outcomes] == ["stored", "edited"]
    assert [m.id for m, _ in engine.search("SQLite", session="s")] == ["m138"]
    assert engine.search("PostgreSQL", session="s") == []
    assert get_tokenizer("cl100k_base").count(NEW) > 0
