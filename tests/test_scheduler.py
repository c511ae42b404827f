"""Compaction off the request path (issue 19 item 6): scheduled runs, one compactor at a time
across processes (SQLite lease, PostgreSQL advisory lock), background window summaries that no
request waits on, metrics and a clean stop."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest

from conftest import Clock, morning
from ctxwarden import ConfigError, Engine
from ctxwarden.config import load_settings
from ctxwarden.engine import EngineConfig
from ctxwarden.scheduler import LEASE, CompactorStats
from ctxwarden.server.http import create_app
from ctxwarden.store.base import Maintenance, Store
from ctxwarden.store.sqlite import SQLiteStore
from ctxwarden.summarize import ExtractiveSummarizer
from ctxwarden.summary import Summary, SummaryItem, TokenCounter
from serving import serve
from test_compact import DAY, _messages

WAIT = 60.0  # an upper bound on waiting for a thread, never a measured duration


class Gate:
    """A summariser that blocks on an event until the test opens it, then summarises
    extractively; ``entered`` is set when a call is waiting."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.opened = threading.Event()
        self.calls = 0
        self._inner = ExtractiveSummarizer()

    def summarize(
        self, items: Sequence[SummaryItem], *, max_tokens: int, tokenizer: TokenCounter
    ) -> Summary:
        self.calls += 1
        self.entered.set()
        assert self.opened.wait(WAIT), "the test never opened the gate"
        return self._inner.summarize(items, max_tokens=max_tokens, tokenizer=tokenizer)


def _until(engine: Engine, condition: Any) -> CompactorStats:
    assert engine.compactor.wait(condition, WAIT)
    return engine.compactor.stats()


# -- background window summaries ------------------------------------------------------------


def test_assembly_never_waits_on_a_window_summariser(clock: Clock) -> None:
    gate = Gate()
    config = EngineConfig(
        auto_summarize=True,
        window_summaries="background",
        summarizer=gate,
        default_model="gpt-4",  # 8k window: 140 messages pass 90 % of the recent block
    )
    with Engine.open(":memory:", clock=clock, config=config) as engine:
        engine.ingest(_messages(clock.now - DAY, days=1, per_day=140))  # returns: queued
        assert gate.entered.wait(WAIT)  # the window thread is inside the summariser, blocked
        context = engine.assemble(session="team", query="where did the deploy go?")
        assert context.included  # assembled while the summariser is still blocked
        assert not gate.opened.is_set()
        assert engine.compactor.stats().window_pending == 1
        assert not engine.store.summaries("default", session="team")
        gate.opened.set()
        stats = _until(engine, lambda s: s.window_pending == 0)
        assert stats.window_summaries >= 1
        assert stats.window_failures == 0
        windows = engine.store.summaries("default", session="team")
        assert windows
        assert all(s.metadata.get("reason") == "window" for s in windows)
        after = engine.assemble(session="team", query="where did the deploy go?")
        assert windows[0].id in after.included


def test_sync_window_summaries_use_the_configured_summariser(clock: Clock) -> None:
    gate = Gate()
    gate.opened.set()
    config = EngineConfig(auto_summarize=True, summarizer=gate, default_model="gpt-4")
    with Engine.open(":memory:", clock=clock, config=config) as engine:
        engine.ingest(_messages(clock.now - DAY, days=1, per_day=140))
        assert gate.calls >= 1  # before ingest returned
        assert engine.store.summaries("default", session="team")
        assert engine.compactor.stats().window_summaries == 0  # nothing went to the thread


def test_a_failing_window_summary_is_counted_and_logged(clock: Clock) -> None:
    class Broken:
        def summarize(self, items: Any, *, max_tokens: int, tokenizer: Any) -> Summary:
            raise RuntimeError("model server down")

    config = EngineConfig(
        auto_summarize=True,
        window_summaries="background",
        summarizer=Broken(),
        default_model="gpt-4",
    )
    with Engine.open(":memory:", clock=clock, config=config) as engine:
        engine.ingest(_messages(clock.now - DAY, days=1, per_day=140))
        stats = _until(engine, lambda s: s.window_pending == 0 and s.window_failures)
        assert stats.window_failures == 1
        assert not engine.store.summaries("default", session="team")


# -- scheduled compaction -------------------------------------------------------------------


