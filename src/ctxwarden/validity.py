"""Which earlier message a new one changes: free-text supersession, no LLM (issue 19).

A message changes an earlier statement when both speak of the same subject and either the new
one carries a *change cue* ("moved to", "now X, not Y", "scratch that", "instead", "no longer",
"postponed", ``に変更``, ``ではなく``, ``改到``, ``不是...而是``...) or the same author gives
the same subject a different value (a number, time, date, name: :func:`~ctxwarden.sentences.
fact_values`). The subject is what the two share after their values and cues are taken out:
content words of three letters or more for scripts with spaces, character pairs of kanji,
katakana, hanzi or hangul for CJK (:func:`~ctxwarden.sentences.cjk_bigrams`), and a term
that most of the window's messages hold is no subject at all. Shared words are not enough: the
subject they make is half the shorter message's (a third in CJK), a cue the earlier message
holds too is shared phrasing (then a value must be replaced, and another author's first-person
statement is about someone else), and a message without an author (a bot's feed) changes
something only by replacing a value.

Pure: :func:`analyse` reads one text, :func:`superseded` picks, among the earlier statements of
the same place (the caller reads a bounded window of the same session and channel), the one the
new statement supersedes, or None. Questions neither change nor are changed.

>>> old = analyse("The customer demo is on Wednesday 15:00.", author="rosa")
>>> new = analyse("The customer demo is now Thursday 10:00, not Wednesday.", author="milo")
>>> superseded(new, [old]) is old
True
>>> superseded(analyse("lunch was great today", author="milo"), [old]) is None
True
>>> old = analyse("製品デモは水曜15時です。", author="yui")
>>> superseded(analyse("製品デモは木曜10時に変更になりました。", author="haruto"), [old]) is old
True
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from collections.abc import Set as AbstractSet
from typing import NamedTuple

from ctxwarden.sentences import cjk_bigrams

__all__ = ["Statement", "analyse", "asks_history", "common_terms", "may_change", "superseded"]

# Change cues, by language: generic phrasing of "this replaces what was said", not taken from
# any data set; a cue alone links nothing, the subject must be shared as well. Words of scripts
# with spaces are looked up (lower-cased) as words, word pairs or stems; CJK cues by pattern.
_CUE_WORDS = frozenset(
    """now instead actually anymore moved moves moving pushed bumped shifted delayed updated update
    correction corrected ahora cambiado cambiada pospuesto pospuesta movido movida maintenant
    plutôt plutot reporté reportée déplacé déplacée changé changée jetzt stattdessen statt
    verschoben geändert geaendert agora adiado adiada invece spostato spostata rinviato""".split()
)
_CUE_STEMS = ("postpon", "reschedul", "replac", "revis", "chang", "switch", "cancel")
_CUE_PAIRS = frozenset(
    {
        ("no", "longer"), ("scratch", "that"), ("never", "mind"), ("rather", "than"),
        ("from", "now"), ("i", "meant"), ("instead", "of"), ("en", "lugar"), ("en", "vez"),
        ("ya", "no"), ("au", "lieu"), ("nicht", "mehr"), ("em", "vez"), ("move", "it"),
    }
)  # fmt: skip
_RETRACT_PAIRS = frozenset({("scratch", "that"), ("never", "mind"), ("i", "meant")})
_PAIR_HEADS = frozenset(first for first, _ in _CUE_PAIRS)
_PAIR_TEXTS = tuple(sorted(f"{first} {second}" for first, second in _CUE_PAIRS))
_PAIR = re.compile(
    r"\b("
    + "|".join(sorted(_PAIR_HEADS))
    + r")\s+("
    + "|".join(sorted({b for _, b in _CUE_PAIRS}))
    + r")\b"
)
_DIGIT = re.compile(r"\d")
_TOKEN = re.compile(r"[\w.:/-]+")
_LETTERS = re.compile(r"\b[^\W\d_]{3,}\b")  # a word of letters only ("word14" is a value)
# The same on lower-case ASCII text, where a letter is a-z: ~30 % cheaper than the class above.
_ASCII_LETTERS = re.compile(r"\b[a-z]{3,}\b")
# A capitalised word after a word (not opening a sentence: the character before the space
# is not a sentence end).
_NAME = re.compile(r"(\S)\s+([A-ZÀ-ÞĀ-Ž][^\W\d_]*)")
_SENTENCE_END = frozenset('.!?:"')
_NOT_AFTER_COMMA = re.compile(r"[,;—]\s*not\b|--\s*not\b", re.IGNORECASE)
_CJK_CUES = re.compile(
    # Japanese
    r"変更|変わ|変え|ではなく|じゃなく|やっぱり|代わりに|延期|移動|訂正|取り消|中止"
    r"|今は|改め|差し替え|前倒し|繰り上げ|繰り下げ|ずれ"
    # Chinese (simplified and traditional)
    r"|改为|改為|改成|改到|改在|改了|而是|不是|推迟|推遲|延期|延后|延後|提前|换成|換成"
    r"|换到|換到|取消|其实|其實|更正|不再|现在|現在|挪到|变成|變成|调整|調整|改期"
    # Korean
    r"|변경|대신|연기|이제|아니라|취소"
)
_CJK_RETRACT = re.compile(r"やっぱり|訂正|算了|更正|我说错了|我說錯了")
# A query about what was in force before: superseded values are shown (dated) for it.
_HISTORY = re.compile(
    r"\b(?:before|previous(?:ly)?|earlier|originally|original|initially|at first|used to"
    r"|history|old|former(?:ly)?|prior|changed|changes|was it|were they"
    r"|antes|anterior|avant|auparavant|pr[ée]c[ée]dent|vorher|fr[üu]her|urspr[üu]nglich)\b"
    r"|以前|前は|元々|もともと|最初|履歴|変更前|変わる前|之前|原来|原來|原先|历史|歷史|改之前|改前",
    re.IGNORECASE,
)
_QUESTION_MARKS = frozenset("?？؟")
_CJK_RUN = re.compile("[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uac00-\ud7af]")
_HIRAGANA = re.compile("[\u3040-\u309f]")
_NUMERAL = "〇零一二两兩三四五六七八九十百千万萬"
# Values in CJK text (as :func:`~ctxwarden.sentences.fact_values` finds them): numbers with
# their counters, CJK numerals with a counter, weekdays, quoted names.
_CJK_VALUES = re.compile(
    r"\d+(?:[.,:：/\-]\d+)*[時时点點分日月号號年人个個元块塊]?"
    f"|[{_NUMERAL}]+[时時点點分日月号號年人个個元块塊周週]"
    r"|[月火水木金土日]曜"
    f"|(?:星期|礼拜|禮拜|周|週)[一二三四五六日天{_NUMERAL}]"
    r"|「[^」\n]{1,40}」|『[^』\n]{1,40}』|“[^”\n]{1,40}”"
)
# Function words of the languages the cues cover, never a subject (three letters or more: shorter
# words are not terms at all). Grammar, not vocabulary of any data set.
_FUNCTION_WORDS = frozenset(
    """the and for are was were is be been being has have had will would shall should can could
    may might must not but our ours your yours their theirs they them this that these those with
    from into onto about over under than then there here what when where which who whom whose why
    how all any some its it's you she her his him also just very too yes yeah okay let let's lets
    going goes gonna get got one still really only more most much per via before after since
    until during while
    del las los una uno por para con que como pero les des une est sont pour avec dans sur pas
    der die das und ist sind mit für von auf nicht ein eine""".split()
)

_NOT_TERMS = _FUNCTION_WORDS | _CUE_WORDS
# First person singular pronouns of the same languages (grammar): a statement holding one
# speaks of its author ("I grew up in X"), so another author's "I grew up in Y" changes nothing.
_FIRST_PERSON = re.compile(
    r"\b(?:i|i'm|i've|i'd|i'll|me|my|mine|myself|yo|mí|je|moi|ich|mich|mir"
    r"|mein|meine|meinen|meinem|eu|meu|minha|io|mio|mia)\b"
)
_FIRST_PERSON_CJK = re.compile(r"私|僕|俺|わたし|あたし|我(?![们們])|저는|제가|나는|내가")

# What an ASCII text must hold (as a substring) to carry a cue: the cue words, stems and pairs,
# and "not" (", not Y"); a string holding another of the set is left out (the shorter one
# finds it). For :func:`may_change`.
_CUE_TEXTS = {w for w in (*_CUE_WORDS, *_CUE_STEMS, *_PAIR_TEXTS, "not") if w.isascii()}
_CUE_SUBSTRINGS = tuple(
    sorted(w for w in _CUE_TEXTS if not any(o != w and o in w for o in _CUE_TEXTS))
)


class Statement(NamedTuple):
    """One message as the detector sees it: its subject terms, its values and what it says of
    change. ``ref`` is the caller's handle (a rowid, a memory), returned as given."""

    ref: object
    author: str | None
    terms: AbstractSet[str]
    values: AbstractSet[str]
    cue: bool
    retracts: bool
    question: bool
    #: The change cues found (words, stems, pairs, CJK patterns): a cue the earlier message
    #: holds as well is shared phrasing ("... before moving here" twice), not a change.
    cues: AbstractSet[str] = frozenset()
    #: Said in the first person singular ("I", "my", 私, 我): its subject is its author.
    #: Found only in a statement with a cue (the only one it matters for).
    personal: bool = False
    #: The values in the order stated: "X instead of Y" after "Y instead of X" says something
    #: new with the same words.
    order: tuple[str, ...] = ()


