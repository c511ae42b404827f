"""``ctxwarden proxy`` as a user runs it (a real subprocess on a loopback port): its body limit
is 32 MiB unless ``--max-body-bytes`` says otherwise."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from llmserver import Recorded, Reply, ScriptedServer, completion


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def proxy(tmp_path: Path, upstream: str, *args: str) -> Iterator[str]:
    port = _free_port()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    log_path = tmp_path / f"proxy-{port}.log"
    log = log_path.open("wb")
    process = subprocess.Popen(
        [sys.executable, "-m", "ctxwarden", "--db", str(tmp_path / "p.db"), "proxy",
         "--upstream", upstream, "--port", str(port), "--no-auth", *args],
        stdout=log, stderr=subprocess.STDOUT, env=env,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert process.poll() is None, log_path.read_text(errors="replace")
            assert time.monotonic() < deadline, "the proxy did not start"
            time.sleep(0.1)
        yield url
    finally:
        process.terminate()
        process.wait(20)
        log.close()


def _answer(recorded: Recorded) -> Reply:
    if recorded.path.endswith("/chat/completions"):
        return Reply(body=completion("ok"))
    return Reply(status=404, body={"error": {"message": "not found"}})


def _body(size: int) -> dict[str, object]:
    """About ``size`` bytes of conversation, in messages of 500 characters."""
    messages = [
        {"role": "user", "content": f"note {i} " + "word " * 100} for i in range(size // 520)
    ]
    return {"model": "gpt-4o", "messages": messages or [{"role": "user", "content": "hi"}]}


def test_the_cli_proxy_takes_a_2_mb_body_by_default_and_honours_max_body_bytes(
    tmp_path: Path,
) -> None:
    with ScriptedServer(_answer) as upstream:
        with proxy(tmp_path, upstream.url) as url:
            answer = httpx.post(url + "/v1/chat/completions", json=_body(2_000_000), timeout=60)
            assert answer.status_code == 200, answer.text
        with proxy(tmp_path, upstream.url, "--max-body-bytes", "5000") as url:
            refused = httpx.post(url + "/v1/chat/completions", json=_body(10_000), timeout=60)
            assert refused.status_code == 413
            assert "5000 bytes" in refused.json()["error"]["message"]
            assert httpx.post(url + "/v1/chat/completions", json=_body(100)).status_code == 200
