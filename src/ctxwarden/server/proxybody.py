"""Reading a chat-completions body only where it is new.

An agent sends its whole conversation on every turn, so a request's bytes are usually the
previous request's bytes up to its last message, then the new messages, then the same closing
fields (``"model"``, ``"tools"``...). :class:`Bodies` remembers the last few bodies of each
caller, as bytes with the place of their messages array, and for such a request compares bytes
(a ``memcmp``, ~0.3 ms for 6 MB) and parses only the new messages: at 20,000 messages (~6 MB)
that replaces a ~13 ms parse and the ~2 ms scan of the whole body. The body it returns is
equal to what :func:`ctxwarden.server.agents.json_body` returns for the same bytes; a body that
does not continue a known one (or holds anything unusual in its new part) is read by
``json_body`` itself, which names the field of a bad one.

Why the result is the same. A body is *learned* only after it was parsed whole and answered:
the regex finds a ``"messages": [`` candidate, orjson parses the array from that ``[`` alone
and reports where it ended, and the body with that array replaced by the string ``"\\u0000"``
must parse to the same fields with ``messages`` equal to that string. The body holds no
``\\u0000`` escape (else nothing is learned), so that string can only be the value of the
top-level ``messages`` key, the last one if the key is repeated: the candidate is the real
array. A later body ``B`` continues a learned body ``A`` (split as head, the bytes up to the
end of its last message, and tail, the rest from the whitespace before ``]`` on) when ``B``
starts with ``A``'s head and ends with its tail, and the bytes between are whitespace, a comma
and values that parse as a JSON array (``[`` + them + ``]``). After the head the parser is inside
the messages array after an element in both bodies; the middle part leaves it in that same
state, so ``A``'s tail ends ``B`` as it ended ``A``: ``B``'s messages are ``A``'s plus the middle
values, and its other fields are ``A``'s. The middle part is checked as ``json_body`` checks a
body (no NUL escape, nesting that orjson can forward), else the whole body is read by
``json_body``. ``B`` is then known in the same way, with no second parse.

Bodies are remembered per caller (tenant and the session and user headers), so one caller's
bodies never speed up, and hence never time, another's. Bounded: :data:`RUNS` bodies and
:data:`HELD_BYTES` bytes and :data:`HELD_MESSAGES` messages in all.
"""

from __future__ import annotations

import logging
import re
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from itertools import islice
from typing import Any

import orjson

from ctxwarden.server.agents import NUL_ESCAPE, json_body

__all__ = ["HELD_BYTES", "HELD_MESSAGES", "RUNS", "Bodies"]

log = logging.getLogger(__name__)

#: Bodies remembered (as many conversations as :class:`ctxwarden.server.chatfit.Conversations`
#: keeps counted, so the two caches hit and miss together).
RUNS = 16
#: Bytes of bodies remembered in all: six 10 MB conversations (the issue's largest size).
HELD_BYTES = 64 << 20
#: Messages of bodies remembered in all (their objects: the bound of ``Conversations``).
HELD_MESSAGES = 200_000
#: A body is looked up by its first bytes (and its caller): as many as hold the opening of a
#: conversation (the model name, the system prompt's start), so two conversations of one caller
#: rarely share a key. A smaller body is read whole (it costs well under a millisecond).
KEY_BYTES = 1024
#: Candidates per key: conversations of one caller whose first bytes agree.
PER_KEY = 4
#: A learned head is kept as the pieces the requests added; joined when there are this many
#: (the byte comparison is one call per piece).
PIECES = 256
#: ``"messages": [`` candidates tried when learning a body (a nested "messages" key before the
#: real one is possible, e.g. in a tool's schema, but rare).
CANDIDATES = 4

_MESSAGES = re.compile(rb'"messages"[ \t\n\r]*:[ \t\n\r]*\[')
_SPACE = b" \t\n\r"  # JSON's whitespace (bytes.strip() would also take \x0b and \x0c)
_SENTINEL = b'"\\u0000"'


@dataclass(frozen=True, slots=True)
class _Known:
    """A body as learned: ``head`` (its bytes up to the end of its last message, in pieces),
    ``tail`` (the rest), its fields as parsed and its messages (neither is ever mutated:
    requests get copies of ``fields`` and new lists around ``messages``' objects)."""

    head: tuple[bytes, ...]
    end: int
    tail: bytes
    fields: dict[str, Any]
    messages: list[Any]

    @property
    def size(self) -> int:
        return self.end + len(self.tail)


