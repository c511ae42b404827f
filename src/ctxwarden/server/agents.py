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

import json
import logging
import math
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import xxhash
from fastapi import Request

from ctxwarden import render, tokens
from ctxwarden.engine import Engine
from ctxwarden.errors import AuthError, InputError, TokenizerError
from ctxwarden.fit import Fitted, Unit, fit
from ctxwarden.llm import ChunkStream, LLMClient
from ctxwarden.llm_anthropic import AnthropicClient
from ctxwarden.server.http import SCOPES, Principal, ServerConfig
from ctxwarden.sessions import TurnSlots
from ctxwarden.wirefit import Pricer

__all__ = [
    "CLAUDE_FACTOR",
    "Budget",
    "Names",
    "Turn",
    "install_agent_apis",
]

log = logging.getLogger(__name__)

SESSION_HEADER = "x-ctxwarden-session"
USER_HEADER = "x-ctxwarden-user"
REPORT_HEADER = "x-ctxwarden-report"
#: Request fields that could point the proxy elsewhere or ask for its key (as chat completions).
FORBIDDEN_FIELDS = frozenset(
    {
        "api_base",
        "base_url",
        "api_key",
        "api_type",
        "api_version",
        "organization",
        "upstream",
        "url",
        "endpoint",
        "headers",
        "extra_headers",
    }
)
#: Claude's tokenizer is not public: without the upstream's count endpoint, o200k times this.
#: An estimate, not measured here (no Claude tokenizer is available offline); the report says
#: so whenever it is used.
CLAUDE_FACTOR = 1.35
#: The window assumed for a Claude model the registry does not know.
CLAUDE_WINDOW = 200_000
#: Unknown models: o200k times this, and this window, flagged in the report.
UNKNOWN_FACTOR = 1.25
UNKNOWN_WINDOW = 32_768
#: The retrieved-memory block takes at most this share of the cap.
MEMORY_SHARE = 0.1
MEMORY_MAX_TOKENS = 2000


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


def refuse_redirects(body: Mapping[str, Any]) -> None:
    """Refuse fields that would point the proxy at another upstream or ask for its key."""
    for name in body:
        if name.lower() in FORBIDDEN_FIELDS:
            raise InputError(
                "the upstream is fixed by the proxy's configuration: remove this field",
                field=name,
            )


@dataclass(frozen=True, slots=True)
class Names:
    """The scope a client named: a session, an end user, both or neither."""

    session: str | None
    user: str | None

    @classmethod
    def of(cls, headers: Mapping[str, str], user: Any) -> Names:
        """From the headers and the body's own user field (``user`` / ``metadata.user_id``)."""
        session = (headers.get(SESSION_HEADER) or "").strip() or None
        named = (headers.get(USER_HEADER) or "").strip() or None
        if named is None and isinstance(user, str) and user.strip():
            named = user.strip()
        return cls(session=session, user=named)

    @property
    def scope(self) -> str | None:
        """The store session memory goes to, or None when nothing may be remembered.

        A session named by an end user lives under that user, so two users who pick the same
        session name never share it.
        """
        if self.session is not None and self.user is not None:
            return f"user:{self.user}/session:{self.session}"
        if self.session is not None:
            return self.session
        if self.user is not None:
            return f"user:{self.user}"
        return None


@dataclass(frozen=True, slots=True)
class Budget:
    """The model's pricer and the cap its fitted request must stay within."""

    model: str
    pricer: Pricer
    cap: int
    window: int
    exact: bool
    notes: tuple[str, ...] = ()


