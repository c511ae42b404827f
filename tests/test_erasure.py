"""Erasure: after deleting a memory, a session or a tenant (and the store's scrub), the text is
gone from the SQLite file and its WAL, byte for byte, and from every query."""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Any, Literal

import pytest
from fastapi.testclient import TestClient

from ctxwarden.compact import CompactionPolicy
from ctxwarden.engine import Engine
from ctxwarden.errors import NotFound
from ctxwarden.server.auth import KeyAuth, issue_key
from ctxwarden.server.http import ServerConfig, create_app
from ctxwarden.store.base import NewMemory, Store
from ctxwarden.store.sqlite import SQLiteStore
from ctxwarden.summary import Summary, SummaryItem


def _canary() -> str:
    # 'zzq' keeps it one FTS term; the FTS index stores terms prefix-compressed, so the files
    # are searched for the random middle, which no neighbouring term can share.
    return "zzq" + secrets.token_hex(12)


def _needle(canary: str) -> bytes:
    return canary[4:-2].encode()


def _file_bytes(path: Path) -> bytes:
    data = path.read_bytes()
    wal = path.with_name(path.name + "-wal")
    if wal.exists():
        data += wal.read_bytes()
    return data


def _filler(tenant: str, session: str, n: int = 60) -> list[dict[str, Any]]:
    return [
        {
            "id": f"{tenant}-{session}-f{i}",
            "session": session,
            "author": "ana",
            "content": f"note {i} of {session} about the deploy window and release {i * 7}",
            "created_at": 1_700_000_000 + i,
        }
        for i in range(n)
    ]


def _summary(store: SQLiteStore, tenant: str, id: str, sources: list[str], text: str) -> None:
    with store.write() as writer:
        writer.insert(
            NewMemory(
                id=id, tenant=tenant, session="s1", channel=None, author=None,
                author_kind="agent", role="assistant", content=text, created_at=1_700_000_500.0,
                thread_id=None, reply_to=None, kind="summary", pinned=False, name=None,
                tool_calls=(), tool_call_id=None, attachments=(), metadata={},
                content_hash=f"summary-{id}", source_ids=sources,
                time_range=(1_700_000_000.0, 1_700_000_100.0),
            )
        )  # fmt: skip


@pytest.mark.parametrize("scope", ["memory", "session", "tenant"])
def test_deleted_canary_leaves_no_bytes_in_the_files(tmp_path: Path, scope: str) -> None:
    path = tmp_path / "erase.db"
    canary = _canary()
    engine = Engine.open(path)
    try:
        engine.ingest(_filler("acme", "s1") + _filler("acme", "s2"), tenant="acme")
        engine.ingest(_filler("other", "s1"), tenant="other")
        engine.ingest(
            [
                {
                    "id": "secret",
                    "session": "s1",
                    "author": "ana",
                    "content": f"my door code is {canary} remember it",
                    "created_at": 1_700_000_100,
                },
                # a verbatim repeat folds into it as an alias
                {
                    "id": "secret-again",
                    "session": "s1",
                    "author": "ana",
                    "content": f"my door code is {canary} remember it",
                    "created_at": 1_700_000_101,
                },
            ],
            tenant="acme",
        )
        store = engine.store
        assert isinstance(store, SQLiteStore)
        # a summary built from it (citing the folded alias), and a summary of that summary
        _summary(store, "acme", "sum1", ["acme-s1-f1", "secret-again"], f"ana's code: {canary}")
        _summary(store, "acme", "sum2", ["sum1"], f"summary of summaries mentions {canary}")
        engine.assemble(session="s1", query=f"door code {canary}", tenant="acme")
        assert [m.id for m, _ in engine.search(canary, tenant="acme")]
        store.scrub()
        assert _needle(canary) in _file_bytes(path), "the test must be able to see the canary"

        if scope == "memory":
            engine.delete("secret-again", tenant="acme")  # by an alias id: the memory goes
        elif scope == "session":
            assert engine.delete_session("s1", tenant="acme") >= 63
        else:
            engine.delete_tenant(tenant="acme")

        assert engine.search(canary, tenant="acme") == []
        for id_ in ("secret", "secret-again", "sum1", "sum2"):
            with pytest.raises(NotFound):
                engine.get(id_, tenant="acme")
        tombstones = [
            (t.id, t.reason) for t in store.tombstones("acme") if t.id in ("secret", "sum1", "sum2")
        ]
        assert [t[0] for t in tombstones] == ["secret", "sum1", "sum2"]
        if scope == "memory":
            assert tombstones[0][1] == "deleted"
            assert "summary of erased memories" in tombstones[1][1]
        # the other tenant is untouched
        assert engine.get("other-s1-f3", tenant="other").content.startswith("note 3 of s1")
        if scope == "memory":
            assert engine.get("acme-s1-f1", tenant="acme")  # sources other than it survive
        if scope == "session":
            assert engine.get("acme-s2-f1", tenant="acme")
        assert store.integrity_check() == "ok"
    finally:
        engine.close()
    assert _needle(canary) not in _file_bytes(path)
    assert canary.encode() not in _file_bytes(path)


