"""Tests of ctxwarden.normalize: canonical text, URLs, volatile masking, attachments, line keys."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ctxwarden.errors import InputError
from ctxwarden.normalize import (
    attachment_text,
    canonical,
    canonical_url,
    line_key,
    mask_volatile,
    mask_volatile_values,
)

# Text that looks like chat: words, numbers, times, URLs, bullets, emoji, odd Unicode.
_PIECES = st.sampled_from(
    [
        "deploy",
        "Standup",
        " ",
        "\n",
        "- ",
        "• ",
        "1. ",
        "#4812",
        "10:30",
        "9am",
        "2026-03-01",
        "3f2a9c1",
        "$1,299.00",
        "+1.1%",
        "1h30m",
        "db-1",
        "march 15",
        "monday",
        "not",
        "https://Ex.com/a/?utm_source=x&b=2#f",
        "http://x.io/p.",
        "👍",
        "ǅ",
        "ﬁ",
        "ß",
        "İ",
        "\u200b",
        "K",
        "...",
        "?",
        "<num>",
        "commit bcffbfe",
        "sha1: ",
        "revision=",
        "Hash @",
        "review",
        "ABCDEF1",
        "deadbeef",
    ]
)
_KINDS = ("uuid", "date", "time", "hex", "counter", "amount", "pct", "dur", "range", "num", "day")
chatty = st.lists(_PIECES, max_size=12).map("".join)
any_text = st.one_of(st.text(), chatty)


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("  Deploy   DONE  ", "deploy done"),
        ("- item", "item"),
        ("• item\n* other\n1. third\n2) fourth", "item other third fourth"),
        ("[ ] todo\n[x] done", "todo done"),
        ("ﬁle Ⅻ", "file xii"),  # NFKC compatibility forms
        ("STRASSE straße", "strasse strasse"),  # case folding, not just lower()
        ("zero\u200bwidth", "zerowidth"),
        ("-5% today", "-5% today"),  # a sign, not a bullet
        ("*bold* move", "*bold* move"),  # emphasis, not a bullet
    ],
)
def test_canonical_examples(raw: str, expected: str) -> None:
    assert canonical(raw) == expected


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("HTTPS://Blog.Example.COM/Post/", "https://blog.example.com/Post"),
        ("https://x.io/a?utm_source=rss&utm_medium=feed", "https://x.io/a"),
        ("https://x.io/a?fbclid=1&gclid=2&mc_cid=3&ref=hn&id=7", "https://x.io/a?id=7"),
        ("https://x.io/a?b=2&a=1&UTM_Campaign=z", "https://x.io/a?a=1&b=2"),
        ("https://x.io/a#section-2", "https://x.io/a"),
        ("http://x.io:80/a", "http://x.io/a"),
        ("https://x.io:8443/a", "https://x.io:8443/a"),
        ("https://youtube.com/watch?v=dQw4w9WgXcQ", "https://youtube.com/watch?v=dQw4w9WgXcQ"),
        ("not a url", "not a url"),
        ("http://[::1", "http://[::1"),  # unparsable: left alone, no exception
    ],
)
def test_canonical_url_examples(raw: str, expected: str) -> None:
    assert canonical_url(raw) == expected


def test_canonical_rewrites_urls_in_text_but_keeps_trailing_punctuation_outside() -> None:
    text = "New post: Flags https://Blog.x.com/flags/?utm_source=rss&utm_medium=feed."
    assert canonical(text) == "new post: flags https://blog.x.com/flags."


def test_url_path_case_is_kept_but_text_case_folded() -> None:
    assert canonical("See HTTPS://X.io/ReadMe") == "see https://x.io/ReadMe"


@pytest.mark.parametrize(
    ("text", "masked"),
    [
        ("deploy #4812 at 10:02 (sha 3f2a9c1)", "deploy <counter> at <time> (sha <hex>)"),
        ("eth: 44,914.49 usd (+1.1% in 1h)", "eth: <amount> (<pct> in <dur>)"),
        ("id 123e4567-e89b-12d3-a456-426614174000", "id <uuid>"),
        ("on 2026-03-01t08:04:49z and 01/03/2026", "on <date> and <date>"),
        ("due march 15, not 15 april", "due <date>, not <date>"),
        ("at 9am or 9 p.m. or 18:30:05", "at <time> or <time> or <time>"),
        ("took 250ms then 1h30m then 3 days", "took <dur> then <dur> then <dur>"),
        ("cost $5 and €3.50", "cost <amount> and <amount>"),
        ("report for monday", "report for <day>"),
        ("commit bcffbfe landed", "commit <hex> landed"),
        ("5 of 12 shards, 2-3 left, 4th try", "<num> of <num> shards, <range> left, <num> try"),
    ],
)
def test_mask_volatile_examples(text: str, masked: str) -> None:
    assert mask_volatile(text) == masked


@pytest.mark.parametrize(
    "text",
    [
        "db-1 is down",  # a host name, not a reading
        "ship v2 and python3",
        "flag ff_dark_mode_80",
        "see https://x.io/posts/4812",  # URLs are identities
        "deadbeef cafe",  # hex-looking words without digits, not named as hashes
        "no numbers here",
    ],
)
def test_mask_volatile_leaves_identifiers_alone(text: str) -> None:
    assert mask_volatile(text) == text


def test_mask_values_line_up_with_placeholders() -> None:
    masked, values = mask_volatile_values("monday at 10:30 build #7 for march 3")
    assert masked == "<day> at <time> build <counter> for <date>"
    assert values == ("monday", "10:30", "#7", "march 3")


def test_attachment_text_keeps_title_description_and_main_url() -> None:
    attachments = [
        {"title": "Q3 plan", "description": "Draft", "url": "https://x.io/q3", "color": 3},
        {"filename": "notes.txt", "size": 120, "proxy_url": "https://cdn/x"},
        {"name": "chart", "thumbnail": {"url": "https://cdn/t.png"}},
    ]
    assert attachment_text(attachments) == "Q3 plan\nDraft\nhttps://x.io/q3\nnotes.txt\nchart"
    assert attachment_text(None) == ""
    assert attachment_text([]) == ""


def test_attachment_text_names_the_bad_field() -> None:
    with pytest.raises(InputError, match=r"attachments\[1\]"):
        attachment_text([{"title": "ok"}, "not an object"])  # type: ignore[list-item]
    with pytest.raises(InputError, match=r"attachments\[0\]\.title"):
        attachment_text([{"title": 5}])
    with pytest.raises(InputError, match="attachments"):
        attachment_text("a string")  # type: ignore[arg-type]


def test_line_key_matches_summary_lines_up_to_formatting() -> None:
    assert line_key("  • Standup   MOVED to 10:30 ") == line_key("- standup moved to 10:30")
    assert line_key("standup moved to 10:30") != line_key("standup moved to 11:30")


@settings(max_examples=300, deadline=None)
@given(any_text)
def test_canonical_is_idempotent_and_total(text: str) -> None:
    once = canonical(text)
    assert canonical(once) == once


@settings(max_examples=300, deadline=None)
@given(any_text)
def test_mask_volatile_is_idempotent_and_total(text: str) -> None:
    once = mask_volatile(canonical(text))
    assert mask_volatile(once) == once
    raw_once = mask_volatile(text)
    assert mask_volatile(raw_once) == raw_once


@settings(max_examples=200, deadline=None)
@given(any_text)
def test_mask_values_rebuild_the_text(text: str) -> None:
    # Every placeholder stands for exactly the value recorded for it, in order.
    canon = canonical(text)
    masked, values = mask_volatile_values(canon)
    rebuilt = masked
    for value in values:
        start = min(
            (rebuilt.find(f"<{kind}>"), kind) for kind in _KINDS if rebuilt.find(f"<{kind}>") >= 0
        )
        rebuilt = rebuilt[: start[0]] + value + rebuilt[start[0] + len(start[1]) + 2 :]
    if "<" not in canon:  # literal placeholders in the input make the rebuild ambiguous
        assert rebuilt == canon


@settings(max_examples=200, deadline=None)
@given(any_text)
def test_line_key_is_idempotent(text: str) -> None:
    once = line_key(text)
    assert line_key(once) == once


@settings(max_examples=200, deadline=None)
@given(st.text(), st.text())
def test_canonical_url_is_idempotent(path: str, query: str) -> None:
    url = f"https://Ex.com/{path}?{query}"
    once = canonical_url(url)
    assert canonical_url(once) == once


def test_canonical_is_stable_across_calls() -> None:
    # Pinned output: a change here changes every stored exact key, so it must be deliberate.
    assert canonical("• Deploy #12 DONE https://X.io/a/?utm_source=z&b=1#top") == (
        "deploy #12 done https://x.io/a?b=1"
    )


_URL_PIECES = st.text(alphabet="aZ09_.~-=&?#/:%+@[] \\é\t", max_size=12)


@settings(max_examples=600, deadline=None)
@given(
    st.sampled_from(["http", "HTTPS", "ftp", "Https", "mailto", "ws"]),
    st.text(alphabet="aZ09.-:@[]%", min_size=0, max_size=10),
    _URL_PIECES,
    st.lists(
        st.tuples(
            st.sampled_from(["utm_source", "ref", "a", "B", "", "x=y", "fbclid", "q"]),
            _URL_PIECES,
        ),
        max_size=4,
    ),
    st.sampled_from(["", "#", "#top", "#a?b", "?"]),
)
def test_simple_url_path_agrees_with_urllib(
    scheme: str, host: str, path: str, query: list[tuple[str, str]], tail: str
) -> None:
    # The fast path (no urllib parsing) must give urllib's answer whenever it answers at all.
    from ctxwarden.normalize import _general_url, _simple_url

    joined = "&".join(f"{k}={v}" if v != "=" else k for k, v in query)
    url = f"{scheme}://{host}/{path}" + (f"?{joined}" if query else "") + tail
    fast = _simple_url(url)
    if fast is not None:
        assert fast == _general_url(url)


@pytest.mark.parametrize(
    "url",
    [
        "https://blog.example.com/post-7?utm_source=feed&utm_campaign=c1&ref=x9",
        "http://News.Example.org:80/item/5?b=2&a=1&fbclid=abc#frag",
        "https://x.io?a&b=&=c&&d=1",
        "https://x.io/a//?z=1",
        "ftp://Files.Example.com:21/pub/",
        "https://x.io/p?a=b=c",
        "https://x.io/p?q=a+b",
        "https://x.io/p?q=%41",
        "https://:443/p",
        "https://[::1]:443/p",
    ],
)
def test_canonical_url_fast_and_general_agree(url: str) -> None:
    from ctxwarden.normalize import _general_url, _simple_url

    fast = _simple_url(url)
    assert fast is None or fast == _general_url(url)
    assert canonical_url(url) == _general_url(url)


# --- the fast path of mask_volatile_values (ASCII text without capitals) ---------------------

_ASCII_CHATTY = st.lists(
    st.one_of(
        _PIECES.filter(str.isascii),
        st.text(alphabet="0123456789abcdefxyz:.,/-+#$%& \t\x1c\x1f<>_", max_size=12),
    ),
    max_size=12,
).map("".join)
lower_ascii = st.one_of(st.text(alphabet=st.characters(max_codepoint=127)), _ASCII_CHATTY).map(
    str.lower
)


def _slow_mask_volatile_values(text: str) -> tuple[str, tuple[str, ...]]:
    """mask_volatile_values as it was before its fast path: the general (Unicode, IGNORECASE)
    patterns only, gated by the same substring tests."""
    from ctxwarden.normalize import (
        _DAY_RE,
        _HAS_DIGIT,
        _WEEKDAYS,
        _named_hex_spans,
        _split_urls,
        _volatile_spans,
    )

    lowered = text.lower()
    has_day = "day" in lowered
    if has_day and text.isascii():
        has_day = any(map(lowered.__contains__, _WEEKDAYS))
    has_named_hex = any(word in lowered for word in ("commit", "sha", "hash", "rev", "digest"))
    has_digit = _HAS_DIGIT.search(text) is not None
    if not (has_digit or has_day or has_named_hex):
        return text, ()
    values: list[str] = []
    out: list[str] = []
    pieces = _split_urls(text) if "://" in text else [(False, text)]
    for is_url, piece in pieces:
        if is_url:
            out.append(piece)
            continue
        spans = _volatile_spans(piece, lower=False) if has_digit else []
        if has_day:
            spans.extend((m.start(), m.end(), "day") for m in _DAY_RE.finditer(piece))
        if has_named_hex:
            spans.extend(_named_hex_spans(piece, lower=False))
        spans.sort()
        position = 0
        for start, end, kind in spans:
            if start < position:
                continue
            out.append(piece[position:start] + f"<{kind.rstrip('_')}>")
            values.append(piece[start:end])
            position = end
        out.append(piece[position:])
    return ("".join(out), tuple(values)) if values else (text, ())


@settings(max_examples=1500, deadline=None)
@given(lower_ascii)
def test_volatile_spans_lower_case_path_equals_general_path(text: str) -> None:
    from ctxwarden.normalize import _volatile_spans

    assert _volatile_spans(text, lower=True) == _volatile_spans(text, lower=False)


@settings(max_examples=1000, deadline=None)
@given(st.one_of(lower_ascii, any_text))
def test_mask_volatile_values_fast_path_equals_slow_path(text: str) -> None:
    # The substring pre-checks and the ASCII patterns only skip work, never change a result.
    assert mask_volatile_values(text) == _slow_mask_volatile_values(text)
    canon = canonical(text)
    assert mask_volatile_values(canon) == _slow_mask_volatile_values(canon)


def test_lower_case_patterns_have_no_capital_letters() -> None:
    # What makes the case-sensitive copy equal to the IGNORECASE pattern on text without capitals.
    import re

    from ctxwarden.normalize import _VOLATILE_RE

    letters = re.sub(r"\\.|\(\?P<", "", _VOLATILE_RE.pattern)
    assert not re.findall(r"[A-Z]", letters)


@settings(max_examples=1000, deadline=None)
@given(st.one_of(any_text, st.text(alphabet=" \t\n\x1c\xa0\u3000\u2028ab.", max_size=12)))
def test_collapse_space_equals_split_and_join(text: str) -> None:
    from ctxwarden.normalize import _collapse_space

    assert _collapse_space(text) == " ".join(text.split())


def test_every_separator_but_space_is_unprintable() -> None:
    # What lets _collapse_space skip printable text.
    separators = [chr(c) for c in range(0x110000) if len(f"a{chr(c)}b".split()) == 2]
    assert " " in separators
    assert not [c for c in separators if c != " " and c.isprintable()]


@settings(max_examples=500, deadline=None)
@given(st.one_of(any_text, lower_ascii, _ASCII_CHATTY))
def test_canonical_ascii_shortcut_equals_one_general_pass(text: str) -> None:
    from ctxwarden.normalize import _canonical_once

    if text.isascii():
        assert canonical(text) == _canonical_once(text)
