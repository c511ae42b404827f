"""Evidence recall of the related block: the share of each question's evidence in the context.

Usage::

    uv run python bench/evidence_recall.py [DATA ...] [--budgets 1000,2000,4000,8000]
        [--model gpt-4-turbo] [--embed off|sync|background] [--embedder minilm]
        [--limit N] [--filler N] [--phrasing lower|bare|lower-bare] [--where]

``DATA`` is a chatbench directory (``messages.jsonl`` + ``qa.jsonl``, see shared/data/README.md)
or a LoCoMo JSON file (a list of samples with ``conversation`` sessions of turns
``{speaker, dia_id, text, blip_caption?}``, a caption becoming an image attachment of its turn,
and ``qa`` items ``{question, answer, evidence, category}``). It
defaults to ../shared/data/locomo-dev/locomo-dev.json and ../shared/data/chatbench-dev (the first
``shared/data`` beside the repository or beside one of its parents, as bench/context_hash.py).

The engine runs with the default :class:`~ctxwarden.engine.EngineConfig` a new user gets (only
``default_model`` set to ``--model``; ``--embed`` defaults to the config's own ``embed``). When
``embed`` is not ``"off"``, every record is embedded before the questions are asked (the steady
state of a running engine), so the related block searches vectors too.

For every question the engine assembles a context at each budget (``gpt-4-turbo``: cl100k, a
128k window, so the budget is the budget) with the clock at the question's time, and the
evidence ids found in ``Context.included`` are counted (an id folded into an aggregate counts as
its aggregate); a context over its budget scores 0. Two baselines run on the same store in the
same run: **recency** (the newest messages whose lines fit the budget) and **bm25** (the store's
full-text hits, best first, lines packed until the budget is full). Prints, per data set, one
row per budget and method: **recall** (the share of a question's evidence found, averaged) and
**full** (the share of questions with all their evidence found) per category, and overall (for
LoCoMo, categories 1-4 by the usual convention; category 5, adversarial, is shown apart). Below
it, p50/p95 of ``Engine.assemble`` (a wall-clock time per call, the query's embedding included
when vectors are on) over every question and budget of that data set.

``--where`` adds a table of where each evidence memory went, per budget and category:
included (related block as a hit or as a hit's neighbour, recent block), left out at a rank
of the related candidates (top 20 / 50 / 100 / deeper: retrieved, but more than fit), or
not retrieved at all (in no candidate list): a miss of ranking or packing against a miss of
retrieval.

``--filler N`` adds N distractor messages to each conversation before it is ingested, to see
recall at a store size where the search's row bound and its very-common-word cut-off apply:
each is a bag of words drawn from the conversation's own words by their frequency (so common
words become very common and rare ones stay rare), as long as one of its messages, at a random
time within its span, in one of its sessions and channels, by one of 50 made-up authors. They
hold no evidence; they compete with it for every method.

``--phrasing`` asks the questions as a user might type them: ``lower`` (lower-cased), ``bare``
(no closing question mark) or ``lower-bare``; the engine must not depend on the benchmark's
capitals and question marks (docs/benchmarks.md has the figures).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import random
import re
import sys
import time
from collections import defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TextIO

from ctxwarden import render, tokens
from ctxwarden.assemble import query_terms
from ctxwarden.budget import BudgetPolicy, chat_policy
from ctxwarden.engine import Engine, EngineConfig
from ctxwarden.errors import NotFound
from ctxwarden.retrieve import RetrievalWeights
from ctxwarden.types import parse_time

# ../shared/data beside the repository, or beside a parent of it (a worktree under wt/).
_PARENTS = Path(__file__).resolve().parents[2:]
DATA = next(
    (p / "shared" / "data" for p in _PARENTS if (p / "shared").exists()),
    Path("../shared/data"),
)
DEFAULT_DATA = (DATA / "locomo-dev" / "locomo-dev.json", DATA / "chatbench-dev")


@dataclass(slots=True)
class Question:
    qid: str
    question: str
    evidence: tuple[str, ...]
    category: str
    asked_at: float


@dataclass(slots=True)
class Conversation:
    """One conversation: records to ingest (each with a session) and questions about it."""

    name: str
    session: str
    records: list[dict[str, Any]] = field(default_factory=list)
    questions: list[Question] = field(default_factory=list)
    #: Categories reported apart, not in the overall figure (LoCoMo's adversarial "5").
    apart: frozenset[str] = frozenset()


# -- readers -----------------------------------------------------------------------------------


def read_chatbench(directory: Path) -> list[Conversation]:
    """A chatbench directory: one conversation (its most common session)."""
    lines = (directory / "messages.jsonl").read_text(encoding="utf-8").splitlines()
    records = [json.loads(line) for line in lines if line.strip()]
    sessions: dict[str, int] = defaultdict(int)
    for record in records:
        sessions[record["session"]] += 1
    conversation = Conversation(
        name=directory.name, session=max(sessions, key=sessions.__getitem__)
    )
    conversation.records = records
    for line in (directory / "qa.jsonl").read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        item = json.loads(line)
        conversation.questions.append(
            Question(
                qid=item["qid"],
                question=item["question"],
                evidence=tuple(item["evidence"]),
                category=str(item["category"]),
                asked_at=parse_time(item["asked_at"]),
            )
        )
    return [conversation]


_LOCOMO_TIME = re.compile(
    r"(?P<hour>\d{1,2}):(?P<minute>\d{2})\s*(?P<ampm>am|pm)\s+on\s+(?P<day>\d{1,2})\s+"
    r"(?P<month>[A-Za-z]+),?\s+(?P<year>\d{4})",
    re.IGNORECASE,
)


def locomo_time(text: str) -> float | None:
    """LoCoMo's session time (``"1:56 pm on 8 May, 2023"``) as a Unix time, or None."""
    match = _LOCOMO_TIME.search(text or "")
    if not match:
        return None
    hour = int(match["hour"]) % 12 + (12 if match["ampm"].lower() == "pm" else 0)
    try:
        month = datetime.strptime(match["month"][:3], "%b").month
        moment = datetime(int(match["year"]), month, int(match["day"]), hour,
                          int(match["minute"]), tzinfo=UTC)  # fmt: skip
    except ValueError:
        return None
    return moment.timestamp()


