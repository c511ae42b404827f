"""Tenants and API keys: twenty tenants each plant a random canary; no door (HTTP API, proxy,
MCP) ever returns another tenant's canary, a missing, unknown, foreign or revoked key is refused,
and keys never show up in logs or reports."""

from __future__ import annotations

import json
import logging
import re
import secrets
from collections.abc import Iterator
from dataclasses import dataclass

import anyio
import httpx
import openai
import pytest
from mcp import Client

from ctxwarden import Engine
from ctxwarden.llm import LLMClient
from ctxwarden.server.auth import KeyAuth, issue_key
from ctxwarden.server.http import ServerConfig, create_app
from ctxwarden.server.mcp import create_mcp_server
from ctxwarden.server.proxy import ProxyConfig, create_proxy_app
from ctxwarden.store.sqlite import SQLiteStore
from llmserver import Recorded, ScriptedServer
from serving import serve

TENANTS = [f"tenant-{i:02d}" for i in range(20)]
UPSTREAM_KEY = "sk-upstream-" + secrets.token_hex(8)


@dataclass
class World:
    engine: Engine
    api: str
    proxy: str
    upstream: ScriptedServer
    keys: dict[str, str]
    canaries: dict[str, str]
    readonly: dict[str, str]

    def auth(self, tenant: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.keys[tenant]}"}

    def others(self, tenant: str) -> list[str]:
        return [c for t, c in self.canaries.items() if t != tenant]


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    path = tmp_path_factory.mktemp("tenants") / "t.db"
    engine = Engine(SQLiteStore(path))
    assert isinstance(engine.store, SQLiteStore)
    keys = {
        t: issue_key(engine.store, tenant=t, scopes={"read", "write", "delete"}) for t in TENANTS
    }
    readonly = {t: issue_key(engine.store, tenant=t, scopes={"read"}) for t in TENANTS[:2]}
    canaries = {t: f"canary{secrets.token_hex(6)}" for t in TENANTS}
    server = ServerConfig(authenticate=KeyAuth(engine.store))

    def reply(recorded: Recorded) -> str:
        return "ok, noted"

    with (
        ScriptedServer(reply) as upstream,
        LLMClient(upstream.url, api_key=UPSTREAM_KEY, max_retries=0) as llm,
        serve(create_app(engine, server)) as api,
        serve(create_proxy_app(engine, llm, ProxyConfig(server=server))) as proxy,
    ):
        world = World(engine, api, proxy, upstream, keys, canaries, readonly)
        for tenant in TENANTS:
            canary = canaries[tenant]
            note = {"id": "note", "role": "user", "content": f"secret note {canary} for the team"}
            own = {"id": f"only-{tenant}", "role": "user", "content": f"the vault code is {canary}"}
            repeat = {"id": f"again-{tenant}", "role": "user",
                      "content": f"secret note {canary} for the team"}  # fmt: skip
            r = httpx.post(
                api + "/v1/ingest",
                json={"records": [note, own, repeat], "session": "s"},
                headers=world.auth(tenant),
            )
            assert r.status_code == 200, r.text
            assert r.json()["counts"]["duplicate"] == 1  # a de-dup aggregate per tenant
        yield world
    engine.close()


