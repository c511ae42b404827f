"""Keyed facts (issue 19, item 1): a newer fact with the same key supersedes the older one."""

from __future__ import annotations

from typing import Any

import pytest

from ctxwarden.engine import Engine
from ctxwarden.errors import InputError
from ctxwarden.store.base import Store

DAY = 86400.0


def _fact(
    id: str, content: str, at: float, *, key: str = "deploy window", **extra: Any
) -> dict[str, Any]:
    return {"id": id, "session": "s", "kind": "fact", "key": key, "content": content,
            "created_at": at, **extra}  # fmt: skip


def _texts(engine: Engine, query: str) -> tuple[str, dict[str, str]]:
    context = engine.assemble(session="s", query=query, model="gpt-4o")
    text = "\n".join(str(m["content"]) for m in context.messages)
    reasons = {r.id: r.reason for r in context.report.candidates if not r.included}
    return text, reasons


def test_a_newer_fact_with_the_same_key_supersedes_the_older(store: Store) -> None:
    engine = Engine(store)
    engine.ingest([_fact("f1", "the deploy window is Tuesday 14:00", 10 * DAY)])
    engine.ingest([_fact("f2", "the deploy window is Wednesday 09:00", 12 * DAY)])
    f1, f2 = engine.get("f1"), engine.get("f2")
    assert store.supersessions("default", [f1.rowid, f2.rowid]) == {f1.rowid: ("f2", 12 * DAY)}
    text, reasons = _texts(engine, "when is the deploy window?")
    assert "Wednesday 09:00" in text
    assert "Tuesday" not in text  # never presented as current
    assert reasons["f1"] == "superseded by f2 (in this context) on 1970-01-13"
    # The older fact is kept, not folded or deleted.
    assert engine.get("f1").content == "the deploy window is Tuesday 14:00"


def test_a_late_older_fact_is_superseded_on_arrival(store: Store) -> None:
    engine = Engine(store)
    engine.ingest([_fact("new", "the deploy window is Friday", 20 * DAY)])
    engine.ingest([_fact("old", "the deploy window is Monday", 5 * DAY)])
    text, reasons = _texts(engine, "deploy window?")
    assert "Friday" in text
    assert "Monday" not in text
    assert reasons["old"].startswith("superseded by new")


def test_keys_of_other_subjects_and_other_end_users_stay_apart(store: Store) -> None:
    engine = Engine(store)
    engine.ingest(
        [
            _fact("a1", "ana's timezone is CET", 1 * DAY, key="timezone", user="ana"),
            _fact("b1", "bo's timezone is PST", 2 * DAY, key="timezone", user="bo"),
            _fact("w1", "the deploy window is Tuesday", 3 * DAY),
        ]
    )
    rowids = [engine.get(i).rowid for i in ("a1", "b1", "w1")]
    assert store.supersessions("default", rowids) == {}


def test_a_key_on_a_message_is_refused_and_nothing_is_written(store: Store) -> None:
    engine = Engine(store)
    with pytest.raises(InputError) as error:
        engine.ingest(
            [
                _fact("f1", "the deploy window is Tuesday", DAY),
                {"id": "m1", "session": "s", "content": "hi", "key": "greeting"},
            ]
        )
    assert error.value.field == "key"
    assert engine.stats()["memories"] == 0
    with pytest.raises(InputError):
        engine.ingest([_fact("f2", "x", DAY, key="  ")])


def test_erasing_a_value_relinks_the_rest(store: Store) -> None:
    engine = Engine(store)
    engine.ingest(
        [
            _fact("a", "the deploy window is Monday", 1 * DAY),
            _fact("b", "the deploy window is Tuesday", 2 * DAY),
            _fact("c", "the deploy window is Wednesday", 3 * DAY),
        ]
    )
    engine.delete("b")
    a, c = engine.get("a").rowid, engine.get("c").rowid
    assert store.supersessions("default", [a, c]) == {a: ("c", 3 * DAY)}
    engine.delete("c")
    assert store.supersessions("default", [a]) == {}  # the value before is in force again
    text, _ = _texts(engine, "deploy window?")
    assert "Monday" in text
