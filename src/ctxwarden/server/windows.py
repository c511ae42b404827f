"""Which tokenizer and window a proxied request is fitted to: the served window, any model.

The window is the smallest of what is known:

- the registry's window for the model (:mod:`ctxwarden.models`), or ``X-Ctxwarden-Window``;
- the window the upstream actually serves, asked once per model and cached: llama.cpp's
  ``GET /props`` (``n_ctx``, or ``default_generation_settings.n_ctx``), an OpenAI-style
  ``GET /v1/models`` entry with a window field (vLLM's ``max_model_len``; LM Studio's
  ``loaded_context_length`` / ``max_context_length``; ``context_length``, ``context_window``),
  Ollama's ``POST /api/show`` (``num_ctx`` in its parameters, else the model's
  ``*.context_length``);
- a window learnt from an upstream's "context length exceeded" answer (llama-cpp-python and
  vLLM say ``maximum context length is N``), after which the proxy fits again and retries once.

The tokenizer is ``X-Ctxwarden-Tokenizer`` when sent, else the registry's. A model the registry
does not know is never refused: it is counted with o200k_base times :data:`UNKNOWN_MODEL_FACTOR`
(the over-estimating :class:`~ctxwarden.tokens.FallbackTokenizer`) in the chatml format, with
:data:`UNKNOWN_MODEL_WINDOW` unless the upstream or a header says otherwise, and the report says
so.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ctxwarden import tokens
from ctxwarden.errors import InputError, TokenizerError
from ctxwarden.llm import LLMClient
from ctxwarden.models import ModelRegistry

__all__ = [
    "TOKENIZER_HEADER",
    "UNKNOWN_MODEL_FACTOR",
    "UNKNOWN_MODEL_WINDOW",
    "WINDOW_HEADER",
    "ModelChoice",
    "Windows",
    "served_window_of",
    "window_from_error",
]

TOKENIZER_HEADER = "x-ctxwarden-tokenizer"
WINDOW_HEADER = "x-ctxwarden-window"
#: The over-estimate for a model without a known tokenizer: o200k_base's count times this (the
#: factor measured for the Gemma fallback, see ctxwarden.tokens.GEMMA_FALLBACK_FACTOR).
UNKNOWN_MODEL_FACTOR = tokens.GEMMA_FALLBACK_FACTOR
#: The window assumed for a model nobody names a window for (neither registry, header nor server).
UNKNOWN_MODEL_WINDOW = 32768
#: The reply reserve of a model without a spec.
UNKNOWN_MODEL_MAX_OUTPUT = 4096
_FORMAT_OF_TOKENIZER = (
    ("o200k", "openai"),
    ("cl100k", "openai"),
    ("qwen", "chatml"),
    ("llama3", "llama3"),
    ("gemma", "gemma"),
    ("mistral", "mistral"),
)
_MODEL_FIELDS = (
    "max_model_len",
    "loaded_context_length",
    "context_length",
    "max_context_length",
    "context_window",
)
_ERROR_PATTERNS = (
    re.compile(r"maximum context length is (\d+)"),
    re.compile(r"exceed context window of (\d+)"),
    re.compile(r"context length of (?:only )?(\d+)"),
    re.compile(r"\bn_ctx\W{1,4}(\d+)"),
)


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelChoice:
    """The tokenizer, chat format and window a request is fitted to, and where each came from."""

    model: str
    tokenizer: tokens.Tokenizer
    fmt: tokens.ChatFormat
    window: int
    max_output: int
    window_source: str
    known: bool
    notes: tuple[str, ...]


def _positive(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int) and value > 0:
        return value
    if isinstance(value, str) and value.strip().isdigit() and int(value) > 0:
        return int(value)
    return None


def served_window_of(kind: str, data: Mapping[str, Any], model: str) -> int | None:
    """The served window in one probe's answer (``kind``: ``props``, ``models`` or ``show``)."""
    if kind == "props":
        settings = data.get("default_generation_settings")
        nested = settings.get("n_ctx") if isinstance(settings, Mapping) else None
        return _positive(nested) or _positive(data.get("n_ctx"))
    if kind == "models":
        entries = data.get("data")
        if not isinstance(entries, list):
            return None
        matching = [e for e in entries if isinstance(e, Mapping) and e.get("id") == model]
        if not matching and len(entries) == 1 and isinstance(entries[0], Mapping):
            matching = [entries[0]]
        for entry in matching:
            for name in _MODEL_FIELDS:
                found = _positive(entry.get(name))
                if found:
                    return found
        return None
    parameters = data.get("parameters")
    if isinstance(parameters, str):
        match = re.search(r"(?m)^\s*num_ctx\s+(\d+)", parameters)
        if match and int(match.group(1)) > 0:
            return int(match.group(1))
    info = data.get("model_info")
    if isinstance(info, Mapping):
        for name, value in info.items():
            if isinstance(name, str) and name.endswith(".context_length"):
                found = _positive(value)
                if found:
                    return found
    return None