def test_http_api_never_returns_another_tenants_canary(world: World) -> None:
    for tenant in TENANTS:
        auth = world.auth(tenant)
        canary = world.canaries[tenant]
        seen: list[str] = []
        with httpx.Client(base_url=world.api, headers=auth) as client:
            query = "secret note vault code canary " + " ".join(world.others(tenant)[:5])
            search = client.post("/v1/search", json={"query": query, "limit": 200})
            assert search.status_code == 200
            assert {h["memory"]["tenant"] for h in search.json()["hits"]} == {tenant}
            seen.append(search.text)
            # (the assembled context echoes its query, so that one names no foreign canary)
            assembled = client.post(
                "/v1/assemble", json={"session": "s", "query": "secret note vault code canary"}
            )
            assert canary in assembled.text
            seen.append(assembled.text)
            note = client.get("/v1/memories/note")
            assert canary in note.text
            seen.append(note.text)
            stats = client.get("/v1/stats")
            assert stats.json()["memories"] == 2
            assert canary in stats.text  # top families: the folded repeat
            seen.append(stats.text)
            # the dashboard's history routes read the caller's tenant only
            over_time = client.get("/v1/stats/history")
            assert over_time.status_code == 200, over_time.text
            assert over_time.json()["memories"]["now"] == 2
            assert sum(over_time.json()["folds"]["exact"]) == 1
            seen.append(over_time.text)
            noted = client.get("/v1/memories/again-" + tenant + "/history")
            assert noted.json()["found_as"] == "folded"
            assert canary in noted.text
            seen.append(noted.text)
            # every tenant has a "note" and the same two keyed facts: the versions and links
            # a history shows are its own tenant's only
            edit = {"content": f"secret note {canary} for the whole team"}
            assert client.patch("/v1/memories/note", json=edit).status_code == 200
            facts = [
                {
                    "id": f"fact-{n}",
                    "kind": "fact",
                    "key": "vault",
                    "created_at": 1000.0 + n,
                    "content": f"vault code number {n} is {canary}",
                }
                for n in (1, 2)
            ]
            assert client.post("/v1/ingest", json={"records": facts, "session": "s"}).is_success
            note = client.get("/v1/memories/note/history").json()
            was = f"secret note {canary} for the team"
            assert [v["content"] for v in note["versions"]] == [was]
            assert note["versions"][0]["replaced_by"] == edit["content"]
            older = client.get("/v1/memories/fact-1/history")
            assert older.json()["superseded_by"]["id"] == "fact-2"
            newer = client.get("/v1/memories/fact-2/history")
            assert [s["id"] for s in newer.json()["supersedes"]] == ["fact-1"]
            seen += [json.dumps(note), older.text, newer.text]
            other = TENANTS[(TENANTS.index(tenant) + 1) % len(TENANTS)]
            for method, path in [
                ("GET", f"/v1/memories/only-{other}"),
                ("GET", f"/v1/memories/again-{other}"),
                ("GET", f"/v1/memories/only-{other}/history"),
                ("GET", f"/v1/memories/again-{other}/history"),
                ("POST", f"/v1/memories/only-{other}/pin"),
                ("POST", f"/v1/memories/only-{other}/unpin"),
                ("DELETE", f"/v1/memories/only-{other}"),
            ]:
                r = client.request(method, path)
                assert r.status_code == 404, (method, path)
                seen.append(r.text)
        text = "\n".join(seen)
        for foreign in world.others(tenant):
            assert foreign not in text
    # the foreign deletes above deleted nothing
    assert all(world.engine.get(f"only-{t}", tenant=t) for t in TENANTS)


def test_proxy_never_sends_or_returns_another_tenants_canary(world: World) -> None:
    for tenant in TENANTS:
        before = len(world.upstream.chat_requests())
        client = openai.OpenAI(
            base_url=world.proxy + "/v1", api_key=world.keys[tenant], max_retries=0
        )
        raw = client.chat.completions.with_raw_response.create(
            model="gpt-4o-mini",
            messages=[
                {"role": "system", "content": "same system prompt for everyone"},
                {"role": "user", "content": "what is the vault code? secret note canary"},
            ],
            extra_headers={"X-Ctxwarden-Session": "s"},
        )
        stream = client.chat.completions.create(
            model="gpt-4o-mini",
            messages=[{"role": "user", "content": "the vault code again? secret note canary"}],
            extra_headers={"X-Ctxwarden-Session": "s"},
            stream=True,
        )
        streamed = json.dumps([chunk.model_dump() for chunk in stream])
        models = client.models.list().model_dump_json()
        client.close()
        sent = world.upstream.chat_requests()[before:]
        assert len(sent) == 2
        upstream_text = json.dumps([r.body for r in sent])
        assert world.canaries[tenant] in json.dumps(sent[0].body)  # its own memory was retrieved
        assert world.canaries[tenant] in json.dumps(sent[1].body)
        visible = (
            upstream_text + raw.http_response.text + json.dumps(dict(raw.headers)) + streamed
            + models
        )  # fmt: skip
        for foreign in world.others(tenant):
            assert foreign not in visible


