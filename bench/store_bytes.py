"""Where a store's bytes are, before and after compaction, and what a lossless pack would save.

    uv run python bench/store_bytes.py [DATA ...] [--keep-days 7] [--keep-sessions 2]
        [--conversations N] [--limit N] [--budget 4000] [--pack] [--max-cluster-tokens N]

``DATA`` as for bench/retention.py (chatbench-dev and locomo-dev by default). For each data set
the log is ingested into one SQLite store and compacted with the default policy and the
extractive summariser, as bench/retention.py does; this prints what retention.py does not:

- the value bytes of each column of ``memories``, ``tombstone_groups`` and ``tombstone_keys``
  as SQLite's record format stores them (a text's UTF-8 bytes, 8 for a REAL, 0-8 for an integer
  by its size; the rowid alias and the headers not counted), before and after, so a row's size
  is split into its text and the per-record rest;
- the tombstones' pages in three layouts, each built from the same tombstones in a copy: the
  store's (``tombstone_groups``, one row per summary or erasure, and ``tombstone_keys``, a
  32-bit hash per id to find its group), the groups with a (tenant, id) -> group table instead
  of the hashes, and the per-id rows of ``tombstones`` before SQLite migration 21;
- the store (pages after FTS optimize and VACUUM) and the FTS index under ``detail=full`` /
  ``column`` / ``none`` for the same texts (copies built beside it, the engine's tokenizer).

``--pack`` is a what-if, not something the engine does: the summary's limit (at most
``max_summary_share`` of its cluster's tokens, ``max_summary_tokens`` at most) is lifted to 1.5 x
the cluster's tokens, so a cluster whose every sentence is a fact (a LoCoMo session) becomes one
extractive summary that keeps every fact sentence verbatim: the bytes it saves are the
per-record overhead alone. (The engine's own answer to such clusters is the lossless pack of
``CompactionPolicy.lossless_packs``, on by default, which keeps every message whole: the
default-policy run shows it.) It prints the store's size and the share of questions whose
gold answer string is in the assembled context (as retention.py) and anywhere in the store's
texts (so an answer the context lost is told from one the store lost). ``--max-cluster-tokens``
sets the policy's cluster size for it (default: the policy's).
"""

from __future__ import annotations

import argparse
import contextlib
import sqlite3
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any
from unittest import mock

from ctxwarden import Engine, cluster_summary, compact
from ctxwarden.engine import EngineConfig
from ctxwarden.store.sqlite import SQLiteStore
from ctxwarden.store.tombstones import GROUP_COLUMNS, tombstones_of
from retention import (
    DataSet,
    _objects,
    _retention,
    _size,
    data_arguments,
    read_chatbench,
    read_locomo_cases,
)

#: The tombstones' layouts measured by :func:`_tombstone_layouts`: table -> its DDL.
LAYOUTS = {
    "ids_by_name": "CREATE TABLE ids_by_name (tenant TEXT NOT NULL, id TEXT NOT NULL, "
    "grp INTEGER NOT NULL, PRIMARY KEY (tenant, id)) WITHOUT ROWID",
    "per_id": "CREATE TABLE per_id (tenant TEXT NOT NULL, id TEXT NOT NULL, "
    "deleted_at REAL NOT NULL, summary_id TEXT, content_hash TEXT NOT NULL, time_start REAL, "
    "time_end REAL, reason TEXT NOT NULL, PRIMARY KEY (tenant, id)) WITHOUT ROWID",
}
#: A value's bytes in SQLite's record format (https://sqlite.org/fileformat.html#record_format):
#: integers 0 and 1 take none, others 1, 2, 3, 4, 6 or 8 by their range.
_STORED = """CASE typeof({0})
    WHEN 'null' THEN 0 WHEN 'real' THEN 8
    WHEN 'integer' THEN CASE
        WHEN {0} IN (0, 1) THEN 0 WHEN {0} BETWEEN -128 AND 127 THEN 1
        WHEN {0} BETWEEN -32768 AND 32767 THEN 2 WHEN {0} BETWEEN -8388608 AND 8388607 THEN 3
        WHEN {0} BETWEEN -2147483648 AND 2147483647 THEN 4
        WHEN {0} BETWEEN -140737488355328 AND 140737488355327 THEN 6 ELSE 8 END
    ELSE length(CAST({0} AS BLOB)) END"""
