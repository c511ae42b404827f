"""Value types shared by every part of ctxwarden: records in, memories stored, contexts out.

A :class:`Record` is what a caller ingests (one chat event, one OpenAI-style message, one fact).
A :class:`Memory` is what the store keeps for it. :class:`IngestResult` says what became of each
record; :class:`Context` is what ``assemble`` returns: the chat messages to send, the ids of every
memory in them, the exact token count and a :class:`Report` that explains every decision.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from types import MappingProxyType
from typing import Any, Literal, NamedTuple

from ctxwarden._fastinit import fast_init
from ctxwarden.attachments import check as check_attachments
from ctxwarden.errors import InputError
from ctxwarden.textcheck import check_json_text, check_text, plain_text

__all__ = [
    "AUTHOR_KINDS",
    "KINDS",
    "ROLES",
    "BlockReport",
    "CandidateReport",
    "CandidateReports",
    "CandidateRow",
    "Context",
    "IngestOutcome",
    "IngestResult",
    "IngestStatus",
    "Memory",
    "Record",
    "Report",
    "Scope",
    "check_scope_name",
    "format_time",
    "parse_time",
]

ROLES = frozenset({"system", "user", "assistant", "tool"})
AUTHOR_KINDS = frozenset({"human", "bot", "agent", "tool"})
KINDS = frozenset({"message", "summary", "fact", "pinned"})
IngestStatus = Literal["stored", "edited", "duplicate", "near_duplicate", "known"]
#: What a read may see: one session's conversation, an end user's sessions, or the whole tenant.
Scope = Literal["session", "user", "tenant"]
SCOPES: frozenset[str] = frozenset({"session", "user", "tenant"})

#: Longest content accepted at ingest (characters). Larger payloads belong in a document store;
#: a prompt could not hold them anyway, and counting them would stall ingest.
MAX_CONTENT_CHARS = 1 << 20

_RECORD_FIELDS = frozenset(
    {
        "id",
        "tenant",
        "session",
        "user",
        "channel",
        "author",
        "author_kind",
        "role",
        "content",
        "created_at",
        "thread_id",
        "reply_to",
        "kind",
        "pinned",
        "name",
        "tool_calls",
        "tool_call_id",
        "attachments",
        "metadata",
        "key",
    }
)


def parse_time(value: object, *, field_name: str = "created_at", line: int | None = None) -> float:
    """Parse an ISO 8601 string, a datetime or epoch seconds into UTC epoch seconds.

    >>> parse_time("2026-03-01T08:04:49Z")
    1772352289.0
    """
    if isinstance(value, bool):
        raise InputError("expected an ISO 8601 time or epoch seconds", field=field_name, line=line)
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, datetime):
        when = value if value.tzinfo else value.replace(tzinfo=UTC)
        seconds = when.timestamp()
    elif isinstance(value, str):
        text = value.strip()
        if text.endswith(("Z", "z")):
            text = text[:-1] + "+00:00"
        try:
            when = datetime.fromisoformat(text)
        except ValueError:
            raise InputError(
                f"{value!r} is not an ISO 8601 time (e.g. 2026-03-01T08:04:49Z)",
                field=field_name,
                line=line,
            ) from None
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        seconds = when.timestamp()
    else:
        raise InputError(
            f"expected an ISO 8601 time or epoch seconds, got {type(value).__name__}",
            field=field_name,
            line=line,
        )
    if not math.isfinite(seconds) or seconds < 0 or seconds > 32503680000:  # year 3000
        raise InputError(f"{value!r} is out of range", field=field_name, line=line)
    return seconds


def format_time(seconds: float, *, precision: str = "seconds") -> str:
    """Format epoch seconds as an ISO 8601 UTC string ending in ``Z``.

    >>> format_time(1772352289.0)
    '2026-03-01T08:04:49Z'
    """
    return (
        datetime.fromtimestamp(seconds, tz=UTC).isoformat(timespec=precision).replace("+00:00", "Z")
    )


def _optional_str(data: Mapping[str, Any], name: str, line: int | None) -> str | None:
    value = data.get(name)
    if value is None:
        return None
    if type(value) is str and len(value) <= 512 and plain_text(value):  # the common case
        return value
    if isinstance(value, int) and not isinstance(value, bool) and name in {"id", "thread_id"}:
        return str(value)
    if not isinstance(value, str):
        raise InputError(f"expected a string, got {type(value).__name__}", field=name, line=line)
    if len(value) > 512:
        raise InputError("longer than 512 characters", field=name, line=line)
    return check_text(value, name, line=line)


def check_scope_name(value: str, field_name: str, *, line: int | None = None) -> str:
    """Validate a session or end-user name: a string of 1-512 characters without NUL or lone
    surrogates (neither survives a round trip through PostgreSQL or UTF-8 JSON).

    >>> check_scope_name("alice-77", "user")
    'alice-77'
    """
    if not isinstance(value, str):
        raise InputError(
            f"expected a string, got {type(value).__name__}", field=field_name, line=line
        )
    if not value:
        raise InputError("is empty", field=field_name, line=line)
    if len(value) > 512:
        raise InputError("longer than 512 characters", field=field_name, line=line)
    if not plain_text(value):
        raise InputError(
            "contains a NUL character or a lone surrogate", field=field_name, line=line
        )
    return value


def _content_text(value: object, line: int | None) -> str:
    """Content as a string: plain text, or OpenAI content parts of type text."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        texts: list[str] = []
        for index, part in enumerate(value):
            if not isinstance(part, Mapping) or part.get("type") != "text":
                raise InputError(
                    f"content part {index} is not a text part ({{'type': 'text', 'text': ...}})",
                    field="content",
                    line=line,
                )
            text = part.get("text")
            if not isinstance(text, str):
                raise InputError(
                    f"content part {index} has no string 'text'", field="content", line=line
                )
            texts.append(text)
        return "\n".join(texts)
    raise InputError(
        f"expected a string or a list of text parts, got {type(value).__name__}",
        field="content",
        line=line,
    )


