"""Load on the HTTP API over loopback: throughput, p50/p99 and errors per operation.

    python bench/serve.py [--requests 20000] [--saturation-requests 20000] [--rate R]
                          [--rate-share 0.5] [--connections 32] [--seed 2000] [--report summary]
                          [--vocabulary chat|tiny] [--client raw|httpx]
                          [--breakdown N [--warm N] [--pause MS]]

Starts ``ctxwarden serve --no-auth`` on 127.0.0.1 (a free port, a temporary database) in its own
process, seeds ``--seed`` messages over ``--sessions`` sessions, then runs two phases over
``--connections`` keep-alive connections (one thread each), each in the mix 70 % assemble
(budget 4,000), 25 % ingest (one record), 5 % search. Targets (issue 6): 0 errors, assemble
p50 <= 10 ms, p99 <= 100 ms.

Text (``--vocabulary``): messages are 30 words, assemble queries 8, searches 4, drawn from

- ``chat`` (default): ~3,000 made-up words, Zipf-like (bench/chat_text.py, shared with
  bench/retrieve.py). As in chat, a few words are everywhere and most are rare, so a query's
  terms each match a small share of the store.
- ``tiny``: 40 words, uniformly: every query term is in about half the messages, so each
  full-text search walks long posting lists and ranks most of the store. An adversarial case
  (the only text this bench had at first), kept to measure it.

(a) Saturation: ``--saturation-requests`` in a closed loop (each connection sends its next
request when the last is answered). This measures throughput; its latency is the queue (by
Little's law the mean is connections / throughput), not what a client at a sane load sees.

(b) Latency at a fixed offered rate: ``--requests`` in an open loop, request i due at
``start + i / rate`` (``--rate``, default ``--rate-share`` of (a)'s throughput), like wrk2.
Latency runs from the due time, so a server that falls behind is charged for the requests it
delayed (no coordinated omission).

The client (``--client``): ``raw`` (default) sends each request as bytes encoded before the run
over a plain keep-alive socket and parses only the status line and ``Content-Length`` of the
answer, as wrk2 does, so the load generator's own work stays out of the latency it measures and
off the cores the server needs: ~0.2 ms of CPU a request (mostly its 32 threads waking), against
~2 ms with ``httpx``, which sends the same requests with httpx's client (this bench's client
before session 7; kept to compare).

Each phase prints answered req/s, p50/p99 and errors per operation, the mean of
``engine.assemble`` inside the server (from ``/metrics``), the server process's CPU time per
request (from /proc, Linux), the load average and the load generator's own CPU per request. The
load generator shares the machine with the server. ``--breakdown N`` skips the server and
assembles N times in process on the same kind of store, printing the CPU time of each phase
(timers wrapped around the engine's own functions), after ``--warm`` untimed ones (token counts
cached, as in a running server); ``--pause MS`` sleeps that long before each call, as a server
idles between requests (the CPU time of the same call grows with the pause: caches go cold).
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import random
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import numpy as np

import chat_text

TINY_WORDS = (
    "the deploy release standup review branch merge ticket customer budget design meeting "
    "schedule laptop coffee lunch weekend plan report bug fix test pipeline server database "
    "query index cache token memory context agent model prompt window latency metric alert"
).split()
MAX_REQUESTS = 200_000


class Text:
    """Message and query text: ``chat`` (Zipf-like over ~3,000 words, bench/chat_text.py) or
    ``tiny`` (uniform over :data:`TINY_WORDS`, drawn from ``rng`` as this bench always did)."""

    def __init__(self, vocabulary: str, rng: random.Random) -> None:
        self.rng = rng
        self.tiny = vocabulary == "tiny"
        if not self.tiny:
            self.draws = np.random.default_rng(rng.getrandbits(64))
            self.words = chat_text.vocabulary(self.draws)
            self.weights = chat_text.zipf_weights(len(self.words))

    def __call__(self, words: int = 30) -> str:
        if self.tiny:
            return " ".join(self.rng.choice(TINY_WORDS) for _ in range(words))
        return chat_text.sentence(self.draws, self.words, self.weights, words=words)


class Connection:
    """One keep-alive HTTP/1.1 connection sending pre-encoded requests (``--client raw``).

    Of an answer only the status line and ``Content-Length`` are parsed; the body is read and
    dropped. Every answer of the server under test has a ``Content-Length`` (its responses are
    whole bodies): anything else is an error of the bench, not a latency.
    """

    def __init__(self, host: str, port: int, timeout: float) -> None:
        self.address = (host, port)
        self.timeout = timeout
        self.sock: socket.socket | None = None
        self.buffer = b""

    def request(self, raw: bytes) -> int:
        """Send ``raw`` (a whole request) and return the answer's status; reconnects once if the
        kept-alive connection was closed by the server, raises OSError otherwise."""
        for attempt in (1, 2):
            if self.sock is None:
                self.sock = socket.create_connection(self.address, timeout=self.timeout)
                self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                self.buffer = b""
            try:
                self.sock.sendall(raw)
                return self._answer()
            except (ConnectionError, EOFError):
                self.close()
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    def _answer(self) -> int:
        assert self.sock is not None
        while (end := self.buffer.find(b"\r\n\r\n")) < 0:
            self._fill()
        head = self.buffer[:end].decode("latin-1").lower()
        status = int(head[9:12])
        length = None
        close = False
        for line in head.split("\r\n")[1:]:
            name, _, value = line.partition(":")
            if name == "content-length":
                length = int(value)
            elif name == "connection" and "close" in value:
                close = True
        if length is None:
            raise OSError(f"an answer without Content-Length: {head.splitlines()[0]!r}")
        need = end + 4 + length
        while len(self.buffer) < need:
            self._fill()
        self.buffer = self.buffer[need:]
        if close:
            self.close()
        return status

    def _fill(self) -> None:
        assert self.sock is not None
        chunk = self.sock.recv(1 << 16)
        if not chunk:
            raise EOFError("the server closed the connection")
        self.buffer += chunk

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None


def encoded(host: str, path: str, body: dict[str, Any]) -> bytes:
    """The whole HTTP/1.1 request ``POST path`` with ``body`` as JSON."""
    data = json.dumps(body).encode()
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(data)}\r\n\r\n"
    )
    return head.encode() + data


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def percentile(values: list[float], share: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=20_000, help="open-loop phase")
    parser.add_argument(
        "--saturation-requests",
        type=int,
        default=20_000,
        help="closed-loop phase (0 skips it; then --rate is needed)",
    )
    parser.add_argument(
        "--rate",
        type=float,
        default=None,
        help="open loop's offered req/s (default: --rate-share of saturation)",
    )
    parser.add_argument("--rate-share", type=float, default=0.5)
    parser.add_argument(
        "--report",
        choices=["summary", "full"],
        default="summary",
        help="assemble's report (full: every retrieval candidate)",
    )
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument(
        "--client",
        choices=["raw", "httpx"],
        default="raw",
        help="load generator: pre-encoded requests on plain sockets (raw) or httpx's client",
    )
    parser.add_argument("--sessions", type=int, default=50)
    parser.add_argument("--seed", type=int, default=2000, help="messages stored before the run")
    parser.add_argument("--max-concurrency", type=int, default=64, help="server's gate")
    parser.add_argument("--threads", type=int, default=4, help="server's worker threads")
    parser.add_argument("--breakdown", type=int, default=0, help="in-process phase CPU times")
    parser.add_argument(
        "--warm", type=int, default=0, help="with --breakdown: untimed assembles first"
    )
    parser.add_argument(
        "--pause",
        type=float,
        default=0.0,
        help="with --breakdown: ms to sleep before each assemble (an idle core between requests)",
    )
    parser.add_argument(
        "--vocabulary",
        choices=["chat", "tiny"],
        default="chat",
        help="message text: Zipf-like over ~3,000 words (chat) or uniform over 40 (tiny)",
    )
    args = parser.parse_args(argv)
    for name in ("requests", "saturation_requests"):
        if not 0 <= getattr(args, name) <= MAX_REQUESTS:
            parser.error(f"--{name.replace('_', '-')} must be between 0 and {MAX_REQUESTS}")
    if (args.rate is not None and args.rate <= 0) or not 0 < args.rate_share <= 1:
        parser.error("--rate must be positive and --rate-share in (0, 1]")
    if not 1 <= args.connections <= 256:
        parser.error("--connections must be between 1 and 256")

    rng = random.Random(7)
    text = Text(args.vocabulary, rng)
    if args.breakdown:
        breakdown(args, rng, text)
        return
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory() as folder:
        command = [sys.executable, "-m", "ctxwarden.cli", "--db", str(Path(folder) / "b.db")]
        server = subprocess.Popen(
            [*command, "serve", "--no-auth", "--host", "127.0.0.1", "--port", str(port),
             "--max-concurrency", str(args.max_concurrency), "--threads", str(args.threads)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )  # fmt: skip
        try:
            run(args, rng, text, base, server)
        finally:
            server.terminate()
            server.communicate(timeout=30)


def breakdown(args: argparse.Namespace, rng: random.Random, text: Text) -> None:
    """CPU time per phase of ``Engine.assemble`` on a store seeded like the load run's."""
    from collections import defaultdict
    from collections.abc import Callable

    import ctxwarden.assembly as assembly_module
    import ctxwarden.recent_walk as recent_walk_module
    from ctxwarden import Engine
    from ctxwarden.store.sqlite import SQLiteStore

    spent: dict[str, float] = defaultdict(float)

    def timed(owner: Any, name: str, label: str) -> None:
        inner: Callable[..., Any] = getattr(owner, name)

        def wrapper(*a: Any, **k: Any) -> Any:
            began = time.process_time()
            try:
                return inner(*a, **k)
            finally:
                spent[label] += time.process_time() - began

        static = isinstance(inspect.getattr_static(owner, name), staticmethod)
        setattr(owner, name, staticmethod(wrapper) if static else wrapper)

    # a method of Assembly at first, a module function since the class was split
    costs = assembly_module.Assembly
    if not hasattr(costs, "_block_message_cost"):
        costs = assembly_module  # type: ignore[assignment]
    phases = [
        (recent_walk_module.RecentWalk, "take", "recent (history walk, counts)"),
        (assembly_module.Assembly, "_related", "related (retrieval + line costs)"),
        (assembly_module, "retrieve", "  retrieve"),
        (SQLiteStore, "search", "    store.search (FTS5)"),
        (SQLiteStore, "neighbours", "    store.neighbours"),
        (assembly_module.Assembly, "_line_candidates", "pinned + summaries"),
        (assembly_module, "fill", "fill (blocks, report)"),
        (costs, "_block_message_cost", "message costs (render, count)"),
        (SQLiteStore, "log_context", "inclusion log + access stats"),
        (SQLiteStore, "token_counts", "store.token_counts (all callers)"),
    ]
    for owner, name, label in phases:
        timed(owner, name, label)
    sessions = [f"s{i}" for i in range(args.sessions)]
    with tempfile.TemporaryDirectory() as folder, Engine.open(Path(folder) / "b.db") as engine:
        for start in range(0, args.seed, 500):
            engine.ingest(
                [
                    {"role": rng.choice(["user", "assistant"]), "content": text(),
                     "session": rng.choice(sessions)}
                    for _ in range(min(500, args.seed - start))
                ]
            )  # fmt: skip
        for _ in range(args.warm):
            engine.assemble(
                session=rng.choice(sessions), query=text(8), budget=4000, scope="tenant"
            )
        spent.clear()
        began = time.process_time()
        for _ in range(args.breakdown):
            if args.pause:
                time.sleep(args.pause / 1000)  # process_time does not count the sleep
            engine.assemble(
                session=rng.choice(sessions), query=text(8), budget=4000, scope="tenant"
            )
        total = time.process_time() - began
    print(f"assemble, CPU ms per call over {args.breakdown} calls ({args.seed} messages stored, "
          f"{args.vocabulary} vocabulary, {args.pause:g} ms pause before each)")  # fmt: skip
    print(f"{'total':<36} {total / args.breakdown * 1000:>7.1f}")
    for _, _, label in phases:
        print(f"{label:<36} {spent[label] / args.breakdown * 1000:>7.1f}")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process ``pid`` (Linux /proc; NaN elsewhere)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass
class Phase:
    """What one load phase measured."""

    wall: float
    latencies: dict[str, list[float]]
    errors: dict[str, int]
    statuses: dict[int, int]
    server_cpu: float
    client_cpu: float
    load: tuple[float, float]
    inside: float


def run(
    args: argparse.Namespace,
    rng: random.Random,
    text: Text,
    base: str,
    server: subprocess.Popen[bytes],
) -> None:
    deadline = time.monotonic() + 30
    while True:
        try:
            httpx.get(base + "/health", timeout=1)
            break
        except httpx.TransportError:
            if server.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("the server did not start") from None
            time.sleep(0.1)
    sessions = [f"s{i}" for i in range(args.sessions)]
    with httpx.Client(base_url=base, timeout=30) as client:
        for start in range(0, args.seed, 500):
            records = [
                {"role": rng.choice(["user", "assistant"]), "content": text(),
                 "session": rng.choice(sessions)}
                for _ in range(min(500, args.seed - start))
            ]  # fmt: skip
            client.post("/v1/ingest", json={"records": records}).raise_for_status()

    print(f"{args.seed} messages seeded over {args.sessions} sessions; "
          f"{args.vocabulary} vocabulary; {args.connections} connections; "
          f"assemble budget 4000, report={args.report}; {args.client} client; "
          f"{os.cpu_count()} CPUs")  # fmt: skip
    rate = args.rate
    if args.saturation_requests:
        plan, bodies = workload(args, rng, text, sessions, args.saturation_requests)
        closed = load(args, base, server, plan, bodies, rate=None)
        report(f"(a) saturation, closed loop ({args.connections} connections always waiting)",
               closed, len(plan))  # fmt: skip
        if rate is None:
            rate = args.rate_share * len(plan) / closed.wall
    if rate is None:
        raise SystemExit("--rate is needed when the saturation phase is skipped")
    if args.requests:
        plan, bodies = workload(args, rng, text, sessions, args.requests)
        opened = load(args, base, server, plan, bodies, rate=rate)
        how = "given" if args.rate else f"{args.rate_share:.0%} of saturation"
        report(f"(b) open loop at {rate:.1f} req/s offered ({how}); latency from the scheduled "
               "send time", opened, len(plan))  # fmt: skip