FTS = "tokenize='porter unicode61 remove_diacritics 2'"  # the engine's (store/migrations.py)


def _columns(db: Path, table: str) -> tuple[int, dict[str, int]]:
    """Rows and value bytes per column of ``table``."""
    with contextlib.closing(sqlite3.connect(db)) as conn:
        names = [str(row[1]) for row in conn.execute(f"PRAGMA table_info({table})")]
        rows = int(conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0])
        keys = [row for row in conn.execute(f"PRAGMA table_info({table})") if row[5]]
        # The rowid alias (an INTEGER PRIMARY KEY) is the b-tree's key, not a record value.
        if len(keys) == 1 and str(keys[0][2]).upper() == "INTEGER":
            names = [n for n in names if n != keys[0][1]]
        sums = conn.execute(
            "SELECT " + ", ".join(f"coalesce(sum({_STORED.format(n)}), 0)" for n in names)
            + f" FROM {table}"
        ).fetchone()  # fmt: skip
    return rows, {n: int(v) for n, v in zip(names, sums, strict=True)}


def _fts_sizes(db: Path) -> dict[str, int] | None:
    """Pages of an FTS5 index of the memories' texts per ``detail`` option (None without
    ``dbstat``). Built in a copy of the database, so the store is not touched."""
    with tempfile.TemporaryDirectory() as tmp, contextlib.closing(sqlite3.connect(db)) as src:
        copy = Path(tmp) / "fts.db"
        with contextlib.closing(sqlite3.connect(copy)) as conn:
            src.backup(conn)
            out = {}
            for detail in ("full", "column", "none"):
                name = f"fts_{detail}"
                conn.execute(
                    f"CREATE VIRTUAL TABLE {name} USING fts5 (content, attachment_text, "
                    f"bigram_text, {FTS}, detail={detail})"
                )
                conn.execute(
                    f"INSERT INTO {name} (content, attachment_text, bigram_text) "
                    "SELECT content, attachment_text, bigram_text FROM memories"
                )
                conn.execute(f"INSERT INTO {name} ({name}) VALUES ('optimize')")
                conn.commit()
                try:
                    shadow = (f"{name}_data", f"{name}_idx", f"{name}_docsize")
                    size = conn.execute(
                        "SELECT coalesce(sum(pgsize), 0) FROM dbstat WHERE name IN (?, ?, ?)",
                        shadow,
                    ).fetchone()[0]
                except sqlite3.OperationalError:  # no dbstat in this SQLite
                    return None
                out[detail] = int(size)
    return out


def _tombstone_layouts(db: Path) -> tuple[int, dict[str, int]] | None:
    """Retired ids, and the pages of the tombstones: ``groups`` (``tombstone_groups`` and its
    index), ``keys`` (``tombstone_keys``), and, built in a copy from the same tombstones,
    ``ids_by_name`` (a (tenant, id) -> group table, what ``keys`` would be without hashing)
    and ``per_id`` (a row per id, the layout before SQLite migration 21). None without
    ``dbstat``."""
    with tempfile.TemporaryDirectory() as tmp, contextlib.closing(sqlite3.connect(db)) as src:
        copy = Path(tmp) / "tombstones.db"
        with contextlib.closing(sqlite3.connect(copy)) as conn:
            src.backup(conn)
            found = tombstones_of(conn.execute(f"SELECT {GROUP_COLUMNS} FROM tombstone_groups"))
            for ddl in LAYOUTS.values():
                conn.execute(ddl)
            conn.executemany(
                "INSERT INTO ids_by_name VALUES (?, ?, ?)",
                [(f.tenant, f.member.id, f.grp) for f in found],
            )
            conn.executemany(
                "INSERT INTO per_id VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                [
                    (t.tenant, t.id, t.deleted_at, t.summary_id, t.content_hash,
                     *(t.time_range or (None, None)), t.reason)
                    for t in (f.tombstone() for f in found)
                ],
            )  # fmt: skip
            conn.commit()
            try:
                sizes = dict(conn.execute("SELECT name, sum(pgsize) FROM dbstat GROUP BY name"))
            except sqlite3.OperationalError:  # no dbstat in this SQLite
                return None
    groups = sizes.get("tombstone_groups", 0) + sizes.get("tombstone_groups_summary", 0)
    return len(found), {
        "groups": groups,
        "keys": sizes.get("tombstone_keys", 0),
        "ids_by_name": sizes.get("ids_by_name", 0),
        "per_id": sizes.get("per_id", 0),
    }


