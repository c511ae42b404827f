"""Attachments of a record: images, files and links, kept as the words that describe them.

A record's ``attachments`` is a list of objects, each::

    {"kind": "image" | "file" | "link", "name": "...", "caption": "...", "url": "..."}

``name`` is a file name or a link's title (``title`` and ``filename`` are accepted for it),
``caption`` the words that say what it shows (``alt`` and ``description`` are accepted for it),
``url`` where it lives. ``kind`` defaults to ``link`` when only a URL says what it is, else
``file``. At least one of name, caption and URL is needed. The engine never downloads anything:
an attachment is what the record carries about it, so a ``data:`` URL (an inline payload) is
refused, as are fields it does not know (a typo is an error naming the field, not a silently
dropped caption).

:func:`check` validates and returns the canonical form (only the keys above, empty ones left
out), which is what the store keeps and returns. The words of an attachment reach every part of
the engine that reads a memory's text:

- **search**: :func:`search_text` (names and captions) is indexed beside the content by both
  backends' full-text search and embedded with it;
- **prompt**: :func:`note` renders them compactly after the content on the memory's line and
  in its chat message, e.g. ``[image: a dog on a beach]``, so the model sees what was shared.

Limits keep a record's attachments from dwarfing its text: at most :data:`MAX_ATTACHMENTS`
per record, names of at most :data:`MAX_NAME_CHARS`, captions of at most
:data:`MAX_CAPTION_CHARS` and URLs of at most :data:`MAX_URL_CHARS` characters.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any, Final

from ctxwarden.errors import InputError
from ctxwarden.textcheck import check_text

__all__ = [
    "KINDS",
    "MAX_ATTACHMENTS",
    "MAX_CAPTION_CHARS",
    "MAX_NAME_CHARS",
    "MAX_URL_CHARS",
    "check",
    "note",
    "search_text",
    "with_note",
]

#: What an attachment is.
KINDS: Final = frozenset({"image", "file", "link"})
#: Most attachments one record may carry.
MAX_ATTACHMENTS: Final = 16
#: Longest name or title (characters).
MAX_NAME_CHARS: Final = 512
#: Longest caption or alt text (characters).
MAX_CAPTION_CHARS: Final = 2000
#: Longest URL (characters).
MAX_URL_CHARS: Final = 2048

#: Each canonical key and the names accepted for it, the canonical one first.
_SYNONYMS: Final = {
    "kind": ("kind", "type"),
    "name": ("name", "title", "filename"),
    "caption": ("caption", "alt", "description"),
    "url": ("url",),
}
_LIMITS: Final = {"name": MAX_NAME_CHARS, "caption": MAX_CAPTION_CHARS, "url": MAX_URL_CHARS}
_CANONICAL: Final = {alias: key for key, names in _SYNONYMS.items() for alias in names}
_KNOWN: Final = ", ".join(sorted(_CANONICAL))
_NAME_SEPARATORS: Final = re.compile(r"[._\-/\\]+")


def check(value: object, *, line: int | None = None) -> tuple[dict[str, str], ...]:
    """Validate a record's ``attachments`` and return their canonical form.

    Raises :class:`~ctxwarden.errors.InputError` naming the attachment and its field
    (``attachments[1].caption``).

    >>> check([{"type": "image", "alt": "a dog on a beach", "url": "https://x.io/d.jpg"}])
    ({'kind': 'image', 'caption': 'a dog on a beach', 'url': 'https://x.io/d.jpg'},)
    >>> check([{"url": "https://x.io/post"}])
    ({'kind': 'link', 'url': 'https://x.io/post'},)
    """
    if value is None:
        return ()
    if isinstance(value, str | bytes) or not isinstance(value, Sequence):
        raise InputError(
            f"expected a list of objects ({{kind, name, caption, url}}), got "
            f"{type(value).__name__}",
            field="attachments",
            line=line,
        )
    if len(value) > MAX_ATTACHMENTS:
        raise InputError(
            f"{len(value)} attachments is over the limit of {MAX_ATTACHMENTS} per record",
            field="attachments",
            line=line,
        )
    return tuple(_one(item, f"attachments[{index}]", line) for index, item in enumerate(value))


def _one(item: object, where: str, line: int | None) -> dict[str, str]:
    if not isinstance(item, Mapping):
        raise InputError(
            f"expected an object ({{kind, name, caption, url}}), got {type(item).__name__}",
            field=where,
            line=line,
        )
    found: dict[str, str] = {}
    given: dict[str, str] = {}
    for alias, raw in item.items():
        key = _CANONICAL.get(alias) if isinstance(alias, str) else None
        if key is None:
            raise InputError(
                f"unknown field (known: {_KNOWN})", field=f"{where}.{alias}", line=line
            )
        if raw is None:
            continue
        if key in given:
            raise InputError(
                f"gives the {key} twice (as {given[key]!r} and {alias!r}): keep one",
                field=f"{where}.{alias}",
                line=line,
            )
        given[key] = alias
        if not isinstance(raw, str):
            raise InputError(
                f"expected a string, got {type(raw).__name__}", field=f"{where}.{alias}", line=line
            )
        # One line: whitespace runs (line breaks included) become one space.
        text = " ".join(check_text(raw, f"{where}.{alias}", line=line).split())
        limit = _LIMITS.get(key)
        if limit is not None and len(text) > limit:
            raise InputError(
                f"{len(text)} characters is over the limit of {limit}",
                field=f"{where}.{alias}",
                line=line,
            )
        if text:
            found[key] = text
    kind = found.pop("kind", None)
    if kind is None:
        kind = "link" if set(found) == {"url"} else "file"
    elif kind not in KINDS:
        raise InputError(
            f"{kind!r} is not one of {', '.join(sorted(KINDS))}",
            field=f"{where}.{given['kind']}",
            line=line,
        )
    if not found:
        raise InputError(
            "says nothing about the attachment: give a name, a caption or a url",
            field=where,
            line=line,
        )
    url = found.get("url")
    if url is not None and url[:5].lower() == "data:":
        raise InputError(
            "is an inline data: URL; the engine keeps what describes an attachment, not its "
            "bytes: give its name or caption (and a URL where it lives)",
            field=f"{where}.url",
            line=line,
        )
    return {"kind": kind, **{k: found[k] for k in ("name", "caption", "url") if k in found}}


def search_text(attachments: Sequence[Mapping[str, Any]] | None) -> str:
    """The words of ``attachments`` that search and embedding see: each one's name (dots,
    dashes, underscores and slashes as spaces) and caption, space-separated (URLs are left out:
    their hashes and paths only add noise).

    >>> search_text([{"kind": "image", "name": "dog.jpg", "caption": "a dog on a beach"}])
    'dog jpg a dog on a beach'
    """
    if not attachments:
        return ""
    words = []
    for item in attachments:
        name, caption = _field(item, "name"), _field(item, "caption")
        if name:
            # "trip_plan-v2.pdf" is searched as its words: PostgreSQL's parser would keep a
            # file name whole (one lexeme), SQLite's splits it.
            words.append(" ".join(_NAME_SEPARATORS.sub(" ", name).split()))
        if caption:
            words.append(caption)
    return " ".join(w for w in words if w)


def _field(item: Mapping[str, Any], key: str) -> str | None:
    """``item``'s ``key`` under its canonical name or a synonym (attachments stored before
    they were validated kept the caller's keys)."""
    for alias in _SYNONYMS[key]:
        value = item.get(alias)
        if isinstance(value, str) and value.strip():
            return value.strip()
    return None