def workload(
    args: argparse.Namespace, rng: random.Random, text: Text, sessions: list[str], count: int
) -> tuple[list[str], list[tuple[str, dict[str, Any]]]]:
    """``count`` requests in the mix (70 % assemble, 25 % ingest, 5 % search)."""
    plan = rng.choices(["assemble", "ingest", "search"], weights=[70, 25, 5], k=count)
    bodies: list[tuple[str, dict[str, Any]]] = []
    path = "/v1/assemble" + ("?report=full" if args.report == "full" else "")
    for op in plan:
        session = rng.choice(sessions)
        if op == "assemble":
            bodies.append((path, {"session": session, "query": text(8),
                                  "budget": 4000, "scope": "tenant"}))  # fmt: skip
        elif op == "ingest":
            bodies.append(("/v1/ingest", {"session": session,
                                          "records": [{"content": text()}]}))  # fmt: skip
        else:
            bodies.append(("/v1/search", {"query": text(4), "limit": 20, "scope": "tenant"}))
    return plan, bodies


def load(
    args: argparse.Namespace,
    base: str,
    server: subprocess.Popen[bytes],
    plan: list[str],
    bodies: list[tuple[str, dict[str, Any]]],
    *,
    rate: float | None,
) -> Phase:
    """Send ``plan`` over ``args.connections`` keep-alive connections, one thread each.

    ``rate`` None: closed loop, each connection sends its next request when the last one is
    answered. Otherwise open loop: request i is due at ``start + i / rate``; a free connection
    waits for its request's due time, and latency runs from the due time, not from when a busy
    server let the connection send it, so queueing is not hidden (coordinated omission).
    """
    latencies: dict[str, list[float]] = {"assemble": [], "ingest": [], "search": []}
    errors: dict[str, int] = dict.fromkeys(latencies, 0)
    statuses: dict[int, int] = {}
    lock = threading.Lock()
    cursor = iter(range(len(plan)))
    began = 0.0

    address = urlsplit(base)
    raw = (
        [encoded(address.netloc, path, body) for path, body in bodies]
        if args.client == "raw"
        else None
    )

    def worker() -> None:
        connection = Connection(address.hostname or "", address.port or 80, timeout=60)
        client = httpx.Client(base_url=base, timeout=60) if raw is None else None
        try:
            while True:
                with lock:
                    index = next(cursor, None)
                if index is None:
                    return
                if rate is None:
                    due = time.perf_counter()
                else:
                    due = began + index / rate
                    wait = due - time.perf_counter()
                    if wait > 0:
                        time.sleep(wait)
                try:
                    if client is None:
                        assert raw is not None
                        status = connection.request(raw[index])
                    else:
                        path, body = bodies[index]
                        status = client.post(path, json=body).status_code
                except (OSError, httpx.HTTPError):
                    status = 0
                took = time.perf_counter() - due
                with lock:
                    latencies[plan[index]].append(took)
                    statuses[status] = statuses.get(status, 0) + 1
                    if status != 200:
                        errors[plan[index]] += 1
        finally:
            connection.close()
            if client is not None:
                client.close()

    count_before, sum_before = assemble_metrics(base)
    load_before = os.getloadavg()[0]
    cpu_before = cpu_seconds(server.pid)
    client_before = time.process_time()
    threads = [threading.Thread(target=worker) for _ in range(args.connections)]
    began = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - began
    server_cpu = cpu_seconds(server.pid) - cpu_before
    client_cpu = time.process_time() - client_before
    load_after = os.getloadavg()[0]
    count_after, sum_after = assemble_metrics(base)
    inside = (sum_after - sum_before) / max(1.0, count_after - count_before)
    return Phase(
        wall, latencies, errors, statuses, server_cpu, client_cpu, (load_before, load_after), inside
    )


