"""ServedWindows: the window an upstream serves, against upstream fakes and a real server.

The fakes answer with the response shapes the servers publish (each named below), on a real
uvicorn server on loopback, asked through the real LLMClient. The real server is llama.cpp's
Python binding's server (tests/realserver.py), which publishes no window: it must give None.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from ctxwarden.llm import LLMClient
from ctxwarden.server.windows import ServedWindows
from realserver import LlamaServer
from serving import serve

Handler = Callable[[Request], Any]


@contextmanager
def upstream(routes: dict[tuple[str, str], Any]) -> Iterator[tuple[str, list[str]]]:
    """A fake upstream answering ``routes[(method, path)]`` (a dict, or a callable of the
    request's JSON body); anything else is a 404. Yields the /v1 base URL and the paths asked."""
    asked: list[str] = []

    async def handle(request: Request) -> Response:
        asked.append(f"{request.method} {request.url.path}")
        answer = routes.get((request.method, request.url.path))
        if answer is None:
            return PlainTextResponse("Not Found", status_code=404)
        if callable(answer):
            answer = answer(await request.json() if request.method == "POST" else None)
        if isinstance(answer, Response):
            return answer
        return JSONResponse(answer)

    app = Starlette(routes=[Route("/{path:path}", handle, methods=["GET", "POST"])])
    with serve(app) as base:
        yield f"{base}/v1", asked


# llama.cpp's server (tools/server/README.md): /props and its /v1/models, whose meta.n_ctx_train
# is the trained length, not the served one.
LLAMACPP_PROPS = {
    "default_generation_settings": {"n_ctx": 8192, "params": {"n_predict": -1}},
    "total_slots": 1,
    "model_path": "/models/Qwen3-8B-Q4_K_M.gguf",
    "chat_template": "{% for message in messages %}...",
    "build_info": "b6000-abcdef",
}
LLAMACPP_MODELS = {
    "object": "list",
    "data": [
        {
            "id": "Qwen3-8B-Q4_K_M.gguf",
            "object": "model",
            "created": 1_750_000_000,
            "owned_by": "llamacpp",
            "meta": {"vocab_type": 2, "n_vocab": 151936, "n_ctx_train": 40960, "n_embd": 4096},
        }
    ],
}
# vLLM's OpenAI-compatible server (vllm/entrypoints/openai/protocol.py, ModelCard).
VLLM_MODELS = {
    "object": "list",
    "data": [
        {
            "id": "Qwen/Qwen2.5-7B-Instruct",
            "object": "model",
            "created": 1_750_000_000,
            "owned_by": "vllm",
            "root": "Qwen/Qwen2.5-7B-Instruct",
            "parent": None,
            "max_model_len": 16384,
            "permission": [{"id": "modelperm-1", "object": "model_permission"}],
        },
        {"id": "other-model", "object": "model", "owned_by": "vllm", "max_model_len": 2048},
    ],
}
# Ollama's API (docs/api.md): its OpenAI list has no context; /api/ps lists loaded models
# (context_length in newer releases); /api/show has parameters text and model_info.
OLLAMA_MODELS = {
    "object": "list",
    "data": [{"id": "qwen3:8b", "object": "model", "created": 1_750_000_000, "owned_by": "ollama"}],
}
OLLAMA_SHOW = {
    "modelfile": "FROM qwen3:8b\nPARAMETER num_ctx 16384\n",
    "parameters": "num_ctx                        16384\n"
    'stop                           "<|im_end|>"',
    "template": "{{ .Prompt }}",
    "details": {"family": "qwen3", "parameter_size": "8.2B", "quantization_level": "Q4_K_M"},
    "model_info": {"general.architecture": "qwen3", "qwen3.context_length": 40960},
}
OLLAMA_PS = {
    "models": [
        {
            "name": "qwen3:8b",
            "model": "qwen3:8b",
            "size": 6_000_000_000,
            "digest": "abc",
            "details": {"family": "qwen3"},
            "expires_at": "2026-11-25T13:00:00Z",
            "size_vram": 6_000_000_000,
            "context_length": 8192,
        }
    ]
}
# LM Studio's REST API (/api/v0/models): max and loaded context lengths.
LMSTUDIO_V0 = {
    "object": "list",
    "data": [
        {
            "id": "qwen2.5-7b-instruct",
            "object": "model",
            "type": "llm",
            "publisher": "lmstudio-community",
            "arch": "qwen2",
            "compatibility_type": "gguf",
            "quantization": "Q4_K_M",
            "state": "loaded",
            "max_context_length": 32768,
            "loaded_context_length": 4096,
        }
    ],
}


_clients: list[LLMClient] = []


@pytest.fixture(autouse=True)
def _close_clients() -> Iterator[None]:
    yield
    while _clients:
        _clients.pop().close()


def _windows(url: str, **kwargs: Any) -> ServedWindows:
    client = LLMClient(url, timeout=5, max_retries=0)
    _clients.append(client)
    return ServedWindows(client, **kwargs)


def test_llamacpp_props_slot_window_not_the_trained_length() -> None:
    routes = {("GET", "/v1/models"): LLAMACPP_MODELS, ("GET", "/props"): LLAMACPP_PROPS}
    with upstream(routes) as (url, asked):
        windows = _windows(url)
        assert windows.window("Qwen3-8B-Q4_K_M.gguf") == 8192
        assert windows.window("Qwen3-8B-Q4_K_M.gguf") == 8192
        assert asked == ["GET /v1/models", "GET /props"]  # asked once, then cached


def test_llamacpp_props_top_level_n_ctx_and_the_smaller_of_both() -> None:
    with upstream({("GET", "/props"): {"n_ctx": 4096}}) as (url, _):
        assert _windows(url).window("any") == 4096
    both = {"n_ctx": 32768, "default_generation_settings": {"n_ctx": 8192}}
    with upstream({("GET", "/props"): both}) as (url, _):
        assert _windows(url).window("any") == 8192


def test_vllm_max_model_len_of_the_named_model() -> None:
    with upstream({("GET", "/v1/models"): VLLM_MODELS}) as (url, asked):
        windows = _windows(url)
        assert windows.window("Qwen/Qwen2.5-7B-Instruct") == 16384
        assert windows.window("other-model") == 2048
        assert windows.window("not-served") is None  # two entries, none of them: no guess
        assert asked.count("GET /v1/models") == 3  # once per model


def test_ollama_loaded_context_then_num_ctx_then_model_info() -> None:
    routes: dict[tuple[str, str], Any] = {
        ("GET", "/v1/models"): OLLAMA_MODELS,
        ("GET", "/api/ps"): OLLAMA_PS,
        ("POST", "/api/show"): lambda body: OLLAMA_SHOW if body == {"model": "qwen3:8b"} else {},
    }
    with upstream(routes) as (url, _):
        assert _windows(url).window("qwen3:8b") == 8192  # loaded: what it runs with
    routes[("GET", "/api/ps")] = {"models": []}
    with upstream(routes) as (url, asked):
        assert _windows(url).window("qwen3:8b") == 16384  # not loaded: its num_ctx
        assert "POST /api/show" in asked
    routes[("POST", "/api/show")] = {**OLLAMA_SHOW, "parameters": 'stop "<|im_end|>"'}
    with upstream(routes) as (url, _):
        assert _windows(url).window("qwen3:8b") == 40960  # no num_ctx: the model's own


def test_lmstudio_loaded_context_length() -> None:
    plain = {"object": "list", "data": [{"id": "qwen2.5-7b-instruct", "object": "model"}]}
    routes = {("GET", "/v1/models"): plain, ("GET", "/api/v0/models"): LMSTUDIO_V0}
    with upstream(routes) as (url, _):
        assert _windows(url).window("qwen2.5-7b-instruct") == 4096
    # The same fields in an LM Studio-style /v1/models list are read there.
    with upstream({("GET", "/v1/models"): LMSTUDIO_V0}) as (url, asked):
        assert _windows(url).window("qwen2.5-7b-instruct") == 4096
        assert asked == ["GET /v1/models"]


def test_no_answer_is_none_cached_for_the_retry_interval() -> None:
    now = [0.0]
    plain = {"object": "list", "data": [{"id": "gpt-4o", "object": "model"}]}
    with upstream({("GET", "/v1/models"): plain}) as (url, asked):
        windows = _windows(url, retry_after=60.0, ttl=600.0, clock=lambda: now[0])
        assert windows.window("gpt-4o") is None
        rounds = len(asked)
        # /v1/models, /props, /api/ps (a 404: not Ollama, so no /api/show), /api/v0/models
        assert rounds == 4
        now[0] = 59.0
        assert windows.window("gpt-4o") is None
        assert len(asked) == rounds  # cached
        now[0] = 61.0
        assert windows.window("gpt-4o") is None
        assert len(asked) == 2 * rounds  # asked again after the retry interval


def test_a_found_window_is_asked_again_after_its_ttl_and_on_forget() -> None:
    now = [0.0]
    with upstream({("GET", "/props"): {"n_ctx": 4096}}) as (url, asked):
        windows = _windows(url, ttl=600.0, clock=lambda: now[0])
        assert windows.window("m") == 4096
        first = len(asked)
        now[0] = 599.0
        windows.window("m")
        assert len(asked) == first
        now[0] = 601.0
        windows.window("m")
        assert len(asked) == 2 * first
        windows.forget("m")
        windows.window("m")
        assert len(asked) == 3 * first


@pytest.mark.parametrize(
    "answer",
    [
        PlainTextResponse("<html>hello</html>"),
        JSONResponse([1, 2, 3]),
        JSONResponse({"n_ctx": -5}),
        JSONResponse({"n_ctx": "8192"}),
        JSONResponse({"n_ctx": True}),
        JSONResponse({"default_generation_settings": "x"}),
        JSONResponse({"error": "boom"}, status_code=500),
    ],
)
def test_garbage_answers_are_none_never_an_exception(answer: Response) -> None:
    paths = ("/v1/models", "/props", "/api/ps", "/api/show", "/api/v0/models")
    routes = {(m, p): answer for m in ("GET", "POST") for p in paths}
    with upstream(routes) as (url, _):
        assert _windows(url).window("m") is None


def test_unreachable_upstream_is_none() -> None:
    assert _windows("http://127.0.0.1:9/v1", timeout=0.5).window("m") is None


def test_concurrent_callers_share_one_round_of_questions() -> None:
    gate = threading.Event()

    def slow_props(_: Any) -> Any:
        gate.wait(10)  # holds the first question open while the other callers arrive
        return {"n_ctx": 4096}

    with upstream({("GET", "/props"): slow_props}) as (url, asked):
        windows = _windows(url)
        results: list[int | None] = []
        threads = [
            threading.Thread(target=lambda: results.append(windows.window("m"))) for _ in range(16)
        ]
        for thread in threads:
            thread.start()
        gate.set()
        for thread in threads:
            thread.join(30)
        assert results == [4096] * 16
        assert asked.count("GET /props") == 1


@pytest.mark.slow
def test_real_llama_cpp_python_server_publishes_no_window(llama: LlamaServer) -> None:
    # llama-cpp-python's server answers /v1/models without any context length and has none of
    # /props, /api/*: the window is unknown (the registry's is used), and nothing raises.
    with LLMClient(llama.url, timeout=10, max_retries=0) as client:
        windows = ServedWindows(client)
        assert windows.window(llama.model) is None
        assert windows.window(llama.model) is None
    assert llama.alive()


def test_a_hanging_upstream_is_cut_by_the_question_timeout() -> None:
    release = threading.Event()

    def hanging(_: Any) -> Any:
        release.wait(3)  # far longer than the question's timeout below
        return {"n_ctx": 4096}

    with upstream({("GET", "/props"): hanging}) as (url, asked):
        client = LLMClient(url, timeout=60, max_retries=0)  # the chat timeout is not used
        _clients.append(client)
        windows = ServedWindows(client, timeout=0.3)
        assert windows.window("m") is None  # the answer came after the question gave up
        release.set()
        assert asked[:2] == ["GET /v1/models", "GET /props"]
