"""The context window an upstream server actually serves, asked once per model and cached.

A model's published window is not what a server gives it: llama.cpp runs with the ``-c`` it was
started with (split across its parallel slots), vLLM with ``--max-model-len``, Ollama with the
model's ``num_ctx``. Sending more than that is a 400 (llama.cpp, vLLM) or a silently cut prompt
(Ollama). :class:`ServedWindows` asks the upstream, in this order, and takes the first answer:

1. ``GET /v1/models``: vLLM's ``max_model_len``; LM Studio-style ``loaded_context_length`` (the
   loaded model's) or ``max_context_length``, for the entry whose ``id`` is the model (or the
   only entry).
2. ``GET /props`` (llama.cpp's server): ``default_generation_settings.n_ctx`` (one slot's share)
   and ``n_ctx``, the smaller when both are there.
3. Ollama: ``GET /api/ps`` ``context_length`` of the loaded model, else ``POST /api/show``'s
   ``num_ctx`` in ``parameters``, else ``model_info["<architecture>.context_length"]`` (the
   model's own limit: a model neither loaded nor given ``num_ctx`` runs with the server's
   default context, which the API does not report).
4. ``GET /api/v0/models`` (LM Studio's REST API): as 1.

It never raises: an upstream that answers none of these (the OpenAI API, llama-cpp-python's
server) gives None, cached for ``retry_after`` seconds before asking again; a found window is
cached for ``ttl`` seconds (a server restarted with another ``-c`` is noticed then). Thread-safe:
concurrent callers for one model wait for a single round of questions.

    >>> from ctxwarden.llm import LLMClient
    >>> windows = ServedWindows(LLMClient("http://127.0.0.1:9/v1"), timeout=0.2)
    >>> windows.window("qwen3") is None  # nothing listens on port 9
    True
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ctxwarden.llm import LLMClient

__all__ = ["ServedWindows"]

logger = logging.getLogger(__name__)

# Spaces within one line only: ``\s*`` after ``^`` crossed newlines, so a reply of blank lines
# was rescanned from every line (quadratic in the upstream's reply).
_NUM_CTX = re.compile(r"(?m)^[^\S\n]*num_ctx[^\S\n]+(\d+)[^\S\n]*$")


@dataclass
class _Entry:
    window: int | None
    expires: float


def _positive(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    number = int(value)
    return number if number > 0 and number == value else None


def _smallest(*values: Any) -> int | None:
    found = [v for v in (_positive(x) for x in values) if v is not None]
    return min(found) if found else None


def _entry_for(data: Mapping[str, Any], model: str) -> Mapping[str, Any] | None:
    """The model's entry in an OpenAI-style ``{"data": [...]}`` list (or the only one)."""
    items = data.get("data")
    if not isinstance(items, list):
        return None
    entries = [e for e in items if isinstance(e, Mapping)]
    wanted = model.strip().lower()
    for entry in entries:
        if str(entry.get("id", "")).strip().lower() == wanted:
            return entry
    return entries[0] if len(entries) == 1 else None


def _from_model_entry(entry: Mapping[str, Any] | None) -> int | None:
    if entry is None:
        return None
    loaded = _positive(entry.get("loaded_context_length"))
    if loaded is not None:
        return loaded
    return _positive(entry.get("max_model_len")) or _positive(entry.get("max_context_length"))


