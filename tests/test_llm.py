"""Tests of ctxwarden.llm against a real HTTP server on loopback (tests/llmserver.py)."""

from __future__ import annotations

import email.utils
import logging
import socket
import time
import traceback

import pytest

from ctxwarden.errors import ConfigError, UpstreamError
from ctxwarden.llm import ChatResult, LLMClient, UpstreamStatusError
from llmserver import Recorded, Reply, ScriptedServer, completion

KEY = "sk-test-7f3a9c1e5b2d4f60a8e9c7b1d3f5e7a9"
MESSAGES = [{"role": "user", "content": "hi"}]


def client_for(server: ScriptedServer, **kwargs: object) -> LLMClient:
    options: dict[str, object] = {"model": "m1", "backoff": 0.001, "timeout": 5.0}
    options.update(kwargs)
    return LLMClient(server.url, KEY, **options)  # type: ignore[arg-type]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# ---------------------------------------------------------------- chat


def test_chat_sends_the_request_and_reads_the_answer():
    with ScriptedServer(["hello there"]) as server, client_for(server) as client:
        result = client.chat(
            MESSAGES,
            max_tokens=50,
            response_format={"type": "json_object"},
            tools=[{"type": "function", "function": {"name": "f"}}],
            extra={"seed": 7},
        )
    assert isinstance(result, ChatResult)
    assert result.text == "hello there"
    assert result.finish_reason == "stop"
    assert result.usage is not None
    assert result.usage.total_tokens == 18
    assert result.model == "scripted"
    assert result.tool_calls == ()
    assert result.raw["id"] == "chatcmpl-1"
    [request] = server.requests
    assert request.method == "POST"
    assert request.path == "/v1/chat/completions"
    assert request.headers["Authorization"] == f"Bearer {KEY}"
    assert request.body == {
        "seed": 7,
        "model": "m1",
        "messages": MESSAGES,
        "stream": False,
        "max_tokens": 50,
        "temperature": 0.0,
        "response_format": {"type": "json_object"},
        "tools": [{"type": "function", "function": {"name": "f"}}],
    }


def test_chat_model_argument_overrides_default_and_no_key_sends_no_authorization():
    with ScriptedServer(["x"]) as server, LLMClient(server.url, model="a") as client:
        client.chat(MESSAGES, model="b", temperature=None)
    [request] = server.requests
    assert request.body["model"] == "b"
    assert "temperature" not in request.body
    assert "Authorization" not in request.headers


def test_chat_reads_tool_calls_and_content_parts():
    calls = [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}},
        {"id": "c2", "type": "function", "function": {"name": "g", "arguments": {"b": 2}}},
    ]
    parts = completion(None)
    parts["choices"][0]["message"]["content"] = [{"type": "text", "text": "a"}, {"text": "b"}]
    with (
        ScriptedServer([completion(None, tool_calls=calls), parts]) as server,
        client_for(server) as client,
    ):
        with_calls = client.chat(MESSAGES)
        with_parts = client.chat(MESSAGES)
    assert with_calls.text is None
    assert [(c.id, c.name) for c in with_calls.tool_calls] == [("c1", "f"), ("c2", "g")]
    assert with_calls.tool_calls[1].arguments == '{"b": 2}'
    assert with_parts.text == "ab"


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        ({"choices": []}, "no choices"),
        ({"choices": [{"finish_reason": "stop"}]}, "no message"),
        ({"choices": [{"message": {"content": 5}}]}, "not text"),
        ({"choices": [{"message": {"tool_calls": [{"id": "x"}]}}]}, "unreadable tool call"),
        ([1, 2], "not a JSON object"),
        ("<html>not json</html>", "not JSON"),
    ],
)
def test_chat_unusable_bodies_are_upstream_errors(body: object, fragment: str):
    with (
        ScriptedServer([Reply(body=body)]) as server,
        client_for(server) as client,
        pytest.raises(UpstreamError) as info,
    ):
        client.chat(MESSAGES)
    assert fragment in str(info.value)
    assert "/v1/chat/completions" in str(info.value)


