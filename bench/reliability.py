"""Crashes, concurrent writers and erasure, tried from outside: a table of what survived.

    python bench/reliability.py [--kills 200] [--processes 8] [--per-process 1000]
                                [--scenarios library,serve,compact,concurrency,erasure]
                                [--seed 20] [--folder DIR]

Scenarios (each against a fresh SQLite file in a temporary folder):

- ``library``: a writer process ingests batches of 1-20 records through :class:`Engine` and,
  after each ``ingest`` returns, appends the outcomes to an acknowledgement file (one
  ``write`` call, so a kill lands before or after it, never inside). It is killed with SIGKILL
  at a random moment (sometimes while it opens the file), ``--kills`` times, on the same
  database. After every kill the file is opened anew (WAL recovery, as after a restart).
- ``serve``: ``ctxwarden serve`` (the CLI command) under four client threads sending
  ``POST /v1/ingest`` of 1-5 records; a record is acknowledged when its request got 200. The
  server is killed with SIGKILL at a random moment, ``--kills`` times, and restarted on the
  same database. Every 5xx is counted, and the slowest answered request.
- ``compact``: ``ctxwarden compact --apply`` on a copy of a store full of old memories, beside
  a library writer (as above) ingesting new ones into the same file; the compaction is killed
  at a random moment spread over the duration of an uncut run, then the writer. Afterwards
  no cluster may be half-applied (every summary has a tombstone per source, every tombstone
  its summary, no original both alive and tombstoned), and a second compaction finishes.
- ``contention``: ``ctxwarden serve`` under HTTP ingest and assemble (half each) while two
  library writers in other processes ingest into the same file back to back, for
  ``--contention-seconds``: the slowest request, every 5xx, and every record acknowledged by
  either afterwards. (No kills: this measures how long the server waits on the file's lock.)
- ``concurrency``: ``--processes`` processes each ingest ``--per-process`` records one per
  call into one file, a quarter of them the same text in every process (one must be stored,
  the rest fold into it). Errors (``database is locked`` among them) and the slowest single
  ingest are counted.
- ``erasure``: a canary (one random word) is planted in a memory, an alias of it (a verbatim
  repeat), a summary built from it and a summary of that summary, with vectors on; then each
  kind of erasure the library has is run and the database, its ``-wal`` and ``-shm`` and the
  vector index files are searched for the canary's bytes (and for the bytes of its vector).
  The ``archived ...`` kinds compact with ``keep_originals="archive"`` first: the archived
  record is compressed, so the files are searched for that record's bytes as well.
  Whatever is found is reported, not hidden.

After every kill: ``PRAGMA integrity_check`` and FTS5's ``integrity-check`` (against the
content table) must pass, and every acknowledged record must be there (``lost`` otherwise)
with the content, session, author and time it was sent with (``wrong`` otherwise). A record
folded into an aggregate (a duplicate) must resolve by its id to the aggregate of its text.

Children are forked from this process (imports already paid, so a kill costs milliseconds,
not the ~2 s an interpreter start costs here); ``serve`` and ``compact --apply`` run the CLI's
own commands (``ctxwarden.cli.app``) in the child, the same code ``ctxwarden serve`` runs.
tests/test_reliability.py runs every scenario at a small size and asserts the table's zeros.
"""

from __future__ import annotations

import argparse
import contextlib
import queue
import random
import secrets
import shutil
import sqlite3
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from ctxwarden import Engine
from ctxwarden.compact import CompactionPolicy
from ctxwarden.config import SERVER_STORE_TIMEOUT
from ctxwarden.engine import EngineConfig
from ctxwarden.errors import CtxwardenError, NotFound

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/crashkit.py
from crashkit import (
    FORK,
    Load,
    Row,
    check_store,
    expected_by_id,
    fork,
    half_applied_clusters,
    http_client,
    kill,
    library_writer,
    percentile,
    read_acks,
    run_cli,
    start_server,
    table,
    tally,
    verify,
    warm,
)

DAY = 86400.0
#: The compaction scenario's writer rests this long between batches: a busy agent, not a
#: loop that holds the write lock back to back (which starves the compaction's transactions).
WRITER_PAUSE = 0.01
SCENARIOS = ("library", "serve", "compact", "concurrency", "contention", "erasure")


# -- scenarios -------------------------------------------------------------------------------


