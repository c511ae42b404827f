"""Canaries across end users and tenants (issue 16, item 1): 50 end users under one tenant key
and 20 tenants each plant a unique canary through one of the faces (library, HTTP API, MCP over
streamable HTTP with the official ``mcp`` client, CLI); then every read path of every face is
tried as every user and tenant, and every returned body is searched for every foreign canary.

Both levels: an end user reads with their own ``user`` (default scope: their session; their
sessions with ``scope="user"``) and must see nothing of the other 49 users nor of any other
tenant; a tenant reads its whole tenant (``scope="tenant"``) and must see nothing of another
tenant. The HTTP API and MCP run under a real uvicorn server on loopback. The CLI runs in
process (typer's runner) on the same database file for a sample of the readers, every path
included (each invocation opens an engine: all 70 readers would cost several seconds more).
"""

from __future__ import annotations

import json
import random
import secrets
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from typer.testing import CliRunner

from ctxwarden import Engine, NotFound
from ctxwarden.cli import app as cli_app
from ctxwarden.server.auth import KeyAuth, issue_key
from ctxwarden.server.http import ServerConfig, create_app
from ctxwarden.server.mcp import create_mcp_http_app
from ctxwarden.store.sqlite import SQLiteStore
from serving import serve

SHARED = "shared-team"
USERS = [f"user-{i:02d}" for i in range(50)]
TENANTS = [f"tenant-{i:02d}" for i in range(20)]
READERS = USERS + TENANTS
FACES = ("library", "http", "mcp", "cli")
T0 = 1_800_000_000
QUERY = "what is my vault code secret canary"


@dataclass
class World:
    engine: Engine
    db: Path
    api: str
    mcp: str
    keys: dict[str, str]  # tenant -> API key
    canaries: dict[str, str] = field(default_factory=dict)  # reader -> canary
    notes: dict[str, str] = field(default_factory=dict)  # reader -> the id its note lives at

    def tenant(self, reader: str) -> str:
        return reader if reader in TENANTS else SHARED

    def foreign(self, reader: str) -> list[str]:
        """Every canary ``reader`` must never see: every other user's and tenant's."""
        return [c for r, c in self.canaries.items() if r != reader]

    def params(self, reader: str) -> dict[str, str]:
        """How ``reader`` names itself: an end user by ``user``; a tenant by nothing."""
        return {} if reader in TENANTS else {"user": reader}


def _session(reader: str) -> str:
    return f"s-{reader}"


def _note(reader: str, canary: str) -> dict[str, Any]:
    return {"id": f"note-{reader}", "role": "user",
            "content": f"my vault code is {canary}, keep it secret"}  # fmt: skip


@asynccontextmanager
async def _mcp(url: str, key: str) -> AsyncIterator[Client]:
    async with (
        create_mcp_http_client(headers={"Authorization": f"Bearer {key}"}) as http,
        Client(streamable_http_client(url + "/mcp", http_client=http)) as client,
    ):
        yield client


def _cli(world: World, *args: str) -> str:
    result = CliRunner().invoke(cli_app, ["--db", str(world.db), *args])
    assert result.exit_code == 0, result.output
    return result.output


