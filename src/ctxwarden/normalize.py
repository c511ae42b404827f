"""Canonical text for de-duplication: pure, deterministic, never raises on any ``str``.

Four views of a message, each idempotent (``f(f(x)) == f(x)``):

- :func:`canonical` — the text an *exact* duplicate must share: Unicode NFKC, case folded,
  zero-width characters removed, bullet markers stripped at line starts, whitespace collapsed,
  URLs canonicalised by :func:`canonical_url`. Differences it erases never carry meaning.
- :func:`mask_volatile` — :func:`canonical`-style text with *volatile* tokens replaced by typed
  placeholders (``<time>``, ``<counter>``, ``<hex>``...). Whether a masked difference is noise or a
  fact is decided by :mod:`ctxwarden.dedupe`, not here: a bot's ``08:17`` is a timestamp, a
  person's ``8:15`` is the new standup time.
- :func:`attachment_text` — attachments and embeds reduced to title, description and main URL.
- :func:`line_key` — the key for read-time de-dup of summary lines.

Volatile tokens (:func:`mask_volatile`), in the order they are tried, and why each one varies
between instances of the same machine-made message (bots stamp them on every event):

- ``<uuid>`` ``123e4567-e89b-12d3-a456-426614174000``: request, job and trace ids are fresh
  per event.
- ``<date>`` ``2026-03-01``, ``2026-03-01t08:04:49z``, ``01/03/2026``, ``march 15``, ``15 mar``:
  event dates and timestamps.
- ``<time>`` ``08:17:53``, ``9:45``, ``9am``, ``9 p.m.``: the clock time an alert fired.
- ``<hex>`` 7 to 64 hex characters with at least one digit and one letter (``3f2a9c1``), or any
  7 to 64 hex characters right after ``commit``, ``sha``, ``hash``, ``rev`` or ``digest``: commit
  and image hashes change on every build; the digit-and-letter rule spares words such as
  ``deadbeef`` and plain numbers where nothing names them as hashes.
- ``<counter>`` ``#4812``: build, run, deploy and ticket sequence numbers.
- ``<amount>`` ``$1,299.00``, ``44,914.49 usd``: prices and balances in market and billing alerts.
- ``<pct>`` ``+1.1%``, ``-3 %``: rates of change and utilisation readings.
- ``<dur>`` ``1h``, ``250ms``, ``3 days``, ``1h30m``: elapsed times and windows.
- ``<range>`` ``2-3``: a numeric span.
- ``<num>`` ``42``, ``4.2.1``, ``+1``, ``15th``: any other free-standing number (counts,
  readings, versions).
- ``<day>`` ``monday`` ... ``sunday``: the weekday a report or reminder is for.

Numbers glued to a word (``db-1``, ``v2``, ``ff_dark_mode_80``, ``python3``) are identifiers, not
readings, and URLs are identities (``/posts/4812`` and ``/posts/4813`` are different posts): neither
is masked.
"""

from __future__ import annotations

import functools
import re
import unicodedata
from collections.abc import Mapping, Sequence
from typing import Final
from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit

from ctxwarden.errors import InputError

__all__ = [
    "TRACKING_PARAMETERS",
    "attachment_text",
    "canonical",
    "canonical_url",
    "line_key",
    "mask_volatile",
    "mask_volatile_values",
]

#: Query parameters that identify a click, a campaign or a share, never the resource itself.
#: Keys are compared case-insensitively; every key starting with ``utm_`` is dropped as well.
TRACKING_PARAMETERS: Final[frozenset[str]] = frozenset(
    {
        "fbclid",  # Facebook click id
        "gclid",  # Google Ads click ids
        "dclid",
        "gbraid",
        "wbraid",
        "msclkid",  # Microsoft Ads
        "yclid",  # Yandex
        "twclid",  # X / Twitter
        "igshid",  # Instagram share id
        "mc_cid",  # Mailchimp campaign / member
        "mc_eid",
        "_hsenc",  # HubSpot
        "_hsmi",
        "mkt_tok",  # Marketo
        "oly_anon_id",  # Omeda
        "oly_enc_id",
        "vero_id",
        "ref",  # "where did the reader come from" markers
        "ref_src",
        "ref_url",
        "referrer",
    }
)

