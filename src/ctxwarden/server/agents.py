"""What the proxy's agent APIs share: who is calling, the model's budget, memory, the report.

:func:`install_agent_apis` adds the OpenAI Responses API (:mod:`ctxwarden.server.responses`) and
the Anthropic Messages API (:mod:`ctxwarden.server.messages`) to the proxy app. Both work as the
chat-completions path does: the client's conversation is checked, priced with the model's
tokenizer, fitted by :func:`ctxwarden.fit.fit` (sent unchanged when it fits) and forwarded to an
upstream speaking the same API; every answer carries the ``x-ctxwarden-report`` header.

Memory is kept only for a scope the client names: the ``X-Ctxwarden-Session`` header, or an end
user (``X-Ctxwarden-User``, the Responses ``user`` field, the Messages ``metadata.user_id``).
Without one, nothing is stored and nothing is retrieved: the proxy only fits what it was sent.
With one, the conversation's text messages and the reply are stored in that scope, and what the
scope said earlier that matches the newest user message comes back as one quoted-data user
message after the system part.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson
import xxhash
from fastapi import Request

from ctxwarden.engine import Engine
from ctxwarden.errors import AuthError, BudgetError, InputError, UpstreamError
from ctxwarden.fit import Fitted, Unit, fit
from ctxwarden.llm import ChunkStream, LLMClient
from ctxwarden.llm_anthropic import AnthropicClient
from ctxwarden.server.access import upstream_failure as access_upstream_failure
from ctxwarden.server.chatfit import TokenCache
from ctxwarden.server.http import SCOPES, Principal, ServerConfig
from ctxwarden.server.proxymemory import Block, ProxyMemory, Who
from ctxwarden.server.proxyreport import ProxyMetrics, cached_tokens, prompt_tokens
from ctxwarden.server.windows import Windows
from ctxwarden.sessions import TurnSlots
from ctxwarden.textcheck import check_json_text
from ctxwarden.wirefit import CostCache, Pricer

__all__ = ["NUL_ESCAPE", "Budget", "Shared", "Turn", "install_agent_apis", "json_body"]

REPORT_HEADER = "x-ctxwarden-report"


#: The deepest nesting a proxy body may have: orjson, which serialises what goes upstream (and
#: keys the conversation cache), refuses values nested more than 254 levels below the body
#: itself. Counted from a top-level field, as :func:`~ctxwarden.textcheck.check_json_text` counts.
FORWARD_DEPTH = 252

#: A NUL can reach a parsed body only as this escape (orjson refuses raw control characters
#: and lone surrogates); one regex scan of the bytes is ~2x faster than ``bytes.__contains__``.
NUL_ESCAPE = re.compile(rb"\\u0000")


def json_body(raw: bytes) -> dict[str, Any]:
    """A proxy request's body: a JSON object whose text holds no NUL and no lone surrogate,
    nested no deeper than the proxy can forward (:data:`FORWARD_DEPTH`), else
    :class:`InputError` naming the field, or the line and column where the JSON stopped
    parsing. One parser for the three APIs (chat completions, responses, messages).

    >>> json_body(b'{"model": ')
    Traceback (most recent call last):
    ...
    ctxwarden.errors.InputError: field 'body': not JSON: unexpected end of data (line 1, column 11)
    """
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        reason = exc.msg.split(": line ")[0]
        raise InputError(
            f"not JSON: {reason} (line {exc.lineno}, column {exc.colno})",
            field="body",
        ) from None
    if not isinstance(body, dict):
        raise InputError(f"expected a JSON object, got {type(body).__name__}", field="body")
    # Without a NUL escape and with a body orjson can serialise again (what forwarding does),
    # there is nothing to refuse, and the walk that names the field (a Python visit of every
    # string and container) is skipped: a 20,000-message conversation costs one regex scan
    # and one serialisation in C (~4 ms) instead of a walk over its containers (~5-18 ms).
    if NUL_ESCAPE.search(raw) is not None or not _forwardable(body):
        for name, value in body.items():
            check_json_text(value, name, max_depth=FORWARD_DEPTH)
    return body


def _forwardable(body: dict[str, Any]) -> bool:
    """Whether orjson serialises ``body``: a value parsed by orjson fails only by nesting."""
    try:
        orjson.dumps(body)
    except orjson.JSONEncodeError:
        return False
    return True


@dataclass
class Shared:
    """What the agent APIs share with the chat-completions path: the memory helper, the
    windows (served window, tokenizer headers), the proxy's settings and counters."""

    engine: Engine
    memory: ProxyMemory
    windows: Windows
    cache: CostCache | None = None
    slots: TurnSlots | None = None
    metrics: ProxyMetrics | None = None
    remember: bool = True
    memory_tokens: int = 1024
    keep_fraction: float = 0.6
    memory_refresh: str = "cut"