def analyse(text: str, *, author: str | None = None, ref: object = None) -> Statement:
    """The :class:`Statement` of ``text`` (said by ``author``).

    One pass over the words: a word with a digit, a capitalised word that does not open a
    sentence and an acronym are values (as :func:`~ctxwarden.sentences.fact_values` finds
    them); other words of three letters or more, not function words, cut to six letters, are
    terms. CJK runs give values by pattern and terms by character pairs. This runs for every
    message ingested, so it is one regex pass and set lookups.
    """
    cjk = not text.isascii() and _CJK_RUN.search(text) is not None
    latin = _CJK_RUN.sub(" ", text) if cjk else text
    lower = latin.lower()
    names: set[str] = set()
    order: list[str] = []  # the values in the order stated (names first, then numbers)
    if lower != latin:  # some capital letter: names are possible
        order = [n.lower() for p, n in _NAME.findall(latin) if p not in _SENTENCE_END]
        names = set(order)
        names.discard("i")
    values = names
    if _DIGIT.search(lower):
        numbers = list(filter(_DIGIT.search, _TOKEN.findall(lower)))
        order.extend(numbers)
        values = names.union(numbers)
    words = set((_ASCII_LETTERS if lower.isascii() else _LETTERS).findall(lower))
    # Substring tests by map: one C loop each (a regex alternation costs ~10x more).
    stem = any(map(lower.__contains__, _CUE_STEMS))
    cues: set[str] = set(words & _CUE_WORDS)
    if stem:
        cues.update(s for s in _CUE_STEMS if s in lower)
    cue = bool(cues)
    retracts = False
    if any(map(lower.__contains__, _PAIR_TEXTS)):
        for first, second in _PAIR.findall(lower):
            cue = True
            cues.add(f"{first} {second}")
            retracts = retracts or (first, second) in _RETRACT_PAIRS
    # a crude stem: "deployment"/"deploying" share "deploy"
    kept = words - _NOT_TERMS - names if names else words - _NOT_TERMS
    if stem:  # a cue word is no subject: tested on the whole word ("postponed"), not its cut
        kept = {w for w in kept if not w.startswith(_CUE_STEMS)}
    terms = {w[:6] for w in kept}
    if "not" in lower and _NOT_AFTER_COMMA.search(lower):
        cue = True
        cues.add("not")
    if cjk:
        found = _CJK_VALUES.findall(text)
        values.update(v.lower() for v in found)
        order.extend(v.lower() for v in found)
        rest = _CJK_VALUES.sub(" ", text) if found else text
        marks = _CJK_CUES.findall(rest)
        if marks:
            cue = True
            cues.update(marks)
            retracts = retracts or _CJK_RETRACT.search(rest) is not None
            rest = _CJK_CUES.sub(" ", rest)
        for pair in cjk_bigrams(rest):
            if not _HIRAGANA.search(pair):  # hiragana writes Japanese grammar, not subjects
                terms.add(pair)
    # Positional, and the sets as made (never changed after): this runs per message.
    question = text.rstrip()[-1:] in _QUESTION_MARKS
    # Read only for a pair that shares a cue (superseded): only a message with a cue needs it.
    personal = cue and (
        _FIRST_PERSON.search(lower) is not None
        or (cjk and _FIRST_PERSON_CJK.search(text) is not None)
    )
    return Statement(
        ref, author, terms, values, cue, retracts, question, cues, personal, tuple(order)
    )