def note(attachments: Sequence[Mapping[str, Any]] | None) -> str:
    """``attachments`` as they follow a memory's content in a prompt: one bracket each,
    joined by spaces, with a leading space (empty without attachments). A link shows its URL;
    an image or file its name and caption only (their URLs are storage paths the model cannot
    open).

    >>> note([{"kind": "image", "caption": "a dog on a beach"}])
    ' [image: a dog on a beach]'
    >>> note([{"kind": "link", "name": "Q3 plan", "url": "https://x.io/q3"}])
    ' [link Q3 plan: https://x.io/q3]'
    """
    if not attachments:
        return ""
    parts = []
    for item in attachments:
        kind = _field(item, "kind") or "file"
        name, caption, url = _field(item, "name"), _field(item, "caption"), _field(item, "url")
        head = f"{kind} {name}" if name else kind
        body = caption or (url if kind == "link" else None)
        if kind == "link" and caption and url:
            body = f"{caption} ({url})"
        parts.append(f" [{head}: {body}]" if body else f" [{head}]")
    return "".join(parts)


def with_note(content: str, attachments: Sequence[Mapping[str, Any]] | None) -> str:
    """``content`` followed by the :func:`note` of its ``attachments`` (the note alone when
    there is no content: a record may be only an image).

    >>> with_note("look!", [{"kind": "image", "name": "cat.png"}])
    'look! [image cat.png]'
    >>> with_note("", [{"kind": "image", "name": "cat.png"}])
    '[image cat.png]'
    """
    if not attachments:
        return content
    return content + note(attachments) if content else note(attachments).lstrip()