def library_crash(folder: Path, kills: int, rng: random.Random, *, window: float = 0.6) -> Row:
    """SIGKILL a library writer ``kills`` times at random moments of its run (from its
    start, which includes opening the store, or, every other time, from its first commit)."""
    db = folder / "library.db"
    Engine.open(db).close()
    now = time.time()
    expected = expected_by_id(now)
    row = Row("kill -9: library ingest", kills=0, acknowledged=0, lost=0, wrong=0)
    row.integrity_failures = 0
    everything: dict[str, str] = {}
    for k in range(kills):
        acks = folder / f"library-{k}.acks"
        child = fork(library_writer, str(db), str(acks), f"L{k}", now, 20, rng.getrandbits(32))
        if k % 2:  # every other kill lands mid-ingest: after the first acknowledged commit
            deadline = time.monotonic() + 60
            while not (acks.exists() and acks.stat().st_size) and time.monotonic() < deadline:
                time.sleep(0.005)
        time.sleep(rng.uniform(0, window))
        kill(child)
        row.kills = k + 1
        acked = read_acks(acks)
        verdict = verify(db, acked, expected)
        tally(row, verdict, acked)
        everything.update(acked)
    if kills:  # every record acknowledged in any round, once more at the end
        final = verify(db, everything, expected)
        row.lost = max(row.lost or 0, final.lost)
        row.wrong = max(row.wrong or 0, final.wrong)
        row.notes.extend(final.faults[:5])
    return row


def serve_crash(
    folder: Path, kills: int, rng: random.Random, *, clients: int = 4, window: float = 1.5
) -> Row:
    """SIGKILL ``ctxwarden serve`` ``kills`` times under HTTP ingest; restart it each time."""
    db = folder / "serve.db"
    Engine.open(db).close()
    now = time.time()
    expected = expected_by_id(now)
    row = Row("kill -9: ctxwarden serve, HTTP ingest", kills=0, acknowledged=0, lost=0, wrong=0)
    row.integrity_failures, row.server_errors, row.errors, row.slowest = 0, 0, 0, 0.0
    everything: dict[str, str] = {}
    took: dict[str, list[float]] = {}
    for k in range(kills):
        server, url = start_server(db)
        load, stop = Load(), threading.Event()
        threads = [
            threading.Thread(
                target=http_client, args=(url, f"H{k}c{c}", now, rng.getrandbits(32), stop, load)
            )
            for c in range(clients)
        ]
        for thread in threads:
            thread.start()
        # The kill lands under load: a random moment after the first acknowledged request.
        load.answered.wait(60)
        time.sleep(rng.uniform(0, window))
        kill(server)
        stop.set()
        for thread in threads:
            thread.join(150)
        row.kills = k + 1
        row.server_errors += load.server_errors
        row.errors += sum(load.other.values())
        if load.other:
            row.notes.append(f"other answers: {dict(load.other)}")
        if load.failed:
            row.notes.append(f"5xx answers: {dict(load.failed)}")
        row.slowest = max(row.slowest, load.slowest)
        for path, times in load.took.items():
            took.setdefault(path, []).extend(times)
        tally(row, verify(db, load.acked, expected), load.acked)
        everything.update(load.acked)
    if kills:
        final = verify(db, everything, expected)
        row.lost = max(row.lost or 0, final.lost)
        row.wrong = max(row.wrong or 0, final.wrong)
    row.p99 = percentile([t for times in took.values() for t in times], 99)
    return row