def test_a_scheduled_run_compacts_every_tenant(tmp_path: Path, clock: Clock) -> None:
    config = EngineConfig(compact_every=6 * 3600)
    with Engine.open(tmp_path / "s.db", clock=clock, config=config) as engine:
        engine.ingest(_messages(clock.now - 20 * DAY, days=2, per_day=6))
        engine.ingest(_messages(clock.now - 20 * DAY, days=2, per_day=6), tenant="acme")
        assert engine.compactor.stats() == CompactorStats()  # the first run is an interval away
        engine.compactor.trigger()
        stats = _until(engine, lambda s: s.runs >= 1)
        assert stats.failures == 0
        assert stats.skipped == 0
        assert stats.clusters >= 2
        assert stats.compacted >= 2 * stats.clusters
        assert stats.tokens_saved > 0
        assert stats.last_run_at == clock.now
        for tenant in ("default", "acme"):
            assert engine.store.tombstones(tenant)
        # A second run finds nothing more to do.
        run = engine.compactor.run_once()
        assert (run.outcome, run.clusters, run.tenants) == ("ran", 0, ("acme", "default"))


def test_a_second_compactor_skips_and_says_who_holds_the_lease(
    tmp_path: Path, clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "s.db"
    with Engine.open(path, clock=clock) as first, Engine.open(path, clock=clock) as second:
        first.ingest(_messages(clock.now - 20 * DAY, days=1, per_day=6))
        store = first.store
        assert isinstance(store, Maintenance)
        assert store.acquire_lease(LEASE, first.compactor.owner, now=clock.now, ttl=60) is None
        with caplog.at_level("INFO", logger="ctxwarden.scheduler"):
            run = second.compactor.run_once()
        assert run.outcome == "skipped"
        assert run.holder == first.compactor.owner
        assert f"held by {first.compactor.owner}" in caplog.text
        assert second.compactor.stats().skipped == 1
        assert second.compactor.stats().runs == 0
        assert not second.store.tombstones("default")  # nothing was touched
        store.release_lease(LEASE, first.compactor.owner)
        assert second.compactor.run_once().outcome == "ran"
        assert second.store.tombstones("default")


_HOLDER = """
import sys, time
from ctxwarden.store.sqlite import SQLiteStore
store = SQLiteStore(sys.argv[1])
assert store.acquire_lease("compactor", "victim", now=float(sys.argv[2]), ttl=600.0) is None
print("held", flush=True)
time.sleep(600)
"""


def test_a_killed_holder_blocks_compaction_only_until_its_lease_expires(
    tmp_path: Path, clock: Clock
) -> None:
    path = tmp_path / "s.db"
    with Engine.open(path, clock=clock) as engine:
        engine.ingest(_messages(clock.now - 20 * DAY, days=1, per_day=6))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    with subprocess.Popen(
        [sys.executable, "-c", _HOLDER, str(path), str(clock.now)],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    ) as holder:
        try:
            assert holder.stdout is not None
            assert holder.stdout.readline().strip() == "held"
        finally:
            holder.send_signal(signal.SIGKILL)
            holder.wait(WAIT)
    assert holder.returncode == -signal.SIGKILL
    with Engine.open(path, clock=clock) as engine:
        run = engine.compactor.run_once()
        assert (run.outcome, run.holder) == ("skipped", "victim")
        clock.now += 601  # the dead holder's lease has run out
        run = engine.compactor.run_once()
        assert run.outcome == "ran"
        assert run.clusters == 1
        store = engine.store
        assert isinstance(store, SQLiteStore)
        assert store.integrity_check() == "ok"
        # the lease is given back after the run
        assert store.acquire_lease(LEASE, "someone", now=clock.now, ttl=1) is None


def test_a_lease_is_renewed_by_its_holder_and_released(store: Store) -> None:
    assert isinstance(store, Maintenance)
    assert store.acquire_lease("x", "a", now=100.0, ttl=10) is None
    assert store.acquire_lease("x", "a", now=105.0, ttl=10) is None  # renewed
    assert store.acquire_lease("x", "b", now=106.0, ttl=10) is not None
    store.release_lease("x", "b")  # not b's: a no-op
    assert store.acquire_lease("x", "b", now=107.0, ttl=10) is not None
    assert store.acquire_lease("y", "b", now=107.0, ttl=10) is None  # another lease
    store.release_lease("x", "a")
    assert store.acquire_lease("x", "b", now=108.0, ttl=10) is None
    assert store.tenants() == []


def test_sqlite_lease_expires_unless_renewed() -> None:
    store = SQLiteStore(":memory:")
    try:
        assert store.acquire_lease("x", "a", now=100.0, ttl=10) is None
        assert store.acquire_lease("x", "b", now=109.0, ttl=10) == "a"
        assert store.acquire_lease("x", "a", now=109.0, ttl=10) is None  # renewed to 119
        assert store.acquire_lease("x", "b", now=118.0, ttl=10) == "a"
        assert store.acquire_lease("x", "b", now=119.5, ttl=10) is None  # expired: b's now
        assert store.acquire_lease("x", "a", now=120.0, ttl=10) == "b"
    finally:
        store.close()


@pytest.mark.postgres
def test_postgres_one_compactor_across_two_engines(pg_schema_dsn: str, clock: Clock) -> None:
    with Engine.open(pg_schema_dsn, clock=clock) as first:
        first.ingest(_messages(clock.now - 20 * DAY, days=1, per_day=6))
        with Engine.open(pg_schema_dsn, clock=clock) as second:
            store = first.store
            assert isinstance(store, Maintenance)
            assert store.acquire_lease(LEASE, "first", now=clock.now, ttl=1) is None
            clock.now += 3600  # an advisory lock has no expiry: only its holder lets go
            run = second.compactor.run_once()
            assert run.outcome == "skipped"
            assert "advisory lock" in (run.holder or "")
            assert not second.store.tombstones("default")
            store.release_lease(LEASE, "first")
            assert second.compactor.run_once().outcome == "ran"
            assert second.store.tombstones("default")
        assert store.acquire_lease(LEASE, "first", now=clock.now, ttl=1) is None
    # a closed store's lock goes with its connection (as a dead process's does)
    with Engine.open(pg_schema_dsn, clock=clock) as third:
        assert third.compactor.run_once().outcome == "ran"


# -- a clean stop ---------------------------------------------------------------------------


def test_stop_ends_a_run_between_clusters(tmp_path: Path, clock: Clock) -> None:
    gate = Gate()
    config = EngineConfig(compact_every=3600, summarizer=gate)
    engine = Engine.open(tmp_path / "s.db", clock=clock, config=config)
    try:
        engine.ingest(_messages(clock.now - 20 * DAY, days=3, per_day=6))
        clusters = len(engine.compact_plan().clusters)
        assert clusters == 3
        engine.compactor.trigger()
        assert gate.entered.wait(WAIT)  # the run is summarising its first cluster
        closing = threading.Thread(target=engine.close)
        closing.start()
        # the stop is asked for while the first cluster is being summarised
        assert engine.compactor.wait(lambda _s: engine.compactor.stopping, WAIT)
        gate.opened.set()
        closing.join(WAIT)
        assert not closing.is_alive()
    finally:
        engine.close()
    assert gate.calls == 1  # no cluster was started after the stop
    with Engine.open(tmp_path / "s.db", clock=clock) as again:
        # the first cluster is whole (summary and tombstones), the others untouched
        assert len(again.store.summaries("default")) == 1
        assert len(again.compact_plan().clusters) == clusters - 1
        store = again.store
        assert isinstance(store, SQLiteStore)
        assert store.integrity_check() == "ok"


# -- configuration, metrics, CLI ------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value"),
    [("window_summaries", "later"), ("compact_every", 0), ("compact_lease", -1)],
)
def test_bad_scheduler_config_names_the_field(field: str, value: Any) -> None:
    with pytest.raises(ConfigError, match=field):
        EngineConfig(**{field: value})


