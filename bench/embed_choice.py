"""Speed and ranking quality of the offline embedders (and optional variants of the static one).

Quality: for each pair (a sentence and a paraphrase of it in other words), the paraphrase is
ranked among every other pair's second sentence plus unrelated distractors; we report top-1, MRR
and the pairwise share (paraphrase scores above a given unrelated candidate). Pairs are written
for this script (chat-memory style: a later question and the earlier message that answers it)
and are distinct from the held-out pairs in tests/test_embed.py.

Speed: embeddings/s for 30-word messages, one thread, batch as the engine would send it.

    uv run python bench/embed_choice.py [--static PATH ...] [--messages N]

``--messages`` caps the messages each embedder's speed is measured on (default: 400 for MiniLM,
20,000 for a static table).
"""

from __future__ import annotations

import argparse
import random
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ctxwarden.embed import Embedder, MiniLMEmbedder, StaticEmbedder, _load_tokenizer

PAIRS = [
    (
        "My flight to Lisbon leaves on Thursday at 7 in the morning.",
        "When does the plane to Portugal depart?",
    ),
    (
        "I adopted a beagle puppy last month, her name is Daisy.",
        "What kind of dog did I get recently?",
    ),
    (
        "The production database ran out of disk space overnight.",
        "Why did the prod DB go down last night?",
    ),
    (
        "I'm allergic to peanuts, so please avoid recipes with them.",
        "Which foods must I stay away from?",
    ),
    (
        "We moved the weekly sync to Tuesdays at 3 pm.",
        "What day is our recurring team meeting now?",
    ),
    (
        "My sister lives in Toronto and works as a nurse.",
        "Where is my sibling based and what is her job?",
    ),
    (
        "The invoice for March is still unpaid by the client.",
        "Has the customer settled last month's bill?",
    ),
    (
        "I started learning the violin in January.",
        "What instrument have I been practising this year?",
    ),
    (
        "The API returns HTTP 503 when the cache cluster is down.",
        "What status code do we get if Redis is unavailable?",
    ),
    ("I prefer window seats on long-haul flights.", "Where do I like to sit on a plane?"),
    (
        "Our lease on the office ends in September.",
        "When does the rental contract for the workplace expire?",
    ),
    (
        "I ran my first half marathon in two hours and five minutes.",
        "How long did the 21 km race take me?",
    ),
    (
        "The build fails because the linter rejects unused imports.",
        "Why is CI red on the pull request?",
    ),
    ("My grandmother turns ninety next week.", "Whose birthday is coming up soon?"),
    (
        "We decided to use PostgreSQL instead of MongoDB for the new service.",
        "Which database did the team pick?",
    ),
    (
        "I've been feeling anxious about the job interview on Friday.",
        "How am I feeling about the upcoming hiring conversation?",
    ),
    ("The car needs new brake pads before the road trip.", "What repair does the vehicle need?"),
    (
        "Alice is vegetarian and Bob doesn't drink alcohol.",
        "What dietary restrictions do the guests have?",
    ),
    (
        "The quarterly revenue grew twelve percent over last year.",
        "How much did sales increase this quarter?",
    ),
    ("I lost my keys at the gym yesterday.", "Where did I misplace my house keys?"),
    (
        "The password reset emails are landing in spam folders.",
        "Why are users not receiving the account recovery messages?",
    ),
    (
        "We're painting the nursery pale green before the baby arrives.",
        "What colour will the child's bedroom be?",
    ),
    (
        "My doctor told me to cut down on salt because of high blood pressure.",
        "What did the physician advise about my diet?",
    ),
    ("The concert was cancelled due to the storm.", "Why didn't the show happen?"),
    ("I switched from Vim to VS Code last spring.", "Which editor do I use these days?"),
    (
        "Our daughter got accepted to the University of Edinburgh.",
        "Which college is my kid going to?",
    ),
    (
        "The memory leak was caused by an unbounded cache in the session store.",
        "What was the root cause of the growing RAM usage?",
    ),
    ("I'm saving up to buy a house in the countryside.", "What is my big financial goal?"),
    (
        "The train strike means I'll work from home on Monday.",
        "Why won't I be in the office at the start of the week?",
    ),
    ("Tom broke his wrist playing basketball.", "How did Tom get injured?"),
    (
        "The new hire, Priya, starts on the data team in two weeks.",
        "Who is joining the analytics group soon?",
    ),
    ("We ordered sushi for the team celebration.", "What food did we get for the party?"),
    (
        "I keep forgetting to water the tomato plants on the balcony.",
        "Which vegetables am I growing outside?",
    ),
    (
        "The contract renewal requires legal approval by Friday.",
        "What's the deadline for the lawyers to sign off on the agreement?",
    ),
    (
        "My laptop battery only lasts about an hour now.",
        "Is there a problem with my computer's charge?",
    ),
    ("The museum is closed on Mondays.", "Which day can't we visit the gallery?"),
    ("Deployments are frozen until after the holiday season.", "When can we ship releases again?"),
    ("I took up pottery classes on Wednesday evenings.", "What hobby do I do midweek?"),
    ("The kids have chickenpox, so we're staying home.", "Why are the children not at school?"),
    (
        "Our landlord raised the rent by two hundred euros.",
        "How much more is the apartment costing us?",
    ),
]

