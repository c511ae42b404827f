"""``POST /v1/messages`` and ``/v1/messages/count_tokens`` end to end: the official ``anthropic``
client -> the ctxwarden proxy (real uvicorn on loopback) -> an upstream fake written from the
published Anthropic Messages API schema (tests/agentupstream.py: llama.cpp's server does not serve
this API). Each test checks what the client got and what the upstream received.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import anthropic
import httpx
import pytest

from agentupstream import AgentUpstream, Step, stand_in_count
from ctxwarden import Engine
from ctxwarden.llm import LLMClient
from ctxwarden.llm_anthropic import AnthropicClient
from ctxwarden.models import ModelSpec
from ctxwarden.server.proxy import create_proxy_app
from ctxwarden.vocabs import FACTORS
from serving import serve

CLAUDE = "claude-sonnet-5"
WEATHER = {
    "name": "get_weather",
    "description": "The weather in a city.",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}


@dataclass
class Rig:
    upstream: AgentUpstream
    engine: Engine
    url: str
    client: anthropic.Anthropic

    def sent(self) -> list[Any]:
        return self.upstream.bodies("/v1/messages")

    def counted(self) -> list[Any]:
        return self.upstream.bodies("/v1/messages/count_tokens")

    def stored(self) -> int:
        return int(self.engine.store.stats(self.engine.config.tenant)["memories"])


def _rig(counts: bool) -> Iterator[Rig]:
    with (
        AgentUpstream(counts=counts) as upstream,
        Engine.open(":memory:") as engine,
        LLMClient(upstream.url, max_retries=0) as openai_upstream,
        AnthropicClient(upstream.url, api_key="sk-ant-upstream", max_retries=0) as claude,
        serve(create_proxy_app(engine, openai_upstream, anthropic=claude)) as url,
        anthropic.Anthropic(base_url=url, api_key="sk-agent", max_retries=0) as client,
    ):
        engine.registry.register(
            ModelSpec(
                name="claude-tiny",
                tokenizer="o200k_base",
                window=4000,
                chat_format="openai",
                max_output=256,
            )
        )
        yield Rig(upstream=upstream, engine=engine, url=url, client=client)


@pytest.fixture
def rig() -> Iterator[Rig]:
    yield from _rig(counts=True)


@pytest.fixture
def uncounted() -> Iterator[Rig]:
    yield from _rig(counts=False)


def test_tool_use_round_trip_goes_upstream_unchanged(rig: Rig) -> None:
    rig.upstream._queue.extend([Step(calls=[("get_weather", {"city": "Oslo"})]), Step("Sunny.")])
    messages: list[Any] = [{"role": "user", "content": "Weather in Oslo?"}]
    first = rig.client.messages.with_raw_response.create(
        model=CLAUDE, max_tokens=256, system="Be brief.", messages=messages, tools=[WEATHER]
    )
    reply = first.parse()
    assert reply.stop_reason == "tool_use"
    use = next(b for b in reply.content if b.type == "tool_use")
    assert (use.name, use.input) == ("get_weather", {"city": "Oslo"})
    sent = rig.sent()[0]
    assert sent["messages"] == messages
    assert sent["system"] == "Be brief."
    assert sent["tools"] == [WEATHER]
    report = json.loads(first.headers["x-ctxwarden-report"])
    assert report["unchanged"] is True
    assert any("no offline tokenizer" in note for note in report["notes"])
    # the upstream's credentials are the proxy's, never the agent's
    recorded = next(r for r in rig.upstream.requests if r.path == "/v1/messages")
    assert recorded.headers["x-api-key"] == "sk-ant-upstream"
    assert recorded.headers["anthropic-version"] == "2023-06-01"
    messages += [
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in reply.content]},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "18C, sun"}],
        },
    ]
    second = rig.client.messages.create(
        model=CLAUDE, max_tokens=256, system="Be brief.", messages=messages, tools=[WEATHER]
    )
    assert second.content[0].type == "text"
    assert second.content[0].text == "Sunny."
    assert rig.sent()[1]["messages"] == messages
    assert rig.stored() == 0


def test_stream_relays_the_events_and_the_final_message(rig: Rig) -> None:
    rig.upstream._queue.append(Step("It is sunny in Oslo.", cached=40))
    with rig.client.messages.stream(
        model=CLAUDE, max_tokens=128, messages=[{"role": "user", "content": "Weather?"}]
    ) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
        report = json.loads(stream.response.headers["x-ctxwarden-report"])
    assert report["streamed"] is True
    assert report["unchanged"] is True
    assert text == "It is sunny in Oslo."
    assert final.stop_reason == "end_turn"
    assert final.usage.cache_read_input_tokens == 40
    assert rig.sent()[0]["stream"] is True


def test_streamed_tool_use_reaches_the_client(rig: Rig) -> None:
    rig.upstream._queue.append(Step(calls=[("get_weather", {"city": "Rome"})]))
    with rig.client.messages.stream(
        model=CLAUDE,
        max_tokens=128,
        messages=[{"role": "user", "content": "Weather in Rome?"}],
        tools=[WEATHER],  # type: ignore[list-item]
    ) as stream:
        final = stream.get_final_message()
    uses = [b for b in final.content if b.type == "tool_use"]
    assert [u.input for u in uses] == [{"city": "Rome"}]


def test_cached_tokens_are_in_the_report(rig: Rig) -> None:
    rig.upstream._queue.append(Step("ok", cached=64))
    raw = rig.client.messages.with_raw_response.create(
        model=CLAUDE, max_tokens=64, messages=[{"role": "user", "content": "hi"}]
    )
    assert json.loads(raw.headers["x-ctxwarden-report"])["cached_tokens"] == 64


def test_count_tokens_asks_the_upstream(rig: Rig) -> None:
    request: dict[str, Any] = {
        "model": CLAUDE,
        "system": "Be brief.",
        "messages": [{"role": "user", "content": "How many tokens is this?"}],
    }
    counted = rig.client.messages.count_tokens(**request)
    assert counted.input_tokens == stand_in_count(request)
    assert rig.counted()[0]["messages"] == request["messages"]


def test_count_tokens_without_an_upstream_count_is_the_proxys_estimate(uncounted: Rig) -> None:
    words = "word " * 300
    counted = uncounted.client.messages.count_tokens(
        model=CLAUDE, messages=[{"role": "user", "content": words}]
    )
    # 300 o200k tokens times the registry's Claude factor, plus the message's template tokens
    factor = FACTORS["claude"]
    assert 300 * factor <= counted.input_tokens < 300 * factor + 20


def test_near_the_cap_the_upstream_count_sizes_the_cut(rig: Rig) -> None:
    rig.upstream._queue.append(Step("done"))
    messages: list[Any] = []
    for n in range(40):
        messages += [
            {"role": "user", "content": f"step {n}: " + "lorem ipsum dolor " * 10},
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": f"t{n}", "name": "run", "input": {"n": n}}],
            },
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": f"t{n}", "content": "ok"}],
            },
            {"role": "assistant", "content": f"finished step {n}"},
        ]
    messages.append({"role": "user", "content": "now summarise"})
    raw = rig.client.messages.with_raw_response.create(
        model="claude-tiny", max_tokens=256, messages=messages
    )
    sent = rig.sent()[0]["messages"]
    assert rig.counted(), "the upstream was asked to count"
    # the fitted request fits by the upstream's own count
    report = json.loads(raw.headers["x-ctxwarden-report"])
    assert stand_in_count({"messages": sent}) <= report["cap"]
    assert report["counted_by"] == "upstream"
    assert sent == messages[len(messages) - len(sent) :]
    assert sent[0]["role"] == "user"
    assert isinstance(sent[0]["content"], str)  # a turn start, not a tool result
    assert len(sent) < len(messages)


def test_session_memory_is_one_user_message_first(rig: Rig) -> None:
    rig.upstream._queue.extend([Step("Noted."), Step("Miso."), Step("?")])
    first = [{"role": "user", "content": "My cat is called Miso and likes tuna."}]
    rig.client.messages.create(
        model=CLAUDE, max_tokens=64, messages=first, metadata={"user_id": "alice-77"}
    )
    later = [{"role": "user", "content": "What is my cat called?"}]
    rig.client.messages.create(
        model=CLAUDE, max_tokens=64, messages=later, metadata={"user_id": "alice-77"}
    )
    sent = rig.sent()[1]["messages"]
    assert sent[1:] == later
    assert sent[0]["role"] == "user"
    assert "Miso" in sent[0]["content"][0]["text"]
    rig.client.messages.create(
        model=CLAUDE, max_tokens=64, messages=later, metadata={"user_id": "bob-88"}
    )
    assert rig.sent()[2]["messages"] == later


@pytest.mark.parametrize(
    ("messages", "field"),
    [
        (
            [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "x"}]}],
            "messages[0].content[0].tool_use_id",
        ),
        ([{"role": "system", "content": "hi"}], "messages[0].role"),
        ([{"role": "user", "content": [{"type": "hologram"}]}], "messages[0].content[0].type"),
        (
            [
                {"role": "user", "content": "go"},
                {
                    "role": "assistant",
                    "content": [{"type": "tool_use", "id": "t1", "name": "f", "input": {}}],
                },
                {"role": "user", "content": "and?"},
            ],
            "messages[1].content[0].id",
        ),
        ([], "messages"),
    ],
)
def test_bad_requests_are_refused_naming_the_field(
    rig: Rig, messages: list[Any], field: str
) -> None:
    with pytest.raises(anthropic.BadRequestError) as caught:
        rig.client.messages.create(
            model=CLAUDE, max_tokens=64, messages=messages, metadata={"user_id": "alice"}
        )
    body = caught.value.body
    assert isinstance(body, dict)
    assert body["type"] == "error"
    assert body["error"]["type"] == "invalid_request_error"
    assert body["error"]["message"].startswith(f"{field}: ")
    assert rig.sent() == []
    assert rig.stored() == 0


def test_redirect_fields_are_refused(rig: Rig) -> None:
    answer = httpx.post(
        rig.url + "/v1/messages",
        json={
            "model": CLAUDE,
            "max_tokens": 5,
            "base_url": "http://evil.example",
            "messages": [{"role": "user", "content": "hi"}],
        },
    )
    assert answer.status_code == 400
    assert "base_url" in answer.json()["error"]["message"]
    assert rig.sent() == []


def test_upstream_errors_pass_through_with_their_status(rig: Rig) -> None:
    rig.upstream._queue.append(Step(status=400, error="max_tokens: too large"))
    with pytest.raises(anthropic.BadRequestError) as caught:
        rig.client.messages.create(
            model=CLAUDE, max_tokens=64, messages=[{"role": "user", "content": "hi"}]
        )
    assert "max_tokens: too large" in str(caught.value)


def test_without_an_anthropic_upstream_messages_is_not_found() -> None:
    with (
        Engine.open(":memory:") as engine,
        LLMClient("http://127.0.0.1:9/v1", max_retries=0) as upstream,
        serve(create_proxy_app(engine, upstream)) as url,
        anthropic.Anthropic(base_url=url, api_key="k", max_retries=0) as client,
        pytest.raises(anthropic.NotFoundError) as caught,
    ):
        client.messages.create(
            model=CLAUDE, max_tokens=5, messages=[{"role": "user", "content": "hi"}]
        )
    assert "--anthropic-upstream" in str(caught.value)


def test_langchain_chat_anthropic(rig: Rig) -> None:
    from langchain_anthropic import ChatAnthropic

    rig.upstream._queue.append(Step("Bonjour."))
    chat = ChatAnthropic(  # type: ignore[call-arg]
        model=CLAUDE, base_url=rig.url, api_key="sk-agent", max_retries=0, max_tokens=64
    )
    answer = chat.invoke("Say hello in French.")
    assert answer.text == "Bonjour."
    assert rig.sent()[0]["messages"][-1]["content"] in (
        "Say hello in French.",
        [{"type": "text", "text": "Say hello in French."}],
    )


def test_an_upstream_error_on_a_stream_keeps_its_status_and_shape(rig: Rig) -> None:
    rig.upstream._queue.append(Step(status=429, error="slow down"))
    with (
        pytest.raises(anthropic.RateLimitError) as caught,
        rig.client.messages.stream(
            model=CLAUDE, max_tokens=16, messages=[{"role": "user", "content": "hi"}]
        ) as stream,
    ):
        stream.get_final_message()
    body = caught.value.body
    assert isinstance(body, dict)
    assert body["error"]["type"] == "rate_limit_error"
    assert "slow down" in body["error"]["message"]


def test_x_api_key_authenticates_and_tenants_stay_apart() -> None:
    from ctxwarden.errors import AuthError
    from ctxwarden.server.http import Principal, ServerConfig
    from ctxwarden.server.proxy import ProxyConfig

    def authenticate(token: str | None) -> Principal:
        if token in ("key-a", "key-b"):
            return Principal(tenant=token[-1], scopes=frozenset({"read", "write"}))
        raise AuthError("unknown API key")

    config = ProxyConfig(server=ServerConfig(authenticate=authenticate))
    with (
        AgentUpstream(Step("noted") for _ in range(4)) as upstream,
        Engine.open(":memory:") as engine,
        LLMClient(upstream.url, max_retries=0) as openai_upstream,
        AnthropicClient(upstream.url, api_key="sk-ant-upstream", max_retries=0) as claude,
        serve(create_proxy_app(engine, openai_upstream, config, anthropic=claude)) as url,
    ):
        for key in ("key-a", "key-b"):
            with anthropic.Anthropic(base_url=url, api_key=key, max_retries=0) as client:
                client.messages.create(
                    model=CLAUDE,
                    max_tokens=16,
                    metadata={"user_id": "same-user"},
                    messages=[{"role": "user", "content": f"my tenant canary is TENANT{key}"}],
                )
        with anthropic.Anthropic(base_url=url, api_key="key-b", max_retries=0) as client:
            client.messages.create(
                model=CLAUDE,
                max_tokens=16,
                metadata={"user_id": "same-user"},
                messages=[{"role": "user", "content": "what is my tenant canary?"}],
            )
        sent = json.dumps(upstream.bodies("/v1/messages")[-1])
        assert "TENANTkey-b" in sent
        assert "TENANTkey-a" not in sent
        with (
            anthropic.Anthropic(base_url=url, api_key="wrong", max_retries=0) as client,
            pytest.raises(anthropic.AuthenticationError) as caught,
        ):
            client.messages.create(
                model=CLAUDE, max_tokens=16, messages=[{"role": "user", "content": "hi"}]
            )
        body = caught.value.body
        assert isinstance(body, dict)
        assert body["error"]["type"] == "authentication_error"


def test_beta_requests_as_claude_code_sends_them(rig: Rig) -> None:
    """Claude Code posts to /v1/messages?beta=true with anthropic-beta flags."""
    rig.upstream._queue.append(Step("ok"))
    reply = rig.client.beta.messages.create(
        model=CLAUDE,
        max_tokens=16,
        messages=[{"role": "user", "content": "hi"}],
        betas=["interleaved-thinking-2025-05-14"],
    )
    assert reply.content[0].type == "text"
    recorded = next(r for r in rig.upstream.requests if r.path == "/v1/messages")
    assert recorded.headers["anthropic-beta"] == "interleaved-thinking-2025-05-14"
    counted = rig.client.beta.messages.count_tokens(
        model=CLAUDE, messages=[{"role": "user", "content": "hi"}]
    )
    assert counted.input_tokens > 0


def test_an_upstream_that_cannot_count_is_asked_once_then_the_margin_is_used(
    uncounted: Rig,
) -> None:
    uncounted.upstream._queue.extend([Step("a"), Step("b")])
    messages: list[Any] = []
    for n in range(100):
        messages += [
            {"role": "user", "content": f"question {n}: " + "lorem ipsum " * 20},
            {"role": "assistant", "content": f"answer {n}"},
        ]
    messages.append({"role": "user", "content": "and now?"})
    for _ in range(2):
        raw = uncounted.client.messages.with_raw_response.create(
            model="claude-tiny", max_tokens=256, messages=messages
        )
        report = json.loads(raw.headers["x-ctxwarden-report"])
        assert "counted_by" not in report
        assert report["unchanged"] is False
        assert report["tokens"] <= report["cap"]
    assert len(uncounted.counted()) == 1  # the 404 is remembered
    sent = uncounted.sent()[-1]["messages"]
    assert sent[-1] == messages[-1]
    assert sent == messages[len(messages) - len(sent) :]


def test_a_window_header_names_the_window_of_any_model(rig: Rig) -> None:
    rig.upstream._queue.append(Step("ok"))
    messages: list[Any] = []
    for n in range(40):
        messages += [
            {"role": "user", "content": f"question {n}: " + "lorem ipsum " * 20},
            {"role": "assistant", "content": f"answer {n}"},
        ]
    messages.append({"role": "user", "content": "and now?"})
    raw = rig.client.messages.with_raw_response.create(
        model="claude-sonnet-5",
        max_tokens=256,
        messages=messages,
        extra_headers={"X-Ctxwarden-Window": "3000"},
    )
    report = json.loads(raw.headers["x-ctxwarden-report"])
    assert report["window"] == 3000
    assert report["window_source"] == "header"
    assert report["unchanged"] is False
    assert stand_in_count({"messages": rig.sent()[0]["messages"]}) <= report["cap"]
