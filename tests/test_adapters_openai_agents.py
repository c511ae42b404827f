"""OpenAI Agents SDK adapter: the SDK's own Runner with a real tool loop, its Chat Completions
model over the official openai client, against a scripted server on loopback."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from agents import Agent, RunConfig, Runner, function_tool
from agents.memory import SQLiteSession
from agents.models.openai_chatcompletions import OpenAIChatCompletionsModel
from openai import AsyncOpenAI

from ctxwarden import Engine
from ctxwarden.adapters.openai_agents import CtxwardenSession
from ctxwarden.tokens import count_messages, get_chat_format, get_tokenizer
from llmserver import ScriptedServer, completion

FILLER = "notes on the weekly sync: the build is green, the release train leaves on thursday"


@function_tool
def order_status(order_id: str) -> str:
    """Look an order up."""
    return f"order {order_id} shipped on monday"


def _count(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> int:
    tok = get_tokenizer("o200k_base")
    return count_messages(tok, get_chat_format("openai", tok), messages, tools)


@pytest.fixture
def engine() -> Iterator[Engine]:
    with Engine.open(":memory:") as opened:
        yield opened


def _seed(engine: Engine) -> None:
    alice = CtxwardenSession("s1", engine, user="alice")
    items: list[Any] = [{"role": "user", "content": "my order number is A-7731"}]
    items.append({"role": "assistant", "content": "Thanks, I noted order A-7731."})
    for turn in range(30):
        items += [
            {"role": "user", "content": f"turn {turn}: {FILLER}"},
            {"role": "assistant", "content": f"ok {turn}"},
        ]
    asyncio.run(alice.add_items(items))
    bob = CtxwardenSession("s1", engine, user="bob")
    asyncio.run(bob.add_items([{"role": "user", "content": "bob's order is Z-0001"}]))


def test_a_runner_with_a_tool_loop_gets_fitted_input(engine: Engine) -> None:
    _seed(engine)
    session = CtxwardenSession("s1", engine, user="alice", model="gpt-4o", budget=500)
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "order_status", "arguments": '{"order_id": "A-7731"}'},
    }
    script = [completion(None, tool_calls=[call], finish_reason="tool_calls"), "It shipped."]
    with ScriptedServer(script) as server:

        async def run() -> Any:
            async with AsyncOpenAI(base_url=server.url, api_key="sk-test", max_retries=0) as client:
                agent = Agent(
                    name="support",
                    instructions="You help with orders.",
                    tools=[order_status],
                    model=OpenAIChatCompletionsModel(model="gpt-4o", openai_client=client),
                )
                config = RunConfig(
                    tracing_disabled=True, call_model_input_filter=session.fit_model_input
                )
                return await Runner.run(
                    agent, "where is my order?", session=session, run_config=config
                )

        result = asyncio.run(run())
        first, second = (r.body for r in server.chat_requests())
    assert result.final_output == "It shipped."
    for body in (first, second):
        sent = body["messages"]
        assert sent[0] == {"role": "system", "content": "You help with orders."}
        assert _count(sent, body["tools"]) <= 500 + _count([], body["tools"])
        text = "\n".join(str(m.get("content")) for m in sent)
        assert "A-7731" in text  # the order number, 60 turns back, retrieved or kept
        assert "Z-0001" not in text  # bob's, same session name, another user
        assert text.count(FILLER) < 30  # the budget is real: not all of the history fits
    assert first["messages"][-1] == {"role": "user", "content": "where is my order?"}
    # Within the turn, the tool result is last, right after its call.
    assert second["messages"][-1]["role"] == "tool"
    assert second["messages"][-1]["content"] == "order A-7731 shipped on monday"
    assert second["messages"][-2]["tool_calls"][0]["id"] == "call_1"
    # The session holds the turn once: question, call, output, answer.
    items = asyncio.run(session.get_items(limit=4))
    assert items[0] == {"role": "user", "content": "where is my order?"}
    assert items[1]["type"] == "function_call"
    assert items[1]["call_id"] == "call_1"
    assert items[2]["type"] == "function_call_output"
    assert items[3]["role"] == "assistant"
    everything = asyncio.run(session.get_items())
    assert len(everything) == 62 + 4
    assert sum(i.get("content") == "where is my order?" for i in everything) == 1


def test_the_session_protocol_matches_sqlite_session(engine: Engine, tmp_path: Any) -> None:
    """The same calls on the SDK's reference SQLiteSession and on ours give the same items."""
    items: list[Any] = [
        {"role": "user", "content": "hi"},
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "42"},
        {"role": "user", "content": "hi"},
    ]

    async def drive(session: Any) -> list[Any]:
        seen: list[Any] = []
        await session.add_items(items)
        seen.append(await session.get_items())
        seen.append(await session.get_items(limit=2))
        seen.append(await session.pop_item())
        seen.append(await session.get_items())
        await session.clear_session()
        seen.append(await session.get_items())
        seen.append(await session.pop_item())
        return seen

    reference = SQLiteSession("s", str(tmp_path / "ref.db"))
    ours = CtxwardenSession("s", engine, user="alice")
    other = CtxwardenSession("s", engine, user="bob")
    asyncio.run(other.add_items([{"role": "user", "content": "bob stays"}]))
    assert asyncio.run(drive(ours)) == asyncio.run(drive(reference))
    reference.close()
    assert asyncio.run(other.get_items()) == [{"role": "user", "content": "bob stays"}]
