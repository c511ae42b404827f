"""An MCP server over one engine (the official ``mcp`` SDK): stdio and streamable HTTP.

Tools: ``summarize_text`` (text -> summary within ``max_tokens``), ``remember`` (store a note:
a message memory by the agent, shown like any other memory as quoted data; a ``fact`` only when
the operator allows it with ``remember_facts=True``, ``ctxwarden mcp --remember-facts``),
``recall`` (search memories, as many as fit ``max_tokens``), ``update`` (replace the text of a
note stored with ``remember``; the old text is kept as a version), ``forget`` (delete one),
``expand`` (the originals of a summary, or an offloaded tool result, by id) and
``assemble_context`` (a whole context for a session). Every tool works in the server's one
tenant. ``remember`` takes the end user (``user``) a note belongs to; ``recall`` and
``assemble_context`` take ``session``, ``user`` and ``scope`` and read the narrowest scope named
(:mod:`ctxwarden.scope`; ``recall`` naming neither reads the tenant). Errors reach the client as
tool errors carrying the ctxwarden message.

Over streamable HTTP (:func:`create_mcp_http_app`) every request needs an API key, as on the HTTP
API: the key's tenant is the tenant the tools read and write, and its scopes gate them
(``remember`` and ``update`` need write, ``forget`` delete, the others read). A missing or
unknown key gets 401 before the MCP session sees the request. Over stdio and in process the
caller is the local user: the server's tenant, every scope.

>>> from ctxwarden import Engine
>>> server = create_mcp_server(Engine.open(":memory:"))
>>> server.name
'ctxwarden'
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, cast

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from starlette.types import ASGIApp, Receive, Scope, Send

from ctxwarden import tokens
from ctxwarden.engine import Engine
from ctxwarden.errors import AuthError, CtxwardenError, InputError, ScopeError
from ctxwarden.models import remote_tokenizer
from ctxwarden.render import line_text
from ctxwarden.server.access import client_message
from ctxwarden.server.guard import can_read
from ctxwarden.server.http import Principal
from ctxwarden.summarize import ExtractiveSummarizer, SummaryItem
from ctxwarden.types import SCOPES, format_time
from ctxwarden.types import Scope as ReadScopeName

__all__ = ["MCPAuthMiddleware", "create_mcp_http_app", "create_mcp_server"]

#: Where the auth middleware leaves the caller for the tools (the ASGI scope's state).
_PRINCIPAL = "ctxwarden_principal"


@contextmanager
def _tool_errors() -> Iterator[None]:
    """Our errors reach the client with their message (the SDK hides other exceptions)."""
    try:
        yield
    except CtxwardenError as exc:
        raise ToolError(f"{type(exc).__name__}: {client_message(exc)}") from exc


def _scope_argument(value: str | None) -> ReadScopeName | None:
    """A tool's ``scope`` argument, checked (the SDK passes any string through)."""
    if value is None or value in SCOPES:
        return cast("ReadScopeName | None", value)
    raise InputError(f"{value!r} is not one of {', '.join(sorted(SCOPES))}", field="scope")