def test_fts_merge_is_what_removes_the_terms(tmp_path: Path) -> None:
    """Without scrub's FTS merge, SQLite 3.40 keeps a deleted row's terms in the index pages:
    the scrub step is load-bearing, not decoration."""
    path = tmp_path / "fts.db"
    canary = _canary()
    with Engine.open(path) as engine:
        engine.ingest([*_filler("t", "s"), {"id": "x", "session": "s", "content": canary}])
        store = engine.store
        assert isinstance(store, SQLiteStore)
        with store.write() as writer:
            writer.delete("default", "x", deleted_at=1.0, reason="test")
        store._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        leftover = _needle(canary) in _file_bytes(path)
        store.scrub()
        assert _needle(canary) not in _file_bytes(path)
    if not leftover:
        pytest.skip("this SQLite removes FTS terms on delete already (secure-delete FTS5)")


def test_http_erasure_endpoints_need_the_delete_scope(tmp_path: Path) -> None:
    with Engine.open(tmp_path / "http.db") as engine:
        store = engine.store
        assert isinstance(store, SQLiteStore)
        writer_key = issue_key(store, tenant="acme", scopes={"read", "write"})
        deleter_key = issue_key(store, tenant="acme", scopes={"read", "write", "delete"})
        other_key = issue_key(store, tenant="other", scopes={"read", "write", "delete"})
        client = TestClient(create_app(engine, ServerConfig(authenticate=KeyAuth(store))))

        def call(method: str, url: str, key: str, **kw: Any) -> Any:
            return client.request(method, url, headers={"Authorization": f"Bearer {key}"}, **kw)

        body = {"records": _filler("acme", "s1", 3) + _filler("acme", "s2", 3)}
        assert call("POST", "/v1/ingest", writer_key, json=body).status_code == 200
        assert call("POST", "/v1/ingest", other_key, json=body).status_code == 200
        assert call("DELETE", "/v1/sessions/s1", writer_key).status_code == 403
        response = call("DELETE", "/v1/sessions/s1", deleter_key)
        assert response.status_code == 200, response.text
        assert response.json()["deleted"] == 3
        assert response.json()["receipt"]["ids"] == ["acme-s1-f0", "acme-s1-f1", "acme-s1-f2"]
        response = call("DELETE", "/v1/memories/acme-s2-f0", deleter_key)
        assert response.json() == {
            "deleted": "acme-s2-f0",
            "receipt": {"ids": ["acme-s2-f0"], "summaries_rewritten": [],
                        "summaries_removed": [], "aggregates_touched": [], "vectors": 0},
        }  # fmt: skip
        assert call("GET", "/v1/memories/acme-s1-f0", deleter_key).status_code == 404
        assert call("GET", "/v1/memories/acme-s2-f0", deleter_key).status_code == 404
        assert call("GET", "/v1/memories/acme-s2-f1", deleter_key).status_code == 200
        assert call("DELETE", "/v1/tenant", writer_key).status_code == 403
        response = call("DELETE", "/v1/tenant", deleter_key)
        assert (response.json()["tenant"], response.json()["deleted"]) == ("acme", 2)
        assert sorted(response.json()["receipt"]["ids"]) == ["acme-s2-f1", "acme-s2-f2"]
        # the deleted tenant's keys are revoked with it; its memories are gone
        assert call("GET", "/v1/memories/acme-s2-f1", deleter_key).status_code == 401
        assert list(store.iter_memories("acme")) == []
        # the other tenant's copies (same ids) are untouched
        assert call("GET", "/v1/memories/acme-s1-f0", other_key).status_code == 200
        assert call("GET", "/v1/stats", other_key).json()["memories"] == 6


