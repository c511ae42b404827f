"""De-dup at ingest end to end: layers A and B through Engine.ingest, aggregates, rendering."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ctxwarden import Engine, InputError
from ctxwarden.dedupe import DedupeConfig
from ctxwarden.engine import EngineConfig

T0 = 1_800_000_000


def _msg(i: int, content: str, *, author: str = "ana", kind: str = "human",
         channel: str = "general", at: float | None = None,
         **kw: Any) -> dict[str, Any]:  # fmt: skip
    return {
        "id": f"m{i}", "session": "s", "channel": channel, "author": author,
        "author_kind": kind, "role": "user", "content": content,
        "created_at": T0 + (i * 60 if at is None else at), **kw,
    }  # fmt: skip


def _statuses(result: Any) -> list[str]:
    return [o.status for o in result.outcomes]


# Pairs whose second message changes a fact the first states: never folded.
HARD_NEGATIVES = [
    ("ana", "human", "standup is now at 8:15, not 9:45", "standup is now at 10:30, not 8:15"),
    ("ana", "human", "budget for Q3 is $12,000", "budget for Q3 is $14,500"),
    ("ana", "human", "release moved to 2026-03-04", "release moved to 2026-03-11"),
    ("ana", "human", "the build passed", "the build paused"),
    ("ana", "human", "we can ship on Friday", "we can't ship on Friday"),
    ("ana", "human", "use port 8080 for the api", "use port 8081 for the api"),
    ("calbot", "bot", "Standup moved to 10:30", "Standup moved to 11:00"),
    ("calbot", "bot", "Review rescheduled from 14:00 to 15:00",
     "Review rescheduled from 15:00 to 16:00"),
    ("opsbot", "bot", "Deploy of api is no longer at 17:00", "Deploy of api is no longer at 18:00"),
]  # fmt: skip


@pytest.mark.parametrize(("author", "kind", "first", "second"), HARD_NEGATIVES)
def test_changed_facts_are_never_folded(
    engine: Engine, author: str, kind: str, first: str, second: str
) -> None:
    result = engine.ingest(
        [_msg(0, first, author=author, kind=kind), _msg(1, second, author=author, kind=kind)]
    )
    assert _statuses(result) == ["stored", "stored"]
    assert engine.get("m1").content == second
    assert engine.get("m0").dup_count == 1


def test_bot_family_folds_with_count_and_keeps_the_latest_value(engine: Engine) -> None:
    ticks = [
        _msg(i, f"Deploy #{4812 + i} of api finished at 10:{i:02d} (sha {i:x}f3a9c1e)",
             author="deploybot", kind="bot")
        for i in range(6)
    ]  # fmt: skip
    result = engine.ingest(ticks)
    assert _statuses(result) == ["stored"] + ["near_duplicate"] * 5
    assert all(o.duplicate_of == "m0" for o in result.outcomes[1:])
    assert all((o.reason or "").startswith("bot-volatile") for o in result.outcomes[1:])
    aggregate = engine.get("m5")
    assert aggregate.id == "m0"
    assert aggregate.dup_count == 6
    assert aggregate.last_seen_at == T0 + 5 * 60
    assert aggregate.latest_content == ticks[-1]["content"]
    context = engine.assemble(session="s", model="gpt-4o", budget=2000)
    rendered = "\n".join(str(m["content"]) for m in context.messages)
    assert "x6 from" in rendered
    assert "#4817" in rendered  # the newest value is what the model sees, not only the first
    assert context.included.count("m0") == 1


def test_exact_repeat_after_a_near_member_shows_its_own_value(engine: Engine) -> None:
    bot = {"author": "pricebot", "kind": "bot"}
    engine.ingest(
        [
            _msg(0, "BTC is at $61,020 (10:00)", **bot),
            _msg(1, "BTC is at $61,400 (10:01)", **bot),
            _msg(2, "btc is at $61,020  (10:00)", **bot),
        ]
    )
    aggregate = engine.get("m0")
    assert aggregate.dup_count == 3
    assert aggregate.latest_content is None  # the newest says what the first says


def test_people_repost_folds_only_on_formatting(engine: Engine) -> None:
    result = engine.ingest(
        [
            _msg(0, "See the doc https://docs.example.com/plan?utm_source=slack"),
            _msg(1, "bump: see the doc https://docs.example.com/plan/"),
            _msg(2, "See the doc https://docs.example.com/plan-v2"),
        ]
    )
    assert _statuses(result)[:2] == ["stored", "near_duplicate"]
    assert result.outcomes[1].reason == "formatting"
    assert _statuses(result)[2] == "stored"


def test_other_authors_and_other_channels_do_not_fold_near(engine: Engine) -> None:
    bot = {"author": "deploybot", "kind": "bot"}
    result = engine.ingest(
        [
            _msg(0, "Deploy #1 ok at 10:00", **bot),
            _msg(1, "Deploy #2 ok at 10:05", author="otherbot", kind="bot"),
            _msg(2, "Deploy #3 ok at 10:10", channel="ops", **bot),
        ]
    )
    assert _statuses(result) == ["stored", "stored", "stored"]


@pytest.mark.parametrize("split", [False, True], ids=["one batch", "batch per record"])
@pytest.mark.parametrize(
    ("scope", "expected"),
    [
        # m1: the same author's cross-post into #random of the same session;
        # m2: the same message into #general from another session (another server's bridge).
        ("channel_or_session", ["stored", "duplicate", "duplicate"]),
        ("channel", ["stored", "stored", "duplicate"]),
        ("session", ["stored", "duplicate", "stored"]),
    ],
)
def test_exact_scope_decides_which_repeats_fold(
    clock: Any, scope: str, expected: list[str], split: bool
) -> None:
    batch = [
        _msg(0, "lunch at noon?"),
        _msg(1, "lunch at noon?", channel="random"),
        {**_msg(2, "lunch at noon?"), "session": "s2"},
    ]
    # Layer B off: it would fold m2 into m0 in every scope (same channel, same text).
    config = EngineConfig(dedupe=DedupeConfig(exact_scope=scope, near=False))  # type: ignore[arg-type]
    with Engine.open(":memory:", clock=clock, config=config) as e:
        if split:
            statuses = [s for record in batch for s in _statuses(e.ingest([record]))]
        else:
            statuses = _statuses(e.ingest(batch))
        assert statuses == expected
        assert e.get("m0").dup_count == expected.count("duplicate") + 1
        if expected[1] == "duplicate":
            assert e.get("m1").channel == "general"  # the alias resolves to the aggregate


def test_default_scope_folds_cross_posts_and_cross_session_repeats(clock: Any) -> None:
    batch = [_msg(0, "lunch at noon?"), _msg(1, "lunch at noon?", channel="random")]
    with Engine.open(":memory:", clock=clock) as e:
        assert _statuses(e.ingest(batch)) == ["stored", "duplicate"]
        # Another author's identical words are another report, in any scope.
        assert _statuses(e.ingest([_msg(2, "lunch at noon?", author="bo")])) == ["stored"]
    with Engine.open(":memory:", clock=clock, config=EngineConfig(dedupe=None)) as e:
        assert _statuses(e.ingest([_msg(0, "same"), _msg(1, "same")])) == ["stored", "stored"]


def test_near_window_limits_folding(clock: Any) -> None:
    config = EngineConfig(dedupe=DedupeConfig(near_window_seconds=600))
    bot = {"author": "deploybot", "kind": "bot"}
    with Engine.open(":memory:", clock=clock, config=config) as e:
        result = e.ingest(
            [
                _msg(0, "Deploy #1 ok at 10:00", at=0, **bot),
                _msg(1, "Deploy #2 ok at 10:09", at=540, **bot),
                _msg(2, "Deploy #3 ok at 10:18", at=1080, **bot),  # 540 s after the last
                _msg(3, "Deploy #4 ok at 11:00", at=4000, **bot),  # out of the window
            ]
        )
    assert _statuses(result) == ["stored", "near_duplicate", "near_duplicate", "stored"]


def test_folds_survive_a_reopen_and_batches(tmp_path: Any) -> None:
    bot = {"author": "deploybot", "kind": "bot"}
    path = tmp_path / "x.db"
    with Engine.open(path) as e:
        e.ingest([_msg(0, "Deploy #1 ok at 10:00", **bot)])
        e.ingest([_msg(1, "Deploy #2 ok at 10:01", **bot)])
    with Engine.open(path) as e:  # a fresh process: no cached candidates
        result = e.ingest([_msg(2, "Deploy #3 ok at 10:02", **bot)])
        assert _statuses(result) == ["near_duplicate"]
        assert e.get("m2").dup_count == 3
        assert e.get("m2").latest_content == "Deploy #3 ok at 10:02"
        stats = e.stats()
    assert stats["channels"]["general"]["near"] == 2
    assert stats["top_families"][0]["count"] == 3


def test_rolled_back_batch_leaves_no_stale_candidates(engine: Engine) -> None:
    bot = {"author": "deploybot", "kind": "bot"}
    with pytest.raises(InputError):
        engine.ingest([_msg(0, "Deploy #1 ok at 10:00", **bot), {"content": ""}])
    result = engine.ingest([_msg(5, "Deploy #2 ok at 10:05", **bot)])
    assert _statuses(result) == ["stored"]


BOT_TEMPLATES = ["Deploy #{n} of api ok at 10:{m:02d}", "BTC ${n},{m:03d} at 09:{m:02d}"]
PEOPLE_TEXTS = ["ok", "lol", "standup at 9:{m:02d}", "see https://x.io/a?utm_source={n}"]

records = st.lists(
    st.builds(
        lambda i, bot, text, n, m, channel, at: {
            "id": f"r{i}",
            "session": "s",
            "channel": channel,
            "author": "feedbot" if bot else "ana",
            "author_kind": "bot" if bot else "human",
            "content": (BOT_TEMPLATES if bot else PEOPLE_TEXTS)[text % 2 if bot else text].format(
                n=n, m=m
            ),
            "created_at": T0 + at,
        },
        i=st.integers(0, 40),
        bot=st.booleans(),
        text=st.integers(0, 3),
        n=st.integers(1, 3),
        m=st.integers(0, 2),
        channel=st.sampled_from(["x", "y"]),
        at=st.integers(0, 7200),
    ),
    max_size=40,
    # One text per id: the same id with another text is an edit (tests/store/test_edits.py).
    unique_by=lambda record: record["id"],
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batch=records)
def test_ingest_idempotent_and_dup_count_equals_folds(batch: list[dict[str, Any]]) -> None:
    with Engine.open(":memory:") as e:
        first = e.ingest(batch)
        stats = e.stats()
        memories = list(e.store.iter_memories("default"))
        second = e.ingest(batch)
        assert all(o.status == "known" for o in second.outcomes)
        assert e.stats() == stats
        assert list(e.store.iter_memories("default")) == memories
        folded: dict[str, int] = {}
        for outcome in first.outcomes:
            if outcome.status in ("duplicate", "near_duplicate"):
                assert outcome.duplicate_of is not None
                assert outcome.reason
                folded[outcome.duplicate_of] = folded.get(outcome.duplicate_of, 0) + 1
                assert e.get(outcome.id).id == outcome.duplicate_of
        for memory in memories:
            assert memory.dup_count == 1 + folded.get(memory.id, 0)
        assert stats["exact"] + stats["near"] == sum(folded.values())
        distinct = len({r["id"] for r in batch})
        assert stats["seen"] == distinct


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batch=records, bad_at=st.integers(0, 40))
def test_bad_record_leaves_store_unchanged(batch: list[dict[str, Any]], bad_at: int) -> None:
    with Engine.open(":memory:") as e:
        e.ingest(batch[: len(batch) // 2])
        before = (e.stats(), list(e.store.iter_memories("default")))
        broken = list(batch)
        broken.insert(min(bad_at, len(broken)), {"content": "x", "created_at": "soon"})
        with pytest.raises(InputError):
            e.ingest(broken)
        assert (e.stats(), list(e.store.iter_memories("default"))) == before
        # and the engine still folds correctly afterwards
        again = e.ingest(batch)
        assert len(again.outcomes) == len(batch)


def test_config_rejects_a_bad_dedupe_value() -> None:
    from ctxwarden.errors import ConfigError

    with pytest.raises(ConfigError, match="dedupe"):
        EngineConfig(dedupe={"exact_ttl_seconds": 1})  # type: ignore[arg-type]
    assert EngineConfig().dedupe == DedupeConfig(exact_scope="channel_or_session")
    assert math.isfinite(EngineConfig().dedupe.exact_ttl_seconds)  # type: ignore[union-attr]


def test_settings_build_the_dedupe_config(tmp_path: Any) -> None:
    from ctxwarden.config import load_settings
    from ctxwarden.errors import ConfigError

    path = tmp_path / "config.toml"
    path.write_text('exact_ttl_seconds = 120\nexact_scope = "channel"\n', encoding="utf-8")
    config = load_settings(path, near_window_seconds=600).engine_config()
    assert config.dedupe == DedupeConfig(
        exact_ttl_seconds=120, near_window_seconds=600, exact_scope="channel"
    )
    with pytest.raises(ConfigError, match="exact_ttl_seconds"):
        load_settings(path, exact_ttl_seconds=0).engine_config()
