"""A client for an upstream speaking the Anthropic Messages API (Anthropic or a compatible server).

The same transport as :class:`~ctxwarden.llm.LLMClient` (timeouts, retries, no redirects, the
key kept out of messages and logs), authenticated the Anthropic way: ``x-api-key`` and
``anthropic-version`` headers instead of a bearer token. ``base_url`` includes the version, as
for LLMClient: ``https://api.anthropic.com/v1``.

>>> AnthropicClient("https://api.anthropic.com/v1", api_key="sk-ant-secret")
AnthropicClient(base_url='https://api.anthropic.com/v1', api_key=***, count_tokens=True)
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

import httpx

from ctxwarden.llm import ChunkStream, LLMClient, UpstreamStatusError

__all__ = ["ANTHROPIC_VERSION", "AnthropicClient"]

#: The API version sent unless configured otherwise.
ANTHROPIC_VERSION = "2023-06-01"
#: Request headers of the agent's that reach the upstream (feature flags, never credentials).
FORWARDED_HEADERS = ("anthropic-beta",)


class AnthropicClient(LLMClient):
    """An upstream speaking the Messages API: :meth:`messages`, :meth:`stream_messages`,
    :meth:`count_tokens`.

    ``count_tokens``: whether to ask the upstream's ``/messages/count_tokens`` for exact counts
    (Anthropic serves it; a server answering 404 or 405 to it is remembered as not counting).
    """

    def __init__(
        self,
        base_url: str,
        api_key: str | None = None,
        *,
        version: str = ANTHROPIC_VERSION,
        count_tokens: bool = True,
        timeout: float = 120.0,
        max_retries: int = 2,
    ) -> None:
        super().__init__(base_url, api_key, timeout=timeout, max_retries=max_retries)
        self.version = version
        self._counts = count_tokens
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        key = "***" if self._api_key else "None"
        shown = f"{urlsplit(self._base_url).scheme}://{self._where}{self._base_path}"
        return f"AnthropicClient(base_url={shown!r}, api_key={key}, count_tokens={self._counts})"

    @property
    def counts(self) -> bool:
        """Whether :meth:`count_tokens` is asked (False once the upstream said it has none)."""
        return self._counts

    def _http(self) -> httpx.Client:
        if self._client is None:
            headers = {"Accept": "application/json", "anthropic-version": self.version}
            if self._api_key:
                headers["x-api-key"] = self._api_key
            self._client = httpx.Client(
                timeout=httpx.Timeout(self._timeout),
                headers=headers,
                follow_redirects=False,  # a redirect could carry the key to another host
                trust_env=False,
            )
        return self._client

    def messages(
        self, body: Mapping[str, Any], *, headers: Mapping[str, str] | None = None
    ) -> dict[str, Any]:
        """``POST {base_url}/messages``, not streamed: the message answered."""
        return self.post("messages", body, headers=headers)

    def stream_messages(
        self, body: Mapping[str, Any], *, headers: Mapping[str, str] | None = None
    ) -> ChunkStream:
        """``POST {base_url}/messages`` with ``"stream": true``: its events' JSON texts."""
        request = body if body.get("stream") is True else {**body, "stream": True}
        return self.stream("messages", request, headers=headers)

    def count_tokens(
        self, body: Mapping[str, Any], *, headers: Mapping[str, str] | None = None
    ) -> int | None:
        """The input tokens of ``body`` as the upstream counts them; None when it cannot count
        (then remembered, so it is not asked again)."""
        if not self._counts:
            return None
        fields = ("model", "messages", "system", "tools", "tool_choice", "thinking", "mcp_servers")
        request = {k: body[k] for k in fields if k in body}
        try:
            data = self.post("messages/count_tokens", request, headers=headers)
        except UpstreamStatusError as exc:
            if exc.status in (404, 405, 501):
                with self._lock:
                    self._counts = False
                return None
            raise
        value = data.get("input_tokens")
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return value
        return None