def _store_bytes(path: Path) -> dict[str, bytes]:
    """The database, its -wal and -shm, and every vector index file, by name."""
    files = [path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")]
    vectors = path.with_name(path.name + ".vectors")
    if vectors.is_dir():
        files += sorted(vectors.iterdir())
    return {f.name: f.read_bytes() for f in files if f.is_file()}


def _canary_files(path: Path, canary: str) -> dict[str, int]:
    return {
        name: data.count(_needle(canary))
        for name, data in _store_bytes(path).items()
        if _needle(canary) in data
    }


class QuotingSummarizer:
    """A summariser (the Summarizer seam) that quotes the canary's item and the first other one
    on lines citing them, as an LLM summariser's cited lines do (not the item ``leave_out``
    names); the small talk around them holds no fact, so compaction's fact check lets the
    summary drop it."""

    def __init__(self, leave_out: str | None = None) -> None:
        self.leave_out = leave_out

    def summarize(self, items: list[SummaryItem], *, max_tokens: int, tokenizer: Any) -> Summary:
        return Summary(
            key_entities=tuple(sorted({i.author for i in items if i.author})),
            main_events=tuple(
                f"[{i.id}] {i.author}: {i.content}"
                for i in items
                if i.id != self.leave_out and i.id in ("secret", "acme-s1-d0")
            ),
            source_ids=tuple(i.id for i in items),
        )


def _compacted(
    path: Path,
    canary: str,
    summarizer: QuotingSummarizer | None = None,
    secret: str | None = None,
    keep_originals: Literal["delete", "archive"] = "delete",
) -> tuple[Engine, str]:
    """An engine whose tenant's old history, the canary's memory among it, is compacted into
    one summary that quotes it."""
    clock = [1_700_000_000.0 + 60 * 86_400]
    engine = Engine.open(path, clock=lambda: clock[0])
    lines = [
        "bo: sounds good to me, let us talk about it later",
        "cy: sure, i will take a look when i get a chance",
        "dee: thanks for the update, that makes sense",
        "bo: ok, no strong opinion from my side",
        "cy: i think we can leave it as it is for now",
        "dee: agreed, nothing else from me today",
        "bo: great, talk soon then",
    ]
    records = [
        {"id": f"acme-s1-d{i}", "session": "s1", "author": line.split(":")[0],
         "content": line.split(": ", 1)[1], "created_at": 1_700_000_000 + i}
        for i, line in enumerate(lines)
    ]  # fmt: skip
    records.insert(
        4,
        {
            "id": "secret",
            "session": "s1",
            "author": "ana",
            "content": secret
            or f"decided: the vault login code is {canary}, rotated every 30 days",
            "created_at": 1_700_000_003.5,
        },
    )
    engine.ingest(records, tenant="acme")
    # a small cluster: its summary (header, entities, the quoted line) may take most of it
    policy = CompactionPolicy(max_summary_share=0.9, keep_originals=keep_originals)
    engine.compact(tenant="acme", summarizer=summarizer or QuotingSummarizer(), policy=policy)
    summary = engine.get("secret", tenant="acme")
    assert summary.kind == "summary", "the canary's memory must have been compacted"
    return engine, summary.id


def test_a_compacted_memory_is_erased_from_its_summary(tmp_path: Path) -> None:
    path = tmp_path / "compacted.db"
    canary = _canary()
    engine, summary_id = _compacted(path, canary)
    try:
        before = engine.get(summary_id, tenant="acme")
        assert canary in before.content, "the summary must quote the canary for the test to bite"
        others = [s for s in before.source_ids if s != "secret"]
        receipt = engine.delete("secret", tenant="acme")
        assert receipt.ids == ("secret",)
        assert receipt.summaries_rewritten == (summary_id,)
        assert receipt.summaries_removed == ()
        with pytest.raises(NotFound):
            engine.get("secret", tenant="acme")
        after = engine.get(summary_id, tenant="acme")
        assert canary not in after.content
        assert "secret" not in after.source_ids
        assert list(after.source_ids) == others
        assert after.content.startswith(f"Summary of {len(others)} messages")
        # the other compacted ids still resolve to the rewritten summary
        assert engine.get(others[0], tenant="acme").id == summary_id
        assert engine.search(canary, tenant="acme") == []
        assert engine.store.integrity_check() == "ok"
        with pytest.raises(NotFound):
            engine.delete("secret", tenant="acme")  # erased: nothing left to erase
    finally:
        engine.close()
    assert _canary_files(path, canary) == {}


@pytest.mark.parametrize("by", ["repeat", "source"])
def test_an_alias_moved_onto_a_summary_is_erased_with_its_source_only(
    store: Store, by: str
) -> None:
    """A verbatim repeat folded into a memory that compaction then moved onto a summary:
    erasing the repeat's id (or the source's) takes that source's lines out of the summary and
    both ids out of the store, and leaves the summary and its other sources (both backends)."""
    canary = _canary()
    clock = [1_700_000_000.0 + 60 * 86_400]
    engine = Engine(store, clock=lambda: clock[0])
    small_talk = [
        "sounds good to me, let us talk about it later",
        "sure, i will take a look when i get a chance",
        "thanks for the update, that makes sense",
        "ok, no strong opinion from my side",
        "i think we can leave it as it is for now",
    ]
    records = [
        {"id": f"acme-s1-d{i}", "session": "s1", "author": "bo", "content": line,
         "created_at": 1_700_000_000 + i}
        for i, line in enumerate(small_talk)
    ]  # fmt: skip
    secret = f"decided: the vault login code is {canary}, rotated every 30 days"
    for id_, at in (("secret", 1_700_000_002.5), ("secret-again", 1_700_000_003.5)):
        records.append(
            {"id": id_, "session": "s1", "author": "ana", "content": secret, "created_at": at}
        )
    ingested = engine.ingest(records, tenant="acme")
    assert ingested.outcomes[-1].status == "duplicate"  # the repeat is an alias of "secret"
    policy = CompactionPolicy(max_summary_share=0.9)
    engine.compact(tenant="acme", summarizer=QuotingSummarizer(), policy=policy)
    summary = engine.get("secret-again", tenant="acme")
    assert summary.kind == "summary", "compaction must have moved the alias onto the summary"
    assert canary in summary.content
    others = [s for s in summary.source_ids if s != "secret"]
    assert len(others) == len(small_talk)

    receipt = engine.delete("secret-again" if by == "repeat" else "secret", tenant="acme")
    assert set(receipt.ids) == {"secret", "secret-again"}
    assert receipt.summaries_rewritten == (summary.id,)
    assert receipt.summaries_removed == ()
    after = engine.get(summary.id, tenant="acme")
    assert canary not in after.content
    assert list(after.source_ids) == others
    assert "acme-s1-d0" in after.content  # the other quoted source's line stays
    for gone in ("secret", "secret-again"):
        with pytest.raises(NotFound):
            engine.get(gone, tenant="acme")
        with pytest.raises(NotFound):
            engine.delete(gone, tenant="acme")
    assert engine.get(others[-1], tenant="acme").id == summary.id
    assert engine.search(canary, tenant="acme") == []
    tombstones = {t.id: t for t in store.tombstones("acme")}
    assert tombstones["secret"].summary_id is None
    assert tombstones["secret-again"].summary_id is None


def test_compaction_apply_leaves_no_original_text_in_the_files(tmp_path: Path) -> None:
    """A summary that keeps none of the canary's text: once apply returns (the engine still
    open), the original's text is in no page of the database, its WAL or the FTS index."""
    path = tmp_path / "compaction.db"
    canary = _canary()
    # a line without a fact (no digit, no name): the summariser may drop it
    canary = "zzq" + "".join(secrets.choice("abcdefghijklmnop") for _ in range(24))
    engine, summary_id = _compacted(
        path,
        canary,
        QuotingSummarizer(leave_out="secret"),
        secret=f"the vault note just says {canary} and nothing else",
    )
    try:
        assert canary not in engine.get(summary_id, tenant="acme").content
        assert _canary_files(path, canary) == {}
        assert engine.search(canary, tenant="acme") == []
    finally:
        engine.close()
    assert _canary_files(path, canary) == {}


def test_erasure_receipts_name_what_went(tmp_path: Path) -> None:
    with Engine.open(tmp_path / "receipt.db") as engine:
        canary = _canary()
        text = f"my door code is {canary} remember it"
        engine.ingest(
            [
                *_filler("acme", "s1", 5),
                {"id": "secret", "session": "s1", "content": text, "created_at": 1_700_000_100},
                {"id": "again", "session": "s1", "content": text, "created_at": 1_700_000_101},
            ],
            tenant="acme",
        )
        store = engine.store
        assert isinstance(store, SQLiteStore)
        _summary(store, "acme", "sum1", ["acme-s1-f1", "secret"], f"ana's code: {canary}")
        receipt = engine.delete("again", tenant="acme")
        assert set(receipt.ids) == {"secret", "again", "sum1"}
        assert receipt.aggregates_touched == ("secret",)
        assert receipt.summaries_removed == ("sum1",)  # no cited line of another source left
        assert receipt.summaries_rewritten == ()
        receipt = engine.erase_session("s1", tenant="acme")
        assert len(receipt.rowids) == 5
        assert set(receipt.ids) == {f"acme-s1-f{i}" for i in range(5)}
        assert receipt.to_json()["ids"] == list(receipt.ids)


def test_a_scrub_blocked_by_a_reader_is_retried_until_done(tmp_path: Path) -> None:
    """After the erasure commits, a reader holding an old snapshot keeps the WAL from being
    truncated: the scrub fails, is retried, and finishes once the reader is done."""
    import sqlite3

    from ctxwarden.errors import StoreError
    from ctxwarden.store.base import scrub_until_done

    path = tmp_path / "busy.db"
    canary = _canary()
    with Engine.open(path) as engine:
        engine.ingest([*_filler("t", "s"), {"id": "x", "session": "s", "content": canary}])
        store = engine.store
        assert isinstance(store, SQLiteStore)
        store.scrub()
        store._conn.execute("PRAGMA busy_timeout = 50")  # the reader below would hold it 30 s
        reader = sqlite3.connect(path)
        reader.execute("BEGIN")
        reader.execute("SELECT count(*) FROM memories").fetchall()  # an old snapshot, held
        with store.write() as writer:
            assert writer.delete("default", "x", deleted_at=1.0, reason="test")
        with pytest.raises(StoreError, match="reader"):
            store.scrub()
        waits: list[float] = []

        def reader_finishes(seconds: float) -> None:
            waits.append(seconds)
            reader.rollback()

        assert scrub_until_done(store, sleep=reader_finishes) == 2
        assert len(waits) == 1
        reader.close()
        assert _needle(canary) not in _file_bytes(path)


def _link(canary: str) -> str:
    return f"runbook access key {canary} for the deploy bot"


def test_erasing_a_session_takes_its_records_out_of_other_sessions_aggregates(
    tmp_path: Path,
) -> None:
    """A record of session 2 folded into session 1's aggregate (a shared channel; the keys
    differ only in a hash-like token, masked as volatile, so it is an exact duplicate whose
    latest variant is session 2's text): erasing session 2 takes it out."""
    path = tmp_path / "folded.db"
    mine, theirs = secrets.token_hex(12), secrets.token_hex(12)
    with Engine.open(path) as engine:
        result = engine.ingest(
            [
                *_filler("acme", "s1", 5),
                {"id": "own", "session": "s1", "channel": "general", "author": "ci",
                 "author_kind": "bot", "content": _link(mine), "created_at": 1_700_000_100},
                {"id": "folded", "session": "s2", "channel": "general", "author": "ci",
                 "author_kind": "bot", "content": _link(theirs), "created_at": 1_700_000_200},
            ],
            tenant="acme",
        )  # fmt: skip
        assert result.outcomes[-1].duplicate_of == "own", "the test needs a cross-session fold"
        assert engine.get("own", tenant="acme").latest_content == _link(theirs)
        engine.assemble(session="s1", query="runbook deploy", tenant="acme")
        receipt = engine.erase_session("s2", tenant="acme")
        assert receipt.rowids == ()
        assert receipt.ids == ("folded",)
        assert receipt.aggregates_touched == ("own",)
        own = engine.get("own", tenant="acme")
        assert (own.content, own.latest_content, own.dup_count) == (
            _link(mine), None, 1,
        )  # fmt: skip
        with pytest.raises(NotFound):
            engine.get("folded", tenant="acme")
        context = engine.assemble(session="s1", query="runbook deploy", tenant="acme")
        rendered = "\n".join(str(m.get("content", "")) for m in context.messages)
        assert mine in rendered
        assert theirs not in rendered
    assert _canary_files(path, theirs) == {}
    assert _needle(mine) in _file_bytes(path)


def _archived(path: Path) -> dict[str, tuple[bytes, list[str]]]:
    """The archive's compressed records and the ids they hold, by summary id, read from the
    file with a connection of its own."""
    import sqlite3

    from ctxwarden.store.archive import decode_rows

    with sqlite3.connect(path) as conn:
        return {
            str(s): (bytes(r), [str(row[1]) for row in decode_rows(r, c)])
            for s, c, r in conn.execute("SELECT summary_id, codec, record FROM archived_memories")
        }


@pytest.mark.parametrize("how", ["id", "summary", "session", "tenant"])
def test_an_erased_memory_leaves_the_archive_too(tmp_path: Path, how: str) -> None:
    """With keep_originals="archive" the canary's original is kept compressed: zlib output does
    not hold the canary's bytes, so the files are searched for the archived record itself."""
    path = tmp_path / f"archived-{how}.db"
    canary = _canary()
    engine, summary_id = _compacted(path, canary, keep_originals="archive")
    try:
        records = _archived(path)
        assert "secret" in records[summary_id][1], "the canary's original must be archived"
        blob = records[summary_id][0]
        assert any(blob in data for data in _store_bytes(path).values())
        assert canary in engine.expand("secret", tenant="acme")[0].content
        if how == "id":
            engine.delete("secret", tenant="acme")
            left = _archived(path)
            assert "secret" not in left[summary_id][1]
            assert left[summary_id][1], "the summary's other originals stay archived"
            assert all(m.id != "secret" for m in engine.expand(summary_id, tenant="acme"))
        elif how == "summary":
            engine.delete(summary_id, tenant="acme")
            assert _archived(path) == {}
        elif how == "session":
            engine.erase_session("s1", tenant="acme")
            assert _archived(path) == {}
        else:
            engine.erase_tenant(tenant="acme")
            assert _archived(path) == {}
        with pytest.raises(NotFound, match="secret"):
            engine.expand("secret", tenant="acme")
        assert not any(blob in data for data in _store_bytes(path).values())
    finally:
        engine.close()
    assert not any(blob in data for data in _store_bytes(path).values())
    assert _canary_files(path, canary) == {}
