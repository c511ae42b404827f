"""The chat-completions proxy replaying a long agent session, and its added latency.

    python bench/proxy.py [--turns 500] [--window 32768] [--sizes 1000,20000] [--runs 40]

Everything runs over loopback: the proxy app under uvicorn (a temporary SQLite store) in front
of a minimal OpenAI-compatible upstream that answers a canned completion without parsing the
request (so its own time is small and the same for every request), and a client that sends
bodies serialised before the clock starts.

Text is chat-like: made-up words drawn Zipf-like (bench/chat_text.py).

(1) Replay: a generated agent session of ``--turns`` user turns (seed fixed; nothing from the dev
data): each turn is a question, then in 60 % of turns one to three tool rounds (one or two
parallel calls, results of 40 to 400 words), then the answer. Every model call is one request
carrying the whole conversation so far, with ``X-Ctxwarden-Session`` (memory on) and
``X-Ctxwarden-Window`` (so that a 500-turn session overflows and is trimmed). It prints the share
of requests whose upstream messages begin with all of the previous request's (what a provider's
prompt cache can reuse; target >= 90 %), the tokens sent upstream against the tokens of sending
every conversation whole, and how many requests were trimmed.

(2) Added latency at ``--sizes`` messages (40-word messages; 20,000 of them are ~6 MB of JSON):
each run sends the conversation grown by one turn through the proxy, and, as baselines, straight
to the upstream (a) the request the proxy sent upstream (trimmed to the window: the strict
baseline, which charges the proxy for receiving the whole body) and (b) the client's own request
(what the client would send without a proxy). Added = through-proxy minus direct, p50 and p99
over ``--runs`` runs (targets: <= 5 ms p50 at 1,000 messages, <= 30 ms at 20,000), with the
proxy's own in-handler time from its report (``proxy_ms``) beside it, for requests naming nobody
(fitting only) and naming a session (stored, memory on). The runs of the three paths
interleave, so a burst of load on the machine touches all three alike. Beside them, the added
CPU time of this process (``time.process_time``, every thread: the client, uvicorn, the proxy's
handler and store threads, the upstream) through the proxy against (a): on a loaded machine
wall times grow with the load, CPU times much less.
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import socket
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import orjson
import uvicorn

from ctxwarden import Engine
from ctxwarden.llm import LLMClient
from ctxwarden.server.proxy import ProxyConfig, create_proxy_app

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/chat_text.py
import chat_text

ANSWER = orjson.dumps(
    {
        "id": "chatcmpl-bench",
        "object": "chat.completion",
        "created": 1,
        "model": "bench",
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}
        ],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }
)


class Upstream:
    """A minimal OpenAI-compatible upstream: reads the body, keeps it, answers ``ANSWER``."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []
        self.keep = True
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            # headers and body go out in separate writes: without this, Nagle holds the body
            # until the client's delayed ACK (40 ms)
            disable_nagle_algorithm = True

            def log_message(self, format: str, *args: Any) -> None:
                return

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if not self.path.endswith("/chat/completions"):
                    self.send_response(404)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                if owner.keep:
                    owner.bodies.append(body)
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(ANSWER)))
                self.end_headers()
                self.wfile.write(ANSWER)

            def do_GET(self) -> None:
                self.send_response(404)
                self.send_header("Content-Length", "0")
                self.end_headers()

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@contextmanager
def serve(app: Any) -> Iterator[str]:
    """The app under uvicorn on a free loopback port."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off", ws="none"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()


class Text:
    """Chat-like text: made-up words drawn Zipf-like over 3,000 (bench/chat_text.py), so a
    question's terms match a small share of the messages, as in real chat (a few dozen words
    drawn uniformly would put every term in every other message)."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.vocab = chat_text.vocabulary(self.rng)
        self.weights = chat_text.zipf_weights(len(self.vocab))
        self.lengths = random.Random(seed)

    def __call__(self, low: int, high: int) -> str:
        count = self.lengths.randint(low, high)
        return chat_text.sentence(self.rng, self.vocab, self.weights, words=count)


