"""Every 400 and 422 of the HTTP API names what to fix (issue 20, item 3): a ``field`` in the
one documented error shape (``{"error": {"type", "message", "field"}}``), or the ``line`` and
``column`` of JSON that does not parse. Walks the error paths of every route with a real
server, ones schemathesis cannot reach as well (checks made by the engine, past the schema)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from ctxwarden import Engine
from ctxwarden.server.http import create_app
from serving import serve

LONG = "word " * 50_000

#: (method, path, JSON body or raw bytes, the field named): each must answer 400 or 422.
CASES: list[tuple[str, str, Any, str]] = [
    ("POST", "/v1/ingest", b'{"records": [', "body"),
    ("POST", "/v1/ingest", b"\xff\xfe", "body"),
    ("POST", "/v1/ingest", [1, 2], "body"),
    ("POST", "/v1/ingest", {}, "records"),
    ("POST", "/v1/ingest", {"records": [{"content": "x"}], "extra": 1}, "extra"),
    ("POST", "/v1/ingest", {"records": [{"id": "a"}], "session": "s"}, "content"),
    ("POST", "/v1/ingest", {"records": [{"id": "a", "content": ""}], "session": "s"}, "content"),
    (
        "POST",
        "/v1/ingest",
        {"records": [{"id": "a", "content": "x\u0000"}], "session": "s"},
        "content",
    ),
    (
        "POST",
        "/v1/ingest",
        {"records": [{"id": "a", "content": "x", "role": "boss"}], "session": "s"},
        "role",
    ),
    (
        "POST",
        "/v1/ingest",
        {"records": [{"id": "a", "content": "x", "tenant": "other"}], "session": "s"},
        "tenant",
    ),
    (
        "POST",
        "/v1/ingest",
        {"records": [{"id": "a", "content": "x", "created_at": "soon"}], "session": "s"},
        "created_at",
    ),
    (
        "POST",
        "/v1/ingest",
        {"records": [{"id": "a", "content": "x", "author": "a\u0000b"}], "session": "s"},
        "author",
    ),
    (
        "POST",
        "/v1/ingest",
        {"records": [{"id": "a", "content": "x", "kind": "spell"}], "session": "s"},
        "kind",
    ),
    ("POST", "/v1/ingest", {"records": ["not an object"], "session": "s"}, "records"),
    ("POST", "/v1/assemble", {}, "session"),
    ("POST", "/v1/assemble", {"session": "s", "budget": 0}, "budget"),
    ("POST", "/v1/assemble", {"session": "s", "budget": 5}, "budget"),
    ("POST", "/v1/assemble", {"session": "s", "scope": "planet"}, "scope"),
    ("POST", "/v1/assemble", {"session": "s", "scope": "user"}, "user"),
    ("POST", "/v1/assemble", {"session": "s", "tokenizer": "no-such-tokenizer"}, "tokenizer"),
    ("POST", "/v1/assemble", {"session": "s", "tokenizer": "gguf:/etc/passwd"}, "tokenizer"),
    ("POST", "/v1/assemble", {"session": "s", "window": 10}, "budget"),
    ("POST", "/v1/assemble", {"session": "s", "items": {"nowhere": ["x"]}}, "items"),
    ("POST", "/v1/assemble", {"session": "s", "query": LONG}, "query"),
    ("POST", "/v1/assemble", {"session": "s", "tools": [1]}, "tools"),
    ("POST", "/v1/assemble", {"session": "s", "system": "\ud800"}, "system"),
    ("POST", "/v1/search", {"query": "x", "limit": 0}, "limit"),
    ("POST", "/v1/search", {"query": "x", "scope": "session"}, "session"),
    ("POST", "/v1/search", {"query": LONG}, "query"),
    ("GET", "/v1/pins?scope=planet", None, "scope"),
    ("GET", "/v1/pins?scope=user", None, "user"),
    ("GET", "/v1/pins?nope=1", None, "query.nope"),
    ("POST", "/v1/memories/m1/pin?scope=planet", None, "scope"),
    ("PATCH", "/v1/memories/m1", {"content": ""}, "content"),
    ("PATCH", "/v1/memories/m1", {"content": "a\u0000"}, "content"),
    ("PATCH", "/v1/memories/m1", {}, "content"),
    ("GET", "/v1/stats?scope=user", None, "user"),
    ("GET", "/v1/stats?scope=planet", None, "scope"),
    ("POST", "/v1/compact/plan", {"older_than": -1}, "older_than"),
    ("POST", "/v1/compact/apply", {"max_summary_share": 2}, "max_summary_share"),
    ("POST", "/v1/compact/plan", {"access_threshold": "high"}, "access_threshold"),
    ("POST", "/v1/search", {"query": "x", "user": "\ud800"}, "user"),
]


@pytest.fixture(scope="module")
def client() -> Iterator[httpx.Client]:
    with Engine.open(":memory:") as engine:
        engine.ingest([{"id": "m1", "content": "a memory to edit"}], session="s")
        with serve(create_app(engine)) as url, httpx.Client(base_url=url, timeout=60) as c:
            yield c


@pytest.mark.parametrize(
    ("method", "path", "body", "field"), CASES, ids=[f"{c[0]} {c[1][:30]} {c[3]}" for c in CASES]
)
def test_every_client_error_names_its_field(
    client: httpx.Client, method: str, path: str, body: Any, field: str
) -> None:
    if isinstance(body, bytes):
        headers = {"content-type": "application/json"}
        r = client.request(method, path, content=body, headers=headers)
    elif body is None:
        r = client.request(method, path)
    else:
        content = json.dumps(body).encode()  # a lone surrogate as its \\u escape: valid JSON
        r = client.request(
            method, path, content=content, headers={"content-type": "application/json"}
        )
    assert r.status_code in (400, 422), (r.status_code, r.text)
    error = r.json()["error"]
    assert set(error) <= {"type", "message", "field", "line", "column"}, error
    assert error["type"]
    assert error["message"]
    if field == "body" and "line" in error:
        assert error["column"] >= 1
        return
    assert field in error.get("field", ""), (field, error)
