"""Free-text change detection (issue 19, item 1): which earlier message a new one changes."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ctxwarden.validity import (
    Statement,
    analyse,
    asks_history,
    common_terms,
    may_change,
    superseded,
)

OLD = "The customer demo is on Wednesday 15:00 in room B."


@pytest.mark.parametrize(
    "new",
    [
        "The customer demo moved to Thursday 10:00.",
        "Customer demo is now Thursday 10:00, not Wednesday.",
        "Scratch that: the customer demo will be Thursday 10:00.",
        "We'll do the customer demo on Thursday instead.",
        "The customer demo is no longer on Wednesday.",
        "Customer demo changed to Friday at 9.",
        "The customer demo is postponed until next week.",
        "Actually, the customer demo is Thursday 10:00.",
    ],
)
def test_a_change_cue_on_the_same_subject_links_the_old_statement(new: str) -> None:
    old = analyse(OLD, author="rosa")
    assert superseded(analyse(new, author="milo"), [old]) is old


@pytest.mark.parametrize(
    ("old_text", "new_text"),
    [
        ("製品デモは水曜15時に会議室Bで行います。", "製品デモは木曜10時に変更になりました。"),
        ("製品デモは水曜15時です。", "製品デモは水曜ではなく木曜10時です。"),
        ("产品发布会定在星期三下午三点。", "产品发布会改到星期四上午十点了。"),
        ("产品发布会定在星期三下午三点。", "产品发布会不是星期三，而是星期五。"),
        ("La demo del cliente es el miércoles a las 15.", "La demo del cliente ahora es el jueves"),
    ],
)
def test_changes_in_other_languages_link(old_text: str, new_text: str) -> None:
    old = analyse(old_text, author="yui")
    assert superseded(analyse(new_text, author="haruto"), [old]) is old


def test_a_new_value_by_the_same_author_links_without_a_cue() -> None:
    old = analyse("the staging database runs on port 5432", author="ana")
    new = analyse("the staging database runs on port 6543", author="ana")
    assert superseded(new, [old]) is old
    # The same words from someone else, with no cue, are an opinion, not a change.
    assert superseded(analyse("the staging database runs on port 6543", author="bo"), [old]) is None


def test_the_newest_statement_of_the_subject_is_the_one_changed() -> None:
    first = analyse("release freeze starts Monday", author="ana")
    second = analyse("release freeze moved to Tuesday", author="bo")
    third = analyse("release freeze now Wednesday, not Tuesday", author="ana")
    assert superseded(third, [first, second]) is second


def test_questions_neither_change_nor_are_changed() -> None:
    old = analyse(OLD, author="rosa")
    asked = analyse("Did the customer demo move to Thursday?", author="milo")
    assert superseded(asked, [old]) is None
    question = analyse("When is the customer demo now?", author="milo")
    moved = analyse("The customer demo moved to Friday.", author="ana")
    assert superseded(moved, [question]) is None


def test_unrelated_messages_with_cues_do_not_link() -> None:
    old = analyse(OLD, author="rosa")
    for text in (
        "Actually I moved to Berlin last year.",
        "lunch is now served in the cafeteria instead",
        "the printer no longer jams",
        "我们现在去吃饭吧。",
        "やっぱり雨が降ってきた。",
    ):
        assert superseded(analyse(text, author="milo"), [old]) is None, text


def test_a_retraction_takes_the_authors_last_statement() -> None:
    own = analyse("let's meet at 15:00", author="ana")
    other = analyse("I can bring snacks at 16:00", author="bo")
    new = analyse("scratch that, 16:30 works better for me", author="ana")
    assert superseded(new, [own, other]) is own


def test_common_terms_are_the_windows_vocabulary() -> None:
    names = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "theta"]
    window = [analyse(f"standup notes {i}: item {w}", author="bot") for i, w in enumerate(names)]
    assert {"standu", "notes", "item"} <= common_terms(window)
    assert "alpha" not in common_terms(window)


def test_asks_history() -> None:
    assert asks_history("what was the demo time before it changed?")
    assert asks_history("デモは変更前は何時でしたか？")
    assert asks_history("发布会原来是几点？")
    assert not asks_history("what time is the demo now?")


_LEFT = st.text(alphabet="abcdefghijklm", min_size=3, max_size=8)
_RIGHT = st.text(alphabet="nopqrstuvwxyz", min_size=3, max_size=8)
_CUES = st.sampled_from(["", "moved to", "now", "instead", "no longer", "changed to", "actually"])


@settings(max_examples=200, deadline=None)
@given(
    st.lists(_LEFT, min_size=1, max_size=8),
    st.lists(_RIGHT, min_size=1, max_size=8),
    _CUES,
    st.integers(0, 99),
    st.integers(0, 99),
    st.booleans(),
)
def test_messages_sharing_no_subject_never_link(
    left: list[str], right: list[str], cue: str, a: int, b: int, same_author: bool
) -> None:
    old = analyse(f"{' '.join(left)} {a}", author="ana")
    new = analyse(f"{cue} {' '.join(right)} {b}", author="ana" if same_author else "bo")
    assert superseded(new, [old]) is None


@settings(max_examples=100, deadline=None)
@given(
    st.lists(_LEFT, min_size=2, max_size=6, unique=True), st.integers(0, 99), st.integers(100, 199)
)
def test_a_changed_value_of_the_same_subject_links(subject: list[str], a: int, b: int) -> None:
    words = " ".join(subject)
    old = analyse(f"the {words} is {a}", author="ana")
    new = analyse(f"the {words} moved to {b}", author="bo")
    found = superseded(new, [old])
    # A subject made only of function words or cue words is no subject at all.
    assert found is old or len(old.terms) < 1


def test_statement_is_a_value() -> None:
    s = analyse("the demo is on Friday", author="ana", ref=7)
    assert isinstance(s, Statement)
    assert s.ref == 7
    assert "friday" in s.values


@given(st.text(alphabet=st.characters(max_codepoint=127), max_size=80))
def test_the_ascii_word_pattern_finds_what_the_general_one_does(text: str) -> None:
    # analyse takes the cheaper pattern for ASCII text: the same words, in the same order.
    from ctxwarden import validity

    lower = text.lower()
    assert validity._ASCII_LETTERS.findall(lower) == validity._LETTERS.findall(lower)


@given(st.text(alphabet="abnotwmvecdhgilr KN1., \u00e9\u5909", max_size=60), st.booleans())
def test_may_change_is_false_only_where_analyse_finds_nothing_that_changes(
    text: str, has_author: bool
) -> None:
    author = "rosa" if has_author else None
    statement = analyse(text, author=author)
    if not may_change(text, author=author):
        assert not statement.cue
        assert not (statement.values and author is not None)


@pytest.mark.parametrize(
    "text", ["it moved", "we are NOT going", "scratch that", "no longer", "the note", "nowhere"]
)
def test_may_change_finds_cues(text: str) -> None:
    assert may_change(text.lower())


# False links found on a chat log (issue 19): phrasing that many people share is not a change
# of what one of them said. Written here in other words than any data set's.


def test_another_authors_first_person_statement_changes_nothing() -> None:
    old = analyse("I was born and raised in Oslo, before moving here.", author="ana")
    new = analyse("I was born and raised in Quito, before moving here.", author="ben")
    assert superseded(new, [old]) is None
    # The same author correcting themself is a change.
    again = analyse("I was born and raised in Quito, before moving here.", author="ana")
    assert superseded(again, [old]) is old


def test_a_cue_both_messages_share_needs_a_new_value_for_the_slot() -> None:
    old = analyse("the cache layer feels much faster now, ask me for details", author="ana")
    new = analyse("the search page feels much faster now, ask me for details", author="ben")
    assert superseded(new, [old]) is None  # no value was replaced: the same phrasing
    old = analyse("the team offsite moved to Bergen", author="ana")
    new = analyse("the team offsite moved to Tromsø", author="ben")
    assert superseded(new, [old]) is old  # a new value for the same subject


def test_a_repeat_by_another_author_is_not_a_change() -> None:
    old = analyse("we really can't manage without Grafana anymore", author="ana")
    new = analyse("we really can't manage without Grafana anymore", author="ben")
    assert superseded(new, [old]) is None


def test_swapped_values_are_a_change() -> None:
    old = analyse("change of plan: the queue uses Kafka instead of NATS", author="ana")
    new = analyse("change of plan: the queue uses NATS instead of Kafka", author="ben")
    assert superseded(new, [old]) is old


def test_a_preposition_is_no_subject() -> None:
    old = analyse("the nightly export broke twice before Friday", author="ana")
    new = analyse("actually I lived in Lima before", author="ben")
    assert superseded(new, [old]) is None


def test_a_feed_without_an_author_changes_only_a_value() -> None:
    # A feed's items repeat its template; a cue word in a title is no change.
    old = analyse("New article: Scaling the search tier https://news.example.org/scaling")
    new = analyse("New article: How we switched build systems https://news.example.org/build")
    assert superseded(new, [old]) is None
    old = analyse("Maintenance window: Tuesday 22:00 UTC for the storage tier")
    new = analyse("Maintenance window moved: Thursday 23:00 UTC for the storage tier")
    assert superseded(new, [old]) is old


def test_long_talk_with_a_cue_in_passing_is_no_change() -> None:
    old = analyse(
        "Spent the weekend restoring an old sailboat with my brother; sanding the hull took "
        "forever but the varnish finally looks right and the harbour crew loved it.",
        author="ana",
    )
    new = analyse(
        "Thanks! The harbour crew were kind. Now I am off to the market to find fresh bread "
        "and maybe cheese for the picnic with my cousins on Sunday afternoon.",
        author="ana",
    )
    assert superseded(new, [old]) is None


def test_naming_the_old_number_again_links_a_longer_message() -> None:
    old = analyse("the retro is at 16:00 every other week this quarter", author="ana")
    new = analyse(
        "note: the retro is now at 15:00, not 16:00, because of the holiday rota", author="ana"
    )
    assert superseded(new, [old]) is old


@pytest.mark.parametrize(
    ("old_text", "new_text"),
    [
        # Another author, a cue, a place without digits: the longer message is long by its
        # values (their character pairs), not by talk.
        ("周会地点定在三楼会议室。", "周会地点推迟到七楼大厅。"),
        ("大家注意，周会地点是线上会议。", "更正一下，周会地点换成七楼大厅。"),
        (
            "定例会議の場所はオンラインではなく大阪オフィスです。",
            "定例会議の場所は第一会議室に移動します。",
        ),
    ],
)
def test_a_cjk_change_of_place_by_another_author_links(old_text: str, new_text: str) -> None:
    old = analyse(old_text, author="yang")
    assert superseded(analyse(new_text, author="wei"), [old]) is old


def test_a_retraction_about_another_subject_leaves_the_authors_last_value() -> None:
    place = analyse("大家注意，周会地点是线上会议。", author="yang")
    own = analyse("大家注意，客户培训是星期五上午十点。", author="wei")
    new = analyse("更正一下，周会地点换成七楼大厅。", author="wei")
    assert superseded(new, [place, own]) is place
    talk = analyse("scratch that, 16:30 works better for me", author="wei")
    assert superseded(talk, [own]) is own