DISTRACTORS = [
    "Photosynthesis converts sunlight into chemical energy in plants.",
    "The referee showed a red card in the second half.",
    "Add two cups of flour and stir until smooth.",
    "The Eiffel Tower was completed in 1889.",
    "Please rotate the screen to landscape mode.",
    "Jupiter has dozens of moons.",
    "The knitting pattern uses a cable stitch.",
    "Stock markets closed mixed on Wednesday.",
    "The sonnet has fourteen lines.",
    "Turn left at the second roundabout.",
    "This sweater is made of merino wool.",
    "The chess opening is called the Sicilian Defence.",
    "Volcanoes form where tectonic plates meet.",
    "Thanks, that works for me!",
    "Can you summarise the article in three bullet points?",
    "The printer on the third floor is out of toner.",
    "Haha, that's hilarious.",
    "Let me know if you need anything else.",
    "The recipe calls for fresh basil and garlic.",
    "Whales communicate with low-frequency songs.",
]

WORDS = [
    "the",
    "a",
    "we",
    "should",
    "deploy",
    "database",
    "server",
    "migration",
    "tomorrow",
    "morning",
    "please",
    "check",
    "logs",
    "error",
    "failed",
    "because",
    "user",
    "account",
    "password",
    "reset",
    "meeting",
    "schedule",
    "team",
    "lunch",
    "friday",
    "budget",
    "report",
    "quarterly",
    "numbers",
    "customer",
    "complained",
    "about",
    "slow",
    "response",
    "times",
    "cache",
    "invalidation",
    "bug",
    "fixed",
    "yesterday",
    "release",
    "notes",
    "draft",
    "review",
    "my",
    "sister",
    "flight",
    "hotel",
    "dinner",
    "kids",
    "school",
]


def quality(embedder: Embedder) -> tuple[float, float, float]:
    """(top-1, MRR, pairwise share) of paraphrase retrieval."""
    queries = [b for _, b in PAIRS]
    corpus = [a for a, _ in PAIRS] + DISTRACTORS
    q = embedder.embed(queries)
    c = embedder.embed(corpus)
    sims = q @ c.T
    top1, rr, wins, total = 0, 0.0, 0, 0
    for i in range(len(PAIRS)):
        rank = int((sims[i] > sims[i, i]).sum()) + 1
        top1 += rank == 1
        rr += 1.0 / rank
        others = np.delete(sims[i], i)
        wins += int((others < sims[i, i]).sum())
        total += len(others)
    n = len(PAIRS)
    return top1 / n, rr / n, wins / total


def speed(embedder: Embedder, count: int = 400, batch: int = 32) -> tuple[float, float]:
    """30-word messages per wall second and per CPU second, sent ``batch`` at a time."""
    rng = random.Random(0)
    texts = [" ".join(rng.choice(WORDS) for _ in range(30)) for _ in range(count)]
    embedder.embed(texts[:batch])
    started, cpu = time.perf_counter(), time.process_time()
    for start in range(0, count, batch):
        embedder.embed(texts[start : start + batch])
    return count / (time.perf_counter() - started), count / (time.process_time() - cpu)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--static", type=Path, nargs="*", default=[], help="extra static tables")
    parser.add_argument("--messages", type=int, default=None, help="speed: at most N messages")
    args = parser.parse_args(argv)
    candidates: list[tuple[str, Embedder, int]] = [
        ("minilm-l6-int8@2, int8 (1 thread)", MiniLMEmbedder(), 400),
        ("minilm-l6-int8@1, float (1 thread)", MiniLMEmbedder(activations="float"), 400),
        ("minilm-static (vendored)", StaticEmbedder(), 20000),
    ]
    for path in args.static:
        variant = StaticEmbedder()
        variant._name = path.stem
        with np.load(path) as archive:
            variant._table = (
                archive["vectors"].astype(np.float32)
                * archive["scales"].astype(np.float32)[:, None]
            )
        tokenizer = _load_tokenizer()
        tokenizer.enable_truncation(max_length=variant.max_tokens)
        variant._tokenizer = tokenizer
        candidates.append((path.stem, variant, 20000))
    print(
        f"{'embedder':34} {'dim':>4} {'top-1':>6} {'MRR':>6} {'pairwise':>8} {'msgs/s':>8} "
        f"{'msgs/cpu-s':>10}"
    )
    for label, embedder, count in candidates:
        top1, mrr, pairwise = quality(embedder)
        rate, cpu_rate = speed(embedder, count=min(count, args.messages or count))
        print(
            f"{label:34} {embedder.dim:>4} {top1:>6.3f} {mrr:>6.3f} {pairwise:>8.3f} {rate:>8.0f} "
            f"{cpu_rate:>10.0f}"
        )


if __name__ == "__main__":
    main()