def _plant(world: World, reader: str, face: str) -> None:
    canary = world.canaries[reader]
    tenant, session = world.tenant(reader), _session(reader)
    user = None if reader in TENANTS else reader
    note = _note(reader, canary)
    if face == "library":
        world.engine.ingest([note], tenant=tenant, session=session, user=user)
        world.notes[reader] = note["id"]
    elif face == "http":
        r = httpx.post(
            world.api + "/v1/ingest",
            json={"records": [note], "session": session, **world.params(reader)},
            headers={"Authorization": f"Bearer {world.keys[tenant]}"},
        )
        assert r.status_code == 200, r.text
        world.notes[reader] = note["id"]
    elif face == "mcp":

        async def remember() -> str:
            async with _mcp(world.mcp, world.keys[tenant]) as client:
                result = await client.call_tool(
                    "remember",
                    {"content": note["content"], "session": session, "kind": "message",
                     **world.params(reader)},
                )  # fmt: skip
                assert not result.is_error, result.content
                return str(json.loads(result.content[0].text)["id"])

        world.notes[reader] = anyio.run(remember)
    else:
        path = world.db.parent / f"{reader}.jsonl"
        path.write_text(json.dumps(note) + "\n", encoding="utf-8")
        _cli(world, "ingest", str(path), "--tenant", tenant, "--session", session,
             *(["--user", user] if user else []))  # fmt: skip
        world.notes[reader] = note["id"]


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    folder = tmp_path_factory.mktemp("canary")
    db = folder / "c.db"
    engine = Engine(SQLiteStore(db))
    store = engine.store
    assert isinstance(store, SQLiteStore)
    keys = {t: issue_key(store, tenant=t, scopes={"read", "write"}) for t in [SHARED, *TENANTS]}
    server = ServerConfig(authenticate=KeyAuth(store))
    with (
        serve(create_app(engine, server)) as api,
        serve(create_mcp_http_app(engine, KeyAuth(store)), lifespan="on") as mcp,
    ):
        world = World(engine, db, api, mcp, keys)
        world.canaries = {r: f"canary{secrets.token_hex(6)}" for r in READERS}
        for number, reader in enumerate(READERS):
            _plant(world, reader, FACES[number % len(FACES)])
        # Pins: even users pin for their session (the default), odd ones for all their
        # sessions; every tenant pins for the tenant. None may show to anyone else.
        for number, reader in enumerate(READERS):
            scope = "tenant" if reader in TENANTS else ("user" if number % 2 else None)
            engine.pin(world.notes[reader], tenant=world.tenant(reader), scope=scope)  # type: ignore[arg-type]
        yield world
    engine.close()


def _library_reads(world: World, reader: str) -> list[str]:
    engine, tenant, session = world.engine, world.tenant(reader), _session(reader)
    named = world.params(reader)
    wide = "user" if named else "tenant"
    bodies = []
    own = engine.assemble(tenant=tenant, session=session, query=QUERY, budget=3000, **named)
    assert world.canaries[reader] in json.dumps(own.to_dict())
    bodies.append(json.dumps(own.to_dict()))
    fresh = engine.assemble(tenant=tenant, session="fresh", query=QUERY, scope=wide, **named)
    assert world.canaries[reader] in json.dumps(fresh.to_dict())  # pinned or related
    bodies.append(json.dumps(fresh.to_dict()))
    adversarial = " ".join([QUERY, *random.Random(reader).sample(world.foreign(reader), 8)])
    for kwargs in ({"scope": wide}, {"session": session}):
        hits = engine.search(adversarial, tenant=tenant, limit=200, **named, **kwargs)  # type: ignore[arg-type]
        bodies.append(json.dumps([m.to_dict() for m, _ in hits]))
    assert world.canaries[reader] in bodies[-1]
    bodies.append(json.dumps(engine.stats(tenant=tenant, scope=wide, **named)))  # type: ignore[arg-type]
    bodies.append(json.dumps([m.to_dict() for m in engine.pinned(tenant=tenant, **named)]))
    mine = engine.get(world.notes[reader], tenant=tenant, **named)
    assert world.canaries[reader] in mine.content
    for other in random.Random(reader).sample([r for r in READERS if r != reader], 6):
        with pytest.raises(NotFound):
            found = engine.get(world.notes[other], tenant=tenant, **named)
            bodies.append(found.content)
    return bodies


def _http_reads(world: World, reader: str) -> list[str]:
    tenant, session, named = world.tenant(reader), _session(reader), world.params(reader)
    wide = "user" if named else "tenant"
    adversarial = " ".join([QUERY, *random.Random(reader).sample(world.foreign(reader), 8)])
    headers = {"Authorization": f"Bearer {world.keys[tenant]}"}
    bodies = []
    with httpx.Client(base_url=world.api, headers=headers) as client:
        for body in (
            {"session": session, "query": QUERY, "budget": 3000, **named},
            {"session": "fresh", "query": QUERY, "scope": wide, **named},
        ):
            r = client.post("/v1/assemble", json=body)
            assert r.status_code == 200, r.text
            assert world.canaries[reader] in r.text
            bodies.append(r.text)
        for body in (
            {"query": adversarial, "limit": 200, "scope": wide, **named},
            {"query": adversarial, "limit": 200, "session": session, **named},
        ):
            r = client.post("/v1/search", json=body)
            assert r.status_code == 200, r.text
            assert world.canaries[reader] in r.text
            bodies.append(r.text)
        for path, params in (
            ("/v1/stats", {"scope": wide, **named}),
            ("/v1/pins", named),
            (f"/v1/memories/{world.notes[reader]}", named),
        ):
            r = client.get(path, params=params)
            assert r.status_code == 200, r.text
            bodies.append(r.text)
        assert world.canaries[reader] in bodies[-1]
        for other in random.Random(reader).sample([r for r in READERS if r != reader], 6):
            r = client.get(f"/v1/memories/{world.notes[other]}", params=named)
            assert r.status_code == 404, (reader, other, r.text)
            bodies.append(r.text)
    return bodies


