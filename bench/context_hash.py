"""One hash of every context the engine assembles for the dev questions: the refactoring yardstick.

Usage::

    uv run python bench/context_hash.py [DATA ...] [--budgets 1000,2000,4000,8000] [--limit N]

``DATA`` defaults to ../shared/data/chatbench-dev and ../shared/data/locomo-dev/locomo-dev.json
(the first ``shared/data`` beside the repository or beside one of its parents), read by
``bench/evidence_recall.py``'s loaders. Each conversation is ingested into its own in-memory
store with the default :class:`~ctxwarden.engine.EngineConfig` (no embeddings: the default
``embed="off"``, so retrieval is lexical), as its own tenant, the clock at 0 as in the recall
bench. Then, with the clock at each question's time, the engine assembles the
context for the question at each budget (``log_inclusions=False``, so no question's access bumps
change the next one's ranking and each hash depends only on the code and the data).

Prints one sha256 per dataset and budget over, for every question in order, the context's
messages and included ids (canonical JSON; the context's random id is left out), and a total over
those lines. A change that should not alter behaviour (moving code between modules, splitting a
class) must leave every line identical; run it before and after and compare. A line that moves
names the dataset and budget to look at.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ctxwarden.engine import Engine, EngineConfig
from evidence_recall import Conversation, read

# ../shared/data beside the repository, or beside a parent of it (a worktree under wt/).
_PARENTS = Path(__file__).resolve().parents[2:]
DATA = next(
    (p / "shared" / "data" for p in _PARENTS if (p / "shared").exists()),
    Path("../shared/data"),
)
DEFAULT_DATA = (DATA / "chatbench-dev", DATA / "locomo-dev" / "locomo-dev.json")
BUDGETS = (1000, 2000, 4000, 8000)


def context_hashes(
    conversations: Sequence[Conversation], budgets: Sequence[int], *, limit: int | None = None
) -> dict[int, str]:
    """sha256 per budget over every question's assembled (messages, included ids), in order."""
    digests = {budget: hashlib.sha256() for budget in budgets}
    clock_now = [0.0]
    for conversation in conversations:
        # One store per conversation: the store's term-count caches expire by wall time (600 s),
        # so a store shared by a whole dataset would make the hashes depend on how long the run
        # takes.
        engine = Engine.open(":memory:", config=EngineConfig(), clock=lambda: clock_now[0])
        with engine:
            clock_now[0] = 0.0
            engine.ingest(conversation.records, tenant=conversation.name)
            questions = conversation.questions[:limit] if limit else conversation.questions
            for question in questions:
                clock_now[0] = question.asked_at
                for budget in budgets:
                    context = engine.assemble(
                        tenant=conversation.name,
                        session=conversation.session,
                        query=question.question,
                        budget=budget,
                        log_inclusions=False,
                    )
                    payload = {
                        "qid": question.qid,
                        "messages": [dict(m) for m in context.messages],
                        "included": list(context.included),
                    }
                    line = json.dumps(payload, sort_keys=True, ensure_ascii=False)
                    digests[budget].update(line.encode("utf-8") + b"\n")
    return {budget: digest.hexdigest() for budget, digest in digests.items()}


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("data", type=Path, nargs="*", default=list(DEFAULT_DATA))
    parser.add_argument("--budgets", default=",".join(str(b) for b in BUDGETS))
    parser.add_argument("--limit", type=int, default=None, help="questions per conversation")
    args = parser.parse_args(argv)
    budgets = [int(b) for b in args.budgets.split(",")]
    total = hashlib.sha256()
    for path in args.data:
        conversations = read(path)
        questions = sum(
            len(c.questions[: args.limit] if args.limit else c.questions) for c in conversations
        )
        for budget, digest in context_hashes(conversations, budgets, limit=args.limit).items():
            line = f"{path.name if path.is_dir() else path.stem} {budget} {digest}"
            total.update(line.encode("utf-8") + b"\n")
            print(f"{line}  ({questions} questions)")
    print(f"total {total.hexdigest()}")


if __name__ == "__main__":
    main()