class ServedWindows:
    """Ask an OpenAI-compatible upstream for the window it serves each model (see the module).

    ``client`` is the proxy's :class:`~ctxwarden.llm.LLMClient` (its ``base_url`` ends in
    ``/v1``; the server-root endpoints are asked with ``root=True``). ``timeout`` bounds each
    question; ``ttl`` and ``retry_after`` are the cache lifetimes of a found window and of
    "no answer", in seconds.
    """

    def __init__(
        self,
        client: LLMClient,
        *,
        timeout: float = 5.0,
        ttl: float = 600.0,
        retry_after: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._client = client
        self._timeout = timeout
        self._ttl = ttl
        self._retry_after = retry_after
        self._clock = clock
        self._lock = threading.Lock()
        self._cache: dict[str, _Entry] = {}
        self._asking: dict[str, threading.Lock] = {}
        self._answered_by: dict[str, str] = {}

    def window(self, model: str) -> int | None:
        """The window the upstream serves ``model`` in tokens, or None when it does not say."""
        key = model.strip().lower() if isinstance(model, str) else ""
        cached = self._cached(key)
        if cached is not None:
            return cached.window
        with self._lock:
            asking = self._asking.setdefault(key, threading.Lock())
        with asking:  # one round of questions per model; the others wait for its answer
            cached = self._cached(key)
            if cached is not None:
                return cached.window
            window = self._ask(model)
            life = self._ttl if window is not None else self._retry_after
            with self._lock:
                self._cache[key] = _Entry(window, self._clock() + life)
            return window

    def answered_by(self, model: str) -> str:
        """Which of the upstream's endpoints said the window of ``model`` ("" if none did)."""
        return self._answered_by.get(model, "")

    def forget(self, model: str | None = None) -> None:
        """Drop the cached answer for ``model`` (all models when None): the next call asks."""
        with self._lock:
            if model is None:
                self._cache.clear()
            else:
                self._cache.pop(model.strip().lower(), None)

    def _cached(self, key: str) -> _Entry | None:
        with self._lock:
            entry = self._cache.get(key)
        if entry is None or entry.expires <= self._clock():
            return None
        return entry

    def _ask(self, model: str) -> int | None:
        probes: tuple[tuple[str, Callable[[str], int | None]], ...] = (
            ("/v1/models", self._openai_models),
            ("/props", self._llamacpp_props),
            ("/api/ps, /api/show", self._ollama),
            ("/api/v0/models", self._lmstudio),
        )
        for name, probe in probes:
            try:
                window = probe(model)
            except Exception as exc:  # never raise: an upstream may answer anything or nothing
                logger.debug("served window of %r: %s: %s", model, name, exc)
                continue
            if window is not None:
                logger.info("upstream serves %r with a %d-token window (%s)", model, window, name)
                self._answered_by[model] = name
                return window
        logger.info("upstream does not say the window it serves %r", model)
        return None

    def _get(self, path: str, *, root: bool) -> dict[str, Any]:
        return self._client.request("GET", path, root=root, timeout=self._timeout, retries=0)

    def _openai_models(self, model: str) -> int | None:
        return _from_model_entry(_entry_for(self._get("models", root=False), model))

    def _llamacpp_props(self, model: str) -> int | None:
        data = self._get("props", root=True)
        settings = data.get("default_generation_settings")
        slot = settings.get("n_ctx") if isinstance(settings, Mapping) else None
        return _smallest(slot, data.get("n_ctx"))

    def _ollama(self, model: str) -> int | None:
        loaded = self._get("api/ps", root=True).get("models")
        for entry in loaded if isinstance(loaded, list) else ():
            if not isinstance(entry, Mapping):
                continue
            names = {str(entry.get(k, "")).lower() for k in ("name", "model")}
            if model.strip().lower() in names and _positive(entry.get("context_length")):
                return _positive(entry.get("context_length"))
        shown = self._client.request(
            "POST", "api/show", {"model": model}, root=True, timeout=self._timeout, retries=0
        )
        parameters = shown.get("parameters")
        if isinstance(parameters, str):
            match = _NUM_CTX.search(parameters)
            if match:
                return _positive(int(match.group(1)))
        info = shown.get("model_info")
        if isinstance(info, Mapping):
            architecture = info.get("general.architecture")
            return _positive(info.get(f"{architecture}.context_length"))
        return None

    def _lmstudio(self, model: str) -> int | None:
        return _from_model_entry(_entry_for(self._get("api/v0/models", root=True), model))