class Bodies:
    """The last bodies read, per caller, so a body that continues one is parsed where it is new.

    >>> bodies = Bodies()
    >>> first = b'{"messages": [{"role": "user", "content": "hi"}], "model": "m"}'
    >>> body, learn = bodies.read(first, ("tenant",))
    >>> learn()  # once the request was answered
    >>> grown = first.replace(b'}],', b'}, {"role": "user", "content": "and?"}],')
    >>> bodies.read(grown, ("tenant",))[0] == orjson.loads(grown)
    True
    """

    def __init__(
        self, *, runs: int = RUNS, held_bytes: int = HELD_BYTES, held_messages: int = HELD_MESSAGES
    ) -> None:
        self.runs = runs
        self.held_bytes = held_bytes
        self.held_messages = held_messages
        self._known: OrderedDict[Hashable, list[_Known]] = OrderedDict()
        self._lock = threading.Lock()
        #: bodies read by continuing a known one (for tests and the bench)
        self.continued = 0

    def read(
        self, raw: bytes, caller: tuple[str | None, ...]
    ) -> tuple[dict[str, Any], Callable[[], None]]:
        """The body (as :func:`~ctxwarden.server.agents.json_body` reads it, raising its
        :class:`~ctxwarden.errors.InputError` for a bad one) and what to call once the
        request was answered, so that the next body of its conversation continues it."""
        key = (caller, raw[:KEY_BYTES])
        with self._lock:
            candidates = list(self._known.get(key, ()))
        for known in candidates:
            continued = _continue(known, raw)
            if continued is not None:
                body, grown = continued
                self._keep(key, grown, replaces=known)
                self.continued += 1
                return body, _nothing
            # a body that starts as the known one but does not continue it is read whole
        body = json_body(raw)
        messages = body.get("messages")
        fields = dict(body)  # as parsed: the request may replace its messages (offloading)

        def learn() -> None:
            if isinstance(messages, list) and messages and len(raw) > KEY_BYTES:
                known = _learn(raw, fields, messages)
                if known is not None:
                    self._keep(key, known, replaces=None)

        return body, learn

    def __len__(self) -> int:
        """How many bodies are known."""
        with self._lock:
            return sum(len(known) for known in self._known.values())

    def _keep(self, key: Hashable, known: _Known, *, replaces: _Known | None) -> None:
        with self._lock:
            held = [k for k in self._known.pop(key, ()) if k is not replaces]
            self._known[key] = [known, *held][:PER_KEY]
            every = [k for ks in self._known.values() for k in ks]
            count, total = len(every), sum(k.size for k in every)
            messages = sum(len(k.messages) for k in every)
            while self._known and (
                count > self.runs or total > self.held_bytes or messages > self.held_messages
            ):
                _, dropped = self._known.popitem(last=False)
                count -= len(dropped)
                total -= sum(k.size for k in dropped)
                messages -= sum(len(k.messages) for k in dropped)


def _nothing() -> None:
    return None


def _continue(known: _Known, raw: bytes) -> tuple[dict[str, Any], _Known] | None:
    """``raw`` read as ``known`` continued (see the module's docstring), and the body it now
    is; None when it does not continue it."""
    tail = known.tail
    stop = len(raw) - len(tail)
    if stop < known.end or not raw.endswith(tail):
        return None
    offset = 0
    for piece in known.head:
        if not raw.startswith(piece, offset):
            return None
        offset += len(piece)
    if stop == known.end:  # the same body again (a retry)
        body = dict(known.fields)
        body["messages"] = list(known.messages)
        return body, known
    middle = raw[known.end : stop]
    opened = middle.lstrip(_SPACE)
    if not opened.startswith(b",") or NUL_ESCAPE.search(middle) is not None:
        return None
    try:
        new = orjson.loads(b"[" + opened[1:] + b"]")
        # as deep as in the body (an object, its messages list): forwarded by orjson as well
        orjson.dumps([new])
    except (orjson.JSONDecodeError, orjson.JSONEncodeError):
        return None
    if not new:
        return None
    messages = [*known.messages, *new]
    body = dict(known.fields)
    body["messages"] = messages
    closed = middle.rstrip(_SPACE)
    space = middle[len(closed) :]  # whitespace before the tail's own: the tail's now
    head = (*known.head, closed)
    if len(head) > PIECES:
        head = (b"".join(head),)
    grown = _Known(
        head=head, end=known.end + len(closed), tail=space + tail,
        fields=known.fields, messages=messages,
    )  # fmt: skip
    return body, grown


def _learn(raw: bytes, fields: dict[str, Any], messages: list[Any]) -> _Known | None:
    """Where ``raw``'s messages array is (see the module's docstring), or None when that is
    not certain; ``fields``: the body as parsed."""
    if NUL_ESCAPE.search(raw) is not None:
        return None  # the sentinel must be the body's only NUL
    for match in islice(_MESSAGES.finditer(raw), CANDIDATES):
        opening = match.end() - 1
        close = _array_end(raw, opening)
        if close is None:
            continue
        try:
            replaced = orjson.loads(raw[:opening] + _SENTINEL + raw[close + 1 :])
        except orjson.JSONDecodeError:
            continue
        if (
            not isinstance(replaced, dict)
            or replaced.get("messages") != "\x00"
            or list(replaced) != list(fields)
            or any(replaced[k] != v for k, v in fields.items() if k != "messages")
        ):
            continue
        end = opening + 1 + len(raw[opening + 1 : close].rstrip(_SPACE))
        if end == opening + 1:
            return None  # an empty array (refused anyway)
        return _Known(head=(raw[:end],), end=end, tail=raw[end:], fields=fields, messages=messages)
    return None


def _array_end(raw: bytes, opening: int) -> int | None:
    """The index of the ``]`` closing the array that opens at ``raw[opening]``: orjson reads
    the array as a document of its own and stops at the first byte after it."""
    try:
        orjson.loads(raw[opening:])
    except orjson.JSONDecodeError as exc:
        if not isinstance(exc.doc, str) or exc.msg != "unexpected content after document":
            return None
        # orjson reports the position in characters of the decoded text
        after = opening + len(exc.doc[: exc.pos].encode("utf-8", "surrogatepass"))
    else:
        return None  # the array ran to the end of the body: not a body's field
    stop = len(raw[opening:after].rstrip(_SPACE))
    if stop < 1 or raw[opening + stop - 1 : opening + stop] != b"]":
        return None
    return opening + stop - 1