def test_mcp_tools_never_return_another_tenants_canary(world: World) -> None:
    async def main() -> None:
        for tenant in TENANTS:
            async with Client(create_mcp_server(world.engine, tenant=tenant)) as client:
                texts = []
                for name, args in [
                    ("remember", {"content": f"mcp fact {tenant}", "session": "mcp"}),
                    ("recall", {"query": "secret note vault code canary", "max_tokens": 4000}),
                    ("assemble_context", {"session": "s", "query": "secret note canary"}),
                    ("summarize_text", {"text": "secret note canary " * 30, "max_tokens": 64}),
                ]:
                    result = await client.call_tool(name, args)
                    assert not result.is_error
                    texts.append(result.content[0].text)
                other = TENANTS[(TENANTS.index(tenant) + 1) % len(TENANTS)]
                result = await client.call_tool("forget", {"id": f"only-{other}"})
                assert result.is_error
                text = "\n".join(texts)
                assert world.canaries[tenant] in text
                for foreign in world.others(tenant):
                    assert foreign not in text

    anyio.run(main)


def test_missing_unknown_foreign_and_revoked_keys_are_refused(world: World) -> None:
    tenant = TENANTS[0]
    key_id = world.keys[tenant].split("_")[1]
    forged = f"cw_{key_id}_{secrets.token_urlsafe(32)}"
    revoked = issue_key(world.engine.store, tenant=tenant, scopes={"read"})  # type: ignore[arg-type]
    assert isinstance(world.engine.store, SQLiteStore)
    world.engine.store.revoke_api_key(revoked.split("_")[1], 1.0)
    bad_headers: list[dict[str, str]] = [
        {},
        {"Authorization": "Bearer nonsense"},
        {"Authorization": f"Bearer {forged}"},
        {"Authorization": f"Bearer {revoked}"},
        {"Authorization": f"Basic {world.keys[tenant]}"},
    ]
    for headers in bad_headers:
        for base, method, path, body in [
            (world.api, "POST", "/v1/search", {"query": "canary"}),
            (world.api, "GET", "/v1/stats", None),
            (world.api, "GET", "/v1/memories/note", None),
            (world.api, "POST", "/v1/ingest", {"records": [{"content": "x"}]}),
            (world.proxy, "GET", "/v1/models", None),
            (world.proxy, "POST", "/v1/chat/completions",
             {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]}),
        ]:  # fmt: skip
            r = httpx.request(method, base + path, json=body, headers=headers)
            assert r.status_code == 401, (headers, path, r.text)
            assert world.canaries[tenant] not in r.text
    readonly = {"Authorization": f"Bearer {world.readonly[tenant]}"}
    r = httpx.post(world.api + "/v1/ingest", json={"records": [{"content": "x"}]}, headers=readonly)
    assert r.status_code == 403
    assert httpx.get(world.api + "/v1/stats", headers=readonly).status_code == 200


