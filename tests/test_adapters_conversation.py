"""The adapters' core, Conversation: for any set of conversations sharing tenant, user and
session names, each reads, fits, pops and clears only its own (hypothesis), and fit stores a
conversation sent again only once."""

from __future__ import annotations

from collections import defaultdict

from hypothesis import given, settings
from hypothesis import strategies as st

from ctxwarden import Engine
from ctxwarden.adapters import Conversation

NAMES = st.sampled_from(["a", "b"])
SCOPES = st.tuples(NAMES, NAMES, NAMES)  # (tenant, user, session): names collide on purpose
TURNS = st.lists(
    st.tuples(SCOPES, st.sampled_from(["user", "assistant"]), st.integers(0, 3)),
    min_size=1,
    max_size=30,
)


@settings(max_examples=40, deadline=None)
@given(turns=TURNS, cleared=SCOPES)
def test_each_conversation_sees_only_its_own(
    turns: list[tuple[tuple[str, str, str], str, int]], cleared: tuple[str, str, str]
) -> None:
    expected: dict[tuple[str, str, str], list[tuple[str, str]]] = defaultdict(list)
    with Engine.open(":memory:") as engine:

        def chat(key: tuple[str, str, str]) -> Conversation:
            tenant, user, session = key
            return Conversation(engine, tenant=tenant, user=user, session=session)

        for index, (key, role, word) in enumerate(turns):
            # every text names its owner, so a leak is visible in any read
            text = f"{'/'.join(key)} says {word} (turn {index})"
            chat(key).add([{"role": role, "content": text}])
            expected[key].append((role, text))
        for key, messages in expected.items():
            assert [(m["role"], m["content"]) for m in chat(key).messages()] == messages
            fitted = chat(key).fit([], budget=4000, remember=False)
            owner = "/".join(key) + " says"
            for message in fitted.messages:
                for line in str(message["content"]).splitlines():
                    if " says " in line:
                        assert owner in line, (key, line)
        popped = chat(cleared).pop()
        if expected[cleared]:
            assert popped is not None
            assert (popped["role"], popped["content"]) == expected[cleared].pop()
        else:
            assert popped is None
        chat(cleared).clear()
        expected[cleared] = []
        for key, messages in expected.items():
            assert [(m["role"], m["content"]) for m in chat(key).messages()] == messages


def test_fit_stores_a_conversation_sent_again_once() -> None:
    with Engine.open(":memory:") as engine:
        chat = Conversation(engine, session="s", user="u")
        history = [
            {"role": "user", "content": "yes"},
            {"role": "assistant", "content": "ok"},
            {"role": "user", "content": "yes"},
        ]
        chat.fit(history)
        chat.fit(history)  # the same list again: nothing new
        chat.fit(history[1:])  # its latest part: nothing new
        chat.fit([*history, {"role": "user", "content": "yes"}])  # one more "yes": a new turn
        assert [m["content"] for m in chat.messages()] == ["yes", "ok", "yes", "yes"]
        # fit stored it, so the framework's own save of the same turn adds nothing
        chat.add([{"role": "user", "content": "yes"}])
        assert len(chat.messages()) == 4
        chat.add([{"role": "user", "content": "yes"}])  # a later, real repeat is a turn
        assert len(chat.messages()) == 5