def budget_for(engine: Engine, model: str, requested_output: Any) -> Budget:
    """Tokenizer, chat format and cap for ``model``; a flagged o200k estimate when the registry
    does not know it (Claude: o200k x :data:`CLAUDE_FACTOR`)."""
    notes: list[str] = []
    try:
        spec = engine.registry.resolve(model)
    except TokenizerError:
        spec = None
    base = tokens.get_tokenizer("o200k_base")
    if spec is not None:
        tokenizer = tokens.get_tokenizer(spec.tokenizer)
        fmt = tokens.get_chat_format(spec.chat_format, tokenizer)
        window, max_output, name = spec.window, spec.max_output, spec.name
        if not tokenizer.exact:
            notes.append(f"tokenizer {tokenizer.name} is an estimate for {spec.name}")
    elif model.lower().split("/")[-1].startswith("claude"):
        tokenizer = tokens.FallbackTokenizer(base, factor=CLAUDE_FACTOR)
        fmt = tokens.get_chat_format("openai", tokenizer)
        window, max_output, name = CLAUDE_WINDOW, 8192, model
        notes.append(
            f"Claude's tokenizer is not public: counts are o200k x {CLAUDE_FACTOR:g} "
            "(an unmeasured margin) unless the upstream counts"
        )
    else:
        tokenizer = tokens.FallbackTokenizer(base, factor=UNKNOWN_FACTOR)
        fmt = tokens.get_chat_format("openai", tokenizer)
        window, max_output, name = UNKNOWN_WINDOW, 4096, model
        notes.append(
            f"unknown model {model!r}: counts are o200k x {UNKNOWN_FACTOR:g} and the window "
            f"is taken as {UNKNOWN_WINDOW}; register the model for exact counts"
        )
    if isinstance(requested_output, int) and not isinstance(requested_output, bool):
        max_output = max(1, min(requested_output, window - 1))
    limits = engine.config.policy.limits(window=window, max_output=max_output)
    cap = min(limits.cap, window - max_output - limits.margin)
    if cap <= 0:
        raise InputError(
            f"asks for {max_output} output tokens of a {window}-token window: lower it",
            field="max_tokens",
        )
    return Budget(
        model=name,
        pricer=Pricer(fmt),
        cap=cap,
        window=window,
        exact=tokenizer.exact,
        notes=tuple(notes),
    )


@dataclass
class Turn:
    """One request's fitting and memory, and what the report says about it."""

    tenant: str
    names: Names
    budget: Budget
    received: int
    units: Sequence[Unit] = ()
    fitted: Fitted | None = None
    memory_lines: int = 0
    ingested: Mapping[str, int] = field(default_factory=dict)
    ids: set[str] = field(default_factory=set)
    seen: Counter[str] = field(default_factory=Counter)
    extra: dict[str, Any] = field(default_factory=dict)

    def report(self, **more: Any) -> dict[str, Any]:
        """The ``x-ctxwarden-report`` content."""
        fitted = self.fitted
        out: dict[str, Any] = {
            "session": self.names.session,
            "user": self.names.user,
            "remembered": self.names.scope is not None,
            "model": self.budget.model,
            "cap": self.budget.cap,
            "window": self.budget.window,
            "tokens": fitted.tokens if fitted else None,
            "unchanged": fitted.unchanged if fitted else None,
            "received_items": self.received,
            "dropped_units": len(fitted.dropped) if fitted else 0,
            "memory_lines": self.memory_lines,
            "ingested": dict(self.ingested),
            "notes": [*self.budget.notes, *(fitted.notes if fitted else ())],
            **self.extra,
            **more,
        }
        return out


def report_header(report: Mapping[str, Any]) -> str:
    """The report as the header's value (compact ASCII JSON)."""
    return json.dumps(report, separators=(",", ":"), ensure_ascii=True)


# -- memory: the one place that stores and retrieves for the agent APIs --------------------------


def _record_id(scope: str, role: str, text: str, seen: Counter[str]) -> str:
    key = f"{scope}\x00{role}\x00{text}"
    seen[key] += 1
    return "ag-" + xxhash.xxh3_64_hexdigest(f"{key}\x00{seen[key]}".encode("utf-8", "replace"))


