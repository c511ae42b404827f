"""The ``ctxwarden`` commands that serve: ``serve``, ``proxy``, ``mcp`` and the ``keys`` group.

:mod:`ctxwarden.cli` registers them on its app, after the offline commands. Each imports its
server lazily, so the CLI's offline commands work without the ``server`` extra.
"""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer

from ctxwarden.cli_context import _engine, _settings
from ctxwarden.engine import Engine
from ctxwarden.errors import ConfigError
from ctxwarden.terminal import echo_json

__all__ = ["keys_app", "mcp", "proxy", "serve"]

_LOOPBACK = ("127.0.0.1", "::1", "localhost")


def _server_config(engine: Engine, host: str, no_auth: bool, **limits: Any) -> Any:
    """Limits and authentication: API keys from the store unless --no-auth (loopback only)."""
    from ctxwarden.server.auth import KeyAuth
    from ctxwarden.server.http import ServerConfig
    from ctxwarden.store.base import KeyStore

    if no_auth:
        if host not in _LOOPBACK:
            raise ConfigError(f"--no-auth: only on a loopback host, not {host!r}; issue API keys")
        return ServerConfig(**limits)
    if not isinstance(engine.store, KeyStore):
        raise ConfigError("this store keeps no API keys: use SQLite, PostgreSQL or --no-auth")
    return ServerConfig(authenticate=KeyAuth(engine.store), **limits)


def _run_server(
    app_: Any, engine: Engine, *, name: str, host: str, port: int, as_json: bool = False
) -> None:
    """Warm up (:func:`ctxwarden.server.runtime.prepare`), then serve with uvicorn: one line
    on stderr when warming up starts, one when the port is open (JSON with ``as_json``)."""
    import signal
    import time

    import uvicorn

    from ctxwarden.server.runtime import prepare

    began = time.perf_counter()

    def say(event: str, text: str, **fields: Any) -> None:
        line = json.dumps({"server": name, "event": event, **fields}) if as_json else text
        typer.echo(line, err=True)

    say("warming_up", f"ctxwarden {name}: warming up (tokenizer, retrieval)")
    prepare(engine)
    took = time.perf_counter() - began

    class _Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: Any) -> None:
            super().handle_exit(sig, frame)
            if sig == signal.SIGTERM and sig in self._captured_signals:
                # uvicorn raises a captured SIGTERM again once it has shut down, which ended
                # the process before the engine closed: the compactor's run and the queued
                # inclusion log were cut short. A stop is not a crash: run() returns, the
                # engine closes (see Engine.close) and the command exits 0.
                self._captured_signals.remove(sig)

        async def startup(self, sockets: Any = None) -> None:
            await super().startup(sockets=sockets)
            if self.started:  # false when the port could not be bound
                url = f"http://{host}:{port}"
                text = f"ctxwarden {name}: ready on {url} (warm-up {took:.1f} s)"
                say("ready", text, url=url, warm_up_seconds=round(took, 2))

    config = uvicorn.Config(app_, host=host, port=port, log_level="warning", access_log=False)
    _Server(config).run()


NoAuth = Annotated[
    bool, typer.Option("--no-auth", help="Serve without API keys (loopback hosts only).")
]
CompactEvery = Annotated[
    str | None,
    typer.Option(
        "--compact-every",
        help="Compact in the background this often (6h, 90m) or off; default 6h "
        "(setting compact_every).",
    ),
]
ServerJson = Annotated[
    bool, typer.Option("--json", help="Write the start-up lines (stderr) as JSON.")
]
InclusionLog = Annotated[
    str | None,
    typer.Option(
        "--inclusion-log",
        help="sync, or deferred (written by a background thread; the servers' default).",
    ),
]


