"""The proxy's numbers: provider cache reads per answer, and its Prometheus counters.

Providers bill a cached prompt prefix at a fraction of the price and say how much of the prompt
they read from cache: OpenAI as ``usage.prompt_tokens_details.cached_tokens``, Anthropic as
``usage.cache_read_input_tokens`` (vLLM and llama.cpp's server send the OpenAI field when they
cache). :func:`cached_tokens` reads either; the proxy puts it in its report header and counts it
in ``/metrics`` next to the prompt tokens, so the share of cached prompt tokens can be watched.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from prometheus_client import Counter

from ctxwarden.server.metrics import Metrics

__all__ = ["ProxyMetrics", "cached_tokens", "prompt_tokens"]


def _count(value: Any) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    return None


def cached_tokens(usage: Any) -> int | None:
    """Prompt tokens the provider read from its cache, when the ``usage`` object says so.

    >>> cached_tokens({"prompt_tokens": 900, "prompt_tokens_details": {"cached_tokens": 768}})
    768
    >>> cached_tokens({"input_tokens": 20, "cache_read_input_tokens": 4000})
    4000
    >>> cached_tokens({"prompt_tokens": 9}) is None
    True
    """
    if not isinstance(usage, Mapping):
        return None
    details = usage.get("prompt_tokens_details") or usage.get("input_tokens_details")
    if isinstance(details, Mapping):
        found = _count(details.get("cached_tokens"))
        if found is not None:
            return found
    return _count(usage.get("cache_read_input_tokens"))


def prompt_tokens(usage: Any) -> int | None:
    """The prompt's tokens as the provider counted them (OpenAI or Anthropic usage)."""
    if not isinstance(usage, Mapping):
        return None
    found = _count(usage.get("prompt_tokens"))
    if found is None:
        found = _count(usage.get("input_tokens"))
        if found is not None:  # Anthropic counts cache reads and writes apart from input_tokens
            found += (_count(usage.get("cache_read_input_tokens")) or 0) + (
                _count(usage.get("cache_creation_input_tokens")) or 0
            )
    return found


class ProxyMetrics:
    """The proxy's counters, registered in the server's :class:`Metrics` registry."""

    def __init__(self, metrics: Metrics) -> None:
        r = metrics.registry
        self.fits = Counter(
            "ctxwarden_proxy_requests",
            "Proxied requests by what was sent: the conversation unchanged or trimmed.",
            ["outcome"],
            registry=r,
        )
        self.sent_tokens = Counter(
            "ctxwarden_proxy_sent_tokens", "Prompt tokens sent upstream (counted).", registry=r
        )
        self.received_tokens = Counter(
            "ctxwarden_proxy_received_tokens",
            "Prompt tokens of the conversations received (counted).",
            registry=r,
        )
        self.upstream_prompt = Counter(
            "ctxwarden_proxy_upstream_prompt_tokens",
            "Prompt tokens the upstream reported in usage.",
            registry=r,
        )
        self.upstream_cached = Counter(
            "ctxwarden_proxy_upstream_cached_tokens",
            "Prompt tokens the upstream reported read from its prompt cache.",
            registry=r,
        )
        self.memory_blocks = Counter(
            "ctxwarden_proxy_memory_blocks",
            "Memory blocks inserted, by whether the previous block was kept for the cache.",
            ["kept"],
            registry=r,
        )

    def observe_usage(self, usage: Any) -> None:
        """Count the upstream's reported prompt and cached tokens."""
        prompt = prompt_tokens(usage)
        if prompt is not None:
            self.upstream_prompt.inc(prompt)
        cached = cached_tokens(usage)
        if cached is not None:
            self.upstream_cached.inc(cached)
