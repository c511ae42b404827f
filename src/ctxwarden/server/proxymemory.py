"""What the proxy remembers, for whom, and the one retrieved-memory block it may add.

Who: the end user is the body's ``user`` or the ``X-Ctxwarden-User`` header, the session the
``X-Ctxwarden-Session`` header. When a request names neither, the proxy stores nothing and
retrieves nothing (:attr:`Who.named` is false): it only fits the conversation it was sent.

What: the conversation's messages are stored verbatim (``fold=False``: an agent's transcript is
never de-duplicated; an image or file part becomes an attachment, :func:`attachments_of`), each
under an id derived from the conversation's scope and the message
(the n-th copy of a message gets the same id every time), so a conversation sent again stores
only what is new; the reply is stored under the id the client's echo of it will get.

The memory block: the newest user message is the query; the related memories are searched in
the narrowest scope named (the session if named, else the end user), the conversation's own kept
messages and tool traffic left out, best first within a token budget, and rendered as one
``user`` message of quoted data (:func:`ctxwarden.render.data_intro`). For prompt caches it is
kept as it was (same text, same place) while the newest user message is unchanged (a tool loop)
and while a new search still finds one of its memories; the state is per tenant, end user and
session in a bounded LRU.
"""

from __future__ import annotations

import threading
from collections import Counter, OrderedDict
from collections.abc import Container, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote, urlsplit

import orjson
import xxhash

from ctxwarden import render
from ctxwarden.attachments import MAX_ATTACHMENTS, MAX_NAME_CHARS, MAX_URL_CHARS
from ctxwarden.engine import Engine
from ctxwarden.errors import InputError
from ctxwarden.server.chatfit import message_text
from ctxwarden.textcheck import plain_text
from ctxwarden.tokens import ChatFormat
from ctxwarden.types import Memory, check_scope_name

__all__ = ["SESSION_HEADER", "USER_HEADER", "Block", "Kept", "ProxyMemory", "Who", "who_of"]

SESSION_HEADER = "x-ctxwarden-session"
USER_HEADER = "x-ctxwarden-user"
_NAME_LIMIT = 500
#: Messages remembered per conversation before its id table starts again.
_KNOWN_LIMIT = 200_000


def _name(value: Any, field: str) -> str | None:
    if value is None:
        return None
    if isinstance(value, str) and not value.strip():
        return None  # an empty user or header names nobody
    # the store's rule for session and user names (no NUL, no lone surrogate); the limit leaves
    # room for the "user:" prefix of an end user's own session
    name = check_scope_name(value.strip() if isinstance(value, str) else value, field)
    if len(name) > _NAME_LIMIT:
        raise InputError(f"longer than {_NAME_LIMIT} characters", field=field)
    return name


@dataclass(frozen=True, slots=True)
class Who:
    """The tenant, end user and session a request names (user and session may be None)."""

    tenant: str
    user: str | None
    session: str | None
    #: Whether the caller may read memories: a write-only key is remembered for, but gets no
    #: retrieved-memory block (it quotes stored memories back: :mod:`ctxwarden.server.guard`).
    reads: bool = True

    @property
    def named(self) -> bool:
        """Whether the request named anyone: only then is anything stored or retrieved."""
        return self.user is not None or self.session is not None

    @property
    def conversation(self) -> str:
        """The session the messages are stored in: the named one, else the end user's own (the
        records carry the end user too, so a user-scope read finds all of their sessions)."""
        if self.session is not None:
            return self.session
        return f"user:{self.user}"

    @property
    def scope(self) -> str:
        """The narrowest scope named: ``session`` or ``user``."""
        return "session" if self.session is not None else "user"


def who_of(
    tenant: str, headers: Mapping[str, str], body: Mapping[str, Any], *, reads: bool = True
) -> Who:
    """The end user (``X-Ctxwarden-User`` header, else the body's ``user``) and session;
    ``reads``: whether the caller's key may read memories."""
    user = _name(headers.get(USER_HEADER), f"header {USER_HEADER}")
    if user is None:
        user = _name(body.get("user"), "user")
    session = _name(headers.get(SESSION_HEADER), f"header {SESSION_HEADER}")
    return Who(tenant=tenant, user=user, session=session, reads=reads)