def contention(
    folder: Path, seconds: float, writers: int, rng: random.Random, *, clients: int = 4
) -> Row:
    """``ctxwarden serve`` under HTTP ingest and assemble while ``writers`` library writers in
    other processes ingest into the same file, for ``seconds``: the slowest request, 5xx and
    other failures, and every acknowledged record (HTTP 200 or a writer's commit) afterwards."""
    db = folder / "contention.db"
    Engine.open(db).close()
    now = time.time()
    expected = expected_by_id(now)
    row = Row(f"serve beside {writers} library writers, {seconds:g} s", acknowledged=0)
    row.lost, row.wrong, row.integrity_failures = 0, 0, 0
    server, url = start_server(db)
    children = [
        fork(
            library_writer, str(db), str(folder / f"contention-{w}.acks"), f"CW{w}", now, 20, w, 0.0
        )
        for w in range(writers)
    ]
    load, stop = Load(), threading.Event()
    threads = [
        threading.Thread(
            target=http_client, args=(url, f"CH{c}", now, rng.getrandbits(32), stop, load, 0.5)
        )
        for c in range(clients)
    ]
    for thread in threads:
        thread.start()
    load.answered.wait(60)  # the clients' first answer starts the clock
    time.sleep(seconds)
    stop.set()
    for thread in threads:
        thread.join(300)
    for child in children:
        kill(child)
    kill(server)
    acked = dict(load.acked)
    for w in range(writers):
        acked.update(read_acks(folder / f"contention-{w}.acks"))
    tally(row, verify(db, acked, expected), acked)
    row.server_errors = load.server_errors
    row.errors = sum(load.other.values())
    if load.other:
        row.notes.append(f"other answers: {dict(load.other)}")
    if load.failed:
        row.notes.append(f"5xx answers: {dict(load.failed)}")
    row.slowest, row.p99 = load.slowest, load.p99()
    row.notes.append(f"{len(load.acked):,} records acknowledged over HTTP, the rest by writers")
    row.notes.append(load.summary())
    over = sum(t > SERVER_STORE_TIMEOUT for times in load.took.values() for t in times)
    row.notes.append(
        f"{over} requests over the server's store wait limit ({SERVER_STORE_TIMEOUT:g} s)"
    )
    if load.gone:  # nobody killed this server: a client that lost it is a failure
        row.errors += 1
        row.notes.append(f"a client lost the server: {load.gone}")
    return row


def prepare_compaction(path: Path, now: float, days: int = 30, per_day: int = 12) -> int:
    """A store of ``days`` x ``per_day`` memories 30-60 days old (compaction candidates);
    returns how many clusters a compaction of it plans."""
    topics = "deploy release budget laptop standup kafka redis invoice roadmap review".split()
    records = []
    for d in range(days):
        for i in range(per_day):
            n = d * per_day + i
            records.append(
                {
                    "id": f"old{n}",
                    "session": "team",
                    "channel": ["dev", "ops"][i % 2],
                    "author": ["ana", "bo", "cy"][n % 3],
                    # one fact a day, the rest talk: compaction leaves alone a cluster whose
                    # summary could not keep every fact in its share
                    "content": (
                        f"we moved the {topics[n % 10]} to version {n} after the "
                        f"{topics[(n * 3) % 10]} review with Omar; ticket T-{n * 7}"
                        if n % per_day == 0
                        else f"ok, the {topics[n % 10]} and the {topics[(n * 3) % 10]} look "
                        f"fine to me, {['ana', 'bo', 'cy'][n % 3]} here, more on the "
                        f"{topics[(n * 7) % 10]} later"
                    ),
                    "created_at": now - 60 * DAY + d * DAY + i * 900,
                }
            )
    with Engine.open(path) as engine:
        engine.ingest(records)
        clusters = len(engine.compact_plan().clusters)
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    return clusters


def _summaries(path: Path) -> int:
    conn = sqlite3.connect(path, timeout=60)
    try:
        return int(
            conn.execute("SELECT count(*) FROM memories WHERE kind = 'summary'").fetchone()[0]
        )
    finally:
        conn.close()


def _compact_once(
    template: Path, path: Path, now: float, seed: int, target: int | None, extra: float
) -> tuple[float, float, dict[str, str]]:
    """Copy the template, start a writer and ``compact --apply`` beside it. With ``target``
    (a number of clusters), kill the compaction ``extra`` seconds after that many summaries
    are seen committed (``target`` 0: ``extra`` seconds after it starts), then the writer;
    with ``None`` let it finish. Returns when the first summary was seen, how long the
    compaction ran, and the writer's acknowledgements."""
    shutil.copy(template, path)
    acks = path.with_suffix(".acks")
    beside = fork(
        library_writer, str(path), str(acks), f"W{path.stem}", now, 10, seed, WRITER_PAUSE
    )
    began = time.perf_counter()
    compaction = fork(run_cli, ["--db", str(path), "compact", "--apply", "--older-than", "14d"])
    first = 0.0
    deadline = time.monotonic() + 600
    while compaction.exitcode is None:
        if time.monotonic() > deadline:
            kill(compaction)
            kill(beside)
            raise RuntimeError("compact --apply ran for 600 s: hung?")
        done = _summaries(path)
        if done and not first:
            first = time.perf_counter() - began
        if target is not None and done >= target:
            time.sleep(extra)
            kill(compaction)
            break
        time.sleep(0.01)
    took = time.perf_counter() - began
    kill(beside)
    if target is None and compaction.exitcode != 0:
        raise RuntimeError(f"compact --apply exited with {compaction.exitcode}")
    return first, took, read_acks(acks)


