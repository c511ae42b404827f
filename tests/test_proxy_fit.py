"""The proxy never bends a conversation: the official ``openai`` client -> our proxy (uvicorn on
loopback) -> a scripted OpenAI-compatible upstream (a real HTTP server on loopback).

Regression tests for issue 16's reproductions 4 (a conversation that fits is sent as is) and 5
(bodies over 1 MiB), bad input (400 naming the message, nothing stored), the limits, the window
and tokenizer headers, unknown models, upstream failures and the provider's cached tokens."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import openai
import pytest

from ctxwarden import Engine, EngineConfig, tokens
from ctxwarden.llm import LLMClient
from ctxwarden.models import ModelSpec
from ctxwarden.server.chatfit import validate_messages
from ctxwarden.server.http import ServerConfig
from ctxwarden.server.proxy import ProxyConfig, create_proxy_app
from llmserver import Recorded, Reply, ScriptedServer, completion
from serving import serve

SYSTEM = {"role": "system", "content": "You are a coding agent."}
SMALL = ModelSpec(name="small-window", tokenizer="o200k_base", window=2000, chat_format="chatml",
                  max_output=200)  # fmt: skip


@dataclass
class Rig:
    upstream: ScriptedServer
    engine: Engine
    url: str
    client: openai.OpenAI

    def sent(self, index: int = -1) -> dict[str, Any]:
        body = self.upstream.chat_requests()[index].body
        assert isinstance(body, dict)
        return body


def _rig(script: Any, config: ProxyConfig | None = None) -> Iterator[Rig]:
    with (
        ScriptedServer(script) as upstream,
        Engine.open(":memory:", config=EngineConfig(models=(SMALL,))) as engine,
        LLMClient(upstream.url, api_key="sk-up", max_retries=0, timeout=5) as llm,
        serve(create_proxy_app(engine, llm, config or ProxyConfig(probe_window=False))) as url,
        openai.OpenAI(base_url=url + "/v1", api_key="sk-agent", max_retries=0) as client,
    ):
        yield Rig(upstream=upstream, engine=engine, url=url, client=client)


@pytest.fixture
def rig(request: pytest.FixtureRequest) -> Iterator[Rig]:
    yield from _rig(getattr(request, "param", ["ok"] * 8))


def report(raw: Any) -> dict[str, Any]:
    return dict(json.loads(raw.headers["x-ctxwarden-report"]))


def call(id: str, name: str = "read_file", arguments: str = '{"path": "a.py"}') -> dict[str, Any]:
    return {"id": id, "type": "function", "function": {"name": name, "arguments": arguments}}


def test_continue_three_times_goes_upstream_as_sent(rig: Rig) -> None:
    """Reproduction 4: a person's repeated turn in an agent session is a real turn."""
    messages: list[dict[str, Any]] = [SYSTEM, {"role": "user", "content": "fix the failing test"}]
    for turn in range(3):
        messages.append({"role": "assistant", "content": f"step {turn} done", "refusal": None})
        messages.append({"role": "user", "content": "continue", "x_client_note": turn})
    raw = rig.client.chat.completions.with_raw_response.create(
        model="gpt-4o", messages=messages, temperature=0.2, metadata={"run": "r1"},  # type: ignore[arg-type]
        extra_headers={"X-Ctxwarden-Session": "coding-1"},
        extra_body={"top_k": 5, "vendor_field": {"a": [1, 2]}},
    )  # fmt: skip
    sent = rig.sent()
    assert sent["messages"] == messages  # order, roles, content, unknown fields: all as sent
    assert [m["content"] for m in sent["messages"]].count("continue") == 3
    assert not any("(x" in json.dumps(m) for m in sent["messages"])
    # the request's other fields go as sent
    assert sent["temperature"] == 0.2
    assert sent["metadata"] == {"run": "r1"}
    assert sent["top_k"] == 5
    assert sent["vendor_field"] == {"a": [1, 2]}
    assert report(raw)["unchanged"] is True
    # stored as a transcript: every "continue" its own memory, nothing folded
    stored = [m for m in rig.engine.store.iter_memories("default") if m.content == "continue"]
    assert len(stored) == 3
    assert all(m.dup_count == 1 for m in stored)