def _semantic_key(message: Mapping[str, Any]) -> str:
    # Only what an agent keeps when it echoes a reply back (clients add null fields of their own).
    calls = [
        [
            c.get("id"),
            (c.get("function") or {}).get("name"),
            (c.get("function") or {}).get("arguments"),
        ]
        for c in message.get("tool_calls") or ()
        if isinstance(c, Mapping)
    ]
    parts = [str(message.get("role")), message_text(message.get("content")).strip()]
    if calls:
        parts.append(orjson.dumps(calls).decode())
    if message.get("tool_call_id"):
        parts.append(str(message["tool_call_id"]))
    return "\x00".join(parts)


def attachments_of(content: Any) -> list[dict[str, str]]:
    """The attachments an OpenAI message's content parts name: each ``image_url`` part as an
    image (its URL's file name, and the URL itself when it is a web address), each ``file``
    part as a file (its ``filename``). Nothing is downloaded, and an inline ``data:`` payload
    is never kept: such an image is remembered as shared, by kind only.

    >>> attachments_of([{"type": "text", "text": "what is this?"},
    ...     {"type": "image_url", "image_url": {"url": "https://x.io/img/cat.png?s=2"}}])
    [{'kind': 'image', 'name': 'cat.png', 'url': 'https://x.io/img/cat.png?s=2'}]
    """
    if not isinstance(content, list):
        return []
    found: list[dict[str, str]] = []
    for part in content:
        if not isinstance(part, Mapping):
            continue
        if part.get("type") == "image_url":
            image = part.get("image_url")
            url = image.get("url") if isinstance(image, Mapping) else image
            if not isinstance(url, str) or not plain_text(url):
                continue
            web = url[:8].lower().startswith(("http://", "https://"))
            name = unquote(urlsplit(url).path.rsplit("/", 1)[-1]) if web else ""
            name = " ".join(name.split())[:MAX_NAME_CHARS] if plain_text(name) else ""
            item = {"kind": "image", "name": name or "inline image"}
            if web and len(url) <= MAX_URL_CHARS:
                item["url"] = url
            found.append(item)
        elif part.get("type") == "file":
            file = part.get("file")
            filename = file.get("filename") if isinstance(file, Mapping) else None
            if isinstance(filename, str) and filename.strip() and plain_text(filename):
                found.append({"kind": "file", "name": " ".join(filename.split())[:MAX_NAME_CHARS]})
    return found[:MAX_ATTACHMENTS]


def _record(message: Mapping[str, Any], id: str) -> dict[str, Any] | None:
    if message.get("role") in ("system", "developer"):
        return None  # the operator's instructions, not the conversation: never retrieved
    content = message_text(message.get("content")).strip()
    calls = message.get("tool_calls") or []
    attachments = attachments_of(message.get("content"))
    if not content and not calls and not attachments:
        return None
    record: dict[str, Any] = {"id": id, "role": message.get("role"), "content": content or None}
    if attachments:
        record["attachments"] = attachments
    if calls:
        record["tool_calls"] = calls
    if message.get("tool_call_id"):
        record["tool_call_id"] = message["tool_call_id"]
    if isinstance(message.get("name"), str):
        record["name"] = message["name"]
    return record


@dataclass
class _Conversation:
    """What was stored of one conversation: the last request's message keys and ids, the id of
    every (message key, n-th occurrence) seen, and how often each semantic key was stored (for
    the n-th-copy ids)."""

    keys: list[int] = field(default_factory=list)
    ids: list[str] = field(default_factory=list)
    position: dict[str, int] = field(default_factory=dict)  # id -> index in the last request
    occurrences: Counter[int] = field(default_factory=Counter)
    known: dict[tuple[int, int], str] = field(default_factory=dict)
    seen: Counter[str] = field(default_factory=Counter)
    block: Block | None = None
    question: int | None = None
    cut: int | None = None  # where the conversation was cut when the block was made