def assemble_metrics(base: str) -> tuple[float, float]:
    """Count and sum of ``ctxwarden_assemble_seconds`` from ``/metrics``."""
    metrics = dict(
        line.rsplit(" ", 1)
        for line in httpx.get(base + "/metrics").text.splitlines()
        if line.startswith("ctxwarden_assemble_seconds_")
    )
    return (
        float(metrics.get("ctxwarden_assemble_seconds_count", "nan")),
        float(metrics.get("ctxwarden_assemble_seconds_sum", "nan")),
    )


def report(title: str, phase: Phase, requests: int) -> None:
    print()
    print(title)
    print(f"{requests} requests in {phase.wall:.1f} s: {requests / phase.wall:.1f} req/s "
          f"answered; statuses {dict(sorted(phase.statuses.items()))}")  # fmt: skip
    print(f"{'operation':<10} {'count':>7} {'errors':>7} {'p50 ms':>8} {'p99 ms':>8}")
    for op, values in phase.latencies.items():
        print(
            f"{op:<10} {len(values):>7} {phase.errors[op]:>7} "
            f"{percentile(values, 0.5) * 1000:>8.1f} {percentile(values, 0.99) * 1000:>8.1f}"
        )
    print(f"assemble inside the server (engine.assemble, wall, mean): {phase.inside * 1000:.1f} ms")
    print(
        f"server CPU {phase.server_cpu:.1f} s = {phase.server_cpu / requests * 1000:.1f} ms per "
        f"request (all operations), {phase.server_cpu / phase.wall:.2f} cores; load average "
        f"(1 min) {phase.load[0]:.1f} before, {phase.load[1]:.1f} after"
    )
    print(f"load generator CPU {phase.client_cpu / requests * 1000:.2f} ms per request")


if __name__ == "__main__":
    main()