def principal(request: Request) -> Principal:
    """The caller: its key from ``Authorization: Bearer`` or ``x-api-key`` (what the
    ``anthropic`` client and Claude Code send)."""
    config: ServerConfig = request.app.state.config
    token: str | None = request.headers.get("x-api-key")
    value = request.headers.get("authorization")
    if value is not None:
        scheme, _, rest = value.partition(" ")
        if scheme.lower() != "bearer" or not rest.strip():
            raise AuthError("Authorization header must be 'Bearer <key>'")
        token = rest.strip()
    if config.authenticate is None:
        engine: Engine = request.app.state.engine
        return Principal(tenant=engine.config.tenant, scopes=frozenset(SCOPES))
    if not token:
        raise AuthError("missing API key: send 'Authorization: Bearer <key>' or 'x-api-key'")
    return config.authenticate(token)


def upstream_failure(exc: UpstreamError) -> tuple[int, str]:
    """The status and message an upstream failure is answered with (the chat path's rules):
    the upstream's own status and message, a 504 for a timeout, a 502 otherwise; never the
    upstream's host or port (:func:`ctxwarden.server.access.upstream_failure`)."""
    return access_upstream_failure(exc)


def refuse_redirects(body: Mapping[str, Any]) -> None:
    """Refuse fields that would point the proxy at another upstream or ask for its key (the
    chat path's list)."""
    from ctxwarden.server.proxy import FORBIDDEN_FIELDS  # proxy.py imports this module

    for name in body:
        if name.lower() in FORBIDDEN_FIELDS:
            raise InputError(
                "the upstream is fixed by the proxy's configuration: remove this field",
                field=name,
            )


@dataclass(frozen=True, slots=True)
class Budget:
    """The model's pricer and the cap its fitted request must stay within."""

    model: str
    pricer: Pricer
    cap: int
    window: int
    exact: bool
    notes: tuple[str, ...] = ()
    tokenizer: str = ""
    window_source: str = ""


def budget_for(
    shared: Shared,
    windows: Windows,
    model: str,
    headers: Mapping[str, str],
    requested_output: Any,
    *,
    field: str,
) -> Budget:
    """Tokenizer, chat format and cap for ``model``, chosen as for chat completions
    (:meth:`Windows.choose`: registry, ``X-Ctxwarden-Tokenizer`` / ``-Window`` headers, the served
    window). Claude, whose tokenizer is not public, is counted with the registry's measured
    approximation (flagged in the report) unless the upstream's count endpoint is used."""
    choice = windows.choose(model, headers)
    tokenizer, fmt = choice.tokenizer, choice.fmt
    window, source, max_output = choice.window, choice.window_source, choice.max_output
    notes = choice.notes
    limits = shared.engine.config.policy.limits(window=window, max_output=max_output)
    cap = limits.cap
    if isinstance(requested_output, int) and not isinstance(requested_output, bool):
        cap = min(cap, window - requested_output - limits.margin)
        if cap <= 0:
            raise InputError(
                f"{requested_output} leaves no room for the prompt in a window of {window}",
                field=field,
            )
    return Budget(
        model=model,
        pricer=Pricer(fmt, shared.cache),
        cap=cap,
        window=window,
        exact=tokenizer.exact,
        notes=notes,
        tokenizer=tokenizer.name,
        window_source=source,
    )


