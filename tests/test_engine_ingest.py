"""Ingest: validation, all-or-nothing batches, idempotence, verbatim folding."""

from __future__ import annotations

from types import MappingProxyType
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ctxwarden import Engine, InputError, Record
from ctxwarden.dedupe import DedupeConfig
from ctxwarden.engine import EngineConfig


def _msg(i: int, content: str, **kw: Any) -> dict[str, Any]:
    base = {
        "id": f"m{i}",
        "session": "s",
        "channel": "general",
        "author": "ana",
        "author_kind": "human",
        "role": "user",
        "content": content,
        "created_at": f"2026-03-01T08:{i // 60:02d}:{i % 60:02d}Z",
    }
    base.update(kw)
    return base


def test_outcomes_one_per_record_in_order(engine: Engine) -> None:
    result = engine.ingest([_msg(0, "hello"), _msg(1, "world"), _msg(2, "hello")])
    assert [o.status for o in result.outcomes] == ["stored", "stored", "duplicate"]
    assert result.outcomes[2].duplicate_of == "m0"
    assert engine.get("m2").id == "m0"
    assert engine.get("m0").dup_count == 2


def test_reingesting_a_known_id_is_a_noop(engine: Engine) -> None:
    engine.ingest([_msg(0, "hello"), _msg(1, "hello")])
    again = engine.ingest([_msg(0, "hello"), _msg(1, "hello")])
    assert [o.status for o in again.outcomes] == ["known", "known"]
    assert again.outcomes[1].duplicate_of == "m0"
    assert engine.get("m0").dup_count == 2
    assert engine.stats()["memories"] == 1


def test_duplicates_fold_only_within_channel_and_ttl(clock: Any) -> None:
    config = EngineConfig(dedupe=DedupeConfig(exact_ttl_seconds=60, exact_scope="channel"))
    with Engine.open(":memory:", clock=clock, config=config) as e:
        result = e.ingest(
            [
                _msg(0, "deploy done"),
                _msg(1, "deploy done", channel="dev"),  # other channel
                _msg(30, "deploy done"),  # within 60 s of m0
                _msg(200, "deploy done"),  # 170 s after the last sighting
                _msg(201, "deploy done", author="bo"),  # other author
            ]
        )
    assert [o.status for o in result.outcomes] == [
        "stored",
        "stored",
        "duplicate",
        "stored",
        "stored",
    ]


def test_bad_record_names_line_and_field_and_leaves_store_unchanged(engine: Engine) -> None:
    engine.ingest([_msg(0, "before")])
    before = engine.stats()
    bad = [_msg(1, "fine"), _msg(2, "also fine"), {**_msg(3, "x"), "role": "wizard"}]
    with pytest.raises(InputError, match=r"line 3, field 'role'") as info:
        engine.ingest(bad)
    assert info.value.field == "role"
    assert info.value.line == 3
    assert engine.stats() == before


@pytest.mark.parametrize(
    ("record", "field"),
    [
        ({"content": ""}, "content"),
        ({"role": "user"}, "content"),
        ({"content": "x", "created_at": "yesterday"}, "created_at"),
        ({"content": "x", "author_kind": "alien"}, "author_kind"),
        ({"content": "x", "kind": "poem"}, "kind"),
        ({"content": "x", "colour": "red"}, "colour"),
        ({"content": 5}, "content"),
        ({"content": "x", "pinned": "yes"}, "pinned"),
        ({"content": "x", "tool_calls": [{"function": {}}]}, "tool_calls"),
        ({"content": "x" * (1 << 20 + 1)}, "content"),
    ],
)
def test_invalid_records(engine: Engine, record: dict[str, Any], field: str) -> None:
    with pytest.raises(InputError) as info:
        engine.ingest([record])
    assert info.value.field == field


def test_openai_message_lists_and_records(engine: Engine) -> None:
    conversation = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "what is 2+2?"}]},
        {"role": "assistant", "content": "4"},
    ]
    result = engine.ingest(conversation, session="chat")
    assert result.counts["stored"] == 3
    again = engine.ingest(conversation, session="chat")
    # Without ids and times, a re-sent conversation folds as verbatim repeats.
    assert again.counts["stored"] == 0
    engine.ingest([Record(content="a fact", kind="fact", session="chat")])
    assert engine.store.pinned("default")[0].content == "a fact"