# Zero-width characters render as nothing; they only make equal texts hash differently.
_ZERO_WIDTH: Final = dict.fromkeys(map(ord, "\u200b\u200c\u200d\u2060\ufeff\u00ad"), None)

# A URL in running text. The scheme is required: bare "example.com" is too ambiguous to rewrite.
_URL_RE: Final = re.compile(r"(?i)\b(?:https?|ftp)://[^\s<>\"'`]+")
# Characters that end a sentence or close a bracket after a URL rather than belong to it.
_URL_TRAILING: Final = ".,;:!?)]}>'\"*_~"

# Bullet markers at a line start ("- x", "* x", "• x", "1. x", "2) x", "[ ] x"). A marker needs a
# space after it (or the line end) so "-5%" and "*bold*" are not bullets.
_BULLET_RE: Final = re.compile(
    r"^(?:(?:[-*+•◦‣▪▫●○■□➤►▸–—·]|\d{1,3}[.)]|\[[ x]?\])(?:\s+|$))+", re.MULTILINE
)

_DEFAULT_PORTS: Final = {"http": ":80", "https": ":443", "ftp": ":21"}


# Feed and alert bots post the same few URLs over and over: parsing dominates their cost.
@functools.lru_cache(maxsize=4096)
def canonical_url(url: str) -> str:
    """Return ``url`` canonicalised for hashing; a string that is not a URL comes back unchanged.

    Scheme and host are lower-cased, a default port is dropped, tracking parameters
    (:data:`TRACKING_PARAMETERS` and every ``utm_*``) are removed, the remaining query parameters
    are sorted, the fragment is dropped and trailing slashes of the path are removed. The path and
    parameter values keep their case: they often name case-sensitive resources (video ids, files).

    >>> canonical_url("HTTPS://Blog.Example.com:443/Post/?utm_source=rss&b=2&a=1#top")
    'https://blog.example.com/Post?a=1&b=2'
    """
    if "://" not in url:
        return url
    fast = _simple_url(url)
    if fast is not None:
        return fast
    return _general_url(url)


# An http(s)/ftp URL whose query needs no decoding or re-encoding: every key and value is
# made only of characters that ``quote(safe="")`` leaves alone. For these the result is what
# _general_url returns (a property test holds it to that) without urllib's parsing.
_SIMPLE_URL_RE: Final = re.compile(
    r"(?i)(https?|ftp)://([^/?#\[\]\\%\s]+)(/[^?#\s]*)?(?:\?([A-Za-z0-9_.~&=-]*))?(?:#\S*)?"
)


def _simple_url(url: str) -> str | None:
    if not url.isascii() or not url.isprintable():
        return None
    match = _SIMPLE_URL_RE.fullmatch(url)
    if match is None:
        return None
    scheme_text, netloc, path, query = match.groups()
    scheme = scheme_text.lower()
    netloc = netloc.lower()
    default_port = _DEFAULT_PORTS[scheme]
    if netloc.endswith(default_port):
        netloc = netloc[: -len(default_port)]
        if not netloc:
            return None
    path = (path or "").rstrip("/")
    if not query:
        return f"{scheme}://{netloc}{path}"
    kept: list[tuple[str, str]] = []
    for pair in query.split("&"):
        if not pair:
            continue
        key, _, value = pair.partition("=")
        if "=" in value:
            return None  # urlencode would quote it
        if not _is_tracking(key):
            kept.append((key, value))
    if not kept:
        return f"{scheme}://{netloc}{path}"
    kept.sort()
    return f"{scheme}://{netloc}{path}?" + "&".join(f"{key}={value}" for key, value in kept)