def serve(
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on.")] = 8765,
    max_body_bytes: Annotated[int, typer.Option(help="Largest request body.")] = 1 << 20,
    max_concurrency: Annotated[int, typer.Option(help="Requests run at once (429 above).")] = 16,
    threads: Annotated[int, typer.Option(help="Worker threads for engine work.")] = 4,
    no_auth: NoAuth = False,
    inclusion_log: InclusionLog = None,
    compact_every: CompactEvery = None,
    as_json: ServerJson = False,
) -> None:
    """Serve the HTTP API (ingest, assemble, search, memories, stats) with uvicorn."""
    from ctxwarden.server.http import create_app

    with _engine(server=True, inclusion_log=inclusion_log, compact_every=compact_every) as engine:
        config = _server_config(
            engine,
            host,
            no_auth,
            max_body_bytes=max_body_bytes,
            max_concurrency=max_concurrency,
            threads=threads,
        )
        app_ = create_app(engine, config)
        _run_server(app_, engine, name="serve", host=host, port=port, as_json=as_json)


keys_app = typer.Typer(no_args_is_help=True, help="API keys of the servers.")


@keys_app.command("create")
def keys_create(
    tenant: Annotated[str, typer.Option(help="Tenant the key works in.")],
    scope: Annotated[list[str], typer.Option(help="read, write, delete or admin (repeat).")],
    name: Annotated[str | None, typer.Option(help="A label for the key.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the key as JSON.")] = False,
) -> None:
    """Issue a key and print it once (only its hash is stored)."""
    from ctxwarden.server.auth import issue_key
    from ctxwarden.store.base import KeyStore

    with _engine() as engine:
        if not isinstance(engine.store, KeyStore):
            raise ConfigError("this store keeps no API keys")
        key = issue_key(engine.store, tenant=tenant, scopes=scope, name=name)
    if as_json:
        echo_json({"key": key, "tenant": tenant, "scopes": sorted(scope), "name": name})
    else:
        typer.echo(key)


@keys_app.command("list")
def keys_list(
    tenant: Annotated[str | None, typer.Option(help="Only this tenant.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON lines.")] = False,
) -> None:
    """List keys (ids, tenants, scopes; never secrets)."""
    from ctxwarden.store.base import KeyStore

    with _engine() as engine:
        if not isinstance(engine.store, KeyStore):
            raise ConfigError("this store keeps no API keys")
        for key in engine.store.api_keys(tenant):
            state = "revoked" if key.revoked_at is not None else "active"
            scopes = ",".join(sorted(key.scopes))
            if as_json:
                data = {"key_id": key.key_id, "tenant": key.tenant, "scopes": sorted(key.scopes)}
                echo_json({**data, "state": state, "name": key.name}, indent=None)
                continue
            typer.echo(f"{key.key_id}\t{key.tenant}\t{scopes}\t{state}\t{key.name or ''}")


@keys_app.command("revoke")
def keys_revoke(
    key_id: Annotated[str, typer.Argument(help="The key id (from keys list).")],
    as_json: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")] = False,
) -> None:
    """Revoke a key."""
    import time

    from ctxwarden.errors import NotFound
    from ctxwarden.store.base import KeyStore

    with _engine() as engine:
        if not isinstance(engine.store, KeyStore):
            raise ConfigError("this store keeps no API keys")
        if not engine.store.revoke_api_key(key_id, time.time()):
            raise NotFound(f"no API key {key_id!r}: see ctxwarden keys list")
    if as_json:
        echo_json({"revoked": key_id})
    else:
        typer.echo(f"revoked {key_id}")


