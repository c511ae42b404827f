"""Lexical search of scripts written without spaces (issues 18 and 19), on both backends.

Chinese, Japanese, Korean and Thai runs are indexed as character bigrams beside the existing
terms (ctxwarden.segment): a query sharing one two-character word with a message finds it among
others, however the rest of the run differs.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ctxwarden.assemble import query_terms
from ctxwarden.engine import Engine
from ctxwarden.segment import bigram_text
from ctxwarden.store import migrations
from ctxwarden.store.base import Store
from ctxwarden.store.sqlite import SQLiteStore

# Written for these tests: everyday team chat, each message with its own words.
JAPANESE = {
    "ja1": "来週の会議は木曜日の午後三時からに変更になりました。",
    "ja2": "昨日のランチはとても美味しかったです。",
    "ja3": "新しいサーバーの設定がやっと終わりました。",
    "ja4": "明日は雨が降るそうなので、傘を忘れないでください。",
    "ja5": "経費の精算は月末までにお願いします。",
}
CHINESE = {
    "zh1": "我们明天在北京开会，请大家准时到达。",
    "zh2": "这个项目的预算已经批准了。",
    "zh3": "周末我想去爬山，你要一起吗？",
    "zh4": "新版本的测试报告在共享文件夹里。",
}
OTHER = {
    "en1": "The deploy window moved to Wednesday at ten.",
    "mix1": "APIキーを更新したので、config.yamlも直してください。",
    "ko1": "내일 회의는 오후 두 시에 시작합니다.",
    "ko2": "점심 메뉴를 정해 주세요.",
    "th1": "การประชุมพรุ่งนี้ถูกยกเลิกแล้ว",
    "th2": "ร้านกาแฟใหม่เปิดใกล้สำนักงาน",
}


def _load(store: Store) -> Engine:
    engine = Engine(store)
    texts = {**JAPANESE, **CHINESE, **OTHER}
    engine.ingest(
        [
            {"id": key, "session": "s", "author": "ana", "content": text, "created_at": 100.0 + i}
            for i, (key, text) in enumerate(texts.items())
        ]
    )
    return engine


def _found(engine: Engine, query: str) -> list[str]:
    return [m.id for m, _ in engine.search(query, scope="tenant", limit=10)]


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("会議", "ja1"),  # a two-character word inside a long run
        ("次の会議はいつですか", "ja1"),  # a question phrased otherwise
        ("サーバー", "ja3"),
        ("精算の締め切り", "ja5"),
        ("北京", "zh1"),
        ("预算批准了吗", "zh2"),
        ("测试报告", "zh4"),
        ("회의가 언제예요", "ko1"),  # the same noun with another particle
        ("ประชุม", "th1"),
        ("ร้านกาแฟ", "th2"),
        ("deploy", "en1"),  # other scripts keep their terms
        ("api", "mix1"),  # a Latin word glued to a run
        ("キー", "mix1"),
        ("config.yaml", "mix1"),
    ],
)
def test_a_word_of_a_run_finds_its_message_first(store: Store, query: str, expected: str) -> None:
    engine = _load(store)
    found = _found(engine, query)
    assert found[:1] == [expected], (query, query_terms(query), found)


def test_unrelated_runs_do_not_match(store: Store) -> None:
    engine = _load(store)
    assert _found(engine, "飛行機") == []
    assert _found(engine, "火车站") == []


def test_an_edit_and_a_delete_move_the_bigrams(store: Store) -> None:
    engine = Engine(store)
    record = {"id": "a", "session": "s", "content": "会議室を予約しました", "created_at": 100.0}
    engine.ingest([record])
    assert _found(engine, "予約") == ["a"]
    result = engine.ingest([{**record, "content": "出張の申請を出しました"}])
    assert result.outcomes[0].status == "edited"
    assert _found(engine, "予約") == []
    assert _found(engine, "出張") == ["a"]
    engine.ingest(
        [{"id": "b", "session": "s", "content": "ok", "created_at": 101.0,
          "attachments": [{"kind": "image", "caption": "富士山の写真"}]}]
    )  # fmt: skip
    assert _found(engine, "富士山") == ["b"]  # an attachment's caption is segmented too
    engine.delete("a")
    engine.delete("b")
    assert _found(engine, "出張") == []
    assert _found(engine, "富士山") == []
    if isinstance(store, SQLiteStore):  # every FTS entry matches its row
        assert (
            store._query("INSERT INTO memories_fts (memories_fts) VALUES ('integrity-check')", ())
            == []
        )


def test_a_tenant_sharing_the_store_ranks_runs_as_when_alone(tmp_path: Path) -> None:
    """The per-tenant BM25 of a shared SQLite file reads each row's length over every column
    (the bigram column included), so a tenant's scores are those of a store of it alone."""
    alone = SQLiteStore(str(tmp_path / "alone.db"))
    shared = SQLiteStore(str(tmp_path / "shared.db"))
    try:
        for store in (alone, shared):
            _load(store)
        Engine(shared).ingest(
            [
                {"id": f"o{i}", "session": "o", "content": f"会議の議事録その{i}です"}
                for i in range(5)
            ],
            tenant="other",
        )
        query = ["会議", "木曜", "議は"]
        first = [(m.id, s) for m, s in alone.search("default", query, limit=5)]
        second = [(m.id, s) for m, s in shared.search("default", query, limit=5)]
        assert [i for i, _ in first] == [i for i, _ in second]
        assert [s for _, s in second] == pytest.approx([s for _, s in first], rel=1e-6)
    finally:
        alone.close()
        shared.close()


