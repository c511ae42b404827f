"""Facts that change: is the value in force in the context, is a superseded one shown as current?

    uv run python bench/facts.py [--sessions 8] [--subjects 4] [--budget 1000] [--seed 7]

Generates a log (seeded, our own templates, no data read) of team channels in English,
Japanese and Chinese: each session holds a few subjects (a demo time, a database, a venue, an
owner, a budget...) stated once and changed one to three times in several phrasings ("moved
to", "now X, not Y", "scratch that", "instead", "postponed", a new value by the same author;
``に変更``, ``ではなく``, ``やっぱり``; ``改到``, ``不是...而是``, ``推迟到``), with chatter
between.
Then asks "what is X now?" for every subject at a 1,000-token budget (gpt-4-turbo, cl100k) and
prints, per language, the share of questions whose context holds the value in force (target
>= 98 %) and the share whose memory blocks (pinned, related) show a superseded value as current:
a line with an old value, without the value in force and without "(superseded on" (target 0).
The recent block is the conversation itself, in order, and is not judged.

Runs twice: with change detection (``change_window`` two weeks, ``CHANGE_WINDOW``, the default)
and without (``change_window=0``). ``--embedder off`` is words only: no vectors at all (the
engine's background embedder is off too), so what is found is found by the full-text index and
the recent block.

Measured (seed 7, 8 sessions x 4 subjects a language, 96 questions): docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import itertools
import random
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ctxwarden import Engine
from ctxwarden.engine_config import CHANGE_WINDOW, EngineConfig
from ctxwarden.store.sqlite import SQLiteStore

MODEL = "gpt-4-turbo"

# subject -> values, per language. Values are distinct strings, none inside another.
SUBJECTS: dict[str, dict[str, list[str]]] = {
    "en": {
        "the customer demo": ["Monday 09:00", "Tuesday 14:00", "Wednesday 15:00", "Thursday 10:00",
                              "Friday 11:30"],
        "the billing database": ["PostgreSQL", "MySQL", "SQLite", "MariaDB", "CockroachDB"],
        "the deploy window": ["Tuesday 22:00", "Wednesday 06:00", "Saturday 02:00",
                              "Sunday 23:00"],
        "the offsite venue": ["Lisbon", "Porto", "Madrid", "Berlin", "Vienna"],
        "the release owner": ["Rosa", "Milo", "Priya", "Kenji", "Amara"],
        "the API rate limit": ["120 rps", "250 rps", "480 rps", "900 rps"],
        "the design review": ["Thursday 16:00", "Monday 13:30", "Friday 09:15", "Tuesday 17:45"],
        "the launch budget": ["$40k", "$55k", "$70k", "$85k"],
    },
    "ja": {
        "製品デモ": ["月曜9時", "火曜14時", "水曜15時", "木曜10時", "金曜11時"],
        "定例会議の場所": ["第一会議室", "大阪オフィス", "オンライン", "東京本社"],
        "リリース担当": ["佐藤さん", "田中さん", "鈴木さん", "高橋さん"],
        "予算上限": ["300万円", "450万円", "520万円", "610万円"],
        "合宿の会場": ["箱根", "京都", "沖縄", "札幌"],
        "本番デプロイ": ["火曜22時", "水曜6時", "土曜2時", "日曜23時"],
        "採用面接": ["月曜13時", "木曜16時", "金曜10時"],
        "新しいデータベース": ["PostgreSQL", "MySQL", "SQLite", "MariaDB"],
    },
    "zh": {
        "产品发布会": ["星期一上午九点", "星期三下午三点", "星期四上午十点", "星期五下午两点"],
        "周会地点": ["三楼会议室", "五楼会议室", "线上会议", "七楼大厅"],
        "项目负责人": ["李娜", "王伟", "张敏", "刘洋"],
        "市场预算": ["50万元", "80万元", "120万元", "150万元"],
        "团建地点": ["杭州", "成都", "厦门", "青岛"],
        "上线时间": ["星期二晚上十点", "星期六凌晨两点", "星期日晚上十一点"],
        "客户培训": ["星期一下午两点", "星期四下午四点", "星期五上午十点"],
        "计费数据库": ["PostgreSQL", "MySQL", "SQLite", "MariaDB"],
    },
}  # fmt: skip

FIRST = {
    "en": ["{s} is {v}.", "Let's set {s} to {v}.", "We're going with {v} for {s}, final answer.",
           "Heads up: {s} will be {v}."],
    "ja": ["{s}は{v}です。", "{s}は{v}で決定しました。", "{s}は{v}にしましょう。"],
    "zh": ["{s}定在{v}。", "{s}就定{v}吧。", "大家注意，{s}是{v}。"],
}  # fmt: skip
CHANGE = {
    "en": ["{s} moved to {v}.", "Scratch that, {s} is {v}.", "{s} is now {v}, not {o}.",
           "Changed {s} to {v}.", "We'll use {v} for {s} instead.", "{s} postponed to {v}.",
           "Actually {s} will be {v}.", "{s} is no longer {o}; it is {v}.", "SAME:{s} is {v}."],
    "ja": ["{s}は{v}に変更しました。", "{s}は{o}ではなく{v}です。", "やっぱり{s}は{v}にします。",
           "{s}は{v}に延期になりました。", "{s}は{v}に移動します。"],
    "zh": ["{s}改到{v}了。", "{s}不是{o}，而是{v}。", "{s}推迟到{v}。", "{s}改成{v}。",
           "更正一下，{s}换成{v}。"],
}  # fmt: skip
CHATTER = {
    "en": ["lol", "anyone up for lunch?", "the coffee machine is broken again", "brb",
           "nice work on the slides", "can someone review my PR please", "thanks!",
           "I'll be a bit late today", "has anyone seen my charger", "ok sounds good",
           "the wifi on floor three is flaky", "great meeting everyone", "happy friday all",
           "who broke the build", "on it", "let me check and get back to you"],
    "ja": ["了解です", "お昼どうしますか？", "コーヒーマシンがまた壊れてる", "ちょっと離席します",
           "スライドお疲れさまでした", "レビューお願いします", "ありがとうございます！",
           "今日は少し遅れます", "充電器見ませんでしたか", "いいですね"],
    "zh": ["好的", "中午一起吃饭吗？", "咖啡机又坏了", "我先离开一下", "幻灯片做得不错",
           "谁帮我看一下代码", "谢谢！", "我今天晚点到", "有人看到我的充电器吗", "收到"],
}  # fmt: skip
QUESTION = {"en": "what is {s} now?", "ja": "{s}は今どうなっていますか？", "zh": "{s}现在是什么？"}
AUTHORS = {
    "en": ["rosa", "milo", "priya", "kenji"],
    "ja": ["haruto", "yui", "sota", "aoi"],
    "zh": ["lina", "wei", "min", "yang"],
}


@dataclass(frozen=True)
class Subject:
    language: str
    session: str
    name: str
    values: tuple[str, ...]  # in the order stated; the last is in force


def generate(sessions: int, subjects: int, seed: int) -> tuple[list[dict[str, Any]], list[Subject]]:
    """The log (records in time order) and the subjects asked about."""
    rng = random.Random(seed)
    records: list[dict[str, Any]] = []
    asked: list[Subject] = []
    clock = 1_760_000_000.0
    for language in ("en", "ja", "zh"):
        for number in range(sessions):
            session = f"{language}-{number}"
            names = rng.sample(sorted(SUBJECTS[language]), min(subjects, len(SUBJECTS[language])))
            events: list[tuple[str, str, str]] = []  # (subject, text, author) per statement
            queues: list[list[tuple[str, str, str]]] = []
            for name in names:
                pool = SUBJECTS[language][name]
                values = rng.sample(pool, min(len(pool), rng.randint(2, 4)))
                author = rng.choice(AUTHORS[language])
                first = rng.choice(FIRST[language]).format(s=name, v=values[0])
                queue = [(name, _capital(first), author)]
                for old, new in itertools.pairwise(values):
                    template = rng.choice(CHANGE[language])
                    if template.startswith("SAME:"):  # a new value by the same author
                        template = template[5:]
                    else:
                        author = rng.choice(AUTHORS[language])
                    queue.append((name, _capital(template.format(s=name, v=new, o=old)), author))
                queues.append(queue)
                asked.append(Subject(language, session, name, tuple(values)))
            while any(queues):  # interleave the subjects, keeping each one's order
                queue = rng.choice([q for q in queues if q])
                events.append(queue.pop(0))
                for _ in range(rng.randint(2, 8)):
                    events.append(("", _chatter(rng, language), rng.choice(AUTHORS[language])))
            for _ in range(rng.randint(15, 40)):  # the talk goes on after the last change
                events.append(("", _chatter(rng, language), rng.choice(AUTHORS[language])))
            for index, (_, text, author) in enumerate(events):
                clock += rng.randint(20, 900)
                records.append({
                    "id": f"{session}-m{index}", "session": session, "channel": "general",
                    "author": author, "role": "user", "content": text, "created_at": clock,
                })  # fmt: skip
    return records, asked


def _chatter(rng: random.Random, language: str) -> str:
    """A line of small talk: one of the pool, or two joined (so repeats are rarer)."""
    first = rng.choice(CHATTER[language])
    if rng.random() < 0.5:
        return first
    joint = {"en": ", ", "ja": "、", "zh": "，"}[language]
    return first.rstrip("?？!！") + joint + rng.choice(CHATTER[language])


def _capital(text: str) -> str:
    return text[:1].upper() + text[1:]


def judge(context: Any, subject: Subject) -> tuple[bool, bool]:
    """(the value in force is in the context, a superseded value is shown as current in the
    memory blocks)."""
    current = subject.values[-1]
    old = subject.values[:-1]
    whole = "\n".join(str(m["content"]) for m in context.messages)
    stale = False
    for message in context.messages:
        if message["role"] not in ("system", "developer") and not _is_data(message):
            continue
        for line in str(message["content"]).splitlines():
            if subject.name not in line and not any(v in line for v in old):
                continue
            if any(v in line for v in old) and current not in line and "(superseded on" not in line:
                stale = True
    return current in whole, stale


def _is_data(message: dict[str, Any]) -> bool:
    from ctxwarden import render

    return bool(message["role"] == render.DATA_ROLE and message.get("content", "").startswith(
        render.data_intro().strip()[:20]
    ))  # fmt: skip


def run(
    records: list[dict[str, Any]],
    asked: list[Subject],
    budget: int,
    *,
    detect: bool,
    embedder: str = "off",
) -> dict[str, list[tuple[bool, bool]]]:
    """Ingest the log into a fresh store and ask every subject; per language the verdicts.
    ``embedder``: ``"off"`` (words only) or an embedder's name (vectors made at ingest)."""
    config = EngineConfig(change_window=CHANGE_WINDOW, embed="off")
    if embedder != "off":
        config = replace(config, embed="sync", embedder=embedder)
    if not detect:
        config = replace(config, change_window=0.0)
    out: dict[str, list[tuple[bool, bool]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        store = SQLiteStore(Path(tmp) / "facts.db")
        with Engine(store, config=config) as engine:
            engine.ingest(records)
            for subject in asked:
                context = engine.assemble(
                    session=subject.session,
                    channel="general",
                    query=QUESTION[subject.language].format(s=subject.name),
                    model=MODEL,
                    budget=budget,
                    log_inclusions=False,
                )
                out.setdefault(subject.language, []).append(judge(context, subject))
    return out


def table(results: dict[str, dict[str, list[tuple[bool, bool]]]]) -> str:
    lines = [
        "| detection | language | questions | value in force in context | superseded shown "
        "as current |",
        "|---|---|---:|---:|---:|",
    ]
    for mode, per_language in results.items():
        every: list[tuple[bool, bool]] = []
        for language, verdicts in per_language.items():
            every.extend(verdicts)
            lines.append(_row(mode, language, verdicts))
        lines.append(_row(mode, "all", every))
    return "\n".join(lines)


def _row(mode: str, language: str, verdicts: list[tuple[bool, bool]]) -> str:
    n = max(1, len(verdicts))
    found = sum(v[0] for v in verdicts) / n * 100
    stale = sum(v[1] for v in verdicts) / n * 100
    return f"| {mode} | {language} | {len(verdicts)} | {found:.1f} % | {stale:.1f} % |"


def main(argv: list[str] | None = None) -> dict[str, dict[str, list[tuple[bool, bool]]]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=8, help="sessions per language")
    parser.add_argument("--subjects", type=int, default=4, help="subjects per session")
    parser.add_argument("--budget", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--embedder", default="off", help="off (words only) or an embedder")
    args = parser.parse_args(argv)
    records, asked = generate(args.sessions, args.subjects, args.seed)
    results = {
        "on": run(records, asked, args.budget, detect=True, embedder=args.embedder),
        "off": run(records, asked, args.budget, detect=False, embedder=args.embedder),
    }
    print(f"{len(records)} messages, {len(asked)} questions at {args.budget} tokens ({MODEL})")
    print(table(results))
    return results


if __name__ == "__main__":
    main()
