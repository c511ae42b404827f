"""Retention after compaction, measured on chatbench-dev and locomo-dev.

    uv run python bench/retention.py [DATA ...] [--budget 4000] [--keep-days 7]
        [--keep-sessions 2] [--objects 12] [--conversations N] [--limit N] [--embed MODE]

``DATA`` is a chatbench directory (``messages.jsonl`` + ``qa.jsonl``) or a LoCoMo JSON file; it
defaults to ../shared/data/chatbench-dev and ../shared/data/locomo-dev/locomo-dev.json (the first
``shared/data`` beside the repository or beside one of its parents, as bench/evidence_recall.py).

Each data set gets one store. Its messages are ingested, then a context is assembled per
question at 4k tokens (model gpt-4, cl100k) and the questions whose gold answer string is in the
assembled context (case-insensitive) are counted. Then old memories are compacted with the
extractive summariser and the questions are asked again; the store's size is compared (after
FTS optimize and VACUUM on both sides, so free pages do not count).

- chatbench-dev: compacts everything older than the last ``--keep-days`` days.
- locomo-dev: each conversation is a tenant of its own, its clock just after its last turn, and
  compaction takes all but its last ``--keep-sessions`` sessions. Questions of category 5
  (adversarial: no answer in the conversation) and items without an ``answer`` are left out.
  ``--conversations N`` takes only the first N conversations of a LoCoMo file, ``--limit N``
  the first N questions of each data set's tenants (a quick run); ``--embed`` sets
  ``EngineConfig.embed`` (default: the config's).

Below each table: where the store's bytes are before and after (SQLite's ``dbstat``, per table
and index, the ``--objects`` largest after compaction), when this SQLite has ``dbstat``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ctxwarden import Engine
from ctxwarden.attachments import with_note
from ctxwarden.compact import CompactionPolicy
from ctxwarden.engine import EngineConfig
from ctxwarden.errors import StoreError
from ctxwarden.pack import PACK_FORMAT_KEY
from ctxwarden.store.sqlite import SQLiteStore
from ctxwarden.tokens import get_tokenizer
from ctxwarden.types import parse_time
from evidence_recall import DATA, read_locomo

DAY = 86400.0


@dataclass(slots=True)
class Case:
    """One tenant's log, its questions, its clock and what compaction takes."""

    tenant: str
    session: str
    messages: list[dict[str, Any]]
    #: (question, gold answer)
    qa: list[tuple[str, str]]
    now: float
    #: compaction's ``older_than``: everything created before ``now - older_than`` is eligible
    older_than: float


@dataclass(slots=True)
class DataSet:
    name: str
    cases: list[Case] = field(default_factory=list)
    note: str = ""


def _load(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]


def read_chatbench(folder: Path, keep_days: float, limit: int | None = None) -> DataSet:
    messages = _load(folder / "messages.jsonl")
    qa = [(str(q["question"]), str(q["answer"])) for q in _load(folder / "qa.jsonl")][:limit]
    now = max(parse_time(m["created_at"]) for m in messages) + 60
    case = Case(tenant="default", session=messages[0]["session"], messages=messages, qa=qa,
                now=now, older_than=keep_days * DAY)  # fmt: skip
    return DataSet(folder.name, [case], f"compacting all but the last {keep_days:g} days")


def read_locomo_cases(
    path: Path, keep_sessions: int, conversations: int | None = None, limit: int | None = None
) -> DataSet:
    raw = json.loads(path.read_text(encoding="utf-8"))
    samples = raw if isinstance(raw, list) else [raw]
    items = {str(s.get("sample_id", f"sample-{n}")): s.get("qa", []) for n, s in enumerate(samples)}
    out = DataSet(path.stem, note=f"compacting all but the last {keep_sessions} sessions")
    for conversation in read_locomo(path)[:conversations]:
        qa = []
        for question in conversation.questions:
            item = items[conversation.name][int(question.qid.rsplit("-", 1)[1])]
            if question.category not in conversation.apart and "answer" in item:
                qa.append((question.question, str(item["answer"])))
        qa = qa[:limit]
        records = conversation.records
        starts: dict[str, float] = {}
        for record in records:
            starts.setdefault(record["channel"], float(record["created_at"]))
        kept = sorted(starts.values())[-keep_sessions:] if keep_sessions else []
        now = max(float(r["created_at"]) for r in records) + 60
        cut = min(kept) if kept else now
        out.cases.append(
            Case(
                tenant=conversation.name,
                session=conversation.session,
                messages=records,
                qa=qa,
                now=now,
                older_than=now - cut,
            )
        )
    return out