def _general_url(url: str) -> str:
    try:
        parts = urlsplit(url)
    except ValueError:  # e.g. an unbalanced IPv6 bracket: leave the text alone rather than guess
        return url
    scheme = parts.scheme.lower()
    if not scheme or not parts.netloc:
        return url
    netloc = parts.netloc.lower()
    default_port = _DEFAULT_PORTS.get(scheme)
    if default_port is not None and netloc.endswith(default_port):
        netloc = netloc[: -len(default_port)]
    path = parts.path.rstrip("/")
    query = ""
    if parts.query:
        kept = sorted(
            (key, value)
            for key, value in parse_qsl(parts.query, keep_blank_values=True)
            if not _is_tracking(key)
        )
        query = urlencode(kept, quote_via=quote)
    return urlunsplit((scheme, netloc, path, query, ""))


def _is_tracking(key: str) -> bool:
    lowered = key.lower()
    return lowered.startswith("utm_") or lowered in TRACKING_PARAMETERS


def _split_urls(text: str) -> list[tuple[bool, str]]:
    """Split ``text`` into (is_url, piece) runs, trailing punctuation left outside the URL."""
    pieces: list[tuple[bool, str]] = []
    position = 0
    for match in _URL_RE.finditer(text):
        raw = match.group()
        url = raw.rstrip(_URL_TRAILING)
        if "://" not in url or url.endswith("://"):
            continue
        start = match.start()
        if start > position:
            pieces.append((False, text[position:start]))
        pieces.append((True, url))
        position = start + len(url)
    if position < len(text):
        pieces.append((False, text[position:]))
    return pieces


def _nfkc(text: str) -> str:
    if text.isascii():
        return text
    return unicodedata.normalize("NFKC", text).translate(_ZERO_WIDTH)


def _fold(text: str) -> str:
    """Case-fold running text, NFKC-stable (see :func:`_nfkc`)."""
    if text.isascii():
        return text.lower()
    return unicodedata.normalize("NFKC", text.casefold())


def _strip_bullets_and_space(text: str) -> str:
    if "\n" in text or "\r" in text:
        lines = text.splitlines()
        text = "\n".join(_BULLET_RE.sub("", line.strip()) for line in lines)
    else:
        # One line: only its start can hold bullets (a MULTILINE sub would try ^ everywhere).
        text = text.strip()
        bullets = _BULLET_RE.match(text)
        if bullets is not None:
            text = text[bullets.end() :]
    return _collapse_space(text)


def _collapse_space(text: str) -> str:
    """Runs of whitespace as single spaces, none at either end: ``" ".join(text.split())``."""
    # Every character str.split() splits on but " " is unprintable (a property test holds it to
    # that), so printable text with no double or outer space is already collapsed: the common
    # case, checked in C without building a list of words.
    if text.isprintable() and "  " not in text and text[:1] != " " and text[-1:] != " ":
        return text
    return " ".join(text.split())


def canonical(text: str) -> str:
    """Return the canonical form of ``text`` that exact duplicates share.

    NFKC, case folded (URL paths and query values excepted), zero-width characters removed,
    bullet markers stripped at line starts, whitespace collapsed to single spaces, URLs
    canonicalised (:func:`canonical_url`). Idempotent and total on ``str``.

    >>> canonical("  - Deploy   DONE, see https://Example.com/run/?utm_source=x ")
    'deploy done, see https://example.com/run'
    """
    if text.isascii() and "://" not in text:
        # _canonical_once's path for such text, without its calls: nothing for NFKC to do, and
        # lower() is casefold() on ASCII. One pass is a fixed point for ASCII (property-tested).
        return _strip_bullets_and_space(text.lower())
    result = _canonical_once(text)
    if result.isascii():
        # One pass is a fixed point for ASCII text (the property tests hold it to that).
        return result
    # Case folding and NFKC can each undo the other's fixed point on rare characters, and a URL
    # rewrite can expose a new bullet: iterate to the fixed point (each pass only removes or
    # normalises characters, so it settles at once in practice).
    for _ in range(4):
        again = _canonical_once(result)
        if again == result:
            break
        result = again
    return result