def _session_keys(conversation: dict[str, Any]) -> list[tuple[int, str]]:
    keys = []
    for key, value in conversation.items():
        found = re.fullmatch(r"session_(\d+)", key)
        if found and isinstance(value, list):
            keys.append((int(found[1]), key))
    return sorted(keys)


def read_locomo(path: Path) -> list[Conversation]:
    """A LoCoMo JSON file: one conversation per sample (turns 60 s apart within a session)."""
    data = json.loads(path.read_text(encoding="utf-8"))
    if isinstance(data, dict):
        data = [data]
    out = []
    for number, sample in enumerate(data):
        name = str(sample.get("sample_id", f"sample-{number}"))
        conv = sample["conversation"]
        conversation = Conversation(name=name, session=name, apart=frozenset({"5"}))
        clock = datetime(2023, 1, 1, tzinfo=UTC).timestamp()
        for index, key in _session_keys(conv):
            start = locomo_time(str(conv.get(f"{key}_date_time", "")))
            clock = start if start is not None and start > clock else clock + 3600.0
            for turn in conv[key]:
                text = str(turn.get("text", "")).strip()
                caption = str(turn.get("blip_caption") or "").strip()
                if not text and not caption:
                    continue
                record = {
                    "id": str(turn["dia_id"]), "session": name, "channel": f"session-{index}",
                    "author": str(turn["speaker"]), "author_kind": "human", "role": "user",
                    "content": text, "created_at": clock,
                }  # fmt: skip
                if caption:  # the shared image, as an attachment (not pasted into the text)
                    record["attachments"] = [{"kind": "image", "caption": caption}]
                conversation.records.append(record)
                clock += 60.0
        asked = clock + timedelta(days=1).total_seconds()
        for q_number, item in enumerate(sample.get("qa", [])):
            evidence = tuple(
                e.strip() for raw in item.get("evidence", []) for e in str(raw).split(";")
                if e.strip()
            )  # fmt: skip
            if not evidence or "question" not in item:
                continue
            conversation.questions.append(
                Question(
                    qid=f"{name}-{q_number}",
                    question=str(item["question"]),
                    evidence=evidence,
                    category=str(item.get("category", "?")),
                    asked_at=asked,
                )
            )
        out.append(conversation)
    return out


