"""The proxy end to end against a real model server: the official ``openai`` client -> the
ctxwarden proxy (real uvicorn on loopback) -> llama.cpp's OpenAI-compatible server running
Gemma 3 270M (see realserver.py; slow, needs the ``llmserver`` group).

The same request is also sent to llama.cpp directly, with greedy decoding: what comes back
through the proxy must be that reply, unchanged apart from the ``x-ctxwarden-report`` header and
the per-request ``id`` and ``created`` stamps.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import openai
import pytest

from ctxwarden import Engine
from ctxwarden.llm import LLMClient
from ctxwarden.server.proxy import create_proxy_app
from realserver import LlamaServer
from serving import serve

pytestmark = pytest.mark.slow

#: Per-request stamps a server makes up for every reply: never equal between two requests.
STAMPS = ("id", "created")
#: Greedy and short: the same prompt gives the same reply, and the test stays quick.
SAMPLING: dict[str, Any] = {"max_tokens": 24, "temperature": 0.0, "seed": 7}


@dataclass
class Rig:
    llama: LlamaServer
    engine: Engine
    proxy: openai.OpenAI
    direct: openai.OpenAI


@pytest.fixture
def rig(llama: LlamaServer) -> Iterator[Rig]:
    with (
        Engine.open(":memory:") as engine,
        LLMClient(llama.url, timeout=300.0, max_retries=0) as upstream,
        serve(create_proxy_app(engine, upstream)) as url,
        openai.OpenAI(
            base_url=url + "/v1", api_key="sk-agent", max_retries=0, timeout=300
        ) as proxy,
        openai.OpenAI(base_url=llama.url, api_key="unused", max_retries=0, timeout=300) as direct,
    ):
        yield Rig(llama=llama, engine=engine, proxy=proxy, direct=direct)
    assert llama.alive(), f"the llama.cpp server died: {llama.log_tail()}"


def reset(rig: Rig) -> None:
    """Leave the server's KV cache in one known state. llama.cpp reuses the cached prefix of the
    previous prompt, and a prompt evaluated in other batches gives slightly different logits:
    the same greedy request must start from the same cache to give the same reply."""
    rig.direct.chat.completions.create(
        model=rig.llama.model,
        messages=[{"role": "user", "content": "Reset."}],
        max_tokens=1,
        temperature=0.0,
    )


def unstamped(body: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in body.items() if k not in STAMPS}


def session_memories(engine: Engine, session: str, count: int = 2) -> list[tuple[str, str]]:
    """The session's memories, oldest first, once ``count`` are there (the proxy stores a
    reply just after sending it)."""
    deadline = time.monotonic() + 10
    while True:
        newest_first = engine.store.recent(engine.config.tenant, session)
        if len(newest_first) >= count or time.monotonic() > deadline:
            return [(m.role, m.content) for m in reversed(newest_first)]
        time.sleep(0.01)


MESSAGES = [{"role": "user", "content": "List three colours of the rainbow."}]


def test_non_streaming_reply_is_the_upstream_reply(rig: Rig) -> None:
    reset(rig)
    raw = rig.proxy.chat.completions.with_raw_response.create(
        model=rig.llama.model,
        messages=MESSAGES,  # type: ignore[arg-type]
        extra_headers={"X-Ctxwarden-Session": "real-1"},
        **SAMPLING,
    )
    via_proxy = raw.http_response.json()
    report = json.loads(raw.headers["x-ctxwarden-report"])
    reset(rig)
    direct = rig.direct.chat.completions.with_raw_response.create(
        model=rig.llama.model,
        messages=MESSAGES,  # type: ignore[arg-type]
        **SAMPLING,
    ).http_response.json()

    assert unstamped(via_proxy) == unstamped(direct)
    assert via_proxy["object"] == "chat.completion"
    text = via_proxy["choices"][0]["message"]["content"]
    assert isinstance(text, str)
    assert text.strip(), "the model answered nothing: the comparison would prove little"
    # parsed by the official client too
    assert raw.parse().choices[0].message.content == text

    assert report["session"] == "real-1"
    assert report["model"] == "gemma-3-270m"
    assert report["stored"] == {"stored": 1}
    assert report["sent_messages"] == 1
    assert report["unchanged"] is True
    stored = session_memories(rig.engine, "real-1")
    assert stored == [("user", MESSAGES[0]["content"]), ("assistant", text.strip())]


def test_streaming_reply_is_the_upstream_stream(rig: Rig) -> None:
    reset(rig)
    raw = rig.proxy.chat.completions.with_raw_response.create(
        model=rig.llama.model,
        messages=MESSAGES,  # type: ignore[arg-type]
        stream=True,
        user="real-2",
        **SAMPLING,
    )
    report = json.loads(raw.headers["x-ctxwarden-report"])
    chunks = list(raw.parse())
    reset(rig)
    direct = list(
        rig.direct.chat.completions.create(
            model=rig.llama.model,
            messages=MESSAGES,  # type: ignore[arg-type]
            stream=True,
            **SAMPLING,
        )
    )

    def events(stream: list[Any]) -> list[dict[str, Any]]:
        return [unstamped(chunk.model_dump()) for chunk in stream]

    assert events(chunks) == events(direct)
    assert len(chunks) > 2  # streamed token by token, not one body sent as events
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text.strip()

    assert report["user"] == "real-2"
    assert report["stored"] == {"stored": 1}
    stored = session_memories(rig.engine, "user:real-2")  # an end user's own session
    assert stored == [("user", MESSAGES[0]["content"]), ("assistant", text.strip())]