def _canonical_once(text: str) -> str:
    text = _nfkc(text)
    if "://" in text:
        pieces = _split_urls(text)
        text = "".join(canonical_url(piece) if is_url else _fold(piece) for is_url, piece in pieces)
    else:
        text = _fold(text)
    return _strip_bullets_and_space(text)


def line_key(line: str) -> str:
    """Return the key under which two summary lines count as the same line at read time.

    Trimmed, NFKC, case folded, bullet markers stripped, whitespace collapsed; URLs are not
    rewritten (summary lines are compared, not hashed for storage).

    >>> line_key("  • Standup   moved to 10:30 ") == line_key("- standup moved to 10:30")
    True
    """
    result = _strip_bullets_and_space(_fold(_nfkc(line)))
    for _ in range(4):
        if result.isascii():
            break
        again = _strip_bullets_and_space(_fold(_nfkc(result)))
        if again == result:
            break
        result = again
    return result


# --- volatile tokens ---------------------------------------------------------------------------

_MONTH = (
    r"(?:jan(?:uary)?|feb(?:ruary)?|mar(?:ch)?|apr(?:il)?|may|june?|july?|aug(?:ust)?"
    r"|sep(?:t(?:ember)?)?|oct(?:ober)?|nov(?:ember)?|dec(?:ember)?)"
)
_UNIT = (
    r"(?:ms|msecs?|milliseconds?|s|secs?|seconds?|m|mins?|minutes?|h|hrs?|hours?"
    r"|d|days?|w|wks?|weeks?)"
)
_NUMBER = r"\d+(?:[.,]\d+)*"
# Boundaries: a volatile token must stand free. ">" and "<" count as word characters here so a
# placeholder next to a number does not change what matches on a second pass (idempotence).
_BEFORE = r"(?<![\w>])(?<![\w>][-+−/.])"
_AFTER = r"(?![\w<])"

