"""LlamaIndex adapter: LlamaIndex's own FunctionAgent (its workflow, tool calling and memory
calls) with ctxwarden as ``memory=``; the model is LlamaIndex's MockFunctionCallingLLM, scripted,
which records every list of messages it is given."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
from llama_index.core.agent.workflow import FunctionAgent
from llama_index.core.llms import ChatMessage
from llama_index.core.llms.mock import MockFunctionCallingLLM
from llama_index.core.memory import BaseMemory, ChatMemoryBuffer
from llama_index.core.tools import FunctionTool

from ctxwarden import Engine, InputError
from ctxwarden.adapters.llamaindex import CtxwardenMemory, to_openai
from ctxwarden.tokens import count_messages, get_chat_format, get_tokenizer

# llama-index-workflows walks the agent with inspect.getmembers, which touches pydantic's
# deprecated ``__fields__``: LlamaIndex's warning, not ours.
pytestmark = [
    pytest.mark.filterwarnings("ignore::pydantic.warnings.PydanticDeprecatedSince20"),
    pytest.mark.filterwarnings("ignore::pydantic.warnings.PydanticDeprecatedSince211"),
]

FILLER = "meeting notes: the quarterly plan is on track and the office moves in spring"


def ticket_status(ticket: int) -> str:
    """The status of a support ticket."""
    return f"ticket {ticket} was closed yesterday"


def _count(messages: Sequence[ChatMessage]) -> int:
    tok = get_tokenizer("o200k_base")
    return count_messages(tok, get_chat_format("openai", tok), [to_openai(m) for m in messages])


@pytest.fixture
def engine() -> Iterator[Engine]:
    with Engine.open(":memory:") as opened:
        yield opened


class Script:
    """A scripted model: a tool call first, then an answer; records what it received."""

    def __init__(self) -> None:
        self.received: list[list[ChatMessage]] = []

    def __call__(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatMessage:
        from llama_index.core.base.llms.types import ToolCallBlock

        self.received.append(list(messages))
        if any(m.role.value == "tool" for m in messages):
            return ChatMessage(role="assistant", content="Ticket 42 is closed.")
        call = ToolCallBlock(tool_call_id="call_1", tool_name="ticket_status", tool_kwargs={})
        call.tool_kwargs = {"ticket": 42}
        return ChatMessage(role="assistant", blocks=[call])


def test_a_function_agent_uses_the_memory(engine: Engine) -> None:
    memory = CtxwardenMemory.from_defaults(
        engine=engine, session="s1", user="alice", model="gpt-4o", budget=400
    )
    assert isinstance(memory, BaseMemory)
    memory.put_messages(
        [
            ChatMessage(role="user", content="I opened ticket 42 about the broken badge reader"),
            ChatMessage(role="assistant", content="Noted, ticket 42."),
        ]
    )
    for turn in range(30):
        memory.put(ChatMessage(role="user", content=f"turn {turn}: {FILLER}"))
        memory.put(ChatMessage(role="assistant", content=f"ok {turn}"))
    bob = CtxwardenMemory.from_defaults(engine=engine, session="s1", user="bob")
    bob.put(ChatMessage(role="user", content="bob opened ticket 77 about the coffee machine"))

    script = Script()
    llm = MockFunctionCallingLLM(response_generator=script, is_chat_model=True)
    agent = FunctionAgent(
        tools=[FunctionTool.from_defaults(ticket_status)],
        llm=llm,
        system_prompt="You are the help desk.",
    )

    async def run() -> Any:
        return await agent.run(user_msg="what happened to my badge ticket?", memory=memory)

    result = asyncio.run(run())
    assert str(result) == "Ticket 42 is closed."
    assert len(script.received) == 2
    first, second = script.received
    # The first call: the fitted memory (system prompt, history within the budget, the
    # question last), the old ticket retrieved, nothing of bob's.
    assert first[0].role.value == "system"
    assert first[-1].content == "what happened to my badge ticket?"
    assert _count(first) <= 400 + _count([first[0]])  # the agent's system prompt on top
    text = "\n".join(m.content or "" for m in first)
    assert "badge reader" in text
    assert "ticket 77" not in text
    assert text.count(FILLER) < 30
    # The second call: the agent's scratchpad (tool call, then its result) after the memory.
    assert second[-1].role.value == "tool"
    assert "closed yesterday" in (second[-1].content or "")
    # The turn is stored once: question, tool call, tool result, answer.
    stored = memory.get_all()
    assert [m.role.value for m in stored[-4:]] == ["user", "assistant", "tool", "assistant"]
    assert to_openai(stored[-3])["tool_calls"][0]["function"]["name"] == "ticket_status"
    assert stored[-1].content == "Ticket 42 is closed."
    assert len(stored) == 62 + 4
    assert [m.content for m in bob.get_all()] == ["bob opened ticket 77 about the coffee machine"]


def test_set_and_reset_behave_as_chat_memory_buffer(engine: Engine) -> None:
    def drive(memory: BaseMemory) -> list[Any]:
        seen: list[Any] = []
        one = [ChatMessage(role="user", content="a"), ChatMessage(role="assistant", content="b")]
        memory.set(one)
        seen.append([m.content for m in memory.get_all()])
        memory.set([*one, ChatMessage(role="user", content="c")])
        seen.append([m.content for m in memory.get_all()])
        memory.set([ChatMessage(role="user", content="x")])
        seen.append([m.content for m in memory.get_all()])
        memory.put(ChatMessage(role="user", content="x"))
        seen.append([m.content for m in memory.get_all()])
        memory.reset()
        seen.append(memory.get_all())
        return seen

    ours = CtxwardenMemory.from_defaults(engine=engine, session="s", user="alice")
    other = CtxwardenMemory.from_defaults(engine=engine, session="s", user="bob")
    other.put(ChatMessage(role="user", content="bob stays"))
    assert drive(ours) == drive(ChatMemoryBuffer.from_defaults())
    assert [m.content for m in other.get_all()] == ["bob stays"]


def test_bad_arguments_name_the_field(engine: Engine) -> None:
    with pytest.raises(InputError, match="session"):
        CtxwardenMemory.from_defaults(engine=engine, session="")
    with pytest.raises(InputError, match="scope"):
        CtxwardenMemory.from_defaults(engine=engine, session="s", scope="user")