def test_a_body_over_one_mebibyte_is_accepted_and_fitted(rig: Rig) -> None:
    """Reproduction 5: an 8,000-message conversation (about 2 MB) is accepted and fitted."""
    messages: list[dict[str, Any]] = [SYSTEM]
    for i in range(4000):
        messages.append({"role": "user", "content": f"line {i}: " + "word " * 40})
        messages.append({"role": "assistant", "content": f"ack {i}"})
    messages.append({"role": "user", "content": "summarise the last line"})
    assert len(json.dumps({"messages": messages})) > 1 << 20
    raw = rig.client.chat.completions.with_raw_response.create(
        model="small-window",
        messages=messages,  # type: ignore[arg-type]
    )
    sent = rig.sent()["messages"]
    rep = report(raw)
    assert rep["tokens"] <= rep["cap"] < 2000
    assert sent[0] == SYSTEM
    assert sent[-1] == messages[-1]
    assert sent[1:] == messages[len(messages) - len(sent) + 1 :]
    validate_messages(sent)


def test_a_20000_message_10_mb_conversation_is_fitted() -> None:
    for rig in _rig(["ok"], ProxyConfig(probe_window=False)):
        messages: list[dict[str, Any]] = [SYSTEM]
        for i in range(10_000):
            messages.append({"role": "user", "content": f"q{i} " + "lorem ipsum " * 45})
            messages.append({"role": "assistant", "content": f"a{i} " + "dolor sit " * 45})
        size = len(json.dumps({"model": "gpt-4o", "messages": messages[:20_000]}))
        assert size > 10_000_000
        raw = rig.client.chat.completions.with_raw_response.create(
            model="gpt-4o",
            messages=messages[:20_000],  # type: ignore[arg-type]
        )
        rep = report(raw)
        assert rep["received_messages"] == 20_000
        assert rep["tokens"] <= rep["cap"]
        assert rig.sent()["messages"][-1] == messages[19_999]


def test_a_100_mb_body_gets_413_and_stores_nothing(rig: Rig) -> None:
    body = json.dumps(
        {"model": "gpt-4o", "messages": [{"role": "user", "content": "x" * 100_000_000}]}
    )
    try:
        response = httpx.post(
            rig.url + "/v1/chat/completions", content=body,
            headers={"Content-Type": "application/json", "X-Ctxwarden-Session": "big"}, timeout=60,
        )  # fmt: skip
    except httpx.WriteError:  # the server answered and closed before the upload ended
        pass
    else:
        assert response.status_code == 413
        error = response.json()["error"]
        assert error["type"] == "PayloadTooLarge"
        assert str(32 << 20) in error["message"]
    assert rig.engine.stats()["memories"] == 0
    assert rig.upstream.chat_requests() == []


def test_the_body_limit_is_configurable() -> None:
    config = ProxyConfig(probe_window=False, server=ServerConfig(max_body_bytes=2000))
    for rig in _rig(["ok"], config):
        with pytest.raises(openai.APIStatusError) as caught:
            rig.client.chat.completions.create(
                model="gpt-4o", messages=[{"role": "user", "content": "y" * 5000}]
            )
        assert caught.value.status_code == 413
        assert "request body over 2000 bytes" in str(caught.value)


