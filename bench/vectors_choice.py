"""Choose the vector index: build time, query p50/p95 at k=50, recall@50, memory and disk.

Candidates: numpy exact search, usearch (f16 and i8 HNSW), hnswlib (HNSW), faiss-cpu (HNSW flat),
and ctxwarden's own ``VectorIndex`` (the chosen backend behind its API: deletes, ``allowed``).

Vectors are realistic, not Gaussian (random Gaussian vectors make every HNSW look broken):
``--base`` synthetic chat-like texts are embedded with the offline MiniLM (cached in --cache), and
each stored vector is ``normalise(e_a + w * e_b + noise)`` for random base embeddings a, b,
w in [0.2, 0.7] and noise of norm ~0.3: points keep MiniLM's anisotropy and topic structure,
with clusters of near-duplicates, which is what a long-lived agent's memory looks like. Queries
come from the same process with another seed. Recall@50 is measured against exact search.

    uv run --with usearch --with hnswlib --with faiss-cpu python bench/vectors_choice.py \
        --sizes 100000 1000000 --only-1m numpy,ctxwarden

Query timings are single-threaded (the engine answers each request on one thread) and measured
as thread CPU time, which stays meaningful when other work shares the machine; build times are
process CPU seconds (2 build threads). Wall-clock p50 is printed too.
"""

from __future__ import annotations

import os

# OpenBLAS's thread pool makes a matrix-vector product ~5x slower on a busy 2-core machine; the
# engine answers each query on one thread, so measure that way (must be set before numpy loads).
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse
import gc
import importlib.util
import random
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

K = 50
DIM = 384


def rss_mb() -> float:
    """Resident memory of this process in MB (Linux)."""
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def synthetic_texts(count: int, seed: int = 7) -> list[str]:
    """Chat-like lines: templates filled from a Zipf-weighted sample of real English words."""
    from ctxwarden.embed import _load_tokenizer

    vocab = _load_tokenizer().get_vocab()
    words = [w for w, i in sorted(vocab.items(), key=lambda x: x[1]) if i >= 1996 and w.isalpha()]
    weights = 1.0 / np.arange(1, len(words) + 1)
    weights /= weights.sum()
    rng = np.random.default_rng(seed)
    templates = [
        "{} {} {} about the {} {} and {}",
        "can you {} the {} before {}?",
        "I think the {} {} is {} because of {} {}",
        "reminder: {} {} on {} with {}",
        "the {} failed when {} {} {} the {}",
        "{} said that {} {} {} {} yesterday",
        "do you remember the {} {} we {} in {}?",
    ]
    out = []
    for _ in range(count):
        template = templates[int(rng.integers(len(templates)))]
        slots = template.count("{}")
        extra = int(rng.integers(0, 14))
        picks = rng.choice(len(words), size=slots + extra, p=weights)
        filled = template.format(*(words[p] for p in picks[:slots]))
        tail = " ".join(words[p] for p in picks[slots:])
        out.append(f"{filled} {tail}".strip())
    return out


def base_embeddings(count: int, cache: Path) -> np.ndarray:
    path = cache / f"minilm_base_{count}.npy"
    if path.exists():
        return np.load(path)
    from ctxwarden.embed import MiniLMEmbedder

    started = time.perf_counter()
    vectors = MiniLMEmbedder(threads=2, batch_size=16).embed(synthetic_texts(count))
    print(f"# embedded {count} base texts in {time.perf_counter() - started:.0f}s")
    cache.mkdir(parents=True, exist_ok=True)
    np.save(path, vectors)
    return vectors


def mixtures(base: np.ndarray, count: int, seed: int) -> np.ndarray:
    """``count`` unit vectors ``normalise(e_a + w e_b + noise)`` in chunks (bounded memory)."""
    rng = np.random.default_rng(seed)
    out = np.empty((count, base.shape[1]), dtype=np.float32)
    for start in range(0, count, 100_000):
        n = min(100_000, count - start)
        a = rng.integers(len(base), size=n)
        b = rng.integers(len(base), size=n)
        w = rng.uniform(0.2, 0.7, size=(n, 1)).astype(np.float32)
        noise = rng.standard_normal((n, base.shape[1]), dtype=np.float32) * (0.3 / np.sqrt(DIM))
        chunk = base[a] + w * base[b] + noise
        chunk /= np.linalg.norm(chunk, axis=1, keepdims=True)
        out[start : start + n] = chunk
    return out


def exact_topk(data: np.ndarray, queries: np.ndarray, k: int) -> np.ndarray:
    out = np.empty((len(queries), k), dtype=np.int64)
    for start in range(0, len(queries), 50):
        sims = queries[start : start + 50] @ data.T
        part = np.argpartition(-sims, k, axis=1)[:, :k]
        order = np.argsort(-np.take_along_axis(sims, part, axis=1), axis=1)
        out[start : start + 50] = np.take_along_axis(part, order, axis=1)
    return out


