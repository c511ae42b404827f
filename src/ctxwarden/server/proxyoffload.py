"""Tool-result offloading in the proxy (``ProxyConfig(offload_tokens=N)``; off by default).

For a request that names an end user or session, each ``tool`` message whose text counts more
than ``offload_tokens`` (with the request's tokenizer) is replaced, before the conversation is
checked, counted and fitted, by a preview naming the id of a memory that holds the whole text
(:mod:`ctxwarden.offload`); the memory is stored in the caller's session and end user when the
conversation is remembered. The id and the preview depend on the text and the scope only, so
the same result reads the same on every turn and a provider's prompt cache keeps hitting;
``GET /v1/memories/{id}/sources``, the MCP tool ``expand`` and ``Engine.expand`` give the text
back.

Off unless configured, so a conversation that fits is still sent byte for byte as the client
sent it (the proxy's first promise). Offloading only when a conversation no longer fits was
the other choice, and was not taken: the prompt would then change shape on the turn it stops
fitting (one cache miss per conversation) and a result would be offloaded or not depending on
what else the conversation holds, so the same request could read two ways.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import xxhash

from ctxwarden.offload import offload_messages
from ctxwarden.server.chatfit import TokenCache
from ctxwarden.server.proxymemory import Who
from ctxwarden.server.windows import Windows

__all__ = ["offload_request"]


def offload_request(
    body: dict[str, Any],
    who: Who,
    headers: Mapping[str, str],
    *,
    max_tokens: int | None,
    preview_chars: int,
    windows: Windows,
    cache: TokenCache,
) -> tuple[dict[str, Any], ...]:
    """Replace ``body["messages"]``'s large tool results by previews (in place: a new list,
    the client's other message objects kept); the records to store, none when offloading is
    off, the request names nobody, or nothing is over the threshold."""
    messages = body.get("messages")
    if max_tokens is None or not who.named or not isinstance(messages, list):
        return ()
    if not any(isinstance(m, dict) and m.get("role") == "tool" for m in messages):
        return ()
    tokenizer = windows.choose(str(body.get("model") or ""), headers).tokenizer

    def count(text: str) -> int:
        # a long tool result comes back on every turn: counted once (the fit's token cache)
        key = xxhash.xxh3_64_intdigest(
            f"offload\x00{tokenizer.name}\x00".encode() + text.encode("utf-8", "surrogatepass")
        )
        found = cache.get(key)
        if found is None:
            found = tokenizer.count(text)
            cache.put(key, found)
        return found

    out = offload_messages(
        messages,
        count=count,
        max_tokens=max_tokens,
        preview_chars=preview_chars,
        tenant=who.tenant,
        user=who.user,
        session=who.conversation,
    )
    if out.records:
        body["messages"] = out.messages
    return out.records
