"""Hostile text at the boundary (issue 20, item 3): no input gets a 5xx, every refusal names
the field (or the line and column of broken JSON), a refused write leaves the store as it was,
and a stored record never makes a later read fail.

Text comes from all of Unicode (``st.text()`` unrestricted: NUL, lone surrogates, line
separators); JSON is sent as ``json.dumps`` writes it, so a lone surrogate arrives as a valid
``\\ud800`` escape.
"""

from __future__ import annotations

import hashlib
import json
import re
import sqlite3
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ctxwarden import Engine, EngineConfig
from ctxwarden.errors import CtxwardenError, InputError
from ctxwarden.llm import LLMClient
from ctxwarden.llm_anthropic import AnthropicClient
from ctxwarden.server.http import create_app
from ctxwarden.server.proxy import ProxyConfig, create_proxy_app
from ctxwarden.textcheck import check_json_text, text_problem
from llmserver import ScriptedServer, completion
from serving import serve

JSON = {"content-type": "application/json"}
FIXTURES = [HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
#: Text from all of Unicode. ``st.text()`` leaves out surrogates (category Cs) unless told
#: otherwise, and finds a lone one about once in 300 examples when told: NUL and a few lone
#: surrogates are drawn more often.
ANY_CHAR = st.characters(exclude_categories=()) | st.sampled_from("\x00\ud800\udbff\udc00\udfff")


def any_text(max_size: int) -> st.SearchStrategy[str]:
    return st.text(ANY_CHAR, max_size=max_size)


TEXT_FIELDS = ("content", "id", "session", "user", "author", "channel", "thread_id", "name")


def store_digest(path: Path) -> str:
    """A hash of every row of every table: equal digests, equal stores."""
    digest = hashlib.sha256()
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as connection:
        tables = connection.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' "
            "AND name NOT LIKE '%fts%' ORDER BY name"
        ).fetchall()
        for (table,) in tables:
            for row in connection.execute(f'SELECT * FROM "{table}" ORDER BY 1'):
                digest.update(repr(row).encode("utf-8", "backslashreplace"))
    return digest.hexdigest()


def refusal(call: Callable[[], object]) -> InputError | None:
    """The :class:`InputError` ``call`` raised, or None when it returned."""
    try:
        call()
    except InputError as exc:
        return exc
    return None


def _assemble_into(contexts: list[Any], engine: Engine, session: str, query: str) -> None:
    contexts.append(engine.assemble(session=session, query=query))


def post(client: httpx.Client, path: str, body: Any) -> httpx.Response:
    return client.post(path, content=json.dumps(body), headers=JSON)


# -- the library ----------------------------------------------------------------------------


def test_text_problem_finds_nul_and_lone_surrogates() -> None:
    assert text_problem("plain") is None
    assert text_problem("caf\u00e9 \U0001f600") is None
    assert text_problem("a\x00b") == "contains a NUL character: remove it"
    assert "U+D800" in str(text_problem("x\ud800"))
    with pytest.raises(InputError) as caught:
        check_json_text({"tags": [{"\udc00": 1}]}, "metadata")
    assert caught.value.field == "metadata.tags[0].\\udc00 (the key)"
    json.dumps(str(caught.value)).encode("utf-8")  # the error itself is printable


@pytest.mark.parametrize("field", [*TEXT_FIELDS, "reply_to", "tool_call_id"])
@pytest.mark.parametrize("bad", ["\ud800", "a\x00b", "\udfff tail"])
def test_records_with_nul_or_surrogates_are_refused_naming_the_field(
    tmp_path: Path, field: str, bad: str
) -> None:
    path = tmp_path / "s.db"
    with Engine.open(path) as engine:
        engine.ingest([{"id": "ok", "content": "kept", "session": "s"}])
        before = store_digest(path)
        record = {"id": "new", "content": "fresh text", "session": "s", field: bad}
        with pytest.raises(InputError) as caught:
            engine.ingest([{"id": "first", "content": "also fresh"}, record])
        assert caught.value.field == field
        assert caught.value.line == 2
        assert store_digest(path) == before