def may_change(text: str, *, author: str | None = None) -> bool:
    """False only when :func:`analyse` would find in ``text`` neither a change cue nor (said by
    an ``author``) a value: then it can change nothing, only be changed, and its analysis can
    wait until a message of its place could change something. A few substring tests: this
    runs where analysing every message would cost ~4x more.

    >>> may_change("lunch was great today"), may_change("lunch moved to noon")
    (False, True)
    >>> may_change("lunch at 12", author="rosa"), may_change("lunch at 12")
    (True, False)
    """
    if not text.isascii():
        return True  # CJK cues and values, accented cue words: analysed
    lower = text.lower()
    if author is not None and (lower != text or _DIGIT.search(lower) is not None):
        return True  # a name (a capitalised word) or a number: a value
    return any(map(lower.__contains__, _CUE_SUBSTRINGS))


def common_terms(statements: Sequence[Statement]) -> frozenset[str]:
    """Terms held by more than a third of ``statements`` (at least six of them): the
    window's vocabulary, not a subject."""
    if len(statements) < 6:
        return frozenset()
    df = Counter(t for s in statements for t in s.terms)
    cut = len(statements) / 3
    return frozenset(t for t, n in df.items() if n > cut)


def superseded(
    new: Statement, earlier: Sequence[Statement], *, common: frozenset[str] = frozenset()
) -> Statement | None:
    """The statement of ``earlier`` (oldest first) that ``new`` changes, or None.

    - With a change cue the old statement does not hold, or one that names an old value
      again ("now X, not Y"): the subject (terms not in ``common``) shares two terms, or one
      term when both state values or an old value comes back, covering half the shorter
      subject (:func:`_covers`), and something new is said; without an author, a value is
      replaced. A retraction ("scratch that") by the same author also takes that author's
      last statement with a value.
    - With only cues the old statement holds too, or without a cue: at least two shared
      terms covering half the shorter subject and a value replaced; with a shared cue, by the
      same author or neither in the first person; without a cue, by the same author.

    The best score (shared terms, plus two for an old value restated) wins; among equals the
    newest (the value in force is the last one stated).
    """
    if new.question or not (new.terms or new.values):
        return None
    if not new.cue and (new.author is None or not new.values):
        return None  # neither a cue nor an author's new value: nothing can be changed
    best: tuple[float, int] | None = None
    chosen: Statement | None = None
    own_last: Statement | None = None
    most_shared = 0  # the most subject terms an earlier statement shares with ``new``
    # Bound once: this loop runs for every earlier statement sharing a term (see changes.py).
    terms, values, author, cue = new.terms, new.values, new.author, new.cue
    subject = len(terms - common) if common else len(terms)
    for index, old in enumerate(earlier):
        if author is not None and old.author == author and old.values:
            own_last = old
        shared = terms & old.terms
        if not shared or old.question or old is new:
            continue  # most pairs: nothing in common
        if common:
            shared -= common
        count = len(shared)
        most_shared = max(most_shared, count)
        old_values = old.values
        restated = not old_values.isdisjoint(values)
        # A cue the earlier message holds as well is the phrasing both share ("... before
        # moving here", "... looks much better now"), unless the old value is named again
        # ("now X, not Y"): then only a new value for the same slot is a change.
        fresh = cue and (restated or not new.cues <= old.cues)
        if fresh:
            linked = count >= 2 or (
                count == 1 and (restated or (bool(old_values) and bool(values)))
            )
            # Two long messages sharing a few words, one with "now" or "actually" in passing,
            # are talk, not a change: the shared subject is half the shorter one's at least,
            # unless the new one names an old number again ("now 10:30, not 9:45"). A name
            # named again is no such sign: a conversation names its people all along.
            if linked and not any(map(_DIGIT.search, old_values & values)):
                # Without an old value named again, the shared words are half of both
                # subjects: a long reply that takes up a few words of a message ("Now the
                # hard part...") changes nothing of it.
                linked = _covers(new, old, common, count, subject, both=not restated)
            if linked and not (values - old_values or terms - old.terms):
                linked = new.order != old.order  # else nothing new was said
            if linked and author is None and not restated:
                # No author (a bot's feed, whose template and cue words repeat): only a
                # value replaced is a change.
                linked = _value_replaced(new, old, common)
        elif cue:
            linked = old.author == author or not (new.personal or old.personal)
            linked = linked and count >= 2 and _replaced(new, old, common, count, subject)
        else:
            if old.author != author or count < 2 or not old_values:
                continue
            linked = (
                _covers(new, old, common, count, subject)
                and bool(old_values - values)
                and bool(values - old_values)
            )
        if not linked:
            continue
        score = (count + (2.0 if restated else 0.0), index)
        if best is None or score >= best:
            best, chosen = score, old
    if chosen is None and new.retracts and own_last is not None:
        # "Scratch that, Friday": the author's own last value, unless the retraction shares
        # more of its subject with another statement ("correction: the venue is X" after
        # "the venue is Y" and the author's "the training is Monday" is about the venue).
        own = len((terms & own_last.terms) - common)
        if own >= most_shared or most_shared < 2:
            return own_last
    return chosen