def _cleanup(path: Path) -> None:
    for name in (path.name, f"{path.name}-wal", f"{path.name}-shm", f"{path.stem}.acks"):
        (path.parent / name).unlink(missing_ok=True)
    shutil.rmtree(f"{path}.vectors", ignore_errors=True)


def compact_crash(folder: Path, kills: int, rng: random.Random, *, days: int = 30) -> Row:
    """SIGKILL ``ctxwarden compact --apply`` (beside a library writer) ``kills`` times, on a
    store of ``days`` days of old memories."""
    template = folder / "compact-template.db"
    now = time.time()
    clusters = prepare_compaction(template, now, days=days)
    expected = expected_by_id(now)
    row = Row("kill -9: compact --apply beside a writer", kills=0, acknowledged=0, lost=0)
    row.wrong, row.half_applied, row.integrity_failures = 0, 0, 0
    full = folder / "compact-full.db"
    first, duration, _ = _compact_once(template, full, now, rng.getrandbits(32), None, 0.0)
    _cleanup(full)
    per_cluster = max(duration - first, 0.01) / clusters
    partial = 0
    for k in range(kills):
        path = folder / f"compact-{k}.db"
        # Kill at a random point: during planning (target 0), or within the transaction
        # after the target-th cluster's (summaries are polled, so this does not hang on timing).
        # (Targets in the first half: the parent polls slower than a busy machine's child
        # commits clusters, so a late target often saw the compaction finish first.)
        target = rng.randint(0, clusters // 2)
        extra = rng.uniform(0, first) if target == 0 else rng.uniform(0, 2 * per_cluster)
        _, _, acked = _compact_once(template, path, now, rng.getrandbits(32), target, extra)
        row.kills = k + 1
        verdict = verify(path, acked, expected)
        halves = half_applied_clusters(path)
        verdict.half_applied = len(halves)
        verdict.faults.extend(halves)
        tally(row, verdict, acked)
        partial += 0 < _summaries(path) < clusters
        with Engine.open(path) as engine:  # a second compaction finishes what was cut
            result = engine.compact()
            # what it chose to leave alone (a summary would lose a fact) stays planned
            left = len(engine.compact_plan().clusters) - result.left_alone
        if left or half_applied_clusters(path) or check_store(path):
            row.integrity_failures = (row.integrity_failures or 0) + 1
            row.notes.append(f"run {k}: the second compaction left {left} clusters or a fault")
        _cleanup(path)
    row.notes.append(
        f"{clusters} clusters a run; {partial} of {kills} kills landed mid-way "
        f"(uncut run {duration:.2f} s, the first summary after {first:.2f} s)"
    )
    return row


def _concurrent_worker(db: str, p: int, per: int, now: float, barrier: Any, out: Any) -> None:
    engine = Engine.open(db)
    barrier.wait()
    acked: list[tuple[str, str]] = []
    errors: Counter[str] = Counter()
    times: list[float] = []
    for i in range(per):
        shared = i % 4 == 0  # the same text from every process: one stored, the rest fold
        item = {
            "id": f"P{p}-{i}",
            "session": "shared" if shared else f"own{p}",
            "channel": "general",
            "author": "ana",
            "content": f"broadcast {i} to everyone" if shared else f"process {p} says {i}",
            "created_at": now + i,
        }
        began = time.perf_counter()
        try:
            outcome = engine.ingest([item]).outcomes[0]
            acked.append((outcome.id, outcome.status))
        except (CtxwardenError, sqlite3.Error) as exc:
            errors["database is locked" if "locked" in str(exc) else type(exc).__name__] += 1
        times.append(time.perf_counter() - began)
    engine.close()
    out.put({"acked": acked, "errors": dict(errors), "times": times})


def concurrency(folder: Path, processes: int, per_process: int) -> Row:
    """``processes`` processes, ``per_process`` single ingests each, into one SQLite file."""
    db = folder / "concurrent.db"
    Engine.open(db).close()
    now = time.time()
    barrier, results = FORK.Barrier(processes), FORK.Queue()
    workers = [
        fork(_concurrent_worker, str(db), p, per_process, now, barrier, results)
        for p in range(processes)
    ]
    reports = []
    while len(reports) < processes:
        try:
            reports.append(results.get(timeout=5))
        except queue.Empty:
            if all(w.exitcode is not None for w in workers) and results.empty():
                codes = [w.exitcode for w in workers]
                raise RuntimeError(f"a writer process died without a report: {codes}") from None
    for worker in workers:
        worker.join(60)
    errors: Counter[str] = Counter()
    acked: dict[str, str] = {}
    for report in reports:
        errors.update(report["errors"])
        acked.update(dict(report["acked"]))
    row = Row(f"{processes} processes x {per_process:,} single ingests, one file", kills=None)
    row.acknowledged, row.lost, row.wrong, row.integrity_failures = len(acked), 0, 0, 0
    row.errors = sum(errors.values())
    times = [t for r in reports for t in r["times"]]
    row.slowest, row.p99 = max(times, default=0.0), percentile(times, 99)
    if errors:
        row.notes.append(f"errors: {dict(errors)}")
    faults = check_store(db)
    row.integrity_failures = len(faults)
    with Engine.open(db) as engine:
        for rid in acked:
            try:
                engine.get(rid)
            except NotFound:
                row.lost += 1
    conn = sqlite3.connect(db)
    stored = conn.execute(
        "SELECT count(*), count(DISTINCT content) FROM memories WHERE content LIKE 'broadcast %'"
    ).fetchone()
    conn.close()
    row.wrong = stored[0] - stored[1]  # a shared text stored twice: a de-dup race
    if row.wrong:
        row.notes.append(f"{row.wrong} shared texts stored more than once")
    return row


# -- erasure ---------------------------------------------------------------------------------


def canary() -> str:
    """A random word the FTS index keeps as one term (``zzq`` + 24 letters; no digit, so the
    line holding it states no fact and a summary may drop it)."""
    return "zzq" + "".join(secrets.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(24))


def needle(word: str) -> bytes:
    """The part of a canary searched for: FTS5 stores terms prefix-compressed, so the files
    are searched for its random middle, which no neighbouring term can share."""
    return word[4:-2].encode()


def store_files(db: Path) -> Iterator[Path]:
    """The database, its ``-wal`` and ``-shm``, and the vector index files."""
    for suffix in ("", "-wal", "-shm"):
        path = Path(f"{db}{suffix}")
        if path.is_file():
            yield path
    vectors = Path(f"{db}.vectors")
    if vectors.is_dir():
        yield from sorted(p for p in vectors.rglob("*") if p.is_file())


def found_bytes(db: Path, patterns: list[bytes]) -> dict[str, int]:
    """File name -> bytes of ``patterns`` found in it (occurrences x length), non-zero only."""
    found: dict[str, int] = {}
    for path in store_files(db):
        data = path.read_bytes()
        hits = sum(data.count(p) * len(p) for p in patterns if p)
        if hits:
            found[path.name] = hits
    return found


def _vector_patterns(db: Path, rowid: int) -> list[bytes]:
    """The bytes a memory's vector is kept as: the table's float16 blob, and the normalised
    float16 row the index files hold."""
    conn = sqlite3.connect(db)
    try:
        rows = conn.execute(
            "SELECT dim, embedding FROM memory_vectors WHERE memory_rowid = ?", (rowid,)
        ).fetchall()
    finally:
        conn.close()
    patterns = []
    for dim, blob in rows:
        vector = np.frombuffer(blob, dtype="<f2", count=dim).astype(np.float32)
        normalised = vector / np.linalg.norm(vector)
        patterns += [bytes(blob), normalised.astype("<f2").tobytes()]
    return list(dict.fromkeys(patterns))  # one pattern when the blob is normalised already


#: The kinds of erasure: ``delete`` by id and by an alias's id, ``delete_session``,
#: ``delete_tenant``, ``delete`` of a memory compacted into a summary, and compaction itself
#: (its originals leave the store: their text should leave the files with them).
#: The ``archived ...`` kinds compact with ``keep_originals="archive"`` first and erase the
#: compacted id, its session or its tenant: the archived record (compressed, so the canary's
#: bytes are not in it as such) is searched for as a whole.
ERASURES = (
    "memory", "alias", "session", "tenant", "compacted memory", "compaction",
    "archived memory", "archived session", "archived tenant",
)  # fmt: skip


def _archived_records(db: Path, ids: tuple[str, ...]) -> list[bytes]:
    """The archive's compressed records that hold any of ``ids`` (one per summary; read with
    a connection of our own)."""
    from ctxwarden.store.archive import decode_rows

    with contextlib.closing(sqlite3.connect(db)) as conn:
        return [
            bytes(record)
            for codec, record in conn.execute("SELECT codec, record FROM archived_memories")
            if any(row[1] in ids for row in decode_rows(record, codec))
        ]


class TerseSummarizer:
    """A summariser (the :class:`~ctxwarden.summarize.Summarizer` seam) that keeps no text of
    its items, so whatever of a compacted original is found in the files afterwards was left
    by the compaction, not written into the summary."""

    def summarize(self, items: Any, *, max_tokens: int, tokenizer: Any) -> Any:
        from ctxwarden.summarize import Summary

        events = (f"{len(items)} messages about the deploy window",)
        return Summary(main_events=events, source_ids=tuple(item.id for item in items))


def erasure(folder: Path, kind: str) -> Row:
    """Plant a canary, erase it the ``kind`` way, then search the files for its bytes."""
    from ctxwarden.store.base import NewMemory

    db = folder / f"erase-{kind.replace(' ', '-')}.db"
    word = canary()
    base = 1_700_000_000.0
    config = EngineConfig(embed="sync", embedder="minilm-static")
    clock_now = [base + 90 * DAY]
    row = Row(f"erase: {kind}", canary_bytes=0)

    def filler(tenant: str, session: str, n: int = 40) -> list[dict[str, Any]]:
        return [
            {"id": f"{tenant}-{session}-f{i}", "session": session, "author": "ana",
             "content": f"note {i} of {session} about the deploy window and release {i * 7}",
             "created_at": base + i}
            for i in range(n)
        ]  # fmt: skip

    secret = {"session": "s1", "author": "ana", "content": f"my door code is {word} remember it"}
    with Engine.open(db, config=config, clock=lambda: clock_now[0]) as engine:
        engine.ingest(filler("acme", "s1") + filler("acme", "s2"), tenant="acme")
        engine.ingest(filler("other", "s1"), tenant="other")
        engine.ingest(
            [{**secret, "id": "secret", "created_at": base + 100},
             {**secret, "id": "secret-again", "created_at": base + 101}],
            tenant="acme",
        )  # fmt: skip
        vector = _vector_patterns(db, engine.get("secret", tenant="acme").rowid)
        archived: list[bytes] = []
        if kind == "compacted memory":
            engine.compact(tenant="acme")
        elif kind.startswith("archived"):
            engine.compact(tenant="acme", policy=CompactionPolicy(keep_originals="archive"))
            archived = _archived_records(db, ("secret", "secret-again"))
            if not archived:
                row.notes.append("the canary's memory was not archived: the run means nothing")
        elif kind == "compaction":
            engine.compact(tenant="acme", summarizer=TerseSummarizer())
            with contextlib.suppress(NotFound):
                if engine.get("secret", tenant="acme").id == "secret":
                    row.notes.append("the canary's memory was not compacted: the run means nothing")
        else:  # summaries built from it, and a summary of that summary, as a compaction writes
            with engine.store.write() as writer:
                for sid, sources, text in (
                    ("sum1", ["acme-s1-f1", "secret-again"], f"ana's code: {word}"),
                    ("sum2", ["sum1"], f"summary of summaries mentions {word}"),
                ):
                    writer.insert(
                        NewMemory(
                            id=sid, tenant="acme", session="s1", channel=None, author=None,
                            author_kind="agent", role="assistant", content=text,
                            created_at=base + 500, thread_id=None, reply_to=None,
                            kind="summary", pinned=False, name=None, tool_calls=(),
                            tool_call_id=None, attachments=(), metadata={},
                            content_hash=f"summary-{sid}", source_ids=sources,
                            time_range=(base, base + 100),
                        )
                    )  # fmt: skip
        engine.assemble(session="s1", query=f"door code {word}", tenant="acme")
        if not vector:
            row.notes.append("no vector was stored for the canary (vectors not checked)")
        try:
            if kind in ("memory", "compacted memory", "archived memory"):
                engine.delete("secret", tenant="acme")
            elif kind == "archived session":
                engine.delete_session("s1", tenant="acme")
            elif kind == "archived tenant":
                engine.delete_tenant(tenant="acme")
            elif kind == "alias":
                engine.delete("secret-again", tenant="acme")
            elif kind == "session":
                engine.delete_session("s1", tenant="acme")
            elif kind == "tenant":
                engine.delete_tenant(tenant="acme")
        except NotFound as exc:
            row.notes.append(f"the erasure answered NotFound: {exc}")
        try:
            hits = engine.search(word, tenant="acme")
        except CtxwardenError:
            hits = []
        if hits:
            row.notes.append(f"search still finds it: {[m.id for m, _ in hits]}")
    text = found_bytes(db, [needle(word)])
    vectors = found_bytes(db, vector)
    records = found_bytes(db, archived) if archived else {}
    row.canary_bytes = sum(text.values()) + sum(vectors.values()) + sum(records.values())
    if records:
        row.notes.append(f"archived canary records left: {records}")
    if text:
        row.notes.append(f"canary text bytes left: {text}")
    if vectors:
        row.notes.append(f"canary vector bytes left: {vectors}")
    return row


# -- main ------------------------------------------------------------------------------------


def run(
    folder: Path,
    *,
    scenarios: tuple[str, ...],
    kills: int,
    processes: int,
    per_process: int,
    seed: int,
    compact_days: int = 30,
    contention_seconds: float = 60.0,
    progress: Callable[[Row], None] | None = None,
) -> list[Row]:
    """Run ``scenarios`` in ``folder``; the table's rows."""
    rng = random.Random(seed)
    rows: list[Row] = []
    warm()

    def done(row: Row) -> None:
        rows.append(row)
        if progress is not None:
            progress(row)

    if "library" in scenarios:
        done(library_crash(folder, kills, rng))
    if "serve" in scenarios:
        done(serve_crash(folder, kills, rng))
    if "compact" in scenarios:
        done(compact_crash(folder, kills, rng, days=compact_days))
    if "concurrency" in scenarios:
        done(concurrency(folder, processes, per_process))
    if "contention" in scenarios:
        done(contention(folder, contention_seconds, 2, rng))
    if "erasure" in scenarios:
        for kind in ERASURES:
            done(erasure(folder, kind))
    return rows


def main(argv: list[str] | None = None) -> list[Row]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kills", type=int, default=200, help="kills per crash scenario")
    parser.add_argument("--processes", type=int, default=8, help="concurrent writer processes")
    parser.add_argument(
        "--per-process", type=int, default=1000, help="single ingests per concurrent process"
    )
    parser.add_argument(
        "--scenarios",
        default=",".join(SCENARIOS),
        help=f"comma-separated subset of {', '.join(SCENARIOS)}",
    )
    parser.add_argument(
        "--compact-days", type=int, default=30, help="days of old memories to compact (12 a day)"
    )
    parser.add_argument(
        "--contention-seconds",
        type=float,
        default=60.0,
        help="how long serve runs beside two library writers (contention)",
    )
    parser.add_argument("--seed", type=int, default=20)
    parser.add_argument("--folder", type=Path, help="work here (kept) instead of a temp folder")
    args = parser.parse_args(argv)
    chosen = tuple(s.strip() for s in args.scenarios.split(",") if s.strip())
    unknown = sorted(set(chosen) - set(SCENARIOS))
    if unknown:
        parser.error(f"--scenarios: unknown {', '.join(unknown)}; choose from {SCENARIOS}")
    if args.kills < 0 or min(args.processes, args.per_process, args.compact_days) < 1:
        parser.error("--kills must be >= 0; --processes, --per-process, --compact-days >= 1")
    began = time.perf_counter()
    with contextlib.ExitStack() as stack:
        if args.folder is None:
            folder = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="reliab-")))
        else:
            folder = args.folder
            folder.mkdir(parents=True, exist_ok=True)
        rows = run(
            folder,
            scenarios=chosen,
            kills=args.kills,
            processes=args.processes,
            per_process=args.per_process,
            seed=args.seed,
            compact_days=args.compact_days,
            contention_seconds=args.contention_seconds,
            progress=lambda row: print(f"done: {row.scenario}", flush=True),
        )
    print()
    print(table(rows))
    print(f"\n{time.perf_counter() - began:.0f} s in all")
    return rows


if __name__ == "__main__":
    main()
