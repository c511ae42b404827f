"""An upstream fake written from the published OpenAI Responses and Anthropic Messages API schemas.

llama.cpp's server (llama-cpp-python 0.3.36, the one in the dev environment) serves neither
``/v1/responses`` nor ``/v1/messages``, so the end-to-end tests of those faces run against this
scripted server instead: a real HTTP server on 127.0.0.1 (stdlib only) whose bodies and
server-sent events carry the names and shapes the API references document (Responses:
``response.created`` ... ``response.completed``; Messages: ``message_start`` ...
``message_stop``, ``/v1/messages/count_tokens``). Every request is recorded, so a test checks
both what the client got and what the upstream got.

Each request takes the next :class:`Step` from the script (or asks a responder function). Its
token counts are a stand-in tokenizer (one token per 4 bytes of the request's JSON), the same in
``usage`` and in ``count_tokens``, so a test can tell which count the proxy used.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Step:
    """One scripted model turn: text, tool calls ``(name, arguments)``, or an error status."""

    text: str | None = None
    calls: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    status: int = 200
    error: str = "scripted error"
    cached: int = 0  # what the provider reports as read from its prompt cache


@dataclass
class Recorded:
    path: str
    headers: dict[str, str]
    body: Any


def stand_in_count(body: Any) -> int:
    """The fake's token count of a request: one per 4 bytes of its compact JSON."""
    names = ("system", "messages", "tools", "instructions", "input")
    fields = {k: body[k] for k in names if k in body}
    return len(json.dumps(fields, separators=(",", ":"))) // 4 + 1


Script = Iterable[Step] | Callable[[Recorded], Step]