@pytest.mark.parametrize(
    ("record", "field"),
    [
        ({"metadata": {"k": "v\x00"}}, "metadata.k"),
        ({"metadata": {"\ud800": 1}}, "metadata.\\ud800 (the key)"),
        ({"attachments": [{"name": "x\ud800"}]}, "attachments[0].name"),
        (
            {"role": "assistant", "tool_calls": [{"function": {"name": "f\x00", "arguments": ""}}]},
            "tool_calls[0].function.name",
        ),
        ({"content": [{"type": "text", "text": "\ud800"}]}, "content"),
    ],
)
def test_nested_text_is_checked(record: dict[str, Any], field: str) -> None:
    with Engine.open(":memory:") as engine, pytest.raises(InputError) as caught:
        engine.ingest([{"id": "r", "content": "text", **record}])
    assert caught.value.field == field


@pytest.mark.parametrize("argument", ["query", "system", "channel", "model"])
@pytest.mark.parametrize("bad", ["\ud800", "a\x00b"])
def test_assemble_arguments_are_checked(argument: str, bad: str) -> None:
    with Engine.open(":memory:") as engine, pytest.raises(InputError) as caught:
        engine.assemble(session="s", **{argument: bad})
    assert caught.value.field == argument


def test_a_nul_stored_before_the_check_does_not_break_reads(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    with Engine.open(path) as engine:
        engine.ingest([{"id": "a", "content": "hello there", "author": "ana", "session": "s"}])
    with sqlite3.connect(path) as connection:  # a record written before ingest refused NUL
        connection.execute("UPDATE memories SET author = 'a' || char(0) || 'na'")
    with Engine.open(path) as engine:
        context = engine.assemble(session="s", query="hello?")
        assert list(context.included) == ["a"]
        assert "\x00" not in json.dumps(context.messages)
        assert engine.get("a").author == "a\x00na"  # the record itself is returned as stored


@settings(max_examples=120, suppress_health_check=FIXTURES, deadline=None)
@given(field=st.sampled_from(TEXT_FIELDS), text=any_text(40), query=any_text(40))
def test_any_text_is_stored_and_read_or_refused_naming_the_field(
    tmp_path_factory: pytest.TempPathFactory, field: str, text: str, query: str
) -> None:
    path = tmp_path_factory.mktemp("any") / "s.db"
    with Engine.open(path) as engine:
        engine.ingest([{"id": "base", "content": "the base record", "session": "s"}])
        before = store_digest(path)
        record = {"id": "x", "content": "some content", "session": "s", field: text}
        refused = refusal(lambda: engine.ingest([record]))
        if refused is not None:
            assert refused.field == field
            assert store_digest(path) == before
        for session in ("s", record["session"]):
            contexts: list[Any] = []
            refused = refusal(partial(_assemble_into, contexts, engine, session, query))
            if refused is not None:
                assert refused.field in {"query", "session"}
            for context in contexts:
                json.dumps(context.to_dict(), ensure_ascii=False).encode("utf-8")
        refused = refusal(lambda: engine.search(query or "x", scope="tenant"))
        if refused is not None:
            assert refused.field == "query"


# -- serve ------------------------------------------------------------------------------------


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    path = tmp_path / "serve.db"
    # No background embedder: its vector writes for earlier records would change the store
    # between the digests these tests compare around a refused request.
    config = EngineConfig(embed="off")
    with Engine.open(path, config=config) as engine, serve(create_app(engine)) as url:
        yield url, path


def test_serve_refuses_nul_author_then_assembles(served: tuple[str, Path]) -> None:
    url, path = served
    with httpx.Client(base_url=url) as client:
        assert post(client, "/v1/ingest", {"records": [{"content": "hi"}], "session": "s"})
        before = store_digest(path)
        r = post(client, "/v1/ingest", {"records": [{"content": "x", "author": "a\x00"}]})
        assert r.status_code == 422
        assert r.json()["error"]["field"] == "author"
        assert store_digest(path) == before
        assert post(client, "/v1/assemble", {"session": "s"}).status_code == 200


@pytest.mark.parametrize(
    ("raw", "line", "column"),
    [
        (b'{"records": [\n  {"content": }]}', 2, 15),
        (b'{"records": [{"content": "\xff"}]}', 1, 27),
    ],
)
def test_serve_unparsable_bodies_name_line_and_column(
    served: tuple[str, Path], raw: bytes, line: int, column: int
) -> None:
    url, _ = served
    r = httpx.post(url + "/v1/ingest", content=raw, headers=JSON)
    assert r.status_code == 422
    error = r.json()["error"]
    assert (error["type"], error["line"], error["column"]) == ("InputError", line, column)


def test_serve_deep_nesting_and_non_json_name_the_body(served: tuple[str, Path]) -> None:
    url, _ = served
    deep = b'{"records": [' + b"[" * 50_000 + b"]" * 50_000 + b"]}"
    for raw, headers in ((deep, JSON), (b'{"records": []}', {})):
        r = httpx.post(url + "/v1/ingest", content=raw, headers=headers)
        assert r.status_code == 422
        assert r.json()["error"]["field"] == "body"


@settings(max_examples=60, suppress_health_check=FIXTURES, deadline=None)
@given(
    body=st.fixed_dictionaries(
        {"session": any_text(20)},
        optional={
            "query": any_text(60),
            "system": any_text(60),
            "channel": any_text(20),
            "user": any_text(20),
            "items": st.dictionaries(any_text(8), st.lists(any_text(20))),
        },
    ),
    record=st.dictionaries(st.sampled_from(TEXT_FIELDS), any_text(30), min_size=1),
)
def test_serve_never_answers_5xx_and_names_the_field(
    served: tuple[str, Path], body: dict[str, Any], record: dict[str, str]
) -> None:
    url, path = served
    with httpx.Client(base_url=url) as client:
        before = store_digest(path)
        r = post(client, "/v1/ingest", {"records": [{"content": "c", **record}]})
        assert r.status_code in (200, 422), r.text
        if r.status_code == 422:
            assert r.json()["error"]["field"]
            assert store_digest(path) == before
        for path_name in ("/v1/assemble", "/v1/search"):
            request = body if path_name == "/v1/assemble" else {"query": body.get("query", "q")}
            r = post(client, path_name, request)
            assert r.status_code in (200, 422), r.text
            if r.status_code == 422:
                assert r.json()["error"]["field"]


# -- the proxy (chat completions, responses, messages) ---------------------------------------

APIS = {
    "/v1/chat/completions": {"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]},
    "/v1/responses": {"model": "gpt-4o", "input": "hi"},
    "/v1/messages": {
        "model": "claude-sonnet-4-5",
        "max_tokens": 16,
        "messages": [{"role": "user", "content": "hi"}],
    },
}


@pytest.fixture
def proxy_url() -> Iterator[str]:
    def answer(_recorded: Any) -> dict[str, Any]:
        return completion("ok")

    with (
        ScriptedServer(answer) as upstream,
        Engine.open(":memory:") as engine,
        LLMClient(upstream.url, api_key="sk-up", max_retries=0) as llm,
        AnthropicClient(upstream.url, api_key="sk-up", max_retries=0) as claude,
        serve(create_proxy_app(engine, llm, ProxyConfig(probe_window=False), claude)) as url,
    ):
        yield url


def _message(response: httpx.Response) -> str:
    return str(response.json()["error"]["message"])


@pytest.mark.parametrize("api", list(APIS))
@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"tools": "weather"}, "tools"),
        ({"tools": [1]}, "tools"),
        ({"stream": True, "stream_options": "yes"}, "stream_options"),
        ({"stream": True, "stream_options": {"include_usage": "yes"}}, "stream_options"),
        ({"metadata": {"k": "\x00"}}, "metadata.k"),
    ],
)
def test_proxy_refuses_bad_fields_with_4xx(
    proxy_url: str, api: str, change: dict[str, Any], field: str
) -> None:
    r = httpx.post(proxy_url + api, content=json.dumps({**APIS[api], **change}), headers=JSON)
    if "stream_options" in change and api != "/v1/chat/completions":
        assert r.status_code < 500  # another API's field: forwarded or refused, never a 500
        return
    assert 400 <= r.status_code < 500, r.text
    assert field in _message(r)