def session(turns: int, seed: int = 16) -> Iterator[list[dict[str, Any]]]:
    """The conversation at each model call of a generated agent session."""
    rng = random.Random(seed)
    words = Text(seed)
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a coding agent. " + words(60, 60)}
    ]
    calls = 0
    for turn in range(turns):
        messages.append({"role": "user", "content": f"task {turn}: " + words(10, 60)})
        yield list(messages)
        rounds = rng.choice([1, 2, 3]) if rng.random() < 0.6 else 0
        for _ in range(rounds):
            ids = [f"call_{calls + i}" for i in range(rng.choice([1, 1, 2]))]
            calls += len(ids)
            messages.append(
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": i,
                            "type": "function",
                            "function": {
                                "name": "read_file",
                                "arguments": json.dumps({"path": f"src/{i}.py"}),
                            },
                        }
                        for i in ids
                    ],
                }
            )
            for i in ids:
                messages.append({"role": "tool", "tool_call_id": i, "content": words(40, 400)})
            yield list(messages)
        messages.append({"role": "assistant", "content": words(10, 80)})


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(share * (len(ordered) - 1)))]


def replay(url: str, upstream: Upstream, turns: int, window: int) -> dict[str, Any]:
    headers = {
        "Content-Type": "application/json",
        "X-Ctxwarden-Session": "bench-agent",
        "X-Ctxwarden-Window": str(window),
    }
    sent_tokens = whole_tokens = trimmed = requests = 0
    upstream.bodies.clear()
    with httpx.Client(timeout=120) as client:
        for messages in session(turns):
            body = orjson.dumps({"model": "gpt-4o", "messages": messages})
            response = client.post(url + "/v1/chat/completions", content=body, headers=headers)
            response.raise_for_status()
            report = json.loads(response.headers["x-ctxwarden-report"])
            sent_tokens += report["tokens"]
            whole_tokens += report["conversation_tokens"]
            trimmed += not report["unchanged"]
            requests += 1
    sent = [orjson.loads(b)["messages"] for b in upstream.bodies]
    kept_prefix = sum(
        1 for before, after in itertools.pairwise(sent) if after[: len(before)] == before
    )
    return {
        "requests": requests,
        "prefix_share": kept_prefix / max(1, len(sent) - 1),
        "sent_tokens": sent_tokens,
        "whole_tokens": whole_tokens,
        "trimmed": trimmed,
    }


def conversation(size: int, seed: int) -> list[dict[str, Any]]:
    words = Text(seed)
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are helpful."}]
    while len(messages) < size - 1:
        messages.append({"role": "user", "content": words(40, 40)})
        messages.append({"role": "assistant", "content": words(40, 40)})
    messages.append({"role": "user", "content": words(40, 40)})
    return messages[:size]