def _in_store(store: SQLiteStore, data: DataSet) -> int:
    """Questions whose gold answer string is in some memory's text of their tenant."""
    hits = 0
    for case in data.cases:
        rows = store._query("SELECT content FROM memories WHERE tenant = ?", (case.tenant,))
        text = "\n".join(str(row[0]) for row in rows).casefold()
        hits += sum(answer.casefold() in text for _, answer in case.qa)
    return hits


@contextlib.contextmanager
def _packing(pack: bool) -> Iterator[None]:
    if not pack:
        yield
        return

    # The what-if: a summary may take every fact of its cluster (1.5 x its tokens covers the
    # line prefixes, `- [id] HH:MM author: `, kept sentences get: ~1.1-1.3 x on locomo-dev).
    def limit(cluster: Any, _cap: int | None, _share: float) -> int:
        return int(cluster.tokens * 1.5)

    with (
        mock.patch.object(compact, "summary_limit", limit),
        mock.patch.object(cluster_summary, "summary_limit", limit),
    ):
        yield


def _table(
    title: str, before: tuple[int, dict[str, int]], after: tuple[int, dict[str, int]]
) -> None:
    rows_before, cols_before = before
    rows_after, cols_after = after
    print(f"| {title}: column | bytes before | bytes after | per row after |")
    print("|---|---:|---:|---:|")
    names = sorted(cols_after, key=lambda n: (-cols_after[n], -cols_before.get(n, 0), n))
    for name in names:
        if cols_before.get(name, 0) or cols_after[name]:
            per_row = cols_after[name] / rows_after if rows_after else 0.0
            print(f"| {name} | {cols_before.get(name, 0):,} | {cols_after[name]:,} | "
                  f"{per_row:.1f} |")  # fmt: skip
    total_before, total_after = sum(cols_before.values()), sum(cols_after.values())
    print(f"| all ({rows_before:,} -> {rows_after:,} rows) | {total_before:,} | {total_after:,} | "
          f"{total_after / rows_after if rows_after else 0.0:.1f} |")  # fmt: skip
    print()