@fast_init
@dataclass(frozen=True, kw_only=True, slots=True)
class Record:
    """One event to ingest: a chat message, an OpenAI-style message, a fact or a pinned note.

    ``id`` is the caller's id and is kept; without one a stable id is derived from the record.
    Content is stored stripped of leading and trailing whitespace.

    >>> Record.from_mapping({"role": "user", "content": "hi"}).role
    'user'
    """

    #: The caller's id, kept; without one a stable id is derived from the record.
    id: str | None = None
    #: The text (an OpenAI list of parts is joined; stored stripped). May be null only for an
    #: assistant message that calls tools or a record with attachments.
    content: str
    #: ``user``, ``assistant``, ``system`` or ``tool``.
    role: str = "user"
    #: The hard boundary: over HTTP and MCP it is the API key's tenant.
    tenant: str = "default"
    #: The conversation (1-512 characters).
    session: str = "default"
    #: The end user the record belongs to (the person an agent serves), or None: with
    #: ``session`` and ``tenant`` it is the scope that reads are confined to (DESIGN rule 6).
    user: str | None = None
    #: Where it was said (``#general``): a channel's repeats fold across sessions.
    channel: str | None = None
    #: Who said it (shown as ``author: content`` in multi-party chats).
    author: str | None = None
    #: ``human``, ``bot``, ``agent`` or ``tool``: bots' near repeats (only volatile values
    #: differ) fold.
    author_kind: str = "human"
    #: When: Unix seconds or ISO 8601 (default: the time of ingest).
    created_at: float | None = None
    #: The thread it belongs to (retrieval brings a hit's thread neighbours along).
    thread_id: str | None = None
    #: The id of the message it answers.
    reply_to: str | None = None
    #: ``message``, ``fact`` (offered to the pinned block of its scope), ``pinned`` or
    #: ``summary`` (written by compaction).
    kind: str = "message"
    #: Always offered to the pinned block of its session's contexts.
    pinned: bool = False
    #: The OpenAI ``name`` of the message (a tool's or a participant's).
    name: str | None = None
    #: An assistant message's OpenAI tool calls (``[{id, type, function: {name, arguments}}]``).
    tool_calls: tuple[Mapping[str, Any], ...] = ()
    #: A tool result's call id (kept with its call in every context).
    tool_call_id: str | None = None
    #: Images, files and links the record carries (``[{kind, name, caption, url}]``,
    #: :mod:`ctxwarden.attachments`): searchable, and shown after the content in prompts.
    attachments: tuple[Mapping[str, Any], ...] = ()
    #: Anything else the caller keeps with the record (JSON), returned as given.
    metadata: Mapping[str, Any] = field(default_factory=dict)
    #: A fact's or pin's subject (``"deploy window"``): a newer one with the same key (in its
    #: tenant, for its end user) supersedes it (issue 19).
    key: str | None = None

    @classmethod
    def from_mapping(
        cls,
        data: Mapping[str, Any],
        *,
        line: int | None = None,
        defaults: Mapping[str, Any] | None = None,
    ) -> Record:
        """Validate one record (chatbench event or OpenAI message) and build it.

        ``defaults`` fills fields the record leaves out (e.g. ``session`` for a plain message list).
        Raises :class:`InputError` naming the line and the field.
        """
        if not defaults and type(data) is dict:
            plain = _plain_record(cls, data)
            if plain is not None:
                return plain
        if not isinstance(data, Mapping):
            raise InputError(f"expected a JSON object, got {type(data).__name__}", line=line)
        merged: Mapping[str, Any]
        if defaults:
            combined = dict(defaults)
            combined.update({k: v for k, v in data.items() if v is not None or k not in combined})
            merged = combined
        else:
            merged = data  # only read below
        if not _RECORD_FIELDS.issuperset(merged):
            unknown = sorted(set(merged) - _RECORD_FIELDS)
            raise InputError(
                f"unknown field (known: {', '.join(sorted(_RECORD_FIELDS))})",
                field=unknown[0] if unknown[0].strip() else repr(unknown[0]),
                line=line,
            )
        role = merged.get("role", "user")
        if role not in ROLES:
            raise InputError(
                f"{role!r} is not one of {', '.join(sorted(ROLES))}", field="role", line=line
            )
        tool_calls = _tool_calls(merged.get("tool_calls"), line)
        content = merged.get("content")
        if content is None:
            if not tool_calls and not merged.get("attachments"):
                raise InputError("missing (every record needs content)", field="content", line=line)
            content = ""
        elif type(content) is str:
            content = content.strip()
        else:
            content = _content_text(content, line).strip()
        if len(content) > MAX_CONTENT_CHARS:
            raise InputError(
                f"{len(content)} characters is over the limit of {MAX_CONTENT_CHARS}; "
                "store large documents elsewhere and ingest a reference",
                field="content",
                line=line,
            )
        check_text(content, "content", line=line)
        attachments = check_attachments(merged.get("attachments"), line=line)
        if not content and not tool_calls and not attachments:
            raise InputError("is empty", field="content", line=line)
        author_kind = merged.get("author_kind", "human")
        if author_kind not in AUTHOR_KINDS:
            raise InputError(
                f"{author_kind!r} is not one of {', '.join(sorted(AUTHOR_KINDS))}",
                field="author_kind",
                line=line,
            )
        kind = merged.get("kind", "message")
        if kind not in KINDS:
            raise InputError(
                f"{kind!r} is not one of {', '.join(sorted(KINDS))}", field="kind", line=line
            )
        pinned = merged.get("pinned", False)
        if not isinstance(pinned, bool):
            raise InputError("expected true or false", field="pinned", line=line)
        tenant = _optional_str(merged, "tenant", line) or "default"
        session = _optional_str(merged, "session", line) or "default"
        check_scope_name(session, "session", line=line)
        user = _optional_str(merged, "user", line) or None
        if user is not None:
            check_scope_name(user, "user", line=line)
        record_id = _optional_str(merged, "id", line)
        if record_id is not None and not record_id.strip():
            raise InputError("is blank", field="id", line=line)
        created = merged.get("created_at")
        metadata = merged.get("metadata") or {}
        if not isinstance(metadata, Mapping):
            raise InputError("expected an object", field="metadata", line=line)
        if metadata:
            check_json_text(metadata, "metadata", line=line)
        if metadata:  # an empty one always serialises
            try:
                json.dumps(metadata)
            except (TypeError, ValueError) as exc:
                raise InputError(
                    f"not JSON-serialisable: {exc}", field="metadata", line=line
                ) from None
        key = _optional_str(merged, "key", line)
        if key is not None and (not key.strip() or (kind not in ("fact", "pinned") and not pinned)):
            raise InputError(
                "a key names the subject of a fact or pin: give it a non-blank text and "
                "kind 'fact' or 'pinned'",
                field="key",
                line=line,
            )
        return cls(
            id=record_id,
            content=content,
            role=role,
            tenant=tenant,
            session=session,
            user=user,
            channel=_optional_str(merged, "channel", line),
            author=_optional_str(merged, "author", line),
            author_kind=author_kind,
            created_at=None if created is None else parse_time(created, line=line),
            thread_id=_optional_str(merged, "thread_id", line),
            reply_to=_optional_str(merged, "reply_to", line),
            kind="pinned" if pinned and kind == "message" else kind,
            pinned=pinned or kind == "pinned",
            name=_optional_str(merged, "name", line),
            tool_calls=tool_calls,
            tool_call_id=_optional_str(merged, "tool_call_id", line),
            attachments=attachments,
            metadata=dict(metadata),
            key=key,
        )


