"""Lexical search ranks like BM25 on every backend: observable properties, run on SQLite and
PostgreSQL alike (the ``store`` fixture of the conformance suite)."""

from __future__ import annotations

import dataclasses
import urllib.parse
import uuid
from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ctxwarden.scope import ReadScope
from ctxwarden.store import sqlite_lexical as sqlite_module
from ctxwarden.store.base import NewMemory, Store
from ctxwarden.store.pg_lexical import choose_terms, idf
from ctxwarden.store.sqlite import SQLiteStore


def _memory(id: str, content: str, *, tenant: str = "t") -> NewMemory:
    return NewMemory(
        id=id, tenant=tenant, session="s", channel="c", author="ana", author_kind="human",
        role="user", content=content, created_at=100.0, thread_id=None, reply_to=None,
        kind="message", pinned=False, name=None, tool_calls=(), tool_call_id=None,
        attachments=(), metadata={}, content_hash=f"h-{id}", near_key=None,
    )  # fmt: skip


def _ids(store: Store, terms: list[str], tenant: str = "t") -> list[str]:
    return [m.id for m, _ in store.search(tenant, terms)]


def test_a_rare_term_outranks_a_common_one(store: Store) -> None:
    # Same length, one matching term each: only the inverse document frequency separates them.
    # The rare one is stored last, so a rank without IDF (ties broken by rowid) puts it last.
    with store.write() as w:
        for i in range(12):
            w.insert(_memory(f"c{i}", f"the deploy went out at stage {i:02d} today"))
        for i in range(20):  # neither term: 'deploy' stays in fewer than half the rows
            w.insert(_memory(f"n{i}", f"lunch is at noon on floor {i:02d}"))
        w.insert(_memory("both", "the deploy of kafka went out at stage 99"))
        w.insert(_memory("rare", "the kafka went out at stage 77 today"))
    hits = store.search("t", ["deploy", "kafka"])
    assert [m.id for m, _ in hits][:2] == ["both", "rare"]
    assert all(score > 0 for _, score in hits)
    scores = [score for _, score in hits]
    assert scores == sorted(scores, reverse=True)
    assert len(hits) == 14


def test_rarity_is_per_tenant_on_postgres_and_shorter_matches_rank_first(store: Store) -> None:
    with store.write() as w:
        w.insert(_memory("long", "kafka " + " ".join(f"word{i}" for i in range(40))))
        w.insert(_memory("short", "kafka lag"))
        w.insert(_memory("other", "kafka again", tenant="u"))
    # Length normalisation: the same term once, in a shorter message, weighs more.
    assert _ids(store, ["kafka"]) == ["short", "long"]
    assert _ids(store, ["kafka"], tenant="u") == ["other"]


