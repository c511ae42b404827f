"""Which tokenizer and window a proxied request is fitted to: the served window, any model.

The window is the smallest of what is known:

- the registry's window for the model (:mod:`ctxwarden.models`), or ``X-Ctxwarden-Window``;
- the window the upstream actually serves, asked once per model and cached by
  :class:`~ctxwarden.server.served.ServedWindows` (llama.cpp's ``/props``, vLLM's and LM Studio's
  model lists, Ollama's ``/api/ps`` and ``/api/show``);
- a window learnt from an upstream's "context length exceeded" answer (llama-cpp-python and
  vLLM say ``maximum context length is N``), after which the proxy fits again and retries once.

The tokenizer is ``X-Ctxwarden-Tokenizer`` when sent, else the registry's
(:meth:`~ctxwarden.models.ModelRegistry.resolve`). A model the registry does not know is never
refused: the registry counts it with its over-estimating approximation, and the proxy assumes
:data:`UNKNOWN_MODEL_WINDOW` unless the upstream or a header says otherwise (an upstream's
context-length error lowers it); the report says so.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ctxwarden import tokens
from ctxwarden.errors import InputError
from ctxwarden.llm import LLMClient
from ctxwarden.models import ModelRegistry, remote_tokenizer
from ctxwarden.server.served import ServedWindows

__all__ = [
    "TOKENIZER_HEADER",
    "UNKNOWN_MODEL_WINDOW",
    "WINDOW_HEADER",
    "ModelChoice",
    "ServedWindows",
    "Windows",
    "window_from_error",
]

TOKENIZER_HEADER = "x-ctxwarden-tokenizer"
WINDOW_HEADER = "x-ctxwarden-window"
#: The window assumed for a model nobody names a window for (neither registry, header nor server);
#: an upstream that serves less says so in its error, and the proxy fits again.
UNKNOWN_MODEL_WINDOW = 32768
#: The reply reserve of a model without a spec.
UNKNOWN_MODEL_MAX_OUTPUT = 4096
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
        self.registry = registry
        self._served = ServedWindows(upstream) if probe else None
        self._learnt: dict[str, int] = {}
        self._lock = threading.Lock()

    def served(self, model: str) -> tuple[int | None, str]:
        """The window the upstream serves ``model`` with and where it was read (cached)."""
        learnt = self._learnt.get(model)
        if learnt is not None:
            return learnt, "served (named in the upstream's error)"
        if self._served is None:
            return None, ""
        found = self._served.window(model)
        return (found, f"served ({self._served.answered_by(model)})") if found else (None, "")

    def learn(self, model: str, window: int) -> None:
        """Remember a window the upstream named in an error (only ever lowers the window)."""
        with self._lock:
            current, _ = self.served(model)
            if current is None or window < current:
                self._learnt[model] = window

    def choose(self, model: str, headers: Mapping[str, str]) -> ModelChoice:
        """The tokenizer, format and window for ``model`` with the request's headers."""
        notes: list[str] = []
        named_tokenizer = headers.get(TOKENIZER_HEADER, "").strip() or None
        named_window = headers.get(WINDOW_HEADER, "").strip()
        window_override = None
        if named_window:
            window_override = _positive(named_window)
            if window_override is None:
                raise InputError(
                    f"{named_window!r} must be a positive number of tokens",
                    field=f"header {WINDOW_HEADER}",
                )
        try:
            spec = self.registry.resolve(
                model, tokenizer=remote_tokenizer(named_tokenizer), window=window_override
            )
        except InputError as exc:
            header = TOKENIZER_HEADER if exc.field == "tokenizer" else WINDOW_HEADER
            raise InputError(str(exc), field=f"header {header}") from None
        tok = tokens.get_tokenizer(spec.tokenizer)
        if not spec.registered and named_tokenizer is None:
            notes.append(
                f"unknown model {model!r}: counted with {tok.name} (an over-estimate); name its "
                f"tokenizer with the {TOKENIZER_HEADER} header or register it"
            )
        elif not tok.exact:
            notes.append(
                f"{model!r} has no offline tokenizer: counted with {tok.name}, an over-estimate "
                "measured for its family"
            )
        if window_override is not None:
            window, source = window_override, "header"
        elif spec.registered:
            window, source = spec.window, "registry"
        else:
            window, source = UNKNOWN_MODEL_WINDOW, "assumed for an unknown model"
            notes.append(f"window {UNKNOWN_MODEL_WINDOW} assumed: name it with {WINDOW_HEADER}")
        served, served_source = self.served(model)
        if served is not None and served < window:
            notes.append(f"window {window} ({source}) lowered to the {served} the upstream serves")
            window, source = served, served_source
        max_output = spec.max_output if spec.registered else UNKNOWN_MODEL_MAX_OUTPUT
        return ModelChoice(
            model=model,
            tokenizer=tok,
            fmt=tokens.get_chat_format(spec.chat_format, tok),
            window=window,
            max_output=min(max_output, window // 2),
            window_source=source,
            known=spec.registered,
            notes=tuple(notes),
        )