#: The fields of the common record: plain strings (at most 512 characters, or null), the content
#: and the time. A record with any other field is validated in full.
_PLAIN_STR_FIELDS = _RECORD_FIELDS - {
    "attachments",
    "content",
    "created_at",
    "key",
    "metadata",
    "pinned",
    "tool_calls",
}
_PLAIN_FIELDS = _PLAIN_STR_FIELDS | {"content", "created_at"}


def _plain_record(cls: type[Record], data: dict[str, Any]) -> Record | None:
    """The common record (plain strings, a number or nothing for the time, no tool calls,
    attachments, metadata or ``pinned``) built without the general checks; None for anything
    else, which :meth:`Record.from_mapping` then validates in full (and reports, in its order).

    One copy of the dict and one pass over its values rather than a lookup per field: the
    fields it leaves out take the dataclass's defaults, which are what the general path gives.
    """
    if not _PLAIN_FIELDS.issuperset(data):
        return None
    fields = dict(data)
    content = fields.pop("content", None)
    created = fields.pop("created_at", None)
    for value in fields.values():
        if value is not None and (
            type(value) is not str or len(value) > 512 or not plain_text(value)
        ):
            return None  # the general path names the problem
    if type(content) is not str:
        return None
    get = fields.get
    if (
        get("role", "user") not in ROLES
        or get("author_kind", "human") not in AUTHOR_KINDS
        or get("kind", "message") not in KINDS
    ):
        return None  # None or an unknown value: the general path names it
    record_id = get("id")
    if record_id is not None and not record_id.strip():
        return None
    if not get("tenant", True):  # null or empty
        fields["tenant"] = "default"
    session = get("session", True)
    if not session:
        fields["session"] = "default"
    user = get("user")
    if user is not None and not user:
        return None
    if get("kind") == "pinned":
        fields["pinned"] = True
    if created is not None:
        if type(created) is not float and type(created) is not int:
            return None
        if not math.isfinite(created) or created < 0 or created > 32503680000:
            return None
        created = float(created)
    content = content.strip()
    if not content or len(content) > MAX_CONTENT_CHARS or not plain_text(content):
        return None
    return cls(content=content, created_at=created, **fields)


