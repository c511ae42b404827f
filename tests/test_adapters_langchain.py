"""LangChain adapter: a real LangChain chain (prompt | trimmer | ChatOpenAI) with its history in
ctxwarden, driven against a scripted OpenAI-compatible server on loopback; the test reads what
the model received off the wire."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from langchain_core.chat_history import BaseChatMessageHistory
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.prompts import ChatPromptTemplate, MessagesPlaceholder
from langchain_core.runnables.history import RunnableWithMessageHistory
from langchain_openai import ChatOpenAI

from ctxwarden import Engine, InputError
from ctxwarden.adapters.langchain import CtxwardenChatMessageHistory, CtxwardenTrimmer
from ctxwarden.tokens import count_messages, get_chat_format, get_tokenizer
from llmserver import ScriptedServer

FILLER = (
    "we talked about the weather, the train timetable, lunch options near the office and "
    "whether the printer on the third floor works again"
)


def _count(messages: list[dict[str, Any]]) -> int:
    tok = get_tokenizer("o200k_base")
    return count_messages(tok, get_chat_format("openai", tok), messages)


@pytest.fixture
def engine() -> Iterator[Engine]:
    with Engine.open(":memory:") as opened:
        yield opened


def _seed(engine: Engine) -> None:
    alice = CtxwardenChatMessageHistory(engine, session="s1", user="alice")
    alice.add_messages([HumanMessage("my locker code is 4471, please remember it")])
    alice.add_messages([AIMessage("Noted: locker code 4471.")])
    for turn in range(40):
        alice.add_messages([HumanMessage(f"turn {turn}: {FILLER}"), AIMessage(f"ok {turn}")])
    bob = CtxwardenChatMessageHistory(engine, session="s1", user="bob")
    bob.add_messages([HumanMessage("my locker code is 9902, bob's secret")])


# Deprecated in langchain-core 1.x in favour of LangGraph persistence, and still where
# BaseChatMessageHistory is used: the LangGraph test covers the newer way.
@pytest.mark.filterwarnings("ignore:RunnableWithMessageHistory is deprecated")
def test_a_chain_with_history_and_trimmer_sends_an_exact_budget(engine: Engine) -> None:
    _seed(engine)
    trimmer = CtxwardenTrimmer(
        engine, session="s1", user="alice", max_tokens=400, model="gpt-4o", remember=False
    )
    prompt = ChatPromptTemplate.from_messages(
        [
            ("system", "You are a helpful assistant."),
            MessagesPlaceholder("history"),
            ("human", "{question}"),
        ]
    )
    with ScriptedServer(["Your locker code is 4471."]) as server:
        model = ChatOpenAI(model="gpt-4o", base_url=server.url, api_key="sk-test", max_retries=0)
        chain = RunnableWithMessageHistory(
            prompt | trimmer | model,
            lambda session_id: CtxwardenChatMessageHistory(
                engine, session=session_id, user="alice"
            ),
            input_messages_key="question",
            history_messages_key="history",
        )
        answer = chain.invoke(
            {"question": "what is my locker code?"},
            config={"configurable": {"session_id": "s1"}},
        )
        sent = server.chat_requests()[0].body["messages"]
    assert answer.content == "Your locker code is 4471."
    # What the model received: within the budget by the real tokenizer, system first, the
    # question last, the old locker-code turn retrieved as related memory, nothing of bob's.
    assert _count(sent) <= 400
    assert trimmer.last_context is not None
    assert _count(sent) == trimmer.last_context.tokens
    assert sent[0] == {"role": "system", "content": "You are a helpful assistant."}
    assert sent[-1] == {"role": "user", "content": "what is my locker code?"}
    text = "\n".join(str(m["content"]) for m in sent)
    assert "4471" in text
    assert "9902" not in text
    assert "bob" not in text
    assert "turn 39" in text  # the newest history is kept
    assert text.count(FILLER) < 40  # not all of the history fits: the budget is real
    # The history now holds the question and the answer once each (the trimmer and the
    # history did not both store the question).
    stored = CtxwardenChatMessageHistory(engine, session="s1", user="alice").messages
    assert [m.content for m in stored[-2:]] == [
        "what is my locker code?",
        "Your locker code is 4471.",
    ]
    assert sum(m.content == "what is my locker code?" for m in stored) == 1
    assert len(stored) == 2 + 80 + 2


def test_the_trimmer_keeps_tool_calls_with_their_results(engine: Engine) -> None:
    trimmer = CtxwardenTrimmer(engine, session="tools", max_tokens=120, model="gpt-4o")
    messages = [SystemMessage("sys")]
    for turn in range(12):
        messages += [
            HumanMessage(f"weather {turn}?"),
            AIMessage("", tool_calls=[{"id": f"c{turn}", "name": "weather", "args": {"n": turn}}]),
            ToolMessage(f"sunny {turn} " + FILLER, tool_call_id=f"c{turn}"),
            AIMessage(f"it is sunny {turn}"),
        ]
    messages.append(HumanMessage("and tomorrow?"))
    fitted = trimmer.invoke(messages)
    assert isinstance(fitted[0], SystemMessage)
    assert fitted[-1].content == "and tomorrow?"
    calls = {c["id"] for m in fitted if isinstance(m, AIMessage) for c in m.tool_calls}
    results = {m.tool_call_id for m in fitted if isinstance(m, ToolMessage)}
    assert calls  # no call without its result, no orphan result
    assert calls == results
    assert len(fitted) < len(messages)
    # Sent again, nothing new is stored.
    before = len(CtxwardenChatMessageHistory(engine, session="tools").messages)
    trimmer.invoke(messages)
    assert len(CtxwardenChatMessageHistory(engine, session="tools").messages) == before == 48 + 1


def test_history_reads_and_clears_only_its_own_scope(engine: Engine) -> None:
    _seed(engine)
    alice = CtxwardenChatMessageHistory(engine, session="s1", user="alice")
    bob = CtxwardenChatMessageHistory(engine, session="s1", user="bob")
    other = CtxwardenChatMessageHistory(engine, session="s2", user="alice")
    assert isinstance(alice, BaseChatMessageHistory)
    assert all("9902" not in str(m.content) for m in alice.messages)
    assert [m.content for m in bob.messages] == ["my locker code is 9902, bob's secret"]
    assert other.messages == []
    bob.clear()
    assert bob.messages == []
    assert len(alice.messages) == 82
    fitted = alice.fitted(budget=200, model="gpt-4o")
    assert _count(_openai(fitted)) <= 200


def _openai(messages: list[Any]) -> list[dict[str, Any]]:
    from ctxwarden.adapters.langchain import to_openai

    return to_openai(messages)


def test_bad_names_are_refused_naming_the_field(engine: Engine) -> None:
    with pytest.raises(InputError, match="user"):
        CtxwardenChatMessageHistory(engine, session="s1", user="")
    with pytest.raises(InputError, match="budget"):
        CtxwardenTrimmer(engine, session="s1", max_tokens=0)
    history = CtxwardenChatMessageHistory(engine, session="s1")
    history.add_messages([HumanMessage("kept")])
    with pytest.raises(InputError, match="role"):
        history.conversation.add(
            [{"role": "user", "content": "a"}, {"role": "robot", "content": "b"}]
        )
    assert [m.content for m in history.messages] == ["kept"]