def _retention(engine: Engine, case: Case, budget: int) -> int:
    hits = 0
    for question, answer in case.qa:
        context = engine.assemble(
            session=case.session, query=question, model="gpt-4", budget=budget,
            tenant=case.tenant, log_inclusions=False, scope="tenant",  # the whole history
        )  # fmt: skip
        text = "\n".join(str(m.get("content") or "") for m in context.messages).casefold()
        hits += answer.casefold() in text
    return hits


def _size(store: SQLiteStore) -> int:
    """The database's bytes after FTS optimize and VACUUM: its pages, not the file's length
    (the file shrinks only when the checkpoint after VACUUM gets the WAL to itself)."""
    with contextlib.suppress(StoreError):  # a busy checkpoint: vacuumed, the file not shrunk
        store.vacuum()
    rows = store._query("PRAGMA page_count", ())
    pages = int(rows[0][0]) - int(store._query("PRAGMA freelist_count", ())[0][0])
    return pages * int(store._query("PRAGMA page_size", ())[0][0])


def _objects(store: SQLiteStore) -> dict[str, int] | None:
    """Bytes per table and index (None when SQLite lacks ``dbstat``, a compile-time option)."""
    try:
        rows = store._query("SELECT name, sum(pgsize) FROM dbstat GROUP BY name", ())
    except StoreError:
        return None
    return {str(name): int(size) for name, size in rows}


def _count(store: SQLiteStore, table: str) -> int:
    return int(store._query(f"SELECT count(*) FROM {table}", ())[0][0])


def run(
    data: DataSet, budget: int, objects: int, share: float | None, embed: str | None = None
) -> bool:
    clock = [0.0]
    config = EngineConfig(default_model="gpt-4", tokenizers=("cl100k_base",))
    if embed is not None:
        config = replace(config, embed=embed)
    tok = get_tokenizer("cl100k_base")
    questions = sum(len(c.qa) for c in data.cases)
    events = sum(len(c.messages) for c in data.cases)
    with (
        tempfile.TemporaryDirectory() as tmp,
        Engine.open(Path(tmp) / "bench.db", config=config, clock=lambda: clock[0]) as engine,
    ):
        store = engine.store
        assert isinstance(store, SQLiteStore)
        for case in data.cases:
            clock[0] = case.now
            engine.ingest(case.messages, tenant=case.tenant)
        memories_before = _count(store, "memories")
        size_before = _size(store)
        objects_before = _objects(store)
        before = 0
        for case in data.cases:
            clock[0] = case.now
            before += _retention(engine, case, budget)
        t0 = time.perf_counter()
        compacted = clusters = summaries = left_alone = 0
        for case in data.cases:
            clock[0] = case.now
            policy = CompactionPolicy(older_than=case.older_than)
            if share is not None:
                policy = replace(policy, max_summary_share=share)
            plan = engine.compact_plan(policy=policy, tenant=case.tenant)
            result = engine.compact(plan, tenant=case.tenant)
            compacted += result.compacted
            clusters += len(plan.clusters)
            summaries += len(result.summaries)
            left_alone += result.left_alone
        seconds = time.perf_counter() - t0
        memories_after = _count(store, "memories")
        size_after = _size(store)
        objects_after = _objects(store)
        after = 0
        for case in data.cases:
            clock[0] = case.now
            after += _retention(engine, case, budget)
        raw_tokens = sum(
            tok.count(str(m.get("content") or "")) for c in data.cases for m in c.messages
        )
        # A lossless pack (CompactionPolicy.lossless_packs) keeps its originals' text: what it
        # adds to the store is what it keeps per line beside that text, not a summary's worth.
        # Counted as stored (the column, not the rendering reads return: a pack in
        # ctxwarden.pack's stored format keeps `author: text` lines, its ids and times being
        # the summary's source_ids and the tombstones'), plus the metadata that names the
        # format, as the JSON it is stored as.
        summary_tokens = packs = pack_tokens = pack_sources = 0
        for c in data.cases:
            said = {
                str(m["id"]): with_note(str(m.get("content") or ""), m.get("attachments"))
                for m in c.messages
            }
            stored = {
                str(id_): (str(content), json.loads(metadata or "{}"))
                for id_, content, metadata in store._query(
                    "SELECT id, content, metadata FROM memories WHERE tenant = ? "
                    "AND kind = 'summary'",
                    (c.tenant,),
                )
            }
            for s in store.summaries(c.tenant):
                text, metadata = stored[s.id]
                if metadata.get("lossless"):
                    packs += 1
                    pack_tokens += tok.count(text)
                    if PACK_FORMAT_KEY in metadata:
                        marker = {PACK_FORMAT_KEY: metadata[PACK_FORMAT_KEY]}
                        pack_tokens += tok.count(json.dumps(marker))
                    pack_sources += sum(tok.count(said.get(i, "")) for i in s.source_ids)
                else:
                    summary_tokens += tok.count(text)
    print(f"## {data.name}: {events} events in {len(data.cases)} tenant(s), {questions} "
          f"questions, budget {budget} tokens (gpt-4, cl100k); {data.note}")  # fmt: skip
    print()
    print("| | before | after | after / before |")
    print("|---|---:|---:|---:|")
    ratio = after / before if before else float("nan")
    print(f"| answer string in context | {before / questions:.1%} | {after / questions:.1%} | "
          f"{ratio:.1%} |")  # fmt: skip
    print(f"| memories | {memories_before} | {memories_after} | "
          f"{memories_after / memories_before:.1%} |")  # fmt: skip
    print(f"| store size (bytes, vacuumed) | {size_before:,} | {size_after:,} | "
          f"{size_after / size_before:.1%} |")  # fmt: skip
    print()
    print(f"{compacted} memories in {clusters} clusters -> {summaries} summaries in "
          f"{seconds:.1f} s; {left_alone} clusters left alone (their summary would lose a "
          "fact)")  # fmt: skip
    growth = summary_tokens + max(0, pack_tokens - pack_sources)
    print(
        f"summary growth: {summary_tokens:,} summary tokens + {pack_tokens - pack_sources:,} "
        f"of {packs} lossless packs ({pack_tokens:,} tokens stored for their originals' "
        f"{pack_sources:,}, attachments' text included) = {growth / raw_tokens:.1%} of the raw "
        f"log's {raw_tokens:,} (cl100k)"
    )
    ok_retention = after >= 0.95 * before
    ok_size = size_after <= 0.55 * size_before
    ok_growth = growth <= 0.10 * raw_tokens
    print(f"targets: retention >= 95% of before: {'met' if ok_retention else 'NOT met'}; "
          f"store size <= 55% of before: {'met' if ok_size else 'NOT met'}; "
          f"summaries <= 10% of the raw log: {'met' if ok_growth else 'NOT met'}")  # fmt: skip
    if objects_before is not None and objects_after is not None and objects > 0:
        print()
        print("| table or index | bytes before | bytes after | share of after |")
        print("|---|---:|---:|---:|")
        names = sorted(objects_after, key=lambda n: -objects_after[n])
        for name in names[:objects]:
            print(f"| {name} | {objects_before.get(name, 0):,} | {objects_after[name]:,} | "
                  f"{objects_after[name] / size_after:.1%} |")  # fmt: skip
        rest = names[objects:]
        rest_before = sum(objects_before.get(n, 0) for n in rest)
        rest_after = sum(objects_after[n] for n in rest)
        print(f"| {len(rest)} others | {rest_before:,} | {rest_after:,} | "
              f"{rest_after / size_after:.1%} |")  # fmt: skip
    print()
    return ok_retention and ok_size


