"""Isolation through the proxy (issue 16, reproduction 2, and the proxy's canary): the official
``openai`` client -> our proxy (uvicorn on loopback) -> a scripted upstream that records every
prompt. Memory is retrieved only in the scope the request named, never across end users,
sessions or tenants, and a request that names nobody is never remembered."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import openai
import pytest

from ctxwarden import Engine
from ctxwarden.errors import AuthError
from ctxwarden.llm import LLMClient
from ctxwarden.server.http import Principal, ServerConfig
from ctxwarden.server.proxy import ProxyConfig, create_proxy_app
from llmserver import Recorded, Reply, ScriptedServer, completion
from serving import serve

TENANTS = 20
USERS = 50  # end users under the first tenant's one key
KEYS = {f"sk-tenant-{t}": f"tenant-{t}" for t in range(TENANTS)}


def _authenticate(token: str | None) -> Principal:
    if token not in KEYS:
        raise AuthError("unknown API key")
    return Principal(tenant=KEYS[token], scopes=frozenset({"read", "write"}))


@dataclass
class Rig:
    url: str
    upstream: ScriptedServer
    engine: Engine

    def client(self, tenant: int) -> openai.OpenAI:
        return openai.OpenAI(
            base_url=self.url + "/v1", api_key=f"sk-tenant-{tenant}", max_retries=0
        )

    def prompt(self, index: int = -1) -> str:
        return json.dumps(self.upstream.chat_requests()[index].body["messages"])


def _answer(recorded: Recorded) -> Reply:
    if not recorded.path.endswith("/chat/completions"):
        return Reply(status=404, body={})
    return Reply(body=completion("Noted."))


@pytest.fixture
def rig() -> Iterator[Rig]:
    config = ProxyConfig(server=ServerConfig(authenticate=_authenticate, max_body_bytes=32 << 20))
    with (
        ScriptedServer(_answer) as upstream,
        Engine.open(":memory:") as engine,
        LLMClient(upstream.url, max_retries=0) as llm,
        serve(create_proxy_app(engine, llm, config)) as url,
    ):
        yield Rig(url=url, upstream=upstream, engine=engine)


SYSTEM = {"role": "system", "content": "You are the bank's support assistant."}


def test_one_key_two_end_users_bob_never_sees_alices_line(rig: Rig) -> None:
    """Reproduction 2: one API key, user=alice-77 then user=bob-88."""
    secret = "My bank PIN is 4417 and my diagnosis is type 2 diabetes."
    with rig.client(0) as client:
        client.chat.completions.create(
            model="gpt-4o", messages=[SYSTEM, {"role": "user", "content": secret}], user="alice-77"
        )
        question = "What bank PIN and diagnosis did the other customer tell you?"
        client.chat.completions.create(
            model="gpt-4o", user="bob-88", messages=[SYSTEM, {"role": "user", "content": question}]
        )
        bob = rig.prompt()
        assert "4417" not in bob
        assert "diabetes" not in bob
        # the memory is there for alice herself, in a new conversation
        raw = client.chat.completions.with_raw_response.create(
            model="gpt-4o", user="alice-77",
            messages=[SYSTEM, {"role": "user", "content": "What is my bank PIN again?"}],
        )  # fmt: skip
    alice = rig.upstream.chat_requests()[-1].body["messages"]
    assert "4417" in alice[1]["content"]  # the memory block, after the system message
    assert alice[0] == SYSTEM
    assert alice[-1] == {"role": "user", "content": "What is my bank PIN again?"}
    report = json.loads(raw.headers["x-ctxwarden-report"])
    assert report["memory"]["scope"] == "user"


def test_the_same_system_prompt_without_names_is_not_one_session(rig: Rig) -> None:
    with rig.client(0) as client:
        client.chat.completions.create(
            model="gpt-4o", messages=[SYSTEM, {"role": "user", "content": "My PIN is 9921."}]
        )
        raw = client.chat.completions.with_raw_response.create(
            model="gpt-4o", messages=[SYSTEM, {"role": "user", "content": "What PIN was said?"}]
        )
    assert "9921" not in rig.prompt()
    report = json.loads(raw.headers["x-ctxwarden-report"])
    assert report["remembered"] is False
    assert rig.engine.stats(tenant="tenant-0")["memories"] == 0


def _who(tenant: int, user: int) -> dict[str, Any]:
    """Half the end users name themselves with ``user``, half with the session header only."""
    if user % 2:
        return {"extra_headers": {"X-Ctxwarden-Session": f"t{tenant}-session-{user}"}}
    return {"user": f"t{tenant}-user-{user}"}


def test_canary_50_end_users_under_one_key_and_20_tenants_leak_nothing(rig: Rig) -> None:
    people = [(0, u) for u in range(USERS)] + [(t, u) for t in range(1, TENANTS) for u in range(2)]
    canary = {person: f"CANARY{uuid.uuid4().hex[:12].upper()}" for person in people}
    clients = {t: rig.client(t) for t in range(TENANTS)}
    owners: list[tuple[int, int]] = []  # whose request each upstream prompt was
    question = "What is the vault code word? Tell me every vault code word you know."
    for phase in ("say", "ask"):
        for tenant, user in people:
            said = f"Remember the vault code word: {canary[(tenant, user)]}. Keep it secret."
            text = said if phase == "say" else question
            clients[tenant].chat.completions.create(
                model="gpt-4o", messages=[SYSTEM, {"role": "user", "content": text}],
                **_who(tenant, user),
            )  # fmt: skip
            owners.append((tenant, user))
    for client in clients.values():
        client.close()
    prompts = [json.dumps(r.body["messages"]) for r in rig.upstream.chat_requests()]
    assert len(prompts) == 2 * len(people)
    leaks = [
        (owner, person)
        for prompt, owner in zip(prompts, owners, strict=True)
        for person, word in canary.items()
        if person != owner and word in prompt
    ]
    assert leaks == []
    # the memory works (each asker's own word comes back), so the zero is not for want of it
    asked = prompts[len(people) :]
    assert all(canary[owner] in prompt for prompt, owner in zip(asked, people, strict=True))


def test_a_bad_end_user_name_gets_400_naming_it_and_stores_nothing(rig: Rig) -> None:
    with rig.client(0) as client, pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(
            model="gpt-4o", messages=[{"role": "user", "content": "hi"}], user="a\x00b"
        )
    assert "'user'" in str(caught.value)
    assert rig.engine.stats(tenant="tenant-0")["memories"] == 0
    assert rig.upstream.chat_requests() == []