def remember(
    engine: Engine, turn: Turn, texts: Sequence[tuple[str, str]], *, reply: bool = False
) -> None:
    """Store ``(role, text)`` messages in the named scope (nothing without one). Ids derive
    from the scope and the n-th copy of each message, so a conversation sent again stores only
    what is new; ``reply`` continues the numbering of the request's own messages."""
    scope = turn.names.scope
    if scope is None:
        return
    records = []
    for role, text in texts:
        text = text.strip()
        if not text or role not in ("user", "assistant"):
            continue
        record_id = _record_id(scope, role, text, turn.seen)
        turn.ids.add(record_id)
        records.append({"id": record_id, "role": role, "content": text})
    if records:
        result = engine.ingest(records, tenant=turn.tenant, session=scope)
        if not reply:
            turn.ingested = result.counts


def recall(engine: Engine, turn: Turn, query: str | None) -> str | None:
    """The retrieved-memory block for ``query`` from the named scope's earlier messages (not
    those of this conversation), or None."""
    scope = turn.names.scope
    if scope is None or not query or not query.strip():
        return None
    limit = min(MEMORY_MAX_TOKENS, int(turn.budget.cap * MEMORY_SHARE))
    try:
        found = engine.search(query, tenant=turn.tenant, limit=50)
    except InputError:
        return None  # a query with no searchable terms
    lines: list[tuple[float, str]] = []
    used = turn.budget.pricer.text(render.data_intro())
    for memory, _score in found:
        if memory.session != scope or memory.id in turn.ids or memory.role == "tool":
            continue
        line = render.line_text(memory)
        cost = turn.budget.pricer.text(line)
        if used + cost > limit:
            break
        used += cost
        lines.append((memory.created_at, line))
    if not lines:
        return None
    turn.memory_lines = len(lines)
    # oldest first, as they were said: the block reads as a transcript excerpt
    body = "".join(line for _, line in sorted(lines))
    return render.data_intro() + render.block_header("Related earlier messages") + body


def fit_turn(
    engine: Engine,
    turn: Turn,
    units: Sequence[Unit],
    fixed: int,
    memory: str | None,
    *,
    exact_total: int | None = None,
) -> Fitted:
    """Fit ``units`` into the cap. ``exact_total``: the upstream's own count of the whole
    request, when it can count; the local prices are then scaled to it."""
    cap = turn.budget.cap
    memory_tokens = turn.budget.pricer.message("user", memory) if memory else 0
    local = fixed + sum(u.tokens for u in units)
    if exact_total is not None and local > 0:
        scale = exact_total / local
        units = [
            Unit(start=u.start, stop=u.stop, tokens=math.ceil(u.tokens * scale), kind=u.kind)
            for u in units
        ]
        fixed = math.ceil(fixed * scale)
        memory_tokens = math.ceil(memory_tokens * scale)
    turn.units = units
    fitted = fit(units, cap=cap, fixed=fixed, memory_tokens=memory_tokens)
    turn.fitted = fitted
    return fitted


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
    *,
    memory: bool = True,
) -> None:
    """Add ``POST /v1/responses`` (to ``upstream``) and ``POST /v1/messages`` with
    ``/v1/messages/count_tokens`` (to ``anthropic``; without one they answer 404 saying so)."""
    from ctxwarden.server import messages, responses

    responses.install(app, engine, upstream, memory=memory)
    messages.install(app, engine, anthropic, memory=memory)


def take_slot(slots: TurnSlots | None, turn: Turn) -> Callable[[], None]:
    """Wait for the named scope's turn slot (turns of one scope run one at a time, so their
    ingests do not race); the function that releases it, idempotent. No scope, no slot."""
    scope = turn.names.scope
    if slots is None or scope is None:
        return lambda: None
    ticket = slots.enqueue(f"{turn.tenant}\x00{scope}")
    ticket.wait(slots.timeout)
    done = False

    def release() -> None:
        nonlocal done
        if not done:
            done = True
            ticket.release()

    return release
