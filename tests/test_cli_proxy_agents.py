"""``ctxwarden proxy --anthropic-upstream`` as a user runs it (a real subprocess): the Messages
upstream and its key come from the command line and the environment, never from the request;
the OpenAI Responses face goes to ``--upstream``. Upstream: the fake written from the published
API schemas (tests/agentupstream.py)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import anthropic
import httpx
import openai

from agentupstream import AgentUpstream, Step


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_proxy_command_serves_messages_and_responses(tmp_path: Path) -> None:
    with AgentUpstream([Step("from claude"), Step("from responses")]) as upstream:
        port = _free_port()
        env = {
            **os.environ,
            "CTXWARDEN_ANTHROPIC_API_KEY": "sk-ant-from-env",
            "CTXWARDEN_UPSTREAM_API_KEY": "sk-openai-from-env",
        }
        process = subprocess.Popen(
            [sys.executable, "-m", "ctxwarden", "--db", str(tmp_path / "p.db"), "proxy",
             "--upstream", upstream.url, "--anthropic-upstream", upstream.url,
             "--port", str(port), "--no-auth"],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        )  # fmt: skip
        base = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 60
            while True:
                assert process.poll() is None, process.stdout.read() if process.stdout else ""
                try:
                    if httpx.get(base + "/health", timeout=1).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                assert time.monotonic() < deadline, "the proxy did not start"
                time.sleep(0.1)
            with anthropic.Anthropic(base_url=base, api_key="agent-key", max_retries=0) as claude:
                reply = claude.messages.create(
                    model="claude-sonnet-5",
                    max_tokens=32,
                    messages=[{"role": "user", "content": "hi"}],
                )
            assert reply.content[0].type == "text"
            assert reply.content[0].text == "from claude"
            with openai.OpenAI(base_url=base + "/v1", api_key="agent-key", max_retries=0) as gpt:
                assert gpt.responses.create(model="gpt-4o", input="hi").output_text == (
                    "from responses"
                )
        finally:
            process.terminate()
            process.wait(20)
            if process.stdout is not None:
                process.stdout.close()
    sent = {r.path: r.headers for r in upstream.requests}
    assert sent["/v1/messages"]["x-api-key"] == "sk-ant-from-env"
    assert "authorization" not in sent["/v1/messages"]
    assert sent["/v1/responses"]["authorization"] == "Bearer sk-openai-from-env"