def test_settings_schedule_servers_by_default_and_turn_off() -> None:
    settings = load_settings(None, db=":memory:")
    assert settings.engine_config().compact_every is None  # one-shot commands
    served = settings.engine_config(compact_every=21600.0, window_summaries="background")
    assert (served.compact_every, served.auto_summarize, served.window_summaries) == (
        21600.0,
        True,
        "background",
    )
    off = load_settings(None, db=":memory:", compact_every="off", window_summaries="off")
    config = off.engine_config(compact_every=21600.0, window_summaries="background")
    assert (config.compact_every, config.auto_summarize) == (None, False)
    every = load_settings(None, db=":memory:", compact_every="90m", compact_older_than="3d")
    config = every.engine_config()
    assert config.compact_every == 5400.0
    assert config.compact_policy is not None
    assert config.compact_policy.older_than == 3 * DAY
    with pytest.raises(ConfigError, match="compact_every"):
        load_settings(None, db=":memory:", compact_every="soon").engine_config()


def test_metrics_show_what_the_compactor_did(tmp_path: Path, clock: Clock) -> None:
    with Engine.open(tmp_path / "s.db", clock=clock) as engine:
        engine.ingest(_messages(clock.now - 20 * DAY, days=2, per_day=6))
        run = engine.compactor.run_once()
        store = engine.store
        assert isinstance(store, Maintenance)
        store.acquire_lease(LEASE, "elsewhere", now=clock.now, ttl=60)
        assert engine.compactor.run_once().outcome == "skipped"
        with serve(create_app(engine)) as url, httpx.Client(base_url=url) as client:
            text = client.get("/metrics").text
    assert "ctxwarden_compactor_runs_total 1.0" in text
    assert "ctxwarden_compactor_skipped_total 1.0" in text
    assert "ctxwarden_compactor_failures_total 0.0" in text
    assert f"ctxwarden_compactor_clusters_total {float(run.clusters)}" in text
    assert f"ctxwarden_compactor_memories_total {float(run.compacted)}" in text
    assert f"ctxwarden_compactor_tokens_saved_total {float(run.tokens_saved)}" in text
    (last,) = [
        line.split()[1]
        for line in text.splitlines()
        if line.startswith("ctxwarden_compactor_last_run_timestamp_seconds ")
    ]
    assert float(last) == clock.now
    assert run.clusters == 2