# The alternatives, most specific first (a date before a range, a time before a number).
_FORMS = "|".join(
    (
        rf"(?P<uuid>[0-9a-f]{{8}}-[0-9a-f]{{4}}-[0-9a-f]{{4}}-[0-9a-f]{{4}}-[0-9a-f]{{12}}{_AFTER})",
        rf"(?P<date>(?:\d{{4}}-\d{{1,2}}-\d{{1,2}}"
        r"(?:[t ]\d{1,2}:\d{2}(?::\d{2})?(?:\.\d+)?(?:z|[+-]\d{2}:?\d{2})?)?"
        r"|\d{1,2}[/.]\d{1,2}[/.]\d{2,4}|\d{4}/\d{1,2}/\d{1,2}"
        rf"|{_MONTH}\.?\s\d{{1,2}}(?:st|nd|rd|th)?(?:,?\s\d{{4}})?"
        rf"|\d{{1,2}}(?:st|nd|rd|th)?\s{_MONTH}(?:,?\s\d{{4}})?){_AFTER})",
        rf"(?P<time>(?:\d{{1,2}}:\d{{2}}(?::\d{{2}})?(?:\.\d+)?(?:\s?[ap]\.?m\.?)?"
        rf"|\d{{1,2}}\s?[ap]\.?m\.?){_AFTER})",
        rf"(?P<hex>(?=[0-9a-f]*[a-f])(?=[0-9a-f]*\d)[0-9a-f]{{7,64}}{_AFTER})",
        rf"(?P<amount>{_NUMBER}\s?(?:usd|eur|gbp|jpy|chf|cad|aud|cny|inr|btc|eth|sol|usdt|usdc"
        rf"|sats?|dollars?|euros?){_AFTER})",
        rf"(?P<pct>[+\-−]?{_NUMBER}\s?%)",
        rf"(?P<dur>(?:{_NUMBER}\s?{_UNIT})(?:\s?{_NUMBER}\s?{_UNIT})*{_AFTER})",
        rf"(?P<range>{_NUMBER}\s?[-–]\s?{_NUMBER}{_AFTER})",
        rf"(?P<num>[+\-−]?{_NUMBER}(?:st|nd|rd|th)?{_AFTER})",
    )
)
_VOLATILE_RE: Final = re.compile(
    rf"(?P<counter>(?<![\w>&])#\d+{_AFTER})"
    rf"|(?P<amount_>[$€£¥₹₿]\s?{_NUMBER}(?:\s?[kmb])?{_AFTER})"
    rf"|{_BEFORE}(?:{_FORMS})",
    re.IGNORECASE,
)
# The same pattern for ASCII text without capitals (all canonical ASCII text), at about half the
# cost: case-sensitive (every letter of the pattern is lower case) and with ASCII classes (\d and
# \w agree with the Unicode ones on ASCII characters; Unicode \s also takes \x1c-\x1f, so it is
# spelled out). On such text it matches exactly what _VOLATILE_RE does (property-tested).
_VOLATILE_LOWER_RE: Final = re.compile(
    _VOLATILE_RE.pattern.replace(r"\s", r"[\s\x1c-\x1f]"), re.ASCII
)
# Where a volatile token can start: a digit or a sign. Letter-led forms (a hash or UUID opening
# with a-f, "march 15") are found by backing up from their first digit, see _volatile_spans.
_START_RE: Final = re.compile(r"[\d#$€£¥₹₿+\-−]")
_START_ASCII_RE: Final = re.compile(r"[0-9#$+\-]")  # the same on ASCII text, ~3x faster
_HEX_RUN: Final = frozenset("0123456789abcdefABCDEF-")
_MONTH_WORDS: Final = frozenset(
    [
        "jan",
        "january",
        "feb",
        "february",
        "mar",
        "march",
        "apr",
        "april",
        "may",
        "jun",
        "june",
        "jul",
        "july",
        "aug",
        "august",
        "sep",
        "sept",
        "september",
        "oct",
        "october",
        "nov",
        "november",
        "dec",
        "december",
    ]
)


def _volatile_spans(text: str, lower: bool = False) -> list[tuple[int, int, str]]:
    """Spans of the digit-bearing volatile forms, left to right, not overlapping.

    Equivalent to ``_VOLATILE_RE.finditer`` restricted to matches that contain a digit, but only
    tries the regex where a match can start: scanning for a start character is done in C, while
    trying an eleven-way alternation at every position costs ~0.1 us per character. ``lower``:
    ``text`` is ASCII without capitals, so the case-sensitive pattern gives the same spans.
    """
    spans: list[tuple[int, int, str]] = []
    position = 0
    search = (_START_ASCII_RE if lower else _START_RE).search
    match_at = (_VOLATILE_LOWER_RE if lower else _VOLATILE_RE).match
    while (found := search(text, position)) is not None:
        index = found.start()
        match = None
        if index > position and text[index - 1] in _HEX_RUN:
            start = index - 1
            while start > position and text[start - 1] in _HEX_RUN:
                start -= 1
            match = match_at(text, start)
        elif (
            index >= position + 2
            and text[index - 1] == " "
            and (text[index - 2].isalpha() or text[index - 2] == ".")  # a month word's end
        ):
            start = max(position, text.rfind(" ", position, index - 1) + 1)
            if text[start : index - 1].rstrip(".").lower() in _MONTH_WORDS:
                match = match_at(text, start)
                if match is not None and match.end() <= index:
                    match = None
        if match is None:
            match = match_at(text, index)
        if match is None:
            position = index + 1
            continue
        start, position = match.span()
        spans.append((start, position, match.lastgroup or ""))
    return spans