def window_from_error(detail: str) -> int | None:
    """The window an upstream's context-length error names, if it names one."""
    for pattern in _ERROR_PATTERNS:
        match = pattern.search(detail)
        if match and int(match.group(1)) > 0:
            return int(match.group(1))
    return None


class Windows:
    """Tokenizer and window per request; served windows asked of the upstream once per model."""

    def __init__(self, upstream: LLMClient, registry: ModelRegistry, *, probe: bool = True) -> None:
        self.upstream = upstream
        self.registry = registry
        self.probe = probe
        self._served: dict[str, tuple[int | None, str]] = {}
        self._lock = threading.Lock()
        # one instance: chat formats are cached per tokenizer object
        self._fallback: tokens.Tokenizer | None = None

    def served(self, model: str) -> tuple[int | None, str]:
        """The window the upstream serves ``model`` with and where it was read (cached)."""
        found = self._served.get(model)
        if found is not None:
            return found
        with self._lock:
            found = self._served.get(model)
            if found is None:
                found = self._ask(model) if self.probe else (None, "")
                self._served[model] = found
        return found

    def _ask(self, model: str) -> tuple[int | None, str]:
        asks: tuple[tuple[str, str, str, Mapping[str, Any] | None, bool], ...] = (
            ("props", "GET", "props", None, True),
            ("models", "GET", "models", None, False),
            ("show", "POST", "api/show", {"model": model, "name": model}, True),
        )
        for kind, method, path, body, root in asks:
            data = self.upstream.probe(method, path, body, root=root)
            if data is None:
                continue
            found = served_window_of(kind, data, model)
            if found:
                shown = f"/{path}" if root else f"/v1/{path}"
                return found, f"served ({method} {shown})"
        return None, ""

    def learn(self, model: str, window: int) -> None:
        """Remember a window the upstream named in an error (only ever lowers the window)."""
        with self._lock:
            current, _ = self._served.get(model, (None, ""))
            if current is None or window < current:
                self._served[model] = (window, "served (named in the upstream's error)")

    def choose(self, model: str, headers: Mapping[str, str]) -> ModelChoice:
        """The tokenizer, format and window for ``model`` with the request's headers."""
        notes: list[str] = []
        try:
            spec = self.registry.resolve(model)
        except TokenizerError:
            spec = None
        named_tokenizer = headers.get(TOKENIZER_HEADER, "").strip()
        if named_tokenizer:
            try:
                tok = tokens.get_tokenizer(named_tokenizer)
            except TokenizerError as exc:
                raise InputError(str(exc), field=f"header {TOKENIZER_HEADER}") from None
            fmt_name = spec.chat_format if spec is not None else _format_for(tok.name)
        elif spec is not None:
            tok = tokens.get_tokenizer(spec.tokenizer)
            fmt_name = spec.chat_format
        else:
            if self._fallback is None:
                self._fallback = tokens.FallbackTokenizer(
                    tokens.get_tokenizer("o200k_base"), factor=UNKNOWN_MODEL_FACTOR
                )
            tok = self._fallback
            fmt_name = "chatml"
            notes.append(
                f"unknown model {model!r}: counted with {tok.name} (an over-estimate) in the "
                f"chatml format; name one with the {TOKENIZER_HEADER} header or register it"
            )
        named_window = headers.get(WINDOW_HEADER, "").strip()
        if named_window:
            window = _positive(named_window)
            if window is None:
                raise InputError(
                    f"{named_window!r} must be a positive number of tokens",
                    field=f"header {WINDOW_HEADER}",
                )
            source = "header"
        elif spec is not None:
            window, source = spec.window, "registry"
        else:
            window, source = UNKNOWN_MODEL_WINDOW, "assumed for an unknown model"
            notes.append(f"window {UNKNOWN_MODEL_WINDOW} assumed: name it with {WINDOW_HEADER}")
        served, served_source = self.served(model)
        if served is not None and served < window:
            notes.append(f"window {window} ({source}) lowered to the {served} the upstream serves")
            window, source = served, served_source
        max_output = spec.max_output if spec is not None else UNKNOWN_MODEL_MAX_OUTPUT
        return ModelChoice(
            model=model,
            tokenizer=tok,
            fmt=tokens.get_chat_format(fmt_name, tok),
            window=window,
            max_output=min(max_output, window // 2),
            window_source=source,
            known=spec is not None,
            notes=tuple(notes),
        )


def _format_for(tokenizer: str) -> str:
    for prefix, name in _FORMAT_OF_TOKENIZER:
        if tokenizer.startswith(prefix):
            return name
    return "chatml"
