"""Free-text changes (issue 19, item 1): a message that changes an earlier one supersedes it at
ingest, and assembly shows what is in force (both backends)."""

from __future__ import annotations

from typing import Any

from ctxwarden.engine import Engine
from ctxwarden.engine_config import CHANGE_WINDOW, EngineConfig
from ctxwarden.store.base import Store

DAY = 86400.0


def _msg(id: str, content: str, at: float, author: str = "rosa", **extra: Any) -> dict[str, Any]:
    return {"id": id, "session": "s", "channel": "general", "author": author,
            "content": content, "created_at": at, **extra}  # fmt: skip


LOG = [
    _msg("m1", "The customer demo is on Wednesday 15:00 in room B.", 1 * DAY),
    _msg("m2", "anyone up for lunch?", 1 * DAY + 60, "milo"),
    _msg("m3", "the printer on floor three jams again", 1 * DAY + 120, "kenji"),
    _msg("m4", "The customer demo is now Thursday 10:00, not Wednesday.", 2 * DAY, "milo"),
    _msg("m5", "thanks, see you all there", 2 * DAY + 60, "kenji"),
]


def _links(store: Store, engine: Engine, ids: list[str]) -> dict[str, tuple[str, float]]:
    rowids = {engine.get(i).rowid: i for i in ids}
    return {rowids[r]: link for r, link in store.supersessions("default", list(rowids)).items()}


def test_a_changed_value_is_linked_and_neither_side_is_changed(store: Store) -> None:
    engine = Engine(store, config=EngineConfig(change_window=CHANGE_WINDOW))
    engine.ingest(LOG)
    assert _links(store, engine, ["m1", "m2", "m3", "m4", "m5"]) == {"m1": ("m4", 2 * DAY)}
    assert engine.get("m1").content == LOG[0]["content"]  # kept, not folded or deleted
    assert engine.get("m4").content == LOG[3]["content"]


def test_one_message_at_a_time_links_the_same(store: Store) -> None:
    engine = Engine(store, config=EngineConfig(change_window=CHANGE_WINDOW))
    for record in LOG:
        engine.ingest([record])
    assert _links(store, engine, ["m1", "m4"]) == {"m1": ("m4", 2 * DAY)}


def test_other_places_and_unrelated_messages_are_not_linked(store: Store) -> None:
    engine = Engine(store, config=EngineConfig(change_window=CHANGE_WINDOW))
    engine.ingest(
        [
            LOG[0],
            # the same change in another channel and in another session: not this demo
            {**LOG[3], "id": "c1", "channel": "random"},
            {**LOG[3], "id": "c2", "session": "other"},
            _msg("u1", "Actually I moved to Berlin last year.", 3 * DAY, "milo"),
            _msg("u2", "lunch is now served in the cafeteria instead", 3 * DAY + 1, "rosa"),
        ]
    )
    assert _links(store, engine, ["m1", "c1", "c2", "u1", "u2"]) == {}


def test_detection_can_be_turned_off(store: Store) -> None:
    engine = Engine(store, config=EngineConfig(change_window=0.0))
    engine.ingest(LOG)
    assert _links(store, engine, ["m1"]) == {}


def test_a_change_in_japanese_and_in_chinese(store: Store) -> None:
    engine = Engine(store, config=EngineConfig(change_window=CHANGE_WINDOW))
    engine.ingest(
        [
            _msg("j1", "製品デモは水曜15時に会議室Bで行います。", 1 * DAY, "yui"),
            _msg("j2", "お昼どうしますか？", 1 * DAY + 60, "sota"),
            _msg("j3", "製品デモは木曜10時に変更になりました。", 2 * DAY, "haruto"),
            _msg("z1", "产品发布会定在星期三下午三点。", 3 * DAY, "lina"),
            _msg("z2", "咖啡机又坏了", 3 * DAY + 60, "wei"),
            _msg("z3", "产品发布会改到星期四上午十点了。", 4 * DAY, "min"),
        ]
    )
    links = _links(store, engine, ["j1", "j2", "j3", "z1", "z2", "z3"])
    assert links == {"j1": ("j3", 2 * DAY), "z1": ("z3", 4 * DAY)}


def _assemble(engine: Engine, query: str) -> Any:
    # Recent history of an empty channel: what the store holds comes by retrieval alone.
    return engine.assemble(session="s", channel="ops", query=query, model="gpt-4o", budget=2000)


def test_assembly_leaves_the_superseded_value_out_and_says_why(store: Store) -> None:
    engine = Engine(store, config=EngineConfig(change_window=CHANGE_WINDOW))
    engine.ingest(LOG)
    context = _assemble(engine, "when is the customer demo?")
    text = "\n".join(str(m["content"]) for m in context.messages)
    assert "Thursday 10:00" in text
    assert "in room B" not in text  # the old statement is not presented as current
    reasons = {r.id: r.reason for r in context.report.candidates if not r.included}
    assert reasons["m1"] == "superseded by m4 (in this context) on 1970-01-03"


def test_a_question_about_history_shows_the_old_value_dated(store: Store) -> None:
    engine = Engine(store, config=EngineConfig(change_window=CHANGE_WINDOW))
    engine.ingest(LOG)
    context = _assemble(engine, "what was the customer demo time before the change?")
    lines = [ln for m in context.messages for ln in str(m["content"]).splitlines()]
    old = [ln for ln in lines if "in room B" in ln]
    assert len(old) == 1
    assert old[0].endswith("(superseded on 1970-01-03)")
    assert any("Thursday 10:00" in ln for ln in lines)
    assert any(n.startswith("m1: shown as history, superseded by m4") for n in context.report.notes)
