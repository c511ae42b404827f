"""Tests of ctxwarden.dedupe: keys, the fold rule (hard negatives and positives), config."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ctxwarden.dedupe import DedupeCandidate, DedupeConfig, exact_key, may_fold, skeleton
from ctxwarden.errors import ConfigError
from ctxwarden.normalize import canonical


def person(text: str, *, author: str = "ana", at: float | None = None) -> DedupeCandidate:
    return DedupeCandidate.build(author=author, author_kind="human", content=text, created_at=at)


def bot(text: str, *, author: str = "opsbot", at: float | None = None) -> DedupeCandidate:
    return DedupeCandidate.build(author=author, author_kind="bot", content=text, created_at=at)


# --- hard negatives: different facts that look alike --------------------------------------------

PERSON_NEGATIVES = [
    # times
    ("retro is now at 14:00, not 15:30", "retro is now at 16:00, not 14:00"),
    ("the standup is now at 8:15, not 9:45", "the standup is now at 10:30, not 8:15"),
    # dates
    ("launch moved to April 3", "launch moved to April 10"),
    ("code freeze starts 2026-05-01", "code freeze starts 2026-05-08"),
    ("offsite is on thursday", "offsite is on tuesday"),
    # amounts and counts
    ("budget for the offsite is $4,000", "budget for the offsite is $5,500"),
    ("we need 3 more reviewers", "we need 5 more reviewers"),
    ("error rate is 2% after the fix", "error rate is 20% after the fix"),
    # negation
    ("the migration is safe to run", "the migration is not safe to run"),
    ("we can ship on friday", "we can't ship on friday"),
    ("ok to merge", "no ok to merge"),
    # from X to Y
    ("on-call moves from Priya to Sam", "on-call moves from Sam to Priya"),
    ("scaling the pool from 3 to 5 replicas", "scaling the pool from 5 to 3 replicas"),
    # version numbers
    ("we pin postgres 15.4 for now", "we pin postgres 16.1 for now"),
    ("release 4.2 is the one with SSO", "release 4.3 is the one with SSO"),
    # people and other words
    ("Sam owns the billing rollout", "Priya owns the billing rollout"),
    (
        "billing moves to CockroachDB instead of ClickHouse",
        "billing moves to ClickHouse instead of CockroachDB",
    ),
    # a question is not a statement; signs and emoji carry meaning
    ("we ship friday?", "we ship friday"),
    ("+1", "-1"),
    ("ship it 👍", "ship it 👎"),
    ("p99 < 200ms", "p99 > 200ms"),
    # identifiers and hashes a person names are facts
    ("please review 3f2a9c1", "please review 9b1e2d7"),
    ("the flag is ff_search_12", "the flag is ff_search_21"),
]


@pytest.mark.parametrize(("first", "second"), PERSON_NEGATIVES)
def test_person_hard_negatives_never_fold(first: str, second: str) -> None:
    old, new = person(first, at=0.0), person(second, at=60.0)
    assert not may_fold(new, old)
    assert not may_fold(old, new)
    assert old.exact_key != new.exact_key


BOT_NEGATIVES = [
    # another event type, not another instance
    ("Deploy #12 of api to staging succeeded", "Deploy #13 of api to production succeeded"),
    ("Deploy #12 of api succeeded at 10:02", "Deploy #13 of api failed at 10:40"),
    ("Build #7 passed", "Build #8 paused"),
    # URLs are identities
    ("New post https://x.io/posts/41", "New post https://x.io/posts/42"),
    # a bot relaying a changed decision relays a fact
    ("Standup moved to 10:30", "Standup moved to 11:00"),
    ("Event 'Retro' rescheduled to March 3", "Event 'Retro' rescheduled to March 10"),
    ("Quota changed from 5 GB to 10 GB", "Quota changed from 10 GB to 20 GB"),
    ("Backups run at 02:00 instead of 03:00", "Backups run at 04:00 instead of 02:00"),
    # comparison direction
    ("alert: p99 > 250ms on api", "alert: p99 < 250ms on api"),
    # hosts glued to numbers are identities
    ("Disk 91% full on db-1", "Disk 93% full on db-2"),
]


@pytest.mark.parametrize(("first", "second"), BOT_NEGATIVES)
def test_bot_hard_negatives_never_fold(first: str, second: str) -> None:
    old, new = bot(first, at=0.0), bot(second, at=60.0)
    assert not may_fold(new, old)
    assert not may_fold(old, new)


def test_same_words_from_two_people_do_not_fold() -> None:
    assert not may_fold(
        person("the build is red", author="ana"), person("the build is red", author="bo")
    )
    assert exact_key(author="ana", content="x", attachments=None) != exact_key(
        author="bo", content="x", attachments=None
    )


def test_near_fold_needs_same_author_kind() -> None:
    # A person and a bot sharing a name: the person's numbers still protect.
    human = DedupeCandidate.build(author="ci", author_kind="human", content="build #1 at 10:00")
    machine = DedupeCandidate.build(author="ci", author_kind="bot", content="build #2 at 11:00")
    assert not may_fold(machine, human)
    assert not may_fold(human, machine)


# --- hard positives: repeats that should fold ----------------------------------------------------

BOT_POSITIVES = [
    (
        "deploy #4812 of api succeeded at 10:02 (sha 3f2a9c1)",
        "deploy #4813 of api succeeded at 11:40 (sha 9b1e2d7)",
    ),
    # an all-digit commit hash is still a hash; one with no digit is a hash when named so
    ("Deploy #1 of api ok (commit 3412882)", "Deploy #2 of api ok (commit 9ab3f10)"),
    ("Deploy #1 of api ok (commit bcffbfe)", "Deploy #2 of api ok (commit 9ab3f10)"),
    (
        "BTC price alert: 37,334.09 USD (+4.3% in 1h) [10:52:33]",
        "BTC price alert: 18,376.60 USD (-2.1% in 1h) [11:00:17]",
    ),
    (
        "Job 6f1c2a3e-0b4d-4c2e-9a7f-1d2e3f4a5b6c finished in 250ms",
        "Job 0a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d finished in 1.2s",
    ),
    ("Nightly report for Monday: 12 errors", "Nightly report for Tuesday: 7 errors"),
    ("Backup of 2026-03-01 done at 03:00", "Backup of 2026-03-02 done at 03:01"),
]


@pytest.mark.parametrize(("first", "second"), BOT_POSITIVES)
def test_bot_volatile_families_fold(first: str, second: str) -> None:
    old, new = bot(first, at=0.0), bot(second, at=60.0)
    decision = may_fold(new, old)
    assert decision.fold, decision.reason
    assert decision.layer == "near"
    assert decision.reason.startswith("bot-volatile")
    assert new.near_key == old.near_key


REPOSTS = [
    # tracking parameters, fragments, trailing slashes, host case
    (
        "New post: Flags https://blog.x.com/flags?utm_source=rss",
        "New post: Flags https://Blog.X.com/flags/?utm_source=rss&utm_medium=feed#top",
    ),
    # whitespace, case, bullets, Unicode forms
    ("  the CI is   green again ", "The CI is green again"),
    ("- lunch at the ﬁsh place?", "Lunch at the fish place?"),
]


@pytest.mark.parametrize(("first", "second"), REPOSTS)
def test_reposts_fold_exactly(first: str, second: str) -> None:
    for make in (person, bot):
        old, new = make(first, at=0.0), make(second, at=60.0)
        decision = may_fold(new, old)
        assert decision.fold
        assert decision.layer == "exact"
        assert exact_key(author=new.author, content=second, attachments=None) == old.exact_key


NEAR_REPOSTS = [
    ("**Heads up**: the build is green!!", "heads up - the build is green"),
    ("bump: can someone review my PR?", "can someone review my PR?"),
    ("the retro notes are in the doc (edited)", "the retro notes are in the doc"),
    ("standup is at 9:45, see you there", "Standup is at 9:45 — see you there!"),
]


@pytest.mark.parametrize(("first", "second"), NEAR_REPOSTS)
def test_person_reposts_with_formatting_edits_fold(first: str, second: str) -> None:
    old, new = person(first, at=0.0), person(second, at=60.0)
    decision = may_fold(new, old)
    assert decision.fold, decision.reason
    assert (decision.layer, decision.reason) == ("near", "formatting")


def test_attachments_count_in_the_exact_key() -> None:
    a = exact_key(
        author="feed", content="new", attachments=[{"title": "A", "url": "https://x.io/a"}]
    )
    b = exact_key(
        author="feed",
        content="new",
        attachments=[{"title": "A", "url": "https://x.io/a/?utm_source=z", "color": 1}],
    )
    c = exact_key(
        author="feed", content="new", attachments=[{"title": "B", "url": "https://x.io/b"}]
    )
    assert a == b
    assert a != c
    with_embed = DedupeCandidate.build(
        author="feed",
        author_kind="bot",
        content="new",
        attachments=[{"title": "A", "url": "https://x.io/a"}],
    )
    assert with_embed.exact_key == a


def test_exact_key_is_pinned() -> None:
    # Stored keys must not change silently between releases.
    assert exact_key(author="ana", content="Hello  World", attachments=None) == exact_key(
        author="ana", content="hello world", attachments=[]
    )
    # xxh3_128 over "author NUL canonical content NUL canonical attachment text".
    assert exact_key(author="ana", content="hello world", attachments=None) == (
        "71f543a24d05cb0a7bf1af4ffd0ee559"
    )


def test_windows_limit_folding() -> None:
    config = DedupeConfig(exact_ttl_seconds=3600, near_window_seconds=600)
    assert may_fold(person("hi all", at=3000.0), person("hi all", at=0.0), config)
    late = may_fold(person("hi all", at=4000.0), person("hi all", at=0.0), config)
    assert not late
    assert late.reason == "outside-exact-ttl"
    near = may_fold(bot("build #2 ok", at=700.0), bot("build #1 ok", at=0.0), config)
    assert (near.fold, near.reason) == (False, "outside-near-window")
    assert may_fold(bot("build #2 ok", at=500.0), bot("build #1 ok", at=0.0), config)


def test_config_switches() -> None:
    off = DedupeConfig(near=False)
    assert not may_fold(bot("build #2 ok"), bot("build #1 ok"), off)
    assert may_fold(bot("build #1 ok"), bot("build  #1 OK"), off)  # exact still folds
    strict = DedupeConfig(fold_bot_values=False)
    assert not may_fold(bot("build #2 ok"), bot("build #1 ok"), strict)
    assert may_fold(bot("build #2 ok!"), bot("build #2 ok"), strict)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"exact_ttl_seconds": 0}, "exact_ttl_seconds"),
        ({"exact_ttl_seconds": -1.0}, "exact_ttl_seconds"),
        ({"near_window_seconds": math.nan}, "near_window_seconds"),
        ({"near_window_seconds": "1h"}, "near_window_seconds"),
        ({"exact_scope": "tenant"}, "exact_scope"),
        ({"near": "yes"}, "near"),
        ({"fold_bot_values": 1}, "fold_bot_values"),
    ],
)
def test_config_errors_name_the_field(kwargs: dict[str, object], field: str) -> None:
    with pytest.raises(ConfigError, match=f"dedupe.{field}"):
        DedupeConfig(**kwargs)  # type: ignore[arg-type]


def test_config_accepts_unbounded_windows() -> None:
    config = DedupeConfig(
        exact_ttl_seconds=math.inf, near_window_seconds=math.inf, exact_scope="session"
    )
    assert config.exact_scope == "session"


def test_empty_skeleton_never_near_folds() -> None:
    assert skeleton("...!!!") == ()
    assert person("...").near_key is None
    assert not may_fold(person("!!!"), person("..."))


# --- properties ----------------------------------------------------------------------------------

_WORDS = st.sampled_from(
    [
        "deploy",
        "api",
        "standup",
        "is",
        "now",
        "at",
        "not",
        "moved",
        "to",
        "the",
        "ok",
        "?",
        "👍",
        "from",
    ]
)
_VALUES = st.sampled_from(
    [
        "10:30",
        "8:15",
        "#12",
        "#13",
        "3f2a9c1",
        "9b1e2d7",
        "$5",
        "$7",
        "4.2",
        "4.3",
        "12",
        "13",
        "5%",
        "monday",
        "march 3",
    ]
)
_SPACING = st.sampled_from([" ", "  ", "\n", " - "])
_template = st.lists(st.one_of(_WORDS, st.just(None)), min_size=1, max_size=8)


def _fill(template: list[str | None], values: list[str], spacing: str) -> str:
    pieces: list[str] = []
    iterator = iter(values)
    for word in template:
        pieces.append(word if word is not None else next(iterator, "1"))
    return spacing.join(pieces)


@st.composite
def pairs(draw: st.DrawFn) -> tuple[DedupeCandidate, DedupeCandidate]:
    template = draw(_template)
    slots = template.count(None)
    first = draw(st.lists(_VALUES, min_size=slots, max_size=slots))
    second = draw(st.one_of(st.just(first), st.lists(_VALUES, min_size=slots, max_size=slots)))
    kind = draw(st.sampled_from(["human", "bot", "bot"]))
    author = draw(st.sampled_from(["ana", "bo"]))
    other_author = draw(st.sampled_from([author, author, "zed"]))
    a = DedupeCandidate.build(
        author=author, author_kind=kind, content=_fill(template, first, draw(_SPACING))
    )
    b = DedupeCandidate.build(
        author=other_author,
        author_kind=kind,
        content=_fill(template, second, draw(_SPACING)).upper(),
    )
    return a, b


@settings(max_examples=400, deadline=None)
@given(pairs())
def test_may_fold_is_symmetric(pair: tuple[DedupeCandidate, DedupeCandidate]) -> None:
    a, b = pair
    assert may_fold(a, b).fold == may_fold(b, a).fold


@settings(max_examples=400, deadline=None)
@given(pairs())
def test_every_fold_is_found_by_a_key(pair: tuple[DedupeCandidate, DedupeCandidate]) -> None:
    # The store only compares messages sharing a key: a fold the keys cannot find would be lost.
    a, b = pair
    if may_fold(a, b).fold:
        assert a.exact_key == b.exact_key or (a.near_key is not None and a.near_key == b.near_key)


@settings(max_examples=400, deadline=None)
@given(pairs())
def test_people_never_fold_different_values(pair: tuple[DedupeCandidate, DedupeCandidate]) -> None:
    a, b = pair
    if a.author_kind == "human" and a.values != b.values:
        assert not may_fold(a, b).fold


@settings(max_examples=300, deadline=None)
@given(st.text(), st.sampled_from([" ", "\t", "\n  "]), st.booleans())
def test_exact_key_equal_up_to_normalisation(text: str, spacing: str, upper: bool) -> None:
    variant = spacing + spacing.join(text.split()) + spacing
    if upper:
        variant = variant.upper()
    base = exact_key(author="ana", content=text, attachments=None)
    assert exact_key(author="ana", content=text, attachments=None) == base  # stable
    # Any two texts with the same canonical form share the key.
    if canonical(variant) == canonical(text):
        assert exact_key(author="ana", content=variant, attachments=None) == base
    assert may_fold(person(text), person(text)).fold


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=80), st.sampled_from(["human", "bot"]))
def test_build_never_raises(text: str, kind: str) -> None:
    candidate = DedupeCandidate.build(author=None, author_kind=kind, content=text)
    assert may_fold(candidate, candidate).fold
