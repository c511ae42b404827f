"""The harness of bench/reliability.py: records a writer acknowledges, the checks run on a
reopened store after a kill, forked children (a library writer, a ``ctxwarden`` command, HTTP
clients) and the table of results."""

from __future__ import annotations

import contextlib
import json
import math
import multiprocessing
import os
import random
import signal
import socket
import sqlite3
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from ctxwarden import Engine
from ctxwarden.errors import NotFound
from ctxwarden.store.tombstones import GROUP_COLUMNS, id_key, tombstones_of

FORK = multiprocessing.get_context("fork")
WORDS = (
    "apple river stone paper window garden orange silver market doctor winter basket candle "
    "forest ladder pocket rocket saddle tunnel violin wallet yellow anchor bridge castle "
    "dragon engine falcon glacier harbor island jungle kettle lantern meadow needle oyster "
    "pepper quartz rabbit sunset tiger umbrella valley walnut zebra blanket cactus dolphin "
    "feather guitar hammer igloo jacket koala lemon mirror noodle orchid pillow quiver"
).split()


# -- the table -----------------------------------------------------------------------------


@dataclass
class Row:
    """One scenario's line of the table. ``None`` prints as ``-`` (not measured there)."""

    scenario: str
    kills: int | None = None
    acknowledged: int | None = None
    lost: int | None = None
    wrong: int | None = None
    half_applied: int | None = None
    integrity_failures: int | None = None
    errors: int | None = None
    server_errors: int | None = None
    canary_bytes: int | None = None
    slowest: float | None = None
    p99: float | None = None
    notes: list[str] = field(default_factory=list)

    def clean(self) -> bool:
        """Nothing lost, wrong, half-applied, corrupt, failed or left behind."""
        counts = (
            self.lost,
            self.wrong,
            self.half_applied,
            self.integrity_failures,
            self.errors,
            self.server_errors,
            self.canary_bytes,
        )
        return all(not c for c in counts)


COLUMNS = (
    ("scenario", "scenario"),
    ("kills", "kills"),
    ("acknowledged", "acknowledged"),
    ("lost", "lost"),
    ("wrong", "wrong"),
    ("half-applied clusters", "half_applied"),
    ("integrity failures", "integrity_failures"),
    ("errors", "errors"),
    ("5xx", "server_errors"),
    ("canary bytes", "canary_bytes"),
    ("p99 (s)", "p99"),
    ("slowest (s)", "slowest"),
)


def table(rows: list[Row]) -> str:
    """The rows as a Markdown table, then one line per note."""

    def cell(value: Any) -> str:
        if value is None:
            return "-"
        if isinstance(value, float):
            return f"{value:.3f}"
        if isinstance(value, int):
            return f"{value:,}"
        return str(value)

    lines = [
        "| " + " | ".join(title for title, _ in COLUMNS) + " |",
        "|" + "|".join("---" for _ in COLUMNS) + "|",
    ]
    for row in rows:
        lines.append("| " + " | ".join(cell(getattr(row, name)) for _, name in COLUMNS) + " |")
    for row in rows:
        lines.extend(f"- {row.scenario}: {note}" for note in row.notes)
    return "\n".join(lines)


# -- records and acknowledgements ------------------------------------------------------------


def record(prefix: str, n: int, now: float) -> dict[str, Any]:
    """The ``n``-th record of a writer, the same in every process (seeded by its id). Every
    tenth repeats the text of the one before it (same session and channel): a duplicate."""
    base = n - 1 if n % 10 == 9 else n
    rng = random.Random(f"{prefix}-{base}")
    words = " ".join(rng.choice(WORDS) for _ in range(12))
    return {
        "id": f"{prefix}-{n}",
        "session": f"{prefix}-s{base % 5}",
        "channel": ["dev", "ops"][base % 2],
        "author": ["ana", "bo", "cy"][base % 3],
        "content": f"{prefix} note {base}: {words}",
        "created_at": round(now + n, 3),
    }


def _acknowledge(fd: int, outcomes: list[tuple[str, str]]) -> None:
    # One write(2): a SIGKILL lands before or after it, so a line is whole or absent.
    os.write(fd, (json.dumps(outcomes) + "\n").encode())


def read_acks(path: Path) -> dict[str, str]:
    """Acknowledged id -> ingest status, from the whole lines of an acknowledgement file."""
    acked: dict[str, str] = {}
    if not path.exists():
        return acked
    for line in path.read_text().splitlines():
        with contextlib.suppress(json.JSONDecodeError):
            acked.update(dict(json.loads(line)))
    return acked


@dataclass
class Verdict:
    """What a check of a reopened store found."""

    lost: int = 0
    wrong: int = 0
    half_applied: int = 0
    integrity_failures: int = 0
    faults: list[str] = field(default_factory=list)