def test_common_terms_are_dropped_from_long_queries(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The thresholds are lowered so that a handful of rows makes a term "common".
    monkeypatch.setattr(sqlite_module, "COMMON_TERM_ROWS", 4)
    monkeypatch.setattr(sqlite_module, "SEARCH_ROW_BUDGET", 6)
    with store.write() as w:
        for i in range(5):
            w.insert(_memory(f"w{i}", f"weekly status note {i}"))
        w.insert(_memory("k", "kafka broker restarted"))
        w.insert(_memory("r", "redis failover done"))
    # Three terms: 'weekly' matches 5 rows >= 4, so it is dropped; the two rarest are kept.
    assert sorted(_ids(store, ["weekly", "kafka", "redis"])) == ["k", "r"]
    # Two terms are always searched, however common.
    assert set(_ids(store, ["weekly", "kafka"])) == {"w0", "w1", "w2", "w3", "w4", "k"}
    # Only common words: the two rarest still answer.
    assert len(_ids(store, ["weekly", "status", "note"])) == 5


def test_terms_matching_more_rows_than_the_budget_rank_only_the_newest(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sqlite_module, "COMMON_TERM_ROWS", 4)
    monkeypatch.setattr(sqlite_module, "SEARCH_ROW_BUDGET", 6)
    monkeypatch.setattr(sqlite_module, "ROWS_PER_RESULT", 2)
    with store.write() as w:
        # The oldest is the best BM25 match (the shortest), the newer ones are longer.
        w.insert(_memory("old", "weekly"))
        for i in range(9):
            w.insert(_memory(f"w{i}", f"weekly status note number {i} for the team"))
    # limit 10: a budget of 6 rows, the newest six; limit 2: 4 rows (2 per result).
    assert sorted(_ids(store, ["weekly"])) == [f"w{i}" for i in range(3, 9)]
    assert {m.id for m, _ in store.search("t", ["weekly"], limit=2)} <= {"w5", "w6", "w7", "w8"}
    assert sqlite_module.row_budget(2) == 4
    assert sqlite_module.row_budget(100) == 6


def test_idf_and_term_choice() -> None:
    assert idf(100, 1) > idf(100, 10) > idf(100, 40)
    assert idf(100, 60) == 1e-6  # FTS5 floors a term in most rows
    assert choose_terms({"a": 1, "b": 2}) == ["a", "b"]
    assert choose_terms({"x": 5000, "y": 1, "z": 3000, "w": 2}) == ["y", "w"]
    assert choose_terms({"x": 10, "y": 5999, "z": 1}) == ["x", "z"]  # budget 6,000 rows
    assert choose_terms({"x": 10, "y": 500, "z": 1}, 100) == ["x", "z"]  # a smaller budget
    assert choose_terms({}) == []


def test_a_very_common_word_is_left_out_when_a_rarer_one_matches(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    _status_reports(store, monkeypatch, _memory("q", "quarterly review"))
    # "status" (9 of 10 rows) is a stop word next to "zeppelin": only the zeppelin row matches.
    assert _ids(store, ["status", "zeppelin"]) == ["z"]
    # "review" (1 row) is not very common: both words are searched.
    assert set(_ids(store, ["review", "zeppelin"])) == {"q", "z"}
    # Only very common words (or a rarer one that matches nothing): they are still searched.
    assert len(_ids(store, ["status", "report"])) == 9
    assert len(_ids(store, ["status", "nowhere"])) == 9


def test_a_required_term_too_common_to_search_means_no_search(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A bridge hop asks for the hit's new words: when every one of them is left out as too
    # common, the hop would only repeat the main search, so nothing is searched.
    _status_reports(store, monkeypatch, _memory("h", "zeppelin hangar"))
    assert store.search("t", ["status", "zeppelin"], require=["status"]) == []
    found = store.search("t", ["hangar", "zeppelin"], require=["hangar"])
    assert {m.id for m, _ in found} == {"z", "h"}
    assert {m.id for m, _ in store.search("t", ["status", "zeppelin"])} == {"z", "h"}


def _status_reports(store: Store, monkeypatch: pytest.MonkeyPatch, extra: NewMemory) -> None:
    """Eight "status report" rows, "zeppelin status" and ``extra``, with lowered thresholds: a
    word in a fifth of the rows (and at least 3) is "very common"."""
    monkeypatch.setattr(sqlite_module, "VERY_COMMON_SHARE", 0.2)
    monkeypatch.setattr(sqlite_module, "VERY_COMMON_MIN_ROWS", 3)
    with store.write() as w:
        for i in range(8):
            w.insert(_memory(f"s{i}", f"status report {i}"))
        w.insert(_memory("z", "zeppelin status"))
        w.insert(extra)


def _tenant_b_scores(store: Store, word_of_a: str) -> list[tuple[str, float]]:
    """Tenant B's scores for a query after tenant A stored rows holding ``word_of_a``."""
    words = [f"w{i}x" for i in range(60)]
    with store.write() as w:
        for i in range(80):
            text = " ".join(words[(i * 7 + j * 3) % 60] for j in range(3 + i % 9))
            if i % 5 == 0:
                text += " kafka" * (1 + i % 3)
            w.insert(_memory(f"b{i}", text, tenant="B"))
            if i % 2 == 0:  # A's rows: as many, as long, only one word differs between runs
                w.insert(_memory(f"a{i}", f"w1x w2x {word_of_a} {word_of_a}", tenant="A"))
    return [(m.id, score) for m, score in store.search("B", ["kafka", "w3x", "w10x"])]


@pytest.fixture
def second_store(store: Store, request: pytest.FixtureRequest) -> Iterator[Store]:
    """A second, empty store of the ``store`` fixture's backend."""
    if isinstance(store, SQLiteStore):
        other: Store = SQLiteStore(":memory:")
    else:
        import psycopg

        from ctxwarden.store.postgres import PostgresStore

        dsn = request.getfixturevalue("pg_dsn")
        schema = f"t_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f"CREATE SCHEMA {schema}")
        options = urllib.parse.quote(f"-c search_path={schema},public")
        other = PostgresStore(f"{dsn}{'&' if '?' in dsn else '?'}options={options}")
    yield other
    other.close()


def test_another_tenants_words_do_not_change_a_tenants_scores(
    store: Store, second_store: Store
) -> None:
    # The side-channel probe of issue 20: B's scores are identical whether or not A stored
    # the word B searches for (FTS5's statistics span the file; the scores must not).
    with_word = _tenant_b_scores(store, "kafka")
    without_word = _tenant_b_scores(second_store, "zebra")
    assert with_word == without_word
    assert len(with_word) > 10
    # A's rows hold the word, and A's own search still finds them.
    assert len(store.search("A", ["kafka"])) == 40


def test_a_tenants_scores_in_a_shared_file_are_those_of_the_tenant_alone() -> None:
    # SQLite: ranked with the tenant's own statistics, the scores are what FTS5 gives in a
    # file holding that tenant alone (to rounding), and the order is the same.
    shared, alone = SQLiteStore(":memory:"), SQLiteStore(":memory:")
    _tenant_b_scores(shared, "kafka")
    words = [f"w{i}x" for i in range(60)]
    with alone.write() as w:
        for i in range(80):
            text = " ".join(words[(i * 7 + j * 3) % 60] for j in range(3 + i % 9))
            if i % 5 == 0:
                text += " kafka" * (1 + i % 3)
            w.insert(_memory(f"b{i}", text, tenant="B"))
    terms = ["kafka", "w3x", "w10x"]
    got = [(m.id, score) for m, score in shared.search("B", terms)]
    expected = [(m.id, score) for m, score in alone.search("B", terms)]
    assert [i for i, _ in got] == [i for i, _ in expected]
    assert [s for _, s in got] == pytest.approx([s for _, s in expected], rel=1e-12)
    # Scoped to a session, too.
    scope = ReadScope(kind="session", session="s")
    assert [m.id for m, _ in shared.search("B", terms, scope=scope)] == [i for i, _ in expected]


_WORDS = ("alpha", "beta", "gamma", "delta", "kafka", "lunch")


@settings(max_examples=30, deadline=None)
@given(
    rows=st.lists(
        st.tuples(
            st.sampled_from(("s1", "s2", "s3")),
            st.sampled_from((None, "ana", "bo")),
            st.lists(st.sampled_from(_WORDS), min_size=1, max_size=6),
        ),
        min_size=1,
        max_size=40,
    ),
    # Two terms at most: a search keeps its two rarest terms whatever its budget, so the
    # reference (limit 1,000) and the scoped search (a smaller budget) search the same terms;
    # with three, the scoped search may leave the commonest out and score without it.
    terms=st.lists(st.sampled_from(_WORDS), min_size=1, max_size=2, unique=True),
    session=st.sampled_from((None, "s1", "s2")),
    user=st.sampled_from((None, "ana", "bo")),
    limit=st.integers(min_value=1, max_value=12),
    per_match=st.sampled_from((0, 3, 10_000)),
)
def test_a_scoped_search_is_the_tenants_ranking_filtered_to_the_scope(
    rows: list[tuple[str, str | None, list[str]]],
    terms: list[str],
    session: str | None,
    user: str | None,
    limit: int,
    per_match: int,
) -> None:
    # SQLite checks a scoped search's matches against the scope's rowid list or by a look-up
    # of each match's row (SCOPE_LIST_PER_MATCH picks one: 0 always looks up, 10,000 always
    # lists), or not at all when the scope's rows are all of its rowid range: either way, the
    # scope's best `limit` of the tenant's own ranking, same scores, among the scope's newest
    # row_budget(limit) matches.
    if session is None and user is None:
        return
    store = SQLiteStore(":memory:")
    with store.write() as w:
        for i, (row_session, row_user, words) in enumerate(rows):
            memory = _memory(f"m{i}", " ".join(words))
            w.insert(dataclasses.replace(memory, session=row_session, user=row_user))
    scope = ReadScope(kind="user" if session is None else "session", session=session, user=user)
    everything = store.search("t", terms, limit=1000)
    in_scope = [
        (m, score)
        for m, score in everything
        if (session is None or m.session == session) and (user is None or m.user == user)
    ]
    budget = sqlite_module.row_budget(limit)
    if len(in_scope) > budget:  # only the scope's newest `budget` matches are ranked
        floor = sorted((m.rowid for m, _ in in_scope), reverse=True)[budget - 1]
        in_scope = [(m, score) for m, score in in_scope if m.rowid >= floor]
    expected = [(m.id, score) for m, score in in_scope][:limit]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sqlite_module, "SCOPE_LIST_PER_MATCH", per_match)
        found = store.search("t", terms, limit=limit, scope=scope)
    assert [(m.id, score) for m, score in found] == expected


@pytest.mark.parametrize(("interleaved", "shared"), [(False, False), (True, False), (True, True)])
def test_a_scoped_search_ranks_the_scopes_newest_budget_of_matches(
    store: Store, interleaved: bool, shared: bool
) -> None:
    """A session of 62 matches, searched for one result (a budget of 20 matching rows): the
    best of its newest 20 matches is found, not the equal match that ranks first over the
    whole session, which is older. Alone in its rowid range or interleaved with another
    session's rows, in a store of one tenant or shared with another (SQLite's tenant-own
    ranking), on both backends."""
    with store.write() as w:
        w.insert(_memory("old-best", "kafka kafka lag"))  # the best match (and its twin, newest)
        for i in range(60):
            w.insert(_memory(f"k{i}", f"kafka broker number {i} restarted after the lag spike"))
            if interleaved:
                w.insert(dataclasses.replace(_memory(f"o{i}", "kafka lag elsewhere"), session="o"))
        w.insert(_memory("new-best", "kafka kafka lag"))
        if shared:
            w.insert(_memory("theirs", "kafka lag", tenant="u"))
    scope = ReadScope(kind="session", session="s")
    assert sqlite_module.row_budget(1) == 20
    [(found, _)] = store.search("t", ["kafka", "lag"], limit=1, scope=scope)
    assert found.id == "new-best"
    unscoped = store.search("t", ["kafka", "lag"], limit=200)
    assert [m.id for m, _ in unscoped[:2]] == ["old-best", "new-best"]  # ties: older first


@pytest.mark.postgres
def test_postgres_counts_a_small_tenants_terms_again_only_after_a_row_is_added(
    pg_schema_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A tenant under FRESH_ROWS reuses its statistics while the store's newest row is the
    same (three searches of one assemble count each term once), and counts them again once a
    row is added, so a new row's words weigh what they now do."""
    from ctxwarden.store import pg_lexical
    from ctxwarden.store.pg_lexical import Lexical
    from ctxwarden.store.postgres import PostgresStore

    store = PostgresStore(pg_schema_dsn)
    try:
        with store.write() as w:
            for i in range(6):
                w.insert(_memory(f"d{i}", f"the deploy went out at stage {i}"))
            w.insert(_memory("k", "kafka lag again"))
        ran: list[str] = []

        def query(sql: str, params: object) -> list[tuple[object, ...]]:
            ran.append(sql)
            return store._query(sql, params)  # type: ignore[arg-type]

        lexical = Lexical()

        def idfs() -> dict[str, float]:
            made = lexical.statement(query, "t", ["deploy", "kafka"], 10)
            assert made is not None
            params = made[1]
            return {params["t0"]: params["idf0"], params["t1"]: params["idf1"]}

        def counted() -> int:
            return sum("numnode" in sql for sql in ran)

        first = idfs()
        assert counted() == 1
        assert idfs() == first
        assert idfs() == first
        assert counted() == 1  # reused: nothing was added
        with store.write() as w:
            for i in range(6):
                w.insert(_memory(f"k{i}", f"kafka broker {i} restarted"))
        second = idfs()
        assert counted() == 2
        assert second["kafka"] < first["kafka"]  # seven of thirteen rows now hold it
        stamps = sum("max(rowid)" in sql for sql in ran)
        assert stamps == 4  # one probe a search of a small tenant
        # A tenant of FRESH_ROWS or more keeps its statistics by time alone: no probe.
        monkeypatch.setattr(pg_lexical, "FRESH_ROWS", 10)
        lexical = Lexical()
        idfs()  # counts: 13 rows now make a large tenant
        idfs()
        assert sum("max(rowid)" in sql for sql in ran) == stamps + 1  # the first search only
    finally:
        store.close()