def test_keys_never_reach_logs_reports_or_upstream(
    world: World, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    tenant = TENANTS[3]
    client = openai.OpenAI(base_url=world.proxy + "/v1", api_key=world.keys[tenant], max_retries=0)
    raw = client.chat.completions.with_raw_response.create(
        model="gpt-4o-mini", messages=[{"role": "user", "content": "hello"}]
    )
    client.close()
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(
            base_url=world.proxy + "/v1", api_key=world.keys[tenant] + "x", max_retries=0
        ).models.list()
    httpx.get(world.api + "/v1/stats", headers={"Authorization": "Bearer cw_zz_wrong"})
    auth = world.auth(tenant)
    api_texts = [
        httpx.post(world.api + "/v1/assemble", json={"session": "s", "query": "note"},
                   headers=auth).text,
        httpx.post(world.api + "/v1/compact/plan", json={}, headers=auth).text,
        httpx.post(world.api + "/v1/search", json={"query": "note"}, headers=auth).text,
        httpx.get(world.api + "/v1/stats", headers=auth).text,
        httpx.get(world.api + "/metrics").text,
    ]  # fmt: skip
    sent = world.upstream.chat_requests()[-1]
    assert sent.headers["Authorization"] == f"Bearer {UPSTREAM_KEY}"
    visible = "\n".join(
        [
            caplog.text,
            raw.headers["x-ctxwarden-report"],
            raw.http_response.text,
            json.dumps(sent.body),
            json.dumps({k: v for k, v in sent.headers.items() if k != "Authorization"}),
            *api_texts,
        ]
    )
    for key in [*world.keys.values(), *world.readonly.values(), UPSTREAM_KEY]:
        assert key not in visible
        if key.startswith("cw_"):  # nor an issued key's secret part alone (it may hold "_")
            assert key.split("_", 2)[2] not in visible
    assert re.search(r"Bearer\s+\S", visible) is None  # no credential after any Bearer


def test_compaction_summaries_and_metrics_stay_within_the_tenant(world: World) -> None:
    everything = {"older_than": 0, "access_threshold": 1e9, "max_summary_share": 0.95}
    for tenant in TENANTS[:10]:
        canary = world.canaries[tenant]
        seen: list[str] = []
        with httpx.Client(base_url=world.api, headers=world.auth(tenant)) as client:
            # A cluster to summarise of this test's own (not what earlier tests left behind).
            # (with small talk around it: a cluster of facts alone is left alone by design)
            talk = [
                "sounds good to me",
                "sure, will look later",
                "thanks, that makes sense",
                "ok, nothing else from me",
                "agreed, talk soon",
                "fine by me as well",
            ]
            related = [
                {"role": "user", "content": f"the team reviewed secret note {canary} today"},
                *(
                    {"role": "user", "content": f"{line}, about the {thing} of the secret note"}
                    for line in talk
                    for thing in ("wording", "format", "owner", "timing", "audience", "length")
                ),
                {"role": "user", "content": f"secret note {canary} was shared with the team"},
            ]
            ingested = client.post("/v1/ingest", json={"records": related, "session": "compacted"})
            assert ingested.status_code == 200, ingested.text
            plan = client.post("/v1/compact/plan", json=everything)
            assert plan.status_code == 200, plan.text
            applied = client.post("/v1/compact/apply", json=everything)
            assert applied.status_code == 200, applied.text
            assert applied.json()["summaries"], applied.text
            assembled = client.post(
                "/v1/assemble",
                json={"session": "compacted", "query": "secret note vault code canary"},
            )
            assert canary in assembled.text  # its own summary (or originals) came back
            seen += [plan.text, applied.text, assembled.text, client.get("/v1/stats").text]
            search = client.post("/v1/search", json={"query": f"vault {canary}", "limit": 200})
            assert {h["memory"]["tenant"] for h in search.json()["hits"]} == {tenant}
            seen.append(search.text)
        text = "\n".join(seen)
        for foreign in world.others(tenant):
            assert foreign not in text
    metrics = httpx.get(world.api + "/metrics").text
    assert "compaction" in metrics
    assert not any(c in metrics for c in world.canaries.values())


def test_deleting_a_tenant_revokes_its_keys(world: World) -> None:
    tenant, neighbour = TENANTS[19], TENANTS[18]
    auth = world.auth(tenant)
    deleted = httpx.delete(world.api + "/v1/tenant", headers=auth)
    assert deleted.status_code == 200, deleted.text
    assert deleted.json()["deleted"] >= 2
    for base, method, path, body in [
        (world.api, "GET", "/v1/stats", None),
        (world.api, "POST", "/v1/search", {"query": "canary"}),
        (world.api, "POST", "/v1/ingest", {"records": [{"content": "back again"}]}),
        (world.api, "DELETE", "/v1/tenant", None),
        (world.proxy, "GET", "/v1/models", None),
    ]:  # fmt: skip
        r = httpx.request(method, base + path, json=body, headers=auth)
        assert r.status_code == 401, (path, r.text)
        assert "revoked" in r.json()["error"]["message"]
    assert [k.revoked_at is not None for k in world.engine.store.api_keys(tenant)] == [True]  # type: ignore[attr-defined]
    stats = httpx.get(world.api + "/v1/stats", headers=world.auth(neighbour))
    assert stats.status_code == 200
    assert stats.json()["memories"] >= 1