def test_tenants_are_kept_apart(engine: Engine) -> None:
    engine.ingest([_msg(0, "canary-a")], tenant="a")
    engine.ingest([_msg(0, "canary-b")], tenant="b")
    assert engine.get("m0", tenant="a").content == "canary-a"
    assert engine.get("m0", tenant="b").content == "canary-b"


records = st.lists(
    st.fixed_dictionaries(
        {
            "id": st.sampled_from([f"r{i}" for i in range(8)]),
            "content": st.sampled_from(["a", "b", "c", "hello there", "ok"]),
            "channel": st.sampled_from(["x", "y"]),
            "author": st.sampled_from(["ana", "bo"]),
            "created_at": st.integers(min_value=1_700_000_000, max_value=1_700_000_100),
        }
    ),
    max_size=30,
)


@settings(max_examples=60, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batch=records)
def test_ingest_is_idempotent_and_counts_add_up(batch: list[dict[str, Any]]) -> None:
    with Engine.open(":memory:") as e:
        first = e.ingest(batch)
        stats = e.stats()
        second = e.ingest(batch)
        assert e.stats() == stats
        # An id the batch gives one text is known; one given several texts is edited back and
        # forth (each text an edit of the last), ending on the batch's last text again.
        texts: dict[str, set[str]] = {}
        for record in batch:
            texts.setdefault(record["id"], set()).add(record["content"])
        for record, outcome in zip(batch, second.outcomes, strict=True):
            assert outcome.status in ("known", "edited")
            if len(texts[record["id"]]) == 1:
                assert outcome.status == "known"
        distinct_ids = len({r["id"] for r in batch})
        folded = first.counts["duplicate"]
        assert stats["memories"] + folded == distinct_ids
        assert stats["seen"] == distinct_ids  # dup_count accounts for every folded record