def data_arguments(parser: argparse.ArgumentParser) -> None:
    """The data sets and what of them stays uncompacted (shared with bench/store_bytes.py)."""
    parser.add_argument(
        "data",
        type=Path,
        nargs="*",
        default=[DATA / "chatbench-dev", DATA / "locomo-dev" / "locomo-dev.json"],
        help="chatbench folders (messages.jsonl + qa.jsonl) or LoCoMo JSON files",
    )
    parser.add_argument("--keep-days", type=float, default=7.0, help="chatbench: days kept")
    parser.add_argument("--keep-sessions", type=int, default=2, help="LoCoMo: sessions kept")


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    data_arguments(parser)
    parser.add_argument("--budget", type=int, default=4000)
    parser.add_argument("--objects", type=int, default=12, help="tables and indexes listed")
    parser.add_argument(
        "--max-summary-share",
        type=float,
        default=None,
        help="CompactionPolicy.max_summary_share (default: the policy's)",
    )
    parser.add_argument(
        "--conversations", type=int, default=None, help="LoCoMo: the first N conversations"
    )
    parser.add_argument("--limit", type=int, default=None, help="questions per tenant")
    parser.add_argument(
        "--embed", choices=["off", "sync", "background"], default=None, help="EngineConfig.embed"
    )
    args = parser.parse_args(argv)
    for path in args.data:
        if not path.exists():
            parser.error(f"{path}: no such folder or file (a chatbench folder or LoCoMo JSON)")
        if path.is_dir() and not (path / "messages.jsonl").is_file():
            # A folder of data sets (../shared/data): both.
            found = [path / "chatbench-dev", path / "locomo-dev" / "locomo-dev.json"]
            paths = [p for p in found if p.exists()]
        else:
            paths = [path]
        for item in paths:
            if item.is_dir():
                data = read_chatbench(item, args.keep_days, args.limit)
            else:
                data = read_locomo_cases(item, args.keep_sessions, args.conversations, args.limit)
            run(data, args.budget, args.objects, args.max_summary_share, args.embed)


if __name__ == "__main__":
    main()