def latency(
    url: str, upstream: Upstream, size: int, runs: int, named: bool
) -> tuple[list[float], list[float], list[float], list[float]]:
    """Added milliseconds against the forwarded request sent direct and against the client's
    own request sent direct, the proxy's in-handler ms, and the added CPU milliseconds of this
    process (client, proxy and upstream all run in it) against the forwarded request."""
    words = Text(size + 1)
    messages = conversation(size, seed=size)
    headers = {"Content-Type": "application/json"}
    if named:
        headers["X-Ctxwarden-Session"] = f"latency-{size}"
    added: list[float] = []
    added_whole: list[float] = []
    inside: list[float] = []
    cpu: list[float] = []
    upstream.keep = True
    with httpx.Client(timeout=120) as client:
        for run in range(runs + 2):  # two warm-up runs: the counts of the history get cached
            # the conversation grows by a turn, as an agent's does
            messages = [*messages, {"role": "assistant", "content": words(40, 40)},
                        {"role": "user", "content": words(40, 40)}]  # fmt: skip
            body = orjson.dumps({"model": "gpt-4o", "messages": messages})
            upstream.bodies.clear()
            start, cpu_start = time.perf_counter(), time.process_time()
            response = client.post(url + "/v1/chat/completions", content=body, headers=headers)
            through, through_cpu = time.perf_counter() - start, time.process_time() - cpu_start
            response.raise_for_status()
            forwarded = upstream.bodies[-1]
            # what the proxy does once the answer is sent (store the reply) is not added
            # latency: let it finish so its CPU time falls in neither measurement
            time.sleep(0.05)
            start, cpu_start = time.perf_counter(), time.process_time()
            client.post(upstream.url + "/chat/completions", content=forwarded, headers=headers)
            direct, direct_cpu = time.perf_counter() - start, time.process_time() - cpu_start
            upstream.keep = False
            start = time.perf_counter()
            client.post(upstream.url + "/chat/completions", content=body, headers=headers)
            whole = time.perf_counter() - start
            upstream.keep = True
            if run >= 2:
                added.append((through - direct) * 1000)
                added_whole.append((through - whole) * 1000)
                inside.append(json.loads(response.headers["x-ctxwarden-report"])["proxy_ms"])
                cpu.append((through_cpu - direct_cpu) * 1000)
    return added, added_whole, inside, cpu


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--turns", type=int, default=500)
    parser.add_argument("--window", type=int, default=32768)
    parser.add_argument("--sizes", default="1000,20000")
    parser.add_argument("--runs", type=int, default=40)
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",") if s]
    upstream = Upstream()
    with tempfile.TemporaryDirectory() as folder:
        engine = Engine.open(Path(folder) / "bench.db")
        try:
            with LLMClient(upstream.url, max_retries=0, timeout=120) as llm:
                app = create_proxy_app(engine, llm, ProxyConfig(probe_window=False))
                with serve(app) as url:
                    result = replay(url, upstream, args.turns, args.window)
                    rows = []
                    for size in sizes:
                        for named in (False, True):
                            measured = latency(url, upstream, size, args.runs, named)
                            rows.append((size, named, *measured))
        finally:
            engine.close()
            upstream.close()
    out = sys.stdout
    out.write(f"replay: {args.turns} turns, {result['requests']} requests, window {args.window}\n")
    out.write("| measure | value | target |\n|---|---|---|\n")
    out.write(
        f"| upstream prefix = previous request's | {result['prefix_share']:.1%} | >= 90 % |\n"
    )
    share = result["sent_tokens"] / max(1, result["whole_tokens"])
    out.write(
        f"| tokens sent upstream / sending everything | {result['sent_tokens']:,} / "
        f"{result['whole_tokens']:,} ({share:.1%}) | |\n"
    )
    out.write(f"| requests trimmed | {result['trimmed']} of {result['requests']} | |\n")
    out.write(
        "\n| messages | named | added p50 ms (a) | added p99 ms (a) | added p50 ms (b) "
        "| added p99 ms (b) | in-proxy p50 ms | added CPU p50 ms (a) | target p50 |\n"
    )
    out.write("|---|---|---|---|---|---|---|---|---|\n")
    for size, named, added, added_whole, inside, cpu in rows:
        target = "<= 5 ms" if size <= 1000 else "<= 30 ms"
        out.write(
            f"| {size:,} | {'session' if named else 'nobody'} | {statistics.median(added):.1f} | "
            f"{percentile(added, 0.99):.1f} | {statistics.median(added_whole):.1f} | "
            f"{percentile(added_whole, 0.99):.1f} | {statistics.median(inside):.1f} | "
            f"{statistics.median(cpu):.1f} | {target} |\n"
        )
    out.write(
        "\n(a) against the trimmed request the proxy forwarded, sent direct; (b) against the "
        "client's own request sent direct; added CPU: this process's CPU time (client, proxy "
        "and upstream all run in it) through the proxy minus sending (a), which other load on "
        "the machine distorts far less than wall time\n"
    )


if __name__ == "__main__":
    main()
