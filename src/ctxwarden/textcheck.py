"""Text checked at the boundary: no NUL and no lone surrogate in anything stored or served.

A lone surrogate (``"\\ud800"``, valid JSON) cannot be encoded as UTF-8, so SQLite, PostgreSQL
and every JSON response refuse it; a NUL is refused by PostgreSQL and by the rendering of a
context. Both are refused where text comes in, with an :class:`~ctxwarden.errors.InputError`
naming the field, so every face (library, CLI, HTTP, proxy, MCP) answers the same way and
nothing that could make a later read fail is ever stored.

>>> check_text("deploy at 10", "content")
'deploy at 10'
>>> check_text("a\\x00b", "author")
Traceback (most recent call last):
...
ctxwarden.errors.InputError: field 'author': contains a NUL character: remove it
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ctxwarden.errors import InputError

__all__ = ["check_json_text", "check_text", "plain_text", "text_problem"]

#: How deep a JSON value (metadata, attachments, tools) may nest before it is refused.
MAX_DEPTH = 64


def text_problem(value: str) -> str | None:
    """What is wrong with ``value`` (a NUL or a lone surrogate), or None when nothing is.

    ASCII text (the common case) costs two scans in C; other text one UTF-8 encode.

    >>> text_problem("caf\\u00e9") is None
    True
    >>> text_problem("\\udc80")
    'contains a lone surrogate (U+DC80), which is not valid Unicode text'
    """
    if "\x00" in value:
        return "contains a NUL character: remove it"
    if value.isascii():
        return None
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        code = ord(value[exc.start])
        return f"contains a lone surrogate (U+{code:04X}), which is not valid Unicode text"
    return None


def _printable(key: object) -> str:
    """A key as it can appear in an error message (lone surrogates and NUL escaped)."""
    text = str(key)
    return text if plain_text(text) else text.encode("unicode_escape").decode("ascii")


def plain_text(value: str) -> bool:
    """Whether ``value`` holds no NUL and no lone surrogate."""
    return text_problem(value) is None


def check_text(value: str, field: str, *, line: int | None = None) -> str:
    """``value`` unchanged, or :class:`InputError` naming ``field`` for a NUL or a lone
    surrogate."""
    problem = text_problem(value)
    if problem is not None:
        raise InputError(problem, field=field, line=line)
    return value


def check_json_text(
    value: Any, field: str, *, line: int | None = None, max_depth: int = MAX_DEPTH
) -> Any:
    """``value`` unchanged after checking every string in it, keys included (a JSON value such
    as metadata, attachments or tool definitions); the error names the path, e.g.
    ``metadata.tags[2]``. Nesting deeper than ``max_depth`` (:data:`MAX_DEPTH` unless told) is
    refused too.

    >>> check_json_text({"tags": ["a", "b\\x00"]}, "metadata")
    Traceback (most recent call last):
    ...
    ctxwarden.errors.InputError: field 'metadata.tags[1]': contains a NUL character: remove it
    """
    stack: list[tuple[Any, str, int]] = [(value, field, 0)]
    while stack:
        item, path, depth = stack.pop()
        if depth > max_depth:
            raise InputError(f"nested deeper than {max_depth} levels", field=path, line=line)
        if isinstance(item, str):
            check_text(item, path, line=line)
        elif isinstance(item, Mapping):
            for key, inner in item.items():
                name = _printable(key)
                if isinstance(key, str):
                    check_text(key, f"{path}.{name} (the key)", line=line)
                stack.append((inner, f"{path}.{name}", depth + 1))
        elif isinstance(item, list | tuple):
            stack.extend((inner, f"{path}[{i}]", depth + 1) for i, inner in enumerate(item))
    return value
