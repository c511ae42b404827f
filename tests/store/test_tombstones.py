"""Tombstone groups (SQLite migration 21, PostgreSQL 19): one row per summary or erasure with
its ids as a compressed list, found by id through 32-bit keys; the migration of per-id rows."""

from __future__ import annotations

import itertools
import sqlite3
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests.store.test_conformance import _memory, _summary_of

from ctxwarden.errors import NotFound
from ctxwarden.store import migrations
from ctxwarden.store.base import Store, Tombstone
from ctxwarden.store.sqlite import SQLiteStore
from ctxwarden.store.tombstones import (
    CODEC,
    GROUP_LIMIT,
    Member,
    decode_members,
    encode_members,
    find_tombstones,
    id_key,
)

_TIMES = st.one_of(
    st.none(), st.floats(min_value=0, max_value=4e9, allow_nan=False, allow_infinity=False)
)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.text(min_size=1, max_size=12), st.text(max_size=40), _TIMES, _TIMES),
        max_size=30,
    )
)
def test_members_round_trip(rows: list[tuple[str, str, float | None, float | None]]) -> None:
    """Any ids (any script, any characters), hashes and time ranges come back as written,
    sorted by id; a member without a start has no time range."""
    members = [Member(i, h, s, e if s is not None else None) for i, h, s, e in rows]
    back = decode_members(encode_members(members), CODEC)
    assert back == sorted(members, key=lambda m: m.id)


def test_an_unknown_codec_names_the_table() -> None:
    with pytest.raises(Exception, match="tombstone_groups: unknown codec 'zstd'"):
        decode_members(encode_members([]), "zstd")


def test_the_key_of_an_id_is_stable() -> None:
    """Keys are stored: the function must give what it gave when they were written (these
    values were computed by the first version; a change would make old tombstones unfindable)."""
    assert id_key("default", "m1") == id_key("default", "m1")
    assert (id_key("default", "m1"), id_key("t", "会議-1")) == (-153945338, -1856963341)
    assert -(2**31) <= id_key("x" * 1000, "y" * 1000) < 2**31


def _compacted(store: Store, groups: list[list[str]]) -> None:
    """Each list of ids stored as messages, then retired into a summary S<index>."""
    with store.write() as w:
        for n, ids in enumerate(groups):
            for i in ids:
                w.insert(_memory(i, content=f"text of {i}", at=100.0 + n))
            lines = "\n".join(f"- [{i}] ana: line {k}" for k, i in enumerate(ids))
            content = f"Summary of {len(ids)} messages\nEvents:\n{lines}"
            rowid = w.insert(_summary_of(f"S{n}", ids, content=content))
            w.retire("t", ids, summary_rowid=rowid, deleted_at=500.0 + n, reason="compacted")


def test_one_row_per_summary_and_one_key_per_id(store: Store) -> None:
    _compacted(store, [["a", "b", "c"], ["d", "e"]])
    rows = store._query("SELECT count(*) FROM tombstone_groups", ())  # type: ignore[attr-defined]
    keys = store._query("SELECT count(*) FROM tombstone_keys", ())  # type: ignore[attr-defined]
    assert (rows[0][0], keys[0][0]) == (2, 5)
    assert [t.id for t in store.tombstones("t", summary_id="S0")] == ["a", "b", "c"]
    assert store.get("t", "e").id == "S1"


def test_erasing_one_id_of_a_group_leaves_the_others(store: Store) -> None:
    _compacted(store, [["a", "b", "c"]])
    before = {t.id: t for t in store.tombstones("t")}
    with store.write() as w:
        receipt = w.erase_id("t", "b", deleted_at=900.0, reason="user request")
    assert receipt is not None
    assert receipt.ids == ("b",)
    after = {t.id: t for t in store.tombstones("t")}
    assert (after["a"], after["c"]) == (before["a"], before["c"])  # untouched
    assert after["b"].summary_id is None
    assert (after["b"].reason, after["b"].deleted_at) == ("user request", 900.0)
    assert after["b"].content_hash == before["b"].content_hash
    with pytest.raises(NotFound):
        store.get("t", "b")
    with store.write() as w:
        assert w.resolve_many("t", ["a", "b", "c"]) == {"a": "S0", "c": "S0"}
        assert w.erase_id("t", "b", deleted_at=901.0, reason="again") is None
    # the group holds two ids now, the erasure's group one
    groups = store._query(  # type: ignore[attr-defined]
        "SELECT summary_id, members FROM tombstone_groups ORDER BY grp", ()
    )
    assert [tuple(g) for g in groups] == [("S0", 2), (None, 1)]


