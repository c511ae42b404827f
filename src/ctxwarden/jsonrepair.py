"""Deterministic repair of the JSON that small models write.

Small local models asked for JSON often wrap it in a code fence, put prose around it, use single
quotes or Python literals (``True``, ``None``), leave a trailing comma, forget to quote keys or stop
before the closing braces. :func:`repair_json` fixes exactly those mistakes with a tolerant
recursive-descent parser and says which repairs it applied; anything it cannot read with confidence
is a failure, never a guess. Text that already parses as JSON is returned unchanged.

>>> result = repair_json("```json\\n{'city': 'Oslo', 'days': 3,}\\n```")
>>> result.text
'{"city": "Oslo", "days": 3}'
>>> result.repairs
('code_fence', 'single_quotes', 'trailing_comma')

The repair names (stable, for reports): ``code_fence``, ``prose_before``, ``prose_after``,
``single_quotes``, ``python_literal``, ``trailing_comma``, ``missing_comma``, ``unquoted_key``,
``missing_close``, ``unterminated_string``, ``comment``, ``control_character``, ``invalid_escape``,
``extra_comma``, ``invalid_number``,
``python_escape``.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any

__all__ = ["MAX_DEPTH", "RepairResult", "repair_json"]

#: Deepest nesting the tolerant parser follows; deeper input is a failure (not a RecursionError).
MAX_DEPTH = 200
#: How many candidate starts (``{`` or ``[``) in prose are tried before giving up.
_MAX_STARTS = 20

_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_-]*)[ \t]*\r?\n?(.*?)(?:```|\Z)", re.DOTALL)
_NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")
_IDENT = re.compile(r"[A-Za-z_$][A-Za-z0-9_$-]*")
_LITERALS: dict[str, tuple[Any, bool]] = {
    # name -> (value, whether writing it this way is a repair)
    "true": (True, False),
    "false": (False, False),
    "null": (None, False),
    "True": (True, True),
    "False": (False, True),
    "None": (None, True),
}
_ESCAPES = {'"': '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}


@dataclass(frozen=True, kw_only=True)
class RepairResult:
    """The outcome of :func:`repair_json`.

    ``ok`` says whether JSON could be had. When it is, ``text`` is valid JSON (the input itself
    when it already parsed, else a canonical ``json.dumps`` of what was read), ``value`` the parsed
    value and ``repairs`` the names of the repairs applied, in the order first applied (empty for
    valid input). When it is not, ``text`` and ``value`` are None and ``error`` says why.
    """

    ok: bool
    text: str | None
    value: Any
    repairs: tuple[str, ...]
    error: str | None = None

    @property
    def repaired(self) -> bool:
        """True when the input was not valid JSON but could be repaired."""
        return self.ok and bool(self.repairs)


class _UnreadableError(Exception):
    """Raised inside the tolerant parser; becomes a failed RepairResult."""


def repair_json(text: str) -> RepairResult:
    """Return valid JSON for ``text``, repairing common malformations deterministically.

    Never raises: input that cannot be repaired gives ``ok=False`` with an ``error``. Valid JSON
    (per :func:`json.loads`) is returned unchanged with no repairs listed, so the function is
    idempotent on its own output.

    >>> repair_json('{"a": [1, 2,]').text
    '{"a": [1, 2]}'
    >>> repair_json("no json here").ok
    False
    """
    if not isinstance(text, str):
        return RepairResult(ok=False, text=None, value=None, repairs=(), error="not a string")
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        pass
    else:
        return RepairResult(ok=True, text=text, value=value, repairs=())

    repairs: list[str] = []
    body = text
    fence = _FENCE.search(text)
    if fence is not None and fence.group(2).strip():
        body = fence.group(2)
        repairs.append("code_fence")
    return _repair_body(body, repairs)


def _repair_body(body: str, repairs: list[str]) -> RepairResult:
    stripped = body.strip()
    first_error: str | None = None
    # Each "{" or "[" is a candidate start, so prose that happens to contain a brace before the
    # real JSON costs a retry, not a failure.
    for start in [i for i, ch in enumerate(stripped) if ch in "{["][:_MAX_STARTS]:
        result = _attempt(stripped, start, repairs, allow_after=True)
        if isinstance(result, RepairResult):
            return result
        first_error = first_error or result
    # No container found: a lone scalar ('text', True) counts only when nothing follows it, so
    # "3 things to note" is not read as the number 3.
    if stripped:
        result = _attempt(stripped, 0, repairs, allow_after=False)
        if isinstance(result, RepairResult):
            return result
        first_error = first_error or result
    return RepairResult(
        ok=False, text=None, value=None, repairs=(), error=first_error or "no JSON found"
    )


def _attempt(text: str, start: int, repairs: list[str], *, allow_after: bool) -> RepairResult | str:
    """Parse from ``start``; a RepairResult on success, else the error message."""
    parser = _Parser(text, start)
    try:
        value = parser.parse_document()
        fixed = json.dumps(value, ensure_ascii=False)
    except (_UnreadableError, RecursionError, ValueError) as exc:
        return str(exc) or "nested too deeply"
    found = list(repairs)
    if text[:start].strip():
        found.append("prose_before")
    found.extend(parser.repairs)
    if text[parser.pos :].strip():
        if not allow_after:
            return f"unexpected text at character {parser.pos}"
        found.append("prose_after")
    return RepairResult(ok=True, text=fixed, value=value, repairs=tuple(dict.fromkeys(found)))


class _Parser:
    """A tolerant JSON reader: accepts the common model mistakes, records each as a repair."""

    def __init__(self, text: str, pos: int) -> None:
        self.text = text
        self.pos = pos
        self.repairs: list[str] = []

    def _note(self, repair: str) -> None:
        if repair not in self.repairs:
            self.repairs.append(repair)

    def _fail(self, what: str) -> _UnreadableError:
        return _UnreadableError(f"{what} at character {self.pos}")

    def _peek(self) -> str:
        return self.text[self.pos] if self.pos < len(self.text) else ""

    def _skip(self) -> None:
        """Skip whitespace and comments (``//``, ``/* */``), noting comments as repairs."""
        text = self.text
        while self.pos < len(text):
            ch = text[self.pos]
            if ch in " \t\r\n\ufeff\u00a0":
                self.pos += 1
            elif text.startswith("//", self.pos):
                end = text.find("\n", self.pos)
                self.pos = len(text) if end < 0 else end + 1
                self._note("comment")
            elif text.startswith("/*", self.pos):
                end = text.find("*/", self.pos + 2)
                self.pos = len(text) if end < 0 else end + 2
                self._note("comment")
            else:
                return

    def parse_document(self) -> Any:
        self._skip()
        return self._value(0)

    def _value(self, depth: int) -> Any:
        if depth > MAX_DEPTH:
            raise self._fail(f"nested deeper than {MAX_DEPTH}")
        self._skip()
        ch = self._peek()
        if ch == "":
            raise self._fail("expected a value, found the end")
        if ch == "{":
            return self._object(depth + 1)
        if ch == "[":
            return self._array(depth + 1)
        if ch in "\"'":
            return self._string()
        if ch in ",:}]":
            raise self._fail("expected a value")
        number = _NUMBER.match(self.text, self.pos)
        if number is not None:
            return self._number(number)
        ident = _IDENT.match(self.text, self.pos)
        if ident is not None and ident.group() in _LITERALS:
            value, is_repair = _LITERALS[ident.group()]
            if is_repair:
                self._note("python_literal")
            self.pos = ident.end()
            return value
        raise self._fail("expected a value")

    def _number(self, match: re.Match[str]) -> int | float:
        raw = match.group()
        self.pos = match.end()
        if re.fullmatch(r"-?(?:0|[1-9]\d*)", raw):
            return int(raw)
        canonical = re.fullmatch(r"-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][-+]?\d+)?", raw)
        if canonical is None:
            if re.fullmatch(r"[-+]?\d+", raw):
                # "+1" or "007": read as the integer the writer meant.
                self._note("invalid_number")
                return int(raw)
            self._note("invalid_number")
        value = float(raw)
        if not math.isfinite(value):
            raise self._fail("number out of range")
        return value

    def _string(self) -> str:
        quote = self.text[self.pos]
        if quote == "'":
            self._note("single_quotes")
        self.pos += 1
        text = self.text
        out: list[str] = []
        while True:
            if self.pos >= len(text):
                self._note("unterminated_string")
                return "".join(out)
            ch = text[self.pos]
            if ch == quote:
                self.pos += 1
                return "".join(out)
            if ch == "\\":
                self.pos += 1
                out.append(self._escape(quote))
                continue
            if ch < " ":
                self._note("control_character")
            out.append(ch)
            self.pos += 1

    def _escape(self, quote: str) -> str:
        text = self.text
        if self.pos >= len(text):
            self._note("unterminated_string")
            return ""
        ch = text[self.pos]
        self.pos += 1
        if ch in _ESCAPES:
            return _ESCAPES[ch]
        if ch == "'" and quote == "'":
            return "'"
        if ch in "xU":
            # Python's repr writes \xNN and \UNNNNNNNN, which JSON lacks.
            size = 2 if ch == "x" else 8
            digits = text[self.pos : self.pos + size]
            if re.fullmatch(rf"[0-9a-fA-F]{{{size}}}", digits) and int(digits, 16) <= 0x10FFFF:
                code = int(digits, 16)
                if not 0xD800 <= code < 0xE000:
                    self.pos += size
                    self._note("python_escape")
                    return chr(code)
        if ch == "u":
            digits = text[self.pos : self.pos + 4]
            if re.fullmatch(r"[0-9a-fA-F]{4}", digits):
                self.pos += 4
                code = int(digits, 16)
                low = text[self.pos : self.pos + 6]
                if 0xD800 <= code < 0xDC00 and re.fullmatch(r"\\u[dD][c-fC-F][0-9a-fA-F]{2}", low):
                    self.pos += 6
                    code = 0x10000 + ((code - 0xD800) << 10) + (int(low[2:], 16) - 0xDC00)
                if 0xD800 <= code < 0xE000:
                    # A lone surrogate cannot be encoded later; keep the escape as text instead.
                    self._note("invalid_escape")
                    return "\\u" + digits
                return chr(code)
        # An unknown escape such as "\d": keep the backslash, as the writer most likely meant it.
        self._note("invalid_escape")
        return "\\" + ch

    def _key(self) -> str:
        ch = self._peek()
        if ch in "\"'":
            return self._string()
        ident = _IDENT.match(self.text, self.pos)
        if ident is not None:
            self.pos = ident.end()
            self._note("unquoted_key")
            return ident.group()
        number = _NUMBER.match(self.text, self.pos)
        if number is not None:
            self.pos = number.end()
            self._note("unquoted_key")
            return number.group()
        raise self._fail("expected a key")

    def _object(self, depth: int) -> dict[str, Any]:
        self.pos += 1  # "{"
        result: dict[str, Any] = {}
        expect_member = True
        while True:
            self._skip()
            ch = self._peek()
            if ch == "}":
                self.pos += 1
                return result
            if ch == "":
                self._note("missing_close")
                return result
            if ch == ",":
                self.pos += 1
                self._note("extra_comma")
                continue
            if ch == "]":
                raise self._fail("']' closes an object")
            if not expect_member:
                self._note("missing_comma")
            key = self._key()
            self._skip()
            if self._peek() != ":":
                raise self._fail("expected ':' after a key")
            self.pos += 1
            result[key] = self._value(depth)
            expect_member = False
            self._skip()
            if self._peek() == ",":
                self.pos += 1
                self._skip()
                if self._peek() == "}":
                    self._note("trailing_comma")
                else:
                    expect_member = True

    def _array(self, depth: int) -> list[Any]:
        self.pos += 1  # "["
        result: list[Any] = []
        expect_item = True
        while True:
            self._skip()
            ch = self._peek()
            if ch == "]":
                self.pos += 1
                return result
            if ch == "":
                self._note("missing_close")
                return result
            if ch == ",":
                self.pos += 1
                self._note("extra_comma")
                continue
            if ch == "}":
                raise self._fail("'}' closes an array")
            if not expect_item:
                self._note("missing_comma")
            result.append(self._value(depth))
            expect_item = False
            self._skip()
            if self._peek() == ",":
                self.pos += 1
                self._skip()
                if self._peek() == "]":
                    self._note("trailing_comma")
                else:
                    expect_item = True
