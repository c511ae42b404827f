"""A random conversation with every shape of neighbour (threads, replies, folded parents,
places, end users) for the tests that compare two ways of reading neighbours."""

from __future__ import annotations

import dataclasses
import random

from ctxwarden.store.base import Alias, NewMemory, Store


def memory(id: str, *, tenant: str = "t", content: str = "hello", at: float = 100.0,
           session: str = "s", channel: str | None = "c") -> NewMemory:  # fmt: skip
    """A message of ``ana`` (a human user) with these fields, the rest empty."""
    return NewMemory(
        id=id, tenant=tenant, session=session, channel=channel, author="ana",
        author_kind="human", role="user", content=content, created_at=at, thread_id=None,
        reply_to=None, kind="message", pinned=False, name=None, tool_calls=(),
        tool_call_id=None, attachments=(), metadata={}, content_hash=f"h-{content}",
    )  # fmt: skip


def conversation(store: Store, seed: int, *, tenant: str = "t") -> None:
    """Write into ``store`` a conversation of ``tenant``: 60 messages (and a few facts) in two
    sessions and three places, with threads, replies (some to an id folded into another
    memory), equal times and end users; and one memory of another tenant."""
    rng = random.Random(seed)
    ids: list[str] = []
    with store.write() as w:
        for i in range(60):
            thread = rng.choice(ids) if ids and rng.random() < 0.3 else None
            reply = rng.choice([*ids, "folded"]) if ids and rng.random() < 0.3 else None
            message = dataclasses.replace(
                memory(f"m{i}", tenant=tenant, content=f"text {i}", at=float(rng.randrange(20)),
                       session=rng.choice(["s0", "s1"]), channel=rng.choice([None, "c", "d"])),
                thread_id=thread, reply_to=reply, user=rng.choice([None, "alice", "bob"]),
                kind="fact" if rng.random() < 0.1 else "message",
            )  # fmt: skip
            w.insert(message)
            ids.append(message.id)
        w.insert(memory(f"elsewhere-{tenant}", tenant=f"other-{tenant}", content="hello",
                         session="s0", at=5.0))  # fmt: skip
    with store.write() as w:
        w.add_aliases([Alias(tenant=tenant, id="folded", rowid=store.get(tenant, "m3").rowid,
                             status="duplicate", created_at=30.0)])  # fmt: skip