TWO_CALLS: dict[str, Any] = {"role": "assistant", "tool_calls": [call("c1"), call("c2")]}
ONE_RESULT = {"role": "tool", "tool_call_id": "c1", "content": "ok"}
BAD_CALL = {"role": "assistant", "tool_calls": [{"id": "c1", "function": {"name": 3}}]}
BAD = [
    ([{"role": "tool", "tool_call_id": "c1", "content": "42"}], "messages[0].tool_call_id"),
    (
        [{"role": "user", "content": "go"}, TWO_CALLS, ONE_RESULT, {"role": "user"}],
        "messages[1].tool_calls",
    ),
    ([{"role": "wizard", "content": "hi"}], "messages[0].role"),
    ([{"role": "user", "content": "hi"}, "not a message"], "messages[1]"),
    ([{"role": "user", "content": [{"type": "hologram"}]}], "messages[0].content[0].type"),
    ([{"role": "user", "content": 7}], "messages[0].content"),
    ([BAD_CALL], "messages[0].tool_calls[0].function"),
    ([], "messages"),
]  # fmt: skip


@pytest.mark.parametrize(("messages", "field"), BAD)
def test_a_malformed_conversation_gets_400_naming_the_message_and_stores_nothing(
    rig: Rig, messages: list[Any], field: str
) -> None:
    response = httpx.post(
        rig.url + "/v1/chat/completions",
        json={"model": "gpt-4o", "messages": messages, "user": "alice"},
        headers={"X-Ctxwarden-Session": "s"},
    )
    assert response.status_code == 400
    error = response.json()["error"]
    assert field in error["message"]
    assert error["param"] == field
    assert rig.engine.stats()["memories"] == 0
    assert rig.upstream.chat_requests() == []


def test_a_body_that_is_not_json_gets_400(rig: Rig) -> None:
    response = httpx.post(rig.url + "/v1/chat/completions", content=b"{nope")
    assert response.status_code == 400
    assert "not JSON" in response.json()["error"]["message"]


def test_a_conversation_too_long_for_the_window_gets_context_length_exceeded(rig: Rig) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        rig.client.chat.completions.create(
            model="small-window", messages=[{"role": "user", "content": "word " * 5000}],
            extra_headers={"X-Ctxwarden-Session": "s"},
        )  # fmt: skip
    assert caught.value.code == "context_length_exceeded"
    assert "but the cap is" in str(caught.value)
    assert rig.engine.stats()["memories"] == 0


def test_trimming_keeps_tool_calls_with_their_results_and_the_question_before_them(
    rig: Rig,
) -> None:
    messages: list[dict[str, Any]] = [SYSTEM]
    for i in range(30):
        messages += [
            {"role": "user", "content": f"task {i}: " + "details " * 30},
            {"role": "assistant", "content": None, "tool_calls": [call(f"a{i}"), call(f"b{i}")]},
            {"role": "tool", "tool_call_id": f"b{i}", "content": "file body " * 20},
            {"role": "tool", "tool_call_id": f"a{i}", "content": "file body " * 20},
            {"role": "assistant", "content": f"done {i}"},
        ]
    messages += [
        {"role": "user", "content": "the last task"},
        {"role": "assistant", "content": None, "tool_calls": [call("z")]},
        {"role": "tool", "tool_call_id": "z", "content": "the result"},
    ]
    raw = rig.client.chat.completions.with_raw_response.create(
        model="small-window",
        messages=messages,  # type: ignore[arg-type]
    )
    sent = rig.sent()["messages"]
    assert report(raw)["unchanged"] is False
    validate_messages(sent)  # every call with all its results, every result after its call
    assert sent[0] == SYSTEM
    assert sent[-3:] == messages[-3:]  # the question stays before the tool traffic
    assert sent[1]["role"] == "user"