class AgentUpstream:
    """Serve scripted Responses and Messages answers on an ephemeral loopback port."""

    def __init__(self, script: Script = (), *, counts: bool = True) -> None:
        self._responder = script if callable(script) else None
        self._queue: list[Step] = [] if callable(script) else list(script)
        self.counts = counts
        self.requests: list[Recorded] = []
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._ids = 0

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    def bodies(self, path: str) -> list[Any]:
        """The bodies received at ``path`` (``"/v1/responses"``, ``"/v1/messages"``...)."""
        return [r.body for r in self.requests if r.path == path]

    def _next(self, recorded: Recorded) -> Step:
        with self._lock:
            self.requests.append(recorded)
            self._ids += 1
            if self._responder is not None:
                return self._responder(recorded)
            if self._queue:
                return self._queue.pop(0)
            return Step(status=500, error="script exhausted")

    def _id(self, prefix: str) -> str:
        with self._lock:
            self._ids += 1
            return f"{prefix}_{self._ids:04d}"

    # -- OpenAI Responses

    def response(self, step: Step, body: Any) -> dict[str, Any]:
        """A Response object as the API reference shows it."""
        output: list[dict[str, Any]] = []
        if step.text is not None:
            output.append(
                {
                    "type": "message",
                    "id": self._id("msg"),
                    "status": "completed",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": step.text, "annotations": []}],
                }
            )
        for name, arguments in step.calls:
            output.append(
                {
                    "type": "function_call",
                    "id": self._id("fc"),
                    "call_id": self._id("call"),
                    "name": name,
                    "arguments": json.dumps(arguments),
                    "status": "completed",
                }
            )
        prompt = stand_in_count(body)
        out = sum(len(json.dumps(o)) // 4 for o in output)
        return {
            "id": self._id("resp"),
            "object": "response",
            "created_at": 1764000000,
            "status": "completed",
            "error": None,
            "incomplete_details": None,
            "instructions": body.get("instructions"),
            "max_output_tokens": body.get("max_output_tokens"),
            "model": body.get("model"),
            "output": output,
            "parallel_tool_calls": True,
            "previous_response_id": body.get("previous_response_id"),
            "reasoning": {"effort": None, "summary": None},
            "store": True,
            "temperature": 1.0,
            "text": {"format": {"type": "text"}},
            "tool_choice": "auto",
            "tools": body.get("tools") or [],
            "top_p": 1.0,
            "truncation": "disabled",
            "usage": {
                "input_tokens": prompt,
                "input_tokens_details": {"cached_tokens": step.cached},
                "output_tokens": out,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": prompt + out,
            },
            "metadata": {},
        }

    def response_events(self, final: dict[str, Any]) -> Iterator[dict[str, Any]]:
        """The streaming events of ``final``, in the documented order."""
        started = {**final, "status": "in_progress", "output": [], "usage": None}
        yield {"type": "response.created", "response": started}
        yield {"type": "response.in_progress", "response": started}
        for index, item in enumerate(final["output"]):
            if item["type"] == "message":
                text = item["content"][0]["text"]
                yield {
                    "type": "response.output_item.added",
                    "output_index": index,
                    "item": {**item, "status": "in_progress", "content": []},
                }
                part = {"type": "output_text", "text": "", "annotations": []}
                where = {"item_id": item["id"], "output_index": index, "content_index": 0}
                yield {"type": "response.content_part.added", **where, "part": part}
                for piece in _pieces(text):
                    yield {
                        "type": "response.output_text.delta",
                        **where,
                        "delta": piece,
                        "logprobs": [],
                    }
                yield {"type": "response.output_text.done", **where, "text": text, "logprobs": []}
                yield {
                    "type": "response.content_part.done",
                    **where,
                    "part": {**part, "text": text},
                }
            else:
                yield {
                    "type": "response.output_item.added",
                    "output_index": index,
                    "item": {**item, "status": "in_progress", "arguments": ""},
                }
                where = {"item_id": item["id"], "output_index": index}
                yield {
                    "type": "response.function_call_arguments.delta",
                    **where,
                    "delta": item["arguments"],
                }
                yield {
                    "type": "response.function_call_arguments.done",
                    **where,
                    "name": item["name"],
                    "arguments": item["arguments"],
                }
            yield {"type": "response.output_item.done", "output_index": index, "item": item}
        yield {"type": "response.completed", "response": final}

    # -- Anthropic Messages

    def message(self, step: Step, body: Any) -> dict[str, Any]:
        """A Message object as the API reference shows it."""
        content: list[dict[str, Any]] = []
        if step.text is not None:
            content.append({"type": "text", "text": step.text})
        for name, arguments in step.calls:
            content.append(
                {"type": "tool_use", "id": self._id("toolu"), "name": name, "input": arguments}
            )
        prompt = stand_in_count(body)
        return {
            "id": self._id("msg"),
            "type": "message",
            "role": "assistant",
            "model": body.get("model"),
            "content": content,
            "stop_reason": "tool_use" if step.calls else "end_turn",
            "stop_sequence": None,
            "usage": {
                "input_tokens": prompt - step.cached,
                "output_tokens": sum(len(json.dumps(c)) // 4 for c in content),
                "cache_creation_input_tokens": 0,
                "cache_read_input_tokens": step.cached,
            },
        }

    def message_events(self, final: dict[str, Any]) -> Iterator[dict[str, Any]]:
        """The streaming events of ``final``, in the documented order."""
        usage = {**final["usage"], "output_tokens": 1}
        start = {**final, "content": [], "stop_reason": None, "usage": usage}
        yield {"type": "message_start", "message": start}
        yield {"type": "ping"}
        for index, block in enumerate(final["content"]):
            if block["type"] == "text":
                yield {
                    "type": "content_block_start",
                    "index": index,
                    "content_block": {"type": "text", "text": ""},
                }
                for piece in _pieces(block["text"]):
                    yield {
                        "type": "content_block_delta",
                        "index": index,
                        "delta": {"type": "text_delta", "text": piece},
                    }
            else:
                yield {
                    "type": "content_block_start",
                    "index": index,
                    "content_block": {**block, "input": {}},
                }
                text = json.dumps(block["input"])
                for piece in (text[: len(text) // 2], text[len(text) // 2 :]):
                    yield {
                        "type": "content_block_delta",
                        "index": index,
                        "delta": {"type": "input_json_delta", "partial_json": piece},
                    }
            yield {"type": "content_block_stop", "index": index}
        yield {
            "type": "message_delta",
            "delta": {"stop_reason": final["stop_reason"], "stop_sequence": None},
            "usage": {"output_tokens": final["usage"]["output_tokens"]},
        }
        yield {"type": "message_stop"}

    # -- the server

    def __enter__(self) -> AgentUpstream:
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                return

            def _json(self, status: int, payload: Any) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _events(self, events: Iterator[dict[str, Any]]) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Connection", "close")
                self.end_headers()
                for number, event in enumerate(events):
                    if self.path.endswith("/responses"):
                        event = {**event, "sequence_number": number}
                    line = f"event: {event['type']}\ndata: {json.dumps(event)}\n\n"
                    self.wfile.write(line.encode())
                    self.wfile.flush()
                self.close_connection = True

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"null")
                headers = {k.lower(): v for k, v in self.headers.items()}
                recorded = Recorded(self.path, headers, body)
                if self.path == "/v1/messages/count_tokens":
                    with owner._lock:
                        owner.requests.append(recorded)
                    if not owner.counts:
                        self._json(404, {"type": "error", "error": {
                            "type": "not_found_error", "message": "Not Found"}})  # fmt: skip
                        return
                    self._json(200, {"input_tokens": stand_in_count(body)})
                    return
                if self.path not in ("/v1/messages", "/v1/responses"):
                    self._json(404, {"error": {"message": f"no route {self.path}"}})
                    return
                step = owner._next(recorded)
                anthropic = self.path == "/v1/messages"
                if step.status != 200:
                    if anthropic:
                        error = {"type": "error", "error": {
                            "type": "invalid_request_error", "message": step.error}}  # fmt: skip
                    else:
                        error = {"error": {"message": step.error, "type": "invalid_request_error",
                                           "param": None, "code": None}}  # fmt: skip
                    self._json(step.status, error)
                    return
                if anthropic:
                    final = owner.message(step, body)
                    events = owner.message_events(final)
                else:
                    final = owner.response(step, body)
                    events = owner.response_events(final)
                if body.get("stream"):
                    self._events(events)
                else:
                    self._json(200, final)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.shutdown()
        self._server.server_close()


def _pieces(text: str) -> list[str]:
    words = text.split(" ")
    return [w + (" " if i < len(words) - 1 else "") for i, w in enumerate(words)] or [""]