def check_store(path: Path) -> list[str]:
    """The store's own checks: ``PRAGMA integrity_check`` and FTS5's ``integrity-check``
    against the content table. Empty when sound."""
    faults: list[str] = []
    conn = sqlite3.connect(path, timeout=60)
    try:
        answer = conn.execute("PRAGMA integrity_check").fetchone()[0]
        if answer != "ok":
            faults.append(f"integrity_check: {answer}")
        try:
            conn.execute(
                "INSERT INTO memories_fts (memories_fts, rank) VALUES ('integrity-check', 1)"
            )
        except sqlite3.DatabaseError as exc:
            faults.append(f"fts integrity-check: {exc}")
    finally:
        conn.close()
    return faults


def half_applied_clusters(path: Path) -> list[str]:
    """Compactions left half-done: a summary without a tombstone for each of its sources, a
    tombstone whose summary is missing, or an original both alive and tombstoned."""
    conn = sqlite3.connect(path, timeout=60)
    try:
        faults = []
        stones = tombstones_of(conn.execute(f"SELECT {GROUP_COLUMNS} FROM tombstone_groups"))
        named: dict[str, set[str]] = {}
        for f in stones:
            if f.summary_id is not None:
                named.setdefault(f.summary_id, set()).add(f.member.id)
        summaries = dict(
            conn.execute("SELECT id, source_ids FROM memories WHERE kind = 'summary'").fetchall()
        )
        for sid, sources in summaries.items():
            if named.get(sid, set()) != set(json.loads(sources)):
                faults.append(f"summary {sid}: tombstones differ from its sources")
        faults.extend(
            f"tombstone {f.member.id}: its summary is missing"
            for f in stones
            if f.summary_id is not None and f.summary_id not in summaries
        )
        alive = {str(r[0]) for r in conn.execute("SELECT id FROM memories")}
        faults.extend(
            f"{f.member.id}: alive and tombstoned" for f in stones if f.member.id in alive
        )
        # every tombstone is found by its key
        keys = set(conn.execute("SELECT key, grp FROM tombstone_keys").fetchall())
        faults.extend(
            f"tombstone {f.member.id}: no key"
            for f in stones
            if (id_key(f.tenant, f.member.id), f.grp) not in keys
        )
        return faults
    finally:
        conn.close()


def verify(path: Path, acked: dict[str, str], expected: Callable[[str], dict[str, Any]]) -> Verdict:
    """Reopen the store and check it and every acknowledged record (``expected`` rebuilds the
    record sent under an id)."""
    verdict = Verdict()
    faults = check_store(path)
    verdict.integrity_failures += bool(faults)
    verdict.faults.extend(faults)
    with Engine.open(path) as engine:
        for rid, status in acked.items():
            sent = expected(rid)
            try:
                kept = engine.get(rid, tenant=sent.get("tenant"))
            except NotFound:
                verdict.lost += 1
                verdict.faults.append(f"lost {rid} ({status})")
                continue
            if status == "stored":
                got = (kept.id, kept.content, kept.session, kept.author, kept.created_at)
                want = (rid, sent["content"], sent["session"], sent["author"], sent["created_at"])
                if got != want:
                    verdict.wrong += 1
                    verdict.faults.append(f"wrong {rid}: {got} != {want}")
            elif status == "duplicate" and (kept.content, kept.session) != (
                sent["content"],
                sent["session"],
            ):  # a verbatim repeat resolves to the aggregate of the same text and session
                verdict.wrong += 1
                verdict.faults.append(f"wrong {rid}: folded into {kept.id} of other text")
    return verdict


def expected_by_id(now: float) -> Callable[[str], dict[str, Any]]:
    def expected(rid: str) -> dict[str, Any]:
        prefix, _, n = rid.rpartition("-")
        return record(prefix, int(n), now)

    return expected


# -- children --------------------------------------------------------------------------------


def _quiet() -> None:
    """Send a child's stdout and stderr to /dev/null (the parent's may be a test's capture)."""
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1)
    os.dup2(null, 2)
    # and Python's own streams, which a test's capture may have pointed elsewhere
    sys.stdout = sys.stderr = open(os.devnull, "w")  # noqa: SIM115 (the child's whole life)


