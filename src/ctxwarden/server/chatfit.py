"""The chat-completions adapter of :mod:`ctxwarden.fit`: validate, group, count, render.

A client's ``messages`` are checked against the OpenAI chat schema (roles, content shapes, tool
calls and their results), grouped into :class:`~ctxwarden.fit.Unit` s (a leading system or
developer message each; then a user message and everything after it up to the next user
message, so a call and its results share a unit), and counted with the model's tokenizer and
chat format. :func:`fit_chat` asks :func:`ctxwarden.fit.fit` which units go upstream and
returns the client's own message objects for them: a conversation that fits is the client's
list itself, and a kept message is never rebuilt.

Images and other non-text content parts cost a documented flat amount each
(:data:`IMAGE_TOKENS`: an OpenAI high-detail 1024x1024 image, 85 + 4 x 170 tokens; ``"detail":
"low"`` images :data:`LOW_DETAIL_IMAGE_TOKENS`), because their real cost depends on the
upstream's vision encoder, which the proxy cannot see.

Token counts are cached per message (a 128-bit hash of what is counted, per tokenizer and
format) in a bounded two-generation cache, so a growing conversation only counts what is new.
"""

from __future__ import annotations

import threading
from bisect import bisect_right
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import orjson
import xxhash

from ctxwarden import tokens
from ctxwarden.errors import InputError
from ctxwarden.fit import Fitted, Lead, Unit, fit, turn_spans

__all__ = [
    "IMAGE_TOKENS",
    "LOW_DETAIL_IMAGE_TOKENS",
    "ROLES",
    "ChatFit",
    "Checked",
    "Conversations",
    "TokenCache",
    "fit_chat",
    "kept_messages",
    "message_text",
    "validate_messages",
]

#: A non-text content part (image, audio, file) as counted: an OpenAI high-detail image tile set.
IMAGE_TOKENS = 765
#: An image part with ``"detail": "low"``.
LOW_DETAIL_IMAGE_TOKENS = 85
#: The roles of the OpenAI chat schema (``function`` is its deprecated tool-result role).
ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})
_PART_TYPES = frozenset({"text", "image_url", "input_audio", "file", "refusal"})


