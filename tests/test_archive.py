"""The way back: compaction's archive of originals (keep_originals="archive", retention,
expand, purge), on SQLite and PostgreSQL, and tool-result offloading through the library."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from conftest import Clock, morning
from ctxwarden import ConfigError, Engine, InputError, NotFound
from ctxwarden.compact import CompactionPolicy
from ctxwarden.offload import OFFLOAD_PREFIX
from ctxwarden.store.base import Store
from ctxwarden.store.sqlite import SQLiteStore

DAY = 86400.0
CHAT = [
    "the release train for the mobile app leaves on Thursday at 10:00",
    "sounds good to me, let us talk about it later",
    "sure, i will take a look when i get a chance",
    "Rosa owns the billing migration, due on the 14th",
    "thanks for the update, that makes sense",
    "ok, no strong opinion from my side",
    "great, talk soon then",
]


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def backend(request: pytest.FixtureRequest) -> Iterator[Store]:
    if request.param == "sqlite":
        store: Store = SQLiteStore(":memory:")
    else:
        from ctxwarden.store.postgres import PostgresStore

        store = PostgresStore(request.getfixturevalue("pg_schema_dsn"))
    yield store
    store.close()


def _engine(store: Store, clock: Clock) -> Engine:
    return Engine(store, clock=clock)


def _history(engine: Engine, clock: Clock, session: str = "team", user: str | None = None) -> None:
    start = clock.now - 20 * DAY
    engine.ingest(
        [
            {
                "id": f"{session}-{i}",
                "session": session,
                "author": ["ana", "bo", "cy"][i % 3],
                "content": text,
                "created_at": start + i * 60,
                "user": user,
            }
            for i, text in enumerate(CHAT)
        ]
    )


def _compact(engine: Engine, keep: str = "archive", days: float = 30.0) -> str:
    policy = CompactionPolicy(max_summary_share=0.9, keep_originals=keep, archive_days=days)  # type: ignore[arg-type]
    result = engine.compact(policy=policy)
    assert len(result.summaries) == 1, "the history must be compacted for the test to bite"
    assert result.archived == (len(CHAT) if keep == "archive" else 0)
    return result.summaries[0]


@pytest.mark.parametrize(
    ("field", "value"), [("keep_originals", "keep"), ("archive_days", 0), ("archive_days", -1)]
)
def test_policy_errors_name_the_field(field: str, value: Any) -> None:
    with pytest.raises(ConfigError, match=f"compact.{field}"):
        CompactionPolicy(**{field: value})


def test_archived_originals_come_back_whole_until_they_expire(backend: Store, clock: Clock) -> None:
    engine = _engine(backend, clock)
    _history(engine, clock)
    originals = {m.id: m for m in (engine.get(f"team-{i}") for i in range(len(CHAT)))}
    summary_id = _compact(engine, days=10)
    expanded = engine.expand(summary_id)
    assert [m.id for m in expanded] == [f"team-{i}" for i in range(len(CHAT))]
    for memory in expanded:
        before = originals[memory.id]
        assert memory.content == before.content
        assert memory.author == before.author
        assert memory.created_at == before.created_at
        assert memory.session == "team"
    # an id compacted into the summary: its own original
    assert [m.content for m in engine.expand("team-3")] == [CHAT[3]]
    # the live store holds the summary only
    assert engine.get("team-3").id == summary_id
    # retention: past archive_days nothing comes back, and the next compaction deletes them
    clock.now += 11 * DAY
    with pytest.raises(NotFound, match=summary_id):
        engine.expand(summary_id)
    assert engine.compact().purged == len(CHAT)
    assert engine.purge_archive() == 0


def test_the_maintenance_call_purges_what_expired(backend: Store, clock: Clock) -> None:
    engine = _engine(backend, clock)
    _history(engine, clock)
    summary_id = _compact(engine, days=2)
    clock.now += 1 * DAY
    assert engine.purge_archive() == 0
    assert len(engine.expand(summary_id)) == len(CHAT)
    clock.now += 1 * DAY
    assert engine.purge_archive() == len(CHAT)
    with pytest.raises(NotFound):
        engine.expand(summary_id)


def test_delete_is_the_default_and_expand_says_the_originals_are_gone(
    backend: Store, clock: Clock
) -> None:
    assert CompactionPolicy().keep_originals == "delete"
    engine = _engine(backend, clock)
    _history(engine, clock)
    summary_id = _compact(engine, keep="delete")
    with pytest.raises(NotFound, match=f"{summary_id}.*keep_originals='delete'"):
        engine.expand(summary_id)


def test_expand_of_a_plain_memory_or_outside_its_scope_is_refused(
    backend: Store, clock: Clock
) -> None:
    engine = _engine(backend, clock)
    _history(engine, clock, session="s1", user="ana")
    summary_id = _compact(engine)
    engine.ingest([{"id": "fresh", "session": "s1", "content": "a new message"}])
    with pytest.raises(InputError, match="'fresh' is not a summary") as caught:
        engine.expand("fresh")
    assert caught.value.field == "id"
    with pytest.raises(NotFound):
        engine.expand("nothing-here")
    with pytest.raises(NotFound):
        engine.expand(summary_id, session="s2")
    with pytest.raises(NotFound):
        engine.expand(summary_id, tenant="other")
    assert len(engine.expand(summary_id, session="s1")) == len(CHAT)


def test_offloaded_tool_results_are_stored_in_scope_and_previewed_the_same_every_time(
    backend: Store, clock: Clock
) -> None:
    engine = _engine(backend, clock)
    big = "\n".join(f"row {i}: status=ok latency={i * 3}ms region=eu-west-1" for i in range(300))
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "check the rows"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "rows", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": big},
        {"role": "tool", "tool_call_id": "c2", "content": "small result"},
    ]  # fmt: skip
    first = engine.offload(messages, max_tokens=200, session="s1", user="ana", model="gpt-4o")
    assert len(first.ids) == 1
    assert first.ids[0].startswith(OFFLOAD_PREFIX)
    preview = first.messages[2]["content"]
    assert first.ids[0] in preview
    assert len(preview) < 600
    assert first.messages[2]["tool_call_id"] == "c1"
    assert first.messages[3] is messages[3]  # small: the caller's own object
    assert messages[2]["content"] == big  # the input is not changed
    again = engine.offload(messages, max_tokens=200, session="s1", user="ana", model="gpt-4o")
    assert again.messages == first.messages
    (stored,) = engine.expand(first.ids[0], session="s1", user="ana")
    assert stored.content == big
    assert stored.role == "tool"
    assert stored.tool_call_id == "c1"
    assert stored.session == "s1"
    assert stored.user == "ana"
    with pytest.raises(NotFound):
        engine.expand(first.ids[0], session="s2")
    # another session's copy of the same text is its own memory
    other = engine.offload(messages, max_tokens=200, session="s2", model="gpt-4o")
    assert other.ids != first.ids
    with pytest.raises(InputError, match="max_tokens"):
        engine.offload(messages, max_tokens=0, session="s1")


def test_http_sources_are_scoped_to_the_keys_tenant(tmp_path: Any) -> None:
    """``GET /v1/memories/{id}/sources`` on a real server: compaction over HTTP archives the
    originals; a key of another tenant sees nothing, a write-only key reads nothing."""
    import httpx

    from ctxwarden.server.auth import KeyAuth, issue_key
    from ctxwarden.server.http import ServerConfig, create_app
    from serving import serve

    clock = Clock()
    with Engine.open(tmp_path / "api.db", clock=clock) as engine:
        keys = {
            "acme": issue_key(engine.store, tenant="acme", scopes={"read", "write", "delete"}),
            "other": issue_key(engine.store, tenant="other", scopes={"read", "write"}),
            "writer": issue_key(engine.store, tenant="acme", scopes={"write"}),
        }
        app = create_app(engine, ServerConfig(authenticate=KeyAuth(engine.store)))
        start = clock.now - 20 * DAY
        records = [
            {"id": f"a{i}", "session": "s1", "author": "ana", "content": text,
             "created_at": start + i * 60}
            for i, text in enumerate(CHAT)
        ]  # fmt: skip
        with serve(app) as url, httpx.Client(base_url=url) as http:

            def call(method: str, path: str, who: str, **kw: Any) -> httpx.Response:
                auth = {"Authorization": f"Bearer {keys[who]}"}
                return http.request(method, path, headers=auth, **kw)

            assert call("POST", "/v1/ingest", "acme", json={"records": records}).status_code == 200
            body = {"max_summary_share": 0.9, "keep_originals": "archive", "archive_days": 5}
            applied = call("POST", "/v1/compact/apply", "acme", json=body)
            assert applied.status_code == 200, applied.text
            (summary_id,) = applied.json()["summaries"]
            got = call("GET", f"/v1/memories/{summary_id}/sources", "acme")
            assert got.status_code == 200, got.text
            assert [s["content"] for s in got.json()["sources"]] == CHAT
            assert [s["id"] for s in got.json()["sources"]] == [f"a{i}" for i in range(len(CHAT))]
            scoped = call("GET", f"/v1/memories/{summary_id}/sources?session=s1", "acme")
            assert scoped.status_code == 200
            elsewhere = call("GET", f"/v1/memories/{summary_id}/sources?session=s2", "acme")
            assert elsewhere.status_code == 404
            assert call("GET", f"/v1/memories/{summary_id}/sources", "other").status_code == 404
            assert call("GET", f"/v1/memories/{summary_id}/sources", "writer").status_code == 403
            bad = call("POST", "/v1/compact/plan", "acme", json={"keep_originals": "keep"})
            assert bad.status_code == 422
            assert "keep_originals" in bad.text
            engine.ingest([{"id": "plain", "session": "s1", "content": "hi"}], tenant="acme")
            plain = call("GET", "/v1/memories/plain/sources", "acme")
            assert plain.status_code == 422
            assert "plain" in plain.text
            clock.now += 6 * DAY
            gone = call("GET", f"/v1/memories/{summary_id}/sources", "acme")
            assert gone.status_code == 404
            assert summary_id in gone.text


def test_cli_compacts_into_the_archive_and_expands(tmp_path: Any) -> None:
    """``ctxwarden compact --apply --keep-originals archive`` then ``ctxwarden expand``, as a
    user runs them (a real subprocess on a database file)."""
    import json

    from test_cli import ctxwarden

    db = str(tmp_path / "cli.db")
    start = morning(20)
    # small talk around the facts, so the summary is worth writing at the default share
    words = "apples pears plums kiwis limes figs dates grapes melons cherries lemons berries"
    talk = [f"{CHAT[1]}, and {CHAT[5]}, like the {w} chat" for w in words.split()]
    chat = [*CHAT, *talk]
    lines = [
        json.dumps({"id": f"c{i}", "session": "team", "author": "ana", "content": text,
                    "created_at": start + i * 60})
        for i, text in enumerate(chat)
    ]  # fmt: skip
    (tmp_path / "log.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    ctxwarden("--db", db, "ingest", str(tmp_path / "log.jsonl"))
    bad = ctxwarden("--db", db, "compact", "--apply", "--keep-originals", "keep", check=False)
    assert bad.returncode == 1
    assert "keep_originals" in bad.stderr
    done = json.loads(
        ctxwarden("--db", db, "compact", "--apply", "--keep-originals", "archive", "--json").stdout
    )
    assert done["archived"] == len(chat)
    (summary_id,) = done["summaries"]
    out = ctxwarden("--db", db, "expand", summary_id, "--json").stdout.splitlines()
    assert [json.loads(line)["content"] for line in out] == chat
    gone = ctxwarden("--db", db, "expand", "nothing-here", check=False)
    assert gone.returncode == 1
    assert "nothing-here" in gone.stderr


@pytest.mark.parametrize("how", ["id", "session", "tenant"])
def test_erasure_takes_archived_originals_with_it(backend: Store, clock: Clock, how: str) -> None:
    """On both backends: what an erasure removes leaves the archive in the same transaction."""
    engine = _engine(backend, clock)
    _history(engine, clock, session="s1")
    _history(engine, clock, session="s2")
    summaries = engine.compact(
        policy=CompactionPolicy(max_summary_share=0.9, keep_originals="archive")
    ).summaries
    assert len(summaries) == 2
    first, second = (engine.get(s) for s in summaries)
    if first.session != "s1":
        first, second = second, first
    if how == "id":
        engine.delete("s1-3")
        left = engine.expand(first.id)
        assert [m.id for m in left] == [f"s1-{i}" for i in range(len(CHAT)) if i != 3]
        with pytest.raises(NotFound):
            engine.expand("s1-3")
    elif how == "session":
        engine.erase_session("s1")
        with pytest.raises(NotFound):
            engine.expand(first.id)
    else:
        engine.erase_tenant()
        with pytest.raises(NotFound):
            engine.expand(second.id)
        assert backend.archived("default", second.id, now=clock.now) == []
        return
    assert len(engine.expand(second.id)) == len(CHAT)  # the other session's stay
