"""Lexical search across scripts: does a question sharing one word with a message find it?

    uv run python bench/script_search.py [--distractors 40] [--seed 3] [--postgres DSN]

Builds a small log per language (our own sentences: no data read) in English, Japanese,
Chinese, Korean and Thai: for each of twelve everyday work nouns (two characters in Chinese and
Japanese, the common case there) two messages that mention it in different sentences, and
``--distractors`` chatter messages that mention none. Then asks two questions per noun, phrased
unlike any message ("what happened with the budget?", ``予算はどうなりましたか``), through
``Engine.search`` (words only: no embedder), and prints per language the share of questions
whose first result mentions the noun (hit@1) and the share of the noun's messages in the first
five (recall@5).

Written for issue 18/19's CJK finding: before character bigrams, a Chinese or Japanese message
was one FTS5 term per run between punctuation, found only by a query holding that whole run.
Run it with another checkout's ``src`` on ``PYTHONPATH`` to compare (docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import random
import tempfile
from pathlib import Path
from typing import Any

from ctxwarden import Engine
from ctxwarden.store.base import Store
from ctxwarden.store.sqlite import SQLiteStore

NOUNS: dict[str, list[str]] = {
    "en": ["meeting", "budget", "trip", "interview", "contract", "training", "inventory",
           "quote", "audit", "hiring", "payroll", "schedule"],
    "ja": ["会議", "予算", "出張", "面接", "契約", "研修", "在庫", "見積", "監査", "採用",
           "給与", "日程"],
    "zh": ["会议", "预算", "出差", "面试", "合同", "培训", "库存", "报价", "审计", "招聘",
           "工资", "日程"],
    "ko": ["회의", "예산", "출장", "면접", "계약", "교육", "재고", "견적", "감사", "채용",
           "급여", "일정"],
    "th": ["ประชุม", "งบประมาณ", "เดินทาง", "สัมภาษณ์", "สัญญา", "ฝึกอบรม", "สินค้า",
           "ใบเสนอราคา", "ตรวจสอบ", "รับสมัคร", "เงินเดือน", "ตารางงาน"],
}  # fmt: skip

MENTIONS: dict[str, list[str]] = {
    "en": ["The {n} will be discussed again next week.",
           "Yesterday the manager asked me about the {n} twice.",
           "I uploaded the {n} documents to the shared folder."],
    "ja": ["{n}の件は来週もう一度話し合うことになりました。",
           "昨日、部長から{n}について質問されました。",
           "{n}の資料を共有フォルダに入れておきました。"],
    "zh": ["{n}的事情下周再讨论一次。",
           "昨天经理问了我关于{n}的问题。",
           "我把{n}的文件放到共享文件夹里了。"],
    "ko": ["{n} 건은 다음 주에 다시 논의하기로 했어요.",
           "어제 팀장님이 {n}에 대해 물어보셨어요.",
           "{n} 자료를 공유 폴더에 올려 두었습니다."],
    "th": ["เรื่อง{n}จะคุยกันอีกครั้งสัปดาห์หน้า",
           "เมื่อวานหัวหน้าถามเรื่อง{n}อีกแล้ว",
           "ส่งเอกสาร{n}ไว้ในโฟลเดอร์กลางแล้วนะ"],
}  # fmt: skip

QUESTIONS: dict[str, list[str]] = {
    "en": ["what happened with the {n}?", "any news on the {n}"],
    "ja": ["{n}はどうなりましたか", "{n}について何か連絡はあった?"],
    "zh": ["{n}现在怎么样了？", "有没有{n}的最新消息"],
    "ko": ["{n}은 어떻게 됐나요?", "{n} 관련 소식 있어요?"],
    "th": ["{n}เป็นยังไงบ้าง", "มีข่าวเรื่อง{n}ไหม"],
}  # fmt: skip

CHATTER: dict[str, list[str]] = {
    "en": ["good morning everyone", "lunch was great today", "I will be a bit late",
           "thanks for the help yesterday", "the coffee machine is broken again",
           "see you all tomorrow"],
    "ja": ["皆さんおはようございます", "今日のランチは美味しかったです", "少し遅れます",
           "昨日は手伝ってくれてありがとう", "コーヒーマシンがまた壊れました", "また明日"],
    "zh": ["大家早上好", "今天的午饭很好吃", "我会晚一点到", "谢谢你昨天的帮忙",
           "咖啡机又坏了", "明天见"],
    "ko": ["모두 좋은 아침이에요", "오늘 점심 맛있었어요", "조금 늦을 것 같아요",
           "어제 도와줘서 고마워요", "커피 머신이 또 고장났어요", "내일 봐요"],
    "th": ["สวัสดีตอนเช้าทุกคน", "มื้อเที่ยงวันนี้อร่อยมาก", "จะไปสายหน่อยนะ",
           "ขอบคุณที่ช่วยเมื่อวาน", "เครื่องชงกาแฟเสียอีกแล้ว", "เจอกันพรุ่งนี้"],
}  # fmt: skip


def build(distractors: int, seed: int) -> list[dict[str, Any]]:
    """The log: per language, two mentions of each noun and ``distractors`` chatter lines."""
    rng = random.Random(seed)
    records: list[dict[str, Any]] = []
    for language, nouns in NOUNS.items():
        lines = []
        for noun in nouns:
            for template in rng.sample(MENTIONS[language], 2):
                lines.append((noun, template.format(n=noun)))
        for i in range(distractors):
            lines.append(("", f"{rng.choice(CHATTER[language])} ({i})"))
        rng.shuffle(lines)
        for noun, text in lines:
            records.append(
                {"id": f"{language}-{len(records)}", "session": language, "author": "kai",
                 "content": text, "created_at": 1_700_000_000.0 + len(records),
                 "metadata": {"noun": noun}}
            )  # fmt: skip
    return records


def measure(store: Store, records: list[dict[str, Any]]) -> dict[str, tuple[int, float, float]]:
    """Per language: questions asked, hit@1 and recall@5 (percent)."""
    holding: dict[tuple[str, str], set[str]] = {}
    for record in records:
        if record["metadata"]["noun"]:
            holding.setdefault((record["session"], record["metadata"]["noun"]), set()).add(
                record["id"]
            )
    out: dict[str, tuple[int, float, float]] = {}
    with Engine(store) as engine:
        engine.ingest(records)
        for language, nouns in NOUNS.items():
            hits = recall = 0.0
            asked = 0
            for noun in nouns:
                wanted = holding[(language, noun)]
                for question in QUESTIONS[language]:
                    found = [
                        m.id
                        for m, _ in engine.search(
                            question.format(n=noun), session=language, limit=5
                        )
                    ]
                    asked += 1
                    hits += bool(found) and found[0] in wanted
                    recall += len(wanted & set(found)) / len(wanted)
            out[language] = (asked, 100.0 * hits / asked, 100.0 * recall / asked)
    return out


def main(argv: list[str] | None = None) -> dict[str, tuple[int, float, float]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--distractors", type=int, default=40, help="chatter lines a language")
    parser.add_argument("--seed", type=int, default=3)
    parser.add_argument("--postgres", default=None, help="a DSN: search PostgreSQL instead")
    args = parser.parse_args(argv)
    records = build(args.distractors, args.seed)
    with tempfile.TemporaryDirectory() as tmp:
        if args.postgres:
            from ctxwarden.store.postgres import PostgresStore

            store: Store = PostgresStore(args.postgres)
        else:
            store = SQLiteStore(Path(tmp) / "scripts.db")
        try:
            results = measure(store, records)
        finally:
            store.close()
    print(f"{len(records)} messages, {args.distractors} distractors a language, seed {args.seed}")
    print("| language | questions | hit@1 | recall@5 |")
    print("|---|---:|---:|---:|")
    for language, (asked, hit, recall) in results.items():
        print(f"| {language} | {asked} | {hit:.1f} % | {recall:.1f} % |")
    return results


if __name__ == "__main__":
    main()
