"""VectorIndex: add/remove/search, deletes respected, allowed scopes, persistence, invariants."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ctxwarden.errors import InputError, StoreError
from ctxwarden.vectors import VectorIndex

DIM = 32


def _clustered(count: int, seed: int = 0, dim: int = DIM) -> np.ndarray:
    """Unit vectors around 20 topic centres: embedding-like, unlike isotropic noise."""
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((20, dim))
    points = centres[rng.integers(20, size=count)] + 0.35 * rng.standard_normal((count, dim))
    return (points / np.linalg.norm(points, axis=1, keepdims=True)).astype(np.float32)


def _exact(data: np.ndarray, ids: np.ndarray, query: np.ndarray, k: int) -> list[int]:
    scores = data @ (query / np.linalg.norm(query))
    order = np.lexsort((ids, -scores))[:k]
    return [int(ids[i]) for i in order]


def test_empty_index() -> None:
    index = VectorIndex(DIM)
    assert len(index) == 0
    assert index.dim == DIM
    assert index.search(np.ones(DIM, dtype=np.float32), 5) == []
    assert index.remove([1, 2]) == 0
    assert index.ids().tolist() == []
    assert 3 not in index


def test_small_index_is_exact_and_sorted() -> None:
    data = _clustered(500)
    ids = np.arange(1000, 1500)
    index = VectorIndex(DIM)
    index.add(ids.tolist(), data)
    assert len(index) == 500
    query = _clustered(1, seed=9)[0]
    got = index.search(query, 10)
    assert [i for i, _ in got] == _exact(data, ids, query, 10)
    scores = [s for _, s in got]
    assert scores == sorted(scores, reverse=True)
    assert all(-1.0001 <= s <= 1.0001 for s in scores)
    # float16 storage: scores agree with float32 cosine to ~1e-3.
    assert abs(scores[0] - float(data[got[0][0] - 1000] @ query)) < 2e-3


def test_large_index_recall_and_deletes() -> None:
    data = _clustered(6000, seed=1)
    # One build thread: a multi-threaded HNSW build is not deterministic.
    index = VectorIndex(DIM, threads=1)
    index.add(range(6000), data)
    queries = _clustered(20, seed=2)
    hits = 0
    for query in queries:
        got = [i for i, _ in index.search(query, 20)]
        hits += len(set(got) & set(_exact(data, np.arange(6000), query, 20)))
    # This noisy 32-d data is harder for HNSW than real embeddings (~0.96 at expansion 128).
    assert hits / (20 * 20) >= 0.9
    # Remove every even id: none may come back, and odd neighbours still do.
    removed = index.remove(range(0, 6000, 2))
    assert removed == 3000
    assert len(index) == 3000
    for query in queries:
        got = [i for i, _ in index.search(query, 30)]
        assert len(got) == 30
        assert all(i % 2 == 1 for i in got)
    assert index.ids().tolist() == list(range(1, 6000, 2))
    assert index.removed_since_rebuild == 3000
    before = [index.search(q, 10) for q in queries]
    index.rebuild()
    assert index.removed_since_rebuild == 0
    assert len(index) == 3000
    after = [index.search(q, 10) for q in queries]
    overlap = sum(
        len({i for i, _ in b} & {i for i, _ in a}) for b, a in zip(before, after, strict=True)
    )
    assert overlap >= 0.9 * 200
    assert all(i % 2 == 1 for result in after for i, _ in result)


def test_add_replaces_existing_vector() -> None:
    index = VectorIndex(3)
    index.add([5, 6], np.array([[1, 0, 0], [0, 1, 0]], dtype=np.float32))
    index.add([5], np.array([[0, 0, 1]], dtype=np.float32))
    assert len(index) == 2
    assert index.search(np.array([0, 0, 1.0], dtype=np.float32), 1) == [(5, pytest.approx(1.0))]
    # The old vector of 5 ([1, 0, 0]) is gone: a query near it finds 6 first.
    assert index.search(np.array([1.0, 0.5, 0], dtype=np.float32), 1)[0][0] == 6


def test_removed_then_readded_id_is_found() -> None:
    index = VectorIndex(DIM)
    data = _clustered(3000, seed=3)
    index.add(range(3000), data)
    index.remove([42])
    assert 42 not in index
    assert all(i != 42 for i, _ in index.search(data[42], 50))
    index.add([42], data[42:43])
    assert 42 in index
    assert index.search(data[42], 1)[0][0] == 42


def test_ties_break_by_id() -> None:
    index = VectorIndex(2)
    same = np.array([[1.0, 0.0]] * 6, dtype=np.float32)
    index.add([9, 3, 7, 1, 5, 2], same)
    assert [i for i, _ in index.search(np.array([1.0, 0.0], dtype=np.float32), 4)] == [1, 2, 3, 5]


@pytest.mark.parametrize(("size", "exact_scope"), [(500, 20_000), (12_000, 20_000), (12_000, 100)])
def test_allowed_scope(size: int, exact_scope: int) -> None:
    data = _clustered(size, seed=4)
    # exact_scope=100 sends the larger scopes through the graph with oversampling.
    index = VectorIndex(DIM, exact_scope=exact_scope)
    index.add(range(size), data)
    rng = np.random.default_rng(5)
    # A small scope (exhaustive path), a large one (graph with oversampling), and a thin one.
    for fraction in (0.05, 0.5, 0.02):
        allowed = {int(i) for i in rng.choice(size, size=int(size * fraction), replace=False)}
        allowed |= {size + 100}  # ids not in the index are ignored
        query = _clustered(1, seed=int(fraction * 100))[0]
        k = min(25, len(allowed) - 1)
        got = index.search(query, k, allowed=allowed)
        assert len(got) == k
        assert {i for i, _ in got} <= allowed
        ids = np.array(sorted(allowed - {size + 100}))
        expected = _exact(data[ids], ids, query, k)
        assert len({i for i, _ in got} & set(expected)) >= k - 2
    assert index.search(data[0], 5, allowed=set()) == []
    assert index.search(data[0], 5, allowed={0})[0][0] == 0
    index.remove([0])
    assert index.search(data[0], 5, allowed={0}) == []


def test_save_load_round_trip(tmp_path: Path) -> None:
    data = _clustered(3000, seed=6)
    index = VectorIndex(DIM, expansion_search=64)
    index.add(range(10, 3010), data)
    index.remove([10, 11, 12])
    path = tmp_path / "vectors.usearch"
    index.save(path)
    assert [p.name for p in tmp_path.iterdir()] == ["vectors.usearch"]  # no temp file left
    loaded = VectorIndex.load(path, expansion_search=64)
    assert loaded.dim == DIM
    assert len(loaded) == len(index) == 2997
    assert loaded.ids().tolist() == index.ids().tolist()
    for query in _clustered(5, seed=7):
        assert loaded.search(query, 10) == index.search(query, 10)
    # Saving again over the file replaces it atomically and stays readable.
    loaded.add([5000], data[:1])
    loaded.save(path)
    assert len(VectorIndex.load(path)) == 2998
    # An empty index round-trips too.
    VectorIndex(DIM).save(tmp_path / "empty")
    assert len(VectorIndex.load(tmp_path / "empty")) == 0


def test_load_errors(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="rebuild"):
        VectorIndex.load(tmp_path / "missing")
    junk = tmp_path / "junk"
    junk.write_bytes(os.urandom(64))
    with pytest.raises(StoreError, match="rebuild"):
        VectorIndex.load(junk)
    good = tmp_path / "good"
    index = VectorIndex(DIM)
    index.add(range(100), _clustered(100))
    index.save(good)
    truncated = tmp_path / "truncated"
    truncated.write_bytes(good.read_bytes()[:-100])
    with pytest.raises(StoreError, match="truncated"):
        VectorIndex.load(truncated)
    with pytest.raises(StoreError, match="writable"):
        VectorIndex(DIM).save(tmp_path / "no-such-dir" / "x")


def test_bad_input_is_rejected_and_changes_nothing() -> None:
    index = VectorIndex(3)
    index.add([1], np.array([[1.0, 0, 0]], dtype=np.float32))
    with pytest.raises(InputError, match="shape"):
        index.add([2, 3], np.ones((1, 3), dtype=np.float32))
    with pytest.raises(InputError, match="twice"):
        index.add([2, 2], np.ones((2, 3), dtype=np.float32))
    with pytest.raises(InputError, match="zero, NaN or infinite"):
        index.add([2, 3], np.array([[1.0, 1, 1], [np.nan, 0, 0]], dtype=np.float32))
    with pytest.raises(InputError, match="between 0"):
        index.add([-1], np.ones((1, 3), dtype=np.float32))
    with pytest.raises(InputError, match="length 4"):
        index.search(np.ones(4, dtype=np.float32), 1)
    assert len(index) == 1
    assert index.search(np.zeros(3, dtype=np.float32), 1) == []
    assert index.search(np.ones(3, dtype=np.float32), 0) == []


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    ops=st.lists(
        st.tuples(st.sampled_from(["add", "remove"]), st.lists(st.integers(0, 60), max_size=12)),
        max_size=12,
    ),
    k=st.integers(1, 20),
    allowed=st.none() | st.sets(st.integers(0, 70), max_size=30),
    seed=st.integers(0, 2**16),
)
def test_results_are_live_allowed_and_sorted(
    ops: list[tuple[str, list[int]]], k: int, allowed: set[int] | None, seed: int
) -> None:
    rng = np.random.default_rng(seed)
    # Small thresholds so that both exhaustive and graph paths are exercised.
    index = VectorIndex(8, exact_below=8, exact_scope=4)
    live: set[int] = set()
    for op, ids in ops:
        unique = sorted(set(ids))
        if op == "add":
            index.add(unique, rng.standard_normal((len(unique), 8)).astype(np.float32) + 0.1)
            live |= set(unique)
        else:
            index.remove(ids)
            live -= set(ids)
    assert len(index) == len(live)
    assert set(index.ids().tolist()) == live
    got = index.search(rng.standard_normal(8).astype(np.float32), k, allowed=allowed)
    ids_out = [i for i, _ in got]
    eligible = live if allowed is None else live & allowed
    assert set(ids_out) <= eligible
    assert len(ids_out) == len(set(ids_out)) == min(k, len(eligible))
    keys = [(-s, i) for i, s in got]
    assert keys == sorted(keys)


def test_usearch_then_onnxruntime_in_one_process() -> None:
    # usearch 2.26.x (numkong builds) crashed onnxruntime when imported first: the store loads the
    # index before the engine embeds, so prove that order works in a fresh interpreter.
    code = (
        "import numpy as np\n"
        "from ctxwarden.vectors import VectorIndex\n"
        "index = VectorIndex(384)\n"
        "index.add([1], np.ones((1, 384), dtype=np.float32))\n"
        "from ctxwarden.embed import MiniLMEmbedder\n"
        "vector = MiniLMEmbedder().embed(['hello'])[0]\n"
        "print(index.search(vector, 1)[0][0])\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "1"


def test_large_ids_use_the_dictionary_path(tmp_path: Path) -> None:
    # Ids far beyond the row count cannot be mapped densely; scopes must still work.
    data = _clustered(1500, seed=8)
    ids = [2**40 + 7 * i for i in range(1500)]
    index = VectorIndex(DIM)
    index.add(ids, data)
    assert index._dense is None
    allowed = set(ids[::3]) | {5, 2**62}
    got = index.search(data[3], 10, allowed=allowed)
    assert got[0][0] == ids[3]
    assert {i for i, _ in got} <= allowed
    index.remove(ids[:3])
    assert ids[0] not in index
    index.save(tmp_path / "big")
    loaded = VectorIndex.load(tmp_path / "big")
    assert loaded.search(data[6], 1)[0][0] == ids[6]
    assert loaded.search(data[6], 5, allowed=allowed) == index.search(data[6], 5, allowed=allowed)


def _exact_f16(data: np.ndarray, ids: np.ndarray, query: np.ndarray, k: int) -> list[int]:
    """Exact top ``k`` as the index scores: unit vectors stored as float16, scored in float32."""
    stored = (data / np.linalg.norm(data, axis=1, keepdims=True)).astype(np.float16)
    return _exact(stored.astype(np.float32), ids, query, k)


def test_int8_shortlist_gives_the_exact_top_k(tmp_path: Path) -> None:
    # Scopes of >= 8,192 rows are shortlisted from an int8 copy, then scored exactly: the
    # result must be the exact top k, through later adds, replacements and removals.
    dim = 64
    data = _clustered(12_000, seed=11, dim=dim)
    ids = np.arange(12_000)
    index = VectorIndex(dim, exact_scope=20_000)
    index.add(ids.tolist(), data)
    rng = np.random.default_rng(12)
    scope = np.sort(rng.choice(12_000, size=9_000, replace=False))
    queries = _clustered(30, seed=13, dim=dim)
    for number, query in enumerate(queries):
        k = (1, 10, 20, 50)[number % 4]
        got = index.search(query, k, allowed=scope)
        assert [i for i, _ in got] == _exact_f16(data[scope], scope, query, k)
    assert index._codes is not None  # the shortlist path ran
    # Remove the best 5 of a query's scope, replace the next 5 with vectors far from it, add
    # new ids (the int8 copy grows with the side copy): the shortlist follows every change.
    query = queries[0]
    best = [i for i, _ in index.search(query, 10, allowed=scope)]
    index.remove(best[:5])
    away = -query[None, :] + 0.01 * rng.standard_normal((5, dim)).astype(np.float32)
    index.add(best[5:], away)
    extra = _clustered(3_000, seed=14, dim=dim)
    index.add(range(12_000, 15_000), extra)
    current = data.copy()
    current[best[5:]] = away
    everything = np.vstack([current, extra])
    live = np.setdiff1d(np.arange(15_000), best[:5])
    got = index.search(query, 20, allowed=live)
    assert not set(best) & {i for i, _ in got}
    assert [i for i, _ in got] == _exact_f16(everything[live], live, query, 20)
    near_extra = extra[7] + 0.001
    assert index.search(near_extra, 1, allowed=live)[0][0] == 12_007
    # A loaded index builds its int8 copy at once and answers the same.
    index.save(tmp_path / "index")
    loaded = VectorIndex.load(tmp_path / "index")
    assert loaded._codes is not None
    loaded.exact_scope = index.exact_scope  # not saved: the caller's setting
    for query in queries[:5]:
        assert loaded.search(query, 20, allowed=live) == index.search(query, 20, allowed=live)


def test_scope_block_follows_every_change(monkeypatch: pytest.MonkeyPatch) -> None:
    # A named scope reads its int8 rows from a block of contiguous chunks: its results must
    # equal the exact top k (and an unnamed search's) through adds, replacements, removals,
    # ids without a vector yet, a growing scope, a shrinking one, and eviction under the rows
    # limit. Chunks of 1,000 rows here, so patches and appends cross chunk boundaries.
    dim = 48
    monkeypatch.setattr("ctxwarden.vector_copy._BLOCK_CHUNK_BYTES", 1000 * dim)
    data = _clustered(14_000, seed=21, dim=dim)
    index = VectorIndex(dim, exact_scope=40_000)
    index.add(range(12_000), data[:12_000])
    rng = np.random.default_rng(22)
    # The scope holds ids 12,000-12,999 too, embedded only later (no vector at first).
    scope = np.sort(np.concatenate([rng.choice(12_000, size=9_000, replace=False),
                                    np.arange(12_000, 13_000)]))  # fmt: skip
    current = data.copy()

    def check(allowed: np.ndarray, vectors: dict[int, np.ndarray], k: int = 20) -> None:
        live = np.asarray([i for i in allowed.tolist() if i in vectors], dtype=np.int64)
        matrix = np.vstack([vectors[i] for i in live.tolist()])
        for query in _clustered(6, seed=int(allowed.size) + k, dim=dim):
            got = index.search(query, k, allowed=allowed, scope="author-a")
            assert [i for i, _ in got] == _exact_f16(matrix, live, query, k)
            assert got == index.search(query, k, allowed=allowed)

    vectors = {i: current[i] for i in range(12_000)}
    check(scope, vectors)
    assert len(index._blocks["author-a"].chunks) == 10
    query = _clustered(1, seed=23, dim=dim)[0]
    best = [i for i, _ in index.search(query, 10, allowed=scope, scope="author-a")]
    index.remove(best[:5])  # removed: never returned again
    for i in best[:5]:
        del vectors[i]
    away = -query[None, :] + 0.01 * rng.standard_normal((5, dim)).astype(np.float32)
    index.add(best[5:], away)  # replaced: scored by the new vector
    for i, vector in zip(best[5:], away, strict=True):
        vectors[i] = vector / np.linalg.norm(vector)
    index.add(range(12_000, 13_000), data[12_000:13_000])  # the scope's late ids embedded
    vectors.update({i: data[i] for i in range(12_000, 13_000)})
    got = index.search(query, 10, allowed=scope, scope="author-a")
    assert not set(best) & {i for i, _ in got}
    check(scope, vectors)
    # The scope grows (new ids appended), then shrinks (ids gone from it): both follow.
    index.add(range(13_000, 14_000), data[13_000:14_000])
    vectors.update({i: data[i] for i in range(13_000, 14_000)})
    grown = np.concatenate([scope, np.arange(13_000, 14_000)])
    check(grown, vectors, k=50)
    assert index._blocks["author-a"].ids.size == grown.size
    check(grown[::2], vectors, k=5)
    # Many scopes: the blocks never hold more rows than the limit together.
    for name in range(12):
        index.search(query, 10, allowed=np.sort(rng.choice(14_000, 9_000, replace=False)),
                     scope=name)  # fmt: skip
        assert index._block_rows <= index._scope_rows_limit()
        assert index._block_rows == sum(b.ids.size for b in index._blocks.values())
    # A change the log missed (simulated: the change count wound back after the top hit's
    # slot went to a new id) is caught by the check of the shortlisted ids: the block is read
    # again, the answer stays exact.
    top = index.search(query, 1, allowed=grown, scope="author-a")[0][0]
    version = index._version
    index.remove([top])
    index.add([20_000], query[None, :])  # outside the scope, nearest the query
    index._version = version
    del vectors[top]
    found = {i for i, _ in index.search(query, 20, allowed=grown, scope="author-a")}
    assert top not in found
    assert 20_000 not in found
    check(grown, vectors)
    # An unsorted array is not kept as a block (it is searched by gathering): same answer.
    shuffled = rng.permutation(scope)
    assert index.search(query, 20, allowed=shuffled, scope="mixed") == index.search(
        query, 20, allowed=scope
    )
    assert "mixed" not in index._blocks


def test_a_removed_vector_is_not_in_the_saved_file(tmp_path: Path) -> None:
    """usearch keeps a removed entry's vector in its slot until the graph is rebuilt: the
    file an erasure saves must not hold it (issue 20)."""
    rng = np.random.default_rng(7)
    vectors = rng.standard_normal((300, 16)).astype(np.float32)
    index = VectorIndex(16)
    index.add(list(range(300)), vectors)
    gone = vectors[42] / np.linalg.norm(vectors[42])
    pattern = gone.astype("<f2").tobytes()
    index.save(tmp_path / "before.idx")
    assert pattern in (tmp_path / "before.idx").read_bytes()
    assert index.remove([42]) == 1
    index.save(tmp_path / "after.idx")
    assert pattern not in (tmp_path / "after.idx").read_bytes()
    assert index.removed_since_rebuild == 1  # blanked in the file, not rebuilt
    assert index.search(vectors[9], 1)[0][0] == 9
    loaded = VectorIndex.load(tmp_path / "after.idx")
    assert 42 not in loaded
    assert len(loaded) == 299
    assert loaded.search(vectors[7], 1)[0][0] == 7