def library_writer(
    db: str, acks: str, prefix: str, now: float, batch: int, seed: int, pause: float = 0.0
) -> None:
    """A library writer: ingest batches until killed, acknowledging each committed batch,
    ``pause`` seconds between batches."""
    _quiet()
    fd = os.open(acks, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    rng = random.Random(seed)
    engine = Engine.open(db)
    n = 0
    while True:
        size = rng.randint(1, batch)
        records = [record(prefix, n + i, now) for i in range(size)]
        result = engine.ingest(records)
        _acknowledge(fd, [(o.id, o.status) for o in result.outcomes])
        n += size
        if pause:
            time.sleep(pause)


def run_cli(args: list[str]) -> None:
    """Run a ``ctxwarden`` command (the CLI's own typer app) in this child, then exit."""
    _quiet()
    from ctxwarden.cli import app

    code = 0
    try:
        app(args, prog_name="ctxwarden", standalone_mode=False)
    except BaseException:
        code = 1
    os._exit(code)


def fork(target: Callable[..., Any], *args: Any) -> Any:
    """Start ``target(*args)`` in a forked child."""
    child = FORK.Process(target=target, args=args, daemon=True)
    child.start()
    return child


def kill(child: Any) -> None:
    """SIGKILL ``child`` (if it still runs) and reap it."""
    if child.pid is not None and child.exitcode is None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(child.pid, signal.SIGKILL)
    child.join(60)


def warm() -> None:
    """Import the CLI and the server and load the default tokenizer and retrieval's modules
    here, once, so forked children inherit them and start in milliseconds."""
    import uvicorn  # noqa: F401

    import ctxwarden.cli
    import ctxwarden.server.http  # noqa: F401
    from ctxwarden.server.runtime import warm_up

    with Engine.open(":memory:") as engine:
        warm_up(engine)


def tally(row: Row, verdict: Verdict, acked: dict[str, str]) -> None:
    row.acknowledged = (row.acknowledged or 0) + len(acked)
    row.lost = (row.lost or 0) + verdict.lost
    row.wrong = (row.wrong or 0) + verdict.wrong
    row.integrity_failures = (row.integrity_failures or 0) + verdict.integrity_failures
    if verdict.half_applied:
        row.half_applied = (row.half_applied or 0) + verdict.half_applied
    row.notes.extend(verdict.faults[: max(0, 5 - len(row.notes))])


def free_port() -> int:
    """A free TCP port on loopback."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_server(db: Path, ready_within: float = 120.0) -> tuple[Any, str]:
    """Fork ``ctxwarden --db DB serve --no-auth`` on a free loopback port; wait for
    ``/health``. Returns the child and its base URL."""
    port = free_port()
    args = ["--db", str(db), "serve", "--no-auth", "--host", "127.0.0.1", "--port", str(port)]
    child = fork(run_cli, args)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + ready_within
    while time.monotonic() < deadline:
        if child.exitcode is not None:
            raise RuntimeError(f"ctxwarden serve exited with {child.exitcode}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return child, url
        time.sleep(0.05)
    kill(child)
    raise RuntimeError(f"ctxwarden serve did not answer within {ready_within:.0f} s")


@dataclass
class Load:
    """What the HTTP clients of one server run saw."""

    acked: dict[str, str] = field(default_factory=dict)
    server_errors: int = 0
    other: Counter[str] = field(default_factory=Counter)  # 4xx by status
    failed: Counter[str] = field(default_factory=Counter)  # 5xx by status
    gone: str | None = None  # why a client stopped before it was told to
    slowest: float = 0.0
    #: Every answered request's time by path (``/v1/ingest``, ``/v1/assemble``), in seconds.
    took: dict[str, list[float]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    answered: threading.Event = field(default_factory=threading.Event)  # a first 200 came

    def p99(self) -> float | None:
        """The 99th percentile of every answered request's time (None: none answered)."""
        return percentile([t for times in self.took.values() for t in times], 99)

    def summary(self) -> str:
        """Per path: requests, p50, p99 and the slowest, for a row's notes."""
        parts = []
        for path, times in sorted(self.took.items()):
            p50, p99 = percentile(times, 50), percentile(times, 99)
            parts.append(
                f"{path}: {len(times):,} requests, p50 {p50:.3f} s, p99 {p99:.3f} s, "
                f"slowest {max(times):.3f} s"
            )
        return "; ".join(parts)


def percentile(values: list[float], q: float) -> float | None:
    """The ``q``-th percentile of ``values`` (nearest rank), None when empty."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def http_client(
    url: str,
    prefix: str,
    now: float,
    seed: int,
    stop: threading.Event,
    load: Load,
    assemble_share: float = 0.0,
) -> None:
    """Send ``POST /v1/ingest`` of 1-5 records (and, ``assemble_share`` of the time, an
    assemble of one of its sessions) until ``stop`` or the server is gone."""
    rng = random.Random(seed)
    n = 0
    with httpx.Client(base_url=url, timeout=120) as client:
        while not stop.is_set():
            assemble = n > 0 and rng.random() < assemble_share
            if assemble:
                query = " ".join(rng.choice(WORDS) for _ in range(6))
                path = "/v1/assemble"
                body: dict[str, Any] = {"session": f"{prefix}-s{rng.randrange(5)}"}
                body.update(query=query, budget=2000)
            else:
                size = rng.randint(1, 5)
                path = "/v1/ingest"
                body = {"records": [record(prefix, n + i, now) for i in range(size)]}
                n += size
            began = time.perf_counter()
            try:
                response = client.post(path, json=body)
            except httpx.HTTPError as exc:
                # the server is gone: what it answered before counts, nothing after
                load.gone = f"{type(exc).__name__}: {exc}"
                return
            took = time.perf_counter() - began
            with load.lock:
                load.slowest = max(load.slowest, took)
                load.took.setdefault(path, []).append(took)
                if response.status_code >= 500:
                    load.server_errors += 1
                    load.failed[str(response.status_code)] += 1
                elif response.status_code != 200:
                    load.other[str(response.status_code)] += 1
                elif not assemble:
                    outcomes = response.json()["outcomes"]
                    load.acked.update((o["id"], o["status"]) for o in outcomes)
                    load.answered.set()
