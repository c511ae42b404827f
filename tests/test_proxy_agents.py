"""Real agent clients through the chat-completions proxy: the OpenAI Agents SDK with its
chat-completions model class (issue 16, reproduction 3) and LangChain's ``ChatOpenAI``, against
our proxy (uvicorn on loopback) and a scripted OpenAI-compatible upstream (a real HTTP server)."""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import Iterator
from typing import Any

import pytest

from ctxwarden import Engine
from ctxwarden.llm import LLMClient
from ctxwarden.server.chatfit import validate_messages
from ctxwarden.server.proxy import ProxyConfig, create_proxy_app
from llmserver import Recorded, Reply, ScriptedServer, completion
from serving import serve


def _tool_call(id: str, city: str) -> dict[str, Any]:
    arguments = json.dumps({"city": city})
    return {
        "id": id,
        "type": "function",
        "function": {"name": "get_weather", "arguments": arguments},
    }


def _script(recorded: Recorded) -> Reply:
    """Call the tool once per city still missing a result, then answer."""
    if not recorded.path.endswith("/chat/completions"):
        return Reply(status=404, body={})
    messages = recorded.body["messages"]
    done = [m for m in messages if m["role"] == "tool"]
    cities = ["Oslo", "Rome", "Lima"]
    if len(done) < len(cities):
        call = _tool_call(f"call_{len(done)}", cities[len(done)])
        return Reply(body=completion(None, finish_reason="tool_calls", tool_calls=[call]))
    return Reply(body=completion("Oslo is sunny, Rome is warm, Lima is grey."))


@pytest.fixture
def proxy() -> Iterator[tuple[str, ScriptedServer]]:
    with (
        ScriptedServer(_script) as upstream,
        Engine.open(":memory:") as engine,
        LLMClient(upstream.url, max_retries=0) as llm,
        serve(create_proxy_app(engine, llm, ProxyConfig())) as url,
    ):
        yield url, upstream


def test_agents_sdk_chat_completions_model_runs_the_tool_as_often_as_asked(
    proxy: tuple[str, ScriptedServer],
) -> None:
    """Reproduction 3: the question stayed behind the tool results and the run ended in
    MaxTurnsExceeded; now the conversation goes upstream as the SDK sent it."""
    import agents
    import openai

    url, upstream = proxy
    seen: list[str] = []

    @agents.function_tool
    def get_weather(city: str) -> str:
        """The weather in a city."""
        seen.append(city)
        return f"weather in {city}: fine"

    async def run() -> Any:
        async with openai.AsyncOpenAI(
            base_url=url + "/v1", api_key="sk-agent", max_retries=0,
            default_headers={"X-Ctxwarden-Session": "agent-run-1"},
        ) as client:  # fmt: skip
            model = agents.OpenAIChatCompletionsModel(model="gpt-4o", openai_client=client)
            agent = agents.Agent(
                name="weather",
                instructions="Use the tool for every city.",
                tools=[get_weather],
                model=model,
            )
            return await agents.Runner.run(
                agent,
                "Weather in Oslo, Rome and Lima?",
                max_turns=6,
                run_config=agents.RunConfig(tracing_disabled=True),
            )

    result = asyncio.run(run())
    assert result.final_output == "Oslo is sunny, Rome is warm, Lima is grey."
    assert seen == ["Oslo", "Rome", "Lima"]
    sent = [r.body["messages"] for r in upstream.chat_requests()]
    assert len(sent) == 4
    last = sent[-1]
    validate_messages(last)
    assert last[0]["role"] == "system"
    assert last[1] == {"role": "user", "content": "Weather in Oslo, Rome and Lima?"}
    assert [m["role"] for m in last[2:]] == ["assistant", "tool"] * 3
    # each request is the previous one plus what happened since: a prefix the cache keeps
    for before, after in itertools.pairwise(sent):
        assert after[: len(before)] == before


def test_langchain_chat_openai_through_the_proxy(proxy: tuple[str, ScriptedServer]) -> None:
    from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage
    from langchain_openai import ChatOpenAI

    url, upstream = proxy
    chat = ChatOpenAI(
        model="gpt-4o", base_url=url + "/v1", api_key="sk-agent",  # type: ignore[arg-type]
        max_retries=0, default_headers={"X-Ctxwarden-User": "lc-user"},
    )  # fmt: skip
    history = [
        SystemMessage("You are brief."),
        HumanMessage("Weather in Oslo, Rome and Lima?"),
        AIMessage(
            "", tool_calls=[{"id": "call_0", "name": "get_weather", "args": {"city": "Oslo"}}]
        ),
        ToolMessage("sunny", tool_call_id="call_0"),
        AIMessage(
            "", tool_calls=[{"id": "call_1", "name": "get_weather", "args": {"city": "Rome"}}]
        ),
        ToolMessage("warm", tool_call_id="call_1"),
        AIMessage(
            "", tool_calls=[{"id": "call_2", "name": "get_weather", "args": {"city": "Lima"}}]
        ),
        ToolMessage("grey", tool_call_id="call_2"),
    ]
    answer = chat.invoke(history)
    assert answer.text == "Oslo is sunny, Rome is warm, Lima is grey."
    sent = upstream.chat_requests()[-1].body["messages"]
    assert [m["role"] for m in sent] == ["system", "user"] + ["assistant", "tool"] * 3
    assert sent[1]["content"] == "Weather in Oslo, Rome and Lima?"
