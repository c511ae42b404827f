"""One small synchronous client for OpenAI-compatible servers (chat and embeddings) over httpx.

Works with llama.cpp's server, Ollama, vLLM and OpenAI. ``base_url`` is the API root including
the version, as the ``openai`` client takes it (``http://127.0.0.1:8080/v1``).

Failures are translated at this boundary into :class:`~ctxwarden.errors.UpstreamError` (or its
:class:`UpstreamStatusError` leaf when the server answered with an error status). Messages name
the method, the URL path and the status, never the API key: the key is kept out of messages,
reprs and logs, and redacted from any upstream text quoted in an error.

Retries: connection failures (refused, reset, connect timeouts, a connection dropped before the
answer), 408, 409, 429 and 5xx are retried up to ``max_retries`` times with exponential backoff
(``backoff * 2**attempt``, capped at ``max_backoff``), or after the server's ``Retry-After`` when
it sends one (capped at ``max_retry_after``). A read timeout is not retried: the request may
still be running upstream, and repeating it would double the load on a server already too slow.

>>> client = LLMClient("http://127.0.0.1:8080/v1", api_key="sk-secret")
>>> client
LLMClient(base_url='http://127.0.0.1:8080/v1', model=None, api_key=***)
"""

from __future__ import annotations

import email.utils
import json
import logging
import math
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any
from urllib.parse import urlsplit

import httpx
import orjson

from ctxwarden.errors import ConfigError, InputError, UpstreamError, UpstreamTimeoutError
from ctxwarden.toolcalls import ToolCall

__all__ = ["ChatResult", "ChunkStream", "LLMClient", "UpstreamStatusError", "Usage"]

logger = logging.getLogger(__name__)

_RETRY_STATUSES = frozenset({408, 409, 429}) | frozenset(range(500, 600))
#: How much of an upstream error body is quoted in an exception message.
_BODY_SNIPPET = 300


class UpstreamStatusError(UpstreamError):
    """The upstream server answered with an error status.

    ``status`` is the HTTP status, ``path`` the URL path asked, ``detail`` the upstream's own
    message (redacted, shortened), so the proxy can pass a client error through as such.
    """

    def __init__(self, message: str, *, status: int, path: str, detail: str) -> None:
        super().__init__(message)
        self.status = status
        self.path = path
        self.detail = detail


@dataclass(frozen=True, kw_only=True)
class Usage:
    """Token usage as the server reported it (None where it did not)."""

    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    total_tokens: int | None = None


@dataclass(frozen=True, kw_only=True)
class ChatResult:
    """The first choice of a chat completion.

    ``text`` is the message content (None when the model only called tools), ``tool_calls`` the
    calls it made (arguments as raw text, unchecked: see :mod:`ctxwarden.toolcalls`), ``raw``
    the whole response body as parsed JSON.
    """

    text: str | None
    tool_calls: tuple[ToolCall, ...]
    finish_reason: str | None
    usage: Usage | None
    model: str | None
    raw: Mapping[str, Any] = field(repr=False)