def add_filler(conversation: Conversation, count: int, *, seed: int = 0) -> None:
    """``count`` distractor records (see the module docstring), merged into the conversation's
    records in time order."""
    if count <= 0 or not conversation.records:
        return
    rng = random.Random(seed)
    texts = [str(r["content"]).split() for r in conversation.records]
    words = [w for text in texts for w in text]
    times = [parse_time(r["created_at"]) for r in conversation.records]
    places = sorted({(r.get("session"), r.get("channel")) for r in conversation.records},
                    key=str)  # fmt: skip
    start, end = min(times), max(times)
    filler = []
    for number in range(count):
        session, channel = rng.choice(places)
        at = rng.uniform(start, end)
        filler.append(
            {
                "id": f"filler-{number}",
                "session": session,
                "channel": channel,
                "author": f"filler{number % 50}",
                "author_kind": "human",
                "role": "user",
                "content": " ".join(rng.choices(words, k=max(1, len(rng.choice(texts))))),
                "created_at": datetime.fromtimestamp(at, UTC).isoformat(),
            }
        )
    merged = [(t, 0, r) for t, r in zip(times, conversation.records, strict=True)]
    merged += [(parse_time(r["created_at"]), 1, r) for r in filler]
    conversation.records = [r for _, _, r in sorted(merged, key=lambda x: (x[0], x[1]))]


#: ``--phrasing``: the questions as a user might type them instead (a robustness check: the
#: engine must not depend on the benchmark's capitals and question marks).
PHRASINGS = ("as-is", "lower", "bare", "lower-bare")


def rephrase(conversation: Conversation, phrasing: str) -> None:
    """Rewrite the conversation's questions: ``lower`` lower-cases them, ``bare`` drops the
    closing question mark, ``lower-bare`` does both, ``as-is`` nothing.

    >>> c = Conversation("c", "s", questions=[Question("q", "What did Ana paint?", (), "1", 0.0)])
    >>> rephrase(c, "lower-bare"); c.questions[0].question
    'what did ana paint'
    """
    if phrasing not in PHRASINGS:
        raise ValueError(f"phrasing: {phrasing!r} is not one of {', '.join(PHRASINGS)}")
    if phrasing == "as-is":
        return
    out = []
    for question in conversation.questions:
        text = question.question
        if "lower" in phrasing:
            text = text.lower()
        if "bare" in phrasing:
            text = text.rstrip().rstrip("?").rstrip()
        out.append(dataclasses.replace(question, question=text))
    conversation.questions = out


def read(path: Path) -> list[Conversation]:
    """Chatbench directory or LoCoMo JSON file."""
    if path.is_dir():
        return read_chatbench(path)
    return read_locomo(path)


# -- baselines ---------------------------------------------------------------------------------


def _packed(lines: Iterator[tuple[str, int]], budget: int) -> set[str]:
    chosen: set[str] = set()
    used = 0
    for memory_id, cost in lines:
        if used + cost > budget:
            continue
        chosen.add(memory_id)
        used += cost
    return chosen