async def _mcp_reads(world: World, readers: list[str], key: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    async with _mcp(world.mcp, key) as client:
        for reader in readers:
            named = world.params(reader)
            wide = "user" if named else "tenant"
            adversarial = " ".join([QUERY, *random.Random(reader).sample(world.foreign(reader), 8)])
            texts = []
            for tool, args in (
                ("recall", {"query": adversarial, "max_tokens": 4000, **named}),
                ("recall", {"query": adversarial, "max_tokens": 4000, "scope": wide, **named}),
                ("assemble_context", {"session": _session(reader), "query": QUERY, **named}),
                ("assemble_context",
                 {"session": "fresh", "query": QUERY, "scope": wide, **named}),
            ):  # fmt: skip
                result = await client.call_tool(tool, args)
                assert not result.is_error, result.content
                texts.append(result.content[0].text)
            assert all(world.canaries[reader] in t for t in texts)
            out[reader] = texts
    return out


def _cli_reads(world: World, reader: str) -> list[str]:
    tenant, session = world.tenant(reader), _session(reader)
    user = [] if reader in TENANTS else ["--user", reader]
    wide = "tenant" if reader in TENANTS else "user"
    adversarial = " ".join([QUERY, *random.Random(reader).sample(world.foreign(reader), 8)])
    bodies = [
        _cli(world, "assemble", "--tenant", tenant, "--session", session, "--query", QUERY,
             "--json", *user),
        _cli(world, "assemble", "--tenant", tenant, "--session", "fresh", "--query", QUERY,
             "--scope", wide, "--json", *user),
        _cli(world, "search", adversarial, "--tenant", tenant, "--scope", wide, "--json", *user),
        _cli(world, "stats", "--tenant", tenant, "--scope", wide, "--json", *user),
    ]  # fmt: skip
    assert all(world.canaries[reader] in b for b in bodies[:3])
    return bodies


def _assert_no_leak(world: World, reader: str, bodies: list[str]) -> None:
    text = "\n".join(bodies)
    leaked = [c for c in world.foreign(reader) if c in text]
    assert leaked == [], f"{reader} saw {len(leaked)} foreign canaries"


def test_every_canary_was_planted_through_its_face(world: World) -> None:
    assert len(world.canaries) == len(set(world.canaries.values())) == 70
    memories = sum(world.engine.stats(tenant=t)["memories"] for t in [SHARED, *TENANTS])
    assert memories == 70  # nothing folded across users: one memory per canary
    users = {world.engine.get(world.notes[u], tenant=SHARED).user for u in USERS}
    assert users == set(USERS)


@pytest.mark.parametrize("reader", READERS)
def test_library_and_http_reads_never_leak(world: World, reader: str) -> None:
    _assert_no_leak(world, reader, _library_reads(world, reader) + _http_reads(world, reader))


def test_mcp_reads_never_leak(world: World) -> None:
    async def main() -> dict[str, list[str]]:
        found = await _mcp_reads(world, USERS, world.keys[SHARED])
        for tenant in TENANTS:
            found.update(await _mcp_reads(world, [tenant], world.keys[tenant]))
        return found

    for reader, texts in anyio.run(main).items():
        _assert_no_leak(world, reader, texts)


@pytest.mark.parametrize("reader", random.Random(16).sample(USERS, 4) + TENANTS[:2])
def test_cli_reads_never_leak(world: World, reader: str) -> None:
    _assert_no_leak(world, reader, _cli_reads(world, reader))


def test_a_tenant_key_cannot_name_another_tenants_user(world: World) -> None:
    # The key's tenant is the hard boundary: naming a user of another tenant reads nothing.
    victim = USERS[0]
    headers = {"Authorization": f"Bearer {world.keys[TENANTS[0]]}"}
    r = httpx.post(
        world.api + "/v1/search",
        json={"query": QUERY + " " + world.canaries[victim], "user": victim},
        headers=headers,
    )
    assert r.status_code == 200
    assert r.json()["hits"] == []
    r = httpx.get(world.api + f"/v1/memories/{world.notes[victim]}", headers=headers)
    assert r.status_code == 404
