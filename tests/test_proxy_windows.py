"""The window actually served (issue 16, reproduction 6): asked of the upstream once per model,
the smaller of it and the registry's used, or learnt from the upstream's context-length error.

The upstream fakes answer what vLLM, Ollama and llama.cpp's server publish for these endpoints
(vLLM's OpenAI-compatible ``/v1/models`` with ``max_model_len``; Ollama's ``/api/show``
documented in docs/api.md; llama.cpp's ``/props`` from tools/server/README.md); the last test
runs the real llama.cpp server (llama-cpp-python) started with a small context."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import openai
import pytest

from ctxwarden import Engine
from ctxwarden.llm import LLMClient
from ctxwarden.server.proxy import create_proxy_app
from ctxwarden.server.windows import window_from_error
from llmserver import Recorded, Reply, ScriptedServer, completion
from realserver import llama_server
from serving import serve

LONG = [{"role": "user", "content": f"note {i}: " + "alpha beta gamma " * 30} for i in range(60)]

#: vLLM 0.6+ ``GET /v1/models`` (vllm/entrypoints/openai/protocol.py ModelCard).
VLLM_MODELS = {
    "object": "list",
    "data": [{
        "id": "Qwen/Qwen2.5-7B-Instruct", "object": "model", "created": 1732000000,
        "owned_by": "vllm", "root": "Qwen/Qwen2.5-7B-Instruct", "parent": None,
        "max_model_len": 1024,
        "permission": [{"id": "modelperm-1", "object": "model_permission", "allow_sampling": True}],
    }],
}  # fmt: skip
#: Ollama ``POST /api/show`` (docs/api.md "Show Model Information"), with num_ctx set.
OLLAMA_SHOW = {
    "modelfile": "FROM llama3.2\nPARAMETER num_ctx 1536\n",
    "parameters": 'num_ctx                        1536\nstop "<|eot_id|>"',
    "template": "{{ .Prompt }}",
    "details": {"format": "gguf", "family": "llama", "parameter_size": "3.2B"},
    "model_info": {"general.architecture": "llama", "llama.context_length": 131072},
}
#: llama.cpp server ``GET /props`` (tools/server/README.md).
LLAMA_PROPS = {
    "default_generation_settings": {"n_ctx": 1200, "params": {"temperature": 0.8}},
    "total_slots": 1,
    "model_path": "/models/qwen2.5-7b-instruct-q4_k_m.gguf",
    "chat_template": "{% for message in messages %}...",
}


def _routes(table: dict[str, Any]) -> Callable[[Recorded], Reply]:
    def answer(recorded: Recorded) -> Reply:
        path = recorded.path.split("?")[0]
        if path.endswith("/chat/completions"):
            return Reply(body=completion("ok"))
        if path in table:
            return Reply(body=table[path])
        return Reply(status=404, body={"error": {"message": "not found"}})

    return answer


def _report(raw: Any) -> dict[str, Any]:
    return dict(json.loads(raw.headers["x-ctxwarden-report"]))


@pytest.mark.parametrize(
    ("name", "model", "table", "window", "source"),
    [
        ("vllm", "Qwen/Qwen2.5-7B-Instruct", {"/v1/models": VLLM_MODELS}, 1024,
         "served (/v1/models)"),
        ("ollama", "llama3.2", {"/api/ps": {"models": []}, "/api/show": OLLAMA_SHOW}, 1536,
         "served (/api/ps, /api/show)"),
        ("llama.cpp", "qwen2.5", {"/props": LLAMA_PROPS}, 1200, "served (/props)"),
    ],
)  # fmt: skip
def test_the_served_window_is_asked_once_and_wins_when_smaller(
    name: str, model: str, table: dict[str, Any], window: int, source: str
) -> None:
    with (
        ScriptedServer(_routes(table)) as upstream,
        Engine.open(":memory:") as engine,
        LLMClient(upstream.url, max_retries=0) as llm,
        serve(create_proxy_app(engine, llm)) as url,
        openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0) as client,
    ):
        for _ in range(2):
            raw = client.chat.completions.with_raw_response.create(
                model=model,
                messages=LONG,  # type: ignore[arg-type]
            )
            report = _report(raw)
            assert (report["window"], report["window_source"]) == (window, source), name
            assert report["tokens"] <= report["cap"] < window
            assert len(upstream.chat_requests()[-1].body["messages"]) < len(LONG)
        probes = [r for r in upstream.requests if not r.path.endswith("/chat/completions")]
        assert (
            len(probes) <= 5
        )  # each endpoint asked once per model (ServedWindows), not per request


def test_a_served_window_larger_than_the_registrys_does_not_raise_it() -> None:
    big = {"default_generation_settings": {"n_ctx": 1_000_000}}
    with (
        ScriptedServer(_routes({"/props": big})) as upstream,
        Engine.open(":memory:") as engine,
        LLMClient(upstream.url, max_retries=0) as llm,
        serve(create_proxy_app(engine, llm)) as url,
        openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0) as client,
    ):
        raw = client.chat.completions.with_raw_response.create(
            model="qwen2.5", messages=[{"role": "user", "content": "hi"}]
        )
        assert (_report(raw)["window"], _report(raw)["window_source"]) == (32768, "registry")


def test_a_window_named_in_the_upstreams_error_is_learnt_and_the_request_sent_again() -> None:
    def answer(recorded: Recorded) -> Reply:
        if not recorded.path.endswith("/chat/completions"):
            return Reply(status=404, body={})
        if len(recorded.body["messages"]) > 20:
            message = (
                "This model's maximum context length is 1400 tokens. However, you requested "
                "3893 tokens (3893 in the messages, 0 in the completion)."
            )
            return Reply(status=400, body={"error": {"message": message, "code": 400}})
        return Reply(body=completion("fits now"))

    with (
        ScriptedServer(answer) as upstream,
        Engine.open(":memory:") as engine,
        LLMClient(upstream.url, max_retries=0) as llm,
        serve(create_proxy_app(engine, llm)) as url,
        openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0) as client,
    ):
        raw = client.chat.completions.with_raw_response.create(
            model="qwen2.5",
            messages=LONG,  # type: ignore[arg-type]
        )
        assert raw.parse().choices[0].message.content == "fits now"
        report = _report(raw)
        assert report["window"] == 1400
        assert report["window_source"] == "served (named in the upstream's error)"
        assert len(upstream.chat_requests()) == 2
        # remembered: the next request is fitted at once
        client.chat.completions.create(model="qwen2.5", messages=LONG)  # type: ignore[arg-type]
        assert len(upstream.chat_requests()) == 3


def test_window_named_in_an_upstream_error() -> None:
    assert window_from_error("Requested tokens (5000) exceed context window of 2048") == 2048
    assert window_from_error("something else went wrong") is None


@pytest.mark.slow
def test_a_real_llama_cpp_server_with_a_small_context_gets_a_fitted_conversation(
    tmp_path: Path,
) -> None:
    """Reproduction 6: llama.cpp started with a small context answered 400; now the proxy fits
    the conversation to the window the server serves."""
    conversation = [
        {"role": "user", "content": f"Fact {i}: the parcel {i} goes to dock {i % 7}. " * 6}
        for i in range(40)
    ]
    conversation.append({"role": "user", "content": "Say OK."})
    with (
        llama_server(tmp_path, n_ctx=1024) as llama,
        Engine.open(":memory:") as engine,
        LLMClient(llama.url, timeout=300.0, max_retries=0) as upstream,
        serve(create_proxy_app(engine, upstream)) as url,
        openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=300) as proxy,
        openai.OpenAI(base_url=llama.url, api_key="x", max_retries=0, timeout=300) as direct,
    ):
        with pytest.raises(openai.BadRequestError):  # what the server says to the whole thing
            direct.chat.completions.create(
                model=llama.model,
                messages=conversation,
                max_tokens=8,  # type: ignore[arg-type]
            )
        raw = proxy.chat.completions.with_raw_response.create(
            model=llama.model, messages=conversation, max_tokens=8, temperature=0.0,  # type: ignore[arg-type]
        )  # fmt: skip
        reply = raw.parse()
        assert reply.choices[0].message is not None
        report = _report(raw)
        assert report["window"] == 1024
        assert report["dropped_turns"] > 0
        assert llama.alive()
