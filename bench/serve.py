"""Load on the HTTP API over loopback: throughput, p50/p99 and errors per operation.

    python bench/serve.py [--requests 20000] [--connections 32] [--sessions 50] [--seed 2000]

Starts ``ctxwarden serve --no-auth`` on 127.0.0.1 (a free port, a temporary database) in its own
process, seeds ``--seed`` messages over ``--sessions`` sessions, then sends ``--requests``
requests over ``--connections`` keep-alive connections (one thread each): 70 % assemble, 25 %
ingest, 5 % search. Targets (issue 6): 0 errors, assemble p50 <= 10 ms, p99 <= 100 ms. The load
generator shares the machine with the server, so on a small machine it measures both.

Client latency with N connections always waiting on the server is queueing: by Little's law its
mean is N / throughput, so it also prints the server process's CPU time per request (from
/proc, Linux) and the load average, and ``--connections 1`` shows the latency of one request
alone. ``--breakdown N`` skips the server and assembles N times in process on the same kind of
store, printing the CPU time of each phase (timers wrapped around the engine's own functions).
"""

from __future__ import annotations

import argparse
import os
import random
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

WORDS = (
    "the deploy release standup review branch merge ticket customer budget design meeting "
    "schedule laptop coffee lunch weekend plan report bug fix test pipeline server database "
    "query index cache token memory context agent model prompt window latency metric alert"
).split()
MAX_REQUESTS = 200_000


def sentence(rng: random.Random, words: int = 30) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def percentile(values: list[float], share: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--sessions", type=int, default=50)
    parser.add_argument("--seed", type=int, default=2000, help="messages stored before the run")
    parser.add_argument("--max-concurrency", type=int, default=64, help="server's gate")
    parser.add_argument("--threads", type=int, default=4, help="server's worker threads")
    parser.add_argument("--breakdown", type=int, default=0, help="in-process phase CPU times")
    args = parser.parse_args()
    if not 1 <= args.requests <= MAX_REQUESTS:
        parser.error(f"--requests must be between 1 and {MAX_REQUESTS}")
    if not 1 <= args.connections <= 256:
        parser.error("--connections must be between 1 and 256")

    rng = random.Random(7)
    if args.breakdown:
        breakdown(args, rng)
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
            run(args, rng, base, server)
        finally:
            server.terminate()
            server.communicate(timeout=30)


def breakdown(args: argparse.Namespace, rng: random.Random) -> None:
    """CPU time per phase of ``Engine.assemble`` on a store seeded like the load run's."""
    from collections import defaultdict
    from collections.abc import Callable
    from typing import Any

    import ctxwarden.engine as engine_module
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

        setattr(owner, name, wrapper)

    phases = [
        (engine_module.Engine, "_related", "related (retrieval + line costs)"),
        (engine_module, "retrieve", "  retrieve"),
        (SQLiteStore, "search", "    store.search (FTS5)"),
        (engine_module, "fill", "fill (blocks, report)"),
        (SQLiteStore, "log_context", "inclusion log + access stats"),
    ]
    for owner, name, label in phases:
        timed(owner, name, label)
    sessions = [f"s{i}" for i in range(args.sessions)]
    with tempfile.TemporaryDirectory() as folder, Engine.open(Path(folder) / "b.db") as engine:
        for start in range(0, args.seed, 500):
            engine.ingest(
                [
                    {"role": rng.choice(["user", "assistant"]), "content": sentence(rng),
                     "session": rng.choice(sessions)}
                    for _ in range(min(500, args.seed - start))
                ]
            )  # fmt: skip
        spent.clear()
        began = time.process_time()
        for _ in range(args.breakdown):
            engine.assemble(session=rng.choice(sessions), query=sentence(rng, 8), budget=4000)
        total = time.process_time() - began
    print(f"assemble, CPU ms per call over {args.breakdown} calls ({args.seed} messages stored)")
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


def run(
    args: argparse.Namespace, rng: random.Random, base: str, server: subprocess.Popen[bytes]
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
                {"role": rng.choice(["user", "assistant"]), "content": sentence(rng),
                 "session": rng.choice(sessions)}
                for _ in range(min(500, args.seed - start))
            ]  # fmt: skip
            client.post("/v1/ingest", json={"records": records}).raise_for_status()

    plan = rng.choices(["assemble", "ingest", "search"], weights=[70, 25, 5], k=args.requests)
    bodies = []
    for op in plan:
        session = rng.choice(sessions)
        if op == "assemble":
            bodies.append(("/v1/assemble", {"session": session, "query": sentence(rng, 8),
                                            "budget": 4000}))  # fmt: skip
        elif op == "ingest":
            bodies.append(("/v1/ingest", {"session": session,
                                          "records": [{"content": sentence(rng)}]}))  # fmt: skip
        else:
            bodies.append(("/v1/search", {"query": sentence(rng, 4), "limit": 20}))
    latencies: dict[str, list[float]] = {"assemble": [], "ingest": [], "search": []}
    errors: dict[str, int] = dict.fromkeys(latencies, 0)
    statuses: dict[int, int] = {}
    lock = threading.Lock()
    cursor = iter(range(args.requests))

    def worker() -> None:
        with httpx.Client(base_url=base, timeout=30) as client:
            while True:
                with lock:
                    index = next(cursor, None)
                if index is None:
                    return
                path, body = bodies[index]
                op = plan[index]
                began = time.perf_counter()
                try:
                    status = client.post(path, json=body).status_code
                except httpx.HTTPError:
                    status = 0
                took = time.perf_counter() - began
                with lock:
                    latencies[op].append(took)
                    statuses[status] = statuses.get(status, 0) + 1
                    if status != 200:
                        errors[op] += 1

    load_before = os.getloadavg()
    cpu_before = cpu_seconds(server.pid)
    began = time.perf_counter()
    threads = [threading.Thread(target=worker) for _ in range(args.connections)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - began
    server_cpu = cpu_seconds(server.pid) - cpu_before
    load_after = os.getloadavg()

    rate = args.requests / wall
    print(f"{args.requests} requests over {args.connections} connections in {wall:.1f} s: "
          f"{rate:.0f} req/s; statuses {dict(sorted(statuses.items()))}")  # fmt: skip
    print(f"{'operation':<10} {'count':>7} {'errors':>7} {'p50 ms':>8} {'p99 ms':>8}")
    for op, values in latencies.items():
        print(
            f"{op:<10} {len(values):>7} {errors[op]:>7} "
            f"{percentile(values, 0.5) * 1000:>8.1f} {percentile(values, 0.99) * 1000:>8.1f}"
        )
    metrics = dict(
        line.rsplit(" ", 1)
        for line in httpx.get(base + "/metrics").text.splitlines()
        if line.startswith("ctxwarden_assemble_seconds_")
    )
    count = float(metrics.get("ctxwarden_assemble_seconds_count", "nan"))
    inside = float(metrics.get("ctxwarden_assemble_seconds_sum", "nan")) / count
    print(f"assemble inside the server (engine.assemble, wall, mean): {inside * 1000:.1f} ms")
    print(
        f"server CPU {server_cpu:.1f} s = {server_cpu / args.requests * 1000:.1f} ms per request "
        f"(all operations); load average (1 min) {load_before[0]:.1f} before, "
        f"{load_after[0]:.1f} after, {os.cpu_count()} CPUs"
    )


if __name__ == "__main__":
    main()