def _tool_calls(value: object, line: int | None) -> tuple[Mapping[str, Any], ...]:
    if value is None:
        return ()
    if not isinstance(value, list | tuple):
        raise InputError("expected a list", field="tool_calls", line=line)
    calls: list[Mapping[str, Any]] = []
    for index, call in enumerate(value):
        function = call.get("function") if isinstance(call, Mapping) else None
        if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
            raise InputError(
                f"tool call {index} needs function.name", field="tool_calls", line=line
            )
        arguments = function.get("arguments", "")
        assert isinstance(call, Mapping)
        check_json_text(call, f"tool_calls[{index}]", line=line)
        if not isinstance(arguments, str):
            arguments = json.dumps(arguments)
        calls.append(
            {
                "id": str(call.get("id", f"call_{index}")),
                "type": "function",
                "function": {"name": function["name"], "arguments": arguments},
            }
        )
    return tuple(calls)


class Memory(NamedTuple):
    """A stored memory: the record as kept, with its aggregate, access and summary fields.

    A named tuple rather than a dataclass: assembly builds hundreds per call, and a tuple is
    several times cheaper to make. Treat it as immutable.
    """

    rowid: int
    id: str
    tenant: str
    session: str
    channel: str | None
    author: str | None
    author_kind: str
    role: str
    content: str
    created_at: float
    thread_id: str | None
    reply_to: str | None
    kind: str
    pinned: bool
    name: str | None
    tool_calls: tuple[Mapping[str, Any], ...]
    tool_call_id: str | None
    content_hash: str
    dup_count: int
    last_seen_at: float
    access_count: int
    last_accessed_at: float | None
    access_score: float
    included_tokens_total: int
    source_ids: tuple[str, ...] = ()
    time_range: tuple[float, float] | None = None
    attachments: tuple[Mapping[str, Any], ...] = ()
    metadata: Mapping[str, Any] = MappingProxyType({})
    #: An aggregate's newest member's content when its values differ from ``content`` (a bot
    #: family's latest price or counter); seen at ``last_seen_at``.
    latest_content: str | None = None
    #: The end user the memory belongs to (:attr:`Record.user`), or None.
    user: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (times as ISO 8601)."""
        return {
            "id": self.id,
            "tenant": self.tenant,
            "session": self.session,
            "user": self.user,
            "channel": self.channel,
            "author": self.author,
            "author_kind": self.author_kind,
            "role": self.role,
            "content": self.content,
            "created_at": format_time(self.created_at),
            "thread_id": self.thread_id,
            "reply_to": self.reply_to,
            "kind": self.kind,
            "pinned": self.pinned,
            "name": self.name,
            "tool_calls": list(self.tool_calls),
            "tool_call_id": self.tool_call_id,
            "dup_count": self.dup_count,
            "last_seen_at": format_time(self.last_seen_at),
            "latest_content": self.latest_content,
            "access_count": self.access_count,
            "access_score": self.access_score,
            "included_tokens_total": self.included_tokens_total,
            "source_ids": list(self.source_ids),
            "attachments": [dict(a) for a in self.attachments],
            "time_range": ([format_time(t) for t in self.time_range] if self.time_range else None),
        }


@fast_init
@dataclass(frozen=True, kw_only=True, slots=True)
class IngestOutcome:
    """What became of one record: stored, an edit of a known id (``edited``: its text replaced),
    folded into an aggregate, or already known."""

    id: str
    status: IngestStatus
    duplicate_of: str | None = None
    reason: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        out: dict[str, Any] = {"id": self.id, "status": self.status}
        if self.duplicate_of is not None:
            out["duplicate_of"] = self.duplicate_of
        if self.reason is not None:
            out["reason"] = self.reason
        return out


@dataclass(frozen=True, kw_only=True, slots=True)
class IngestResult:
    """One outcome per record, in input order.

    >>> IngestResult(outcomes=()).counts
    {'stored': 0, 'edited': 0, 'duplicate': 0, 'near_duplicate': 0, 'known': 0}
    """

    outcomes: tuple[IngestOutcome, ...]

    @property
    def counts(self) -> dict[str, int]:
        """How many records ended in each status."""
        counts = {"stored": 0, "edited": 0, "duplicate": 0, "near_duplicate": 0, "known": 0}
        for outcome in self.outcomes:
            counts[outcome.status] += 1
        return counts

    def __len__(self) -> int:
        return len(self.outcomes)


@dataclass(frozen=True, kw_only=True, slots=True)
class CandidateReport:
    """One memory the assembler considered: where it went (or why not), its cost and score."""

    id: str
    block: str
    included: bool
    reason: str
    tokens: int
    score: float | None = None
    components: Mapping[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        out: dict[str, Any] = {
            "id": self.id,
            "block": self.block,
            "included": self.included,
            "reason": self.reason,
            "tokens": self.tokens,
        }
        if self.score is not None:
            out["score"] = round(self.score, 6)
        if self.components:
            out["components"] = {k: round(v, 6) for k, v in self.components.items()}
        return out


#: One candidate's entry as the assembler records it: id, block, included, reason, tokens, score,
#: components (see :class:`CandidateReport`).
CandidateRow = tuple[str, str, bool, str, int, "float | None", Mapping[str, float]]


class CandidateReports(Sequence[CandidateReport]):
    """A report's candidate entries, each :class:`CandidateReport` made when first read.

    An assembly considers hundreds of candidates (every retrieval candidate, every recent
    message) and records a reason for each; most callers read the count or a few entries, and
    making every entry up front was ~4 % of an assembly. A tuple in all but type: indexing,
    slicing (a tuple), iteration, ``len``, equality with any sequence of the same entries.
    """

    __slots__ = ("_made", "_rows")

    def __init__(self, rows: Sequence[CandidateRow] = ()) -> None:
        self._rows = tuple(rows)
        self._made: tuple[CandidateReport, ...] | None = None

    def _entries(self) -> tuple[CandidateReport, ...]:
        if self._made is None:
            self._made = tuple(
                CandidateReport(
                    id=id_,
                    block=block,
                    included=included,
                    reason=reason,
                    tokens=tokens,
                    score=score,
                    components=dict(components),
                )
                for id_, block, included, reason, tokens, score, components in self._rows
            )
        return self._made

    def __len__(self) -> int:
        return len(self._rows)

    def __getitem__(self, index: Any) -> Any:
        return self._entries()[index]

    def __iter__(self) -> Iterator[CandidateReport]:
        return iter(self._entries())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, CandidateReports):
            other = other._entries()
        if not isinstance(other, Sequence) or isinstance(other, str):
            return NotImplemented
        return self._entries() == tuple(other)

    __hash__ = None  # type: ignore[assignment]  # unhashable, as the tuple was (dict fields)

    def __repr__(self) -> str:
        return repr(self._entries())


@dataclass(frozen=True, kw_only=True, slots=True)
class BlockReport:
    """One block of a context: its budget, what it used, and the ids it holds."""

    name: str
    budget: int
    used: int
    items: tuple[str, ...]
    note: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        out: dict[str, Any] = {
            "name": self.name,
            "budget": self.budget,
            "used": self.used,
            "items": list(self.items),
        }
        if self.note:
            out["note"] = self.note
        return out


@dataclass(frozen=True, kw_only=True, slots=True)
class Report:
    """Why a context looks the way it does: the cap, the tokenizer, each block and candidate."""

    model: str
    tokenizer: str
    exact: bool
    window: int
    reserve: int
    margin: int
    cap: int
    tokens: int
    fixed: Mapping[str, int]
    blocks: tuple[BlockReport, ...]
    candidates: Sequence[CandidateReport]
    notes: tuple[str, ...] = ()
    #: Ids of memories in the read scope that had no vector yet when the query was searched
    #: (``EngineConfig.assemble_embed_limit`` reached), so retrieval found them by words only.
    lexical_only: tuple[str, ...] = ()
    #: How retrieval was sized for this context (empty without a query): the related block's
    #: budget it was sized by (``related_tokens``), the candidates read from each search
    #: (``candidates``), each named author's nearest turns (``author_candidates``), the hits
    #: whose neighbours were read (``anchors``) and the fusion's ``rrf_k``.
    retrieval: Mapping[str, float] = field(default_factory=dict)

    def block(self, name: str) -> BlockReport | None:
        """The report of the block called ``name``, if the context has it."""
        return next((b for b in self.blocks if b.name == name), None)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {
            "model": self.model,
            "tokenizer": self.tokenizer,
            "exact": self.exact,
            "window": self.window,
            "reserve": self.reserve,
            "margin": self.margin,
            "cap": self.cap,
            "tokens": self.tokens,
            "fixed": dict(self.fixed),
            "blocks": [b.to_dict() for b in self.blocks],
            "candidates": [c.to_dict() for c in self.candidates],
            "notes": list(self.notes),
            "lexical_only": list(self.lexical_only),
            "retrieval": dict(self.retrieval),
        }


@dataclass(frozen=True, kw_only=True, slots=True)
class Context:
    """An assembled context: the messages to send and the account of how they were chosen.

    ``included`` lists the caller's ids of every memory in the messages, in message order;
    ``tokens`` is the prompt's size counted with the model's tokenizer, chat template included.
    """

    id: str
    messages: tuple[Mapping[str, Any], ...]
    included: tuple[str, ...]
    tokens: int
    report: Report

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {
            "id": self.id,
            "messages": [dict(m) for m in self.messages],
            "included": list(self.included),
            "tokens": self.tokens,
            "report": self.report.to_dict(),
        }


def records_from_messages(messages: Sequence[Mapping[str, Any]], **defaults: Any) -> list[Record]:
    """Build records from a plain OpenAI-style ``[{role, content}, ...]`` list."""
    return [Record.from_mapping(m, line=i + 1, defaults=defaults) for i, m in enumerate(messages)]