@dataclass
class Turn:
    """One request's fitting and memory, and what the report says about it."""

    who: Who
    budget: Budget
    received: int
    remember: bool
    units: Sequence[Unit] = ()
    fixed: int = 0
    scale: float = 1.0
    fitted: Fitted | None = None
    block: Block | None = None
    block_kept: bool = False
    ingested: Mapping[str, int] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)

    def report(self, **more: Any) -> dict[str, Any]:
        """The ``x-ctxwarden-report`` content."""
        fitted = self.fitted
        out: dict[str, Any] = {
            "session": self.who.session,
            "user": self.who.user,
            "remembered": self.remember,
            "model": self.budget.model,
            "tokenizer": self.budget.tokenizer,
            "exact": self.budget.exact,
            "window": self.budget.window,
            "window_source": self.budget.window_source,
            "cap": self.budget.cap,
            "tokens": fitted.tokens if fitted else None,
            "unchanged": fitted.unchanged if fitted else None,
            "received_items": self.received,
            "dropped_units": len(fitted.dropped) if fitted else 0,
            "memory_block": self.block is not None,
            "memory_block_kept": self.block_kept,
            "ingested": dict(self.ingested),
            "notes": [*self.budget.notes, *(fitted.notes if fitted else ())],
            **self.extra,
            **more,
        }
        return out


def report_header(report: Mapping[str, Any]) -> str:
    """The report as the header's value (compact ASCII JSON)."""
    return json.dumps(report, separators=(",", ":"), ensure_ascii=True)


def remember_conversation(shared: Shared, turn: Turn, texts: Sequence[tuple[str, str]]) -> None:
    """Store the conversation in the scope the client named, with the chat path's helper
    (:class:`ProxyMemory`: nothing without a name). ``texts``: one ``(role, text)`` per item of
    the request's list, in order (items that are not text messages as ``(type, "")``: not
    stored, but they keep the positions :func:`with_memory` reads)."""
    if not turn.remember:
        return
    messages = [{"role": role, "content": text} for role, text in texts]
    keys = [
        xxhash.xxh3_64_intdigest(f"{role}\x00{text}".encode("utf-8", "surrogatepass"))
        for role, text in texts
    ]
    turn.ingested, _ = shared.memory.remember(turn.who, messages, keys)


def remember_reply(shared: Shared, turn: Turn, text: str) -> None:
    """Store the upstream's reply text in the named scope (nothing without one)."""
    if turn.remember and text.strip():
        shared.memory.remember_reply(turn.who, {"role": "assistant", "content": text})


def fit_turn(
    shared: Shared,
    turn: Turn,
    units: Sequence[Unit],
    fixed: int,
    *,
    exact_total: int | None = None,
) -> Fitted:
    """Fit ``units`` into the cap (:class:`BudgetError` when even the newest turn does not
    fit). ``exact_total``: the upstream's own count of the whole request, when it can count;
    the local prices are then scaled to it."""
    scale = 1.0
    if exact_total is not None:
        local = fixed + sum([u.tokens for u in units])
        scale = exact_total / local if local > 0 else 1.0
        units = [
            Unit(start=u.start, stop=u.stop, tokens=math.ceil(u.tokens * scale), kind=u.kind)
            for u in units
        ]
        fixed = math.ceil(fixed * scale)
    turn.units, turn.fixed, turn.scale = units, fixed, scale
    turn.fitted = fit(units, cap=turn.budget.cap, fixed=fixed, keep_fraction=shared.keep_fraction)
    return turn.fitted


def with_memory(shared: Shared, turn: Turn, *, question: str | None, memory_at: int) -> Fitted:
    """The fit of :func:`fit_turn` with the memory block, as the chat path does it, when the
    client named a scope and memory is on: a conversation trimmed anyway is trimmed with room
    kept for the block (so it never has to leave between two cuts); the block changes only when
    the cut moves (``memory_refresh="cut"``) and leaves out what is sent anyway. ``memory_at``:
    the item index after the system part, where the block goes. Counted in ``/metrics``."""
    assert turn.fitted is not None, "fit_turn first"
    fitted = turn.fitted
    memory = turn.remember and shared.remember and shared.memory_tokens > 0 and bool(question)
    if memory:
        reserved = 0
        if not fitted.unchanged:
            try:
                fitted = fit(
                    turn.units,
                    cap=turn.budget.cap,
                    fixed=turn.fixed,
                    memory_tokens=math.ceil(shared.memory_tokens * turn.scale),
                    keep_fraction=shared.keep_fraction,
                )
                reserved = math.ceil(shared.memory_tokens * turn.scale)
            except BudgetError:
                pass  # the newest turn leaves no such room: the block gets what is left
        tail_from = turn.units[fitted.dropped[-1]].stop if fitted.dropped else memory_at
        exclude = shared.memory.kept(turn.who, memory_at, tail_from)
        room = min(
            shared.memory_tokens, int((turn.budget.cap - fitted.tokens + reserved) / turn.scale)
        )
        turn.block, turn.block_kept = shared.memory.block(
            turn.who,
            str(question),
            exclude=exclude,
            budget=room,
            fmt=turn.budget.pricer.fmt,
            cut=tail_from if shared.memory_refresh == "cut" else None,
        )
        used = math.ceil(turn.block.tokens * turn.scale) if turn.block is not None else 0
        fitted = dataclasses.replace(fitted, tokens=fitted.tokens - reserved + used)
    turn.fitted = fitted
    if shared.metrics is not None:
        shared.metrics.fits.labels(outcome="unchanged" if fitted.unchanged else "trimmed").inc()
        shared.metrics.sent_tokens.inc(fitted.tokens)
        if turn.block is not None:
            shared.metrics.memory_blocks.labels(kept=str(turn.block_kept).lower()).inc()
    return fitted


