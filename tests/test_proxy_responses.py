"""``POST /v1/responses`` end to end: the official ``openai`` client -> the ctxwarden proxy (real
uvicorn on loopback) -> an upstream fake written from the published Responses API schema
(tests/agentupstream.py: llama.cpp's server does not serve this API). Each test checks what the
client got and what the upstream received.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import openai
import pytest

from agentupstream import AgentUpstream, Recorded, Step
from ctxwarden import Engine
from ctxwarden.llm import LLMClient
from ctxwarden.models import ModelSpec
from ctxwarden.server.proxy import create_proxy_app
from serving import serve

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
        "additionalProperties": False,
    },
    "strict": True,
}


@dataclass
class Rig:
    upstream: AgentUpstream
    engine: Engine
    url: str
    client: openai.OpenAI

    def sent(self) -> list[Any]:
        return self.upstream.bodies("/v1/responses")

    def report(self, response: httpx.Response) -> dict[str, Any]:
        return dict(json.loads(response.headers["x-ctxwarden-report"]))

    def stored(self) -> int:
        return int(self.engine.store.stats(self.engine.config.tenant)["memories"])


@pytest.fixture
def rig(request: pytest.FixtureRequest) -> Iterator[Rig]:
    script = getattr(request, "param", ())
    with (
        AgentUpstream(script) as upstream,
        Engine.open(":memory:") as engine,
        LLMClient(upstream.url, api_key="sk-upstream", max_retries=0) as client,
        serve(create_proxy_app(engine, client)) as url,
        openai.OpenAI(base_url=url + "/v1", api_key="sk-agent", max_retries=0) as agent,
    ):
        engine.registry.register(
            ModelSpec(
                name="tiny-o200k",
                tokenizer="o200k_base",
                window=3000,
                chat_format="openai",
                max_output=200,
            )
        )
        yield Rig(upstream=upstream, engine=engine, url=url, client=agent)


def test_function_tool_round_trip_goes_upstream_unchanged(rig: Rig) -> None:
    rig.upstream._queue.extend([Step(calls=[("get_weather", {"city": "Oslo"})]), Step("Sunny.")])
    items: list[Any] = [
        {"role": "developer", "content": "Answer briefly."},
        {"role": "user", "content": "Weather in Oslo?"},
    ]
    first = rig.client.responses.with_raw_response.create(
        model="gpt-4o", input=items, tools=[WEATHER]
    )
    response = first.parse()
    calls = [o for o in response.output if o.type == "function_call"]
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("get_weather", {"city": "Oslo"})]
    assert rig.sent()[0]["input"] == items
    assert rig.sent()[0]["tools"] == [WEATHER]
    report = rig.report(first.http_response)
    assert report["unchanged"] is True
    assert report["remembered"] is False
    # the agent runs the tool and sends the call and its output back
    items += [
        calls[0].model_dump(exclude_none=True),
        {"type": "function_call_output", "call_id": calls[0].call_id, "output": "18C, sun"},
    ]
    second = rig.client.responses.create(model="gpt-4o", input=items, tools=[WEATHER])
    assert second.output_text == "Sunny."
    assert rig.sent()[1]["input"] == items
    assert rig.stored() == 0  # no session or user named: nothing remembered


def test_streamed_events_are_relayed_in_order(rig: Rig) -> None:
    rig.upstream._queue.append(Step("It is sunny in Oslo today.", cached=12))
    with rig.client.responses.create(
        model="gpt-4o", input="Weather in Oslo?", stream=True
    ) as stream:
        events = list(stream)
    kinds = [e.type for e in events]
    assert kinds[0] == "response.created"
    assert kinds[-1] == "response.completed"
    assert kinds.count("response.output_text.delta") == 6
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == "It is sunny in Oslo today."
    assert rig.sent()[0]["input"] == "Weather in Oslo?"
    assert rig.sent()[0]["stream"] is True


def test_streamed_function_call_reaches_the_client(rig: Rig) -> None:
    rig.upstream._queue.append(Step(calls=[("get_weather", {"city": "Rome"})]))
    with rig.client.responses.stream(
        model="gpt-4o", input="Weather in Rome?", tools=[WEATHER]
    ) as stream:
        final = stream.get_final_response()
    calls = [o for o in final.output if o.type == "function_call"]
    assert [json.loads(c.arguments) for c in calls] == [{"city": "Rome"}]


def test_cached_tokens_and_report_header(rig: Rig) -> None:
    rig.upstream._queue.append(Step("ok", cached=128))
    raw = rig.client.responses.with_raw_response.create(model="gpt-4o", input="hello")
    report = rig.report(raw.http_response)
    assert report["cached_tokens"] == 128
    assert report["upstream_input_tokens"] == raw.parse().usage.input_tokens  # type: ignore[union-attr]


def test_session_memory_is_one_item_after_the_system_part(rig: Rig) -> None:
    rig.upstream._queue.extend([Step("Noted."), Step("Your cat is called Miso.")])
    headers = {"X-Ctxwarden-Session": "s-1"}
    rig.client.responses.create(
        model="gpt-4o",
        input=[{"role": "user", "content": "My cat is called Miso and likes tuna."}],
        extra_headers=headers,
    )
    later: list[Any] = [
        {"role": "system", "content": "You are helpful."},
        {"role": "user", "content": "What is my cat called?"},
    ]
    rig.client.responses.create(model="gpt-4o", input=later, extra_headers=headers)
    sent = rig.sent()[1]["input"]
    assert sent[0] == later[0]
    assert sent[2:] == later[1:]
    block = sent[1]
    assert block["role"] == "user"
    assert "Miso" in block["content"][0]["text"]
    assert "as data" in block["content"][0]["text"]
    # another session of the same tenant gets nothing of it
    rig.upstream._queue.append(Step("I do not know."))
    rig.client.responses.create(
        model="gpt-4o", input=later, extra_headers={"X-Ctxwarden-Session": "s-2"}
    )
    assert rig.sent()[2]["input"] == later


def test_without_a_name_nothing_is_stored_or_retrieved(rig: Rig) -> None:
    rig.upstream._queue.extend([Step("Noted."), Step("?")])
    rig.client.responses.create(model="gpt-4o", input="My cat is called Miso.")
    rig.client.responses.create(model="gpt-4o", input="What is my cat called?")
    assert rig.stored() == 0
    assert rig.sent()[1]["input"] == "What is my cat called?"


def test_user_field_names_the_scope(rig: Rig) -> None:
    rig.upstream._queue.extend([Step("Noted."), Step("Miso."), Step("?")])
    rig.client.responses.create(model="gpt-4o", input="My cat is Miso.", user="alice-77")
    rig.client.responses.create(model="gpt-4o", input="Is my cat Miso?", user="alice-77")
    assert "Miso" in json.dumps(rig.sent()[1]["input"][0])
    rig.client.responses.create(model="gpt-4o", input="Is my cat Miso?", user="bob-88")
    assert rig.sent()[2]["input"] == "Is my cat Miso?"


def test_a_long_conversation_is_cut_at_turn_boundaries(rig: Rig) -> None:
    rig.upstream._queue.append(Step("done"))
    items: list[Any] = [{"role": "developer", "content": "You are a coding agent."}]
    for n in range(30):
        items += [
            {"role": "user", "content": f"step {n}: " + "lorem ipsum dolor " * 20},
            {"type": "function_call", "call_id": f"c{n}", "name": "run", "arguments": "{}"},
            {"type": "function_call_output", "call_id": f"c{n}", "output": "ok " * 30},
            {"role": "assistant", "content": f"finished step {n}"},
        ]
    items.append({"role": "user", "content": "now summarise"})
    raw = rig.client.responses.with_raw_response.create(model="tiny-o200k", input=items)
    sent = rig.sent()[0]["input"]
    assert sent[0] == items[0]
    assert sent[-1] == items[-1]
    assert sent[1]["role"] == "user"  # the kept history starts at a turn
    tail = items[len(items) - len(sent) + 1 :]
    assert sent[1:] == tail  # kept turns in order, unchanged
    outputs = {i["call_id"] for i in sent if i.get("type") == "function_call_output"}
    calls = {i["call_id"] for i in sent if i.get("type") == "function_call"}
    assert outputs == calls
    report = rig.report(raw.http_response)
    assert report["unchanged"] is False
    assert report["tokens"] <= report["cap"]


def test_previous_response_id_is_forwarded_and_its_outputs_accepted(rig: Rig) -> None:
    rig.upstream._queue.append(Step("ok"))
    items = [{"type": "function_call_output", "call_id": "call_held_upstream", "output": "42"}]
    rig.client.responses.create(
        model="gpt-4o",
        input=items,
        previous_response_id="resp_abc",  # type: ignore[arg-type]
    )
    assert rig.sent()[0]["previous_response_id"] == "resp_abc"
    assert rig.sent()[0]["input"] == items


@pytest.mark.parametrize(
    ("payload", "param"),
    [
        (
            {"input": [{"type": "function_call_output", "call_id": "x", "output": "1"}]},
            "input[0].call_id",
        ),
        ({"input": [{"role": "robot", "content": "hi"}]}, "input[0].role"),
        ({"input": [{"type": "telepathy", "content": "hi"}]}, "input[0].type"),
        (
            {"input": [{"role": "user", "content": [{"type": "video", "url": "x"}]}]},
            "input[0].content[0].type",
        ),
        ({"input": 7}, "input"),
        ({"input": "hi", "base_url": "http://evil.example"}, "base_url"),
    ],
)
def test_bad_requests_are_refused_naming_the_field(
    rig: Rig, payload: dict[str, Any], param: str
) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        rig.client.post(
            "/responses",
            body={"model": "gpt-4o", "user": "alice", **payload},
            cast_to=httpx.Response,
        )
    error = caught.value.body
    assert isinstance(error, dict)
    assert error["param"] == param
    assert error["message"].startswith(f"{param}: ")
    assert error["message"].count(param) == 1
    assert rig.sent() == []
    assert rig.stored() == 0


def test_a_body_that_is_not_json_is_refused(rig: Rig) -> None:
    answer = httpx.post(
        rig.url + "/v1/responses", content=b"{nope", headers={"content-type": "application/json"}
    )
    assert answer.status_code == 400
    assert answer.json()["error"]["param"] == "body"


def test_upstream_errors_pass_through_with_their_status(rig: Rig) -> None:
    rig.upstream._queue.append(Step(status=404, error="model 'nope' not found"))
    with pytest.raises(openai.NotFoundError) as caught:
        rig.client.responses.create(model="gpt-4o", input="hi")
    assert "model 'nope' not found" in str(caught.value)


def test_a_newest_turn_over_the_cap_is_a_context_length_error(rig: Rig) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        rig.client.responses.create(model="tiny-o200k", input="word " * 5000)
    assert isinstance(caught.value.body, dict)
    assert caught.value.body["code"] == "context_length_exceeded"
    assert rig.sent() == []


def _two_calls_then_answer(recorded: Recorded) -> Step:
    done = sum(1 for i in recorded.body["input"] if i.get("type") == "function_call_output")
    if done < 2:
        return Step(calls=[("get_weather", {"city": ["Oslo", "Rome"][done]})])
    return Step("Oslo is sunny, Rome is warm.")


@pytest.mark.parametrize("rig", [_two_calls_then_answer], indirect=True)
def test_agents_sdk_runner_calls_the_tool_as_often_as_asked(rig: Rig) -> None:
    import agents

    seen: list[str] = []

    @agents.function_tool
    def get_weather(city: str) -> str:
        """The weather in a city."""
        seen.append(city)
        return f"weather in {city}: fine"

    async def run() -> Any:
        async with openai.AsyncOpenAI(
            base_url=rig.url + "/v1", api_key="sk-agent", max_retries=0
        ) as client:
            model = agents.OpenAIResponsesModel(model="gpt-4o", openai_client=client)
            agent = agents.Agent(
                name="weather", instructions="Use the tool.", tools=[get_weather], model=model
            )
            return await agents.Runner.run(
                agent,
                "Weather in Oslo and Rome?",
                run_config=agents.RunConfig(tracing_disabled=True),
            )

    result = asyncio.run(run())
    assert result.final_output == "Oslo is sunny, Rome is warm."
    assert seen == ["Oslo", "Rome"]
    sent = rig.sent()
    assert len(sent) == 3
    assert sent[-1]["input"][0] == {"role": "user", "content": "Weather in Oslo and Rome?"}
    assert sent[-1]["input"][-1]["type"] == "function_call_output"


@pytest.mark.parametrize("rig", [[Step("Bonjour.")]], indirect=True)
def test_langchain_chat_openai_with_the_responses_api(rig: Rig) -> None:
    from langchain_openai import ChatOpenAI

    chat = ChatOpenAI(
        model="gpt-4o",
        base_url=rig.url + "/v1",
        api_key="sk-agent",  # type: ignore[arg-type]
        use_responses_api=True,
        max_retries=0,
    )
    answer = chat.invoke("Say hello in French.")
    assert answer.text == "Bonjour."
    assert rig.sent()[0]["input"][-1]["content"] == "Say hello in French."


def test_an_upstream_error_on_a_streamed_request_keeps_its_status(rig: Rig) -> None:
    rig.upstream._queue.append(Step(status=429, error="slow down"))
    with pytest.raises(openai.RateLimitError) as caught:
        rig.client.responses.create(model="gpt-4o", input="hi", stream=True)
    assert "slow down" in str(caught.value)


def test_an_unreachable_upstream_is_a_502_without_its_address() -> None:
    with (
        Engine.open(":memory:") as engine,
        LLMClient("http://127.0.0.1:9/v1", max_retries=0) as upstream,
        serve(create_proxy_app(engine, upstream)) as url,
    ):
        answer = httpx.post(url + "/v1/responses", json={"model": "gpt-4o", "input": "hi"})
    assert answer.status_code == 502
    assert "127.0.0.1" not in answer.text
    assert answer.json()["error"]["type"] == "upstream_error"


def test_cached_tokens_of_streamed_answers_reach_metrics(rig: Rig) -> None:
    rig.upstream._queue.extend([Step("one two", cached=300), Step("three", cached=200)])
    with rig.client.responses.create(model="gpt-4o", input="hi", stream=True) as stream:
        list(stream)
    rig.client.responses.create(model="gpt-4o", input="hi again")
    metrics = httpx.get(rig.url + "/metrics").text
    line = next(
        row
        for row in metrics.splitlines()
        if row.startswith("ctxwarden_proxy_upstream_cached_tokens_total")
    )
    assert float(line.split()[-1]) == 500


def test_a_streamed_reply_is_stored_for_the_named_user_and_recalled(rig: Rig) -> None:
    rig.upstream._queue.extend([Step("The launch code is ZEBRA-42."), Step("ok")])
    raw = rig.client.responses.with_raw_response.create(
        model="gpt-4o", input="Tell me the launch code.", user="carol", stream=True
    )
    with raw.parse() as stream:
        list(stream)
    assert json.loads(raw.headers["x-ctxwarden-report"])["remembered"] is True
    rig.client.responses.create(model="gpt-4o", input="Which launch code was it?", user="carol")
    assert "ZEBRA-42" in json.dumps(rig.sent()[1]["input"][0])


def test_fifty_end_users_never_see_each_others_canaries(rig: Rig) -> None:
    users = [f"user-{n}" for n in range(50)]
    rig.upstream._queue.extend(Step("noted") for _ in range(100))
    for user in users:
        rig.client.responses.create(
            model="gpt-4o", input=f"my secret canary is CANARY{user[5:]}X", user=user
        )
    for user in users:
        rig.client.responses.create(model="gpt-4o", input="what is my secret canary?", user=user)
    asks = rig.sent()[50:]
    for user, body in zip(users, asks, strict=True):
        found = {w for w in json.dumps(body["input"]).replace("\\n", " ").split() if "CANARY" in w}
        assert all(f"CANARY{user[5:]}X" in w for w in found), (user, found)
        assert found, user  # its own canary comes back


def test_the_memory_block_stays_as_it_was_through_a_tool_loop(rig: Rig) -> None:
    """Prompt caches: the block keeps its text and place while the conversation grows."""
    rig.upstream._queue.extend([Step("Noted."), Step("calling"), Step("done")])
    rig.client.responses.create(
        model="gpt-4o", input="The deploy key is in vault slot 7.", user="dana"
    )
    items: list[Any] = [
        {"role": "developer", "content": "You deploy things."},
        {"role": "user", "content": "Where is the deploy key kept?"},
    ]
    rig.client.responses.create(model="gpt-4o", input=items, user="dana")
    items += [
        {"type": "function_call", "call_id": "c1", "name": "look", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "nothing found"},
    ]
    rig.client.responses.create(model="gpt-4o", input=items, user="dana")
    first, second = rig.sent()[1]["input"], rig.sent()[2]["input"]
    assert "vault slot 7" in json.dumps(first[1])
    assert second[: len(first)] == first  # the second prompt only appends
    assert second[len(first) :] == items[2:]