# -- candidates: each returns (build seconds, search(query) -> ids, save(path)) -----------------

Built = tuple[Callable[[np.ndarray], np.ndarray], Callable[[Path], None], Any]


def build_numpy(data: np.ndarray, ef: int) -> Built:
    matrix = data.copy()

    def search(q: np.ndarray) -> np.ndarray:
        sims = matrix @ q
        part = np.argpartition(-sims, K)[:K]
        return part[np.argsort(-sims[part])]

    return search, lambda path: np.save(path, matrix), matrix


def build_usearch(data: np.ndarray, ef: int, dtype: str) -> Built:
    from usearch.index import Index

    index = Index(
        ndim=data.shape[1],
        metric="ip",
        dtype=dtype,
        connectivity=16,
        expansion_add=128,
        expansion_search=ef,
    )
    index.add(np.arange(len(data), dtype=np.uint64), data, threads=2)

    def search(q: np.ndarray) -> np.ndarray:
        return np.asarray(index.search(q, K, threads=1).keys, dtype=np.int64)

    return search, lambda path: index.save(str(path)), index


def build_hnswlib(data: np.ndarray, ef: int) -> Built:
    import hnswlib

    index = hnswlib.Index(space="ip", dim=data.shape[1])
    index.init_index(max_elements=len(data), M=16, ef_construction=128)
    index.add_items(data, np.arange(len(data)), num_threads=2)
    index.set_ef(ef)
    index.set_num_threads(1)

    def search(q: np.ndarray) -> np.ndarray:
        labels, _ = index.knn_query(q, k=K, num_threads=1)
        return np.asarray(labels[0], dtype=np.int64)

    return search, lambda path: index.save_index(str(path)), index


def build_faiss(data: np.ndarray, ef: int) -> Built:
    import faiss

    faiss.omp_set_num_threads(2)
    index = faiss.IndexHNSWFlat(data.shape[1], 16, faiss.METRIC_INNER_PRODUCT)
    index.hnsw.efConstruction = 128
    index.add(data)
    index.hnsw.efSearch = ef
    faiss.omp_set_num_threads(1)

    def search(q: np.ndarray) -> np.ndarray:
        _, ids = index.search(q[None, :], K)
        return np.asarray(ids[0], dtype=np.int64)

    return search, lambda path: faiss.write_index(index, str(path)), index


def build_ctxwarden(data: np.ndarray, ef: int) -> Built:
    from ctxwarden.vectors import VectorIndex

    index = VectorIndex(data.shape[1], expansion_search=ef, threads=2)
    for start in range(0, len(data), 100_000):
        chunk = data[start : start + 100_000]
        index.add(range(start, start + len(chunk)), chunk)
    index.threads = 1

    def search(q: np.ndarray) -> np.ndarray:
        return np.asarray([i for i, _ in index.search(q, K)], dtype=np.int64)

    return search, index.save, index


CANDIDATES: dict[str, tuple[str | None, Callable[[np.ndarray, int], Built]]] = {
    "numpy": ("numpy", build_numpy),
    "usearch-f16": ("usearch", lambda d, ef: build_usearch(d, ef, "f16")),
    "usearch-i8": ("usearch", lambda d, ef: build_usearch(d, ef, "i8")),
    "hnswlib": ("hnswlib", build_hnswlib),
    "faiss-hnsw": ("faiss", build_faiss),
    "ctxwarden": ("usearch", build_ctxwarden),
}


def measure(
    name: str, data: np.ndarray, queries: np.ndarray, truth: np.ndarray, efs: list[int]
) -> list[str]:
    module, builder = CANDIDATES[name]
    if module and importlib.util.find_spec(module) is None:
        row = f"{name:22} {len(data):>9,}  (not installed: uv run --with {module} ...)"
        print(row, flush=True)
        return [row]
    gc.collect()
    before = rss_mb()
    started = time.process_time()
    search, save, handle = builder(data, efs[0])
    build = time.process_time() - started
    memory = rss_mb() - before
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "index.bin"
        save(path)
        disk = sum(f.stat().st_size for f in Path(tmp).iterdir()) / 1e6
    rows = []
    for ef in efs if name != "numpy" else efs[:1]:
        if ef != efs[0]:
            set_ef(name, handle, ef)
        for q in queries[:5]:
            search(q)
        times, walls, hits = [], [], 0
        for q, expected in zip(queries, truth, strict=True):
            t0, w0 = time.thread_time(), time.perf_counter()
            got = search(q)
            times.append((time.thread_time() - t0) * 1000)
            walls.append((time.perf_counter() - w0) * 1000)
            hits += len(set(got.tolist()) & set(expected.tolist()))
        p50, p95 = np.percentile(times, [50, 95])
        wall50 = float(np.percentile(walls, 50))
        recall = hits / truth.size
        label = name if name == "numpy" else f"{name} ef={ef}"
        rows.append(
            f"{label:22} {len(data):>9,} {build:>8.1f} {p50:>7.2f} {p95:>7.2f} {recall:>7.3f} "
            f"{memory:>8.0f} {disk:>8.0f} {wall50:>8.2f}"
        )
        print(rows[-1], flush=True)
    if name == "ctxwarden":
        set_ef(name, handle, efs[0])
        rows += measure_scopes(handle, data, queries, memory, disk)
    del handle, search, save
    gc.collect()
    return rows


