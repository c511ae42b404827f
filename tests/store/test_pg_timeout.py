"""PostgreSQL waits at most ``store_timeout`` (issue 20, item 6): a lock held by another
connection past it becomes :class:`StoreUnavailable` (``locked``), over HTTP a 503 with
``Retry-After``, and the store is left as it was, as on SQLite."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import httpx
import psycopg
import pytest

from ctxwarden import Engine, EngineConfig
from ctxwarden.errors import StoreUnavailable
from ctxwarden.server.http import create_app
from ctxwarden.store.base import NewMemory, TokenCount
from ctxwarden.store.postgres import PostgresStore
from serving import serve

pytestmark = pytest.mark.postgres


def _memory(id: str) -> NewMemory:
    return NewMemory(
        id=id, tenant="t", session="s", channel="c", author="ana", author_kind="human",
        role="user", content=f"text of {id}", created_at=100.0, thread_id=None, reply_to=None,
        kind="message", pinned=False, name=None, tool_calls=(), tool_call_id=None,
        attachments=(), metadata={}, content_hash=f"h-{id}", near_key=None,
    )  # fmt: skip


@pytest.fixture
def locker(pg_schema_dsn: str) -> Iterator[psycopg.Connection[tuple[object, ...]]]:
    """Another connection, for holding locks in an open transaction."""
    with psycopg.connect(pg_schema_dsn) as conn:
        yield conn
        conn.rollback()


def test_a_held_lock_past_the_timeout_is_store_unavailable(
    pg_schema_dsn: str, locker: psycopg.Connection[tuple[object, ...]]
) -> None:
    store = PostgresStore(pg_schema_dsn, timeout=0.3)
    try:
        with store.write() as w:
            w.insert(_memory("m1"))
        locker.execute("LOCK TABLE memories IN EXCLUSIVE MODE")  # writes wait, reads do not
        with pytest.raises(StoreUnavailable) as caught, store.write() as w:
            w.insert(_memory("m2"))
        assert caught.value.cause == "locked"
        assert "store_timeout" in str(caught.value)
        assert [m.id for m, _ in store.search("t", ["text"])] == ["m1"]  # reads go on
        locker.execute("LOCK TABLE memories IN ACCESS EXCLUSIVE MODE")  # now reads wait too
        with pytest.raises(StoreUnavailable) as read:
            store.search("t", ["text"])
        assert read.value.cause in ("locked", "timeout")  # the statement's bound is the same
        locker.rollback()
        # The store is as it was, and works again once the lock is gone.
        assert [m.id for m, _ in store.search("t", ["text"])] == ["m1"]
        with store.write() as w:
            w.insert(_memory("m3"))
        assert sorted(m.id for m, _ in store.search("t", ["text"])) == ["m1", "m3"]
    finally:
        store.close()


def test_over_http_a_held_lock_is_503_with_retry_after(
    pg_schema_dsn: str, locker: psycopg.Connection[tuple[object, ...]]
) -> None:
    config = EngineConfig(store_timeout=0.3)
    with Engine.open(pg_schema_dsn, config=config) as engine:
        assert isinstance(engine.store, PostgresStore)
        assert engine.store.timeout == 0.3
        engine.ingest([{"id": "m1", "content": "the first record"}], session="s")
        with serve(create_app(engine)) as url, httpx.Client(base_url=url, timeout=30) as client:
            locker.execute("LOCK TABLE memories IN EXCLUSIVE MODE")
            body = {"records": [{"id": "m2", "content": "a second record"}], "session": "s"}
            r = client.post("/v1/ingest", json=body)
            assert r.status_code == 503, r.text
            assert r.headers["retry-after"]
            assert r.json()["error"]["type"] == "StoreUnavailable"
            locker.rollback()
            assert client.post("/v1/ingest", json=body).status_code == 200
            assert client.get("/v1/memories/m2").status_code == 200


def test_a_cache_write_gives_up_after_its_own_short_wait(
    pg_schema_dsn: str, locker: psycopg.Connection[tuple[object, ...]]
) -> None:
    """``wait=`` bounds a write below the store's timeout (assembly's token counts and catch-up
    vectors), as on SQLite: a held lock is StoreUnavailable within it, and nothing is stored."""
    store = PostgresStore(pg_schema_dsn, timeout=30.0)
    try:
        with store.write() as w:
            rowid = w.insert(_memory("m1"))
        count = TokenCount(rowid=rowid, tokenizer="probe", message=1, line=1)
        locker.execute("LOCK TABLE token_counts IN EXCLUSIVE MODE")
        release = threading.Timer(15.0, locker.rollback)  # a 30 s wait would get in after this
        release.start()
        try:
            with pytest.raises(StoreUnavailable) as caught:
                store.put_token_counts([count], wait=0.2)
            assert caught.value.cause == "locked"
            assert release.is_alive()
        finally:
            release.cancel()
            locker.rollback()
        assert store.token_counts([rowid], "probe") == {}
        store.put_token_counts([count], wait=0.2)
        assert store.token_counts([rowid], "probe") == {rowid: count}
    finally:
        store.close()
