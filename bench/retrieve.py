"""Retrieval speed at scale: a synthetic store, hybrid retrieval p50/p95, embedder throughput.

Usage::

    uv run python bench/retrieve.py [--n 1000000] [--queries 200] [--db PATH] [--keep]
        [--breakdown] [--other-tenants K]

Builds (or reuses, with ``--db`` and ``--keep``) a SQLite store of ``n`` synthetic chat messages
(40 authors, 8 channels, a vocabulary of ~3,000 words drawn Zipf-like, so common terms are common)
with a 384-d vector each. The vectors are MiniLM-like without running MiniLM ``n`` times: real
MiniLM embeddings of a few hundred template sentences, mixed (two per row, random weights) and
normalised. Then times :func:`ctxwarden.retrieve.retrieve` (lexical + vector candidates, fusion,
scoring, MMR, neighbours, token costs) for queries whose embedding is computed beforehand: the
timings exclude the query's embedding, which is reported separately with the embedders'
throughput on 30-word messages. Both wall and CPU time (``time.process_time``) per query are
printed: on a shared machine wall time mostly measures the wait for a core, so compare CPU time.
``--breakdown`` adds the CPU per query of each store search (main and bridge-hop BM25, vector,
author-scoped vector); ``--exact-check`` compares each query's author-scoped top 20 with exact
search over the author's stored vectors. Targets: p50 <= 20 ms, p95 <= 50 ms. Measured (README,
"Related memory"; rounds in docs/benchmarks.md): 100k CPU p50 12.1-12.5 / p95 14.3-14.8 ms, 1M
16.2-18.8 / 31.1-36.9 ms (load average 2-4). At 1M: FTS5 ranking of the main search ~5 ms and
of the two bridge hops ~2 ms, the graph search ~3 ms, the author scope ~2 ms warm (~12 ms the
first time per author), Python ~3-4 ms.
``--other-tenants K`` gives ``K`` of every ``K + 1`` rows to other tenants (queries still
search ``default``): the file's FTS5 statistics are then not the tenant's, and search ranks with
the tenant's own (``store/sqlite_tenant_lexical.py``).
A store kept with ``--keep`` is reused as it is (its queries differ from a fresh build's, as the
random generator is not advanced by the build). ``--templates N`` (300) and ``--texts N`` (512)
set how many sentences MiniLM embeds for the vectors and for the throughput line (a quick run).
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

from chat_text import sentence, vocabulary, zipf_weights
from ctxwarden.embed import MiniLMEmbedder, StaticEmbedder
from ctxwarden.retrieve import RetrievalWeights, retrieve
from ctxwarden.store.base import NewMemory
from ctxwarden.store.sqlite import SQLiteStore

AUTHORS = [f"user{i:02d}" for i in range(40)]
CHANNELS = ["general", "dev", "ops", "random", "alerts", "design", "sales", "support"]
#: Sentences MiniLM embeds, mixed two by two into the stored vectors (``--templates``).
TEMPLATES = 300


def build(
    path: Path, n: int, rng: np.random.Generator, others: int = 0
) -> tuple[SQLiteStore, list[str]]:
    vocab = vocabulary(rng)
    weights = zipf_weights(len(vocab))
    store = SQLiteStore(path)
    if store.stats("default")["memories"] >= n // (others + 1):
        return store, vocab
    embedder = MiniLMEmbedder()
    templates = [sentence(rng, vocab, weights) for _ in range(TEMPLATES)]
    base = embedder.embed(templates)
    started = time.perf_counter()
    batch = 20_000
    for start in range(0, n, batch):
        rows = []
        with store.write() as writer:
            for i in range(start, min(n, start + batch)):
                memory = NewMemory(
                    id=f"m{i}", tenant=_tenant(i, others), session="s", channel=CHANNELS[i % 8],
                    author=AUTHORS[int(rng.integers(0, 40))], author_kind="human", role="user",
                    content=sentence(rng, vocab, weights), created_at=1.7e9 + i * 30.0,
                    thread_id=None, reply_to=None, kind="message", pinned=False, name=None,
                    tool_calls=(), tool_call_id=None, attachments=(), metadata={},
                    content_hash=f"h{i}",
                )  # fmt: skip
                rows.append(writer.insert(memory))
        pick = rng.integers(0, len(base), size=(len(rows), 2))
        mix = rng.random((len(rows), 1)).astype(np.float32)
        vectors = base[pick[:, 0]] * mix + base[pick[:, 1]] * (1 - mix)
        vectors += rng.standard_normal(vectors.shape).astype(np.float32) * 0.02
        vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
        store.put_vectors(embedder.name, rows, vectors)
        print(f"  {start + len(rows):,} rows, {time.perf_counter() - started:.0f}s", flush=True)
    return store, vocab


def _tenant(row: int, others: int) -> str:
    """The tenant of the ``row``-th row: ``default`` for one in ``others + 1``."""
    return "default" if row % (others + 1) == 0 else f"other{row % (others + 1)}"


def _time_store_calls(store: SQLiteStore, spent: dict[str, list[float]]) -> None:
    """Wrap the store's searches to add up their CPU time (bridge hops ask for 10 results, the
    main lexical search for ``RetrievalWeights.candidates``, 100; a vector search's step is its
    rowids and cosines, the memories then read apart)."""
    search, vector_search = store.search, store.vector_search
    vector_nearest = store.vector_nearest  # retrieval's own vector searches (rowids first)

    def timed_search(
        tenant: str, terms: Any, *, limit: int = 100, require: Any = (), **rest: Any
    ) -> Any:
        began = time.process_time()
        found = search(tenant, terms, limit=limit, require=require, **rest)
        step = "lexical search (bridge hop)" if require else "lexical search"
        spent.setdefault(step, []).append((time.process_time() - began) * 1000)
        return found

    def timed_vector_search(*args: Any, **kwargs: Any) -> Any:
        began = time.process_time()
        found = vector_search(*args, **kwargs)
        step = "vector search (author)" if kwargs.get("author") else "vector search"
        spent.setdefault(step, []).append((time.process_time() - began) * 1000)
        return found

    def timed_vector_nearest(*args: Any, **kwargs: Any) -> Any:
        began = time.process_time()
        found = vector_nearest(*args, **kwargs)
        step = "vector search (author)" if kwargs.get("author") else "vector search"
        spent.setdefault(step, []).append((time.process_time() - began) * 1000)
        return found

    store.search = timed_search  # type: ignore[method-assign]
    store.vector_search = timed_vector_search  # type: ignore[method-assign]
    store.vector_nearest = timed_vector_nearest  # type: ignore[method-assign]


def exact_check(
    store: SQLiteStore, model: str, queries: list[str], vectors: list[Any], k: int = 20
) -> None:
    """Author-scoped vector search against exact search over the author's stored vectors
    (unit vectors in float16 as the index keeps them, scored in float32, ties by rowid):
    overlap@k and identical lists."""
    overlaps, same = [], 0
    by_author: dict[str, list[int]] = {}
    for number, query in enumerate(queries):
        by_author.setdefault(query.rsplit(" ", 1)[-1].rstrip("?"), []).append(number)
    for author, numbers in by_author.items():
        rows = store._conn.execute(
            "SELECT v.memory_rowid, v.embedding FROM memory_vectors v JOIN memories m "
            "ON m.rowid = v.memory_rowid WHERE m.author = ? AND m.tenant = ? AND v.model = ?",
            (author, "default", model),
        ).fetchall()
        ids = np.array([r[0] for r in rows], dtype=np.int64)
        matrix = np.frombuffer(b"".join(r[1] for r in rows), dtype="<f2").reshape(len(rows), -1)
        matrix = matrix.astype(np.float32)
        matrix /= np.linalg.norm(matrix, axis=1, keepdims=True)
        matrix = matrix.astype(np.float16).astype(np.float32)  # as the index holds them
        for number in numbers:
            query = np.asarray(vectors[number], dtype=np.float32)
            scores = matrix @ (query / np.linalg.norm(query))
            exact = [int(ids[i]) for i in np.lexsort((ids, -scores))[:k]]
            found = store.vector_search("default", model, query, k=k, author=author)
            got = [memory.rowid for memory, _ in found]
            overlaps.append(len(set(got) & set(exact)) / k)
            same += got == exact
    print(
        f"author-scoped vector search against exact, {len(overlaps)} queries: overlap@{k} "
        f"{statistics.fmean(overlaps):.3f}, identical top {k} in {same}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=1_000_000)
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument(
        "--templates", type=int, default=300, help="MiniLM-embedded sentences mixed into vectors"
    )
    parser.add_argument(
        "--texts", type=int, default=512, help="30-word messages for the embedders' throughput"
    )
    parser.add_argument("--db", type=Path, default=Path("/tmp/ctxwarden-bench-retrieve.db"))
    parser.add_argument("--keep", action="store_true", help="keep (and reuse) the database")
    parser.add_argument(
        "--breakdown", action="store_true", help="also print CPU per query of each store call"
    )
    parser.add_argument(
        "--exact-check",
        action="store_true",
        help="also compare each query's author-scoped top 20 with exact search (overlap@20)",
    )
    parser.add_argument(
        "--other-tenants",
        type=int,
        default=0,
        help="give K of every K + 1 rows to other tenants (the file is shared)",
    )
    args = parser.parse_args()
    rng = np.random.default_rng(7)
    global TEMPLATES
    TEMPLATES = args.templates
    if not args.keep:
        for suffix in ("", "-wal", "-shm"):
            Path(str(args.db) + suffix).unlink(missing_ok=True)
        for leftover in Path(str(args.db) + ".vectors").glob("*"):
            leftover.unlink()
    started = time.perf_counter()
    store, vocab = build(args.db, args.n, rng, args.other_tenants)
    print(f"store of {args.n:,} memories ready in {time.perf_counter() - started:.0f}s")
    embedder = MiniLMEmbedder()
    weights = zipf_weights(len(vocab))
    queries = [sentence(rng, vocab, weights)[:80] + f" {AUTHORS[i % 40]}?"
               for i in range(args.queries)]  # fmt: skip
    started = time.perf_counter()
    vectors = [embedder.embed([q])[0] for q in queries]
    query_ms = (time.perf_counter() - started) * 1000 / len(queries)
    started = time.perf_counter()
    store.vector_search("default", embedder.name, vectors[0], k=10)  # load/replay the index
    print(f"vector index loaded in {time.perf_counter() - started:.1f}s")
    authors = store.authors("default")
    spent: dict[str, list[float]] = {}
    if args.breakdown:
        _time_store_calls(store, spent)
    timings = []
    cpu = []
    for query, vector in zip(queries, vectors, strict=True):
        began = time.perf_counter()
        began_cpu = time.process_time()
        hits = retrieve(
            store,
            tenant="default",
            query=query,
            now=1.7e9 + args.n * 30.0,
            cost=lambda ms: {m.rowid: 30 for m in ms},
            query_vector=vector,
            model=embedder.name,
            weights=RetrievalWeights(),
            authors=authors,
        )
        timings.append((time.perf_counter() - began) * 1000)
        cpu.append((time.process_time() - began_cpu) * 1000)
        assert hits
    for label, values in (("wall", timings), ("CPU", cpu)):
        values.sort()
        p50 = statistics.median(values)
        p95 = values[int(0.95 * (len(values) - 1))]
        print(
            f"retrieve over {args.n:,} memories, {len(queries)} queries, {label} time (query "
            f"embedding excluded): p50 {p50:.1f} ms, p95 {p95:.1f} ms"
        )
    for step, values in spent.items():
        print(f"  {step}: {sum(values) / len(queries):.2f} ms CPU per query ({len(values)} calls)")
    if args.exact_check:
        exact_check(store, embedder.name, queries, vectors)
    print(f"query embedding (MiniLM, one at a time): {query_ms:.1f} ms")
    texts = [sentence(rng, vocab, weights) for _ in range(args.texts)]
    texts = [" ".join((t + " " + t).split()[:30]) for t in texts]
    for model in (MiniLMEmbedder(), StaticEmbedder()):
        model.embed(texts[:8])
        began = time.perf_counter()
        began_cpu = time.process_time()
        for start in range(0, len(texts), 32):
            model.embed(texts[start : start + 32])
        rate = len(texts) / (time.perf_counter() - began)
        cpu_rate = len(texts) / (time.process_time() - began_cpu)
        print(
            f"embedder {model.name}: {rate:,.0f} messages/s wall, {cpu_rate:,.0f} per CPU-s "
            "(30 words, batches of 32, one thread)"
        )
    store.close()


if __name__ == "__main__":
    main()