def message_text(content: Any) -> str:
    """The text of a message's content: the string, or its text parts joined by newlines."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            p[p["type"]]
            for p in content
            if isinstance(p, dict)
            and p.get("type") in ("text", "refusal")
            and isinstance(p.get(p["type"]), str)
        )
    return ""


def _bad(index: int, where: str, problem: str) -> InputError:
    return InputError(problem, field=f"messages[{index}]{where}")


def _check_content(index: int, message: Mapping[str, Any], *, required: bool) -> None:
    content = message.get("content")
    if content is None:
        if required:
            raise _bad(index, ".content", "missing: a string or a list of content parts")
        return
    if isinstance(content, str):
        return
    if not isinstance(content, list):
        raise _bad(
            index, ".content", f"must be a string or a list of parts, not {type(content).__name__}"
        )
    for position, part in enumerate(content):
        where = f".content[{position}]"
        if not isinstance(part, dict):
            raise _bad(index, where, "must be an object with a 'type'")
        kind = part.get("type")
        if kind not in _PART_TYPES:
            raise _bad(
                index, f"{where}.type", f"unknown part type {kind!r}: one of {sorted(_PART_TYPES)}"
            )
        if kind in ("text", "refusal") and not isinstance(part.get(kind), str):
            raise _bad(index, f"{where}.{kind}", "must be a string")


def _check_calls(index: int, message: Mapping[str, Any]) -> list[str]:
    calls = message.get("tool_calls")
    if calls is None:
        return []
    if not isinstance(calls, list):
        raise _bad(index, ".tool_calls", "must be a list of tool calls")
    ids: list[str] = []
    for position, call in enumerate(calls):
        where = f".tool_calls[{position}]"
        if not isinstance(call, dict):
            raise _bad(index, where, "must be an object with 'id' and 'function'")
        call_id = call.get("id")
        if not isinstance(call_id, str) or not call_id:
            raise _bad(index, f"{where}.id", "must be a non-empty string")
        if call_id in ids:
            raise _bad(index, f"{where}.id", f"{call_id!r} is used twice in this message")
        function = call.get("function")
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise _bad(index, f"{where}.function", "must be {'name': str, 'arguments': str}")
        if not isinstance(function.get("arguments", ""), str):
            raise _bad(index, f"{where}.function.arguments", "must be a JSON string")
        ids.append(call_id)
    return ids


def validate_messages(messages: Any, *, start: int = 0) -> list[Lead]:
    """Check ``messages`` against the chat schema; the :data:`~ctxwarden.fit.Lead` of each.

    Raises :class:`~ctxwarden.errors.InputError` naming ``messages[i]...``: an unknown role, a
    malformed content or tool call, a ``tool`` message that answers no call of the assistant
    message just before it, an assistant ``tool_calls`` message not followed by a result for
    every call. ``start``: check only ``messages[start:]`` (the ones before were checked as a
    whole conversation, so no call is open there) and return their leads.
    """
    if not isinstance(messages, list) or not messages:
        raise InputError("expected a non-empty list of messages", field="messages")
    leads: list[Lead] = []
    pending: dict[str, int] = {}  # open call id -> the index of the assistant message
    for index, message in enumerate(messages[start:], start):
        if type(message) is dict and len(message) == 2 and not pending:
            # the common shapes, checked in full here: {"role": user|assistant, "content": str}
            role = message.get("role")
            if type(message.get("content")) is str and role in ("user", "assistant"):
                leads.append("user" if role == "user" else "other")
                continue
        if not isinstance(message, dict):
            raise _bad(index, "", "must be an object with a 'role'")
        role = message.get("role")
        if role not in ROLES:
            raise _bad(index, ".role", f"unknown role {role!r}: one of {sorted(ROLES)}")
        if role != "tool" and pending:
            call_id, owner = next(iter(pending.items()))
            raise _bad(
                owner,
                ".tool_calls",
                f"call {call_id!r} has no result: each call needs a 'tool' message with its "
                "tool_call_id right after the assistant message",
            )
        name = message.get("name")
        if name is not None and not isinstance(name, str):
            raise _bad(index, ".name", "must be a string")
        if role == "tool":
            answered = message.get("tool_call_id")
            if not isinstance(answered, str) or not answered:
                raise _bad(index, ".tool_call_id", "must be a non-empty string")
            call_id = answered
            if call_id not in pending:
                raise _bad(
                    index,
                    ".tool_call_id",
                    f"{call_id!r} answers no call of the assistant message before it",
                )
            del pending[call_id]
            _check_content(index, message, required=True)
            leads.append("other")
        elif role == "assistant":
            ids = _check_calls(index, message)
            if (
                not ids
                and message.get("content") is None
                and not message.get("function_call")
                and not message.get("refusal")
            ):
                raise _bad(index, ".content", "missing: an assistant needs content or tool_calls")
            _check_content(index, message, required=False)
            pending = dict.fromkeys(ids, index)
            leads.append("other")
        else:
            if role != "function" and message.get("tool_calls") is not None:
                raise _bad(
                    index, ".tool_calls", f"only assistant messages have tool calls, not {role}"
                )
            _check_content(index, message, required=role != "function")
            leads.append("system" if role in ("system", "developer") else
                         "user" if role == "user" else "other")  # fmt: skip
    if pending:
        call_id, owner = next(iter(pending.items()))
        raise _bad(owner, ".tool_calls", f"call {call_id!r} has no result: send a 'tool' message")
    return leads


class TokenCache:
    """Bounded message-token cache: two generations of at most ``size`` entries each.

    Lookups and stores are single dict operations (atomic under the GIL), so request threads
    share it without a lock; when the young generation is full it becomes the old one.
    """

    def __init__(self, size: int = 200_000) -> None:
        self.size = size
        self._young: dict[int, int] = {}
        self._old: dict[int, int] = {}

    def get(self, key: int) -> int | None:
        """The cached count for ``key`` (promoted to the young generation), or None."""
        value = self._young.get(key)
        if value is None:
            value = self._old.get(key)
            if value is not None:
                self.put(key, value)
        return value

    def put(self, key: int, value: int) -> None:
        """Remember ``value`` for ``key``."""
        if len(self._young) >= self.size:
            self._old = self._young
            self._young = {}
        self._young[key] = value

    def __len__(self) -> int:
        return len(self._young) + len(self._old)


@dataclass(slots=True)
class _Run:
    """A conversation as last checked and counted: the next request of a growing conversation
    starts with these very messages, so only its new ones are checked and counted."""

    messages: list[Any]
    leads: list[Lead]
    counted: dict[str, tuple[list[int], list[int], list[Unit]]]  # per format: keys, costs, units


class Checked(NamedTuple):
    """A checked conversation: the lead of each message, and the earlier request it extends."""

    leads: list[Lead]
    base: _Run | None


class Conversations:
    """The last few conversations checked, so a growing one is checked and counted only where
    it is new. Bounded: at most ``runs`` conversations and ``messages`` messages in all."""

    def __init__(self, runs: int = 16, messages: int = 200_000) -> None:
        self.runs = runs
        self.messages = messages
        self._runs: OrderedDict[int, _Run] = OrderedDict()
        self._lock = threading.Lock()

    @staticmethod
    def _identity(messages: list[Any]) -> int:
        # the first three messages: a shared system prompt alone would not tell users apart
        return hash(tuple(_key("", m) if type(m) is dict else 0 for m in messages[:3]))

    def check(self, messages: Any) -> Checked:
        """:func:`validate_messages`, for the new messages only when the conversation grew."""
        if not isinstance(messages, list) or not messages:
            return Checked(validate_messages(messages), None)
        with self._lock:
            run = self._runs.get(self._identity(messages))
        if run is not None:
            done = len(run.messages)
            if done <= len(messages) and messages[:done] == run.messages:
                return Checked([*run.leads, *validate_messages(messages, start=done)], run)
        return Checked(validate_messages(messages), None)

    def keep(self, messages: list[Any], run: _Run) -> None:
        """Remember ``run`` as the latest state of its conversation."""
        identity = self._identity(messages)
        with self._lock:
            self._runs.pop(identity, None)
            self._runs[identity] = run
            total = sum(len(r.messages) for r in self._runs.values())
            while self._runs and (len(self._runs) > self.runs or total > self.messages):
                _, dropped = self._runs.popitem(last=False)
                total -= len(dropped.messages)


def _parts_cost(content: Any) -> int:
    if not isinstance(content, list):
        return 0
    total = 0
    for part in content:
        kind = part.get("type")
        if kind in ("text", "refusal"):
            continue
        detail = (part.get("image_url") or {}).get("detail") if kind == "image_url" else None
        total += LOW_DETAIL_IMAGE_TOKENS if detail == "low" else IMAGE_TOKENS
    return total


def _key(prefix: str, message: Mapping[str, Any]) -> int:
    content = message.get("content")
    if type(content) is str and len(message) == 2:
        # The common case (role + text), ~20x cheaper than serialising: Python's string hash
        # (64-bit, computed once per string object); a collision among the 200k cached keys has
        # a chance of about 1e-9.
        return hash((prefix, message.get("role"), content))
    data = prefix.encode() + orjson.dumps(message, option=orjson.OPT_SORT_KEYS)
    return xxhash.xxh3_128_intdigest(data)


def _message_tokens(fmt: tokens.ChatFormat, message: Mapping[str, Any]) -> int:
    role = str(message["role"])
    name = message.get("name") or None
    content = message.get("content")
    # as sent: the content goes upstream unstripped (templates that trim do it in content_text)
    total = fmt.message_tokens(role, message_text(content), name=name)
    total += _parts_cost(content)
    for call in message.get("tool_calls") or ():
        function = call["function"]
        total += fmt.tool_call_tokens(function["name"], function.get("arguments", "{}"))
    legacy = message.get("function_call")
    if isinstance(legacy, dict) and isinstance(legacy.get("name"), str):
        total += fmt.tool_call_tokens(legacy["name"], legacy.get("arguments", "{}"))
    return total


@dataclass(frozen=True, slots=True, kw_only=True)
class ChatFit:
    """What goes upstream: the messages (the client's own objects), the decision, the counts."""

    messages: list[Any]
    fitted: Fitted
    units: tuple[Unit, ...]
    memory_at: int  # where a memory block goes: after the leading system messages
    counted: int  # messages counted now (not found in the cache)


def count_units(
    messages: Sequence[Mapping[str, Any]],
    checked: Checked | Sequence[Lead],
    fmt: tokens.ChatFormat,
    cache: TokenCache,
    conversations: Conversations | None = None,
) -> tuple[list[Unit], int, list[int]]:
    """The conversation's units with their token counts, how many messages were counted (not
    found in ``cache``), and each message's cache key (a hash of the message).

    With a :class:`Checked` whose conversation was counted before in this format, only the new
    messages are hashed and looked up; ``conversations`` then remembers this one.
    """
    if not isinstance(checked, Checked):
        checked = Checked(list(checked), None)
    leads = checked.leads
    prefix = f"{fmt.name}\x00{fmt.tokenizer.name}\x00"
    previous = checked.base.counted.get(prefix) if checked.base is not None else None
    if previous is not None and previous[2]:
        old_keys, old_costs, old_units = previous
        reused = old_units[:-1]
        start = len(old_keys)
        keys, costs = list(old_keys), list(old_costs)
    else:
        reused, start, keys, costs = [], 0, [], []
    counted = 0
    lookup = cache.get
    for message in messages[start:]:
        key = _key(prefix, message)
        keys.append(key)
        cost = lookup(key)
        if cost is None:
            cost = _message_tokens(fmt, message)
            cache.put(key, cost)
            counted += 1
        costs.append(cost)
    first = reused[-1].stop if reused else 0
    units = [
        *reused,
        *(
            Unit(start=a + first, stop=b + first, tokens=sum(costs[a + first : b + first]), kind=k)
            for a, b, k in turn_spans(leads[first:])
        ),
    ]
    if conversations is not None and isinstance(messages, list):
        counts = dict(checked.base.counted) if checked.base is not None else {}
        counts[prefix] = (keys, costs, units)
        conversations.keep(messages, _Run(messages=messages, leads=leads, counted=counts))
    return units, counted, keys


def kept_messages(messages: Sequence[Any], units: Sequence[Unit], keep: Sequence[int]) -> list[Any]:
    """The messages of the ``keep`` units, in order: one slice per run of adjacent units (a
    trimmed conversation is its system messages and one tail), found by bisection."""
    kept: list[Any] = []
    index, count = 0, len(keep)
    while index < count:
        # keep rises by at least 1 a step, so keep[j] - j never falls: a run is where it stays
        offset = keep[index] - index
        stop = bisect_right(range(count), offset, lo=index, key=lambda j: keep[j] - j)
        kept += messages[units[keep[index]].start : units[keep[stop - 1]].stop]
        index = stop
    return kept


def fit_chat(
    messages: list[Any],
    *,
    fmt: tokens.ChatFormat,
    cap: int,
    fixed: int,
    cache: TokenCache,
    memory_tokens: int = 0,
    keep_fraction: float = 0.6,
) -> ChatFit:
    """Validate, count and fit ``messages``; the client's message objects that go upstream.

    ``fixed``: the request's tokens outside the messages (template overhead, tool schemas).
    Raises :class:`~ctxwarden.errors.InputError` for a malformed conversation and
    :class:`~ctxwarden.errors.BudgetError` when the system messages and the newest turn alone
    exceed ``cap``.
    """
    leads = validate_messages(messages)
    units, counted, _ = count_units(messages, leads, fmt, cache)
    fitted = fit(
        units, cap=cap, fixed=fixed, memory_tokens=memory_tokens, keep_fraction=keep_fraction
    )
    lead = 0
    while lead < len(units) and units[lead].kind == "system":
        lead += 1
    memory_at = units[lead - 1].stop if lead else 0
    kept = messages if fitted.unchanged else kept_messages(messages, units, fitted.keep)
    return ChatFit(
        messages=kept, fitted=fitted, units=tuple(units), memory_at=memory_at, counted=counted
    )
