"""tokenizer= and window= through every face: HTTP (real uvicorn), MCP (the SDK's client), CLI.

Regression for issue 16, reproduction 6 (second half): the family names the issue lists are
accepted everywhere, and ``tokenizer='o200k_base'``, the advice the old refusal gave, works.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from mcp import Client

from ctxwarden import Engine
from ctxwarden.server.http import create_app
from ctxwarden.server.mcp import create_mcp_server
from serving import serve

# One name per family the issue names, as users spell them.
ISSUE_FAMILIES = [
    "claude-sonnet-4-5",
    "gemini-2.5-flash",
    "deepseek-chat",
    "microsoft/Phi-3.5-mini-instruct",
    "gpt-oss:20b",
    "meta-llama/Llama-4-Scout-17B-16E-Instruct",
    "gemma2:9b",
]
RECORDS = [{"id": f"r{i}", "content": f"note {i}: the release moves to friday"} for i in range(20)]


@pytest.fixture
def url() -> Iterator[str]:
    with Engine.open(":memory:") as engine, serve(create_app(engine)) as base:
        yield base


def test_http_assemble_takes_any_model_tokenizer_and_window(url: str) -> None:
    with httpx.Client(base_url=url) as client:
        assert client.post("/v1/ingest", json={"records": RECORDS, "session": "s"}).is_success
        for model in [*ISSUE_FAMILIES, "no-such-model-x"]:
            r = client.post("/v1/assemble", json={"session": "s", "model": model, "budget": 400})
            assert r.status_code == 200, (model, r.text)
            assert 0 < r.json()["tokens"] <= 400
        body = {"session": "s", "model": "no-such-model-x", "tokenizer": "o200k_base"}
        named = client.post("/v1/assemble", json={**body, "window": 4096}).json()
        assert (named["report"]["tokenizer"], named["report"]["exact"]) == ("o200k_base", True)
        assert named["report"]["window"] == 4096
        cases: list[tuple[dict[str, Any], str, str]] = [
            ({"tokenizer": "gpt-2000"}, "tokenizer", "unknown tokenizer 'gpt-2000'; known are"),
            ({"tokenizer": "gguf:/etc/hostname"}, "tokenizer", "only from the server's config"),
            ({"window": 0}, "window", "must be a positive integer"),
            ({"window": -1}, "window", "must be a positive integer"),
        ]
        before = client.get("/v1/stats").json()
        for extra, field, message in cases:
            r = client.post("/v1/assemble", json={"session": "s", **extra})
            assert r.status_code == 422, (extra, r.text)
            assert r.json()["error"]["field"] == field
            assert message in r.json()["error"]["message"]
        assert client.get("/v1/stats").json() == before


def test_mcp_assemble_context_takes_any_model_tokenizer_and_window() -> None:
    async def main() -> None:
        with Engine.open(":memory:") as engine:
            engine.ingest(RECORDS, session="mcp")
            async with Client(create_mcp_server(engine)) as client:
                for model in ISSUE_FAMILIES:
                    result = await client.call_tool(
                        "assemble_context", {"session": "mcp", "model": model, "budget": 300}
                    )
                    assert not result.is_error, (model, result.content)
                unknown = await client.call_tool(
                    "assemble_context", {"session": "mcp", "model": "acme-1"}
                )
                data = unknown.structured_content
                assert data is not None
                assert data["exact"] is False
                assert any("not in the registry" in n for n in data["notes"])
                named = await client.call_tool(
                    "assemble_context",
                    {"session": "mcp", "model": "acme-1", "tokenizer": "o200k_base",
                     "window": 2048},
                )  # fmt: skip
                data = named.structured_content
                assert data is not None
                assert (data["tokenizer"], data["exact"], data["notes"]) == ("o200k_base", True, [])
                assert data["cap"] < 2048
                for bad, message in (
                    ({"tokenizer": "nope"}, "field 'tokenizer': unknown tokenizer 'nope'"),
                    ({"window": 0}, "field 'window': must be a positive integer"),
                    ({"tokenizer": "gguf:/etc/hostname"}, "field 'tokenizer': gguf: paths"),
                ):
                    result = await client.call_tool("assemble_context", {"session": "mcp", **bad})
                    assert result.is_error
                    assert message in result.content[0].text

    anyio.run(main)


def test_cli_assemble_takes_every_issue_family(tmp_path: Path) -> None:
    db = str(tmp_path / "x.db")
    for model in ISSUE_FAMILIES:
        result = subprocess.run(
            [sys.executable, "-m", "ctxwarden", "--db", db, "assemble", "--session", "s",
             "--model", model, "--json"],
            capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        assert result.returncode == 0, (model, result.stderr)
        assert json.loads(result.stdout)["report"]["window"] > 0