@settings(max_examples=40, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batch=records, bad_at=st.integers(min_value=0, max_value=29))
def test_bad_record_anywhere_leaves_store_unchanged(
    batch: list[dict[str, Any]], bad_at: int
) -> None:
    with Engine.open(":memory:") as e:
        e.ingest(batch[: len(batch) // 2])
        before = e.stats()
        poisoned = list(batch)
        poisoned.insert(min(bad_at, len(poisoned)), {"content": "x", "role": "nope"})
        with pytest.raises(InputError):
            e.ingest(poisoned)
        assert e.stats() == before


_FIELD_VALUES = st.one_of(
    st.none(), st.booleans(), st.integers(-5, 2**40), st.floats(allow_nan=True),
    st.text(max_size=8),
    st.sampled_from(["", " ", "user", "tool", "bot", "fact", "pinned", "a" * 513]),
    st.lists(st.dictionaries(st.sampled_from(["title", "url"]), st.text(max_size=4)), max_size=2),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)  # fmt: skip


_NAME = st.one_of(st.none(), st.text(max_size=4))
_VALID = st.fixed_dictionaries(
    {"content": st.text(min_size=1, max_size=8)},
    optional={
        "id": _NAME, "tenant": _NAME, "session": _NAME, "channel": _NAME, "author": _NAME,
        "created_at": st.one_of(st.none(), st.integers(0, 2**33), st.floats(0, 1e10)),
        "role": st.sampled_from(["user", "assistant", "system", "tool"]),
        "author_kind": st.sampled_from(["human", "bot", "agent", "tool"]),
        "kind": st.sampled_from(["message", "fact", "pinned", "summary"]),
        "pinned": st.booleans(), "metadata": st.just({}), "attachments": st.just([]),
    },
)  # fmt: skip
_KEYS = st.sampled_from(
    ["id", "tenant", "session", "channel", "author", "author_kind", "role", "content",
     "created_at", "thread_id", "reply_to", "kind", "pinned", "name", "tool_call_id", "attachments",
     "metadata", "tool_calls", "bogus"]
)  # fmt: skip


@settings(max_examples=300)
@given(valid=_VALID, changes=st.dictionaries(_KEYS, _FIELD_VALUES, max_size=2))
def test_plain_dict_fast_path_matches_full_validation(
    valid: dict[str, Any], changes: dict[str, Any]
) -> None:
    # A dict may take the fast path; a read-only mapping always takes the general one.
    data = {**valid, **changes}

    def build(source: Any) -> Record | tuple[str, str | None]:
        try:
            return Record.from_mapping(source, line=1)
        except Exception as exc:  # the same error (class and field) either way
            return (type(exc).__name__, getattr(exc, "field", None))

    assert build(dict(data)) == build(MappingProxyType(data))


def test_ingest_pauses_the_garbage_collector_only_while_it_runs(engine: Engine) -> None:
    import gc

    seen: list[bool] = []

    def records() -> Any:
        seen.append(gc.isenabled())
        yield _msg(0, "hello")

    assert gc.isenabled()
    engine.ingest(records())
    assert seen == [False]
    assert gc.isenabled()
    with pytest.raises(InputError):
        engine.ingest([{"content": ""}])
    assert gc.isenabled()  # restored after an error too
    gc.disable()
    try:
        engine.ingest([_msg(1, "world")])
        assert not gc.isenabled()  # a caller's choice is left alone
    finally:
        gc.enable()


@pytest.mark.parametrize(
    "extra",
    [
        {},
        {"author_kind": "bot", "thread_id": "t1", "reply_to": "m0", "name": "n"},
        {"attachments": [{"title": "a", "url": "https://x.io"}], "metadata": {"k": [1, 2]}},
        {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f"}}]},
        {"role": "tool", "tool_call_id": "c1", "kind": "fact"},
        {"pinned": True},
    ],
)
def test_insert_values_are_the_new_memory_row(extra: dict[str, Any]) -> None:
    # Ingest builds the insert values directly; they must be what the NewMemory's row would be.
    from ctxwarden.dedupe import DedupeCandidate
    from ctxwarden.ingestion import _memory_values, _Prepared
    from ctxwarden.store.base import NewMemory
    from ctxwarden.store.reads import memory_row

    record = Record.from_mapping({**_msg(3, "deploy #12 at 10:02"), **extra}, line=1)
    for candidate in (
        None,
        DedupeCandidate.build(
            author=record.author, author_kind=record.author_kind, content=record.content
        ),
    ):
        item = _Prepared(
            record=record,
            id="x1",
            created_at=12.5,
            content_hash=candidate.exact_key if candidate else "h",
            candidate=candidate,
        )
        memory = NewMemory(
            id=item.id, tenant=record.tenant, session=record.session, channel=record.channel,
            author=record.author, author_kind=record.author_kind, role=record.role,
            content=record.content, created_at=item.created_at, thread_id=record.thread_id,
            reply_to=record.reply_to, kind=record.kind, pinned=record.pinned, name=record.name,
            tool_calls=record.tool_calls, tool_call_id=record.tool_call_id,
            attachments=record.attachments, metadata=record.metadata,
            content_hash=item.content_hash,
            near_key=candidate.near_key if candidate is not None else None,
        )  # fmt: skip
        assert _memory_values(item) == memory_row(None, memory)[1:]


def test_a_batch_mixing_plain_and_full_records_stores_each_as_given(engine: Engine) -> None:
    # SQLite inserts plain messages with a shorter statement: fields left out must read back as
    # empty, and the others as sent, whichever statement a record took and in any order.
    extras: list[dict[str, Any]] = [
        {},
        {"thread_id": "t1", "reply_to": "m0"},
        {},
        {"name": "n", "metadata": {"k": 1}},
        {"attachments": [{"kind": "file", "name": "doc", "url": "https://x.io/d"}]},
        {},
        {"pinned": True},
    ]
    batch = [_msg(i, f"message number {i} about topic {i * 7}", **extra) for i, extra in
             enumerate(extras)]  # fmt: skip
    result = engine.ingest(batch)
    assert [o.status for o in result.outcomes] == ["stored"] * len(extras)
    for i, extra in enumerate(extras):
        memory = engine.get(f"m{i}")
        assert memory.content == f"message number {i} about topic {i * 7}"
        assert memory.thread_id == extra.get("thread_id")
        assert memory.reply_to == extra.get("reply_to")
        assert memory.name == extra.get("name")
        assert dict(memory.metadata) == extra.get("metadata", {})
        assert list(memory.attachments) == extra.get("attachments", [])
        assert memory.pinned is bool(extra.get("pinned"))
        assert memory.dup_count == 1
        assert memory.last_seen_at == memory.created_at
    # Every row reached the full-text index.
    found = {m.id for m, _ in engine.search("topic", limit=20)}
    assert found == {f"m{i}" for i in range(len(extras))}