def test_headers_name_tokenizer_and_window_and_an_unknown_model_is_never_refused(rig: Rig) -> None:
    messages = [{"role": "user", "content": f"turn {i} " + "text " * 50} for i in range(40)]
    raw = rig.client.chat.completions.with_raw_response.create(
        model="acme-lm-7b", messages=messages,  # type: ignore[arg-type]
    )  # fmt: skip
    rep = report(raw)
    assert rep["known_model"] is False
    assert rep["tokenizer"] == tokens.get_tokenizer("approx").name
    assert rep["exact"] is False
    assert any("unknown model" in note for note in rep["notes"])
    raw = rig.client.chat.completions.with_raw_response.create(
        model="acme-lm-7b", messages=messages,  # type: ignore[arg-type]
        extra_headers={"X-Ctxwarden-Tokenizer": "llama3", "X-Ctxwarden-Window": "1500"},
    )  # fmt: skip
    rep = report(raw)
    assert (rep["tokenizer"], rep["window"], rep["window_source"]) == ("llama3", 1500, "header")
    assert rep["tokens"] <= rep["cap"] < 1500
    assert len(rig.sent()["messages"]) < len(messages)
    for headers, field in (
        ({"X-Ctxwarden-Tokenizer": "nope"}, "x-ctxwarden-tokenizer"),
        ({"X-Ctxwarden-Window": "-3"}, "x-ctxwarden-window"),
    ):
        with pytest.raises(openai.BadRequestError) as caught:
            rig.client.chat.completions.create(
                model="gpt-4o",
                messages=messages[:1],
                extra_headers=headers,  # type: ignore[arg-type]
            )
        assert field in str(caught.value)


def test_max_tokens_is_reserved_from_the_window(rig: Rig) -> None:
    messages = [{"role": "user", "content": f"turn {i} " + "text " * 50} for i in range(20)]
    raw = rig.client.chat.completions.with_raw_response.create(
        model="small-window",
        messages=messages,
        max_tokens=900,  # type: ignore[arg-type]
    )
    rep = report(raw)
    assert rep["tokens"] <= rep["cap"] <= 2000 - 900
    assert rig.sent()["max_tokens"] == 900


@pytest.mark.parametrize(
    "rig",
    [[Reply(status=503, body={"error": {"message": "model is loading"}})],
     [Reply(status=429, body={"error": {"message": "slow down"}})],
     [Reply(delay=8.0, body=completion("late"))]],
    indirect=True,
)  # fmt: skip
def test_upstream_failures_keep_their_status_and_never_name_the_upstream(rig: Rig) -> None:
    with pytest.raises(openai.APIStatusError) as caught:
        rig.client.chat.completions.create(
            model="gpt-4o", messages=[{"role": "user", "content": "hi"}]
        )
    text = caught.value.response.text
    assert str(rig.upstream.port) not in text
    assert "127.0.0.1" not in text
    assert caught.value.status_code in (503, 429, 504)
    if caught.value.status_code == 504:
        assert "no answer in time" in text
    else:
        assert "upstream answered" in text


def test_an_unreachable_upstream_is_502_without_its_address() -> None:
    with (
        Engine.open(":memory:") as engine,
        LLMClient("http://127.0.0.1:9/v1", max_retries=0, timeout=2) as llm,
        serve(create_proxy_app(engine, llm, ProxyConfig(probe_window=False))) as url,
        openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0) as client,
        pytest.raises(openai.APIStatusError) as caught,
    ):
        client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "hi"}])
    assert caught.value.status_code == 502
    assert "127.0.0.1" not in caught.value.response.text
    assert "cannot be reached" in caught.value.response.text


def _cached(recorded: Recorded) -> dict[str, Any]:
    body = completion("cached answer")
    body["usage"] = {
        "prompt_tokens": 1200, "completion_tokens": 5, "total_tokens": 1205,
        "prompt_tokens_details": {"cached_tokens": 1024},
    }  # fmt: skip
    return body


def test_the_providers_cached_tokens_are_in_the_report_and_metrics() -> None:
    for rig in _rig(_cached):
        raw = rig.client.chat.completions.with_raw_response.create(
            model="gpt-4o", messages=[{"role": "user", "content": "hi"}]
        )
        assert report(raw)["cached_tokens"] == 1024
        metrics = httpx.get(rig.url + "/metrics").text
        assert "ctxwarden_proxy_upstream_cached_tokens_total 1024.0" in metrics
        assert "ctxwarden_proxy_upstream_prompt_tokens_total 1200.0" in metrics
        assert 'ctxwarden_proxy_requests_total{outcome="unchanged"} 1.0' in metrics