def measure_scopes(
    index: Any, data: np.ndarray, queries: np.ndarray, memory: float, disk: float
) -> list[str]:
    """Search restricted to a random ``allowed`` scope of 1 %, 5 %, 20 % and 50 % of the rows."""
    rows = []
    rng = np.random.default_rng(3)
    for fraction in (0.01, 0.05, 0.2, 0.5):
        members = rng.choice(len(data), size=int(len(data) * fraction), replace=False)
        allowed = {int(i) for i in members}
        members.sort()
        sub = data[members]
        # Exact answers first: interleaving a scan of the scope with the timed searches would
        # evict the index from cache and time that instead.
        # A scope of K rows or fewer (a small --sizes) is its own top K.
        k = min(K, len(members))
        truth = []
        for q in queries[:100]:
            sims = sub @ q
            top = np.argpartition(-sims, k)[:k] if k < len(members) else np.arange(k)
            truth.append(set(members[top].tolist()))
        del sub
        times, walls, hits = [], [], 0
        for q, expected in zip(queries[:100], truth, strict=True):
            t0, w0 = time.thread_time(), time.perf_counter()
            got = index.search(q, K, allowed=allowed)
            times.append((time.thread_time() - t0) * 1000)
            walls.append((time.perf_counter() - w0) * 1000)
            hits += len({i for i, _ in got} & expected)
        p50, p95 = np.percentile(times, [50, 95])
        label = f"  scope {fraction:.0%} ef={index.expansion_search}"
        rows.append(
            f"{label:22} {len(allowed):>9,} {'':>8} {p50:>7.2f} {p95:>7.2f} "
            f"{hits / max(1, sum(map(len, truth))):>7.3f} {memory:>8.0f} {disk:>8.0f} "
            f"{float(np.percentile(walls, 50)):>8.2f}"
        )
        print(rows[-1], flush=True)
    return rows


def set_ef(name: str, handle: Any, ef: int) -> None:
    if name.startswith("usearch"):
        handle.expansion_search = ef
    elif name == "hnswlib":
        handle.set_ef(ef)
    elif name == "faiss-hnsw":
        handle.hnsw.efSearch = ef
    elif name == "ctxwarden":
        handle.expansion_search = ef


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[100_000])
    parser.add_argument("--candidates", default=",".join(CANDIDATES))
    parser.add_argument("--only-1m", default="numpy,ctxwarden", help="candidates run at >=1M")
    parser.add_argument("--ef", type=int, nargs="+", default=[64, 128, 256])
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--base", type=int, default=6000)
    parser.add_argument("--cache", type=Path, default=Path(tempfile.gettempdir()) / "ctxw-bench")
    args = parser.parse_args(argv)
    if min(args.sizes) <= K:
        parser.error(f"--sizes: each must be more than k={K}")
    random.seed(0)
    base = base_embeddings(args.base, args.cache)
    header = (
        f"{'candidate':22} {'rows':>9} {'build s':>8} {'p50 ms':>7} {'p95 ms':>7} "
        f"{'recall':>7} {'mem MB':>8} {'disk MB':>8} {'wall p50':>8}"
    )
    print(
        f"# k={K}, dim={DIM}, {args.queries} queries on one thread, build on 2 threads; build s is "
        "CPU seconds, p50/p95 are CPU ms per query (thread time: steady on a shared machine), "
        "wall p50 is what the clock said"
    )
    print(header, flush=True)
    for size in args.sizes:
        data = mixtures(base, size, seed=1)
        queries = mixtures(base, args.queries, seed=2)
        truth = exact_topk(data, queries, K)
        names = args.candidates.split(",")
        if size >= 1_000_000:
            names = [n for n in names if n in args.only_1m.split(",")]
        for name in names:
            measure(name, data, queries, truth, args.ef)
        del data
        gc.collect()


if __name__ == "__main__":
    main()