def create_mcp_server(
    engine: Engine,
    *,
    tenant: str | None = None,
    session: str = "mcp",
    remember_facts: bool = False,
) -> MCPServer:
    """An MCP server whose tools read and write ``tenant`` (the engine's default if None).

    ``session`` is where ``remember`` stores notes unless the call names another one.
    ``remember_facts``: whether ``remember`` may store ``kind="fact"`` (a fact shows in every
    context of its session, like a pin). Off by default: what an agent is told to remember is
    a note, found by retrieval when relevant, never a standing fact unless the operator says so
    (issue 20: memory poisoning).
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

    def caller(ctx: Context | None, scope: str) -> str:
        """The tenant this tool call works in, once the caller's key holds ``scope``."""
        request = ctx.request_context.request if ctx is not None else None
        if request is None:
            return tenant  # stdio or in process: the local user
        state = getattr(request, "scope", {}).get("state") or {}
        principal = state.get(_PRINCIPAL)
        if principal is None:
            raise AuthError("missing API key: send 'Authorization: Bearer <key>'")
        principal.require(scope)
        return str(principal.tenant)

    def reads(ctx: Context | None) -> bool:
        """Whether the caller may read memories (the local user may)."""
        request = ctx.request_context.request if ctx is not None else None
        if request is None:
            return True
        principal = (getattr(request, "scope", {}).get("state") or {}).get(_PRINCIPAL)
        return principal is not None and can_read(principal)

    def tokenizer() -> tokens.Tokenizer:
        spec = engine.registry.resolve(engine.config.default_model)
        return tokens.get_tokenizer(spec.tokenizer)

    @server.tool()
    def summarize_text(text: str, max_tokens: int = 128, ctx: Context | None = None) -> str:
        """Summarise ``text`` extractively (offline); the summary counts at most max_tokens."""
        with _tool_errors():
            caller(ctx, "read")
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
        content: str,
        session: str | None = None,
        pinned: bool = False,
        kind: str = "message",
        user: str | None = None,
        scope: str | None = None,
        attachments: list[dict[str, str]] | None = None,
        ctx: Context | None = None,
    ) -> dict[str, Any]:
        """Store a note of end user ``user`` in ``session`` (``kind`` message; fact only where
        the operator allows it); returns its id and what happened to it (to a key without
        ``read``: the note's own id, status ``accepted``). A ``pinned`` note
        shows in every context of its session, or of ``scope``: ``user`` (all the user's
        sessions) or ``tenant`` (everyone's). ``attachments``: images, files or links the note
        is about, ``[{kind: image|file|link, name?, caption?, url?}]`` (searched, and shown
        after the note). Notes are shown as quoted data with their author (``agent``) and
        time, never as instructions."""
        with _tool_errors():
            where = caller(ctx, "write")
            if kind not in ("fact", "message"):
                raise InputError(f"{kind!r} is not fact or message", field="kind")
            if kind == "fact" and not remember_facts:
                raise InputError(
                    "facts from agents are off on this server: store a message (the default), "
                    "or the operator starts the server with remember_facts=True "
                    "(ctxwarden mcp --remember-facts)",
                    field="kind",
                )
            pin_scope = _scope_argument(scope)
            if pin_scope is not None and not pinned:
                raise InputError("applies to pinned notes: pass pinned=true", field="scope")
            if pin_scope == "user" and user is None:
                raise InputError("a pin for the user needs the user: pass user", field="user")
            record = {
                "id": f"mcp-{uuid.uuid4().hex[:16]}",
                "content": content,
                "role": "user",
                "author": "agent",
                "author_kind": "agent",
                "kind": kind,
                "pinned": pinned,
                "created_at": time.time(),
            }
            if attachments:
                record["attachments"] = attachments
            result = engine.ingest(
                [record], tenant=where, session=session or notes_session, user=user
            )
            outcome = result.outcomes[0]
            stored = outcome.duplicate_of or outcome.id
            if pin_scope is not None:
                engine.pin(stored, tenant=where, scope=pin_scope)
            if not reads(ctx):  # a write-only key learns nothing of what the store held
                return {"id": outcome.id, "status": "accepted"}
            return {"id": stored, "status": outcome.status}

    @server.tool()
    def recall(
        query: str,
        max_tokens: int = 512,
        limit: int = 50,
        session: str | None = None,
        user: str | None = None,
        scope: str | None = None,
        ctx: Context | None = None,
    ) -> dict[str, Any]:
        """Memories matching ``query``, best first, as many as fit in max_tokens; of
        ``session`` or end user ``user`` when named (``scope``: session, user or tenant)."""
        with _tool_errors():
            where = caller(ctx, "read")
            if max_tokens < 1:
                raise InputError(f"{max_tokens} must be at least 1", field="max_tokens")
            tok = tokenizer()
            hits = engine.search(
                query,
                tenant=where,
                limit=limit,
                session=session,
                user=user,
                scope=_scope_argument(scope),
            )
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
    def update(
        id: str,
        content: str,
        user: str | None = None,
        session: str | None = None,
        ctx: Context | None = None,
    ) -> dict[str, Any]:
        """Replace the text of a note stored with ``remember`` (a note that changed); the old
        text is kept as a version. With ``user`` or ``session``, only if it is that end user's
        or session's. Returns ``edited``, or ``known`` when the text was already this."""
        with _tool_errors():
            where = caller(ctx, "write")
            memory = engine.get(id, tenant=where, user=user, session=session)
            # An agent rewrites its own notes only: never what people, tools or the operator
            # stored (a prompt-injected agent must not be able to rewrite the record).
            if memory.author_kind != "agent" or memory.id != id:
                raise InputError(
                    f"{id!r} is not a note stored with remember: only those can be updated "
                    "over MCP; store a new note instead",
                    field="id",
                )
            if memory.kind == "fact" and not remember_facts:
                raise InputError(
                    "facts from agents are off on this server: store a new message note",
                    field="id",
                )
            outcome = engine.update(id, content, tenant=where, user=user, session=session)
            return outcome.to_dict()

    @server.tool()
    def expand(
        id: str, user: str | None = None, session: str | None = None, ctx: Context | None = None
    ) -> dict[str, Any]:
        """The whole text behind ``id``: the originals a summary was made from (while the
        archive keeps them) or a tool result that was offloaded and replaced by a preview
        naming this id. With ``user`` or ``session``, only if it is that end user's or
        session's."""
        with _tool_errors():
            where = caller(ctx, "read")
            found = engine.expand(id, tenant=where, user=user, session=session)
            return {
                "id": id,
                "sources": [
                    {
                        "id": m.id,
                        "role": m.role,
                        "author": m.author,
                        "created_at": format_time(m.created_at),
                        "content": m.content,
                    }
                    for m in found
                ],
            }

    @server.tool()
    def forget(
        id: str, user: str | None = None, session: str | None = None, ctx: Context | None = None
    ) -> dict[str, Any]:
        """Delete the memory ``id`` (a content-free tombstone remains); with ``user`` or
        ``session``, only if it is that end user's or session's."""
        with _tool_errors():
            where = caller(ctx, "delete")
            engine.delete(id, tenant=where, reason="forgotten over MCP", user=user, session=session)
            return {"deleted": id}

    @server.tool()
    def assemble_context(
        session: str,
        query: str | None = None,
        model: str | None = None,
        budget: int | None = None,
        system: str | None = None,
        tokenizer: str | None = None,
        window: int | None = None,
        user: str | None = None,
        scope: str | None = None,
        ctx: Context | None = None,
    ) -> dict[str, Any]:
        """The messages to send a model for this session's next turn, within its window;
        related memory from this session (``scope``: session, user or tenant).

        Any model name works; ``tokenizer`` (e.g. ``o200k_base``, ``qwen``) and ``window``
        (tokens) override what the registry says for it.
        """
        with _tool_errors():
            where = caller(ctx, "read")
            context = engine.assemble(
                session=session,
                query=query,
                model=model,
                budget=budget,
                system=system,
                tenant=where,
                tokenizer=remote_tokenizer(tokenizer),
                window=window,
                user=user,
                scope=_scope_argument(scope),
            )
            return {
                "messages": list(context.messages),
                "tokens": context.tokens,
                "cap": context.report.cap,
                "included": list(context.included),
                # which counting the cap rests on, and what was assumed (unknown models)
                "tokenizer": context.report.tokenizer,
                "exact": context.report.exact,
                "notes": list(context.report.notes),
                # how retrieval was sized for this context (empty without a query)
                "retrieval": dict(context.report.retrieval),
            }

    return server


