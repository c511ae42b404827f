"""LangGraph adapter: LangGraph's prebuilt ReAct agent (a real graph with a checkpointer, a tool
node and our store) calling ChatOpenAI against a scripted server on loopback; the test reads what
the model received off the wire and what the tools wrote to the store."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.config import get_store
from langgraph.prebuilt import create_react_agent
from langgraph.store.base import BaseStore
from langgraph.store.memory import InMemoryStore

from ctxwarden import Engine, InputError
from ctxwarden.adapters.conversation import Conversation
from ctxwarden.adapters.langgraph import CtxwardenHooks, CtxwardenStore, pre_model_hook
from ctxwarden.tokens import count_messages, get_chat_format, get_tokenizer
from llmserver import ScriptedServer, completion

FILLER = "standup notes: the deploy went fine, two reviews are pending, lunch is at noon"
SYSTEM = "You are a personal assistant."


@tool
def save_preference(topic: str, value: str) -> str:
    """Save a preference of the user."""
    store = get_store()
    store.put(("prefs",), topic, {"value": value})
    return f"saved {topic}"


def _count(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> int:
    tok = get_tokenizer("o200k_base")
    return count_messages(tok, get_chat_format("openai", tok), messages, tools or [])


@pytest.fixture
def engine() -> Iterator[Engine]:
    with Engine.open(":memory:") as opened:
        yield opened


# create_react_agent moved to langchain.agents.create_agent in LangGraph 1.0 (a package this
# project does not depend on); langgraph-prebuilt still ships it and people still use it.
@pytest.mark.filterwarnings("ignore:create_react_agent has been moved")
def test_a_react_agent_with_hook_and_store(engine: Engine) -> None:
    alice = Conversation(engine, session="t1", user="alice")
    alice.add(
        [
            {"role": "user", "content": "my dog is called Biscuit"},
            {"role": "assistant", "content": "What a nice name for a dog."},
        ]
    )
    for turn in range(30):
        alice.add(
            [
                {"role": "user", "content": f"turn {turn}: {FILLER}"},
                {"role": "assistant", "content": f"ok {turn}"},
            ]
        )
    Conversation(engine, session="t1", user="bob").add(
        [{"role": "user", "content": "my dog is called Rex"}]
    )
    store = CtxwardenStore(engine, user="alice")
    hooks = CtxwardenHooks(
        engine, user="alice", max_tokens=450, model="gpt-4o", system=SYSTEM, tools=[save_preference]
    )
    call = {
        "id": "call_1",
        "type": "function",
        "function": {
            "name": "save_preference",
            "arguments": '{"topic": "food", "value": "ramen"}',
        },
    }
    script = [
        completion(None, tool_calls=[call], finish_reason="tool_calls"),
        "Saved: you like ramen.",
        "Your dog is called Biscuit.",
    ]
    with ScriptedServer(script) as server:
        model = ChatOpenAI(model="gpt-4o", base_url=server.url, api_key="sk-test", max_retries=0)
        agent = create_react_agent(
            model,
            [save_preference],
            pre_model_hook=hooks.pre,
            post_model_hook=hooks.post,
            checkpointer=InMemorySaver(),
            store=store,
        )
        config: Any = {"configurable": {"thread_id": "t1"}}
        first = agent.invoke({"messages": [("user", "remember that I like ramen")]}, config)
        second = agent.invoke({"messages": [("user", "what is my dog called?")]}, config)
        bodies = [r.body for r in server.chat_requests()]
    assert first["messages"][-1].content == "Saved: you like ramen."
    assert second["messages"][-1].content == "Your dog is called Biscuit."
    assert len(bodies) == 3
    for body in bodies:
        sent = body["messages"]
        assert sent[0] == {"role": "system", "content": SYSTEM}
        assert _count(sent, body.get("tools")) <= 450
        text = "\n".join(str(m.get("content")) for m in sent)
        assert "Rex" not in text  # bob's, in a session of the same name
        assert text.count(FILLER) < 30  # the budget is real
    assert bodies[0]["messages"][-1] == {"role": "user", "content": "remember that I like ramen"}
    # the second call of the first turn: the tool result last, after its call
    assert bodies[1]["messages"][-1]["role"] == "tool"
    assert bodies[1]["messages"][-1]["content"] == "saved food"
    assert bodies[1]["messages"][-2]["tool_calls"][0]["id"] == "call_1"
    # the second turn: the old fact, 62 messages back, is there; the question is last
    assert "Biscuit" in "\n".join(str(m.get("content")) for m in bodies[2]["messages"])
    assert bodies[2]["messages"][-1] == {"role": "user", "content": "what is my dog called?"}
    # The tool wrote through the graph's store, into alice's scope only.
    saved = store.get(("prefs",), "food")
    assert saved is not None
    assert saved.value == {"value": "ramen"}
    assert CtxwardenStore(engine, user="bob").get(("prefs",), "food") is None
    # Each message of the thread is stored once (the hook sees the whole state every call).
    contents = [m["content"] for m in alice.messages()]
    assert contents.count("remember that I like ramen") == 1
    assert contents[-1] == "Your dog is called Biscuit."
    assert len(contents) == 62 + 4 + 2


def _drive(store: BaseStore) -> list[Any]:
    """The same calls on any BaseStore; what they return, comparable across stores."""
    seen: list[Any] = []
    store.put(("users", "prefs"), "food", {"likes": "ramen", "spicy": True})
    store.put(("users", "prefs"), "drink", {"likes": "tea", "spicy": False})
    store.put(("users", "work"), "job", {"role": "engineer"})
    store.put(("users", "prefs"), "food", {"likes": "sushi", "spicy": False})
    got = store.get(("users", "prefs"), "food")
    seen.append(None if got is None else (got.namespace, got.key, got.value))
    seen.append(store.get(("users", "prefs"), "nothing"))
    listed = store.search(("users",), limit=10)
    seen.append(sorted((i.namespace, i.key) for i in listed))
    filtered = store.search(("users", "prefs"), filter={"spicy": False})
    seen.append(sorted(i.key for i in filtered))
    seen.append(store.list_namespaces())
    seen.append(store.list_namespaces(prefix=("users",), max_depth=1))
    seen.append(store.list_namespaces(suffix=("work",)))
    store.delete(("users", "work"), "job")
    seen.append(store.get(("users", "work"), "job"))
    return seen


def test_the_store_answers_as_langgraphs_in_memory_store(engine: Engine) -> None:
    ours = CtxwardenStore(engine, tenant="acme", user="alice")
    assert _drive(ours) == _drive(InMemoryStore())
    # A namespace whose last item is deleted is gone (InMemoryStore keeps listing it empty).
    assert ours.list_namespaces() == [("users", "prefs")]
    # nothing of it is visible to another user or tenant
    assert CtxwardenStore(engine, tenant="acme", user="bob").list_namespaces() == []
    assert CtxwardenStore(engine, tenant="other", user="alice").list_namespaces() == []
    assert CtxwardenStore(engine, tenant="acme", user="bob").search(("users",), query="sushi") == []
    hits = ours.search(("users",), query="sushi")
    assert [(h.key, h.value["likes"]) for h in hits] == [("food", "sushi")]


def test_bad_namespaces_and_values_are_refused(engine: Engine) -> None:
    store = CtxwardenStore(engine, user="alice")
    with pytest.raises(InputError, match="namespace"):
        store.put(("a/b",), "k", {"v": 1})
    with pytest.raises(InputError, match="value"):
        store.batch([_put_op(("a",), "k", ["not", "a", "dict"])])
    assert store.list_namespaces() == []


def _put_op(namespace: tuple[str, ...], key: str, value: Any) -> Any:
    from langgraph.store.base import PutOp

    return PutOp(namespace, key, value)


def test_the_hook_needs_a_session_and_stays_in_its_user(engine: Engine) -> None:
    Conversation(engine, session="t9", user="bob").add(
        [{"role": "user", "content": "bob's note: the vault code is 5150"}]
    )
    hook = pre_model_hook(engine, user="alice", max_tokens=300, scope="tenant")
    with pytest.raises(InputError, match="session"):
        hook({"messages": []}, {"configurable": {}})
    fitted = hook(
        {"messages": [("user", "what is the vault code?")]}, {"configurable": {"thread_id": "t9"}}
    )["llm_input_messages"]
    # scope="tenant" lets related memory draw on the whole tenant: the adapter passes the
    # scope it was given and nothing wider, so bob's note is found only because it was asked
    assert any("5150" in str(m.content) for m in fitted)
    narrow = pre_model_hook(engine, user="alice", max_tokens=300)(
        {"messages": [("user", "what is the vault code?")]}, {"configurable": {"thread_id": "t9"}}
    )["llm_input_messages"]
    assert all("5150" not in str(m.content) for m in narrow)
