"""Compaction off the request path: a scheduled compactor and background window summaries.

:class:`Compactor` is what :attr:`Engine.compactor <ctxwarden.engine.Engine.compactor>` returns.
It does two things in threads of its own, so no request waits on a summariser:

- **Scheduled compaction** (``EngineConfig(compact_every=...)``; ``ctxwarden serve`` runs it
  every 6 h by default, ``ctxwarden compact --every 6h`` in the foreground): each run plans and
  applies compaction for every tenant of the store. One compactor runs at a time across every
  process and server sharing the store: a run first takes the store's ``compactor`` lease
  (:class:`~ctxwarden.store.base.Maintenance`: a row with owner and expiry in SQLite, renewed
  after each cluster; an advisory lock in PostgreSQL). A run that finds it held skips, logs who
  holds it and counts itself in :attr:`CompactorStats.skipped`.
- **Window summaries** (``EngineConfig(auto_summarize=True, window_summaries="background")``):
  ingest queues each session it stored into and returns; one thread checks them against 90 % of
  the recent block (:meth:`Engine.summarize_session`) and writes their summaries. A session
  queued twice before its turn is summarised once.

:meth:`Compactor.stop` (called by :meth:`Engine.close`) ends both: a compaction run stops
before its next cluster (each cluster is one transaction, so none is half applied), the window
thread after the session it is on.

>>> from ctxwarden import Engine
>>> with Engine.open(":memory:") as engine:
...     engine.compactor.run_once().outcome
'ran'
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import uuid
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from ctxwarden import compact as compaction
from ctxwarden.compaction import Compaction
from ctxwarden.engine_config import EngineConfig
from ctxwarden.errors import ConfigError, ConflictError
from ctxwarden.store.base import Maintenance, Store
from ctxwarden.summary import Summarizer

__all__ = ["LEASE", "Compactor", "CompactorRun", "CompactorStats"]

log = logging.getLogger(__name__)

#: The lease a compaction run holds (one per store).
LEASE = "compactor"


@dataclass(frozen=True, kw_only=True, slots=True)
class CompactorRun:
    """What one run did: ``outcome`` is ``"ran"``, ``"skipped"`` (another compactor holds the
    lease: ``holder`` says who), ``"stopped"`` (a shutdown ended it between clusters) or
    ``"failed"`` (``error`` says why; clusters finished before it stay compacted)."""

    outcome: str
    at: float
    holder: str | None = None
    tenants: tuple[str, ...] = ()
    clusters: int = 0
    compacted: int = 0
    tokens_saved: int = 0
    summaries: tuple[str, ...] = ()
    error: str | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class CompactorStats:
    """Counts since the engine opened: runs that compacted (or found nothing to), runs skipped
    because another compactor held the lease, failed runs, clusters compacted, memories
    compacted, tokens saved (the plans' estimate), the time of the last run that held the
    lease; window summaries written, window checks that failed, sessions queued."""

    runs: int = 0
    skipped: int = 0
    failures: int = 0
    clusters: int = 0
    compacted: int = 0
    tokens_saved: int = 0
    last_run_at: float | None = None
    window_summaries: int = 0
    window_failures: int = 0
    window_pending: int = 0


@dataclass
class _Counts:
    runs: int = 0
    skipped: int = 0
    failures: int = 0
    clusters: int = 0
    compacted: int = 0
    tokens_saved: int = 0
    last_run_at: float | None = None
    window_summaries: int = 0
    window_failures: int = 0
    pending: dict[tuple[str, str], None] = field(default_factory=dict)


def _owner() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class Compactor:
    """Scheduled compaction and background window summaries of one engine (see the module).

    Threads start on first use (:meth:`start`, :meth:`request_windows`) and end in :meth:`stop`.
    """

    def __init__(
        self,
        compaction_flow: Compaction,
        store: Store,
        config: EngineConfig,
        *,
        clock: Callable[[], float],
    ) -> None:
        self._flow = compaction_flow
        self._store = store
        self._config = config
        self._clock = clock
        #: Who this compactor is in the lease (host, process id, a random part).
        self.owner = _owner()
        self._changed = threading.Condition(threading.Lock())
        self._counts = _Counts()
        self._stopping = False
        self._triggered = False
        self._busy = False  # the window thread is summarising a session
        self._run_lock = threading.Lock()  # one run at a time within the process
        self._loop: threading.Thread | None = None
        self._windows: threading.Thread | None = None

    # -- compaction --------------------------------------------------------------------------

    def run_once(
        self,
        *,
        policy: compaction.CompactionPolicy | None = None,
        summarizer: Summarizer | None = None,
        tenants: Iterable[str] | None = None,
    ) -> CompactorRun:
        """One compaction run now, under the lease, over ``tenants`` (default: every tenant of
        the store). ``policy`` defaults to ``config.compact_policy``; summaries are written by
        ``summarizer``, else ``config.summarizer``, else the extractive one."""
        store = self._store
        policy = policy or self._config.compact_policy
        summarizer = summarizer or self._config.summarizer
        with self._run_lock:
            now = self._clock()
            ttl = self._config.compact_lease
            lease = store if isinstance(store, Maintenance) else None
            try:
                holder = lease.acquire_lease(LEASE, self.owner, now=now, ttl=ttl) if lease else None
            except Exception as exc:  # the store is busy or gone: this run fails, the next tries
                log.exception("compaction failed: the lease could not be taken")
                with self._changed:
                    self._counts.failures += 1
                    self._changed.notify_all()
                return CompactorRun(outcome="failed", at=now, error=f"{type(exc).__name__}: {exc}")
            if holder is not None:
                log.info("compaction skipped: the %s lease is held by %s", LEASE, holder)
                with self._changed:
                    self._counts.skipped += 1
                    self._changed.notify_all()
                return CompactorRun(outcome="skipped", at=now, holder=holder)
            names: list[str] = sorted(tenants) if tenants is not None else []
            done: list[str] = []
            clusters = compacted = saved = 0
            lost: list[str] = []

            def renew(cluster: compaction.Cluster, outcome: str) -> None:
                nonlocal clusters, compacted, saved
                if outcome == "compacted":
                    clusters += 1
                    compacted += cluster.size
                    saved += cluster.tokens_saved
                if lease is not None and not lost:
                    # Never raises: a failure here would skip the scrub after the clusters
                    # already applied; a lease that cannot be renewed ends the run instead.
                    try:
                        taken = lease.acquire_lease(LEASE, self.owner, now=self._clock(), ttl=ttl)
                    except Exception as exc:
                        taken = f"unknown ({type(exc).__name__}: {exc})"
                    if taken is not None:  # our lease ran out and another took it: stop
                        log.warning("compaction stopped: the lease passed to %s", taken)
                        lost.append(taken)

            def stop() -> bool:
                return self._stopping or bool(lost)

            outcome, error = "ran", None
            try:
                if tenants is None:
                    names = lease.tenants() if lease else [self._config.tenant]
                for tenant in names:
                    if stop():
                        break
                    plan = self._flow.compact_plan(
                        policy=policy, tenant=tenant, model=None, embeddings=None, tokenizer=None
                    )
                    if plan.clusters:
                        result = self._flow.compact(
                            plan,
                            summarizer=summarizer,
                            policy=policy,
                            tenant=tenant,
                            progress=renew,
                            stop=stop,
                        )
                        done.extend(result.summaries)
                if stop():
                    outcome = "stopped"
            except Exception as exc:
                log.exception("compaction failed")
                outcome, error = "failed", f"{type(exc).__name__}: {exc}"
            finally:
                if lease is not None:
                    try:
                        lease.release_lease(LEASE, self.owner)
                    except Exception:
                        log.exception("compaction: releasing the lease failed (it expires)")
            with self._changed:
                c = self._counts
                c.failures += outcome == "failed"
                c.runs += outcome != "failed"
                c.clusters += clusters
                c.compacted += compacted
                c.tokens_saved += saved
                c.last_run_at = now
                self._changed.notify_all()
            log.info(
                "compaction %s: %d clusters, %d memories, about %d tokens saved",
                outcome, clusters, compacted, saved,
            )  # fmt: skip
            return CompactorRun(
                outcome=outcome,
                at=now,
                tenants=tuple(names),
                clusters=clusters,
                compacted=compacted,
                tokens_saved=saved,
                summaries=tuple(done),
                error=error,
            )

    @contextmanager
    def lease(self) -> Iterator[None]:
        """Hold the compactor lease around a compaction a caller asked for
        (``POST /v1/compact/apply``, ``ctxwarden compact --apply``), so it never runs beside a
        scheduled one; :class:`~ctxwarden.errors.ConflictError` (HTTP 409) when another
        compactor holds it."""
        if not self._run_lock.acquire(blocking=False):
            raise ConflictError("compaction: this server's compactor is running; retry later")
        try:
            store = self._store
            lease = store if isinstance(store, Maintenance) else None
            now, ttl = self._clock(), self._config.compact_lease
            holder = lease.acquire_lease(LEASE, self.owner, now=now, ttl=ttl) if lease else None
            if holder is not None:
                raise ConflictError(
                    f"compaction: another compactor holds the lease ({holder}); retry later"
                )
            try:
                yield
            finally:
                if lease is not None:
                    lease.release_lease(LEASE, self.owner)
        finally:
            self._run_lock.release()

    def start(
        self,
        every: float,
        *,
        now: bool = False,
        policy: compaction.CompactionPolicy | None = None,
        summarizer: Summarizer | None = None,
        report: Callable[[CompactorRun], None] | None = None,
        tenants: Iterable[str] | None = None,
    ) -> None:
        """Run compaction every ``every`` seconds in a thread of its own, the first run one
        interval from now (at once with ``now``, or at :meth:`trigger`), over ``tenants``
        (default: every tenant); ``report`` is called with each run. A no-op when already
        started. A server's first run waits an interval, so restarts do not compact again and
        again; ``ctxwarden compact --every`` runs at once."""
        if not every > 0:
            raise ConfigError(f"compact_every: {every} must be above 0 seconds")
        with self._changed:
            if self._loop is not None or self._stopping:
                return
            self._triggered = now
            self._loop = threading.Thread(
                target=self._run_every,
                args=(every, policy, summarizer, report, None if tenants is None else [*tenants]),
                name="ctxwarden-compactor",
                daemon=True,
            )
            self._loop.start()

    def trigger(self) -> None:
        """Wake the scheduled thread to run now (then one interval until the next run)."""
        with self._changed:
            self._triggered = True
            self._changed.notify_all()

    def _run_every(
        self,
        every: float,
        policy: compaction.CompactionPolicy | None,
        summarizer: Summarizer | None,
        report: Callable[[CompactorRun], None] | None,
        tenants: list[str] | None,
    ) -> None:
        while True:
            with self._changed:
                self._changed.wait_for(lambda: self._stopping or self._triggered, timeout=every)
                if self._stopping:
                    return
                self._triggered = False
            try:
                run = self.run_once(policy=policy, summarizer=summarizer, tenants=tenants)
            except Exception:  # run_once counts its own failures; this keeps the schedule alive
                log.exception("compaction: the scheduled run failed")
                continue
            if report is not None:
                try:
                    report(run)
                except Exception:
                    log.exception("compaction: the run's report failed")

    def wait(self, condition: Callable[[CompactorStats], bool], timeout: float) -> bool:
        """Block until ``condition(stats())`` holds or ``timeout`` seconds pass; whether it
        holds (tests and shutdown scripts wait for a run or an empty window queue)."""
        with self._changed:
            return self._changed.wait_for(lambda: condition(self._stats()), timeout=timeout)

    # -- window summaries ----------------------------------------------------------------------

    def request_windows(self, sessions: Iterable[tuple[str, str]]) -> None:
        """Queue ``(tenant, session)`` pairs for a window-summary check and return at once."""
        with self._changed:
            if self._stopping:
                return
            for pair in sessions:
                self._counts.pending[pair] = None
            if self._windows is None:
                self._windows = threading.Thread(
                    target=self._summarise_windows, name="ctxwarden-windows", daemon=True
                )
                self._windows.start()
            self._changed.notify_all()

    def _summarise_windows(self) -> None:
        while True:
            with self._changed:
                self._busy = False
                self._changed.notify_all()
                self._changed.wait_for(lambda: self._stopping or bool(self._counts.pending))
                if self._stopping:
                    return
                tenant, session = next(iter(self._counts.pending))
                del self._counts.pending[(tenant, session)]
                self._busy = True
            written, failed = 0, 0
            try:
                written = len(
                    self._flow.summarize_session(
                        session,
                        summarizer=self._config.summarizer,
                        model=None,
                        tenant=tenant,
                        threshold=None,
                        capacity=None,
                        tokenizer=None,
                        window=None,
                    )
                )
            except Exception:
                log.exception("window summary of a session failed (retried at its next ingest)")
                failed = 1
            with self._changed:
                self._counts.window_summaries += written
                self._counts.window_failures += failed

    # -- state -------------------------------------------------------------------------------

    def _stats(self) -> CompactorStats:
        c = self._counts
        return CompactorStats(
            runs=c.runs,
            skipped=c.skipped,
            failures=c.failures,
            clusters=c.clusters,
            compacted=c.compacted,
            tokens_saved=c.tokens_saved,
            last_run_at=c.last_run_at,
            window_summaries=c.window_summaries,
            window_failures=c.window_failures,
            window_pending=len(c.pending) + self._busy,
        )

    @property
    def stopping(self) -> bool:
        """Whether :meth:`stop` was called (a run in progress ends before its next cluster)."""
        return self._stopping

    def stats(self) -> CompactorStats:
        """The counts so far (``/metrics`` reads them at each scrape)."""
        with self._changed:
            return self._stats()

    def stop(self, timeout: float | None = None) -> None:
        """Stop both threads: a compaction run ends before its next cluster, the window thread
        after the session it is on (sessions still queued are checked at their next ingest).
        Waits up to ``timeout`` seconds (None: until they end). Idempotent."""
        with self._changed:
            self._stopping = True
            self._changed.notify_all()
            threads = [t for t in (self._loop, self._windows) if t is not None]
        for thread in threads:
            if thread is not threading.current_thread():
                thread.join(timeout)