def run(
    conversations: Sequence[Conversation],
    *,
    budgets: Sequence[int],
    model: str,
    embedder: str = "minilm",
    limit: int | None,
    db: str = ":memory:",
    embed: str | None = None,
    timings: list[float] | None = None,
    retrieval: RetrievalWeights | None = None,
    policy: BudgetPolicy | None = None,
    change_window: float | None = None,
    where: dict[tuple[int, str], dict[str, int]] | None = None,
    dump: TextIO | None = None,
    dump_as: str = "",
) -> dict[str, dict[int, dict[str, list[float]]]]:
    """Recall per method, budget and category (a list of per-question recalls).

    Each conversation is its own tenant. The engine has the default configuration but for
    ``default_model`` (``model``), ``embed`` (default: the config's) and ``embedder`` (its name;
    ``"none"`` turns embedding off). ``db``: a file keeps the store (and its vectors) for the
    next run; records already there are known and not embedded again. ``change_window``
    (seconds; default: the config's) sets free-text change detection. ``timings`` receives the
    seconds of every ``assemble`` call. The ``"all"`` list leaves out the categories a
    conversation shows apart (LoCoMo's adversarial category 5). ``where`` receives, per
    (budget, category), how many evidence memories went where (:func:`evidence_place`).
    ``dump`` receives one JSON line per question and budget: the related candidates with their
    score components, cost, whether they were included and whether they are evidence
    (:func:`dump_line`, the data set named ``dump_as``; read by ``bench/ranking_ceiling.py``).
    """
    results: dict[str, dict[int, dict[str, list[float]]]] = {
        m: {b: defaultdict(list) for b in budgets} for m in ("ctxwarden", "recency", "bm25")
    }
    defaults = EngineConfig()
    embed = "off" if embedder == "none" else (embed or defaults.embed)
    config = EngineConfig(
        default_model=model,
        retrieval=retrieval or defaults.retrieval,
        embed=embed,
        embedder=defaults.embedder if embedder == "none" else embedder,
        change_window=defaults.change_window if change_window is None else change_window,
    )
    clock_now = [0.0]

    def clock() -> float:
        return clock_now[0]

    with Engine.open(db, config=config, clock=clock) as engine:
        for conversation in conversations:
            tenant = conversation.name
            started = time.perf_counter()
            engine.ingest(conversation.records, tenant=tenant)
            ingest_s = time.perf_counter() - started
            embedded = 0
            started = time.perf_counter()
            if embed != "off":  # the steady state: every memory embedded before it is asked about
                embedded = engine.embed_pending(batch_size=32)
            embed_s = time.perf_counter() - started
            print(
                f"# {conversation.name}: {len(conversation.records)} records ingested in "
                f"{ingest_s:.1f}s; {embedded} embedded in {embed_s:.1f}s; "
                f"{len(conversation.questions)} questions",
                file=sys.stderr,
            )
            tok = tokens.get_tokenizer(engine.registry.resolve(model).tokenizer)
            history = list(engine.store.iter_memories(tenant))
            line_cost = {m.id: tok.count(render.line_text(m)) for m in history}
            questions = conversation.questions[:limit] if limit else conversation.questions
            for question in questions:
                clock_now[0] = question.asked_at
                wanted = set()
                for evidence in question.evidence:
                    try:
                        wanted.add(engine.get(evidence, tenant=tenant).id)
                    except NotFound:
                        wanted.add(evidence)
                visible = [m for m in history if m.created_at <= question.asked_at]
                hits = engine.store.search(tenant, query_terms(question.question), limit=400)
                for budget in budgets:
                    started = time.perf_counter()
                    context = engine.assemble(
                        tenant=tenant,
                        session=conversation.session,
                        query=question.question,
                        model=model,
                        budget=budget,
                        log_inclusions=False,
                        policy=policy,
                        # A team whose whole history is shared: every session's evidence.
                        scope="tenant",
                    )
                    if timings is not None:
                        timings.append(time.perf_counter() - started)
                    if dump is not None:
                        dump.write(
                            dump_line(dump_as, conversation, question, budget, context, wanted)
                        )
                    if where is not None:
                        places = where.setdefault((budget, question.category), defaultdict(int))
                        for place in evidence_place(context, wanted):
                            places[place] += 1
                    got = {
                        # Over its budget, a context scores nothing.
                        "ctxwarden": set(context.included) if context.tokens <= budget else set(),
                        "recency": _packed(
                            ((m.id, line_cost[m.id]) for m in reversed(visible)), budget
                        ),
                        "bm25": _packed(((m.id, line_cost[m.id]) for m, _ in hits), budget),
                    }
                    for method, ids in got.items():
                        recall = len(wanted & ids) / len(wanted) if wanted else 0.0
                        results[method][budget][question.category].append(recall)
                        if question.category not in conversation.apart:
                            results[method][budget]["all"].append(recall)
    return results