def test_migration_20_indexes_the_runs_of_older_rows(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    conn = sqlite3.connect(path, isolation_level=None)
    for migration in migrations.MIGRATIONS:
        if migration.version < 20:
            for statement in migration.statements:
                conn.execute(statement)
            conn.execute(f"PRAGMA user_version = {migration.version}")
    rows = [
        (1, JAPANESE["ja1"], None),
        (2, "the plain numbers", None),
        (3, "photo", json.dumps([{"kind": "image", "caption": "北京的天安门"}])),
    ]
    for rowid, content, attachments in rows:
        conn.execute(
            "INSERT INTO memories (rowid, id, tenant, session, author_kind, role, content, "
            "created_at, kind, content_hash, last_seen_at, attachments, attachment_text) "
            "VALUES (?, ?, 'default', 's', 'human', 'user', ?, 1.0, 'message', ?, 1.0, ?, ?)",
            (rowid, f"m{rowid}", content, f"h{rowid}", attachments,
             "北京的天安门" if attachments else None),
        )  # fmt: skip
        conn.execute(
            "INSERT INTO memories_fts (rowid, content, attachment_text) "
            "SELECT rowid, content, attachment_text FROM memories WHERE rowid = ?",
            (rowid,),
        )
    assert conn.execute(
        "SELECT count(*) FROM memories_fts WHERE memories_fts MATCH '会議'"
    ).fetchone() == (0,)
    conn.close()
    store = SQLiteStore(str(path))
    try:
        assert [m.id for m, _ in store.search("default", ["会議"], limit=5)] == ["m1"]
        assert [m.id for m, _ in store.search("default", ["北京"], limit=5)] == ["m3"]
        assert [m.id for m, _ in store.search("default", ["numbers"], limit=5)] == ["m2"]
        assert (
            store._query("INSERT INTO memories_fts (memories_fts) VALUES ('integrity-check')", ())
            == []
        )
    finally:
        store.close()


@pytest.mark.postgres
def test_postgres_migration_18_indexes_the_runs_of_older_rows(
    pg_schema_dsn: str,
) -> None:
    import psycopg

    from ctxwarden.store import pg_migrations
    from ctxwarden.store.postgres import PostgresStore

    with psycopg.connect(pg_schema_dsn, autocommit=True) as pg:
        pg_migrations.apply(pg, below=18)
        for rowid, content in ((1, CHINESE["zh2"]), (2, "the plain numbers")):
            pg.execute(
                "INSERT INTO memories (rowid, id, tenant, session, author_kind, role, content, "
                "created_at, kind, content_hash, last_seen_at) VALUES (%s, %s, 'default', 's', "
                "'human', 'user', %s, 1.0, 'message', %s, 1.0)",
                (rowid, f"m{rowid}", content, f"h{rowid}"),
            )
    store = PostgresStore(pg_schema_dsn)
    try:
        assert [m.id for m, _ in store.search("default", ["预算"], limit=5)] == ["m1"]
        assert [m.id for m, _ in store.search("default", ["numbers"], limit=5)] == ["m2"]
    finally:
        store.close()


_KANA_KANJI = st.sampled_from(list("あいうかきくさしすアイウカキク日本語会議木曜東京山川"))


@settings(max_examples=200, deadline=None)
@given(
    before=st.text(_KANA_KANJI, max_size=8),
    word=st.text(_KANA_KANJI, min_size=2, max_size=6),
    after=st.text(_KANA_KANJI, max_size=8),
    latin=st.sampled_from(["", "deploy ", "v2 "]),
)
def test_every_term_of_a_word_is_indexed_for_a_text_holding_it(
    before: str, word: str, after: str, latin: str
) -> None:
    """Whatever surrounds a word of two or more characters in a run, the terms a query of it
    searches are all among the terms indexed for the text (so FTS5 and PostgreSQL match it)."""
    text = f"{latin}{before}{word}{after}。"
    indexed = set((bigram_text(text) or "").split())
    assert set(query_terms(word)) <= indexed


def test_erasing_a_compacted_id_takes_its_bigrams_out_of_the_summary(store: Store) -> None:
    """A summary rewritten without an erased message's line loses that line's bigrams from the
    index too (the erased words must not stay searchable)."""
    from tests.store.test_conformance import _memory, _summary_of

    summary = (
        "Summary of 2 messages\nEvents:\n- [a] ana: 金庫の暗証番号は四七一一\n"
        "- [b] ana: 会議室を予約"
    )
    with store.write() as w:
        w.insert(_memory("a", content="金庫の暗証番号は四七一一"))
        w.insert(_memory("b", content="会議室を予約"))
        rowid = w.insert(_summary_of("S1", ["a", "b"], content=summary))
        w.retire("t", ["a", "b"], summary_rowid=rowid, deleted_at=600.0, reason="compacted")
    assert [m.id for m, _ in store.search("t", ["暗証"], limit=5)] == ["S1"]
    with store.write() as w:
        receipt = w.erase_id("t", "a", deleted_at=700.0, reason="user request")
    assert receipt is not None
    assert receipt.summaries_rewritten == ("S1",)
    assert store.search("t", ["暗証"], limit=5) == []
    assert [m.id for m, _ in store.search("t", ["予約"], limit=5)] == ["S1"]
    if isinstance(store, SQLiteStore):
        assert (
            store._query("INSERT INTO memories_fts (memories_fts) VALUES ('integrity-check')", ())
            == []
        )
