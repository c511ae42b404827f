"""PostgreSQL reads every anchor's neighbours with one branch per shape (a ``LATERAL`` over
arrays of the anchors' values, :mod:`ctxwarden.store.pg_neighbours`): the same links, in the
same order, as the ``UNION ALL`` of every anchor's branches it replaces."""

from __future__ import annotations

import urllib.parse
import uuid
from collections.abc import Iterator

import pytest
from conversation import conversation
from hypothesis import given, settings
from hypothesis import strategies as st

from ctxwarden.scope import ReadScope
from ctxwarden.store.reads import MemoryReads

pytestmark = pytest.mark.postgres

SEEDS = 4


@pytest.fixture(scope="module")
def pg_store(pg_dsn: str) -> Iterator[object]:
    """One store in a fresh schema, holding the conversations of seeds 0-3 (tenants t0-t3)."""
    import psycopg

    from ctxwarden.store.postgres import PostgresStore

    schema = f"t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    options = urllib.parse.quote(f"-c search_path={schema},public")
    store = PostgresStore(f"{pg_dsn}{'&' if '?' in pg_dsn else '?'}options={options}")
    try:
        for seed in range(SEEDS):
            conversation(store, seed, tenant=f"t{seed}")
        yield store
    finally:
        store.close()
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA {schema} CASCADE")


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, SEEDS - 1),
    picks=st.lists(st.integers(0, 59), max_size=30),
    turns=st.integers(0, 3),
    replies=st.integers(0, 4),
    scope=st.sampled_from([None, ("s0", None), ("s1", "alice"), (None, "bob")]),
)
def test_neighbours_by_shape_are_the_union_statements_links(
    pg_store: object,
    seed: int,
    picks: list[int],
    turns: int,
    replies: int,
    scope: tuple[str | None, str | None] | None,
) -> None:
    from ctxwarden.store.postgres import PostgresStore

    assert isinstance(pg_store, PostgresStore)
    tenant = f"t{seed}"
    anchors = [pg_store.get(tenant, f"m{i}") for i in picks]
    read_scope = (
        None
        if scope is None
        else ReadScope(kind="session" if scope[0] else "user", session=scope[0], user=scope[1])
    )
    expected = MemoryReads.neighbours(pg_store, tenant, anchors, turns=turns, replies=replies,
                                      scope=read_scope)  # fmt: skip
    got = pg_store.neighbours(tenant, anchors, turns=turns, replies=replies, scope=read_scope)
    assert got == expected
