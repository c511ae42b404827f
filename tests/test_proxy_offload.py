"""Tool-result offloading in the proxy: the official ``openai`` client -> our proxy (uvicorn on
loopback) -> a scripted upstream. Off by default (a conversation is sent as is); with
``offload_tokens`` a large tool result goes upstream as a preview naming a memory that
``Engine.expand`` gives back, the same preview on every turn."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from ctxwarden import ConfigError, Engine, NotFound
from ctxwarden.llm import LLMClient
from ctxwarden.server.proxy import ProxyConfig, create_proxy_app
from llmserver import ScriptedServer
from serving import serve

SESSION = {"X-Ctxwarden-Session": "agent-1"}
BIG = "\n".join(f"{i:04d} src/module_{i}.py: def handler_{i}(request): ..." for i in range(400))


def _conversation() -> list[dict[str, Any]]:
    return [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": "find the handlers"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function",
             "function": {"name": "grep", "arguments": '{"pattern": "def handler"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": BIG},
    ]  # fmt: skip


@pytest.fixture
def rig(request: pytest.FixtureRequest) -> Iterator[tuple[ScriptedServer, Engine, openai.OpenAI]]:
    config: ProxyConfig = getattr(request, "param", ProxyConfig(probe_window=False))
    with (
        ScriptedServer(["ok"] * 6) as upstream,
        Engine.open(":memory:") as engine,
        LLMClient(upstream.url, api_key="sk-up", max_retries=0, timeout=5) as llm,
        serve(create_proxy_app(engine, llm, config)) as url,
        openai.OpenAI(base_url=url + "/v1", api_key="sk-agent", max_retries=0) as client,
    ):
        yield upstream, engine, client


OFFLOAD = ProxyConfig(probe_window=False, offload_tokens=500, offload_preview_chars=120)


def _sent(upstream: ScriptedServer, index: int = -1) -> list[dict[str, Any]]:
    body = upstream.chat_requests()[index].body
    assert isinstance(body, dict)
    return list(body["messages"])


def _ask(client: openai.OpenAI, messages: list[dict[str, Any]], **headers: str) -> Any:
    return client.chat.completions.with_raw_response.create(
        model="gpt-4o",
        messages=messages,  # type: ignore[arg-type]
        extra_headers=headers or None,
    )


def test_off_by_default_a_large_tool_result_goes_as_sent(rig: Any) -> None:
    upstream, _engine, client = rig
    messages = _conversation()
    raw = _ask(client, messages, **SESSION)
    assert _sent(upstream) == messages
    assert "offloaded" not in json.loads(raw.headers["x-ctxwarden-report"])


@pytest.mark.parametrize("rig", [OFFLOAD], indirect=True)
def test_a_large_tool_result_becomes_the_same_preview_on_every_turn(rig: Any) -> None:
    upstream, engine, client = rig
    messages = _conversation()
    raw = _ask(client, messages, **SESSION)
    report = json.loads(raw.headers["x-ctxwarden-report"])
    (id,) = report["offloaded"]
    sent = _sent(upstream)
    assert sent[:3] == messages[:3]
    assert sent[3]["tool_call_id"] == "c1"
    assert sent[3]["content"].startswith(f"[offloaded tool result {id}: ")
    assert BIG[:100] in sent[3]["content"]
    assert len(sent[3]["content"]) < 400
    (memory,) = engine.expand(id, session="agent-1")
    assert memory.content == BIG
    assert memory.role == "tool"
    with pytest.raises(NotFound):
        engine.expand(id, session="agent-2")
    # the next turn: the same prefix, byte for byte (prompt caches keep hitting)
    messages += [
        {"role": "assistant", "content": "found 400 handlers"},
        {"role": "user", "content": "which one is slow?"},
    ]
    raw = _ask(client, messages, **SESSION)
    again = _sent(upstream)
    assert json.dumps(again[:4]) == json.dumps(sent)
    assert again[4:] == messages[4:]
    assert json.loads(raw.headers["x-ctxwarden-report"])["offloaded"] == [id]
    # the transcript holds the preview; the original lives once, under its id
    copies = [m for m in engine.store.iter_memories("default") if m.content == BIG]
    assert [m.id for m in copies] == [id]


@pytest.mark.parametrize("rig", [OFFLOAD], indirect=True)
def test_a_request_naming_nobody_or_with_small_results_is_sent_unchanged(rig: Any) -> None:
    upstream, _engine, client = rig
    messages = _conversation()
    _ask(client, messages)  # no user, no session: nothing is stored, so nothing is offloaded
    assert _sent(upstream) == messages
    small = [*messages[:3], {"role": "tool", "tool_call_id": "c1", "content": "3 matches"}]
    _ask(client, small, **SESSION)
    assert _sent(upstream) == small


@pytest.mark.parametrize(
    ("field", "value"),
    [("offload_tokens", 0), ("offload_tokens", True), ("offload_preview_chars", -1)],
)
def test_config_errors_name_the_field(field: str, value: Any) -> None:
    with pytest.raises(ConfigError, match=field):
        ProxyConfig(**{field: value})
