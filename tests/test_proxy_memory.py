"""What the proxy remembers and the one memory block it inserts, kept stable for prompt caches:
ProxyMemory on a real engine, and through the proxy with the official ``openai`` client."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from ctxwarden import Engine
from ctxwarden.llm import LLMClient
from ctxwarden.server.chatfit import Conversations, TokenCache, count_units
from ctxwarden.server.proxy import ProxyConfig, create_proxy_app
from ctxwarden.server.proxymemory import ProxyMemory, Who
from ctxwarden.tokens import get_chat_format, get_tokenizer
from llmserver import Recorded, Reply, ScriptedServer, completion
from serving import serve

FMT = get_chat_format("openai", get_tokenizer("o200k_base"))


def _remember(memory: ProxyMemory, who: Who, messages: list[dict[str, Any]]) -> dict[str, int]:
    checked = Conversations().check(messages)
    _, _, keys = count_units(messages, checked, FMT, TokenCache())
    counts, _ = memory.remember(who, messages, keys)
    return counts


def test_a_reply_stored_late_is_known_not_a_duplicate() -> None:
    with Engine.open(":memory:") as engine:
        memory = ProxyMemory(engine)
        who = Who(tenant="default", user="ann", session="s1")
        first = [{"role": "user", "content": "hello"}]
        assert _remember(memory, who, first) == {"stored": 1}
        record = memory.reply_record(
            who, {"role": "assistant", "content": "hi ann", "refusal": None}
        )
        assert record is not None
        # the next turn arrives before the reply was stored: the client's echo stores it
        echo = {"role": "assistant", "content": "hi ann", "refusal": None, "annotations": []}
        second = [*first, echo, {"role": "user", "content": "bye"}]
        assert _remember(memory, who, second) == {"stored": 2}
        assert memory.store(who, [record]) == {"known": 1}
        assert engine.stats()["memories"] == 3


def test_image_and_file_parts_are_remembered_as_attachments_without_their_bytes() -> None:
    with Engine.open(":memory:") as engine:
        memory = ProxyMemory(engine)
        who = Who(tenant="default", user="ann", session="s1")
        messages = [
            {"role": "user", "content": [
                {"type": "text", "text": "is this rash worth a doctor visit?"},
                {"type": "image_url", "image_url": {
                    "url": "https://cdn.example/u/ann/left%20arm.jpg?sig=1", "detail": "low"}},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
                {"type": "file", "file": {"filename": "blood test.pdf", "file_data": "JVBERi0="}},
            ]},
            # A message of only an image is remembered too.
            {"role": "user", "content": [
                {"type": "image_url", "image_url": {"url": "https://cdn.example/u/ann/x.png"}}]},
        ]  # fmt: skip
        assert _remember(memory, who, messages) == {"stored": 2}
        first, second = engine.store.recent("default", "s1", limit=10)[::-1]
        assert first.attachments == (
            {"kind": "image", "name": "left arm.jpg",
             "url": "https://cdn.example/u/ann/left%20arm.jpg?sig=1"},
            {"kind": "image", "name": "inline image"},
            {"kind": "file", "name": "blood test.pdf"},
        )  # fmt: skip
        assert "base64" not in json.dumps(first.to_dict()) + json.dumps(second.to_dict())
        assert second.content == ""
        assert [m.id for m, _ in engine.store.search("default", ["blood"], limit=5)] == [first.id]


def test_the_block_is_kept_while_the_question_is_unchanged_or_the_search_overlaps() -> None:
    with Engine.open(":memory:") as engine:
        memory = ProxyMemory(engine)
        who = Who(tenant="default", user="ann", session=None)
        _remember(memory, who, [
            {"role": "user", "content": "the staging database password rotates on mondays"},
            {"role": "assistant", "content": "noted"},
            {"role": "user", "content": "the deploy freeze starts friday at noon"},
        ])  # fmt: skip
        first, kept = memory.block(who, "when does the password rotate?", exclude=frozenset(),
                                   budget=500, fmt=FMT)  # fmt: skip
        assert first is not None
        assert not kept
        assert "mondays" in first.text
        assert first.text.startswith("Memory retrieved for this turn")
        again, kept = memory.block(who, "when does the password rotate?", exclude=frozenset(),
                                   budget=500, fmt=FMT)  # fmt: skip
        assert (again, kept) == (first, True)
        # a new question whose search still finds one of the block's memories: kept as it was
        related, kept = memory.block(who, "which database password?", exclude=frozenset(),
                                     budget=500, fmt=FMT)  # fmt: skip
        assert (related, kept) == (first, True)
        # a new topic: a new block
        other, kept = memory.block(who, "when is the deploy freeze?", exclude=frozenset(),
                                   budget=500, fmt=FMT)  # fmt: skip
        assert other is not None
        assert not kept
        assert "freeze" in other.text
        # memories that are in the conversation itself are left out
        inside, _ = memory.block(who, "tell me about the deploy freeze", exclude=other.ids,
                                 budget=500, fmt=FMT)  # fmt: skip
        assert inside is None or not (inside.ids & other.ids)
        # no room: no block
        none, _ = memory.block(who, "password rotation schedule", exclude=frozenset(), budget=5,
                               fmt=FMT)  # fmt: skip
        assert none is None


def _tool_loop(recorded: Recorded) -> Reply:
    if not recorded.path.endswith("/chat/completions"):
        return Reply(status=404, body={})
    tools = [m for m in recorded.body["messages"] if m["role"] == "tool"]
    if len(tools) < 2:
        call = {"id": f"call_{len(tools)}", "type": "function",
                "function": {"name": "lookup", "arguments": "{}"}}  # fmt: skip
        return Reply(body=completion(None, finish_reason="tool_calls", tool_calls=[call]))
    return Reply(body=completion("Mondays."))


@pytest.fixture
def rig() -> Iterator[tuple[openai.OpenAI, ScriptedServer]]:
    with (
        ScriptedServer(_tool_loop) as upstream,
        Engine.open(":memory:") as engine,
        LLMClient(upstream.url, max_retries=0) as llm,
        serve(create_proxy_app(engine, llm, ProxyConfig())) as url,
        openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0) as client,
    ):
        yield client, upstream


def test_through_the_proxy_the_block_stays_put_during_a_tool_loop(
    rig: tuple[openai.OpenAI, ScriptedServer],
) -> None:
    client, upstream = rig
    system = {"role": "system", "content": "You are an ops assistant."}
    earlier = [system, {"role": "user", "content": "FYI the staging password rotates on mondays"}]
    client.chat.completions.create(model="gpt-4o", messages=earlier, user="ann")  # type: ignore[arg-type]
    # a new conversation of the same end user, with a tool loop
    messages: list[dict[str, Any]] = [
        system,
        {"role": "user", "content": "when does the staging password rotate?"},
    ]
    prompts = []
    for _ in range(3):
        raw = client.chat.completions.with_raw_response.create(
            model="gpt-4o",
            messages=messages,
            user="ann",
            tools=[
                {
                    "type": "function",
                    "function": {"name": "lookup", "parameters": {"type": "object"}},
                }
            ],  # type: ignore[arg-type,list-item]
        )
        prompts.append(upstream.chat_requests()[-1].body["messages"])
        reply = raw.parse().choices[0].message
        if not reply.tool_calls:
            break
        messages.append(reply.model_dump(exclude_none=True))
        for call in reply.tool_calls:
            messages.append({"role": "tool", "tool_call_id": call.id, "content": "see the wiki"})
    assert len(prompts) == 3
    block = prompts[0][1]
    assert block["role"] == "user"
    assert "mondays" in block["content"]
    assert all(p[1] == block for p in prompts)  # same place, same text
    for before, after in itertools.pairwise(prompts):
        assert after[: len(before)] == before  # each prompt extends the previous one
    report = json.loads(raw.headers["x-ctxwarden-report"])
    assert report["memory"]["kept"] is True
    assert report["memory"]["scope"] == "user"


def test_with_a_cut_the_block_changes_only_when_the_cut_moves() -> None:
    with Engine.open(":memory:") as engine:
        memory = ProxyMemory(engine)
        who = Who(tenant="default", user="ann", session="s")
        _remember(memory, who, [
            {"role": "user", "content": "the staging database password rotates on mondays"},
            {"role": "assistant", "content": "noted"},
            {"role": "user", "content": "the deploy freeze starts friday at noon"},
        ])  # fmt: skip

        def ask(question: str, cut: int) -> tuple[Any, bool]:
            return memory.block(who, question, exclude=frozenset(), budget=500, fmt=FMT, cut=cut)

        first, kept = ask("when does the password rotate?", 4)
        assert first is not None
        assert "mondays" in first.text
        assert not kept
        # another topic, the same cut: the prompt's prefix stays as it was
        assert ask("when is the deploy freeze?", 4) == (first, True)
        # the cut moved (the prompt changes there anyway): the block follows the question
        moved, kept = ask("when is the deploy freeze?", 9)
        assert moved is not None
        assert "freeze" in moved.text
        assert not kept