#: Ids in any script (letters, digits, marks) and the punctuation ids carry; not the ones a
#: summary's citation ``- [a,b]`` separates ids with.
_IDS = st.text(
    st.characters(categories=("L", "M", "N"), include_characters="-_:./#@"),
    min_size=1,
    max_size=6,
)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    ids=st.lists(_IDS, min_size=1, max_size=24, unique=True),
    cuts=st.lists(st.integers(min_value=1, max_value=24), max_size=3),
    erased=st.sets(st.integers(min_value=0, max_value=23), max_size=8),
)
def test_every_id_resolves_to_its_summary_until_erased(
    ids: list[str], cuts: list[int], erased: set[int]
) -> None:
    """For any ids split into summaries and any of them erased afterwards: the others resolve
    to their summary (a re-ingest is known) and keep their tombstones as written; the erased
    ones resolve to nothing and have an erasure's tombstone; each id has one tombstone."""
    bounds = sorted({0, *(c for c in cuts if c < len(ids)), len(ids)})
    groups = [ids[a:b] for a, b in itertools.pairwise(bounds)]
    store = SQLiteStore(":memory:")
    try:
        _compacted(store, groups)
        gone = {ids[i] for i in erased if i < len(ids)}
        with store.write() as w:
            for i in sorted(gone):
                assert w.erase_id("t", i, deleted_at=900.0, reason="erased") is not None
        summary_of = {i: f"S{n}" for n, g in enumerate(groups) for i in g}
        with store.write() as w:
            assert w.resolve_many("t", ids) == {
                i: s for i, s in summary_of.items() if i not in gone
            }
        # a summary whose every source was erased goes too, with a tombstone of its own
        removed = {f"S{n}" for n, g in enumerate(groups) if set(g) <= gone}
        stones = store.tombstones("t")
        assert [t.id for t in stones] == sorted([*ids, *removed])
        for t in stones:
            if t.id in removed:
                continue
            assert t.summary_id == (None if t.id in gone else summary_of[t.id])
            assert t.content_hash == f"h-text of {t.id}"
        found = find_tombstones(store._read, "t", ids)
        assert set(found) == set(ids)
        assert find_tombstones(store._read, "other", ids) == {}
    finally:
        store.close()


def _old_rows(tenant: str, n: int) -> list[tuple[object, ...]]:
    return [
        (tenant, f"m{i:04d}", 500.0, "S1", f"{i:032x}", 100.0 + i, 100.0 + i, "compacted")
        for i in range(n)
    ]


#: Per-id tombstones as they were before the migration: a summary's ids (more than a group
#: holds), one erased message without a time range, one tenant more with the same ids.
OLD_ROWS = [
    *_old_rows("t", GROUP_LIMIT + 3),
    ("t", "gone", 700.0, None, "~tool", None, None, "deleted"),
    *_old_rows("u", 2),
]


def _expected() -> dict[tuple[str, str], Tombstone]:
    return {
        (r[0], r[1]): Tombstone(
            tenant=r[0],
            id=r[1],
            deleted_at=r[2],
            summary_id=r[3],
            content_hash=r[4],
            time_range=(r[5], r[6]) if r[5] is not None else None,
            reason=r[7],
        )
        for r in OLD_ROWS
    }


def _check_migrated(store: Store) -> None:
    expected = _expected()
    got = {(t.tenant, t.id): t for tenant in ("t", "u") for t in store.tombstones(tenant)}
    assert got == expected
    assert store.get("t", "m0000").id == "S1"
    assert store.get("t", f"m{GROUP_LIMIT + 2:04d}").id == "S1"
    with pytest.raises(NotFound):
        store.get("t", "gone")
    with store.write() as w:
        assert w.resolve_many("u", ["m0000", "m0001", "m0002"]) == {"m0000": "S1", "m0001": "S1"}