@pytest.mark.parametrize("api", list(APIS))
def test_proxy_unparsable_bodies_name_line_and_column(proxy_url: str, api: str) -> None:
    deep = b'{"model": "m", "messages": ' + b"[" * 50_000 + b"]" * 50_000 + b"}"
    for raw in (deep, b'{"model":\n "m", ', b'{"model": "\xff"}', b'{"model": "\\ud800"}'):
        r = httpx.post(proxy_url + api, content=raw, headers=JSON)
        assert r.status_code == 400, r.text
        assert "body: " in _message(r) or "'body'" in _message(r)
        assert "(line " in _message(r)
        assert "column " in _message(r)


@settings(max_examples=40, suppress_health_check=FIXTURES, deadline=None)
@given(
    api=st.sampled_from(list(APIS)),
    texts=st.lists(any_text(40), min_size=1, max_size=4),
    session=any_text(12),
)
def test_proxy_conversations_of_any_text_never_get_5xx(
    proxy_url: str, api: str, texts: list[str], session: str
) -> None:
    roles = ["user", "assistant"]
    messages = [{"role": roles[i % 2], "content": t} for i, t in enumerate(texts)]
    if len(messages) % 2 == 0:
        messages.append({"role": "user", "content": "and?"})
    body = dict(APIS[api])
    if api == "/v1/responses":
        body["input"] = messages
    else:
        body["messages"] = messages
    name = session.encode("unicode_escape").decode("ascii").strip()[:64] or "s"
    headers = {**JSON, "x-ctxwarden-session": name}
    r = httpx.post(proxy_url + api, content=json.dumps(body), headers=headers)
    assert r.status_code < 500, r.text
    if r.status_code >= 400:
        assert ": " in _message(r)