def test_cli_compact_every_runs_at_once_and_stops_on_sigterm(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    with Engine.open(db) as engine:
        engine.ingest(_messages(morning(20), days=2, per_day=6))
    with subprocess.Popen(
        [sys.executable, "-m", "ctxwarden", "--db", str(db), "compact", "--every", "6h"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as process:
        try:
            assert process.stdout is not None
            line = process.stdout.readline()
            assert line.startswith("compaction ran: "), line
            assert "in 2 clusters" in line
            process.send_signal(signal.SIGTERM)
            _, err = process.communicate(timeout=WAIT)
        finally:
            if process.poll() is None:
                process.kill()
    assert process.returncode == 0, err
    assert "stopping" in err
    with Engine.open(db) as engine:
        assert len(engine.store.summaries("default")) == 2


def test_serve_compacts_on_its_schedule_and_stops_cleanly(tmp_path: Path) -> None:
    import socket

    db = tmp_path / "s.db"
    with Engine.open(db) as engine:
        engine.ingest(_messages(morning(20), days=2, per_day=6))
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    # the first run one second in
    argv = ["--db", str(db), "serve", "--no-auth", "--port", str(port), "--compact-every", "1s"]
    with subprocess.Popen(
        [sys.executable, "-m", "ctxwarden", *argv],
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
    ) as process:
        try:
            assert process.stderr is not None
            # "warming up", then "ready" (a warning may come between: a scrub of the file
            # retried while the first compaction run reads it)
            lines = [process.stderr.readline() for _ in range(2)]
            while "ready" not in lines[-1] and lines[-1] and len(lines) < 20:
                lines.append(process.stderr.readline())
            assert "ready" in lines[-1], lines
            deadline = time.monotonic() + WAIT  # a bound on waiting, not a measurement
            runs = 0.0
            while runs < 1 and time.monotonic() < deadline:
                text = httpx.get(f"http://127.0.0.1:{port}/metrics").text
                (value,) = [
                    line.split()[1]
                    for line in text.splitlines()
                    if line.startswith("ctxwarden_compactor_runs_total ")
                ]
                runs = float(value)
                time.sleep(0.1)
            assert runs >= 1
            assert "ctxwarden_compactor_skipped_total 0.0" in text
            process.send_signal(signal.SIGTERM)
            process.wait(WAIT)
        finally:
            if process.poll() is None:
                process.kill()
    assert process.returncode == 0
    with Engine.open(db) as engine:
        assert len(engine.store.summaries("default")) == 2
        store = engine.store
        assert isinstance(store, SQLiteStore)
        assert store.integrity_check() == "ok"


def test_a_session_erased_while_its_window_summary_is_made_stays_erased(clock: Clock) -> None:
    gate = Gate()
    config = EngineConfig(
        auto_summarize=True,
        window_summaries="background",
        summarizer=gate,
        default_model="gpt-4",
    )
    with Engine.open(":memory:", clock=clock, config=config) as engine:
        engine.ingest(_messages(clock.now - DAY, days=1, per_day=140))
        assert gate.entered.wait(WAIT)  # the summary's text is being made from the sources
        engine.erase_session("team")
        gate.opened.set()
        stats = _until(engine, lambda s: s.window_pending == 0)
        assert stats.window_summaries == 0
        assert stats.window_failures == 0
        assert not engine.store.summaries("default")
        assert engine.stats()["memories"] == 0


def test_compaction_asked_for_waits_for_no_one_and_says_who_runs(
    tmp_path: Path, clock: Clock
) -> None:
    path = tmp_path / "s.db"
    with Engine.open(path, clock=clock) as engine, Engine.open(path, clock=clock) as other:
        engine.ingest(_messages(clock.now - 20 * DAY, days=1, per_day=6))
        store = other.store
        assert isinstance(store, Maintenance)
        assert store.acquire_lease(LEASE, other.compactor.owner, now=clock.now, ttl=60) is None
        with serve(create_app(engine)) as url, httpx.Client(base_url=url) as client:
            held = client.post("/v1/compact/apply", json={})
            assert held.status_code == 409, held.text
            assert other.compactor.owner in held.text
            assert not engine.store.tombstones("default")
            store.release_lease(LEASE, other.compactor.owner)
            done = client.post("/v1/compact/apply", json={})
            assert done.status_code == 200, done.text
            assert done.json()["compacted"] == 6
        # the lease was given back after the request
        assert store.acquire_lease(LEASE, "next", now=clock.now, ttl=60) is None


def test_cli_compact_apply_refuses_while_another_compactor_runs(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    now = time.time()
    with Engine.open(db) as engine:
        engine.ingest(_messages(morning(20), days=1, per_day=6))
        store = engine.store
        assert isinstance(store, Maintenance)
        store.acquire_lease(LEASE, "elsewhere", now=now, ttl=600)
    result = subprocess.run(
        [sys.executable, "-m", "ctxwarden", "--db", str(db), "compact", "--apply"],
        capture_output=True,
        text=True,
        timeout=WAIT,
        check=False,
    )
    assert result.returncode == 1
    assert result.stderr.strip() == (
        "error: compaction: another compactor holds the lease (elsewhere); retry later"
    )
    with Engine.open(db) as engine:
        assert not engine.store.tombstones("default")


def test_a_run_that_lost_its_lease_stops_after_the_cluster_in_hand(
    tmp_path: Path, clock: Clock
) -> None:
    path = tmp_path / "s.db"
    config = EngineConfig(compact_lease=60)
    with Engine.open(path, clock=clock, config=config) as engine:
        engine.ingest(_messages(clock.now - 20 * DAY, days=3, per_day=6))
        store = engine.store
        assert isinstance(store, Maintenance)
        inner = ExtractiveSummarizer()

        class Slow:
            """The first cluster outlasts the lease, and another compactor takes it."""

            def summarize(self, items: Any, *, max_tokens: int, tokenizer: Any) -> Summary:
                if clock.now < 1_900_000_000:
                    clock.now = 1_900_000_000.0
                    assert store.acquire_lease(LEASE, "usurper", now=clock.now, ttl=60) is None
                return inner.summarize(items, max_tokens=max_tokens, tokenizer=tokenizer)

        run = engine.compactor.run_once(summarizer=Slow())
        assert (run.outcome, run.clusters) == ("stopped", 1)
        assert len(engine.store.summaries("default")) == 1
        # the usurper's lease is left alone
        assert store.acquire_lease(LEASE, "third", now=clock.now, ttl=60) == "usurper"


def test_a_failed_run_is_counted_and_the_schedule_goes_on(tmp_path: Path, clock: Clock) -> None:
    config = EngineConfig(compact_every=3600)
    with Engine.open(tmp_path / "s.db", clock=clock, config=config) as engine:
        engine.store.close()  # every store call fails from here on
        for expected in (1, 2):
            engine.compactor.trigger()
            stats = _until(engine, lambda s, n=expected: s.failures >= n)
            assert (stats.failures, stats.runs, stats.last_run_at) == (expected, 0, None)
        run = engine.compactor.run_once()
        assert run.outcome == "failed"
        assert run.error is not None
        assert "closed" in run.error
