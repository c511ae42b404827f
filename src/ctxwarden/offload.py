r"""Tool-result offloading: a tool result too large for the prompt is stored as a memory and
replaced by a short preview naming its id; ``expand`` brings the whole text back.

What Anthropic's context editing and LangChain's ``ClearToolUsesEdit`` do to old tool results,
but reversible: the result is a memory of the caller's session (and end user), found again by
:meth:`ctxwarden.engine.Engine.expand`, ``GET /v1/memories/{id}/sources`` or the MCP tool
``expand``. The id and the preview depend only on the tenant, end user, session and the
result's text, so the same result gets the same preview on every turn (a provider's prompt
cache keeps hitting) and storing it again is ``known``.

This module is pure: :func:`offload_messages` decides and rewrites; the engine stores the
records it returns (:meth:`~ctxwarden.engine.Engine.offload`).

>>> out = offload_messages(
...     [{"role": "tool", "tool_call_id": "c1", "content": "row " * 50}],
...     count=lambda text: len(text.split()), max_tokens=20, preview_chars=12,
...     tenant="t", user=None, session="s",
... )
>>> head, text = out.messages[0]["content"].split("\n")
>>> head == f"[offloaded tool result {out.ids[0]}: 50 tokens, 200 characters; " + (
...     "call expand with this id for the full text]")
True
>>> text
'row row row…'
>>> out.records[0]["metadata"]["offloaded"]
True
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ctxwarden.errors import InputError

__all__ = ["OFFLOAD_PREFIX", "Offloaded", "offload_id", "offload_messages", "preview"]

#: Every offloaded result's id starts with this.
OFFLOAD_PREFIX = "offload-"


def offload_id(tenant: str, user: str | None, session: str, content: str) -> str:
    """The id of an offloaded tool result: the same text in the same scope, the same id."""
    raw = "\x00".join((tenant, user or "", session, content)).encode("utf-8", "surrogatepass")
    return OFFLOAD_PREFIX + hashlib.sha256(raw).hexdigest()[:24]


def preview(id: str, content: str, tokens: int, preview_chars: int) -> str:
    """The text that stands in the prompt for an offloaded result: its id, size, and its first
    ``preview_chars`` characters (cut at a space when there is one in the last fifth)."""
    head = content[:preview_chars]
    if len(content) > preview_chars:
        space = head.rfind(" ")
        if space >= preview_chars * 4 // 5:
            head = head[:space]
        head = head.rstrip() + "…"
    return (
        f"[offloaded tool result {id}: {tokens} tokens, {len(content)} characters; "
        f"call expand with this id for the full text]\n{head}"
    )


def _text(content: Any) -> str | None:
    """A tool message's content as text: a string, or a list of text parts; None for
    anything else (images and other parts are never offloaded)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and content:
        parts = []
        for part in content:
            if not isinstance(part, Mapping) or part.get("type") != "text":
                return None
            text = part.get("text")
            if not isinstance(text, str):
                return None
            parts.append(text)
        return "".join(parts)
    return None


@dataclass(frozen=True, kw_only=True, slots=True)
class Offloaded:
    """The messages with large tool results replaced by previews (the caller's own message
    objects where nothing changed), the records to store, and the ids offloaded, in order."""

    messages: list[Any]
    records: tuple[dict[str, Any], ...]
    ids: tuple[str, ...]


def offload_messages(
    messages: Sequence[Any],
    *,
    count: Callable[[str], int],
    max_tokens: int,
    preview_chars: int,
    tenant: str,
    user: str | None,
    session: str,
) -> Offloaded:
    """Replace each ``tool`` message whose text counts more than ``max_tokens`` (by ``count``)
    with a preview (:func:`preview`); the records to store hold the whole text."""
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise InputError(f"{max_tokens!r} must be a positive number of tokens", field="max_tokens")
    if isinstance(preview_chars, bool) or not isinstance(preview_chars, int) or preview_chars < 0:
        raise InputError(
            f"{preview_chars!r} must be zero or more characters", field="preview_chars"
        )
    out: list[Any] = list(messages)
    records: list[dict[str, Any]] = []
    ids: list[str] = []
    for index, message in enumerate(messages):
        if not isinstance(message, Mapping) or message.get("role") != "tool":
            continue
        text = _text(message.get("content"))
        # a token covers at least one UTF-8 byte: a text of fewer bytes is never counted
        if text is None or len(text.encode("utf-8", "surrogatepass")) <= max_tokens:
            continue
        tokens = count(text)
        if tokens <= max_tokens:
            continue
        id = offload_id(tenant, user, session, text)
        out[index] = {**message, "content": preview(id, text, tokens, preview_chars)}
        record: dict[str, Any] = {
            "id": id,
            "role": "tool",
            "content": text,
            "metadata": {"offloaded": True, "tokens": tokens},
        }
        for name in ("tool_call_id", "name"):
            if isinstance(message.get(name), str):
                record[name] = message[name]
        records.append(record)
        ids.append(id)
    return Offloaded(messages=out, records=tuple(records), ids=tuple(ids))
