"""Which tokenizer, context window and chat format a model has: :class:`ModelSpec` and the registry.

>>> spec = default_registry().resolve("openai/gpt-4o-2024-08-06")
>>> (spec.name, spec.tokenizer, spec.window, spec.chat_format)
('gpt-4o', 'o200k_base', 128000, 'openai')

Resolution is case-insensitive: the exact name or alias, else the longest registered name that is
a prefix of the model id ending at a separator (``-``, ``:``, ``_``, ``@``, ``/``, space), tried
on the whole id and on its last path segment ("Qwen/Qwen2.5-7B-Instruct" -> "qwen2.5-7b-instruct"
-> "qwen2.5"). Windows are the published native context lengths; where a model can be stretched
(YaRN), the native one is used, because the smaller window is the one that never overflows.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from ctxwarden.errors import ConfigError, TokenizerError
from ctxwarden.tokens import CHAT_FORMATS, TOKENIZER_NAMES

__all__ = ["DEFAULT_SPECS", "ModelRegistry", "ModelSpec", "default_registry"]

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
    if spec.tokenizer not in TOKENIZER_NAMES:
        raise ConfigError(
            f"tokenizer: unknown tokenizer {spec.tokenizer!r}; "
            f"known are {', '.join(TOKENIZER_NAMES)}"
        )
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


class ModelRegistry:
    """Model specs by name and alias; :meth:`resolve` finds the spec for a model id.

    Registering a name that exists replaces it (users override the defaults).
    """

    def __init__(self, specs: tuple[ModelSpec, ...] = ()) -> None:
        self._lock = threading.Lock()
        self._by_key: dict[str, ModelSpec] = {}
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
        if not isinstance(model, str):
            return False
        try:
            self.resolve(model)
        except TokenizerError:
            return False
        return True

    def resolve(self, model: str) -> ModelSpec:
        """The spec for ``model``: exact name or alias, then the longest prefix match.

        >>> default_registry().resolve("qwen2.5:7b").name
        'qwen2.5'
        """
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
        raise TokenizerError(
            f"no tokenizer known for model {model!r}: pass tokenizer='o200k_base' or register "
            "the model"
        )


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
_GEMMA_NOTE = "no offline tokenizer: counted by an over-estimating fallback"
_GEMMA = (
    _spec("gemma-3", "gemma3", 131072, "gemma", 8192, _GEMMA_NOTE, "gemma3"),
    _spec("gemma-3-1b", "gemma3", 32768, "gemma", 4096, _GEMMA_NOTE, "gemma3:1b", "gemma3-1b"),
    _spec("gemma-3-270m", "gemma3", 32768, "gemma", 4096, _GEMMA_NOTE, "gemma3:270m"),
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
DEFAULT_SPECS: tuple[ModelSpec, ...] = (*_OPENAI, *_QWEN, *_LLAMA, *_GEMMA, *_MISTRAL)


def default_registry() -> ModelRegistry:
    """A new registry holding the built-in specs (OpenAI, Qwen, Llama 3, Gemma 3, Mistral)."""
    return ModelRegistry(DEFAULT_SPECS)
