"""Write-behind of the inclusion log: ``EngineConfig(inclusion_log="deferred")``.

With it, :meth:`Engine.assemble <ctxwarden.engine.Engine.assemble>` hands its
:class:`~ctxwarden.store.base.ContextLog` to a :class:`LogWriter` and returns; one background
thread writes the queued entries in batches, each batch one transaction
(:meth:`Store.log_contexts <ctxwarden.store.base.Store.log_contexts>`). What a user can observe
stays as with ``"sync"``:

- **Read-your-writes.** Every engine method that reads or erases the inclusion log or the access
  stats calls :meth:`LogWriter.flush` first, which returns once every entry queued before the
  call is committed (or has failed, see below). ``close()`` writes everything still queued.
- **Erasure.** ``delete``, ``delete_session`` and ``delete_tenant`` flush before they erase, so
  no entry of an assemble that returned before the erasure is written after it. (An assemble
  running *concurrently* with an erasure may log after it, exactly as in ``"sync"`` mode.)
- **Bounded.** At most ``capacity`` entries wait; when the queue is full, ``assemble`` writes
  its own entry itself (backpressure: the caller pays the write, nothing is dropped, memory does
  not grow). Such an entry may commit before older queued ones, as two concurrent ``"sync"``
  assembles may.
- **Failures are not silent.** A batch that fails is written again one entry per transaction,
  so one bad entry loses only itself; each entry that still fails is logged (its context id
  and the error, never content or keys) and counted in :attr:`LogCounters.failed`. The thread
  keeps running.

Not kept: an assemble's own retrieval may not see the access bumps of the assembles just
before it (they are at most a queue behind; concurrent ``"sync"`` assembles race the same way).

What a crash can lose: the entries still queued, those of the last moments (at most
``capacity``, usually the last few milliseconds' worth). Never memories: ingest, pins,
deletions and compaction write synchronously as always; the log holds ids and token counts,
never text.

>>> from ctxwarden.store.sqlite import SQLiteStore
>>> writer = LogWriter(SQLiteStore(":memory:"))
>>> writer.flush()  # nothing queued: returns at once
>>> writer.counters().pending
0
>>> writer.close()
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from dataclasses import dataclass

from ctxwarden.store.base import ContextLog, Store

__all__ = ["LogCounters", "LogWriter"]

log = logging.getLogger(__name__)

#: Entries that may wait before ``assemble`` writes its own (backpressure).
DEFAULT_CAPACITY = 1024
#: Entries written per transaction at most.
DEFAULT_BATCH = 64
#: Seconds the thread lets entries gather after the first before it writes them (unless a
#: flush, a close or a full batch calls it sooner): fewer transactions and thread wake-ups.
#: 0.1 rather than 0.02: at ~50-150 assembles a second a batch holds ~5-15 entries, not 1-3
#: (bench/serve.py, closed loop: 5.6 against 7.2 ms of server CPU per request, one run each);
#: readers never wait for it (a flush hurries the thread), and a crash loses at most this
#: long's entries.
DEFAULT_LINGER = 0.1


@dataclass(frozen=True, kw_only=True, slots=True)
class LogCounters:
    """The state of a :class:`LogWriter` (all counts since it was made).

    ``pending``: entries queued and not written yet; ``written``: entries the background thread
    committed; ``batches``: its transactions; ``failed``: entries it could not write (each
    logged); ``synchronous``: entries ``assemble`` wrote itself because the queue was full.
    """

    pending: int
    written: int
    batches: int
    failed: int
    synchronous: int


class LogWriter:
    """A queue of inclusion-log entries and the one thread that writes them (see the module).

    The thread starts on the first :meth:`submit` and stops in :meth:`close`.
    """

    def __init__(
        self,
        store: Store,
        *,
        capacity: int = DEFAULT_CAPACITY,
        batch: int = DEFAULT_BATCH,
        linger: float = DEFAULT_LINGER,
    ) -> None:
        self._store = store
        self._capacity = capacity
        self._batch = batch
        self._linger = linger
        self._hurry = False  # a flush waits: write without lingering
        self._queue: deque[ContextLog] = deque()
        self._changed = threading.Condition(threading.Lock())
        # Entries ever queued, and how many of them are done (written or failed): the queue is
        # first in, first out with one consumer, so "done >= n" means the first n are done.
        self._queued = 0
        self._done = 0
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._written = 0
        self._batches = 0
        self._failed = 0
        self._synchronous = 0

    def submit(self, entry: ContextLog) -> None:
        """Queue ``entry`` for the background thread; when the queue is full (or the writer
        is closed), write it now in the caller's thread (its error is the caller's)."""
        with self._changed:
            room = not self._stopping and len(self._queue) < self._capacity
            if room:
                self._queue.append(entry)
                self._queued += 1
                wake = len(self._queue) == 1 or len(self._queue) >= self._batch
                if self._thread is None or not self._thread.is_alive():
                    self._thread = threading.Thread(
                        target=self._run, name="ctxwarden-log", daemon=True
                    )
                    self._thread.start()
                if wake:
                    self._changed.notify_all()
                return
            self._synchronous += 1
        self._store.log_context(entry)

    def flush(self) -> None:
        """Return once every entry queued before this call is written (or has failed)."""
        with self._changed:
            target = self._queued
            if self._done < target:
                self._hurry = True
                self._changed.notify_all()
            while self._done < target:
                thread = self._thread
                if thread is None or not thread.is_alive():
                    break  # the thread died (interrupted): drain below, in this thread
                self._changed.wait(1.0)
            else:
                return
        self._drain()

    def close(self) -> None:
        """Write everything queued, then stop the thread. Idempotent; later entries are
        written synchronously by :meth:`submit`."""
        with self._changed:
            self._stopping = True
            self._changed.notify_all()
            thread = self._thread
        if thread is not None:
            thread.join()
        self._drain()

    def counters(self) -> LogCounters:
        """The counts so far (see :class:`LogCounters`)."""
        with self._changed:
            return LogCounters(
                pending=len(self._queue),
                written=self._written,
                batches=self._batches,
                failed=self._failed,
                synchronous=self._synchronous,
            )

    # -- the writer thread ---------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._changed:
                while not self._queue and not self._stopping:
                    self._changed.wait()
                if self._linger and not (
                    self._stopping or self._hurry or len(self._queue) >= self._batch
                ):
                    self._changed.wait(self._linger)
                self._hurry = False
                if not self._queue:
                    return  # stopping, and everything is written
                batch = [self._queue.popleft() for _ in range(min(self._batch, len(self._queue)))]
            self._write(batch)

    def _drain(self) -> None:
        """Write what is queued in this thread (the writer thread is gone)."""
        while True:
            with self._changed:
                if not self._queue:
                    return
                batch = [self._queue.popleft() for _ in range(min(self._batch, len(self._queue)))]
            self._write(batch)

    def _write(self, batch: list[ContextLog]) -> None:
        written = 0
        failed = 0
        batches = 0
        try:
            try:
                self._store.log_contexts(batch)
                written, batches = len(batch), 1
            except Exception as exc:
                if len(batch) > 1:
                    log.warning(
                        "inclusion log: a batch of %d entries failed (%s), writing them one by one",
                        len(batch),
                        type(exc).__name__,
                    )
                for entry in batch:
                    try:
                        # the batch's exception is retried too: it may have been a conflict
                        self._store.log_contexts([entry])
                        written += 1
                        batches += 1
                    except Exception as one:
                        failed += 1
                        log.error(
                            "inclusion log: context %s of tenant %r was not written: %s: %s",
                            entry.id,
                            entry.tenant,
                            type(one).__name__,
                            one,
                        )
        finally:
            with self._changed:
                self._written += written
                self._failed += failed
                self._batches += batches
                # An interrupted write (BaseException) counts its batch as done, not written, so
                # a flush never waits for it forever.
                self._failed += len(batch) - written - failed
                self._done += len(batch)
                self._changed.notify_all()