def test_sqlite_migration_21_moves_per_id_tombstones_into_groups(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "old.db"
    conn = sqlite3.connect(path, isolation_level=None)
    with monkeypatch.context() as patch:
        older = tuple(m for m in migrations.MIGRATIONS if m.version < 21)
        patch.setattr(migrations, "MIGRATIONS", older)
        migrations.apply(conn)
    conn.executemany("INSERT INTO tombstones VALUES (?, ?, ?, ?, ?, ?, ?, ?)", OLD_ROWS)
    conn.close()
    store = SQLiteStore(str(path))
    try:
        with store.write() as w:
            for tenant in ("t", "u"):
                w.insert(_memory("S1", tenant=tenant, kind="summary", content="the summary"))
        _check_migrated(store)
        tables = {r[0] for r in store._query("SELECT name FROM sqlite_master", ())}
        assert "tombstones" not in tables
        groups = store._query("SELECT members FROM tombstone_groups ORDER BY grp", ())
        assert sorted(g[0] for g in groups) == [1, 2, 3, GROUP_LIMIT]
        assert store.integrity_check() == "ok"
    finally:
        store.close()


@pytest.mark.postgres
def test_postgres_migration_19_moves_per_id_tombstones_into_groups(
    pg_schema_dsn: str,
) -> None:
    import psycopg

    from ctxwarden.store import pg_migrations
    from ctxwarden.store.postgres import PostgresStore

    with psycopg.connect(pg_schema_dsn, autocommit=True) as pg:
        pg_migrations.apply(pg, below=19)
        with pg.cursor() as cursor:
            cursor.executemany(
                "INSERT INTO tombstones VALUES (%s, %s, %s, %s, %s, %s, %s, %s)", OLD_ROWS
            )
    store = PostgresStore(pg_schema_dsn)
    try:
        with store.write() as w:
            for tenant in ("t", "u"):
                w.insert(_memory("S1", tenant=tenant, kind="summary", content="the summary"))
        _check_migrated(store)
        assert store._query("SELECT to_regclass('tombstones') IS NULL", ()) == [(True,)]
    finally:
        store.close()


def test_history_counts_each_retired_id_from_when_it_began(store: Store) -> None:
    """The dashboard's series count every retired id from its own start to its deletion,
    whether its group falls in one time bucket (counted in SQL) or spans several or is an
    erasure's (decoded): the series agree with the tombstones read back one by one."""
    from ctxwarden.store import history

    with store.write() as w:
        for k in range(4):  # an hour apart: the group spans buckets
            w.insert(_memory(f"a{k}", content=f"a{k}", at=3600.0 * k))
        for k in range(2):  # a second apart: one bucket
            w.insert(_memory(f"b{k}", content=f"b{k}", at=30000.0 + k))
    _retire = [("S0", ["a0", "a1", "a2", "a3"]), ("S1", ["b0", "b1"])]
    with store.write() as w:
        for summary, ids in _retire:
            lines = "\n".join(f"- [{i}] ana: line {i}" for i in ids)
            content = f"Summary of {len(ids)} messages\nEvents:\n{lines}"
            rowid = w.insert(_summary_of(summary, ids, content=content))
            w.retire("t", ids, summary_rowid=rowid, deleted_at=40000.0, reason="compacted")
    with store.write() as w:
        assert w.erase_id("t", "a1", deleted_at=50000.0, reason="erased") is not None
    health = history.health(store, "t", buckets=48)
    width, count = health["width"], health["buckets"]
    stones = store.tombstones("t")
    created = [m.created_at for m in store.iter_memories("t")]
    begins = [t.time_range[0] if t.time_range else t.deleted_at for t in stones]
    low = min([*created, *begins, *(t.deleted_at for t in stones)])
    start = int(low // width) * width

    def bucket(at: float) -> int:
        return min(max(int(at - start) // width, 0), count - 1)

    expected = [0] * count
    for at in created:
        expected[bucket(at)] += 1
    for t, began in zip(stones, begins, strict=True):
        expected[bucket(began)] += 1
        expected[bucket(t.deleted_at)] -= 1
    alive = list(itertools.accumulate(expected))
    assert health["memories"]["alive"] == alive
    retired = health["memories"]["retired"]
    assert (sum(retired["compacted"]), sum(retired["erased"])) == (5, 1)