def _replaced(
    new: Statement, old: Statement, common: frozenset[str], count: int, subject: int
) -> bool:
    """Whether ``new`` gives the subject it shares with ``old`` (``count`` terms of its
    ``subject`` ones, :func:`_covers`) another value (:func:`_value_replaced`)."""
    return _covers(new, old, common, count, subject) and _value_replaced(new, old, common)


def _value_replaced(new: Statement, old: Statement, common: frozenset[str]) -> bool:
    """Whether an old value is gone in ``new`` and a new one stated. For CJK text, where a
    name or a place has no case or digit to mark it a value, character pairs stand in."""
    if old.values - new.values and new.values - old.values:
        return True
    cjk = any(_CJK_RUN.match(t) for t in new.terms)
    return cjk and bool(old.terms - new.terms) and bool(new.terms - old.terms - common)


def _covers(
    new: Statement,
    old: Statement,
    common: frozenset[str],
    count: int,
    subject: int,
    *,
    both: bool = False,
) -> bool:
    """Whether the ``count`` shared terms are half the shorter subject (of ``subject`` terms
    in ``new``; of the longer with ``both``, in a spaced script), or a third in CJK text:
    there a value without a digit ("七楼大厅") is not told apart from the subject and its k
    characters add k + 1 pairs to the terms, where in a spaced script a word adds one."""
    sizes = (subject, len(old.terms - common) if common else len(old.terms))
    cjk = any(_CJK_RUN.match(t) for t in new.terms)
    # ``both`` is for spaced scripts only: in CJK text the values stated (a new place, an old
    # one) are pairs among the terms, so the longer side is long by its values, not by talk.
    bound = max(1, max(sizes) if both and not cjk else min(sizes))
    return count * (3 if cjk else 2) >= bound


def asks_history(query: str) -> bool:
    """Whether ``query`` asks what was in force before ("what was it before?", "変更前は?",
    "原来是几点?"): then superseded memories are shown, dated, rather than left out.

    >>> asks_history("what was the demo time before the change?"), asks_history("demo time?")
    (True, False)
    """
    return _HISTORY.search(query) is not None