#: Where an evidence memory can be, best first (the columns of :func:`show_where`).
PLACES = ("related", "neighbour", "recent", "top 20", "top 50", "top 100", "deeper",
          "not retrieved")  # fmt: skip


def dump_line(
    data: str,
    conversation: Conversation,
    question: Question,
    budget: int,
    context: Any,
    wanted: set[str],
) -> str:
    """One question's related candidates as a JSON line: ``data`` (the data set),
    ``conversation``, ``category``, ``apart`` (a category shown apart), ``budget``, ``wanted``
    (evidence ids), ``found`` (evidence ids in the context, any block) and ``candidates``:
    ``id``, ``included``, ``tokens``, ``score``, ``components`` (the report's) and
    ``evidence``, in report order."""
    candidates = [
        {
            "id": c.id,
            "included": c.included,
            "tokens": c.tokens,
            "score": c.score,
            "components": dict(c.components),
            "evidence": c.id in wanted,
        }
        for c in context.report.candidates
        if c.block == "related"
    ]
    line = {
        "data": data,
        "conversation": conversation.name,
        "category": question.category,
        "apart": question.category in conversation.apart,
        "budget": budget,
        "wanted": sorted(wanted),
        "found": sorted(wanted & set(context.included)) if context.tokens <= budget else [],
        "candidates": candidates,
    }
    return json.dumps(line) + "\n"


def evidence_place(context: Any, wanted: set[str]) -> list[str]:
    """Where each of ``wanted`` went in ``context``: included in the related block as a hit
    (``related``) or as a hit's neighbour (``neighbour``), in the ``recent`` block (or another
    block, by its name), left out at a rank of the related candidates (``top 20`` ... ``deeper``:
    retrieved, but more than fit), or ``not retrieved`` (in no candidate list at all)."""
    rows = {c.id: (rank, c) for rank, c in enumerate(
        c for c in context.report.candidates if c.block == "related")}  # fmt: skip
    blocks = {c.id: c for c in context.report.candidates if c.included}
    out = []
    for memory_id in sorted(wanted):
        if memory_id in context.included:
            chosen = blocks.get(memory_id)
            block = chosen.block if chosen is not None else "recent"
            if block == "related" and any(k.startswith("neighbour") for k in chosen.components):
                block = "neighbour"
            out.append(block)
        elif memory_id in rows:
            rank = rows[memory_id][0]
            out.append("top 20" if rank < 20 else "top 50" if rank < 50
                       else "top 100" if rank < 100 else "deeper")  # fmt: skip
        else:
            out.append("not retrieved")
    return out