class ChunkStream:
    """The events of a streamed answer: iterate for each ``data:`` payload (JSON text) until
    ``[DONE]``; close it (or use it as a context manager) to free the connection. ``body`` is
    the whole answer when the server did not stream (it then yields no events)."""

    def __init__(
        self, response: httpx.Response, shown: str, *, body: dict[str, Any] | None = None
    ) -> None:
        self._response = response
        self._shown = shown
        self.body = body

    def __iter__(self) -> Iterator[str]:
        if self.body is not None:
            return
        try:
            for line in self._response.iter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    return
                yield data
        except httpx.HTTPError as exc:
            raise UpstreamError(
                f"{self._shown}: the stream broke off ({type(exc).__name__})"
            ) from exc

    def close(self) -> None:
        """Close the connection (idempotent)."""
        self._response.close()

    def __enter__(self) -> ChunkStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class LLMClient:
    """A synchronous client for an OpenAI-compatible API.

    Constructing it does no I/O; the connection pool opens on first use. Close it with
    :meth:`close` or use it as a context manager. Thread-safe as httpx's ``Client`` is.

    ``model`` is the default model for :meth:`chat` and :meth:`embeddings`. ``timeout`` is in
    seconds per request attempt.
    """

    def __init__(
        self,
        base_url: str,
        api_key: str | None = None,
        *,
        timeout: float = 30.0,
        max_retries: int = 2,
        model: str | None = None,
        backoff: float = 0.5,
        max_backoff: float = 8.0,
        max_retry_after: float = 60.0,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConfigError(
                f"llm base_url must be an http(s) URL such as http://127.0.0.1:8080/v1, "
                f"got scheme '{parts.scheme}'"
            )
        if not (timeout > 0 and math.isfinite(timeout)):
            raise ConfigError(f"llm timeout must be a positive number of seconds, got {timeout}")
        if max_retries < 0:
            raise ConfigError(f"llm max_retries must be 0 or more, got {max_retries}")
        self._base_url = base_url.rstrip("/")
        # What error messages show: host and port, never user info or a query that might hold a key.
        port = f":{parts.port}" if parts.port else ""
        self._where = f"{parts.hostname}{port}"
        self._base_path = parts.path.rstrip("/")
        self._api_key = api_key
        self._timeout = timeout
        self._max_retries = max_retries
        self._backoff = backoff
        self._max_backoff = max_backoff
        self._max_retry_after = max_retry_after
        self._headers = dict(headers or {})
        self.model = model
        self._client: httpx.Client | None = None

    def __repr__(self) -> str:
        key = "***" if self._api_key else "None"
        shown = f"{urlsplit(self._base_url).scheme}://{self._where}{self._base_path}"
        return f"LLMClient(base_url={shown!r}, model={self.model!r}, api_key={key})"

    # -- lifecycle

    def _http(self) -> httpx.Client:
        if self._client is None:
            headers = {"Accept": "application/json", **self._headers}
            if self._api_key:
                headers["Authorization"] = f"Bearer {self._api_key}"
            self._client = httpx.Client(
                timeout=httpx.Timeout(self._timeout),
                headers=headers,
                # Never follow redirects: a redirect could carry the key to another host.
                follow_redirects=False,
                trust_env=False,
            )
        return self._client

    def close(self) -> None:
        """Close the connection pool (the client can be used again; it reopens)."""
        if self._client is not None:
            self._client.close()
            self._client = None

    def __enter__(self) -> LLMClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- the API

    def chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        model: str | None = None,
        max_tokens: int | None = None,
        temperature: float | None = 0.0,
        response_format: Mapping[str, Any] | None = None,
        tools: Sequence[Mapping[str, Any]] | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> ChatResult:
        """Ask for one chat completion (``POST {base_url}/chat/completions``, not streamed).

        ``extra`` adds other request fields (``stop``, ``tool_choice``, ``seed``...). Raises
        :class:`UpstreamError` when the server fails or answers without a usable choice.
        """
        body: dict[str, Any] = dict(extra or {})
        body.update(
            {"model": self._model(model), "messages": [dict(m) for m in messages], "stream": False}
        )
        if max_tokens is not None:
            body["max_tokens"] = max_tokens
        if temperature is not None:
            body["temperature"] = temperature
        if response_format is not None:
            body["response_format"] = dict(response_format)
        if tools:
            body["tools"] = [dict(t) for t in tools]
        data = self.post("chat/completions", body)
        return _chat_result(data, self._bad_body)

    def stream(
        self, path: str, body: Mapping[str, Any], *, headers: Mapping[str, str] | None = None
    ) -> ChunkStream:
        """POST ``body`` and read the answer as server-sent events (``"stream": true`` bodies).

        The request is sent and its status checked before this returns (an error status raises
        :class:`UpstreamStatusError`, as :meth:`request` does); iterate the result for each
        event's JSON text, until ``[DONE]``, and close it when done. Not retried: a stream
        cannot be resumed, and the caller has usually started answering its own client.
        ``headers`` are added to this request's.
        """
        url = f"{self._base_url}/{path.lstrip('/')}"
        shown = f"POST {self._base_path}/{path.lstrip('/')} at {self._where}"
        http = self._http()
        try:
            response = http.send(
                http.build_request(
                    "POST",
                    url,
                    content=_json_bytes(body),
                    headers={
                        **(headers or {}),
                        "Accept": "text/event-stream",
                        "Content-Type": "application/json",
                    },
                ),
                stream=True,
            )
        except httpx.TimeoutException as exc:
            raise UpstreamTimeoutError(f"{shown}: no answer within {self._timeout:g}s") from exc
        except httpx.HTTPError as exc:
            raise UpstreamError(
                f"{shown}: cannot reach the server ({type(exc).__name__}: "
                f"{self._redact(str(exc))}); check that it is running and the base_url is right"
            ) from exc
        if response.status_code >= 300:
            response.read()
            response.close()
            detail = self._detail(response)
            raise UpstreamStatusError(
                f"{shown}: status {response.status_code}: {detail}; {_hint(response.status_code)}",
                status=response.status_code,
                path=f"{self._base_path}/{path.lstrip('/')}",
                detail=detail,
            )
        if response.headers.get("content-type", "").startswith("application/json"):
            # a server that ignores "stream": its whole answer at once
            response.read()
            response.close()
            try:
                data = response.json()
            except ValueError as exc:
                raise self._bad_body(path, "the body is not JSON") from exc
            if not isinstance(data, dict):
                raise self._bad_body(path, "the body is not a JSON object")
            return ChunkStream(response, shown, body=data)
        return ChunkStream(response, shown)

    def embeddings(self, texts: Sequence[str], *, model: str | None = None) -> list[list[float]]:
        """Embed ``texts`` (``POST {base_url}/embeddings``), one vector per text, in order."""
        if not texts:
            return []
        data = self.post("embeddings", {"model": self._model(model), "input": list(texts)})
        items = data.get("data")
        if not isinstance(items, list) or len(items) != len(texts):
            raise self._bad_body("embeddings", f"expected {len(texts)} embeddings in 'data'")
        vectors: list[list[float] | None] = [None] * len(texts)
        for position, item in enumerate(items):
            index = item.get("index", position) if isinstance(item, Mapping) else None
            vector = item.get("embedding") if isinstance(item, Mapping) else None
            if (
                not isinstance(index, int)
                or not 0 <= index < len(texts)
                or not isinstance(vector, list)
                or not all(isinstance(x, int | float) and not isinstance(x, bool) for x in vector)
            ):
                raise self._bad_body("embeddings", f"item {position} is not an embedding")
            vectors[index] = [float(x) for x in vector]
        if any(v is None for v in vectors):
            raise self._bad_body("embeddings", "some inputs got no embedding")
        return [v for v in vectors if v is not None]

    def models(self) -> list[str]:
        """The ids of the models the server lists (``GET {base_url}/models``)."""
        data = self.request("GET", "models")
        items = data.get("data")
        if not isinstance(items, list):
            raise self._bad_body("models", "expected a 'data' list")
        return [str(m["id"]) for m in items if isinstance(m, Mapping) and "id" in m]

    def post(
        self, path: str, body: Mapping[str, Any], *, headers: Mapping[str, str] | None = None
    ) -> dict[str, Any]:
        """POST ``body`` as JSON to ``{base_url}/{path}`` with retries; the JSON object answered."""
        return self.request("POST", path, body, headers=headers)

    def request(
        self,
        method: str,
        path: str,
        body: Mapping[str, Any] | None = None,
        *,
        root: bool = False,
        timeout: float | None = None,
        retries: int | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> dict[str, Any]:
        """Send one request with retries and return the JSON object answered.

        ``path`` is relative to ``base_url`` (``"chat/completions"``), or with ``root`` to the
        server's root, ``base_url`` less a trailing ``/v1`` (llama.cpp's ``/props``, Ollama's
        ``/api/show``). ``timeout`` and ``retries`` override the client's for this request;
        ``headers`` are added to this request's. The body is serialised once, with orjson (a
        10 MB conversation in milliseconds). Raises :class:`UpstreamStatusError` for an error
        status and :class:`UpstreamError` for everything else that goes wrong.
        """
        content = None if body is None else _json_bytes(body)
        sent_headers = dict(headers or {})
        if content is not None:
            sent_headers["Content-Type"] = "application/json"
        base, base_path = self._base_url, self._base_path
        if root:
            base, base_path = base.removesuffix("/v1"), base_path.removesuffix("/v1")
        url = f"{base}/{path.lstrip('/')}"
        shown = f"{method} {base_path}/{path.lstrip('/')} at {self._where}"
        max_retries = self._max_retries if retries is None else retries
        attempt = 0
        while True:
            try:
                response = self._http().request(
                    method,
                    url,
                    content=content,
                    headers=sent_headers,
                    timeout=httpx.USE_CLIENT_DEFAULT if timeout is None else timeout,
                )
            except (httpx.ConnectError, httpx.ConnectTimeout, httpx.RemoteProtocolError) as exc:
                if attempt < max_retries:
                    wait = self._backoff_for(attempt)
                    logger.warning(
                        "%s: %s; retry %d/%d in %.2fs",
                        shown,
                        type(exc).__name__,
                        attempt + 1,
                        max_retries,
                        wait,
                    )
                    time.sleep(wait)
                    attempt += 1
                    continue
                raise UpstreamError(
                    f"{shown}: cannot reach the server ({type(exc).__name__}: "
                    f"{self._redact(str(exc))}) after {attempt + 1} attempt(s); "
                    "check that it is running and the base_url is right"
                ) from exc
            except httpx.TimeoutException as exc:
                raise UpstreamTimeoutError(
                    f"{shown}: no answer within {timeout or self._timeout:g}s "
                    f"({type(exc).__name__}); "
                    "raise the timeout or use a faster model"
                ) from exc
            except httpx.HTTPError as exc:
                raise UpstreamError(
                    f"{shown}: request failed ({type(exc).__name__}: {self._redact(str(exc))})"
                ) from exc

            status = response.status_code
            if status in _RETRY_STATUSES and attempt < max_retries:
                after = self._retry_after(response)
                wait = self._backoff_for(attempt) if after is None else after
                logger.warning(
                    "%s: status %d; retry %d/%d in %.2fs",
                    shown,
                    status,
                    attempt + 1,
                    max_retries,
                    wait,
                )
                response.close()
                time.sleep(wait)
                attempt += 1
                continue
            if status >= 300:
                detail = self._detail(response)
                hint = _hint(status)
                raise UpstreamStatusError(
                    f"{shown}: status {status} after {attempt + 1} attempt(s): {detail}; {hint}",
                    status=status,
                    path=f"{base_path}/{path.lstrip('/')}",
                    detail=detail,
                )
            try:
                data = response.json()
            except ValueError as exc:
                raise UpstreamError(
                    f"{shown}: status {status} but the body is not JSON "
                    f"({self._snippet(response.text)!r}); is base_url the API root (…/v1)?"
                ) from exc
            if not isinstance(data, dict):
                raise UpstreamError(f"{shown}: status {status} but the body is not a JSON object")
            return data

    # -- helpers

    def _model(self, model: str | None) -> str:
        chosen = model or self.model
        if not chosen:
            raise ConfigError("no model given: pass model=... to the call or to LLMClient")
        return chosen

    def _backoff_for(self, attempt: int) -> float:
        return float(min(self._max_backoff, self._backoff * (2**attempt)))

    def _retry_after(self, response: httpx.Response) -> float | None:
        value = response.headers.get("retry-after")
        if value is None:
            return None
        seconds: float | None
        try:
            seconds = float(value)
        except ValueError:
            try:
                when = email.utils.parsedate_to_datetime(value)
            except (TypeError, ValueError):
                return None
            seconds = when.timestamp() - time.time()
        if not math.isfinite(seconds):
            return None
        return min(max(seconds, 0.0), self._max_retry_after)

    def _redact(self, text: str) -> str:
        if self._api_key:
            text = text.replace(self._api_key, "***")
        return text

    def _snippet(self, text: str) -> str:
        text = self._redact(text.strip())
        return text if len(text) <= _BODY_SNIPPET else text[:_BODY_SNIPPET] + "…"

    def _detail(self, response: httpx.Response) -> str:
        """The upstream's own error message when it sent the usual ``{"error": ...}`` shape."""
        try:
            data = response.json()
        except ValueError:
            return self._snippet(response.text) or "(empty body)"
        if isinstance(data, Mapping):
            error = data.get("error")
            if isinstance(error, Mapping) and isinstance(error.get("message"), str):
                return self._snippet(error["message"])
            if isinstance(error, str):
                return self._snippet(error)
        return self._snippet(json.dumps(data, ensure_ascii=False))

    def _bad_body(self, path: str, what: str) -> UpstreamError:
        return UpstreamError(f"POST {self._base_path}/{path} at {self._where}: {what}")


def _chat_result(
    data: Mapping[str, Any], bad_body: Callable[[str, str], UpstreamError]
) -> ChatResult:
    """The :class:`ChatResult` of a chat completion body; ``bad_body(path, what)`` is the error
    (:meth:`LLMClient._bad_body`) for a body that is not one."""
    choices = data.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], Mapping):
        raise bad_body("chat/completions", "the answer has no choices")
    choice = choices[0]
    message = choice.get("message")
    if not isinstance(message, Mapping):
        raise bad_body("chat/completions", "the first choice has no message")
    content = message.get("content")
    if content is not None and not isinstance(content, str):
        # Some servers send content parts; join their text.
        if isinstance(content, list):
            content = "".join(str(p.get("text", "")) for p in content if isinstance(p, Mapping))
        else:
            raise bad_body("chat/completions", "message content is not text")
    calls: list[ToolCall] = []
    for entry in message.get("tool_calls") or ():
        if not isinstance(entry, Mapping):
            raise bad_body("chat/completions", "a tool call is not an object")
        try:
            calls.append(ToolCall.from_openai(entry))
        except InputError as exc:
            raise bad_body("chat/completions", f"unreadable tool call: {exc}") from exc
    usage = data.get("usage")
    finish = choice.get("finish_reason")
    model = data.get("model")
    return ChatResult(
        text=content,
        tool_calls=tuple(calls),
        finish_reason=finish if isinstance(finish, str) else None,
        usage=_usage(usage) if isinstance(usage, Mapping) else None,
        model=model if isinstance(model, str) else None,
        raw=data,
    )


def _json_bytes(body: Mapping[str, Any]) -> bytes:
    # orjson: a 10 MB conversation serialises in milliseconds, not the ~50 ms of json.dumps
    return orjson.dumps(body)


def _usage(data: Mapping[str, Any]) -> Usage:
    def number(name: str) -> int | None:
        value = data.get(name)
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    return Usage(
        prompt_tokens=number("prompt_tokens"),
        completion_tokens=number("completion_tokens"),
        total_tokens=number("total_tokens"),
    )


def _hint(status: int) -> str:
    if status in (401, 403):
        return "check the api_key configured for this server"
    if status == 404:
        return "check base_url (it should end in /v1) and the model name"
    if status == 429:
        return "the server is rate limiting: lower the request rate or raise max_retries"
    if status >= 500:
        return "the server failed; check its log"
    if status < 400:
        return "redirects are not followed; point base_url at the final address"
    return "the request was refused; check the model and parameters"