def proxy(
    upstream: Annotated[
        str | None, typer.Option(help="Upstream API root, e.g. http://127.0.0.1:8080/v1.")
    ] = None,
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on.")] = 8766,
    destructive: Annotated[
        list[str] | None, typer.Option(help="Tool-name pattern to hold for approval (repeat).")
    ] = None,
    max_body_bytes: Annotated[int, typer.Option(help="Largest request body (default 32 MiB).")] = 32
    << 20,
    memory: Annotated[
        bool,
        typer.Option(
            "--memory/--no-memory",
            help="Retrieve memory for requests that name an end user or session.",
        ),
    ] = True,
    anthropic_upstream: Annotated[
        str | None,
        typer.Option(
            help="Anthropic Messages API root for /v1/messages, e.g. https://api.anthropic.com/v1 "
            "(key from CTXWARDEN_ANTHROPIC_API_KEY or the config)."
        ),
    ] = None,
    offload_tokens: Annotated[
        int | None,
        typer.Option(
            "--offload-tokens",
            help="Store tool results over this many tokens as memories and send a preview "
            "naming the id (requests that name a user or session; off by default).",
        ),
    ] = None,
    no_auth: NoAuth = False,
    inclusion_log: InclusionLog = None,
    compact_every: CompactEvery = None,
    as_json: ServerJson = False,
) -> None:
    """Serve the proxy: chat completions and Responses to --upstream (key from
    CTXWARDEN_UPSTREAM_API_KEY or the config), Anthropic Messages to --anthropic-upstream.

    Requests that name neither an end user (``user`` / X-Ctxwarden-User) nor a session
    (X-Ctxwarden-Session) are only fitted to the window: nothing is stored or retrieved.
    """
    from ctxwarden.llm import LLMClient
    from ctxwarden.llm_anthropic import AnthropicClient
    from ctxwarden.server.proxy import ProxyConfig, create_proxy_app

    settings = _settings()
    url = upstream or settings.upstream
    if not url:
        raise ConfigError("upstream: not set; pass --upstream URL or set it in the config")
    patterns = tuple(destructive or settings.destructive_tools)
    claude_url = anthropic_upstream or settings.anthropic_upstream
    claude = (
        AnthropicClient(
            claude_url,
            api_key=settings.anthropic_api_key,
            count_tokens=settings.anthropic_count_tokens,
        )
        if claude_url
        else None
    )
    with (
        _engine(
            settings, server=True, inclusion_log=inclusion_log, compact_every=compact_every
        ) as engine,
        LLMClient(url, api_key=settings.upstream_api_key, timeout=120.0) as client,
    ):
        server = _server_config(engine, host, no_auth, max_body_bytes=max_body_bytes)
        config = ProxyConfig(
            destructive=patterns,
            server=server,
            memory=memory,
            offload_tokens=offload_tokens or settings.offload_tokens,
        )
        app_ = create_proxy_app(engine, client, config, anthropic=claude)
        try:
            _run_server(app_, engine, name="proxy", host=host, port=port, as_json=as_json)
        finally:
            if claude is not None:
                claude.close()


def mcp(
    transport: Annotated[str, typer.Option(help="stdio or http (streamable HTTP).")] = "stdio",
    host: Annotated[str, typer.Option(help="Address for http.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port for http.")] = 8767,
    no_auth: NoAuth = False,
    inclusion_log: InclusionLog = None,
    compact_every: CompactEvery = None,
    as_json: ServerJson = False,
    remember_facts: Annotated[
        bool,
        typer.Option(
            "--remember-facts",
            help="Let remember store facts (shown in every context of the "
            "session); by default what agents remember is a note.",
        ),
    ] = False,
) -> None:
    """Serve the MCP tools (summarize_text, remember, recall, forget, assemble_context).

    Over http every request needs an API key (``ctxwarden keys create``), whose tenant the tools
    work in, unless --no-auth on a loopback host.
    """
    from ctxwarden.server.mcp import create_mcp_http_app, create_mcp_server

    if transport not in ("stdio", "http"):
        raise ConfigError(f"transport: {transport!r} is not stdio or http")
    with _engine(server=True, inclusion_log=inclusion_log, compact_every=compact_every) as engine:
        if transport == "stdio":
            create_mcp_server(engine, remember_facts=remember_facts).run("stdio")
            return
        from ctxwarden.server.http import SCOPES, Principal

        config = _server_config(engine, host, no_auth)
        local = Principal(tenant=engine.config.tenant, scopes=frozenset(SCOPES))
        authenticate = config.authenticate or (lambda _token: local)
        app_ = create_mcp_http_app(engine, authenticate, host=host, remember_facts=remember_facts)
        _run_server(app_, engine, name="mcp", host=host, port=port, as_json=as_json)