def test_errors_with_unprintable_text_are_printable() -> None:
    with Engine.open(":memory:") as engine:
        with pytest.raises(CtxwardenError) as caught:
            engine.ingest([{"content": "x", "\ud800": 1}])
        str(caught.value).encode("utf-8")


def test_an_empty_unknown_key_is_named() -> None:
    with Engine.open(":memory:") as engine, pytest.raises(InputError) as caught:
        engine.ingest([{"content": "x", "": 1}])
    assert caught.value.field == "''"


# -- MCP over streamable HTTP -------------------------------------------------------------------


def test_mcp_over_http_answers_broken_bodies_with_line_and_column() -> None:
    from ctxwarden.server.http import SCOPES, Principal
    from ctxwarden.server.mcp import create_mcp_http_app

    def authenticate(_token: str | None) -> Principal:
        return Principal(tenant="t", scopes=frozenset(SCOPES))

    headers = {
        **JSON,
        "authorization": "Bearer k",
        "accept": "application/json, text/event-stream",
    }
    start = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-06-18",
            "capabilities": {},
            "clientInfo": {"name": "test", "version": "1"},
        },
    }
    with (
        Engine.open(":memory:") as engine,
        serve(create_mcp_http_app(engine, authenticate), lifespan="on") as url,
        httpx.Client(base_url=url, headers=headers) as client,
    ):
        session = client.post("/mcp", content=json.dumps(start)).headers["mcp-session-id"]
        client.headers["mcp-session-id"] = session
        call = {"jsonrpc": "2.0", "id": 2, "method": "tools/call"}
        remember = {"name": "remember", "arguments": {"content": "\ud800"}}
        for raw in (
            b'{"jsonrpc":\n "2.0", ',
            b'{"jsonrpc": "\xff"}',
            b"[" * 50_000,
            json.dumps({**call, "params": remember}).encode(),
        ):
            r = client.post("/mcp", content=raw)
            assert r.status_code == 400, r.text
            error = r.json()["error"]
            assert error["code"] == -32700  # JSON-RPC's parse error, the protocol's own shape
            assert re.search(r"line \d+ column \d+", error["message"]), error
        assert engine.stats(tenant="t", scope="tenant")["memories"] == 0
