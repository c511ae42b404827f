"""Turn slots: order within a session, the concurrency cap, round-robin fairness, overload."""

from __future__ import annotations

import threading
import time

import pytest

from ctxwarden.errors import ConfigError, OverloadedError
from ctxwarden.sessions import Ticket, TurnSlots

SESSIONS = 100
TURNS = 10
SLOTS = 4


def test_100_sessions_x_10_turns_at_concurrency_4() -> None:
    slots = TurnSlots(SLOTS)
    # every turn is queued before any runs, session by session, turn by turn
    tickets = {s: [slots.enqueue(f"s{s}") for _ in range(TURNS)] for s in range(SESSIONS)}
    assert slots.running == SLOTS
    lock = threading.Lock()
    running: set[int] = set()
    peak = 0
    done: dict[int, list[int]] = {s: [] for s in range(SESSIONS)}
    overlap: list[int] = []

    def session(s: int) -> None:
        nonlocal peak
        for turn, ticket in enumerate(tickets[s]):
            with ticket:
                with lock:
                    if s in running:
                        overlap.append(s)
                    running.add(s)
                    peak = max(peak, len(running))
                time.sleep(0.0005)  # let other sessions' turns overlap this one
                with lock:
                    running.discard(s)
                    done[s].append(turn)

    threads = [threading.Thread(target=session, args=(s,)) for s in range(SESSIONS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert all(done[s] == list(range(TURNS)) for s in range(SESSIONS))  # order kept
    assert overlap == []  # one turn per session at a time
    assert peak <= SLOTS
    assert slots.running == 0
    assert slots.waiting == 0
    # round robin: the i-th slot handed out goes to a turn of round i // SESSIONS, give or take
    # one round at the boundaries (a session still running its turn when the round ends
    # rejoins behind sessions already back), and never more than SLOTS grants early or late
    grants = sorted((t.grant, turn) for s in tickets for turn, t in enumerate(tickets[s]))
    rounds = [turn for _, turn in grants]
    assert all(abs(turn - i // SESSIONS) <= 1 for i, turn in enumerate(rounds))
    assert sum(turn != i // SESSIONS for i, turn in enumerate(rounds)) <= 2 * SLOTS * TURNS


def test_a_busy_session_cannot_starve_others() -> None:
    slots = TurnSlots(1)
    busy = [slots.enqueue("busy") for _ in range(5)]
    quiet = slots.enqueue("quiet")
    order: list[str] = []
    with busy[0]:
        order.append("busy")
    for ticket in [quiet, *busy[1:]]:
        with ticket:
            order.append(ticket.session)
    assert order[:2] == ["busy", "quiet"]
    assert quiet.grant == 1


def test_overload_and_timeout() -> None:
    slots = TurnSlots(1, max_waiting=2, timeout=0.05)
    holder: Ticket = slots.enqueue("a")
    with holder:
        waiting = slots.enqueue("b")
        slots.enqueue("c")
        with pytest.raises(OverloadedError):
            slots.enqueue("d")
        with pytest.raises(OverloadedError, match="no turn slot"):
            waiting.wait(0.01)
        assert slots.waiting == 1
    assert slots.running == 1  # "c" took the freed slot
    with pytest.raises(ConfigError):
        TurnSlots(0)
