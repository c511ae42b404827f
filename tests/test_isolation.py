"""Isolation per session and end user in the engine (issue 16, item 1 and the library half of 2).

De-dup never folds across sessions unless both records name the same channel; an agent's
transcript (assistant and tool turns) never folds; ``fold=False`` folds nothing; reads see the
narrowest scope the caller named.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ctxwarden import Engine, InputError, Record
from ctxwarden.scope import resolve

T0 = 1_800_000_000

THREE = ["hi, I need help with my order", "it has not arrived yet", "order number is 5521"]


def _turns(user: str, session: str, start: float, lines: list[str]) -> list[dict[str, Any]]:
    return [
        {"id": f"{session}-{i}", "session": session, "user": user, "role": "user",
         "content": text, "created_at": start + i * 30}
        for i, text in enumerate(lines)
    ]  # fmt: skip


def test_reproduction_1_two_end_users_same_messages_no_channel(engine: Engine) -> None:
    """Issue 16, reproduction 1: the second user's lines came back ``duplicate of`` the first's,
    their context held only their new question, and the first's lines gained ``(x2 ...)``."""
    first = engine.ingest(_turns("alice", "a", T0, THREE))
    second = engine.ingest(_turns("bob", "b", T0 + 120, THREE))
    assert [o.status for o in first.outcomes] == ["stored"] * 3
    assert [o.status for o in second.outcomes] == ["stored"] * 3
    assert all(o.duplicate_of is None for o in second.outcomes)
    for user, session in (("alice", "a"), ("bob", "b")):
        context = engine.assemble(session=session, user=user, query="where is my order?")
        text = "\n".join(str(m["content"]) for m in context.messages)
        assert "(x2" not in text
        assert "duplicate" not in text
        for i in range(3):
            assert f"{session}-{i}" in context.included
        other = "b" if session == "a" else "a"
        assert not any(i.startswith(f"{other}-") for i in context.included)
    assert engine.get("a-0").dup_count == 1
    assert engine.get("b-0").dup_count == 1


def test_reproduction_1_without_users_sessions_alone_keep_apart(engine: Engine) -> None:
    def plain(session: str, start: float) -> list[dict[str, Any]]:
        return [
            {k: v for k, v in r.items() if k != "user"} for r in _turns("-", session, start, THREE)
        ]

    engine.ingest(plain("a", T0))
    result = engine.ingest(plain("b", T0 + 60))
    assert [o.status for o in result.outcomes] == ["stored"] * 3
    context = engine.assemble(session="a", budget=2000)
    assert all("(x2" not in str(m["content"]) for m in context.messages)


def test_a_named_channel_still_folds_across_sessions(engine: Engine) -> None:
    rows = [
        {"id": f"m{i}", "session": f"s{i}", "channel": "general", "author": "feedbot",
         "author_kind": "bot", "content": "Daily digest: 3 new posts", "created_at": T0 + i}
        for i in range(3)
    ]  # fmt: skip
    result = engine.ingest(rows)
    assert [o.status for o in result.outcomes] == ["stored", "duplicate", "duplicate"]


def test_repeats_within_ones_own_conversation_still_fold(engine: Engine) -> None:
    rows = [
        {"id": f"m{i}", "session": "a", "user": "alice", "author": "alice",
         "content": "ping", "created_at": T0 + i}
        for i in range(3)
    ]  # fmt: skip
    result = engine.ingest(rows)
    assert [o.status for o in result.outcomes] == ["stored", "duplicate", "duplicate"]


def test_near_repeats_fold_only_within_the_conversation(engine: Engine) -> None:
    engine.ingest(
        [{"id": "a1", "session": "a", "author": "ana", "content": "Lunch at noon, anyone?",
          "created_at": T0}]
    )  # fmt: skip
    other = engine.ingest(
        [{"id": "b1", "session": "b", "author": "ana", "content": "lunch at noon anyone?",
          "created_at": T0 + 5}]
    )  # fmt: skip
    same = engine.ingest(
        [{"id": "a2", "session": "a", "author": "ana", "content": "lunch at noon anyone?",
          "created_at": T0 + 9}]
    )  # fmt: skip
    assert other.outcomes[0].status == "stored"
    assert same.outcomes[0].status == "near_duplicate"
    assert same.outcomes[0].duplicate_of == "a1"


