"""One conversation held in an :class:`~ctxwarden.Engine`, with no framework involved.

Every adapter stands on :class:`Conversation`: it names one tenant, one session and optionally
one end user, and every read and write goes through that scope (rule 6 of the design: an adapter
never sees another user's or session's memories). Messages are OpenAI-shaped dicts
(``{"role", "content", "tool_calls", "tool_call_id", "name"}``); the adapters convert their own
message types to and from them.

Two ways to write:

- :meth:`Conversation.add` appends messages as new turns (a chat history's ``add_messages``, a
  session's ``add_items``): each gets a fresh id, so a repeated "yes" is a second turn.
- :meth:`Conversation.fit` takes the whole conversation a framework holds (a graph's messages, the
  list handed to a trimmer), stores the messages after the part that matches the stored tail
  (so sending the same list again stores nothing, and a history already written through
  :meth:`Conversation.add` is not written twice), and returns
  the context :meth:`Engine.assemble` builds: exact token budget with the model's tokenizer,
  tool calls kept with their results, related memory of the scope, the question last.

>>> from ctxwarden import Engine
>>> engine = Engine.open(":memory:")
>>> chat = Conversation(engine, session="s1", user="alice")
>>> _ = chat.add([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}])
>>> [m["content"] for m in chat.messages()]
['hi', 'hello']
>>> chat.pop()["content"]
'hello'
>>> engine.close()
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ctxwarden.engine import Engine
from ctxwarden.errors import InputError
from ctxwarden.scope import resolve as resolve_scope
from ctxwarden.types import ROLES, Context, IngestResult, Memory, Scope, check_scope_name

__all__ = ["Conversation", "message_text"]

# Pages of the session's history read at a time (newest first, an index range scan each).
_PAGE = 256


def message_text(content: Any) -> str:
    """The text of an OpenAI-style ``content``: a string, or the text parts of a list of parts.

    >>> message_text([{"type": "text", "text": "a"}, {"type": "image_url"}])
    'a'
    """
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            str(part.get("text", ""))
            for part in content
            if isinstance(part, Mapping)
            and part.get("type") in ("text", "input_text", "output_text")
        )
    return str(content)


def _arguments(value: Any) -> str:
    # Frameworks re-serialise tool arguments ('{"a":1}' comes back as '{"a": 1}'): compare values.
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return str(value)
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)


def _key(message: Mapping[str, Any] | Memory) -> tuple[str, ...]:
    # What identifies a turn when a framework sends the conversation again: frameworks keep
    # their own ids and add null fields, so only the substance counts.
    if isinstance(message, Memory):
        message = _as_dict(message)
    calls = [
        [
            str(call.get("id") or ""),
            str((call.get("function") or {}).get("name")),
            _arguments((call.get("function") or {}).get("arguments")),
        ]
        for call in message.get("tool_calls") or []
        if isinstance(call, Mapping)
    ]
    return (
        str(message.get("role")),
        message_text(message.get("content")).strip(),
        json.dumps(calls, separators=(",", ":")),
        str(message.get("tool_call_id") or ""),
    )


def _as_dict(memory: Memory, *, metadata: bool = False) -> dict[str, Any]:
    message: dict[str, Any] = {"role": memory.role, "content": memory.content}
    if metadata and memory.metadata:
        message["metadata"] = dict(memory.metadata)
    if memory.tool_calls:
        message["tool_calls"] = [dict(call) for call in memory.tool_calls]
    if memory.tool_call_id:
        message["tool_call_id"] = memory.tool_call_id
    if memory.name:
        message["name"] = memory.name
    return message


class Conversation:
    """One conversation (``tenant``, ``session``, optional end ``user``) in ``engine``.

    ``model`` picks the tokenizer and window for :meth:`fit` (the engine's default model when
    None); ``budget`` caps a fitted context's tokens (the model's window minus its reserve when
    None). ``scope`` is what the related block may draw on: ``"session"`` (the default),
    ``"user"`` (the end user's other sessions; needs ``user``) or ``"tenant"``. Recent history,
    :meth:`messages`, :meth:`pop` and :meth:`clear` always stay inside the session (and the
    user, when named).

    Bad names raise :class:`~ctxwarden.errors.InputError` naming the field.
    """

    def __init__(
        self,
        engine: Engine,
        *,
        session: str,
        tenant: str | None = None,
        user: str | None = None,
        model: str | None = None,
        budget: int | None = None,
        scope: Scope | None = None,
    ) -> None:
        check_scope_name(session, "session")
        if user is not None:
            check_scope_name(user, "user")
        if tenant is not None:
            check_scope_name(tenant, "tenant")
        if budget is not None and (isinstance(budget, bool) or budget < 1):
            raise InputError(f"{budget!r} must be a positive number of tokens", field="budget")
        # Validated now, so a bad scope fails when the adapter is built, not on the first turn.
        resolve_scope(session=session, user=user, scope=scope)
        self.engine = engine
        self.session = session
        self.tenant = tenant or engine.config.tenant
        self.user = user
        self.model = model
        self.budget = budget
        self.scope = scope
        self._fitted: list[tuple[str, ...]] = []  # turns fit() stored that add() may see again

    # -- writes ------------------------------------------------------------------------------

    def add(self, messages: Iterable[Mapping[str, Any]]) -> list[str]:
        """Append ``messages`` as new turns, in order; the ids given to them.

        Every message is stored, a repeat included (a turn is a turn), and nothing is folded;
        only the turns this object's :meth:`fit` stored since are skipped, in order.
        All or nothing: an invalid message raises :class:`~ctxwarden.errors.InputError` naming
        its field and stores none of the batch.
        """
        records: list[dict[str, Any]] = []
        for index, message in enumerate(messages):
            record = self._record(message, index, f"cw-{uuid.uuid4().hex}")
            if record is None:
                continue
            if self._fitted:
                if _key(record) == self._fitted[0]:
                    # fit() stored this turn already (a framework that also saves it after
                    # the model call): once is enough.
                    self._fitted.pop(0)
                    continue
                self._fitted.clear()  # a turn fit() did not see: the rest is new too
            records.append(record)
        self._ingest(records)
        return [str(r["id"]) for r in records]

    def fit(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        budget: int | None = None,
        model: str | None = None,
        system: str | None = None,
        tools: Sequence[Mapping[str, Any]] | None = None,
        query: str | None = None,
        remember: bool = True,
    ) -> Context:
        """Store what is new in ``messages`` (the whole conversation as the framework holds it)
        and return the context to send: within ``budget`` tokens (else the conversation's) by
        the model's real tokenizer, tool calls kept with their results, related memory of the
        conversation's scope in a quoted data block, and the user's message last.

        ``query`` overrides the question (else the last message when it is the user's; with no
        messages, the newest stored message when it is the user's). ``remember=False`` stores
        nothing: for a framework that stores the turn itself after the model call, the context
        is the stored history plus ``query`` (sent last unless it is already the newest turn).

        The last message drives retrieval when it is the user's; when it is a tool result (an
        agent's loop within one turn) the history is fitted with no retrieval, the result last.

        System messages are not stored: they join ``system``, which the context sends first.
        What is already stored is not stored again: the longest run of leading messages that
        equals the stored conversation's tail (role, text, tool calls, tool-call id) is taken as
        known, and only the messages after it are added as new turns. A framework may so send
        the whole conversation every call, or only its latest part.
        """
        system_parts, records, last = self._split(messages)
        if system and system.strip():
            system_parts.insert(0, system)
        records = records[self._known_prefix(records) :] if remember and records else []
        self._fitted.extend(_key(r) for r in records)
        # The question drives retrieval and is sent last. Only a turn that ends with the user's
        # message has one: after a tool result the model must see that result last, and
        # assemble would repeat a query it does not find newest in the history.
        if last is None and query is None:
            newest = self._page(None, 1)
            if newest and newest[0].role == "user":
                query = newest[0].content
        elif query is None and last is not None and last.get("role") == "user":
            query = message_text(last.get("content")).strip() or None
        self._ingest(records)
        return self.engine.assemble(
            session=self.session,
            user=self.user,
            tenant=self.tenant,
            scope=self.scope,
            query=query,
            model=model or self.model,
            budget=budget if budget is not None else self.budget,
            system="\n\n".join(system_parts) or None,
            tools=tools,
        )

    def remember(self, messages: Sequence[Mapping[str, Any]]) -> list[str]:
        """Store what is new in ``messages`` (the whole conversation as the framework holds
        it, or its latest part) as :meth:`fit` does, without assembling; the new ids."""
        _, records, _ = self._split(messages)
        records = records[self._known_prefix(records) :] if records else []
        self._ingest(records)
        return [str(r["id"]) for r in records]

    def _split(
        self, messages: Sequence[Mapping[str, Any]]
    ) -> tuple[list[str], list[dict[str, Any]], Mapping[str, Any] | None]:
        # system texts, records of the other messages, and the last non-system message
        system_parts: list[str] = []
        records: list[dict[str, Any]] = []
        last: Mapping[str, Any] | None = None
        for index, message in enumerate(messages):
            if not isinstance(message, Mapping):
                raise InputError("expected a message object", field=f"messages[{index}]")
            if message.get("role") in ("system", "developer"):
                text = message_text(message.get("content"))
                if text.strip():
                    system_parts.append(text)
                continue
            record = self._record(message, index, f"cw-{uuid.uuid4().hex}")
            if record is not None:
                records.append(record)
            last = message
        return system_parts, records, last

    def _known_prefix(self, records: list[dict[str, Any]]) -> int:
        """How many leading ``records`` are the stored conversation's tail, in order."""
        stored = [_key(m) for m in self._tail(len(records))]
        wanted = [_key(r) for r in records]
        for size in range(min(len(stored), len(wanted)), 0, -1):
            if wanted[:size] == stored[len(stored) - size :]:
                return size
        return 0

    def pop(self, *, metadata: bool = False) -> dict[str, Any] | None:
        """Remove the newest message of the conversation and return it (None when empty).

        The message is erased as :meth:`Engine.delete` erases: a content-free tombstone stays.
        """
        newest = self._page(None, 1)
        if not newest:
            return None
        self.engine.delete(newest[0].id, tenant=self.tenant, reason="popped")
        return _as_dict(newest[0], metadata=metadata)

    def clear(self) -> int:
        """Erase every message of the conversation (of its end user only, when one is named);
        how many were erased. Other sessions and users are untouched."""
        if self.user is None:
            return self.engine.delete_session(self.session, tenant=self.tenant, reason="cleared")
        erased = 0
        for memory in self.memories():
            self.engine.delete(memory.id, tenant=self.tenant, reason="cleared")
            erased += 1
        return erased

    # -- reads -------------------------------------------------------------------------------

    def _tail(self, limit: int) -> list[Memory]:
        return self.memories(limit) if limit > 0 else []

    def memories(self, limit: int | None = None) -> list[Memory]:
        """The conversation's stored memories, oldest first (the newest ``limit`` when given)."""
        if limit is not None and limit < 1:
            raise InputError(f"{limit!r} must be at least 1", field="limit")
        newest_first: list[Memory] = []
        before: tuple[float, int] | None = None
        while limit is None or len(newest_first) < limit:
            wanted = _PAGE if limit is None else min(_PAGE, limit - len(newest_first))
            page = self._page(before, wanted)
            newest_first.extend(page)
            if len(page) < wanted:
                break
            before = (page[-1].created_at, page[-1].rowid)
        newest_first.reverse()
        return newest_first

    def messages(self, limit: int | None = None, *, metadata: bool = False) -> list[dict[str, Any]]:
        """The conversation as OpenAI-shaped messages, oldest first (the newest ``limit``);
        with ``metadata``, each message's stored ``metadata`` too (where it has some)."""
        return [_as_dict(memory, metadata=metadata) for memory in self.memories(limit)]

    # -- internals ---------------------------------------------------------------------------

    def _page(self, before: tuple[float, int] | None, limit: int) -> list[Memory]:
        self.engine.flush_log()
        return self.engine.store.recent(
            self.tenant, self.session, before=before, limit=limit, user=self.user
        )

    def _record(self, message: Mapping[str, Any], index: int, id: str) -> dict[str, Any] | None:
        if not isinstance(message, Mapping):
            raise InputError("expected a message object", field=f"messages[{index}]")
        role = message.get("role")
        if role == "developer":
            role = "system"
        if role not in ROLES:
            raise InputError(
                f"{role!r} is not one of {', '.join(sorted(ROLES))}",
                field=f"messages[{index}].role",
            )
        content = message_text(message.get("content")).strip()
        calls = [dict(c) for c in message.get("tool_calls") or [] if isinstance(c, Mapping)]
        if not content and not calls:
            return None  # an empty turn (an assistant message cut off) carries nothing to keep
        record: dict[str, Any] = {"id": id, "role": role, "content": content or None}
        if calls:
            record["tool_calls"] = calls
        if message.get("tool_call_id"):
            record["tool_call_id"] = str(message["tool_call_id"])
        if isinstance(message.get("name"), str) and message["name"]:
            record["name"] = message["name"]
        if isinstance(message.get("metadata"), Mapping):
            # an adapter's own copy of the framework's item, returned as it was given
            record["metadata"] = dict(message["metadata"])
        return record

    def _ingest(self, records: list[dict[str, Any]]) -> IngestResult | None:
        if not records:
            return None
        # fold=False: a conversation is kept verbatim, so the history read back is the one sent.
        return self.engine.ingest(
            records, tenant=self.tenant, session=self.session, user=self.user, fold=False
        )
