"""A real loopback server that streams chat completions as server-sent events (stdlib only)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class StreamingServer:
    """Answers every ``POST .../chat/completions`` with ``pieces`` as chunk events, then
    [DONE]; records each request body. ``status`` other than 200 answers a JSON error."""

    def __init__(self, pieces: list[str], *, status: int = 200) -> None:
        self.pieces = pieces
        self.status = status
        self.bodies: list[Any] = []
        self._server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    def __enter__(self) -> StreamingServer:
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                return

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                if not self.path.endswith("/chat/completions"):  # another server's endpoint
                    self.rfile.read(length)
                    self.send_error(404)
                    return
                owner.bodies.append(json.loads(self.rfile.read(length)))
                if owner.status != 200:
                    payload = json.dumps({"error": {"message": "bad request"}}).encode()
                    self.send_response(owner.status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                    return
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Connection", "close")
                self.end_headers()
                base = {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "m"}
                events = [{"role": "assistant", "content": ""}] + [
                    {"content": p} for p in owner.pieces
                ]
                for delta in events:
                    chunk = {
                        **base,
                        "choices": [{"index": 0, "delta": delta, "finish_reason": None}],
                    }
                    self.wfile.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
                    self.wfile.flush()
                end = {**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
                self.wfile.write(b"data: " + json.dumps(end).encode() + b"\n\n")
                self.wfile.write(b"data: [DONE]\n\n")
                self.wfile.flush()
                self.close_connection = True

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.shutdown()
        self._server.server_close()