# Weekday names carry no digit, so they get their own pass, run only when one occurs.
_DAY_RE: Final = re.compile(r"(?i)\b(?:mon|tues|wednes|thurs|fri|satur|sun)days?\b")
_DAY_LOWER_RE: Final = re.compile(r"\b(?:mon|tues|wednes|thurs|fri|satur|sun)days?\b")
# Each span's kind (a group name of _VOLATILE_RE, "day" or "hex") to its placeholder.
_PLACEHOLDERS: Final = {
    name: f"<{name.rstrip('_')}>" for name in (*_VOLATILE_RE.groupindex, "day", "hex")
}
_WEEKDAYS: Final = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")
# A hash named as one ("commit bcffbfe", "sha: deadbeef") is a hash even with no digit in it.
_NAMED_HEX_RE: Final = re.compile(
    r"(?i)\b(?:commit|sha|sha1|sha256|hash|rev|revision|digest)[\s:=#@]+"
    r"(?P<hex>[0-9a-f]{7,64})(?![\w<])"
)
# The same without IGNORECASE and the leading \b, for lower-case ASCII text: a pattern that opens
# with plain literals lets the regex engine skip ahead in C (the \b is checked afterwards).
_NAMED_HEX_LOWER_RE: Final = re.compile(
    r"(?:commit|sha|sha1|sha256|hash|rev|revision|digest)[\s:=#@]+"
    r"(?P<hex>[0-9a-f]{7,64})(?![\w<])"
)
_HAS_DIGIT: Final = re.compile(r"\d")
# ASCII bytes: hex digits (either case) to "x", everything else to a space.
_HEX_MARKS: Final = bytes(
    ord("x") if chr(i) in "0123456789abcdefABCDEF" else ord(" ") for i in range(256)
)


def _named_hex_spans(piece: str, lower: bool = False) -> list[tuple[int, int, str]]:
    if not (lower or piece.isascii()):
        return [(m.start("hex"), m.end("hex"), "hex") for m in _NAMED_HEX_RE.finditer(piece)]
    lowered = piece if lower else piece.lower()
    return [
        (m.start("hex"), m.end("hex"), "hex")
        for m in _NAMED_HEX_LOWER_RE.finditer(lowered)
        if m.start() == 0 or not (lowered[m.start() - 1].isalnum() or lowered[m.start() - 1] == "_")
    ]


def _piece_spans(
    piece: str, has_digit: bool, has_day: bool, has_named_hex: bool, lower: bool
) -> list[tuple[int, int, str]]:
    """The volatile spans of a piece of text outside URLs, in text order (may overlap: the
    caller skips a span that starts inside an earlier one)."""
    spans = _volatile_spans(piece, lower) if has_digit else []
    if has_day:
        day = _DAY_LOWER_RE if lower else _DAY_RE
        spans.extend((m.start(), m.end(), "day") for m in day.finditer(piece))
    if has_named_hex:
        spans.extend(_named_hex_spans(piece, lower))
    if has_day or has_named_hex:
        # Merge the passes in text order so values line up with their placeholders.
        spans.sort()
    return spans


