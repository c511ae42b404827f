"""A key without ``read`` reads nothing, and ``/metrics`` needs loopback or a key (issue 20,
item 5): the pin and unpin answers, the proxy's retrieved-memory block and the metrics of the
HTTP API and of the proxy, with real API keys (:class:`~ctxwarden.server.auth.KeyAuth`)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import anyio
import httpx
import pytest

from ctxwarden import Engine
from ctxwarden.llm import LLMClient
from ctxwarden.server.auth import KeyAuth, issue_key
from ctxwarden.server.http import ServerConfig, create_app
from ctxwarden.server.proxy import ProxyConfig, create_proxy_app
from ctxwarden.store.sqlite import SQLiteStore
from llmserver import ScriptedServer, completion
from serving import serve

CANARY = "the vault code is 7431-canary"
#: A client that is not this machine, for the in-process transport.
REMOTE = ("203.0.113.7", 40000)


@dataclass
class Keys:
    writer: str  # write only
    reader: str  # read and write
    admin: str


def _keys(engine: Engine) -> Keys:
    store = engine.store
    assert isinstance(store, SQLiteStore)
    return Keys(
        writer=issue_key(store, tenant="acme", scopes={"write"}),
        reader=issue_key(store, tenant="acme", scopes={"read", "write"}),
        admin=issue_key(store, tenant="acme", scopes={"admin"}),
    )


def _auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def test_a_write_only_key_pins_without_reading_the_memory() -> None:
    with Engine.open(":memory:") as engine:
        keys = _keys(engine)
        config = ServerConfig(authenticate=KeyAuth(engine.store))  # type: ignore[arg-type]
        with serve(create_app(engine, config)) as url, httpx.Client(base_url=url) as client:
            records = [{"id": "m1", "content": CANARY}]
            r = client.post(
                "/v1/ingest", json={"records": records, "session": "s"}, headers=_auth(keys.writer)
            )
            assert r.status_code == 200, r.text
            for action, pinned in (("pin", True), ("unpin", False)):
                r = client.post(f"/v1/memories/m1/{action}", headers=_auth(keys.writer))
                assert r.status_code == 200, r.text
                assert r.json() == {"id": "m1", "pinned": pinned}
                assert CANARY not in r.text
            assert client.get("/v1/memories/m1", headers=_auth(keys.writer)).status_code == 403
            for key in (keys.reader, keys.admin):
                r = client.post("/v1/memories/m1/pin", headers=_auth(key))
                assert r.json()["content"] == CANARY
            # over loopback /metrics needs no key
            assert client.get("/metrics").status_code == 200


def test_a_write_only_keys_ingest_does_not_tell_what_the_store_held() -> None:
    # A duplicate's outcome names the record that held the text first (``duplicate_of``), and
    # "known" says an id existed: to a key without read, every record is just "accepted".
    with Engine.open(":memory:") as engine:
        keys = _keys(engine)
        config = ServerConfig(authenticate=KeyAuth(engine.store))  # type: ignore[arg-type]
        with serve(create_app(engine, config)) as url, httpx.Client(base_url=url) as client:

            def ingest(key: str, id: str, text: str = CANARY) -> dict[str, object]:
                body = {"records": [{"id": id, "content": text}], "session": "s"}
                r = client.post("/v1/ingest", json=body, headers=_auth(key))
                assert r.status_code == 200, r.text
                return dict(r.json())

            assert ingest(keys.reader, "first")["outcomes"] == [{"id": "first", "status": "stored"}]
            accepted = {
                "outcomes": [{"id": "probe", "status": "accepted"}],
                "counts": {"accepted": 1},
            }
            assert ingest(keys.writer, "probe") == accepted  # a duplicate of "first"
            assert ingest(keys.writer, "probe") == accepted  # known
            fresh = ingest(keys.writer, "new", "a text nobody stored before")
            assert fresh["outcomes"] == [{"id": "new", "status": "accepted"}]
            # A reader (and admin) sees what happened.
            for key in (keys.reader, keys.admin):
                seen = ingest(key, f"again-{key[-4:]}")
                (outcome,) = seen["outcomes"]  # type: ignore[misc]
                assert outcome["status"] == "duplicate"
                assert outcome["duplicate_of"] == "first"


async def _remote_metrics(app: object, key: str | None) -> int:
    transport = httpx.ASGITransport(app=app, client=REMOTE)  # type: ignore[arg-type]
    async with httpx.AsyncClient(transport=transport, base_url="http://ctxwarden") as client:
        headers = _auth(key) if key else {}
        return (await client.get("/metrics", headers=headers)).status_code


@pytest.mark.parametrize("face", ["http", "proxy"])
def test_metrics_from_another_machine_need_a_key_with_read(face: str) -> None:
    with Engine.open(":memory:") as engine, LLMClient("http://127.0.0.1:9/v1") as llm:
        keys = _keys(engine)
        server = ServerConfig(authenticate=KeyAuth(engine.store))  # type: ignore[arg-type]
        app = (
            create_app(engine, server)
            if face == "http"
            else create_proxy_app(engine, llm, ProxyConfig(server=server, probe_window=False))
        )
        statuses = [
            anyio.run(_remote_metrics, app, key)
            for key in (None, "cw_0000_not-a-key", keys.writer, keys.reader, keys.admin)
        ]
        assert statuses == [401, 401, 403, 200, 200]


@pytest.fixture
def proxy() -> Iterator[tuple[str, ScriptedServer, Keys]]:
    with (
        ScriptedServer([completion("ok")] * 4) as upstream,
        Engine.open(":memory:") as engine,
        LLMClient(upstream.url, api_key="sk-upstream", max_retries=0) as llm,
    ):
        keys = _keys(engine)
        server = ServerConfig(authenticate=KeyAuth(engine.store))  # type: ignore[arg-type]
        config = ProxyConfig(server=server, probe_window=False, memory_refresh="topic")
        with serve(create_proxy_app(engine, llm, config)) as url:
            yield url, upstream, keys


def test_the_proxy_gives_a_write_only_key_no_memory_block(
    proxy: tuple[str, ScriptedServer, Keys],
) -> None:
    url, upstream, keys = proxy

    def ask(key: str, question: str) -> list[dict[str, object]]:
        body = {
            "model": "gpt-4o",
            "user": "ann",
            "messages": [{"role": "user", "content": question}],
        }
        r = httpx.post(f"{url}/v1/chat/completions", json=body, headers=_auth(key), timeout=60)
        assert r.status_code == 200, r.text
        sent: list[dict[str, object]] = upstream.chat_requests()[-1].body["messages"]
        return sent

    ask(keys.reader, f"remember this: {CANARY}")
    sent = ask(keys.writer, "what is the vault code?")
    assert all(CANARY not in str(m["content"]) for m in sent)  # stored, but not read back
    sent = ask(keys.reader, "what is the vault code, again?")
    assert any(CANARY in str(m["content"]) for m in sent), sent  # a reader gets the block
