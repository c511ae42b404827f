"""Layer C of de-dup (ctxwarden.semantic) with the real offline MiniLM embedder: reworded repeats
fold, changed facts never do, nothing crosses channels, authors or tenants, the folded text is
erased from the file, and a second pass finds nothing."""

from __future__ import annotations

import math
import secrets
import string
from pathlib import Path
from typing import Any

import pytest

from ctxwarden.engine import Engine, EngineConfig
from ctxwarden.errors import ConfigError
from ctxwarden.semantic import SemanticConfig, fact_guard, families, fold_line

T0 = 1_700_000_000


def _msg(id: str, content: str, *, at: int, author: str = "ana", channel: str = "dev",
         author_kind: str = "human", **extra: Any) -> dict[str, Any]:  # fmt: skip
    return {
        "id": id,
        "session": "s",
        "channel": channel,
        "author": author,
        "author_kind": author_kind,
        "content": content,
        "created_at": T0 + at,
        **extra,
    }


def _engine(path: str | Path = ":memory:", **semantic: Any) -> Engine:
    return Engine.open(path, config=EngineConfig(semantic=SemanticConfig(enabled=True, **semantic)))


#: Reworded repeats by one person: layers A and B cannot fold them (different words).
PARAPHRASES = [
    ("is anyone else seeing the flaky login test?", "anyone else seeing the flaky login test?"),
    ("lunch at the usual place today", "lunch today at the usual place"),
]

#: Bot texts that differ in a word of the template: other events.
BOT_PAIRS = [
    ("Deploy #1 of api to staging succeeded", "Deploy #2 of api to production succeeded"),
]

#: Changes of a decision or fact, close in wording: must never fold.
HARD_NEGATIVES = [
    ("standup is now at 8:15, not 9:45", "standup is now at 10:30, not 8:15"),
    ("deploy moved to Tuesday", "deploy moved to Thursday"),
    ("the tests pass on main", "the tests don't pass on main"),
    ("I will enable the flag tonight", "I will disable the flag tonight"),
    ("the meeting is in room A", "the meeting is in room B"),
    ("we picked Postgres for the store", "we picked SQLite for the store"),
    ("budget for the offsite is $400", "budget for the offsite is $4000"),
    ("ship it on March 3", "ship it on May 3"),
]


def test_reworded_repeats_fold_after_embedding() -> None:
    with _engine() as engine:
        records = []
        for i, (a, b) in enumerate(PARAPHRASES):
            records += [_msg(f"a{i}", a, at=10 * i), _msg(f"b{i}", b, at=10 * i + 5)]
        outcomes = engine.ingest(records).outcomes
        assert all(o.status == "stored" for o in outcomes)  # A and B leave them alone
        engine.embed_pending()  # the hook folds after the batch
        for i in range(len(PARAPHRASES)):
            aggregate = engine.get(f"b{i}")
            assert aggregate.id == f"a{i}"
            assert aggregate.dup_count == 2
            assert aggregate.last_seen_at == T0 + 10 * i + 5
            assert aggregate.latest_content is None  # same values: nothing newer to show
        stats = engine.stats()
        assert stats["semantic"] == len(PARAPHRASES)
        assert stats["channels"]["dev"]["semantic"] == len(PARAPHRASES)
        assert stats["memories"] == len(PARAPHRASES)
        assert stats["seen"] == 2 * len(PARAPHRASES)


@pytest.mark.parametrize(("old", "new"), HARD_NEGATIVES)
def test_changed_facts_never_fold(old: str, new: str) -> None:
    with _engine(threshold=0.5) as engine:  # the guard alone must hold them apart
        engine.ingest([_msg("old", old, at=0), _msg("new", new, at=60)])
        engine.embed_pending()
        assert engine.get("new").id == "new"
        assert engine.stats()["semantic"] == 0
    assert fact_guard(new, old, author_kind="human") is not None


@pytest.mark.parametrize(("old", "new"), BOT_PAIRS)
def test_bot_templates_with_another_word_never_fold(old: str, new: str) -> None:
    with _engine(threshold=0.5) as engine:
        engine.ingest(
            [
                _msg("old", old, at=0, author="deploybot", author_kind="bot"),
                _msg("new", new, at=60, author="deploybot", author_kind="bot"),
            ]
        )
        engine.embed_pending()
        assert engine.get("new").id == "new"


