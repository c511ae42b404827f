"""Turn slots: many sessions queued, at most ``slots`` turns running at once, fair between sessions.

A turn of a session (ingest, assemble, ask the model, store the reply) must not interleave with
another turn of the same session, or the second would assemble a history missing the first's
reply. :class:`TurnSlots` runs one turn per session at a time, in arrival order; across sessions
it hands out free slots round robin, so one busy session cannot starve the others: a session
whose turn ends goes to the back of the line of sessions waiting.

>>> slots = TurnSlots(2)
>>> with slots.turn("s1"):
...     slots.running
1
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from types import TracebackType

from ctxwarden.errors import ConfigError, OverloadedError

__all__ = ["Ticket", "TurnSlots"]


class Ticket:
    """One queued turn. Enter it (``with ticket:``) to wait for its slot; leaving frees it.

    ``grant`` is the turn's place in the order slots were handed out (None until granted).
    """

    def __init__(self, slots: TurnSlots, session: str) -> None:
        self._slots = slots
        self.session = session
        self.grant: int | None = None

    def wait(self, timeout: float | None = None) -> None:
        """Block until this turn holds a slot; :class:`OverloadedError` after ``timeout``."""
        self._slots._wait(self, timeout)

    def release(self) -> None:
        """Free the slot (the session's next turn may then be scheduled)."""
        self._slots._release(self)

    def __enter__(self) -> Ticket:
        self.wait(self._slots.timeout)
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.release()


class TurnSlots:
    """At most ``slots`` turns at once; one per session, in order; round robin between sessions.

    ``max_waiting`` bounds the queue (:class:`OverloadedError` beyond it); ``timeout`` is how
    long ``with ticket`` waits for a slot (None: no limit).
    """

    def __init__(
        self, slots: int, *, max_waiting: int = 10_000, timeout: float | None = None
    ) -> None:
        if slots < 1:
            raise ConfigError(f"turn slots: {slots} must be at least 1")
        if max_waiting < 1:
            raise ConfigError(f"max_waiting: {max_waiting} must be at least 1")
        self.slots = slots
        self.max_waiting = max_waiting
        self.timeout = timeout
        self._cond = threading.Condition()
        self._queues: dict[str, deque[Ticket]] = {}
        self._ring: deque[str] = deque()  # sessions with waiting turns and none running
        self._active: set[str] = set()
        self._waiting = 0
        self._granted = 0

    @property
    def running(self) -> int:
        """Turns holding a slot now."""
        with self._cond:
            return len(self._active)

    @property
    def waiting(self) -> int:
        """Turns queued for a slot."""
        with self._cond:
            return self._waiting

    def enqueue(self, session: str) -> Ticket:
        """Queue a turn of ``session`` now (arrival order is queue order) without waiting."""
        ticket = Ticket(self, session)
        with self._cond:
            if self._waiting >= self.max_waiting:
                raise OverloadedError(
                    f"{self._waiting} turns are already waiting: retry after a moment"
                )
            queue = self._queues.setdefault(session, deque())
            queue.append(ticket)
            self._waiting += 1
            if len(queue) == 1 and session not in self._active:
                self._ring.append(session)
            self._dispatch()
        return ticket

    @contextmanager
    def turn(self, session: str) -> Iterator[Ticket]:
        """Queue a turn, wait for its slot, run the block, free the slot."""
        with self.enqueue(session) as ticket:
            yield ticket

    def _dispatch(self) -> None:
        while len(self._active) < self.slots and self._ring:
            session = self._ring.popleft()
            ticket = self._queues[session].popleft()
            if not self._queues[session]:
                del self._queues[session]
            self._waiting -= 1
            ticket.grant = self._granted
            self._granted += 1
            self._active.add(session)
        self._cond.notify_all()

    def _wait(self, ticket: Ticket, timeout: float | None) -> None:
        with self._cond:
            if self._cond.wait_for(lambda: ticket.grant is not None, timeout):
                return
            queue = self._queues.get(ticket.session)
            if queue is not None and ticket in queue:
                queue.remove(ticket)
                self._waiting -= 1
                if not queue:
                    del self._queues[ticket.session]
                    if ticket.session in self._ring:
                        self._ring.remove(ticket.session)
        raise OverloadedError(
            f"no turn slot for session {ticket.session!r} within {timeout}s: retry later"
        )

    def _release(self, ticket: Ticket) -> None:
        with self._cond:
            if ticket.grant is None or ticket.session not in self._active:
                return
            self._active.discard(ticket.session)
            if ticket.session in self._queues:
                self._ring.append(ticket.session)
            self._dispatch()
