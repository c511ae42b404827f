"""The HTTP API over a real uvicorn server on loopback, driven with httpx."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from ctxwarden import Engine
from ctxwarden.errors import (
    AuthError,
    BudgetError,
    ConflictError,
    CtxwardenError,
    InputError,
    NotFound,
    StoreError,
    UpstreamError,
)
from ctxwarden.server.http import SCOPES, ServerConfig, create_app, status_for
from serving import serve

JSON = {"content-type": "application/json"}
RECORDS = [
    {"id": "m1", "role": "user", "author": "ana", "content": "the deploy moved to 10:30 friday"},
    {"id": "m2", "role": "assistant", "content": "noted: deploy at 10:30 on friday"},
    {"id": "m3", "role": "user", "author": "ana", "content": "omar owns the release checklist"},
]


@pytest.fixture
def url() -> Iterator[str]:
    with Engine.open(":memory:") as engine, serve(create_app(engine)) as base:
        yield base


def test_ingest_assemble_search_round_trip(url: str) -> None:
    with httpx.Client(base_url=url) as client:
        r = client.post("/v1/ingest", json={"records": RECORDS, "session": "s"})
        assert r.status_code == 200, r.text
        assert [o["status"] for o in r.json()["outcomes"]] == ["stored"] * 3
        r = client.post("/v1/assemble", json={"session": "s", "query": "who owns the checklist?"})
        assert r.status_code == 200
        context = r.json()
        assert set(context["included"]) >= {"m1", "m2", "m3"}
        assert context["messages"][-1] == {"role": "user", "content": "who owns the checklist?"}
        r = client.post("/v1/search", json={"query": "release checklist"})
        assert r.json()["hits"][0]["memory"]["id"] == "m3"
        assert client.get("/v1/stats").json()["memories"] == 3
        assert client.get("/health").json() == {"status": "ok"}


def test_patch_edits_a_memory_and_keeps_the_old_text(url: str) -> None:
    with httpx.Client(base_url=url) as client:
        client.post("/v1/ingest", json={"records": RECORDS, "session": "s"})
        r = client.patch("/v1/memories/m1", json={"content": "the deploy moved to 11:00 monday"})
        assert r.status_code == 200, r.text
        assert r.json()["status"] == "edited"
        assert client.get("/v1/memories/m1").json()["content"] == "the deploy moved to 11:00 monday"
        versions = client.get("/v1/memories/m1/versions").json()
        assert [v["content"] for v in versions["versions"]] == [RECORDS[0]["content"]]
        hits = client.post("/v1/search", json={"query": "monday"}).json()["hits"]
        assert [h["memory"]["id"] for h in hits] == ["m1"]
        assert (
            client.post("/v1/search", json={"query": "friday"}).json()["hits"][0]["memory"]["id"]
            == "m2"
        )  # m1's old text is no longer indexed
        # Re-ingesting the id with new text is an edit too; the same text is known.
        edit = {**RECORDS[2], "content": "lee owns the release checklist"}
        r = client.post("/v1/ingest", json={"records": [edit], "session": "s"})
        assert r.json()["outcomes"][0]["status"] == "edited"
        assert r.json()["counts"]["edited"] == 1
        same = client.patch("/v1/memories/m3", json={"content": edit["content"]})
        assert same.json()["status"] == "known"
        # Errors: unknown id, outside the session named, a body without content or with more.
        assert client.patch("/v1/memories/nope", json={"content": "x"}).status_code == 404
        outside = client.patch("/v1/memories/m1?session=other", json={"content": "x"})
        assert outside.status_code == 404
        bad = client.patch("/v1/memories/m1", json={"text": "x"})
        assert bad.status_code == 422
        assert client.get("/v1/memories/nope/versions").status_code == 404
        assert client.get("/v1/memories/m1").json()["content"] == "the deploy moved to 11:00 monday"


def test_memory_pin_unpin_delete(url: str) -> None:
    with httpx.Client(base_url=url) as client:
        client.post("/v1/ingest", json={"records": RECORDS, "session": "s"})
        assert client.get("/v1/memories/m3").json()["pinned"] is False
        assert client.post("/v1/memories/m3/pin").json()["pinned"] is True
        assert client.get("/v1/memories/m3").json()["pinned"] is True
        assert client.post("/v1/memories/m3/unpin").json()["pinned"] is False
        assert client.delete("/v1/memories/m3").status_code == 200
        r = client.get("/v1/memories/m3")
        assert r.status_code == 404
        assert r.json()["error"]["type"] == "NotFound"
        assert client.post("/v1/search", json={"query": "checklist"}).json()["hits"] == []
        assert client.delete("/v1/memories/m3").status_code == 404


def test_errors_name_the_field(url: str) -> None:
    with httpx.Client(base_url=url) as client:
        r = client.post("/v1/ingest", json={"records": [{"role": "user"}], "session": "s"})
        assert r.status_code == 422
        assert "content" in r.json()["error"]["message"]
        r = client.post("/v1/assemble", json={"query": "no session"})
        assert r.status_code == 422
        assert r.json()["error"]["field"] == "session"
        r = client.post("/v1/assemble", json={"session": "s", "tokenizer": "no-such-tokenizer"})
        assert r.status_code == 422
        assert r.json()["error"]["field"] == "tokenizer"
        r = client.post("/v1/ingest", json={"records": [{**RECORDS[0], "tenant": "other"}]})
        assert r.status_code == 422
        assert r.json()["error"]["field"] == "tenant"


def test_openapi_schema_lists_the_endpoints(url: str) -> None:
    schema = httpx.get(url + "/openapi.json").json()
    assert {"/v1/ingest", "/v1/assemble", "/v1/search", "/v1/memories/{memory_id}"} <= set(
        schema["paths"]
    )


def test_error_table_maps_the_tree() -> None:
    assert status_for(NotFound("x")) == 404
    assert status_for(AuthError("x")) == 401
    assert status_for(InputError("x")) == 422
    assert status_for(BudgetError("x")) == 422
    assert status_for(ConflictError("x")) == 409
    assert status_for(StoreError("x")) == 503
    assert status_for(UpstreamError("x")) == 502
    assert status_for(CtxwardenError("x")) == 500


def test_body_over_the_limit_is_413() -> None:
    config = ServerConfig(max_body_bytes=2000)
    with Engine.open(":memory:") as engine, serve(create_app(engine, config)) as url:
        big = {"records": [{"role": "user", "content": "x" * 5000}], "session": "s"}
        r = httpx.post(url + "/v1/ingest", json=big)
        assert r.status_code == 413

        def chunks() -> Iterator[bytes]:  # no Content-Length: counted as it arrives
            yield b'{"session": "s", "records": [{"role": "user", "content": "'
            for _ in range(10):
                yield b"y" * 500
            yield b'"}]}'

        r = httpx.post(url + "/v1/ingest", content=chunks())
        assert r.status_code == 413
        assert engine.stats()["memories"] == 0


def test_overload_gets_429_with_retry_after() -> None:
    config = ServerConfig(max_concurrency=1, retry_after_seconds=3)
    release = threading.Event()
    sent = threading.Event()

    def slow_body() -> Iterator[bytes]:
        yield b'{"session": "s", "records": [{"role": "user", "content": "hello"}]'
        sent.set()
        release.wait(10)
        yield b"}"

    with Engine.open(":memory:") as engine, serve(create_app(engine, config)) as url:
        results: list[int] = []
        holder = threading.Thread(
            target=lambda: results.append(
                httpx.post(
                    url + "/v1/ingest", content=slow_body(), headers=JSON, timeout=20
                ).status_code
            )
        )
        holder.start()
        assert sent.wait(10)
        try:
            for _ in range(50):  # the holder's request reaches the gate once its headers land
                r = httpx.get(url + "/v1/stats")
                if r.status_code == 429:
                    break
            assert r.status_code == 429
            assert r.headers["retry-after"] == "3"
            assert httpx.get(url + "/health").status_code == 200
        finally:
            release.set()
            holder.join(20)
        assert results == [200]
        assert httpx.get(url + "/v1/stats").status_code == 200


def test_cli_serve_requires_a_key_from_cli_keys_create(tmp_path: Path) -> None:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    command = [sys.executable, "-m", "ctxwarden.cli", "--db", str(tmp_path / "x.db")]
    key = subprocess.run(
        [*command, "keys", "create", "--tenant", "acme", "--scope", "read", "--scope", "write"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert key.startswith("cw_")
    listed = subprocess.run([*command, "keys", "list"], capture_output=True, text=True, check=True)
    assert "acme" in listed.stdout
    assert key.split("_", 2)[2] not in listed.stdout
    proc = subprocess.Popen(
        [*command, "serve", "--host", "127.0.0.1", "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(300):
            try:
                r = httpx.get(base + "/health", timeout=1)
                break
            except httpx.TransportError:
                if proc.poll() is not None:
                    raise AssertionError(proc.stderr.read().decode()) from None
                threading.Event().wait(0.05)
        assert r.status_code == 200
        r = httpx.post(base + "/v1/ingest", json={"records": RECORDS[:1]})
        assert r.status_code == 401
        assert r.headers["www-authenticate"] == "Bearer"
        auth = {"Authorization": f"Bearer {key}"}
        r = httpx.post(base + "/v1/ingest", json={"records": RECORDS[:1]}, headers=auth)
        assert r.json()["counts"]["stored"] == 1
        assert httpx.get(base + "/v1/stats", headers=auth).json()["memories"] == 1
        assert httpx.delete(base + "/v1/memories/m1", headers=auth).status_code == 403
    finally:
        proc.terminate()
        proc.communicate(timeout=10)


def test_cli_no_auth_only_on_loopback(tmp_path: Path) -> None:
    command = [sys.executable, "-m", "ctxwarden.cli", "--db", str(tmp_path / "x.db")]
    done = subprocess.run(
        [*command, "serve", "--host", "0.0.0.0", "--no-auth"], capture_output=True, text=True
    )
    assert done.returncode == 1
    assert "loopback" in done.stderr


def test_metrics_expose_latency_budget_use_and_dedupe(url: str) -> None:
    with httpx.Client(base_url=url) as client:
        client.post("/v1/ingest", json={"records": [*RECORDS, {**RECORDS[0], "id": "m4"}]})
        client.post("/v1/assemble", json={"session": "default", "query": "deploy?"})
        client.get("/v1/memories/nope")
        text = client.get("/metrics").text
    assert 'ctxwarden_ingest_records_total{status="stored"} 3.0' in text
    assert 'ctxwarden_ingest_records_total{status="duplicate"} 1.0' in text
    assert "ctxwarden_assemble_seconds_count 1.0" in text
    assert 'ctxwarden_block_tokens_used_total{block="recent"}' in text
    assert 'route="/v1/memories/{memory_id}",status="404"' in text
    assert "nope" not in text


def test_compact_plan_apply_and_metrics() -> None:
    from ctxwarden.server.http import Principal

    now = 1_800_000_000.0
    old = now - 30 * 86400.0
    keys = {
        "reader": Principal(tenant="default", scopes=frozenset({"read"})),
        "owner": Principal(tenant="default", scopes=frozenset({"read", "write", "delete"})),
    }

    def authenticate(token: str | None) -> Principal:
        if token not in keys:
            raise AuthError("unknown key")
        return keys[token]

    config = ServerConfig(authenticate=authenticate)
    records = [
        {"id": f"o{i}", "role": "user", "author": "ana", "created_at": old + i,
         "content": f"decision {i}: move the kafka upgrade to week {i}"}
        for i in range(5)
    ] + [{"id": "fresh", "role": "user", "content": "today", "created_at": now - 60}]  # fmt: skip
    with (
        Engine.open(":memory:", clock=lambda: now) as engine,
        serve(create_app(engine, config)) as url,
        httpx.Client(base_url=url, headers={"Authorization": "Bearer owner"}) as client,
    ):
        assert client.post("/v1/ingest", json={"records": records, "session": "s"}).is_success
        r = client.post("/v1/compact/plan", json={}, headers={"Authorization": "Bearer reader"})
        assert r.status_code == 200, r.text
        plan = r.json()
        assert plan["memories"] == 5
        assert sorted(plan["clusters"][0]["ids"]) == [f"o{i}" for i in range(5)]
        assert engine.stats()["memories"] == 6  # planning wrote nothing
        r = client.post("/v1/compact/apply", json={}, headers={"Authorization": "Bearer reader"})
        assert r.status_code == 403
        r = client.post("/v1/compact/apply", json={"older_than": -1})
        assert r.status_code == 422
        r = client.post("/v1/compact/apply", json={})
        assert r.status_code == 200, r.text
        done = r.json()
        assert done["compacted"] == 5
        assert done["summaries"] == [plan["clusters"][0]["summary_id"]]
        assert client.get("/v1/memories/o3").json()["id"] == done["summaries"][0]
        assert client.post("/v1/compact/apply", json={}).json()["compacted"] == 0
        text = client.get("/metrics").text
        assert "ctxwarden_compacted_memories_total 5.0" in text
        assert "ctxwarden_compaction_summaries_total 1.0" in text


def test_assemble_lists_candidates_only_when_the_full_report_is_asked_for(url: str) -> None:
    with httpx.Client(base_url=url) as client:
        client.post("/v1/ingest", json={"records": RECORDS, "session": "s"})
        body = {"session": "other", "query": "who owns the release checklist?", "scope": "tenant"}
        short = client.post("/v1/assemble", json=body)
        full = client.post("/v1/assemble", params={"report": "full"}, json=body)
        bad = client.post("/v1/assemble", params={"report": "everything"}, json=body)
    assert short.status_code == full.status_code == 200
    summary, detailed = short.json()["report"], full.json()["report"]
    assert "candidates" not in summary
    assert summary["candidate_count"] == len(detailed["candidates"]) > 0
    assert summary["blocks"] == detailed["blocks"]
    # How retrieval was sized is in both reports (it is a few numbers, not a list).
    assert summary["retrieval"] == detailed["retrieval"]
    assert summary["retrieval"]["candidates"] > 0
    assert summary["retrieval"]["rrf_k"] > 0
    assert {c["id"] for c in detailed["candidates"]} >= {"m3"}
    assert bad.status_code == 422
    assert bad.json()["error"]["field"] == "query.report"


def test_a_keyed_fact_supersedes_the_older_one_over_http(url: str) -> None:
    facts = [
        {"id": "f1", "kind": "fact", "key": "deploy window", "content": "deploy window: Tuesday",
         "created_at": 1_700_000_000},
        {"id": "f2", "kind": "fact", "key": "deploy window", "content": "deploy window: Wednesday",
         "created_at": 1_700_090_000},
    ]  # fmt: skip
    with httpx.Client(base_url=url) as client:
        r = client.post("/v1/ingest", json={"records": facts, "session": "s"})
        assert r.status_code == 200, r.text
        body = {"session": "s", "query": "when is the deploy window?"}
        context = client.post("/v1/assemble", params={"report": "full"}, json=body).json()
        bad = client.post("/v1/ingest", json={"records": [{"content": "x", "key": "k"}]})
    text = "\n".join(m["content"] for m in context["messages"])
    assert "Wednesday" in text
    assert "Tuesday" not in text
    left_out = {c["id"]: c["reason"] for c in context["report"]["candidates"] if not c["included"]}
    assert left_out["f1"].startswith("superseded by f2")
    assert bad.status_code == 422
    assert bad.json()["error"]["field"] == "key"


def test_a_missing_or_malformed_key_is_refused_before_the_body_is_validated() -> None:
    from ctxwarden.server.http import Principal

    checked: list[str | None] = []

    def authenticate(token: str | None) -> Principal:
        checked.append(token)
        if token != "good":
            raise AuthError("unknown key")
        return Principal(tenant="default", scopes=frozenset({"read"}))

    bad_body = {"query": "no session"}
    with (
        Engine.open(":memory:") as engine,
        serve(create_app(engine, ServerConfig(authenticate=authenticate))) as url,
        httpx.Client(base_url=url) as client,
    ):
        for headers in ({}, {"Authorization": "Basic good"}, {"Authorization": "Bearer"}):
            r = client.post("/v1/assemble", json=bad_body, headers=headers)
            assert r.status_code == 401, (headers, r.text)
            assert r.headers["www-authenticate"] == "Bearer"
        assert checked == []  # refused from the header alone
        good = {"Authorization": "Bearer good"}
        assert client.post("/v1/assemble", json=bad_body, headers=good).status_code == 422
        unknown = {"Authorization": "Bearer nope"}
        body = {"session": "s", "query": "hello"}
        assert client.post("/v1/assemble", json=body, headers=unknown).status_code == 401
        assert client.post("/v1/ingest", json={"records": RECORDS}, headers=good).status_code == 403
        assert client.post("/v1/assemble", json=body, headers=good).status_code == 200
        assert checked == ["nope", "good", "good"]


@pytest.mark.parametrize("keys", [True, False], ids=["authenticate", "no-auth"])
def test_the_key_check_and_the_engine_work_share_one_worker_thread(
    keys: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    import anyio.to_thread

    from ctxwarden.server import access
    from ctxwarden.server.http import Principal

    hops: list[int] = []
    real_run_sync = anyio.to_thread.run_sync
    real_in_worker = access._in_worker

    async def counted_run_sync(*args: Any, **kwargs: Any) -> Any:
        hops.append(threading.get_ident())
        return await real_run_sync(*args, **kwargs)

    async def counted_in_worker(*args: Any, **kwargs: Any) -> Any:
        hops.append(threading.get_ident())
        return await real_in_worker(*args, **kwargs)

    # either way to a worker thread counts: anyio's, or the app's own threads
    monkeypatch.setattr(anyio.to_thread, "run_sync", counted_run_sync)
    monkeypatch.setattr(access, "_in_worker", counted_in_worker)
    threads: dict[str, int] = {}

    def authenticate(token: str | None) -> Principal:
        threads["auth"] = threading.get_ident()
        return Principal(tenant="default", scopes=frozenset(SCOPES))

    def on_loop(app: Any) -> Any:
        async def middleware(scope: Any, receive: Any, send: Any) -> None:
            threads["loop"] = threading.get_ident()
            await app(scope, receive, send)

        return middleware

    config = ServerConfig(authenticate=authenticate if keys else None)
    with Engine.open(":memory:") as engine:
        real_assemble = engine.assemble

        def assemble(**kwargs: Any) -> Any:
            threads["engine"] = threading.get_ident()
            return real_assemble(**kwargs)

        engine.assemble = assemble  # type: ignore[method-assign]
        app = create_app(engine, config)
        with serve(on_loop(app)) as url, httpx.Client(base_url=url) as client:
            headers = {"Authorization": "Bearer k"} if keys else {}
            client.post("/v1/ingest", json={"records": RECORDS, "session": "s"}, headers=headers)
            hops.clear()
            r = client.post("/v1/assemble", json={"session": "s", "query": "x"}, headers=headers)
            assert r.status_code == 200, r.text
            assert hops == [threads["loop"]]  # one hand-off from the event loop
            assert threads["engine"] != threads["loop"]
            if keys:
                assert threads["auth"] == threads["engine"]
            hops.clear()
            assert client.get("/health").status_code == 200
            assert hops == []


def test_credentials_keep_the_key_out_of_their_repr() -> None:
    from ctxwarden.server.http import Credentials, Principal

    local = Principal(tenant="default", scopes=frozenset({"read"}))
    with ThreadPoolExecutor(1) as workers:
        credentials = Credentials(
            token="cw_id_s3cret", authenticate=lambda _token: local, workers=workers
        )
    assert "s3cret" not in repr(credentials)


def test_metrics_expose_the_deferred_inclusion_log() -> None:
    from ctxwarden.engine import EngineConfig

    config = EngineConfig(inclusion_log="deferred")
    with (
        Engine.open(":memory:", config=config) as engine,
        serve(create_app(engine)) as url,
        httpx.Client(base_url=url) as client,
    ):
        client.post("/v1/ingest", json={"records": RECORDS})
        for _ in range(3):
            client.post("/v1/assemble", json={"session": "default", "query": "deploy?"})
        assert client.get("/v1/stats").json()["contexts"] == 3  # read after a flush
        text = client.get("/metrics").text
    assert 'ctxwarden_inclusion_log_entries_total{outcome="written"} 3.0' in text
    assert 'ctxwarden_inclusion_log_entries_total{outcome="failed"} 0.0' in text
    assert "ctxwarden_inclusion_log_pending 0.0" in text


def _answers(app: Any) -> list[tuple[int, str | None, str | None, bytes]]:
    """Status, content type, WWW-Authenticate and body of a fixed run of hot-endpoint requests
    (plain ones and every kind of odd one) against ``app``."""
    good = {"Authorization": "Bearer good"}
    reader = {"Authorization": "Bearer reader"}
    as_json = {**good, "content-type": "application/json"}
    assemble = b'{"session": "s", "query": "who owns the checklist?"}'
    big = json.dumps({"session": "s", "query": "x" * 6000}).encode()  # over max_body_bytes
    requests: list[tuple[str, str, dict[str, str], bytes | list[bytes]]] = [
        ("/v1/assemble", "", as_json, [assemble[:10], assemble[10:]]),  # chunked
        ("/v1/assemble", "", as_json, [big[:3000], big[3000:]]),
        ("/v1/assemble", "", as_json, big),
        ("/v1/ingest", "", as_json, json.dumps({"records": RECORDS, "session": "s"}).encode()),
        ("/v1/assemble", "", as_json, assemble),
        ("/v1/assemble", "", {"content-type": "application/json"}, assemble),
        ("/v1/assemble", "", {**as_json, "Authorization": "Bearer nope"}, assemble),
        ("/v1/assemble", "", {**as_json, "Authorization": "Basic good"}, assemble),
        ("/v1/assemble", "", {"content-type": "application/json"}, b'{"query": "x"}'),
        ("/v1/assemble", "", as_json, b'{"query": "x"}'),
        ("/v1/assemble", "", as_json, b'{"session": "s", "budget": 0}'),
        ("/v1/assemble", "", as_json, b'{"session": "s", "model": "no-such-model"}'),
        ("/v1/assemble", "", {"content-type": "application/json"}, b'{"session": '),
        ("/v1/assemble", "", as_json, b'{"session": '),
        ("/v1/assemble", "", as_json, b""),
        ("/v1/assemble", "", as_json, b"[" * 100_000),
        ("/v1/assemble", "", as_json, b'{"session": "\xff"}'),
        ("/v1/assemble", "", as_json, b'{"session": "s", "budget": NaN}'),
        ("/v1/assemble", "", good, assemble),
        ("/v1/assemble", "", {**good, "content-type": "text/plain"}, assemble),
        ("/v1/assemble", "", {**good, "content-type": "application/json; charset=utf-8"}, assemble),
        ("/v1/assemble", "", {**good, "content-type": "application/vnd.x+json"}, assemble),
        ("/v1/assemble", "report=full", as_json, assemble),
        ("/v1/assemble", "report=everything", as_json, assemble),
        ("/v1/assemble", "report=everything", as_json, b'{"query": "x"}'),
        ("/v1/search", "", as_json, b'{"query": "release checklist"}'),
        ("/v1/search", "", as_json, b'{"query": "release checklist", "limit": 500}'),
        ("/v1/search", "", as_json, b'{"query": 7}'),
        ("/v1/search", "", as_json, b'{"query": "checklist", "limit": "3"}'),
        ("/v1/search", "unknown=1", as_json, b'{"query": "checklist"}'),
        ("/v1/ingest", "", {**as_json, **reader}, b'{"records": []}'),
        ("/v1/ingest", "", as_json, b'{"records": [{"content": "x", "tenant": "other"}]}'),
        ("/v1/ingest", "", as_json, b'{"records": {"content": "x"}}'),
    ]

    def authenticate(token: str | None) -> Any:
        from ctxwarden.server.http import Principal

        if token not in ("good", "reader"):
            raise AuthError("unknown key")
        scopes = frozenset(SCOPES) if token == "good" else frozenset({"read"})
        return Principal(tenant="default", scopes=scopes)

    answers = []
    with serve(app(authenticate)) as url, httpx.Client(base_url=url) as client:
        for path, query, headers, content in requests:
            sent = iter(content) if isinstance(content, list) else content
            r = client.post(f"{path}?{query}" if query else path, content=sent, headers=headers)
            got = r.headers
            answer = (r.status_code, got.get("content-type"), got.get("www-authenticate"))
            # a context's id is random; memories' times (and the access score decaying with
            # them) are the server's clock
            content = re.sub(rb'"id":"[0-9a-f]{32}"', b'"id":"?"', r.content)
            content = re.sub(rb'"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ"', b'"?"', content)
            content = re.sub(rb'"access_score":[0-9.e-]+', b'"access_score":0', content)
            answers.append((*answer, content))
    return answers


def test_the_hot_endpoints_answer_as_fastapi_s_own_handler_does(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # the hot endpoints call the endpoint directly for a plain request (_DirectRoute) and leave
    # every other request to FastAPI's handler: the answers must be FastAPI's, byte for byte
    import fastapi.routing

    from ctxwarden.server.http import _DirectRoute

    general = 0
    real_solve = fastapi.routing.solve_dependencies

    async def counted_solve(*args: Any, **kwargs: Any) -> Any:
        nonlocal general
        general += 1
        return await real_solve(*args, **kwargs)

    monkeypatch.setattr(fastapi.routing, "solve_dependencies", counted_solve)

    def app(authenticate: Any) -> Any:
        config = ServerConfig(authenticate=authenticate, max_body_bytes=5000)
        return create_app(Engine.open(":memory:"), config)

    direct = _answers(app)
    direct_general = general
    with monkeypatch.context() as patched:
        patched.setattr(_DirectRoute, "_direct_shape", lambda _self: False)
        general = 0
        reference = _answers(app)
        reference_general = general
    for number, (ours, theirs) in enumerate(zip(direct, reference, strict=True)):
        assert ours == theirs, number
    assert [a[0] for a in reference].count(200) >= 5
    # bytes that are not UTF-8 and JSON nested too deeply are 422s naming the line and column
    # or the body (issue 20), never FastAPI's bare 400
    assert {a[0] for a in reference} >= {200, 401, 403, 413, 422}
    assert 400 not in {a[0] for a in reference}
    # the twelve plain requests (JSON that parses, no query string, and a valid body or a
    # refused key) did not go through it
    assert reference_general - direct_general == 12


def test_a_cancelled_request_waits_for_its_running_work() -> None:
    # as anyio.to_thread.run_sync: the work in the worker thread is never abandoned
    import asyncio
    from concurrent.futures import ThreadPoolExecutor

    from ctxwarden.server.access import _in_worker

    started, release = threading.Event(), threading.Event()
    finished: list[str] = []

    def work() -> str:
        started.set()
        release.wait(10)
        finished.append("work")
        return "done"

    async def main() -> None:
        with ThreadPoolExecutor(1) as workers:
            assert await _in_worker(workers, lambda: 7) == 7
            task = asyncio.ensure_future(_in_worker(workers, work))
            while not started.is_set():
                await asyncio.sleep(0.001)
            task.cancel()
            await asyncio.sleep(0.05)
            assert not task.done()  # still waiting for the running work
            release.set()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert finished == ["work"]

    asyncio.run(main())


def test_responses_are_the_bytes_json_dumps_wrote() -> None:
    from datetime import UTC, datetime

    from ctxwarden.server.http import _json

    bodies: list[Any] = [
        {"hits": [{"memory": {"id": "m1", "content": 'é \u2028 <"x"> \\ \t 😀'}, "score": 1.5}]},
        {"counts": {"stored": 2}, "n": [0, -1, 2**63 - 1, 0.1, 1 / 3, 1e16, -0.0, None, True]},
        {"big": 2**70, 1: "a key that is not a string"},  # orjson refuses: json.dumps writes
    ]
    for body in bodies:
        expected = json.dumps(body, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
        response = _json(body)
        assert response.body == expected.encode("utf-8")
        assert response.headers["content-type"] == "application/json"
    with pytest.raises(TypeError):  # not JSON: refused as json.dumps refused it
        _json({"when": datetime.now(UTC)})
