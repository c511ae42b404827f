"""Natural text of the kinds the approximation factors cover, held out from the bench's corpus.

bench/tokenizer_margin.py measures the factors on its corpus (even-numbered Python doc topics,
five stdlib modules, JSON from seed 16, its own CJK and emoji lines); these samples are other
topics, other modules, another seed and other lines (Russian, Greek, Hindi, Arabic, Hebrew, Thai,
Ukrainian), so a test over them checks the factors on text they were not picked from.
"""

from __future__ import annotations

import inspect
import json
import random

CJK = [
    "请把上周的销售数据整理成表格，明天上午发给我，谢谢。",
    "这个功能在测试环境没有问题，但是上线以后偶尔会出现重复提交的情况。",
    "我们计划下个月在北京举办用户大会，需要提前预订会场和酒店。",
    "新しいデザイン案を共有します。ご意見があれば金曜日までにお願いします。",
    "電車が遅れているので、会議に十分ほど遅れます。申し訳ありません。",
    "이번 분기 목표를 다시 검토하고 다음 회의에서 논의합시다.",
    "数据库备份每天凌晨两点自动执行，保留最近三十天的记录。",
]
OTHER_SCRIPTS = [
    "Добрый вечер! Отчёт за квартал готов, посмотрите его до пятницы, пожалуйста.",
    "Пользователи жалуются, что приложение медленно открывается на старых телефонах.",
    "Ο διακομιστής θα είναι εκτός λειτουργίας για συντήρηση το Σάββατο το πρωί.",
    "कृपया अगले सप्ताह की बैठक के लिए अपनी रिपोर्ट तैयार रखें।",
    "يرجى مراجعة التقرير قبل نهاية الأسبوع وإرسال ملاحظاتكم.",
    "נא לשלוח את הדוח עד יום חמישי בבוקר, תודה רבה.",
    "กรุณาส่งรายงานภายในวันศุกร์นี้ ขอบคุณครับ",
    "Будь ласка, перевірте налаштування сервера перед оновленням.",
]
EMOJI = [
    "congrats on the launch 🎊🥳🍾 well deserved 👏👏",
    "running late 🏃‍♂️💨 be there in 10 ⏰",
    "the build is green again ✅🟢 thanks 🙏",
    "pizza tonight? 🍕🍕🍺 👀",
    "❤️🧡💛💚💙💜 love this team",
]


def english() -> list[str]:
    """Python documentation topics the bench does not use (odd positions), 1,500 characters."""
    import pydoc_data.topics

    topics = [t for t in pydoc_data.topics.topics.values() if len(t) > 1500]
    return [t[:1500] for t in topics[1:40:2]]


def code() -> list[str]:
    """Chunks of standard-library modules the bench does not use."""
    import dataclasses
    import functools
    import string

    out = []
    for module in (dataclasses, functools, string):
        source = inspect.getsource(module)
        out.extend(source[i : i + 1500] for i in range(0, min(len(source), 9000), 1500))
    return out


def json_samples() -> list[str]:
    """Seeded random records, compact and indented."""
    rng = random.Random(99)
    words = "invoice customer shipped refunded region north south sku warehouse total".split()
    out = []
    for index in range(15):
        record = {
            "order": rng.randrange(10**6),
            "customer": {"name": " ".join(rng.choices(words, k=2)), "vip": rng.random() > 0.7},
            "lines": [{"sku": f"SKU-{rng.randrange(10**4)}", "qty": rng.randrange(1, 9)}
                      for _ in range(3)],
            "total": round(rng.uniform(1, 5000), 2),
        }  # fmt: skip
        out.append(json.dumps(record, indent=None if index % 2 else 2))
    return out


def samples() -> dict[str, list[str]]:
    """The held-out samples by kind."""
    return {
        "english": english(),
        "code": code(),
        "json": json_samples(),
        "cjk": CJK,
        "emoji": EMOJI,
        "other-scripts": OTHER_SCRIPTS,
    }