class MCPAuthMiddleware:
    """Every HTTP request needs an API key: ``authenticate`` maps the bearer token to a
    :class:`~ctxwarden.server.http.Principal` (or raises :class:`AuthError`), which the tools
    find in the request's state. Refusals are 401 (no or unknown key) and 403 (no read scope)."""

    def __init__(self, app: ASGIApp, authenticate: Callable[[str | None], Principal]) -> None:
        self.app = app
        self.authenticate = authenticate

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        token = None
        for name, value in scope.get("headers", ()):
            if name == b"authorization":
                kind, _, rest = value.decode("latin-1").partition(" ")
                token = rest.strip() if kind.lower() == "bearer" and rest.strip() else ""
        try:
            principal = self.authenticate(token or None)
            principal.require("read")
        except CtxwardenError as exc:
            status = 403 if isinstance(exc, ScopeError) else 401
            body = json.dumps({"error": {"type": type(exc).__name__, "message": str(exc)}})
            headers = [(b"content-type", b"application/json")]
            if status == 401:
                headers.append((b"www-authenticate", b"Bearer"))
            await send({"type": "http.response.start", "status": status, "headers": headers})
            await send({"type": "http.response.body", "body": body.encode()})
            return
        scope.setdefault("state", {})[_PRINCIPAL] = principal
        await self.app(scope, receive, send)


def create_mcp_http_app(
    engine: Engine,
    authenticate: Callable[[str | None], Principal],
    *,
    host: str = "127.0.0.1",
    session: str = "mcp",
    remember_facts: bool = False,
) -> ASGIApp:
    """The MCP server over streamable HTTP (``/mcp``), every request authenticated by API key;
    each key works in its own tenant. Run it with uvicorn (lifespan on). ``remember_facts`` as
    in :func:`create_mcp_server`."""
    server = create_mcp_server(engine, session=session, remember_facts=remember_facts)
    return MCPAuthMiddleware(server.streamable_http_app(host=host), authenticate)