def show_where(where: dict[tuple[int, str], dict[str, int]], *, apart: frozenset[str]) -> None:
    """One markdown table: the share (%) of evidence memories in each place, per budget and
    category (and all categories but those shown ``apart``)."""
    print("\nwhere the evidence went (% of evidence memories; ranks among related candidates)")
    print("| budget | category | n | " + " | ".join(PLACES) + " | other |")
    print("|---|---|---:|" + "---:|" * (len(PLACES) + 1))
    for budget in sorted({b for b, _ in where}):
        categories = sorted(c for b, c in where if b == budget)
        overall: dict[str, int] = defaultdict(int)
        for category in categories:
            if category not in apart:
                for place, count in where[(budget, category)].items():
                    overall[place] += count
        for category, places in [*((c, where[(budget, c)]) for c in categories),
                                 ("all" if not apart else "all but " + ",".join(sorted(apart)),
                                  overall)]:  # fmt: skip
            total = sum(places.values()) or 1
            other = sum(v for k, v in places.items() if k not in PLACES)
            cells = [f"{100 * places.get(p, 0) / total:.1f}" for p in PLACES]
            print(f"| {budget} | {category} | {sum(places.values())} | " + " | ".join(cells)
                  + f" | {100 * other / total:.1f} |")  # fmt: skip


