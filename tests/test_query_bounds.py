"""Hostile input sizes (issue 20, item 1): every request-path step is linear (or bounded) in the
query and message size, and the query itself is bounded.

No wall clock: each test either counts what reached the store and the embedder, or feeds an
input so large that the quadratic code it replaced would hold the suite for many minutes (the
entity scan took 0.65 s at 40k characters and grew with the square; ``"?" * 20_000`` took 29 s
in the question check and a 20k-id citation 71 s in the summary de-dup).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import httpx
import numpy as np
import numpy.typing as npt
import pytest

from ctxwarden.assemble import _summary_line_keys
from ctxwarden.embed import StaticEmbedder
from ctxwarden.engine import Engine, EngineConfig
from ctxwarden.entities import entities as _entities
from ctxwarden.errors import ConfigError, InputError
from ctxwarden.llm import LLMClient
from ctxwarden.models import ModelSpec
from ctxwarden.retrieve import MAX_QUERY_CHARS, RetrievalWeights, _is_question
from ctxwarden.server.http import ServerConfig, create_app
from ctxwarden.server.proxy import ProxyConfig, create_proxy_app
from ctxwarden.server.served import _NUM_CTX
from ctxwarden.store.sqlite import SQLiteStore
from llmserver import ScriptedServer, completion
from serving import serve

WORDS = (
    "Ana moved the v2.3 deploy to Lake Tahoe after the SSO outage. Why? Ask ops_team now".split()
)


def _text(chars: int) -> str:
    """Words with entities, sentence ends and identifiers, cycled to ``chars`` characters."""
    unit = " ".join(WORDS) + " "
    return (unit * (chars // len(unit) + 1))[:chars]


class _CountingStore(SQLiteStore):
    """The real SQLite store, recording the terms of every full-text search."""

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.searched: list[list[str]] = []

    def search(self, tenant: str, terms: Sequence[str], **kwargs: Any) -> Any:
        self.searched.append(list(terms))
        return super().search(tenant, terms, **kwargs)


class _CountingEmbedder(StaticEmbedder):
    """The real static embedder, recording the length of every text it embeds."""

    def __init__(self) -> None:
        super().__init__()
        self.lengths: list[int] = []

    def embed(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        self.lengths.extend(len(t) for t in texts)
        return super().embed(texts)


def test_the_entity_scan_is_linear_in_the_query() -> None:
    # Half a million characters: the old scan re-read the text before every token (minutes).
    query = _text(500_000)
    found = _entities(query)
    assert {"Ana", "Lake Tahoe", "v2.3", "SSO", "ops_team"} <= set(found)
    # a name opening a sentence is not an entity; after "Why? " Ask opens one
    assert "Ask" not in found
    assert _entities("ok. Ana left") == []
    assert _entities("ok Ana left") == ["Ana"]


def test_pathological_texts_are_scanned_in_linear_time() -> None:
    assert _is_question("?" * 2_000_000 + "x") is False
    assert _is_question("x" + "?" * 2_000_000) is True
    assert _is_question("see https://x.io/?a=1 ok") is False
    citation = "- [" + ",".join(["ab"] * 500_000) + " x"
    assert len(_summary_line_keys(citation)) == 1  # no citation: only the line's own key
    assert _summary_line_keys("- [m1, m2] ana: standup at 10:30") >= {"standup at 10:30"}
    assert _summary_line_keys("\t " * 500_000 + "[m1] x") >= {"x"}
    assert _NUM_CTX.search("\n" * 1_000_000) is None
    assert _NUM_CTX.search("stop <eos>\n  num_ctx   8192 \nseed 1").group(1) == "8192"


def test_a_huge_query_drives_retrieval_by_its_first_characters_only() -> None:
    store = _CountingStore(":memory:")
    embedder = _CountingEmbedder()
    config = EngineConfig(max_query_chars=2_100_000, embed="sync")
    with Engine(store, config=config, embedder=embedder) as engine:
        engine.ingest(
            [{"id": f"m{i}", "content": _text(300 + i), "author": "ana"} for i in range(40)],
            session="s",
        )
        embedder.lengths.clear()
        query = _text(2_000_000)
        context = engine.assemble(session="s", query=query, model="big", window=1_000_000)
    assert context.messages[-1] == {"role": "user", "content": query}  # sent whole
    assert any(c.block == "related" for c in context.report.candidates)
    limit = RetrievalWeights().query_chars
    assert embedder.lengths
    assert max(embedder.lengths) <= limit
    assert store.searched
    assert all(len(terms) <= 12 + 4 for terms in store.searched)
    assert all(len(t) <= limit for terms in store.searched for t in terms)


def test_a_query_over_the_limit_is_refused_naming_the_field() -> None:
    with Engine.open(":memory:") as engine:
        engine.ingest([{"id": "m1", "content": "deploy at ten"}], session="s")
        before = engine.stats()
        with pytest.raises(InputError, match="field 'query'") as raised:
            engine.assemble(session="s", query="x" * (MAX_QUERY_CHARS + 1))
        assert raised.value.field == "query"
        with pytest.raises(InputError, match="max_query_chars"):
            engine.search("x" * (MAX_QUERY_CHARS + 1))
        assert engine.stats() == before  # no context logged
        engine.assemble(session="s", query="x" * MAX_QUERY_CHARS)  # the limit itself is fine
    with pytest.raises(ConfigError, match="max_query_chars"):
        EngineConfig(max_query_chars=0)
    with pytest.raises(ConfigError, match="query_chars"):
        RetrievalWeights(query_chars=0)


@pytest.fixture
def small_limit_url() -> Iterator[str]:
    config = EngineConfig(max_query_chars=1_000)
    server = ServerConfig(max_body_bytes=8 << 20)
    with Engine.open(":memory:", config=config) as engine, serve(create_app(engine, server)) as url:
        yield url


@pytest.mark.parametrize("path", ["/v1/assemble", "/v1/search"])
def test_over_http_a_long_query_is_a_422_naming_query(small_limit_url: str, path: str) -> None:
    with httpx.Client(base_url=small_limit_url, timeout=60) as client:
        body = {"session": "s", "query": "x" * 1_001}
        r = client.post(path, json=body)
        assert r.status_code == 422, r.text
        assert r.json()["error"]["field"] == "query"
        assert "1,001 characters, over the limit of 1,000" in r.json()["error"]["message"]
        assert client.post(path, json={**body, "query": "x" * 1_000}).status_code == 200
        # a body over the server's size limit is refused before it is parsed
        r = client.post(path, json={**body, "query": "x" * (9 << 20)})
        assert r.status_code == 413


def test_a_million_character_message_through_the_proxy_is_answered() -> None:
    # Issue 20: a 1M-character message got no answer in 600 s. It is remembered for the end
    # user, searched for by its first characters, and sent on whole.
    big = ModelSpec(name="big", tokenizer="o200k_base", window=1_000_000, chat_format="chatml",
                    max_output=1_000)  # fmt: skip
    message = _text(1_000_000)
    with (
        ScriptedServer([completion("ok"), completion("ok again")]) as upstream,
        Engine.open(":memory:", config=EngineConfig(models=(big,))) as engine,
        LLMClient(upstream.url, api_key="sk-upstream", max_retries=0) as llm,
        serve(create_proxy_app(engine, llm, ProxyConfig(probe_window=False))) as url,
        httpx.Client(base_url=url, timeout=300) as client,
    ):
        first = [{"role": "user", "content": "the deploy moved to Lake Tahoe"}]
        body = {"model": "big", "user": "ann", "messages": first}
        assert client.post("/v1/chat/completions", json=body).status_code == 200
        body["messages"] = [*first, {"role": "assistant", "content": "ok"},
                            {"role": "user", "content": message}]  # fmt: skip
        r = client.post("/v1/chat/completions", json=body)
        assert r.status_code == 200, r.text[:300]
        assert r.json()["choices"][0]["message"]["content"] == "ok again"
        sent = upstream.chat_requests()[-1].body["messages"]
        assert sent[-1] == {"role": "user", "content": message}
        assert engine.stats(user="ann")["memories"] >= 3
