"""A real, scripted OpenAI-compatible HTTP server on 127.0.0.1 for tests (stdlib only).

Each request to ``/v1/chat/completions``, ``/v1/embeddings`` or ``/v1/models`` takes the next
:class:`Reply` from the script (or asks a responder function), and every request is recorded, so a
test drives the real client over a real socket and checks both sides.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Reply:
    """One scripted answer: a status, a JSON (or raw text) body, headers, a delay, or a drop."""

    body: Any = None
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0
    drop: bool = False  # close the connection without answering


@dataclass
class Recorded:
    method: str
    path: str
    headers: dict[str, str]
    body: Any


def completion(
    content: str | None,
    *,
    finish_reason: str = "stop",
    tool_calls: list[dict[str, Any]] | None = None,
    model: str = "scripted",
) -> dict[str, Any]:
    """A chat completion body as OpenAI servers send it."""
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if tool_calls is not None:
        message["tool_calls"] = tool_calls
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": finish_reason}],
        "usage": {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18},
    }


Script = (
    Iterable["Reply | str | dict[str, Any]"] | Callable[[Recorded], "Reply | str | dict[str, Any]"]
)


class ScriptedServer:
    """Serve scripted replies on an ephemeral loopback port; use as a context manager.

    A ``str`` in the script is the content of a chat completion, a ``dict`` is a full JSON body.
    When the script runs out, the server answers 500 "script exhausted" so the test sees it.
    Paths outside ``/v1/`` (other servers' own endpoints) get 404 and are kept in ``probes``,
    unless a responder function answers everything.
    """

    def __init__(self, script: Script = ()) -> None:
        self._responder = script if callable(script) else None
        self._queue: list[Reply | str | dict[str, Any]] = [] if callable(script) else list(script)
        self.requests: list[Recorded] = []
        self.probes: list[Recorded] = []
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        assert self._server is not None
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def chat_requests(self) -> list[Recorded]:
        return [r for r in self.requests if r.path.endswith("/chat/completions")]

    def _next(self, recorded: Recorded) -> Reply:
        if not recorded.path.startswith("/v1/") and self._responder is None:
            # a server-specific path (llama.cpp's /props, Ollama's /api/show): not this server's
            self.probes.append(recorded)
            return Reply(status=404, body={"error": {"message": "not found"}})
        with self._lock:
            self.requests.append(recorded)
            if self._responder is not None:
                item = self._responder(recorded)
            elif self._queue:
                item = self._queue.pop(0)
            else:
                item = Reply(status=500, body={"error": {"message": "script exhausted"}})
        if isinstance(item, Reply):
            return item
        if isinstance(item, str):
            return Reply(body=completion(item))
        return Reply(body=item)

    def __enter__(self) -> ScriptedServer:
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:  # quiet
                return

            def _handle(self, method: str) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                try:
                    body = json.loads(raw) if raw else None
                except ValueError:
                    body = raw.decode("utf-8", "replace")
                recorded = Recorded(method, self.path, dict(self.headers.items()), body)
                reply = owner._next(recorded)
                if reply.delay:
                    time.sleep(reply.delay)
                if reply.drop:
                    self.close_connection = True
                    self.connection.close()
                    return
                if isinstance(reply.body, str | bytes):
                    payload = reply.body.encode() if isinstance(reply.body, str) else reply.body
                    content_type = "text/plain"
                else:
                    payload = json.dumps(reply.body).encode()
                    content_type = "application/json"
                try:
                    self.send_response(reply.status)
                    self.send_header("Content-Type", content_type)
                    self.send_header("Content-Length", str(len(payload)))
                    for name, value in reply.headers.items():
                        self.send_header(name, value)
                    self.end_headers()
                    self.wfile.write(payload)
                except OSError:
                    # the client gave up (a timeout test); nothing to answer
                    return

            def do_POST(self) -> None:
                self._handle("POST")

            def do_GET(self) -> None:
                self._handle("GET")

        class Server(ThreadingHTTPServer):
            daemon_threads = True

            def handle_error(self, request: Any, client_address: Any) -> None:
                return  # a client that hung up mid-reply is expected in timeout tests

        self._server = Server(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True
        )
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._server is not None
        assert self._thread is not None
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
