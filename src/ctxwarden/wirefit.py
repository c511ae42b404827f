"""What the Responses and Anthropic Messages adapters share: token costs of items and errors.

Pure: no I/O. The adapters (:mod:`ctxwarden.fit_responses`, :mod:`ctxwarden.fit_messages`) turn
a request into :class:`ctxwarden.fit.Unit` runs; this module prices what goes in them with the
model's tokenizer and chat format (:mod:`ctxwarden.tokens`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import xxhash

from ctxwarden.errors import InputError
from ctxwarden.tokens import ChatFormat

__all__ = ["IMAGE_TOKENS", "CostCache", "Pricer", "require"]

#: What one image is priced at, whatever its size: above what either API charges for one
#: image (Anthropic: (w*h)/750, at most ~1,600 for the 1.15 megapixels it keeps; OpenAI
#: high detail: 85 + 170 per 512-px tile, 765 for the 4 tiles of its 768-px short side).
IMAGE_TOKENS = 1600


def require(condition: bool, field: str, problem: str) -> None:
    """Raise :class:`InputError` naming ``field`` unless ``condition`` holds."""
    if not condition:
        raise InputError(problem, field=field)


class CostCache(Protocol):
    """Where item costs are kept between requests (e.g. the proxy's ``TokenCache``): a growing
    agent conversation is re-sent whole each turn, and only its new items need counting."""

    def get(self, key: int) -> int | None:
        """The cost stored under ``key``, or None."""

    def put(self, key: int, value: int) -> None:
        """Store ``value`` under ``key``."""


@dataclass(frozen=True)
class Pricer:
    """Token costs of the parts of a request, counted with ``fmt``'s tokenizer and template.

    With a ``cache``, :meth:`cached` counts an item once per (API, format, tokenizer, item
    JSON) and then looks it up.
    """

    fmt: ChatFormat
    cache: CostCache | None = None

    def costs(
        self, api: str, items: Sequence[Any], cost: Callable[[Pricer, Any], int]
    ) -> list[int]:
        """``cost(self, item)`` of each item in ``api``'s format, through the cache."""
        cache = self.cache
        if cache is None:
            return [cost(self, item) for item in items]
        # orjson comes with the server extra, and only the proxy passes a cache
        import orjson

        prefix = f"{api}\x00{self.fmt.name}\x00{self.fmt.tokenizer.name}\x00".encode()
        out: list[int] = []
        for item in items:
            key = xxhash.xxh3_128_intdigest(
                prefix + orjson.dumps(item, option=orjson.OPT_SORT_KEYS)
            )
            value = cache.get(key)
            if value is None:
                value = cost(self, item)
                cache.put(key, value)
            out.append(value)
        return out

    def text(self, text: str) -> int:
        """Tokens of ``text`` alone."""
        return self.fmt.tokenizer.count(text)

    def message(self, role: str, text: str = "", *, extra: int = 0) -> int:
        """A message of ``role`` holding ``text`` plus ``extra`` tokens of other parts."""
        return self.fmt.message_tokens(role, text) + extra

    def call(self, name: str, arguments: Any) -> int:
        """One tool call (name and arguments)."""
        return self.fmt.tool_call_tokens(name, arguments)

    def json(self, value: Any) -> int:
        """Anything else, priced as its compact JSON (more than any template renders of it)."""
        return self.text(json.dumps(value, ensure_ascii=False, separators=(",", ":")))

    def tools(self, tools: Sequence[Mapping[str, Any]]) -> int:
        """The tool schemas of a request."""
        return self.fmt.tools_tokens(self.fmt.tokenizer, tools)

    def request(self, *, has_system: bool) -> int:
        """What a request adds once (reply priming, template prefix)."""
        return self.fmt.request_overhead(has_system=has_system)
