"""An MCP server over one engine (the official ``mcp`` SDK): stdio and streamable HTTP.

Tools: ``summarize_text`` (text -> summary within ``max_tokens``), ``remember`` (store a note),
``recall`` (search memories, as many as fit ``max_tokens``), ``forget`` (delete one) and
``assemble_context`` (a whole context for a session). Every tool works in the server's one
tenant. Errors reach the client as tool errors carrying the ctxwarden message.

>>> from ctxwarden import Engine
>>> server = create_mcp_server(Engine.open(":memory:"))
>>> server.name
'ctxwarden'
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

from ctxwarden import tokens
from ctxwarden.engine import Engine
from ctxwarden.errors import CtxwardenError, InputError
from ctxwarden.render import line_text
from ctxwarden.summarize import ExtractiveSummarizer, SummaryItem

__all__ = ["create_mcp_server"]


@contextmanager
def _tool_errors() -> Iterator[None]:
    """Our errors reach the client with their message (the SDK hides other exceptions)."""
    try:
        yield
    except CtxwardenError as exc:
        raise ToolError(f"{type(exc).__name__}: {exc}") from exc


def create_mcp_server(
    engine: Engine, *, tenant: str | None = None, session: str = "mcp"
) -> MCPServer:
    """An MCP server whose tools read and write ``tenant`` (the engine's default if None).

    ``session`` is where ``remember`` stores notes unless the call names another one.
    """
    tenant = tenant or engine.config.tenant
    notes_session = session
    server = MCPServer(
        "ctxwarden",
        instructions=(
            "Long-term memory for this agent: remember facts, recall them within a token budget, "
            "forget them, summarise text, and assemble a context that fits a model's window."
        ),
    )
    summarizer = ExtractiveSummarizer(cite_sources=False)

    def tokenizer() -> tokens.Tokenizer:
        spec = engine.registry.resolve(engine.config.default_model)
        return tokens.get_tokenizer(spec.tokenizer)

    @server.tool()
    def summarize_text(text: str, max_tokens: int = 128) -> str:
        """Summarise ``text`` extractively (offline); the summary counts at most max_tokens."""
        with _tool_errors():
            if not text.strip():
                raise InputError("is empty: pass the text to summarise", field="text")
            if max_tokens < 16:
                raise InputError(f"{max_tokens} is below 16", field="max_tokens")
            paragraphs = [p.strip() for p in text.split("\n") if p.strip()]
            items = [SummaryItem(id=f"p{i}", content=p) for i, p in enumerate(paragraphs, start=1)]
            summary = summarizer.summarize(items, max_tokens=max_tokens, tokenizer=tokenizer())
            return summary.render()

    @server.tool()
    def remember(
        content: str, session: str | None = None, pinned: bool = False, kind: str = "fact"
    ) -> dict[str, Any]:
        """Store a note (``kind`` fact or message); returns its id and what happened to it."""
        with _tool_errors():
            if kind not in ("fact", "message"):
                raise InputError(f"{kind!r} is not fact or message", field="kind")
            record = {
                "id": f"mcp-{uuid.uuid4().hex[:16]}",
                "content": content,
                "role": "user",
                "author_kind": "agent",
                "kind": kind,
                "pinned": pinned,
                "created_at": time.time(),
            }
            result = engine.ingest([record], tenant=tenant, session=session or notes_session)
            outcome = result.outcomes[0]
            return {"id": outcome.duplicate_of or outcome.id, "status": outcome.status}

    @server.tool()
    def recall(query: str, max_tokens: int = 512, limit: int = 50) -> dict[str, Any]:
        """Memories matching ``query``, best first, as many as fit in max_tokens."""
        with _tool_errors():
            if max_tokens < 1:
                raise InputError(f"{max_tokens} must be at least 1", field="max_tokens")
            tok = tokenizer()
            hits = engine.search(query, tenant=tenant, limit=limit)
            chosen: list[dict[str, Any]] = []
            used = 0
            for memory, score in hits:
                text = line_text(memory)
                cost = tok.count(text)
                if used + cost > max_tokens:
                    continue
                used += cost
                chosen.append(
                    {"id": memory.id, "text": text.rstrip("\n"), "score": round(score, 4)}
                )
            return {"memories": chosen, "tokens": used, "max_tokens": max_tokens}

    @server.tool()
    def forget(id: str) -> dict[str, Any]:
        """Delete the memory ``id`` (a content-free tombstone remains)."""
        with _tool_errors():
            engine.delete(id, tenant=tenant, reason="forgotten over MCP")
            return {"deleted": id}

    @server.tool()
    def assemble_context(
        session: str,
        query: str | None = None,
        model: str | None = None,
        budget: int | None = None,
        system: str | None = None,
    ) -> dict[str, Any]:
        """The messages to send a model for this session's next turn, within its window."""
        with _tool_errors():
            context = engine.assemble(
                session=session,
                query=query,
                model=model,
                budget=budget,
                system=system,
                tenant=tenant,
            )
            return {
                "messages": list(context.messages),
                "tokens": context.tokens,
                "cap": context.report.cap,
                "included": list(context.included),
            }

    return server