# ---------------------------------------------------------------- retries


def test_retries_5xx_then_succeeds():
    script = [Reply(status=502, body="bad gateway"), Reply(status=503), "ok"]
    with ScriptedServer(script) as server, client_for(server) as client:
        assert client.chat(MESSAGES).text == "ok"
    assert len(server.requests) == 3


def test_gives_up_after_max_retries_with_status_and_path():
    script = [Reply(status=503, body={"error": {"message": "overloaded"}})] * 5
    with (
        ScriptedServer(script) as server,
        client_for(server, max_retries=2) as client,
        pytest.raises(UpstreamStatusError) as info,
    ):
        client.chat(MESSAGES)
    assert len(server.requests) == 3
    error = info.value
    assert error.status == 503
    assert error.path == "/v1/chat/completions"
    assert error.detail == "overloaded"
    assert "status 503 after 3 attempt(s)" in str(error)
    assert "POST /v1/chat/completions at 127.0.0.1:" in str(error)


def test_client_errors_are_not_retried():
    script = [Reply(status=400, body={"error": {"message": "model 'm1' not found"}}), "never"]
    with (
        ScriptedServer(script) as server,
        client_for(server) as client,
        pytest.raises(UpstreamStatusError) as info,
    ):
        client.chat(MESSAGES)
    assert len(server.requests) == 1
    assert info.value.status == 400
    assert "model 'm1' not found" in str(info.value)


def test_429_honours_retry_after_seconds():
    script = [Reply(status=429, headers={"Retry-After": "0.4"}), "ok"]
    with ScriptedServer(script) as server, client_for(server, backoff=0.001) as client:
        started = time.monotonic()
        assert client.chat(MESSAGES).text == "ok"
        elapsed = time.monotonic() - started
    assert elapsed >= 0.4
    assert len(server.requests) == 2


def test_retry_after_http_date_in_the_past_means_now_and_is_capped():
    past = email.utils.formatdate(time.time() - 60, usegmt=True)
    script = [
        Reply(status=429, headers={"Retry-After": past}),
        Reply(status=429, headers={"Retry-After": "3600"}),
        "ok",
    ]
    with ScriptedServer(script) as server, client_for(server, max_retry_after=0.05) as client:
        started = time.monotonic()
        assert client.chat(MESSAGES).text == "ok"
        assert time.monotonic() - started < 2


def test_connection_refused_is_retried_then_reported():
    url = f"http://127.0.0.1:{free_port()}/v1"
    with (
        LLMClient(url, KEY, model="m", backoff=0.001, max_retries=2) as client,
        pytest.raises(UpstreamError) as info,
    ):
        client.chat(MESSAGES)
    message = str(info.value)
    assert "POST /v1/chat/completions" in message
    assert "cannot reach the server" in message
    assert "after 3 attempt(s)" in message


def test_dropped_connection_is_retried():
    with ScriptedServer([Reply(drop=True), "ok"]) as server, client_for(server) as client:
        assert client.chat(MESSAGES).text == "ok"
    assert len(server.requests) == 2


def test_read_timeout_is_reported_and_not_retried():
    script = [Reply(delay=1.0, body=completion("late")), "never"]
    with ScriptedServer(script) as server, client_for(server, timeout=0.2) as client:
        started = time.monotonic()
        with pytest.raises(UpstreamError) as info:
            client.chat(MESSAGES)
        assert time.monotonic() - started < 0.9
    assert "no answer within 0.2s" in str(info.value)
    assert len(server.requests) == 1


def test_redirects_are_not_followed():
    with ScriptedServer(["secret-catcher"]) as other:
        location = f"{other.url}/chat/completions"
        script = [Reply(status=307, headers={"Location": location})]
        with (
            ScriptedServer(script) as server,
            client_for(server) as client,
            pytest.raises(UpstreamStatusError) as info,
        ):
            client.chat(MESSAGES)
    assert info.value.status == 307
    assert other.requests == []


# ---------------------------------------------------------------- embeddings and models


