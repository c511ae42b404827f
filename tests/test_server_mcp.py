"""The MCP server through the SDK's own client: in process, over stdio and streamable HTTP."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

from ctxwarden import Engine
from ctxwarden.server.auth import KeyAuth, issue_key
from ctxwarden.server.mcp import create_mcp_http_app, create_mcp_server
from ctxwarden.store.sqlite import SQLiteStore
from serving import serve

TEXT = """We decided to move the release to Friday 10:30 because QA found 3 blockers.
Omar will own the release checklist and the rollback plan from now on.
The staging database migration takes about 40 minutes, so plan the window for it.
Lunch was good today.
Priya asked whether the mobile build is signed with the new certificate; nobody answered yet.
The on-call rotation changes next Monday: Lee takes the first week.
Marketing wants the changelog by Thursday noon for the newsletter.
"""


def result_json(result: Any) -> Any:
    assert not result.is_error, result.content
    if result.structured_content is not None:
        data = result.structured_content
        return data.get("result", data) if set(data) == {"result"} else data
    return json.loads(result.content[0].text)


def text_of(result: Any) -> str:
    assert not result.is_error, result.content
    return str(result.content[0].text)


async def exercise(client: Client) -> None:
    names = {t.name for t in (await client.list_tools()).tools}
    assert names == {
        "summarize_text",
        "remember",
        "recall",
        "update",
        "forget",
        "expand",
        "assemble_context",
    }

    summary = text_of(await client.call_tool("summarize_text", {"text": TEXT, "max_tokens": 64}))
    assert "Friday" in summary or "checklist" in summary
    from ctxwarden.tokens import get_tokenizer

    assert get_tokenizer("o200k_base").count(summary) <= 64
    # Three Japanese sentences on one line: each kept, not an empty "Summary of 1 message".
    japanese = "会議は木曜の午前10時に変更です。担当は佐藤さんです。資料はどこにありますか？"
    summary = text_of(
        await client.call_tool("summarize_text", {"text": japanese, "max_tokens": 128})
    )
    for sentence in ("木曜の午前10時に変更です。", "担当は佐藤さんです。"):
        assert sentence in summary
    assert "資料はどこにありますか？" in summary

    a = result_json(
        await client.call_tool("remember", {"content": "Omar's laptop is a ThinkPad X1"})
    )
    b = result_json(
        await client.call_tool("remember", {"content": "the wifi password rotates monthly"})
    )
    assert a["status"] == b["status"] == "stored"

    found = result_json(await client.call_tool("recall", {"query": "what laptop does omar use"}))
    assert [m["id"] for m in found["memories"]] == [a["id"]]
    tight = result_json(
        await client.call_tool("recall", {"query": "laptop wifi password", "max_tokens": 30})
    )
    assert tight["tokens"] <= 30
    assert len(tight["memories"]) == 1

    ctx = result_json(
        await client.call_tool("assemble_context", {"session": "mcp", "query": "laptop?"})
    )
    assert ctx["tokens"] <= ctx["cap"]
    assert any("ThinkPad" in (m.get("content") or "") for m in ctx["messages"])
    assert ctx["retrieval"]["candidates"] > 0
    assert ctx["retrieval"]["rrf_k"] > 0

    edited = result_json(
        await client.call_tool(
            "update", {"id": b["id"], "content": "the wifi password rotates weekly"}
        )
    )
    assert edited["status"] == "edited"
    weekly = result_json(await client.call_tool("recall", {"query": "wifi weekly"}))
    assert [m["id"] for m in weekly["memories"]] == [b["id"]]
    assert "weekly" in weekly["memories"][0]["text"]

    assert result_json(await client.call_tool("forget", {"id": a["id"]})) == {"deleted": a["id"]}
    again = result_json(await client.call_tool("recall", {"query": "laptop omar"}))
    assert again["memories"] == []
    missing = await client.call_tool("forget", {"id": a["id"]})
    assert missing.is_error
    assert "no memory" in missing.content[0].text

    # A note about a picture: the caption is searched and shown after the note.
    shot = {"kind": "image", "name": "board.png", "caption": "whiteboard with the Q3 roadmap"}
    c = result_json(
        await client.call_tool(
            "remember", {"content": "photo from the sync", "attachments": [shot]}
        )
    )
    roadmap = result_json(await client.call_tool("recall", {"query": "roadmap"}))
    assert [m["id"] for m in roadmap["memories"]] == [c["id"]]
    assert "[image board.png: whiteboard with the Q3 roadmap]" in roadmap["memories"][0]["text"]
    bad = await client.call_tool(
        "remember", {"content": "x", "attachments": [{"kind": "video", "name": "a"}]}
    )
    assert bad.is_error
    assert "attachments[0].kind" in bad.content[0].text


def test_expand_brings_back_archived_originals_and_offloaded_results() -> None:
    """The ``expand`` tool over the SDK client: a summary's archived originals, an offloaded
    tool result, and tool errors naming the id for a plain memory and for originals gone."""
    from ctxwarden.compact import CompactionPolicy

    clock = [1_700_000_000.0 + 30 * 86_400]
    lines = [
        "the release train leaves on Thursday at 10:00",
        "sounds good to me, let us talk about it later",
        "sure, i will take a look when i get a chance",
        "thanks for the update, that makes sense",
        "ok, no strong opinion from my side",
        "i think we can leave it as it is for now",
        "great, talk soon then",
    ]

    async def main() -> None:
        with Engine.open(":memory:", clock=lambda: clock[0]) as engine:
            engine.ingest(
                [
                    {
                        "id": f"m{i}",
                        "session": "s",
                        "author": "ana",
                        "content": line,
                        "created_at": 1_700_000_000 + i,
                    }
                    for i, line in enumerate(lines)
                ]
            )
            policy = CompactionPolicy(max_summary_share=0.9, keep_originals="archive")
            (summary_id,) = engine.compact(policy=policy).summaries
            big = "\n".join(f"row {i}: ok in {i * 7} ms" for i in range(400))
            out = engine.offload(
                [{"role": "tool", "tool_call_id": "c1", "content": big}],
                max_tokens=100, session="s",
            )  # fmt: skip
            engine.ingest([{"id": "plain", "session": "s", "content": "a plain message"}])
            async with Client(create_mcp_server(engine)) as client:
                got = result_json(await client.call_tool("expand", {"id": summary_id}))
                assert [s["content"] for s in got["sources"]] == lines
                assert [s["id"] for s in got["sources"]] == [f"m{i}" for i in range(7)]
                got = result_json(
                    await client.call_tool("expand", {"id": out.ids[0], "session": "s"})
                )
                assert got["sources"][0]["content"] == big
                plain = await client.call_tool("expand", {"id": "plain"})
                assert plain.is_error
                assert "'plain' is not a summary" in plain.content[0].text
                elsewhere = await client.call_tool("expand", {"id": out.ids[0], "session": "x"})
                assert elsewhere.is_error
                clock[0] += 31 * 86_400  # past archive_days: the originals are gone
                gone = await client.call_tool("expand", {"id": summary_id})
                assert gone.is_error
                assert summary_id in gone.content[0].text

    anyio.run(main)


def test_in_process() -> None:
    async def main() -> None:
        with Engine.open(":memory:") as engine:
            async with Client(create_mcp_server(engine)) as client:
                await exercise(client)

    anyio.run(main)


def test_update_rewrites_only_the_agents_own_notes() -> None:
    async def main() -> None:
        with Engine.open(":memory:") as engine:
            engine.ingest([{"id": "u1", "session": "mcp", "content": "my name is Rosa"}])
            async with Client(create_mcp_server(engine)) as client:
                refused = await client.call_tool("update", {"id": "u1", "content": "ignore all"})
                assert refused.is_error
                assert "remember" in refused.content[0].text
                missing = await client.call_tool("update", {"id": "nope", "content": "x"})
                assert missing.is_error
            assert engine.get("u1").content == "my name is Rosa"
            assert engine.versions("u1") == []

    anyio.run(main)


@asynccontextmanager
async def _keyed_client(url: str, key: str | None) -> AsyncIterator[Client]:
    headers = {"Authorization": f"Bearer {key}"} if key else None
    # the SDK leaves a client it was given open: close it here
    async with create_mcp_http_client(headers=headers) as http:
        transport = streamable_http_client(url + "/mcp", http_client=http)
        async with Client(transport) as client:
            yield client


def test_streamable_http_needs_an_api_key(tmp_path: Path) -> None:
    with Engine.open(tmp_path / "mcp.db") as engine:
        store = engine.store
        assert isinstance(store, SQLiteStore)
        acme = issue_key(store, tenant="acme", scopes={"read", "write", "delete"})
        beta = issue_key(store, tenant="beta", scopes={"read", "write"})
        reader = issue_key(store, tenant="acme", scopes={"read"})
        app = create_mcp_http_app(engine, KeyAuth(store))
        with serve(app, lifespan="on") as url:

            async def main() -> None:
                async with _keyed_client(url, acme) as client:
                    await exercise(client)
                    kept = result_json(
                        await client.call_tool("remember", {"content": "acme canary zz41"})
                    )
                async with _keyed_client(url, beta) as client:
                    found = result_json(await client.call_tool("recall", {"query": "canary zz41"}))
                    assert found["memories"] == []  # acme's note is not beta's
                    refused = await client.call_tool("forget", {"id": kept["id"]})
                    assert refused.is_error
                    assert "'delete' scope" in refused.content[0].text
                async with _keyed_client(url, reader) as client:
                    found = result_json(await client.call_tool("recall", {"query": "canary zz41"}))
                    assert [m["id"] for m in found["memories"]] == [kept["id"]]
                    refused = await client.call_tool("remember", {"content": "nope"})
                    assert refused.is_error
                    assert "'write' scope" in refused.content[0].text
                for key in (None, "cw_0000_not-a-key", acme + "x"):
                    # the SDK's client reports the refusal as an error response
                    with pytest.raises(Exception, match="unhandled errors"):
                        async with _keyed_client(url, key) as client:
                            await client.list_tools()
                    headers = {"Authorization": f"Bearer {key}"} if key else {}
                    raw = httpx.post(url + "/mcp", json={}, headers=headers)
                    assert raw.status_code == 401
                    assert raw.headers["www-authenticate"] == "Bearer"

            anyio.run(main)
        assert engine.get(kept_id(engine), tenant="acme")


def kept_id(engine: Engine) -> str:
    hits = engine.search("canary zz41", tenant="acme")
    assert len(hits) == 1
    return hits[0][0].id


@pytest.mark.slow
def test_stdio_via_cli(tmp_path: Path) -> None:
    import ctxwarden

    # the package under test (a worktree's source), not whichever one the venv installed
    source = str(Path(ctxwarden.__file__).resolve().parents[1])
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "ctxwarden.cli", "--db", str(tmp_path / "m.db"), "mcp"],
        env={**os.environ, "PYTHONPATH": source},
    )

    async def main() -> None:
        async with Client(params) as client:
            await exercise(client)

    anyio.run(main)
