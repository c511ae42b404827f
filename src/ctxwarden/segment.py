"""Search terms for scripts written without spaces between words: overlapping character bigrams.

Chinese, Japanese, Korean, Thai, Lao, Khmer and Myanmar text runs its words together. Both
lexical indexes split text at spaces and punctuation (SQLite FTS5's ``unicode61`` tokenizer,
PostgreSQL's default parser), so a run such as ``来週の会議は木曜日です`` became one term, and a
query sharing a word with it (``会議``) matched only an identical run. This module gives such
runs the terms of Lucene's ``CJKAnalyzer`` (Elasticsearch's ``cjk_bigram`` filter): every pair of
adjacent characters (``来週 週の の会 会議 議は ...``); a run of one character is its own term.
A two-character word is then a term of every text holding it, and a longer word is the phrase
of its bigrams, with no dictionary of any language.

Why bigrams and not FTS5's ``trigram`` tokenizer: a trigram index matches no query shorter than
three characters, and most Chinese and Japanese words are two (``会議``, ``北京``, ``猫``
aside); it also indexes every script by trigrams, so English would lose Porter stemming, and
the index grows about threefold. Bigrams go only where runs are, beside the existing terms.

What both sides do with a run (:func:`bigram_text` when indexing, :func:`split_query` for a
query): NFKC (half-width katakana and compatibility ideographs fold to their usual forms),
combining marks dropped (Thai, Lao, Khmer and Myanmar vowel and tone marks: ``unicode61``
splits words at them, so a bigram holding one would be cut in two), case folded, then the
bigrams. A letter run in another script touching a run (``v2の``, ``APIキー``) is kept as its
own term too: the index saw ``apiキー`` as one word, which a query for ``api`` never matched.
Pure: no I/O.
"""

from __future__ import annotations

import functools
import re
import unicodedata
from typing import Final

__all__ = ["SCRIPT_BLOCKS", "bigram_text", "bigrams", "has_run", "split_runs"]

#: The Unicode blocks of the scripts written without spaces: their letters make runs, their
#: combining marks continue one. (Hangul puts spaces between phrases, but particles join the
#: words: ``회의는`` / ``회의가``; Lucene's CJK analyzer bigrams it too.)
SCRIPT_BLOCKS: Final = (
    (0x0E00, 0x0E7F),  # Thai
    (0x0E80, 0x0EFF),  # Lao
    (0x1000, 0x109F),  # Myanmar
    (0x1100, 0x11FF),  # Hangul Jamo
    (0x1780, 0x17FF),  # Khmer
    (0x3000, 0x303F),  # CJK symbols (only 々 〆 〇 and the like are letters)
    (0x3040, 0x309F),  # Hiragana
    (0x30A0, 0x30FF),  # Katakana
    (0x3130, 0x318F),  # Hangul compatibility jamo
    (0x31F0, 0x31FF),  # Katakana phonetic extensions
    (0x3400, 0x4DBF),  # CJK unified ideographs extension A
    (0x4E00, 0x9FFF),  # CJK unified ideographs
    (0xA960, 0xA97F),  # Hangul Jamo extended-A
    (0xAC00, 0xD7AF),  # Hangul syllables
    (0xD7B0, 0xD7FF),  # Hangul Jamo extended-B
    (0xF900, 0xFAFF),  # CJK compatibility ideographs
    (0xFF66, 0xFF9F),  # half-width katakana
    (0x20000, 0x323AF),  # CJK unified ideographs extensions B-H, compatibility supplement
)
#: Blocks every code point of which is a letter (classified without looking at each).
_ALL_LETTERS: Final = frozenset(
    {(0x3400, 0x4DBF), (0x4E00, 0x9FFF), (0xAC00, 0xD7AF), (0x20000, 0x323AF)}
)


def _ranges(points: list[int]) -> str:
    """A regex character class body for sorted code points (consecutive ones as ranges)."""
    parts = []
    start = 0
    for i, point in enumerate(points):
        if i + 1 < len(points) and points[i + 1] == point + 1:
            continue
        first = points[start]
        parts.append(re.escape(chr(first)) + ("-" + re.escape(chr(point)) if point > first else ""))
        start = i + 1
    return "".join(parts)