@pytest.mark.parametrize("role", ["assistant", "tool"])
def test_agent_transcripts_never_fold(engine: Engine, role: str) -> None:
    rows = [
        {"id": f"m{i}", "session": "a", "role": role, "content": "continue",
         "created_at": T0 + i, **({"tool_call_id": f"c{i}"} if role == "tool" else {})}
        for i in range(3)
    ]  # fmt: skip
    result = engine.ingest(rows)
    assert [o.status for o in result.outcomes] == ["stored"] * 3
    context = engine.assemble(session="a", budget=2000)
    assert all("(x" not in str(m["content"]) for m in context.messages)


def test_fold_false_folds_nothing_but_known_ids_stay_known(engine: Engine) -> None:
    rows = [
        {"id": f"m{i}", "session": "a", "content": "continue", "created_at": T0 + i}
        for i in range(3)
    ]  # fmt: skip
    result = engine.ingest(rows, fold=False)
    assert [o.status for o in result.outcomes] == ["stored"] * 3
    again = engine.ingest(rows[:1], fold=False)
    assert again.outcomes[0].status == "known"
    # The same batch folded (fold=True) for comparison: the rule is fold's, not the data's.
    folded = engine.ingest([{**r, "id": f"n{i}", "session": "b"} for i, r in enumerate(rows)])
    assert [o.status for o in folded.outcomes] == ["stored", "duplicate", "duplicate"]


def test_ingest_user_fills_records_and_is_stored(engine: Engine) -> None:
    engine.ingest([{"id": "x", "content": "hello"}], session="s", user="alice")
    engine.ingest([Record(id="y", content="hey", session="s", user="bob")])
    assert engine.get("x").user == "alice"
    assert engine.get("y").user == "bob"
    assert engine.get("x").to_dict()["user"] == "alice"


@pytest.mark.parametrize(
    ("user", "problem"),
    [("a\x00b", "NUL"), ("\ud800", "surrogate"), ("u" * 513, "512"), (7, "string")],
)
def test_a_bad_user_names_the_field_and_stores_nothing(
    engine: Engine, user: Any, problem: str
) -> None:
    with pytest.raises(InputError, match=problem) as info:
        engine.ingest([{"id": "ok", "content": "fine"}, {"id": "x", "content": "hi", "user": user}])
    assert info.value.field == "user"
    assert engine.stats()["memories"] == 0
    with pytest.raises(InputError) as direct:
        engine.ingest([Record(id="z", content="hi", user=str(user)[:600] + "\x00")])
    assert direct.value.field == "user"
    assert engine.stats()["memories"] == 0


def test_scope_user_without_a_user_is_an_error_naming_user(engine: Engine) -> None:
    with pytest.raises(InputError) as info:
        engine.search("order", scope="user")
    assert info.value.field == "user"
    with pytest.raises(InputError) as info:
        engine.assemble(session="s", scope="user")
    assert info.value.field == "user"
    with pytest.raises(InputError) as info:
        engine.stats(scope="everything")  # type: ignore[arg-type]
    assert info.value.field == "scope"


def _two_users(engine: Engine) -> None:
    engine.ingest(
        [
            {"id": "a1", "session": "a1", "user": "alice", "content": "alice flamingo one",
             "created_at": T0},
            {"id": "a2", "session": "a2", "user": "alice", "content": "alice flamingo two",
             "created_at": T0 + 1},
            {"id": "b1", "session": "b1", "user": "bob", "content": "bob flamingo one",
             "created_at": T0 + 2},
        ]
    )  # fmt: skip


def test_search_defaults_to_the_narrowest_scope_named(engine: Engine) -> None:
    _two_users(engine)

    def ids(**kw: Any) -> set[str]:
        return {m.id for m, _ in engine.search("flamingo", **kw)}

    assert ids(session="a1", user="alice") == {"a1"}
    assert ids(session="a1") == {"a1"}
    assert ids(user="alice") == {"a1", "a2"}
    assert ids(session="a1", user="alice", scope="user") == {"a1", "a2"}
    assert ids() == {"a1", "a2", "b1"}  # neither named: the tenant
    assert ids(session="b1", scope="tenant") == {"a1", "a2", "b1"}
    assert ids(session="a1", user="bob") == set()  # a's session holds nothing of bob's


def test_assemble_related_block_follows_the_scope(engine: Engine) -> None:
    _two_users(engine)

    def related(**kw: Any) -> set[str]:
        context = engine.assemble(query="flamingo", budget=2000, **kw)
        return set(context.included)

    assert related(session="a1", user="alice") == {"a1"}
    assert related(session="a1", user="alice", scope="user") == {"a1", "a2"}
    assert related(session="new", user="alice") == set()
    assert related(session="new", user="alice", scope="user") == {"a1", "a2"}
    assert related(session="new", scope="tenant") == {"a1", "a2", "b1"}