def mask_volatile_values(text: str) -> tuple[str, tuple[str, ...]]:
    """Return ``(masked, values)``: :func:`mask_volatile` and the original tokens, in order.

    >>> mask_volatile_values("deploy #4812 ok at 10:02")
    ('deploy <counter> ok at <time>', ('#4812', '10:02'))
    """
    # Cheap substring tests first: most chat lines have no digit and no weekday.
    lowered = text.lower()
    ascii_text = text.isascii()
    has_day = "day" in lowered
    if has_day and ascii_text:
        # "today", "days": only a weekday name can match _DAY_RE (ASCII: no case-folding
        # surprises such as U+017F matching "s" under IGNORECASE).
        has_day = any(map(lowered.__contains__, _WEEKDAYS))
    has_named_hex = (
        "commit" in lowered
        or "sha" in lowered
        or "hash" in lowered
        or "rev" in lowered
        or "digest" in lowered
    )
    if ascii_text:
        raw = text.encode("ascii")
        # Deleting the digits from the bytes, in C, beats a regex scan for \d.
        has_digit = len(raw.translate(None, b"0123456789")) != len(text)
        if has_named_hex:  # "review", "share": a named hash needs a run of 7 hex characters
            has_named_hex = b"xxxxxxx" in raw.translate(_HEX_MARKS)
    else:
        has_digit = _HAS_DIGIT.search(text) is not None
    if not (has_digit or has_day or has_named_hex):
        return text, ()
    # Canonical ASCII text has no capitals: the case-sensitive patterns match the same there.
    lower = ascii_text and lowered == text
    pieces = _split_urls(text) if "://" in text else [(False, text)]
    values: list[str] = []
    out: list[str] = []
    for is_url, piece in pieces:
        if is_url:
            out.append(piece)
            continue
        position = 0
        for start, end, kind in _piece_spans(piece, has_digit, has_day, has_named_hex, lower):
            if start < position:  # already inside a token taken by an earlier form
                continue
            out.append(piece[position:start])
            out.append(_PLACEHOLDERS[kind])
            values.append(piece[start:end])
            position = end
        out.append(piece[position:])
    if not values:  # e.g. "review" named no hash: nothing was masked
        return text, ()
    return "".join(out), tuple(values)


def mask_volatile(text: str) -> str:
    """Replace volatile tokens (times, dates, counters, hashes, amounts...) by typed placeholders.

    The table in the module docstring lists the rules and why each token varies. URLs and numbers
    glued to words are left alone. Idempotent; meant for :func:`canonical` text but total on any
    ``str``.

    >>> mask_volatile("deploy #4812 of api succeeded at 10:02 (sha 3f2a9c1)")
    'deploy <counter> of api succeeded at <time> (sha <hex>)'
    """
    return mask_volatile_values(text)[0]


# --- attachments -------------------------------------------------------------------------------

_TITLE_KEYS: Final = ("title", "name", "filename")
_DESCRIPTION_KEYS: Final = ("description", "text", "summary")
_URL_KEYS: Final = ("url", "href", "link")


def attachment_text(attachments: Sequence[Mapping[str, object]] | None) -> str:
    """Reduce attachments and embeds to their title, description and main URL, one per line.

    Each item is a mapping; the first present of ``title``/``name``/``filename``,
    ``description``/``text``/``summary`` and ``url``/``href``/``link`` is kept, everything else
    (thumbnails, colours, footers, sizes, proxy URLs) is presentation and dropped. Raises
    :class:`~ctxwarden.errors.InputError` naming the item when an item is not a mapping or a kept
    field is not a string.

    >>> attachment_text([{"title": "Q3 plan", "url": "https://x.io/a", "color": 5}])
    'Q3 plan\\nhttps://x.io/a'
    """
    if not attachments:
        return ""
    if isinstance(attachments, str | bytes) or not isinstance(attachments, Sequence):
        raise InputError(
            "must be a list of objects with title/description/url", field="attachments"
        )
    lines: list[str] = []
    for index, item in enumerate(attachments):
        if not isinstance(item, Mapping):
            raise InputError(
                f"must be an object with title/description/url, got {type(item).__name__}",
                field=f"attachments[{index}]",
            )
        for keys in (_TITLE_KEYS, _DESCRIPTION_KEYS, _URL_KEYS):
            for key in keys:
                value = item.get(key)
                if value is None:
                    continue
                if not isinstance(value, str):
                    raise InputError(
                        f"must be a string, got {type(value).__name__}",
                        field=f"attachments[{index}].{key}",
                    )
                if value.strip():
                    lines.append(value.strip())
                    break
    return "\n".join(lines)