def percentile(values: Sequence[float], share: float) -> float:
    """The ``share`` quantile of ``values`` (nearest rank)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(share * len(ordered)) - 1))]


def show(
    results: dict[str, dict[int, dict[str, list[float]]]],
    budgets: Sequence[int],
    *,
    apart: frozenset[str] = frozenset(),
) -> None:
    """One markdown table: recall / full-hit (%) per category and overall, per budget and method."""
    categories = sorted({c for b in results["ctxwarden"].values() for c in b if c != "all"})
    overall = "all" if not apart else "all but " + ",".join(sorted(apart))
    columns = [c for c in categories if c not in apart] + ["all"] + sorted(apart & set(categories))
    names = [overall if c == "all" else c for c in columns]
    print("recall / full-hit (%), n = questions per column")
    print("| budget | method | " + " | ".join(names) + " |")
    print("|---|---|" + "---:|" * len(columns))
    print("| n | | " + " | ".join(str(len(results["ctxwarden"][budgets[0]][c])) for c in columns)
          + " |")  # fmt: skip
    for budget in budgets:
        for method in ("ctxwarden", "bm25", "recency"):
            row = results[method][budget]
            cells = [
                f"{100 * sum(row[c]) / len(row[c]):.1f} / "
                f"{100 * sum(1 for r in row[c] if r >= 1.0) / len(row[c]):.1f}"
                if row[c]
                else "-"
                for c in columns
            ]
            print(f"| {budget} | {method} | " + " | ".join(cells) + " |")


def _policy(recent_share: int | None, recent_floor: int | None = None) -> BudgetPolicy | None:
    if recent_share is None and recent_floor is None:
        return None
    base = chat_policy()
    blocks = base.blocks
    if recent_share is not None:
        shares = {"recent": recent_share, "related": 75 - recent_share}
        blocks = tuple(
            dataclasses.replace(b, share=shares[b.name]) if b.name in shares else b for b in blocks
        )
    if recent_floor is not None:
        blocks = tuple(
            dataclasses.replace(b, floor=recent_floor) if b.name == "recent" else b for b in blocks
        )
    return chat_policy(blocks=blocks)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("data", type=Path, nargs="*", default=list(DEFAULT_DATA))
    parser.add_argument("--budgets", default="1000,2000,4000,8000")
    parser.add_argument("--model", default="gpt-4-turbo")
    parser.add_argument(
        "--embed", default=None, help="off, sync or background (default: EngineConfig's)"
    )
    parser.add_argument("--embedder", default=EngineConfig().embedder, help="minilm, ...")
    parser.add_argument("--limit", type=int, default=None, help="questions per conversation")
    parser.add_argument("--db", default=":memory:", help="keep the store (and vectors) here")
    parser.add_argument("--filler", type=int, default=0, help="distractors per conversation")
    parser.add_argument(
        "--recent-share",
        type=int,
        default=None,
        help="what-if: the chat policy with this share (%%) for recent, the rest of the two "
        "blocks' 75 to related (default: the policy as it is)",
    )
    parser.add_argument(
        "--recent-floor",
        type=int,
        default=None,
        help="what-if: the chat policy with this floor (tokens) for recent (default: its own)",
    )
    parser.add_argument(
        "--weights", default="", help="RetrievalWeights fields to change: name=value,..."
    )
    parser.add_argument(
        "--change-window",
        type=float,
        default=None,
        help="days change detection looks back (0: off; default: EngineConfig's)",
    )
    parser.add_argument(
        "--phrasing",
        choices=PHRASINGS,
        default="as-is",
        help="ask the questions lower-cased, without their question mark, or both",
    )
    parser.add_argument(
        "--where",
        action="store_true",
        help="also print where the evidence went: included (block), left out at a rank of the "
        "related candidates, or not retrieved",
    )
    parser.add_argument(
        "--dump",
        type=Path,
        default=None,
        help="write every question's related candidates (score components, cost, included, "
        "evidence) to this JSON-lines file, for bench/ranking_ceiling.py",
    )
    args = parser.parse_args(argv)
    budgets = [int(b) for b in args.budgets.split(",")]
    # --embedder none turns embedding off (as run() does), whatever --embed says
    embed = "off" if args.embedder == "none" else (args.embed or EngineConfig().embed)
    changes = dict(item.split("=", 1) for item in args.weights.split(",") if item)
    retrieval = RetrievalWeights(
        **{k: type(getattr(RetrievalWeights(), k))(float(v)) for k, v in changes.items()}
    )
    dump = args.dump.open("w", encoding="utf-8") if args.dump else None
    try:
        for path in args.data:
            measure(path, args, budgets=budgets, embed=embed, retrieval=retrieval, dump=dump)
    finally:
        if dump is not None:
            dump.close()


def measure(
    path: Path,
    args: argparse.Namespace,
    *,
    budgets: list[int],
    embed: str,
    retrieval: RetrievalWeights,
    dump: TextIO | None,
) -> None:
    """Run and print one data set (:func:`main`'s options in ``args``)."""
    window = None if args.change_window is None else args.change_window * 86400.0
    conversations = read(path)
    for conversation in conversations:
        add_filler(conversation, args.filler)
        rephrase(conversation, args.phrasing)
    timings: list[float] = []
    where: dict[tuple[int, str], dict[str, int]] | None = {} if args.where else None
    results = run(
        conversations,
        budgets=budgets,
        model=args.model,
        embedder=args.embedder,
        embed=embed,
        limit=args.limit,
        db=args.db,
        timings=timings,
        retrieval=retrieval,
        policy=_policy(args.recent_share, args.recent_floor),
        change_window=window,
        where=where,
        dump=dump,
        dump_as=path.name,
    )
    vectors = f"embed {embed}" + (f", weights {args.weights}" if args.weights else "")
    vectors += f", recent share {args.recent_share}%" if args.recent_share else ""
    vectors += f", recent floor {args.recent_floor}" if args.recent_floor is not None else ""
    vectors += f" ({args.embedder})" if embed != "off" else ""
    changes_on = window if window is not None else EngineConfig().change_window
    vectors += f", change window {changes_on / 86400:g} days"
    vectors += f", questions {args.phrasing}" if args.phrasing != "as-is" else ""
    print(f"\n{path.name}: evidence recall, model {args.model}, {vectors}"
          + (f", {args.filler} distractors" if args.filler else ""))  # fmt: skip
    apart = frozenset().union(*(c.apart for c in conversations))
    show(results, budgets, apart=apart)
    if where is not None:
        show_where(where, apart=apart)
    if timings:
        print(
            f"assemble: p50 {1000 * percentile(timings, 0.5):.1f} ms, p95 "
            f"{1000 * percentile(timings, 0.95):.1f} ms over {len(timings)} calls"
            + (" (the query's embedding included)" if embed != "off" else "")
        )


if __name__ == "__main__":
    main()