def test_stats_follow_the_scope(engine: Engine) -> None:
    _two_users(engine)
    assert engine.stats()["memories"] == 3
    assert engine.stats(user="alice")["memories"] == 2
    assert engine.stats(session="b1")["memories"] == 1
    assert engine.stats(session="b1", scope="tenant")["memories"] == 3


def test_pins_show_in_the_scope_they_were_pinned_for(engine: Engine) -> None:
    engine.ingest(
        [
            {"id": "p", "session": "a0", "user": "alice", "content": "alice likes tea",
             "created_at": T0},
            {"id": "q", "session": "b0", "user": "bob", "content": "bob likes coffee",
             "created_at": T0 + 1},
        ]
    )  # fmt: skip

    def pinned(session: str, user: str) -> set[str]:
        context = engine.assemble(session=session, user=user, budget=2000)
        block = context.report.block("persistent")
        return set() if block is None else set(block.items)

    engine.pin("p")  # its own session only
    own = engine.store.pinned("default", scope=resolve(session="a0", user="alice", scope=None))
    assert [m.id for m in own] == ["p"]
    assert pinned("a1", "alice") == set()
    assert pinned("b1", "bob") == set()
    engine.pin("p", scope="user")
    assert pinned("a1", "alice") == {"p"}
    assert pinned("b1", "bob") == set()
    engine.pin("q", scope="tenant")  # an explicit choice
    assert pinned("a1", "alice") == {"p", "q"}
    engine.pin("q", pinned=False)
    assert pinned("a1", "alice") == {"p"}
    with pytest.raises(InputError) as info:
        engine.ingest([{"id": "n", "session": "z", "content": "no user here"}])
        engine.pin("n", scope="user")
    assert info.value.field == "scope"


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    lines=st.lists(st.sampled_from(["ok", "thanks", "hi there", "lol", "same"]), min_size=1,
                   max_size=6),
    users=st.lists(st.sampled_from(["u1", "u2", "u3"]), min_size=2, max_size=3, unique=True),
)  # fmt: skip
def test_no_record_ever_folds_into_another_users_conversation(
    engine: Engine, lines: list[str], users: list[str]
) -> None:
    engine.delete_tenant()
    rows = []
    for n, user in enumerate(users):
        for i, text in enumerate(lines):
            rows.append(
                {"id": f"{user}-{i}", "session": f"s-{user}", "user": user, "author": "p",
                 "content": text, "created_at": T0 + n * 100 + i}
            )  # fmt: skip
    result = engine.ingest(rows)
    for outcome in result.outcomes:
        if outcome.duplicate_of is not None:
            assert outcome.duplicate_of.split("-")[0] == outcome.id.split("-")[0]


def test_mcp_remember_pins_for_the_scope_asked_and_recall_follows_the_user(
    engine: Engine,
) -> None:
    import json

    import anyio
    from mcp import Client

    from ctxwarden.server.mcp import create_mcp_server

    async def main() -> None:
        async with Client(create_mcp_server(engine)) as client:

            async def call(tool: str, args: dict[str, Any]) -> Any:
                result = await client.call_tool(tool, args)
                assert not result.is_error, result.content
                return json.loads(result.content[0].text)

            kept = await call(
                "remember",
                {"content": "alice prefers oat milk", "user": "alice", "session": "a1",
                 "pinned": True, "scope": "user"},
            )  # fmt: skip
            await call("remember", {"content": "bob prefers soy milk", "user": "bob"})
            other = await call(
                "assemble_context", {"session": "a2", "user": "alice", "budget": 2000}
            )
            assert kept["id"] in other["included"]
            bob = await call("assemble_context", {"session": "b9", "user": "bob", "budget": 2000})
            assert kept["id"] not in bob["included"]
            mine = await call("recall", {"query": "milk", "user": "alice"})
            assert [m["id"] for m in mine["memories"]] == [kept["id"]]
            refused = await client.call_tool(
                "remember", {"content": "x", "pinned": True, "scope": "user"}
            )
            assert refused.is_error
            assert "user" in refused.content[0].text
            wrong = await client.call_tool("recall", {"query": "milk", "scope": "everyone"})
            assert wrong.is_error

    anyio.run(main)
    assert engine.stats()["memories"] == 2  # the refused note stored nothing