def observe(shared: Shared, usage: Any) -> dict[str, Any]:
    """Count the upstream's reported usage in ``/metrics``; its numbers for the report."""
    if shared.metrics is not None:
        shared.metrics.observe_usage(usage)
    return {"upstream_input_tokens": prompt_tokens(usage), "cached_tokens": cached_tokens(usage)}


def relay(
    events: ChunkStream,
    *,
    on_event: Callable[[dict[str, Any]], None],
    on_end: Callable[[], None],
    release: Callable[[], None],
) -> Iterator[bytes]:
    """The upstream's server-sent events as they come (``event:`` named by each payload's
    ``type``, as both APIs name them); ``on_event`` sees each payload, ``on_end`` runs after a
    complete stream."""
    try:
        for data in events:
            try:
                payload = json.loads(data)
            except ValueError:
                payload = None
            if isinstance(payload, dict):
                on_event(payload)
                kind = payload.get("type")
                if isinstance(kind, str) and kind:
                    yield b"event: " + kind.encode() + b"\n"
            yield b"data: " + data.encode() + b"\n\n"
        on_end()
    finally:
        events.close()
        release()


def install_agent_apis(
    app: Any,
    engine: Engine,
    upstream: LLMClient,
    anthropic: AnthropicClient | None = None,
) -> None:
    """Add ``POST /v1/responses`` (to ``upstream``) and ``POST /v1/messages`` with
    ``/v1/messages/count_tokens`` (to ``anthropic``; without one they answer 404 saying so).

    Call it from ``create_proxy_app`` after ``app.state.proxy`` is set: the memory helper,
    windows, settings and counters are the chat path's own."""
    from ctxwarden.server import messages, responses

    proxy = getattr(app.state, "proxy", None)
    config = getattr(proxy, "config", None)
    shared = Shared(
        engine=engine,
        memory=getattr(proxy, "memory", None) or ProxyMemory(engine),
        windows=getattr(proxy, "windows", None) or Windows(upstream, engine.registry),
        cache=getattr(proxy, "cache", None) or TokenCache(),
        slots=getattr(proxy, "slots", None),
        metrics=getattr(proxy, "metrics", None),
        remember=bool(getattr(config, "memory", True)),
        memory_tokens=int(getattr(config, "memory_tokens", 1024)),
        keep_fraction=float(getattr(config, "keep_fraction", 0.6)),
        memory_refresh=str(getattr(config, "memory_refresh", "cut")),
    )
    responses.install(app, shared, upstream)
    claude_windows = None
    if anthropic is not None:
        # Anthropic serves no window endpoint: the registry's, a header's or Claude's own
        claude_windows = Windows(anthropic, engine.registry, probe=False)
    messages.install(app, shared, anthropic, claude_windows)


def take_slot(slots: TurnSlots | None, turn: Turn) -> Callable[[], None]:
    """Wait for the named conversation's turn slot (turns of one conversation run one at a time,
    so their ingests do not race); the function that releases it, idempotent. Nothing named,
    no slot."""
    if slots is None or not turn.remember:
        return lambda: None
    ticket = slots.enqueue(f"{turn.who.tenant}\x00{turn.who.user}\x00{turn.who.session}")
    ticket.wait(slots.timeout)
    done = False

    def release() -> None:
        nonlocal done
        if not done:
            done = True
            ticket.release()

    return release