def test_threshold_separates_what_the_guard_cannot_see() -> None:
    # "blocked"/"unblocked" differ in no token class the guard knows: the cosine must.
    with _engine() as engine:
        engine.ingest(
            [_msg("x", "the release is blocked", at=0), _msg("y", "the release is unblocked", at=5)]
        )
        engine.embed_pending()
        assert engine.get("y").id == "y"


def test_other_channels_authors_tenants_and_windows_never_fold() -> None:
    a, b = PARAPHRASES[0]
    with _engine(window_seconds=600) as engine:
        engine.ingest([_msg("c1", a, at=0), _msg("c2", b, at=5, channel="random")])
        engine.ingest([_msg("p1", a, at=10), _msg("p2", b, at=15, author="bob")])
        # Their own session: layer A would fold w2 into c2 (the same words in one session).
        ops = {"channel": "ops", "session": "s-ops"}
        engine.ingest([_msg("w1", a, at=20, **ops), _msg("w2", b, at=2000, **ops)])
        engine.ingest([_msg("t1", a, at=30, channel="qa")], tenant="one")
        engine.ingest([_msg("t2", b, at=35, channel="qa")], tenant="two")
        engine.ingest(
            [
                _msg("pin1", a, at=40, channel="pins"),
                _msg("pin2", b, at=45, channel="pins", pinned=True),
            ]
        )
        engine.embed_pending()
        for id in ("c2", "p2", "w2", "pin2"):
            assert engine.get(id).id == id
        assert engine.get("t2", tenant="two").id == "t2"
        # A run over the tenant with no window finds the ops pair, and nothing else.
        report = engine.dedupe_semantic(config=SemanticConfig(window_seconds=math.inf))
        assert [(f.id, f.into) for f in report.folds] == [("w2", "w1")]


def test_dry_run_plans_and_run_is_idempotent(tmp_path: Path) -> None:
    with Engine.open(tmp_path / "s.db") as engine:  # semantic off: ingest and embed only
        a, b = PARAPHRASES[0]
        c, d = PARAPHRASES[1]
        engine.ingest(
            [
                _msg("a", a, at=0),
                _msg("b", b, at=5),
                _msg("b2", a + " 🙏", at=9),
                _msg("c", c, at=20),
                _msg("d", d, at=25),
            ]
        )
        engine.embed_pending()
        assert engine.stats()["semantic"] == 0  # off by default
        plan = engine.dedupe_semantic(dry_run=True)
        assert engine.stats()["memories"] == 5
        done = engine.dedupe_semantic()
        assert [(f.id, f.into) for f in done.folds] == [(f.id, f.into) for f in plan.folds]
        assert ("b", "a") in [(f.id, f.into) for f in done.folds]
        assert families(done.folds)[0][0] == "a"
        again = engine.dedupe_semantic()
        assert again.folds == []
        assert engine.stats()["semantic"] == len(done.folds)


def test_folded_text_is_erased_from_the_file(tmp_path: Path) -> None:
    # Letters only: a digit would be a fact to the guard. 'zzq' keeps it one FTS term.
    canary = "zzq" + "".join(secrets.choice(string.ascii_lowercase) for _ in range(20))
    path = tmp_path / "e.db"
    with Engine.open(path) as engine:
        engine.ingest(
            [
                _msg("a", "can someone review my pull request please", at=0),
                _msg("b", f"could someone please review my pull request {canary}", at=5),
            ]
        )
        engine.embed_pending()
        assert engine.search(canary)
        # The made-up word lowers the cosine: a looser threshold, the guard still applies.
        report = engine.dedupe_semantic(config=SemanticConfig(threshold=0.5))
        assert [(f.id, f.into) for f in report.folds] == [("b", "a")]
        assert engine.get("b").id == "a"
        assert engine.search(canary) == []
        # Same values: the aggregate's own text stands, the newer wording is not kept.
        assert engine.get("a").latest_content is None
    data = path.read_bytes()
    wal = path.with_name(path.name + "-wal")
    if wal.exists():
        data += wal.read_bytes()
    assert canary[4:-2].encode() not in data