class Kept:
    """The ids of a conversation's messages that go upstream, as a container: ``id in kept``
    is O(1) however long the conversation (memory blocks leave these out)."""

    def __init__(self, position: Mapping[str, int], head: int, tail_from: int) -> None:
        self._position = position
        self._head = head
        self._tail_from = tail_from

    def __contains__(self, id: object) -> bool:
        index = self._position.get(id) if isinstance(id, str) else None
        return index is not None and (index < self._head or index >= self._tail_from)


@dataclass(frozen=True, slots=True)
class Block:
    """The retrieved-memory message: its text, tokens and the ids of the memories in it."""

    text: str
    tokens: int
    ids: frozenset[str]

    def message(self) -> dict[str, str]:
        """The block as the chat message the proxy inserts."""
        return {"role": render.DATA_ROLE, "content": self.text}


class ProxyMemory:
    """Stores conversations and builds memory blocks; per-conversation state in an LRU."""

    def __init__(self, engine: Engine, *, conversations: int = 256) -> None:
        self.engine = engine
        self.size = conversations
        self._state: OrderedDict[tuple[str, str | None, str | None], _Conversation] = OrderedDict()
        self._lock = threading.Lock()

    def _conversation(self, who: Who) -> _Conversation:
        key = (who.tenant, who.user, who.session)
        with self._lock:
            state = self._state.get(key)
            if state is None:
                state = _Conversation()
                self._state[key] = state
                while len(self._state) > self.size:
                    self._state.popitem(last=False)
            else:
                self._state.move_to_end(key)
            return state

    def _id(self, who: Who, semantic: str, copy: int) -> str:
        raw = f"{who.user}\x00{who.conversation}\x00{semantic}\x00{copy}".encode(
            "utf-8", "surrogatepass"
        )
        return f"px-{xxhash.xxh3_128_hexdigest(raw)}"

    def remember(
        self,
        who: Who,
        messages: Sequence[Mapping[str, Any]],
        keys: Sequence[int],
        *,
        later: list[dict[str, Any]] | None = None,
        later_from: int = 0,
    ) -> tuple[dict[str, int], list[str]]:
        """Store the messages not stored yet (``keys``: their cache keys, one per message).

        Returns the ingest counts and every message's id (for leaving them out of retrieval).
        A conversation that grew is looked at from where the last request ended; one whose
        history the client changed (trimmed, edited) is looked up message by message.
        ``later``: the records of messages from ``later_from`` on go there instead, for the
        caller to :meth:`store` (and :meth:`reset` if that fails): the proxy stores the
        messages it sends anyway while the upstream answers.
        """
        state = self._conversation(who)
        if len(state.known) > _KNOWN_LIMIT:
            state.known.clear()  # ids restart from the conversation's start, the same ids
            state.seen.clear()
        done = len(state.keys)
        if done <= len(keys) and state.keys == list(keys[:done]):
            start, ids, occurrences = done, state.ids[:done], state.occurrences
            position = state.position
        else:
            start, ids, occurrences, position = 0, [], Counter(), {}
            # not a continuation of the last request (a new conversation of the same end user,
            # or a history the client rewrote): its memory block starts afresh
            state.block, state.question, state.cut = None, None, None
        records: list[dict[str, Any]] = []
        for index in range(start, len(messages)):
            key = keys[index]
            occurrences[key] += 1
            composite = (key, occurrences[key])
            id = state.known.get(composite)
            if id is None:
                semantic = _semantic_key(messages[index])
                state.seen[semantic] += 1
                id = self._id(who, semantic, state.seen[semantic])
                state.known[composite] = id
                record = _record(messages[index], id)
                if record is not None:
                    if later is not None and index >= later_from:
                        later.append(record)
                    else:
                        records.append(record)
            ids.append(id)
            position.setdefault(id, index)
        counts = self._ingest(who, records)
        state.keys = list(keys)
        state.ids = ids
        state.occurrences = occurrences
        state.position = position
        return counts, ids

    def reset(self, who: Who) -> None:
        """Forget what was stored of ``who``'s conversation (after a store failed): the next
        request stores it again from its start, under the same ids."""
        with self._lock:
            self._state.pop((who.tenant, who.user, who.session), None)

    def kept(self, who: Who, head: int, tail_from: int) -> Kept:
        """The memories that are messages of the conversation as sent: its first ``head``
        messages and those from ``tail_from`` on (the ones between were trimmed)."""
        return Kept(self._conversation(who).position, head, tail_from)

    def _ingest(self, who: Who, records: list[dict[str, Any]]) -> dict[str, int]:
        if not records:
            return {}
        result = self.engine.ingest(
            records, tenant=who.tenant, session=who.conversation, user=who.user, fold=False
        )
        return {status: count for status, count in result.counts.items() if count}

    def reply_record(self, who: Who, message: Mapping[str, Any]) -> dict[str, Any] | None:
        """The upstream's reply as a record, under the id the client's echo of it will get
        (so whichever is stored first, the other is ``known``)."""
        state = self._conversation(who)
        reply = {**message, "role": "assistant"}
        semantic = _semantic_key(reply)
        return _record(reply, self._id(who, semantic, state.seen[semantic] + 1))

    def store(self, who: Who, records: list[dict[str, Any]]) -> dict[str, int]:
        """Store ``records`` for ``who`` verbatim (never folded); the non-zero counts."""
        return self._ingest(who, records)

    def remember_reply(self, who: Who, message: Mapping[str, Any]) -> None:
        """Store the upstream's reply (see :meth:`reply_record`)."""
        record = self.reply_record(who, message)
        if record is not None:
            self._ingest(who, [record])

    def _search(self, who: Who, query: str, limit: int) -> list[Memory]:
        """The one place retrieval is scoped: the narrowest scope the request named (the
        session, of that end user when one is named; else the end user), filtered in the store
        query. Only the question's first ``retrieval.query_chars`` characters are searched for
        (all retrieval reads), so a conversation's longest message never meets the query limit
        of ``search``."""
        query = query[: self.engine.config.retrieval.query_chars]
        found = self.engine.search(
            query, tenant=who.tenant, session=who.session, user=who.user, limit=limit
        )
        return [memory for memory, _ in found]

    def block(
        self,
        who: Who,
        question: str,
        *,
        exclude: Container[str],
        budget: int,
        fmt: ChatFormat,
        cut: int | None = None,
    ) -> tuple[Block | None, bool]:
        """The memory block for ``question`` within ``budget`` tokens, and whether it is the
        previous request's block kept as it was (see the module's docstring).

        ``cut``: where the conversation's kept tail starts. When given, the block (or its
        absence) is kept while the cut stays where it was, and only changes when the cut moves:
        a new block rewrites the prompt from its place on, which the cut does anyway.
        """
        if not who.reads:
            return None, False  # a write-only key reads nothing, quoted memories included
        state = self._conversation(who)
        asked = xxhash.xxh3_64_intdigest(question.encode("utf-8", "surrogatepass"))
        previous = state.block
        valid = previous is not None and previous.tokens <= budget
        if previous is not None and any(id in exclude for id in previous.ids):
            valid = False  # one of its memories is now in the conversation itself
        same_cut = cut is not None and state.cut == cut
        if same_cut and (valid or previous is None):
            return previous, previous is not None
        if valid and state.question == asked:
            return previous, True
        state.question = asked
        state.cut = cut
        if not valid:
            previous = None
        if not question.strip() or budget <= 0:
            state.block = None
            return None, False
        hits = [
            m
            for m in self._search(who, question, limit=20)
            if m.id not in exclude and m.role != "tool" and not m.tool_calls
        ]
        if previous is not None and any(m.id in previous.ids for m in hits):
            return previous, True
        block = self._render(hits, budget, fmt)
        state.block = block
        return block, False

    @staticmethod
    def _render(hits: Sequence[Memory], budget: int, fmt: ChatFormat) -> Block | None:
        intro = render.data_intro()
        lines: list[str] = []
        ids: list[str] = []
        for memory in hits:
            candidate = [*lines, render.line_text(memory)]
            text = intro + "".join(candidate)
            if fmt.message_tokens(render.DATA_ROLE, text.strip()) > budget:
                break
            lines, ids = candidate, [*ids, memory.id]
        if not lines:
            return None
        text = (intro + "".join(lines)).rstrip("\n")
        return Block(
            text=text, tokens=fmt.message_tokens(render.DATA_ROLE, text), ids=frozenset(ids)
        )