@functools.cache
def _patterns() -> tuple[re.Pattern[str], re.Pattern[str], re.Pattern[str]]:
    """(a run, a combining mark of these scripts, a run or a word of other letters), built on
    first use (~1 ms: the small blocks classified by :mod:`unicodedata`)."""
    letters: list[int] = []
    marks: list[int] = []
    whole = ""
    for low, high in SCRIPT_BLOCKS:
        if (low, high) in _ALL_LETTERS:
            whole += re.escape(chr(low)) + "-" + re.escape(chr(high))
            continue
        for point in range(low, high + 1):
            category = unicodedata.category(chr(point))
            if category[0] == "L" or category == "Nl":
                letters.append(point)
            elif category[0] == "M":
                marks.append(point)
    letter, mark = _ranges(letters) + whole, _ranges(marks)
    run = f"[{letter}][{letter}{mark}]*"
    return (
        re.compile(run),
        re.compile(f"[{mark}]+"),
        # Words of other scripts: word characters that are not letters or marks of a run.
        re.compile(f"(?P<run>{run})|[^\\W{letter}{mark}]+"),
    )


def has_run(text: str) -> bool:
    """Whether ``text`` holds a letter of a script written without spaces.

    >>> has_run("deploy on Tuesday"), has_run("会議は木曜日"), has_run("ประชุม")
    (False, True, True)
    """
    return not text.isascii() and _patterns()[0].search(text) is not None


def bigrams(run: str) -> list[str]:
    """The terms of one run: NFKC, marks dropped, case folded, then each pair of adjacent
    characters (a run of one character is its own term).

    >>> bigrams("会議室")
    ['会議', '議室']
    >>> bigrams("ｶﾞｲﾄﾞ")
    ['ガイ', 'イド']
    >>> bigrams("猫")
    ['猫']
    """
    letters = _patterns()[1].sub("", unicodedata.normalize("NFKC", run)).casefold()
    if len(letters) < 2:
        return [letters] if letters else []
    return [letters[i : i + 2] for i in range(len(letters) - 1)]


def _pieces(text: str) -> list[tuple[bool, str, int, int]]:
    return [
        (m.group("run") is not None, m.group(), m.start(), m.end())
        for m in _patterns()[2].finditer(text)
    ]


#: Characters a word of other scripts holds inside (``config.yaml``, ``v2.3``, ``a/b``).
_INNER = frozenset("._-/:@#+'")


def _chunk(text: str, start: int, end: int) -> str:
    """The word around ``text[start:end]`` (letters, digits and :data:`_INNER`, up to a run):
    the whole ``config.yaml`` of ``、config.yamlを``, so a query's phrase of its words
    matches."""
    run = _patterns()[0]

    def inner(at: int) -> bool:
        char = text[at]
        return (char.isalnum() or char in _INNER) and not run.match(text, at)

    while start > 0 and inner(start - 1):
        start -= 1
    while end < len(text) and inner(end):
        end += 1
    return text[start:end]


def bigram_text(text: str) -> str | None:
    """What the lexical index adds for ``text``: the bigrams of its runs and the other-script
    words touching a run, space-separated; None when it has no run (most text, found
    without a regex when it is ASCII).

    >>> bigram_text("来週の会議は木曜日です")
    '来週 週の の会 会議 議は は木 木曜 曜日 日で です'
    >>> bigram_text("APIキーを更新 (see docs)")
    'キー ーを を更 更新 api'
    >>> bigram_text("、config.yamlも直す")
    'も直 直す config.yaml'
    >>> bigram_text("deploy on Tuesday") is None
    True
    """
    if not has_run(text):
        return None
    pieces = _pieces(text)
    terms: list[str] = []
    touching: list[str] = []
    for i, (is_run, piece, start, end) in enumerate(pieces):
        if is_run:
            terms.extend(bigrams(piece))
        elif (i > 0 and pieces[i - 1][0] and pieces[i - 1][3] == start) or (
            i + 1 < len(pieces) and pieces[i + 1][0] and pieces[i + 1][2] == end
        ):
            touching.append(_chunk(text, start, end).casefold())
    if not terms:
        return None
    return " ".join(terms + touching)


def split_runs(text: str) -> list[tuple[str, bool]]:
    """``text`` cut into runs and the text between them, in order: ``(piece, is_run)``.

    >>> split_runs("deploy は木曜 ok")
    [('deploy ', False), ('は木曜', True), (' ok', False)]
    """
    out: list[tuple[str, bool]] = []
    at = 0
    for match in _patterns()[0].finditer(text):
        if match.start() > at:
            out.append((text[at : match.start()], False))
        out.append((match.group(), True))
        at = match.end()
    if at < len(text):
        out.append((text[at:], False))
    return out