def run(data: DataSet, budget: int, pack: bool, max_cluster_tokens: int | None) -> None:
    clock = [0.0]
    config = EngineConfig(default_model="gpt-4", tokenizers=("cl100k_base",), embed="off")
    questions = sum(len(c.qa) for c in data.cases)
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "bench.db"
        with Engine.open(db, config=config, clock=lambda: clock[0]) as engine:
            store = engine.store
            assert isinstance(store, SQLiteStore)
            for case in data.cases:
                clock[0] = case.now
                engine.ingest(case.messages, tenant=case.tenant)
            size_before = _size(store)
            objects_before = _objects(store) or {}
            memories_before = _columns(db, "memories")
            groups_before, keys_before = (
                _columns(db, "tombstone_groups"),
                _columns(db, "tombstone_keys"),
            )
            fts_before = _fts_sizes(db)
            hits_before = sum(_retention(engine, c, budget) for c in data.cases) if pack else 0
            stored_before = _in_store(store, data) if pack else 0
            with _packing(pack):
                for case in data.cases:
                    clock[0] = case.now
                    policy = compact.CompactionPolicy(older_than=case.older_than)
                    if max_cluster_tokens is not None:
                        policy = replace(policy, max_cluster_tokens=max_cluster_tokens)
                    plan = engine.compact_plan(policy=policy, tenant=case.tenant)
                    engine.compact(plan, tenant=case.tenant)
            size_after = _size(store)
            objects_after = _objects(store) or {}
            hits_after = sum(_retention(engine, c, budget) for c in data.cases) if pack else 0
            stored_after = _in_store(store, data) if pack else 0
        memories_after = _columns(db, "memories")
        groups_after, keys_after = _columns(db, "tombstone_groups"), _columns(db, "tombstone_keys")
        fts_after = _fts_sizes(db)
        layouts = _tombstone_layouts(db)
    how = "lossless packs (what-if: summary limit 1.5 x the cluster)" if pack else "default policy"
    cluster = f", max_cluster_tokens {max_cluster_tokens}" if max_cluster_tokens else ""
    print(f"## {data.name}: {data.note}; {how}{cluster}")
    print()
    print("| measure | before | after | after / before |")
    print("|---|---:|---:|---:|")
    print(f"| store bytes (vacuumed) | {size_before:,} | {size_after:,} | "
          f"{size_after / size_before:.1%} |")  # fmt: skip
    fts_now = sum(v for k, v in objects_after.items() if k.startswith("memories_fts"))
    fts_then = sum(v for k, v in objects_before.items() if k.startswith("memories_fts"))
    if objects_before:
        print(f"| FTS index (memories_fts_*) | {fts_then:,} | {fts_now:,} | "
              f"{fts_now / fts_then if fts_then else 0.0:.1%} |")  # fmt: skip
    if fts_before is not None and fts_after is not None:
        for detail in ("full", "column", "none"):
            print(f"| FTS copy, detail={detail} | {fts_before[detail]:,} | {fts_after[detail]:,} | "
                  f"{fts_after[detail] / fts_before[detail]:.1%} |")  # fmt: skip
    if layouts is not None:
        ids, pages = layouts
        per = {name: f"{size / ids:.1f} per id" if ids else "" for name, size in pages.items()}
        print(f"| tombstones: retired ids | 0 | {ids:,} | |")
        print(f"| tombstones: groups (one row per summary or erasure) | 0 | "
              f"{pages['groups']:,} | {per['groups']} |")  # fmt: skip
        print(f"| tombstones: keys (32-bit hash of each id -> group) | 0 | "
              f"{pages['keys']:,} | {per['keys']} |")  # fmt: skip
        print(f"| tombstones, layout not taken: (tenant, id) -> group | 0 | "
              f"{pages['ids_by_name']:,} | {per['ids_by_name']} |")  # fmt: skip
        print(f"| tombstones, layout before: a row per id | 0 | "
              f"{pages['per_id']:,} | {per['per_id']} |")  # fmt: skip
    if pack:
        print(f"| answer string in context | {hits_before / questions:.1%} | "
              f"{hits_after / questions:.1%} | "
              f"{hits_after / hits_before if hits_before else 0.0:.1%} |")  # fmt: skip
        print(f"| answer string in the store's texts | {stored_before / questions:.1%} | "
              f"{stored_after / questions:.1%} | |")  # fmt: skip
    print()
    _table("memories", memories_before, memories_after)
    _table("tombstone_groups", groups_before, groups_after)
    _table("tombstone_keys", keys_before, keys_after)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    data_arguments(parser)
    parser.add_argument("--budget", type=int, default=4000, help="--pack: the context's tokens")
    parser.add_argument(
        "--conversations", type=int, default=None, help="LoCoMo: the first N conversations"
    )
    parser.add_argument("--limit", type=int, default=None, help="questions per tenant")
    parser.add_argument("--pack", action="store_true", help="the lossless-pack what-if")
    parser.add_argument(
        "--max-cluster-tokens", type=int, default=None, help="CompactionPolicy.max_cluster_tokens"
    )
    args = parser.parse_args(argv)
    for path in args.data:
        if not path.exists():
            parser.error(f"{path}: no such folder or file (a chatbench folder or LoCoMo JSON)")
        if path.is_dir():
            data = read_chatbench(path, args.keep_days, args.limit)
        else:
            data = read_locomo_cases(path, args.keep_sessions, args.conversations, args.limit)
        run(data, args.budget, args.pack, args.max_cluster_tokens)


if __name__ == "__main__":
    main()