def test_embeddings_are_returned_in_input_order():
    body = {
        "data": [
            {"index": 1, "embedding": [0.0, 1.0]},
            {"index": 0, "embedding": [1, 0]},
        ]
    }
    with ScriptedServer([body]) as server, client_for(server) as client:
        vectors = client.embeddings(["a", "b"], model="emb")
        assert client.embeddings([]) == []
    assert vectors == [[1.0, 0.0], [0.0, 1.0]]
    [request] = server.requests
    assert request.path == "/v1/embeddings"
    assert request.body == {"model": "emb", "input": ["a", "b"]}


@pytest.mark.parametrize(
    "body",
    [
        {"data": [{"index": 0, "embedding": [1.0]}]},
        {"data": [{"index": 0, "embedding": [1.0]}, {"index": 0, "embedding": [2.0]}]},
        {"data": [{"index": 0, "embedding": ["x"]}, {"index": 1, "embedding": [2.0]}]},
        {"nothing": True},
    ],
)
def test_embeddings_bad_answers_are_upstream_errors(body: dict[str, object]):
    with (
        ScriptedServer([body]) as server,
        client_for(server) as client,
        pytest.raises(UpstreamError, match="/v1/embeddings"),
    ):
        client.embeddings(["a", "b"])


def test_models_lists_ids():
    body = {"object": "list", "data": [{"id": "qwen"}, {"id": "llama"}]}
    with ScriptedServer([body]) as server, client_for(server) as client:
        assert client.models() == ["qwen", "llama"]
    assert server.requests[0].method == "GET"
    assert server.requests[0].path == "/v1/models"


# ---------------------------------------------------------------- configuration


@pytest.mark.parametrize("url", ["127.0.0.1:8080", "ftp://host/v1", "http:///v1"])
def test_bad_base_url_is_a_config_error(url: str):
    with pytest.raises(ConfigError, match="base_url"):
        LLMClient(url)


def test_bad_timeout_and_retries_are_config_errors():
    with pytest.raises(ConfigError, match="timeout"):
        LLMClient("http://127.0.0.1:1/v1", timeout=0)
    with pytest.raises(ConfigError, match="max_retries"):
        LLMClient("http://127.0.0.1:1/v1", max_retries=-1)


def test_no_model_anywhere_is_a_config_error_before_any_request():
    with (
        ScriptedServer(["x"]) as server,
        LLMClient(server.url) as client,
        pytest.raises(ConfigError, match="model"),
    ):
        client.chat(MESSAGES)
    assert server.requests == []


def test_constructing_does_no_io():
    # Port 9 on loopback has no server: a constructor that connected would fail here.
    client = LLMClient("http://127.0.0.1:9/v1", KEY)
    client.close()


# ---------------------------------------------------------------- the key stays secret


def test_the_key_never_appears_in_reprs_errors_tracebacks_or_logs(caplog: pytest.LogCaptureFixture):
    caplog.set_level(logging.DEBUG)

    def echo(request: Recorded) -> Reply:
        # A hostile or careless upstream that echoes the Authorization header in its error.
        auth = request.headers.get("Authorization", "")
        return Reply(status=500, body={"error": {"message": f"bad credentials {auth}"}})

    url_with_key = f"http://user:{KEY}@127.0.0.1:{free_port()}/v1?api-key={KEY}"
    texts: list[str] = []
    with ScriptedServer(echo) as server, client_for(server, max_retries=1) as client:
        texts.append(repr(client))
        with pytest.raises(UpstreamError) as info:
            client.chat(MESSAGES)
        texts += [str(info.value), repr(info.value)]
        texts += traceback.format_exception(info.value)
    with LLMClient(url_with_key, KEY, model="m", backoff=0.001, max_retries=1) as refused:
        texts.append(repr(refused))
        with pytest.raises(UpstreamError) as info:
            refused.chat(MESSAGES)
        texts += [str(info.value), repr(info.value)]
    texts += [record.getMessage() for record in caplog.records]
    assert any("bad credentials Bearer ***" in t for t in texts)
    assert any("retry" in record.getMessage() for record in caplog.records)
    for text in texts:
        assert KEY not in text
