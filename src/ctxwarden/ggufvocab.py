"""A tokenizer from a GGUF model file's vocabulary: ``get_tokenizer("gguf:/path/to/model.gguf")``.

llama.cpp users have the model file, and the file holds the tokenizer (``tokenizer.ggml.*``
metadata), so counting with it is exact for any model llama.cpp serves. The metadata is read here
directly (the GGUF header and key/value section, stopping before the tensor table), which takes a
fraction of a second where the ``gguf`` package's reader maps every tensor first (~8 s for a 250 MB
file here) and needs no extra dependency; tests check the values against the ``gguf`` package.

Two vocabulary kinds are built into a Hugging Face ``tokenizers`` tokenizer (a core dependency):

- ``llama`` (SentencePiece BPE: Gemma, Llama 2, Phi-3, Mistral v0.1): pieces and scores; the
  merges are derived from the scores (a merge's rank is its result's score), with byte fallback,
  the ``▁`` space escape and the optional dummy prefix, as llama.cpp's SPM tokenizer does.
- ``gpt2`` (byte-level BPE: Llama 3/4, Qwen, DeepSeek, gpt-oss, Phi-4, ...): vocabulary and merges
  as stored, with the pre-tokenizer regex named by ``tokenizer.ggml.pre`` (see ``PRE_PATTERNS``).

Tokens of type USER_DEFINED are matched whole before the BPE, as llama.cpp does even when it does
not parse special tokens; CONTROL tokens (``<bos>``, ``<start_of_turn>``) are plain text there, as
everywhere in ctxwarden. tests/test_gguf_tokenizer.py checks counts against llama.cpp's own
tokenizer (``llama_cpp.Llama(path, vocab_only=True)``).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

from ctxwarden.errors import TokenizerError
from ctxwarden.vocabs import HFTokenizer

__all__ = ["PRE_PATTERNS", "load_gguf", "read_metadata"]

_MAGIC = b"GGUF"
# GGUF value types: id -> (struct format, size); 8 is a string, 9 an array.
_SCALARS = {
    0: ("B", 1),
    1: ("b", 1),
    2: ("H", 2),
    3: ("h", 2),
    4: ("I", 4),
    5: ("i", 4),
    6: ("f", 4),
    7: ("?", 1),
    10: ("Q", 8),
    11: ("q", 8),
    12: ("d", 8),
}
_STRING, _ARRAY = 8, 9
# llama.cpp's token types.
_NORMAL, _UNKNOWN, _CONTROL, _USER_DEFINED, _UNUSED, _BYTE = 1, 2, 3, 4, 5, 6

_LLAMA3 = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2 = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_O200K = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
_DEEPSEEK3 = (
    r"\p{N}{1,3}",
    r"[一-龥぀-ゟ゠-ヿ]+",
    r"[!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+"
    r"| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
)
#: ``tokenizer.ggml.pre`` values (llama.cpp's names) -> the regexes that split text before BPE,
#: applied in order. Others are refused with this list, rather than guessed.
PRE_PATTERNS: dict[str, tuple[str, ...]] = {
    "default": (_GPT2,),
    "gpt2": (_GPT2,),
    "llama3": (_LLAMA3,),
    "llama-bpe": (_LLAMA3,),
    "smollm": (_LLAMA3,),
    "qwen2": (_QWEN2,),
    "qwen35": (_QWEN2,),
    "gpt-4o": (_O200K,),
    "llama4": (_O200K,),
    "deepseek-v3": _DEEPSEEK3,
}


class _Reader:
    def __init__(self, handle: IO[bytes], where: str) -> None:
        self._handle = handle
        self._where = where

    def take(self, size: int) -> bytes:
        data = self._handle.read(size)
        if len(data) != size:
            raise TokenizerError(f"{self._where}: the GGUF file is truncated")
        return data

    def scalar(self, kind: int) -> Any:
        fmt, size = _SCALARS[kind]
        return struct.unpack("<" + fmt, self.take(size))[0]

    def string(self) -> str:
        (length,) = struct.unpack("<Q", self.take(8))
        return self.take(length).decode("utf-8", errors="replace")

    def value(self, kind: int) -> Any:
        if kind == _STRING:
            return self.string()
        if kind == _ARRAY:
            inner, count = struct.unpack("<IQ", self.take(12))
            if inner == _STRING:
                return [self.string() for _ in range(count)]
            if inner in _SCALARS:
                fmt, size = _SCALARS[inner]
                return list(struct.unpack(f"<{count}{fmt}", self.take(size * count)))
            return [self.value(inner) for _ in range(count)]
        if kind in _SCALARS:
            return self.scalar(kind)
        raise TokenizerError(f"{self._where}: unknown GGUF value type {kind}")


def read_metadata(path: str | Path) -> dict[str, Any]:
    """The key/value metadata of a GGUF file (little-endian, versions 2 and 3).

    Arrays come back as lists; the tensor table after the metadata is not read.
    """
    where = str(path)
    try:
        with open(path, "rb") as handle:
            reader = _Reader(handle, where)
            if reader.take(4) != _MAGIC:
                raise TokenizerError(f"{where}: not a GGUF file (no GGUF magic)")
            version, _tensors, count = struct.unpack("<IQQ", reader.take(20))
            if version not in (2, 3):
                raise TokenizerError(f"{where}: GGUF version {version} is not supported (2, 3)")
            metadata: dict[str, Any] = {}
            for _ in range(count):
                key = reader.string()
                (kind,) = struct.unpack("<I", reader.take(4))
                metadata[key] = reader.value(kind)
            return metadata
    except OSError as exc:
        raise TokenizerError(f"cannot read GGUF file {where}: {exc.strerror or exc}") from exc


def _spm_merges(vocab: dict[str, int], scores: Sequence[float], normal: set[int]) -> list[Any]:
    # SentencePiece BPE merges the adjacent pair whose result scores highest; as a rank list,
    # every split of a piece into two known pieces is a merge ranked by the piece's score.
    candidates: list[tuple[float, int, int, str, str]] = []
    for piece, index in vocab.items():
        if index not in normal or len(piece) < 2:
            continue
        for cut in range(1, len(piece)):
            left, right = piece[:cut], piece[cut:]
            left_id, right_id = vocab.get(left), vocab.get(right)
            if left_id is not None and right_id is not None:
                candidates.append((-scores[index], left_id, right_id, left, right))
    candidates.sort()
    return [(left, right) for _, _, _, left, right in candidates]


def _added_tokens(tokens: Sequence[str], types: Sequence[int]) -> list[Any]:
    from tokenizers import AddedToken

    return [
        AddedToken(token, normalized=False, special=False)
        for token, kind in zip(tokens, types, strict=True)
        if kind == _USER_DEFINED
    ]


def _build_spm(meta: dict[str, Any], where: str) -> Any:
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import decoders, models, normalizers

    tokens: list[str] = meta["tokenizer.ggml.tokens"]
    scores = meta.get("tokenizer.ggml.scores")
    types = meta.get("tokenizer.ggml.token_type") or [_NORMAL] * len(tokens)
    if scores is None or len(scores) != len(tokens) or len(types) != len(tokens):
        raise TokenizerError(f"{where}: tokenizer.ggml.scores/token_type missing or mismatched")
    vocab: dict[str, int] = {}
    for index, token in enumerate(tokens):
        vocab.setdefault(token, index)
    normal = {i for i, kind in enumerate(types) if kind == _NORMAL}
    unknown = meta.get("tokenizer.ggml.unknown_token_id")
    model = models.BPE(
        vocab=vocab,
        merges=_spm_merges(vocab, scores, normal),
        unk_token=tokens[unknown] if isinstance(unknown, int) and unknown < len(tokens) else None,
        byte_fallback=True,
        fuse_unk=True,
    )
    backend = HFTokenizer(model)
    steps: list[Any] = []
    if meta.get("tokenizer.ggml.add_space_prefix", True):
        steps.append(normalizers.Prepend("▁"))
    steps.append(normalizers.Replace(" ", "▁"))
    backend.normalizer = normalizers.Sequence(steps)
    backend.decoder = decoders.ByteFallback()
    backend.add_tokens(_added_tokens(tokens, types))
    return backend


def _build_bpe(meta: dict[str, Any], where: str) -> Any:
    from tokenizers import Regex, decoders, models, pre_tokenizers
    from tokenizers import Tokenizer as HFTokenizer

    pre = str(meta.get("tokenizer.ggml.pre", "default"))
    patterns = PRE_PATTERNS.get(pre)
    if patterns is None:
        raise TokenizerError(
            f"{where}: pre-tokenizer {pre!r} is not supported (known are "
            f"{', '.join(sorted(PRE_PATTERNS))}); name a built-in tokenizer or window instead"
        )
    tokens: list[str] = meta["tokenizer.ggml.tokens"]
    types = meta.get("tokenizer.ggml.token_type") or [_NORMAL] * len(tokens)
    merges = [tuple(m.split(" ", 1)) for m in meta.get("tokenizer.ggml.merges", [])]
    vocab: dict[str, int] = {}
    for index, token in enumerate(tokens):
        vocab.setdefault(token, index)
    # llama.cpp takes a whole pre-token that is in the vocabulary for Llama 3 only.
    ignore_merges = pre in ("llama3", "llama-bpe")
    backend = HFTokenizer(models.BPE(vocab=vocab, merges=merges, ignore_merges=ignore_merges))
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            *(pre_tokenizers.Split(Regex(p), behavior="isolated") for p in patterns),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    backend.decoder = decoders.ByteLevel()
    backend.add_tokens(_added_tokens(tokens, types))
    return backend


def load_gguf(path: str) -> HFTokenizer:
    """The tokenizer stored in the GGUF file at ``path`` (see the module docstring)."""
    file = Path(path).expanduser()
    if not file.is_file():
        raise TokenizerError(f"tokenizer 'gguf:{path}': no such file")
    meta = read_metadata(file)
    kind = meta.get("tokenizer.ggml.model")
    if "tokenizer.ggml.tokens" not in meta:
        raise TokenizerError(f"{path}: the GGUF file holds no tokenizer (tokenizer.ggml.tokens)")
    if kind == "llama":
        backend = _build_spm(meta, path)
    elif kind == "gpt2":
        backend = _build_bpe(meta, path)
    else:
        raise TokenizerError(
            f"{path}: tokenizer model {kind!r} is not supported (llama, gpt2); "
            "name a built-in tokenizer instead"
        )
    return HFTokenizer(f"gguf:{path}", backend)
