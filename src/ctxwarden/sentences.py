"""Sentences and the facts in them, for any script: pure functions, no word lists.

:func:`split_sentences` cuts text at sentence ends: after ``。！？`` (and ``؟ ।``) always (CJK
writes no space between sentences), after ``. ! ?`` when a space and a capital, digit or
non-Latin letter follow. :func:`fact_values` finds what makes a sentence a fact, by signals that
do not depend on a language: digits (any script's, full-width included) and the numbers, dates
and times they make, CJK numerals with a counter (``三时``) and weekday forms (``木曜``,
``星期四``), question marks in any script, quoted values (``"x"``, ``“x”``, ``「x」``, ``«x»``,
`` `x` ``), ``@mentions``, ``#channels``, URLs, versions, and names by capitalisation where the
script has case (a capitalised word that does not start the sentence, or an acronym). A script
without case (CJK, Arabic, Hebrew, Thai...) cannot show a name that way, so there a sentence of
six letters or more (not counting hiragana, which writes Japanese grammar, not names) is a fact
as a whole: kept rather than guessed at.

>>> split_sentences("会議は木曜10時に変更。担当は佐藤さん！資料は？")
['会議は木曜10時に変更。', '担当は佐藤さん！', '資料は？']
>>> fact_values("The demo is now on Thursday 10:00, not Wednesday.")
('Thursday', '10:00', 'Wednesday')
>>> fact_values("ok sounds good")
()
"""

from __future__ import annotations

import re
from collections.abc import Iterable

__all__ = ["cjk_bigrams", "fact_values", "is_fact", "split_sentences", "words"]

_CJK_END = "。！？؟।"
_CLOSERS = "」』）)]】〕\"'”’»"
_LATIN_END = re.compile(r"(?<=[.!?])\s+(?=[\"'(\[“‘«]?[^\W_a-z])")
_CJK = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uac00-\ud7af"
_CJK_CHAR = re.compile(f"[{_CJK}]")
_WORD = re.compile(r"[^\W_]+(?:['’.-][^\W_]+)*")
_CJK_NUMERAL = "〇零一二两兩三四五六七八九十百千万萬"
_SIGNALS = re.compile(
    "|".join(
        (
            r"https?://\S+",
            r"(?<![\w@#])[@#][^\W\d_][\w.-]*",
            r"\d+(?:[.,:：/\-]\d+)*(?:\s?%|[時时点點分日月号號年人个個元块塊]|[^\W\d_]{1,3}(?![^\W\d_]))?",
            f"[{_CJK_NUMERAL}]+[时時点點分日月号號年人个個元块塊周週]",
            r"[月火水木金土日]曜",
            f"(?:星期|礼拜|禮拜|周|週)[一二三四五六日天{_CJK_NUMERAL}]",
            r"\"[^\"\n]{1,80}\"|“[^”\n]{1,80}”|「[^」\n]{1,80}」|『[^』\n]{1,80}』",
            r"«[^»\n]{1,80}»|`[^`\n]{1,80}`|(?<!\w)'[^'\n]{1,60}'(?!\w)",
        )
    )
)
_NAME = re.compile(r"(?<![\w'’])[^\W\d_][\w'’.-]*")
_QUESTION = re.compile(r"[?？؟]")


def split_sentences(text: str) -> list[str]:
    """Sentences of ``text`` in order, bullets and blank lines dropped (see the module doc)."""
    out: list[str] = []
    for raw in text.splitlines():
        line = raw.strip().lstrip("-*•>").strip()
        if not line:
            continue
        start = 0
        index = 0
        pieces: list[str] = []
        while index < len(line):
            if line[index] in _CJK_END:
                end = index + 1
                while end < len(line) and line[end] in _CJK_END + _CLOSERS:
                    end += 1
                pieces.append(line[start:end])
                start = index = end
                continue
            index += 1
        pieces.append(line[start:])
        for piece in pieces:
            out.extend(s.strip() for s in _LATIN_END.split(piece) if s.strip())
    return out


def words(text: str) -> list[str]:
    """Lower-cased words; a CJK run counts one word per character (no spaces to cut at)."""
    out: list[str] = []
    for word in _WORD.findall(text.lower()):
        if _CJK_CHAR.search(word):
            out.extend(ch for ch in word if not ch.isspace())
        else:
            out.append(word)
    return out


def cjk_bigrams(text: str) -> list[str]:
    """Character pairs of each CJK run (single characters for runs of one): CJK's terms."""
    out: list[str] = []
    for run in re.findall(f"[{_CJK}]+", text):
        out.extend([run] if len(run) == 1 else [run[i : i + 2] for i in range(len(run) - 1)])
    return out


def _names(text: str) -> Iterable[str]:
    """Capitalised words that do not open the sentence, and acronyms anywhere."""
    first = True
    for match in _NAME.finditer(text):
        word = match.group().rstrip(".-'’")
        head = word[:1]
        cased = head.isupper() and head.lower() != head
        acronym = sum(c.isupper() for c in word) >= 2 and not word.isdigit()
        opens = first or text[: match.start()].rstrip().endswith((":", ".", "!", "?", '"'))
        first = False
        if word in ("I", "I'm", "I'll", "I've", "I'd"):
            continue
        if acronym or (cased and not opens):
            yield word


def _caseless(text: str) -> bool:
    """Six or more letters besides hiragana, most of them of a script without case."""
    letters = [c for c in text if c.isalpha() and not "\u3040" <= c <= "\u309f"]
    caseless = sum(c.lower() == c.upper() for c in letters)
    return len(letters) >= 6 and caseless * 2 > len(letters)


def fact_values(text: str) -> tuple[str, ...]:
    """The values that make ``text`` a fact (numbers, times, names, quotes, ids), in order;
    a question with none of them gives the question itself."""
    found = [m.group().strip() for m in _SIGNALS.finditer(text)]
    found.extend(_names(_SIGNALS.sub(" ", text)))
    values = tuple(dict.fromkeys(v for v in found if v))
    if not values and _caseless(text):
        return (text.strip(),)
    if not values and _QUESTION.search(text):
        return (text.strip(),)
    return tuple(sorted(values, key=lambda v: (text.find(v), v)))


def is_fact(text: str) -> bool:
    """Whether ``text`` states something a question could ask for (see :func:`fact_values`).

    >>> is_fact("明天下午3点在会议室A开会。"), is_fact("好的")
    (True, False)
    """
    return bool(fact_values(text))
