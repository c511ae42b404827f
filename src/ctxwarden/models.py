"""Which tokenizer, context window and chat format a model has: :class:`ModelSpec` and the registry.

>>> spec = default_registry().resolve("openai/gpt-4o-2024-08-06")
>>> (spec.name, spec.tokenizer, spec.window, spec.chat_format)
('gpt-4o', 'o200k_base', 128000, 'openai')

Resolution is case-insensitive: the exact name or alias, else the longest registered name that is
a prefix of the model id ending at a separator (``-``, ``:``, ``_``, ``@``, ``/``, space), tried
on the whole id and on its last path segment ("Qwen/Qwen2.5-7B-Instruct" -> "qwen2.5-7b-instruct"
-> "qwen2.5"). Windows are the published native context lengths; where a model can be stretched
(YaRN), the native one is used, because the smaller window is the one that never overflows.

Resolution never refuses: a model no entry matches gets :func:`fallback_spec` (the ``approx``
tokenizer, o200k_base times a measured factor, and a conservative 8,192-token window), logged
once per name and flagged in the context's report. ``tokenizer=`` and ``window=`` override what
the registry says, for any model:

>>> spec = default_registry().resolve("my-finetune", tokenizer="qwen", window=32768)
>>> (spec.tokenizer, spec.window, spec.registered)
('qwen', 32768, False)
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ctxwarden.chatformats import CHAT_FORMATS
from ctxwarden.errors import ConfigError, InputError
from ctxwarden.tokenizers import GGUF_PREFIX, TOKENIZER_NAMES
from ctxwarden.vocabs import FACTORS

__all__ = [
    "DEFAULT_SPECS",
    "FALLBACK_WINDOW",
    "ModelRegistry",
    "ModelSpec",
    "default_registry",
    "fallback_spec",
    "known_tokenizer",
    "remote_tokenizer",
]

logger = logging.getLogger(__name__)

#: The window assumed for a model the registry does not know: small enough for every chat model
#: in use (the smallest common served context), because overflowing is the failure that costs a
#: request; name ``window=`` (or let the proxy ask the server) for more.
FALLBACK_WINDOW = 8192

_SEPARATORS = frozenset("-:_@/ ")
_FIELDS = ("name", "tokenizer", "window", "chat_format", "max_output", "notes", "aliases")


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    """A model's tokenizer (a ``TOKENIZER_NAMES`` entry), window, chat format and reply reserve.

    >>> ModelSpec.from_mapping({"name": "my-qwen", "tokenizer": "qwen", "window": 65536,
    ...                         "chat_format": "chatml"}).max_output
    4096
    """

    name: str
    tokenizer: str
    window: int
    chat_format: str
    max_output: int = 4096
    notes: str = ""
    aliases: tuple[str, ...] = ()
    #: False for a spec made up for a model the registry does not know, or changed by a
    #: ``tokenizer=`` / ``window=`` argument.
    registered: bool = True

    def __post_init__(self) -> None:
        _validate(self)

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], *, where: str = "model") -> ModelSpec:
        """Build a spec from a config mapping (e.g. a TOML table), naming bad fields.

        ``where`` prefixes field names in errors (``models.my-qwen.window: ...``).
        """
        if not isinstance(data, Mapping):
            raise ConfigError(f"{where}: must be a table of fields, got {type(data).__name__}")
        unknown = sorted(set(data) - set(_FIELDS))
        if unknown:
            raise ConfigError(
                f"{where}: unknown field(s) {', '.join(unknown)}; known are {', '.join(_FIELDS)}"
            )
        for required in ("name", "tokenizer", "window", "chat_format"):
            if required not in data:
                raise ConfigError(f"{where}.{required}: missing (required)")
        aliases = data.get("aliases", ())
        if isinstance(aliases, str) or not all(isinstance(a, str) for a in aliases):
            raise ConfigError(f"{where}.aliases: must be a list of strings")
        return _build(where, {**data, "aliases": tuple(aliases)})


def _build(where: str, fields: dict[str, Any]) -> ModelSpec:
    try:
        return ModelSpec(**fields)
    except ConfigError as exc:
        raise ConfigError(f"{where}.{exc}") from None


def _validate(spec: ModelSpec) -> None:
    # Messages start with the field name so from_mapping can prefix where the table came from.
    if not isinstance(spec.name, str) or not spec.name.strip():
        raise ConfigError("name: must be a non-empty string")
    if not known_tokenizer(spec.tokenizer):
        raise ConfigError(
            f"tokenizer: unknown tokenizer {spec.tokenizer!r}; "
            f"known are {', '.join(TOKENIZER_NAMES)}, or {GGUF_PREFIX}<path to a .gguf file>"
        )
    gguf_path = spec.tokenizer.strip()[len(GGUF_PREFIX) :]
    if spec.tokenizer.strip().lower().startswith(GGUF_PREFIX) and not (
        Path(gguf_path).expanduser().is_file()
    ):
        raise ConfigError(f"tokenizer: no GGUF model file at {gguf_path!r}")
    if isinstance(spec.window, bool) or not isinstance(spec.window, int) or spec.window <= 0:
        raise ConfigError(f"window: must be a positive integer of tokens, got {spec.window!r}")
    if spec.chat_format not in CHAT_FORMATS:
        raise ConfigError(
            f"chat_format: unknown format {spec.chat_format!r}; known are {', '.join(CHAT_FORMATS)}"
        )
    output = spec.max_output
    if isinstance(output, bool) or not isinstance(output, int) or not 0 <= output < spec.window:
        raise ConfigError(
            f"max_output: must be an integer from 0 to below the window ({spec.window}), "
            f"got {output!r}"
        )
    if not isinstance(spec.notes, str):
        raise ConfigError("notes: must be a string")


def known_tokenizer(name: object) -> bool:
    """Whether ``name`` is a ``TOKENIZER_NAMES`` entry or ``gguf:<path>`` (case-insensitive)."""
    if not isinstance(name, str):
        return False
    key = name.strip().lower()
    return key in TOKENIZER_NAMES or (key.startswith(GGUF_PREFIX) and len(key) > len(GGUF_PREFIX))


def fallback_spec(
    model: str, *, tokenizer: str | None = None, window: int | None = None
) -> ModelSpec:
    """The spec a model the registry does not know gets (see the module docstring); its notes
    say what was assumed (what ``tokenizer`` / ``window`` did not name)."""
    name = model.strip() if isinstance(model, str) and model.strip() else "unknown"
    assumed = []
    if tokenizer is None:
        assumed.append(f"tokens approximated (o200k_base x{FACTORS['approx']:g})")
    if window is None:
        assumed.append(f"window {FALLBACK_WINDOW} assumed")
    size = window or FALLBACK_WINDOW
    return ModelSpec(
        name=name,
        tokenizer=tokenizer or "approx",
        window=size,
        chat_format="chatml",
        max_output=min(1024, size // 4),
        notes=(
            f"model {name!r} is not in the registry: {', '.join(assumed)}; name tokenizer= and "
            "window= or register the model"
            if assumed
            else ""
        ),
        registered=False,
    )


def _check_tokenizer(tokenizer: object) -> str:
    if not isinstance(tokenizer, str) or not known_tokenizer(tokenizer):
        raise InputError(
            f"unknown tokenizer {tokenizer!r}; known are {', '.join(TOKENIZER_NAMES)}, "
            f"or {GGUF_PREFIX}<path to a .gguf model file>",
            field="tokenizer",
        )
    key = tokenizer.strip()
    if not key.lower().startswith(GGUF_PREFIX):
        return key.lower()
    path = key[len(GGUF_PREFIX) :]
    if not Path(path).expanduser().is_file():
        raise InputError(f"no GGUF model file at {path!r}", field="tokenizer")
    return GGUF_PREFIX + path


def remote_tokenizer(tokenizer: str | None) -> str | None:
    """``tokenizer`` as a network client may name it: no ``gguf:`` paths (a server reads only
    the files its operator configured, in ``[[models]]``); other names pass unchanged, to be
    checked by :meth:`ModelRegistry.resolve`. Used by the HTTP API, MCP and the proxy's header.

    >>> remote_tokenizer("gguf:/etc/passwd")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ctxwarden.errors.InputError: field 'tokenizer': gguf: paths are accepted only from ...
    """
    if isinstance(tokenizer, str) and tokenizer.strip().lower().startswith(GGUF_PREFIX):
        raise InputError(
            "gguf: paths are accepted only from the server's configuration ([[models]] entries); "
            "name a built-in tokenizer",
            field="tokenizer",
        )
    return tokenizer


def _check_window(window: object) -> int:
    if isinstance(window, bool) or not isinstance(window, int) or window <= 0:
        raise InputError(f"must be a positive integer of tokens, got {window!r}", field="window")
    return window


class ModelRegistry:
    """Model specs by name and alias; :meth:`resolve` finds the spec for a model id.

    Registering a name that exists replaces it (users override the defaults).
    """

    def __init__(self, specs: tuple[ModelSpec, ...] = ()) -> None:
        self._lock = threading.Lock()
        self._by_key: dict[str, ModelSpec] = {}
        self._warned: set[str] = set()
        for spec in specs:
            self.register(spec)

    def register(self, spec: ModelSpec) -> None:
        """Add or replace ``spec`` under its name and aliases (case-insensitive)."""
        if not isinstance(spec, ModelSpec):
            raise ConfigError(f"register: expected a ModelSpec, got {type(spec).__name__}")
        with self._lock:
            for key in (spec.name, *spec.aliases):
                self._by_key[key.strip().lower()] = spec

    def __iter__(self) -> Iterator[ModelSpec]:
        seen: dict[str, ModelSpec] = {}
        for spec in self._by_key.values():
            seen.setdefault(spec.name, spec)
        return iter(seen.values())

    def __contains__(self, model: object) -> bool:
        return isinstance(model, str) and self.lookup(model) is not None

    def resolve(
        self, model: str, *, tokenizer: str | None = None, window: int | None = None
    ) -> ModelSpec:
        """The spec for ``model``; never refuses a name.

        The registered spec (exact name or alias, then the longest prefix match), else
        :func:`fallback_spec` (logged once per name). ``tokenizer`` (a ``TOKENIZER_NAMES`` entry
        or ``gguf:<path>``) and ``window`` (tokens) replace the spec's; with ``window``, the
        reply reserve is capped at a quarter of it. Bad values raise :class:`InputError`
        naming the field.

        >>> default_registry().resolve("qwen2.5:7b").name
        'qwen2.5'
        >>> default_registry().resolve("claude-sonnet-4-5-20250929").window
        200000
        """
        checked_tokenizer = None if tokenizer is None else _check_tokenizer(tokenizer)
        checked_window = None if window is None else _check_window(window)
        spec = self.lookup(model)
        if spec is None:
            spec = fallback_spec(model, tokenizer=checked_tokenizer, window=checked_window)
            if spec.notes:
                self._warn_once(spec)
            return spec
        if checked_tokenizer is None and checked_window is None:
            return spec
        size = checked_window if checked_window is not None else spec.window
        return dataclasses.replace(
            spec,
            tokenizer=checked_tokenizer or spec.tokenizer,
            window=size,
            max_output=min(spec.max_output, size // 4),
            registered=False,
        )

    def _warn_once(self, spec: ModelSpec) -> None:
        key = spec.name.lower()
        with self._lock:
            if key in self._warned or len(self._warned) > 10_000:
                return
            self._warned.add(key)
        logger.warning("%s", spec.notes)

    def lookup(self, model: str) -> ModelSpec | None:
        """The registered spec for ``model`` (exact name or alias, then the longest prefix
        match), or None."""
        key = model.strip().lower() if isinstance(model, str) else ""
        candidates = [key]
        if "/" in key:
            candidates.append(key.rsplit("/", 1)[1])
        with self._lock:
            table = dict(self._by_key)
        for candidate in candidates:
            if candidate in table:
                return table[candidate]
        for candidate in candidates:
            best = ""
            for name in table:
                if (
                    len(name) > len(best)
                    and candidate.startswith(name)
                    and (len(candidate) == len(name) or candidate[len(name)] in _SEPARATORS)
                ):
                    best = name
            if best:
                return table[best]
        return None


def _spec(
    name: str,
    tokenizer: str,
    window: int,
    chat_format: str,
    max_output: int = 4096,
    notes: str = "",
    *aliases: str,
) -> ModelSpec:
    return ModelSpec(
        name=name,
        tokenizer=tokenizer,
        window=window,
        chat_format=chat_format,
        max_output=max_output,
        notes=notes,
        aliases=aliases,
    )


_OPENAI = (
    _spec("gpt-4o", "o200k_base", 128000, "openai", 16384, "", "chatgpt-4o-latest"),
    _spec("gpt-4o-mini", "o200k_base", 128000, "openai", 16384),
    _spec("gpt-4.1", "o200k_base", 1047576, "openai", 32768),
    _spec("gpt-4.1-mini", "o200k_base", 1047576, "openai", 32768),
    _spec("gpt-4.1-nano", "o200k_base", 1047576, "openai", 32768),
    _spec("gpt-4.5-preview", "o200k_base", 128000, "openai", 16384),
    _spec("gpt-5", "o200k_base", 400000, "openai", 128000, "272k input + 128k output"),
    _spec("o1", "o200k_base", 200000, "openai", 100000, "reasoning tokens count as output"),
    _spec("o1-mini", "o200k_base", 128000, "openai", 65536),
    _spec("o1-preview", "o200k_base", 128000, "openai", 32768),
    _spec("o3", "o200k_base", 200000, "openai", 100000, "reasoning tokens count as output"),
    _spec("o3-mini", "o200k_base", 200000, "openai", 100000),
    _spec("o4-mini", "o200k_base", 200000, "openai", 100000),
    _spec("gpt-4", "cl100k_base", 8192, "openai", 2048, "published max output 8192 = window"),
    _spec("gpt-4-32k", "cl100k_base", 32768, "openai", 4096),
    _spec("gpt-4-turbo", "cl100k_base", 128000, "openai", 4096, "", "gpt-4-1106-preview"),
    _spec("gpt-4-0125-preview", "cl100k_base", 128000, "openai", 4096),
    _spec("gpt-3.5-turbo", "cl100k_base", 16385, "openai", 4096, "0125 and later; older 4096"),
)
_YARN = "native window; 131072 with YaRN rope scaling (register your own spec for it)"
_QWEN = (
    _spec("qwen2.5", "qwen", 32768, "qwen2.5", 4096, _YARN, "qwen2.5-coder", "qwen2"),
    _spec("qwen2.5-7b-instruct-1m", "qwen", 1010000, "qwen2.5", 8192),
    _spec("qwen2.5-14b-instruct-1m", "qwen", 1010000, "qwen2.5", 8192),
    _spec("qwq", "qwen", 131072, "chatml", 32768, "QwQ-32B"),
    _spec("qwen3", "qwen", 32768, "chatml", 4096, _YARN),
    _spec("qwen3-4b-instruct-2507", "qwen", 262144, "chatml", 16384),
    _spec("qwen3-4b-thinking-2507", "qwen", 262144, "chatml", 32768),
    _spec("qwen3-30b-a3b-instruct-2507", "qwen", 262144, "chatml", 16384),
    _spec("qwen3-30b-a3b-thinking-2507", "qwen", 262144, "chatml", 32768),
    _spec("qwen3-235b-a22b-instruct-2507", "qwen", 262144, "chatml", 16384),
    _spec("qwen3-235b-a22b-thinking-2507", "qwen", 262144, "chatml", 32768),
    _spec("qwen3-coder", "qwen", 262144, "chatml", 16384),
    _spec("qwen3-next", "qwen", 262144, "chatml", 16384),
    _spec("qwen3-vl", "qwen", 262144, "chatml", 16384, "256k native, 1M with scaling"),
    _spec("qwen3-vl-2b", "qwen", 262144, "chatml", 16384, "256k native, 1M with scaling"),
)
_LLAMA = (
    _spec("llama3", "llama3", 8192, "llama3", 2048, "Llama 3 (8B, 70B)", "llama-3", "meta-llama-3"),
    _spec("llama3.1", "llama3", 131072, "llama3", 4096, "", "llama-3.1", "meta-llama-3.1"),
    _spec("llama3.2", "llama3", 131072, "llama3", 4096, "", "llama-3.2", "meta-llama-3.2"),
    _spec("llama3.3", "llama3", 131072, "llama3", 4096, "", "llama-3.3", "meta-llama-3.3"),
)
_GEMMA_NOTE = "approximated (x1.3, measured on Gemma 3's real tokenizer); exact: tokenizer=gguf:"
_GEMMA = (
    _spec("gemma-3", "gemma3", 131072, "gemma", 8192, _GEMMA_NOTE, "gemma3"),
    _spec("gemma-3-1b", "gemma3", 32768, "gemma", 4096, _GEMMA_NOTE, "gemma3:1b", "gemma3-1b"),
    _spec("gemma-3-270m", "gemma3", 32768, "gemma", 4096, _GEMMA_NOTE, "gemma3:270m"),
    _spec("gemma-3n", "gemma3", 32768, "gemma", 4096, _GEMMA_NOTE, "gemma3n"),
    _spec("gemma-2", "gemma2", 8192, "gemma", 2048, "approximated (generic x1.6)", "gemma2"),
    _spec("gemma", "gemma2", 8192, "gemma", 2048, "Gemma 1; approximated (generic x1.6)"),
)
_APPROX = "no public tokenizer: approximated (x2.0, measured on the Claude 2-era tokenizer)"
_CLAUDE = (
    _spec("claude", "claude", 200000, "openai", 8192, _APPROX),
    _spec("claude-3-haiku", "claude", 200000, "openai", 4096, _APPROX),
    _spec("claude-3-opus", "claude", 200000, "openai", 4096, _APPROX),
    _spec("claude-3-5-haiku", "claude", 200000, "openai", 8192, _APPROX, "claude-3.5-haiku"),
    _spec("claude-3-5-sonnet", "claude", 200000, "openai", 8192, _APPROX, "claude-3.5-sonnet"),
    _spec("claude-3-7-sonnet", "claude", 200000, "openai", 64000, _APPROX, "claude-3.7-sonnet"),
    _spec("claude-sonnet-4", "claude", 200000, "openai", 64000, "1M in beta; " + _APPROX),
    _spec("claude-sonnet-4-5", "claude", 200000, "openai", 64000, "1M in beta; " + _APPROX),
    _spec("claude-opus-4", "claude", 200000, "openai", 32000, _APPROX),
    _spec("claude-opus-4-1", "claude", 200000, "openai", 32000, _APPROX),
    _spec("claude-opus-4-5", "claude", 200000, "openai", 64000, _APPROX),
    _spec("claude-haiku-4-5", "claude", 200000, "openai", 64000, _APPROX),
)
_GEMINI_NOTE = "approximated (x1.3, measured on Gemma 3, which shares Gemini's vocabulary)"
_GEMINI = (
    _spec("gemini", "gemini", 1048576, "openai", 8192, _GEMINI_NOTE),
    _spec("gemini-1.5-pro", "gemini", 2097152, "openai", 8192, _GEMINI_NOTE),
    _spec("gemini-1.5-flash", "gemini", 1048576, "openai", 8192, _GEMINI_NOTE),
    _spec("gemini-2.0-flash", "gemini", 1048576, "openai", 8192, _GEMINI_NOTE),
    _spec("gemini-2.5-pro", "gemini", 1048576, "openai", 65536, _GEMINI_NOTE),
    _spec("gemini-2.5-flash", "gemini", 1048576, "openai", 65536, _GEMINI_NOTE),
    _spec("gemini-2.5-flash-lite", "gemini", 1048576, "openai", 65536, _GEMINI_NOTE),
    _spec("gemini-3-pro", "gemini", 1048576, "openai", 65536, _GEMINI_NOTE),
)
_DEEPSEEK_NOTE = "exact with ctxwarden[deepseek] (the V4 tokenizer file; V3/R1 share its 128k BPE)"
_DEEPSEEK = (
    _spec("deepseek", "deepseek", 131072, "chatml", 8192, _DEEPSEEK_NOTE, "deepseek-chat"),
    _spec("deepseek-v3", "deepseek", 131072, "chatml", 8192, _DEEPSEEK_NOTE, "deepseek-v3.1"),
    _spec("deepseek-r1", "deepseek", 131072, "chatml", 32768, _DEEPSEEK_NOTE, "deepseek-reasoner"),
    _spec("deepseek-v4", "deepseek", 1048576, "chatml", 32768, _DEEPSEEK_NOTE),
    # Ollama's small deepseek-r1 tags are the distilled Qwen and Llama models.
    _spec(
        "deepseek-r1-distill-qwen",
        "qwen",
        131072,
        "chatml",
        32768,
        "Qwen base",
        *("deepseek-r1:1.5b", "deepseek-r1:7b", "deepseek-r1:8b"),
        *("deepseek-r1:14b", "deepseek-r1:32b", "deepseek-r1-0528-qwen3-8b"),
    ),
    _spec(
        "deepseek-r1-distill-llama", "llama3", 131072, "llama3", 32768, "Llama 3", "deepseek-r1:70b"
    ),
    _spec("deepseek-coder-v2", "deepseek", 131072, "chatml", 8192, _DEEPSEEK_NOTE),
)
_PHI3 = "Llama 2's 32k SentencePiece: approximated (x2.05, +1 per CJK character)"
_PHI = (
    _spec("phi-3", "phi3", 4096, "chatml", 1024, _PHI3, "phi3"),
    _spec("phi-3-mini-128k", "phi3", 131072, "chatml", 4096, _PHI3, "phi3:3.8b-mini-128k"),
    _spec("phi-3-medium-128k", "phi3", 131072, "chatml", 4096, _PHI3),
    _spec("phi-3.5", "phi3", 131072, "chatml", 4096, _PHI3, "phi3.5"),
    _spec("phi-4", "cl100k_base", 16384, "chatml", 4096, "tiktoken cl100k (Phi-4 report)", "phi4"),
    _spec("phi-4-mini", "o200k_base", 131072, "chatml", 4096, "o200k vocabulary", "phi4-mini"),
    _spec("phi-4-reasoning", "cl100k_base", 32768, "chatml", 8192, "", "phi4-reasoning"),
)
_GPT_OSS = (
    _spec("gpt-oss", "o200k_harmony", 131072, "harmony", 32768, "", "gpt-oss-20b", "gpt-oss-120b"),
)
_LLAMA4_NOTE = "202k vocabulary not runnable offline: approximated (x1.6); exact: tokenizer=gguf:"
_LLAMA4 = (
    _spec("llama4", "llama4", 10485760, "llama3", 8192, "Scout 10M; " + _LLAMA4_NOTE, "llama-4"),
    _spec("llama-4-scout", "llama4", 10485760, "llama3", 8192, _LLAMA4_NOTE, "llama4:scout"),
    _spec("llama-4-maverick", "llama4", 1048576, "llama3", 8192, _LLAMA4_NOTE, "llama4:maverick"),
    _spec("llama2", "phi3", 4096, "mistral", 1024, "Llama 2 vocabulary (as Phi-3)", "llama-2"),
)
_OTHER_NOTE = "tokenizer not runnable offline: approximated (o200k_base x1.6)"
_OTHER = (
    _spec("kimi-k2", "approx", 131072, "chatml", 16384, _OTHER_NOTE),
    _spec("kimi-k2-0905", "approx", 262144, "chatml", 16384, _OTHER_NOTE),
    _spec("glm-4.5", "approx", 131072, "chatml", 16384, _OTHER_NOTE, "glm-4.5-air"),
    _spec("glm-4.6", "approx", 202752, "chatml", 16384, _OTHER_NOTE),
    _spec("command-r", "approx", 131072, "chatml", 4096, _OTHER_NOTE, "command-r-plus"),
    _spec("command-a", "approx", 262144, "chatml", 8192, _OTHER_NOTE),
    _spec("granite3", "approx", 131072, "chatml", 8192, _OTHER_NOTE, "granite-3", "granite3.3"),
    _spec("grok-3", "approx", 131072, "openai", 16384, _OTHER_NOTE, "grok-3-mini"),
    _spec("grok-4", "approx", 256000, "openai", 16384, _OTHER_NOTE),
    _spec("smollm3", "llama3", 65536, "chatml", 4096, "Llama 3 vocabulary"),
    _spec("olmo-2", "approx", 4096, "chatml", 1024, _OTHER_NOTE, "olmo2"),
)
_MISTRAL = (
    _spec(
        "mistral-7b", "mistral-sp-v3", 32768, "mistral", 4096, "v0.3", "mistral", "open-mistral-7b"
    ),
    _spec("mistral-7b-instruct-v0.1", "mistral-sp-v1", 8192, "mistral", 2048),
    _spec("mistral-7b-instruct-v0.2", "mistral-sp-v1", 32768, "mistral", 4096),
    _spec(
        "mixtral-8x7b", "mistral-sp-v1", 32768, "mistral", 4096, "", "mixtral", "open-mixtral-8x7b"
    ),
    _spec("mixtral-8x22b", "mistral-sp-v3", 65536, "mistral", 4096, "", "open-mixtral-8x22b"),
    _spec("mistral-nemo", "mistral-tekken", 128000, "mistral", 4096, "", "open-mistral-nemo"),
    _spec("mistral-small", "mistral-tekken", 32768, "mistral", 4096, "Small 3 (2501)"),
    _spec(
        "mistral-small-2409",
        "mistral-sp-v3",
        32768,
        "mistral",
        4096,
        "",
        "mistral-small-instruct-2409",
    ),
    _spec("mistral-small-3.1", "mistral-tekken", 128000, "mistral", 8192, "", "mistral-small-2503"),
    _spec(
        "mistral-small-3.2",
        "mistral-tekken",
        128000,
        "mistral",
        8192,
        "",
        "mistral-small-2506",
        "mistral-small-latest",
    ),
    _spec("mistral-large", "mistral-sp-v7", 128000, "mistral", 4096, "Large 2.1 (2411)"),
    _spec(
        "mistral-large-2407",
        "mistral-sp-v3",
        131072,
        "mistral",
        4096,
        "",
        "mistral-large-instruct-2407",
    ),
    _spec(
        "mistral-large-2411",
        "mistral-sp-v7",
        128000,
        "mistral",
        4096,
        "",
        "mistral-large-instruct-2411",
    ),
    _spec("ministral-8b", "mistral-tekken", 128000, "mistral", 4096, "", "ministral"),
    _spec("ministral-3b", "mistral-tekken", 128000, "mistral", 4096),
    _spec("pixtral-12b", "mistral-tekken", 128000, "mistral", 4096),
)
DEFAULT_SPECS: tuple[ModelSpec, ...] = (
    *_OPENAI,
    *_QWEN,
    *_LLAMA,
    *_GEMMA,
    *_MISTRAL,
    *_CLAUDE,
    *_GEMINI,
    *_DEEPSEEK,
    *_PHI,
    *_GPT_OSS,
    *_LLAMA4,
    *_OTHER,
)


def default_registry() -> ModelRegistry:
    """A new registry holding the built-in specs (OpenAI, Qwen, Llama, Gemma, Mistral, Claude,
    Gemini, DeepSeek, Phi, gpt-oss and others: README, "Models and tokenizers")."""
    return ModelRegistry(DEFAULT_SPECS)