def test_aliases_of_the_folded_memory_follow_it() -> None:
    a, b = PARAPHRASES[0]
    with _engine() as engine:
        engine.ingest(
            [_msg("a", a, at=0), _msg("b", b, at=5), _msg("b-again", b, at=6)]
        )  # b-again folds into b at ingest (layer A)
        assert engine.get("b-again").id == "b"
        engine.embed_pending()
        assert engine.get("b-again").id == "a"
        aggregate = engine.get("b")
        assert aggregate.id == "a"
        assert aggregate.dup_count == 3
        stats = engine.stats()
        assert (stats["exact"], stats["semantic"], stats["folded"]) == (1, 1, 2)


def test_config_is_validated() -> None:
    with pytest.raises(ConfigError, match="semantic.threshold"):
        SemanticConfig(threshold=0)
    with pytest.raises(ConfigError, match="semantic.window_seconds"):
        SemanticConfig(window_seconds=-1)
    with pytest.raises(ConfigError, match="semantic: expected a SemanticConfig"):
        EngineConfig(semantic=True)  # type: ignore[arg-type]


def test_cli_dedupe_semantic(tmp_path: Path) -> None:
    import json
    import subprocess
    import sys

    db = tmp_path / "c.db"
    records = tmp_path / "in.jsonl"
    a, b = PARAPHRASES[0]
    records.write_text(
        "\n".join(
            json.dumps(_msg(i, text, at=n)) for n, (i, text) in enumerate([("a", a), ("b", b)])
        )
    )

    def run(*args: str) -> str:
        done = subprocess.run(
            [sys.executable, "-m", "ctxwarden", "--db", str(db), *args],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        return done.stdout

    run("ingest", str(records))
    run("embed")
    assert "would fold 1" in run("dedupe", "--semantic", "--dry-run")
    assert "folded 1" in run("dedupe", "--semantic")
    assert "folded 0" in run("dedupe", "--semantic")
    stats = json.loads(run("stats", "--json"))
    assert (stats["semantic"], stats["memories"]) == (1, 1)


def test_conversations_transcripts_and_unfolded_batches_never_fold_semantically() -> None:
    a, b = PARAPHRASES[1]
    with _engine(window_seconds=600) as engine:
        # no channel: two sessions (and two end users of one session) are two conversations
        engine.ingest([_msg("x1", a, at=0, channel=None, session="s1")])
        engine.ingest([_msg("x2", b, at=5, channel=None, session="s2")])
        engine.ingest([_msg("u1", a, at=10, channel=None, session="s3", user="alice")])
        engine.ingest([_msg("u2", b, at=15, channel=None, session="s3", user="bob")])
        # an agent's turns, and a batch ingested with fold=False
        engine.ingest(
            [_msg("r1", a, at=20, role="assistant"), _msg("r2", b, at=25, role="assistant")]
        )
        engine.ingest(
            [_msg("f1", a, at=30, channel="f"), _msg("f2", b, at=35, channel="f")], fold=False
        )
        # the same pair in one conversation does fold (the rule is the scope's, not the text's)
        engine.ingest([_msg("y1", a, at=40, channel=None, session="s4", user="carol")])
        engine.ingest([_msg("y2", b, at=45, channel=None, session="s4", user="carol")])
        engine.embed_pending()
        for id in ("x2", "u2", "r2", "f2"):
            assert engine.get(id).id == id
        assert engine.get("y2").id == "y1"


def test_the_default_threshold_is_the_line_of_the_store_vectors() -> None:
    # 0.983 on MiniLM's float path: under its line (0.985), over the int8 path's (0.98).
    a = "the new CI pipeline broke twice before noon"
    b = "the new CI pipeline broke twice before noon, ugh"
    for threshold, folded in ((None, False), (0.98, True)):
        config = EngineConfig(
            embedder="minilm-l6-int8@1",
            semantic=SemanticConfig(enabled=True, threshold=threshold),
        )
        with Engine.open(":memory:", config=config) as engine:
            engine.ingest([_msg("c1", a, at=0), _msg("c2", b, at=5)])
            engine.embed_pending()
            assert (engine.get("c2").id == "c1") is folded
    assert fold_line("minilm-l6-int8@2") == 0.98
    assert fold_line("minilm-l6-int8@2/t128") == 0.98
    assert fold_line("minilm-l6-int8@1") == fold_line("openai:nomic-embed-text") == 0.985
