"""Attachments on both backends: their words are searched, embedded and erased with the row."""

from __future__ import annotations

import json
import sqlite3

import numpy as np

from ctxwarden.engine import Engine
from ctxwarden.store import migrations
from ctxwarden.store.base import Store
from ctxwarden.store.sqlite import SQLiteStore


def _ids(store: Store, term: str) -> set[str]:
    return {m.id for m, _ in store.search("default", [term], limit=10)}


def test_captions_and_names_are_searched_embedded_and_rendered(store: Store) -> None:
    engine = Engine(store)
    engine.ingest(
        [
            {"id": "a", "session": "s", "author": "mel", "content": "look what I made!",
             "created_at": 100.0,
             "attachments": [{"kind": "image", "caption": "a pottery bowl with blue glaze"}]},
            {"id": "b", "session": "s", "author": "car", "created_at": 101.0,
             "attachments": [{"kind": "file", "name": "itinerary.pdf"}]},
            {"id": "c", "session": "s", "author": "car", "content": "nice!", "created_at": 102.0},
        ]
    )  # fmt: skip
    assert _ids(store, "pottery") == {"a"}
    assert _ids(store, "itinerary") == {"b"}
    assert _ids(store, "made") == {"a"}  # the content is still searched
    pending = dict(store.pending_embeddings("m"))
    texts = {engine.get(i).rowid: i for i in "abc"}
    assert {texts[r]: t for r, t in pending.items()} == {
        "a": "look what I made! a pottery bowl with blue glaze",
        "b": "itinerary pdf",
        "c": "nice!",
    }
    # the background worker's claim embeds the same texts (an attachment-only row included)
    seen: list[str] = []

    def embed(batch: list[str]) -> np.ndarray:
        seen.extend(batch)
        return np.ones((len(batch), 384), dtype=np.float32)

    store.embed_pending_batch("m", embed, limit=10)
    assert sorted(seen) == sorted(pending.values())
    context = engine.assemble(session="s", query="what pottery did mel make", budget=2000)
    text = "\n".join(str(m["content"]) for m in context.messages)
    assert "look what I made! [image: a pottery bowl with blue glaze]" in text
    assert "[file itinerary.pdf]" in text


def test_an_edit_of_the_attachments_moves_the_index_and_a_delete_empties_it(
    store: Store,
) -> None:
    engine = Engine(store)
    record = {"id": "a", "session": "s", "content": "see this", "created_at": 100.0}
    engine.ingest([{**record, "attachments": [{"kind": "image", "caption": "a red kayak"}]}])
    # Same text, other attachment: an edit (not "known"), and the index follows it.
    result = engine.ingest([{**record, "attachments": [{"kind": "image", "caption": "a tent"}]}])
    assert result.outcomes[0].status == "edited"
    assert _ids(store, "kayak") == set()
    assert _ids(store, "tent") == {"a"}
    assert engine.get("a").attachments == ({"kind": "image", "caption": "a tent"},)
    again = engine.ingest([{**record, "attachments": [{"kind": "image", "caption": "a tent"}]}])
    assert again.outcomes[0].status == "known"
    engine.delete("a")
    assert _ids(store, "tent") == set()
    if isinstance(store, SQLiteStore):  # every FTS entry matches its row
        assert (
            store._query("INSERT INTO memories_fts (memories_fts) VALUES ('integrity-check')", ())
            == []
        )


def test_migration_18_indexes_the_attachments_of_older_rows(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "old.db"
    conn = sqlite3.connect(path, isolation_level=None)
    for migration in migrations.MIGRATIONS:
        if migration.version < 18:
            for statement in migration.statements:
                conn.execute(statement)
            conn.execute(f"PRAGMA user_version = {migration.version}")
    columns = (
        "id, tenant, session, author_kind, role, content, created_at, kind, content_hash, "
        "last_seen_at, attachments"
    )
    for rowid, attachments in ((1, [{"title": "Q3 plan", "caption": "revenue chart"}]), (2, None)):
        conn.execute(
            f"INSERT INTO memories (rowid, {columns}) VALUES (?, ?, 'default', 's', 'human', "
            "'user', 'the numbers', 1.0, 'message', ?, 1.0, ?)",
            (rowid, f"m{rowid}", f"h{rowid}", json.dumps(attachments) if attachments else None),
        )
        conn.execute(
            "INSERT INTO memories_fts (rowid, content) VALUES (?, 'the numbers')", (rowid,)
        )
        conn.execute("INSERT INTO token_counts VALUES (?, 'cl100k_base', 3, 9)", (rowid,))
    conn.close()
    store = SQLiteStore(str(path))
    try:
        assert _ids(store, "revenue") == {"m1"}  # a caption (the stored key was "caption")
        assert _ids(store, "numbers") == {"m1", "m2"}
        # The row with attachments is counted again; the other keeps its count.
        assert set(store.token_counts([1, 2], "cl100k_base")) == {2}
        assert (
            store._query("INSERT INTO memories_fts (memories_fts) VALUES ('integrity-check')", ())
            == []
        )
        # Attachments stored before they were validated render under their own keys.
        memory = store.memories_at([1])[0]
        from ctxwarden.render import line_text

        assert line_text(memory).endswith("the numbers [file Q3 plan: revenue chart]\n")
    finally:
        store.close()
