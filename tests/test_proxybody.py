"""Reading a chat body only where it is new (:mod:`ctxwarden.server.proxybody`).

The rule: whatever bytes arrive, :meth:`Bodies.read` returns what ``json_body`` returns for them
(the same dict, the same keys in the same order, the same bytes when forwarded) or raises the
same error naming the same field; and a body that continues a known one is in fact continued.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import openai
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ctxwarden import Engine
from ctxwarden.errors import InputError
from ctxwarden.llm import LLMClient
from ctxwarden.server.agents import NUL_ESCAPE, json_body
from ctxwarden.server.proxy import ProxyConfig, create_proxy_app
from ctxwarden.server.proxybody import KEY_BYTES, Bodies
from llmserver import ScriptedServer
from serving import serve

CALLER = ("tenant", None, None)
# longer than the lookup key, as every conversation worth continuing is
SYSTEM = {"role": "system", "content": "You are a coding agent. " + "Be careful. " * 100}

Dump = Callable[[Any], bytes]
STYLES: dict[str, Dump] = {
    "orjson": orjson.dumps,
    "json": lambda v: json.dumps(v).encode(),
    "json-utf8": lambda v: json.dumps(v, ensure_ascii=False).encode(),
    "json-compact": lambda v: json.dumps(v, separators=(",", ":")).encode(),
    "json-indent": lambda v: json.dumps(v, indent=2).encode(),
    "json-tabs": lambda v: json.dumps(v, indent="\t", ensure_ascii=False).encode(),
}

# texts that look like the body's own structure
_TRICKY = ['"messages": [', "]}", '"}],"model":"x"}', "\\", '\\"', "\\u0000", "日本", "\u2028", "]"]
# a NUL is refused by both readers (tested below); here the bodies are accepted ones
text = st.one_of(
    st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=40),
    st.sampled_from(_TRICKY),
)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | text,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(text, inner, max_size=3),
    max_leaves=8,
)
message = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "assistant", "tool"]), "content": text},
    optional={"extra": json_values, "messages": json_values},
)
fields = st.dictionaries(
    st.sampled_from(["model", "user", "tools", "stream", "temperature", "metadata"]),
    json_values,
    max_size=3,
)


def _same(bodies: Bodies, raw: bytes) -> dict[str, Any] | None:
    """Read ``raw`` with ``bodies`` and with ``json_body``: the same outcome; then learn it."""
    try:
        expected: dict[str, Any] | None = json_body(raw)
        refused: tuple[str, str | None] | None = None
    except InputError as exc:
        expected, refused = None, (str(exc), exc.field)
    if refused is not None:
        with pytest.raises(InputError) as caught:
            bodies.read(raw, CALLER)
        assert (str(caught.value), caught.value.field) == refused
        return None
    got, learn = bodies.read(raw, CALLER)
    assert refused is None
    assert got == expected
    assert list(got) == list(expected or {})
    assert orjson.dumps(got) == orjson.dumps(expected)
    learn()
    return got


def _body(before: dict[str, Any], messages: list[Any], after: dict[str, Any]) -> dict[str, Any]:
    return {**before, "messages": messages, **{k: v for k, v in after.items() if k not in before}}


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    style=st.sampled_from(sorted(STYLES)),
    before=fields,
    after=fields,
    history=st.lists(message, min_size=1, max_size=6),
    turns=st.lists(st.lists(message, max_size=3), min_size=1, max_size=3),
)
def test_a_growing_conversation_is_continued_and_read_as_json_body_reads_it(
    style: str,
    before: dict[str, Any],
    after: dict[str, Any],
    history: list[Any],
    turns: list[list[Any]],
) -> None:
    dump = STYLES[style]
    bodies = Bodies()
    messages = [SYSTEM, *history]
    raw = dump(_body(before, messages, after))
    assert _same(bodies, raw) is not None
    # a body with the bytes of a NUL escape (here a backslash before "u0000") is not learned
    learned = NUL_ESCAPE.search(raw) is None
    assert len(bodies) == learned
    for added in turns:
        messages = [*messages, *added]
        continued = bodies.continued
        raw = dump(_body(before, messages, after))
        assert _same(bodies, raw) is not None
        learned = learned and NUL_ESCAPE.search(raw) is None
        assert bodies.continued == continued + learned


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    style=st.sampled_from(sorted(STYLES)),
    history=st.lists(message, min_size=1, max_size=4),
    added=st.lists(message, min_size=1, max_size=2),
    edits=st.lists(
        st.tuples(st.floats(0, 1), st.integers(0, 3), st.binary(max_size=4)), min_size=1, max_size=3
    ),
)
def test_any_bytes_after_a_known_body_are_read_as_json_body_reads_them(
    style: str, history: list[Any], added: list[Any], edits: list[tuple[float, int, bytes]]
) -> None:
    """Bytes near a known body (its continuation with random edits anywhere: in the known
    part, the new messages, the closing fields): the same dict or the same error."""
    dump = STYLES[style]
    bodies = Bodies()
    messages = [SYSTEM, *history]
    _same(bodies, dump({"messages": messages, "model": "m", "tools": [{"a": [1]}]}))
    raw = bytearray(dump({"messages": [*messages, *added], "model": "m", "tools": [{"a": [1]}]}))
    for where, cut, insert in edits:
        at = int(where * len(raw))
        raw[at : at + cut] = insert
    _same(bodies, bytes(raw))


@pytest.mark.parametrize(
    "raw",
    [
        # a nested "messages" array before the real one (a tool's schema)
        b'{"tools": [{"parameters": {"messages": [1, 2]}}], "messages": [%s], "model": "m"}',
        # the key twice: the last one is the body's messages
        b'{"messages": [{"role": "user", "content": "old"}], "model": "m", "messages": [%s]}',
        b'{"messages": [%s], "model": "m", "messages": [{"role": "user", "content": "last"}]}',
        # a key that ends in "messages after an escaped quote
        b'{"say \\"messages": [1], "messages": [%s], "model": "m"}',
        # pretty-printed with the messages last
        b'{\n  "model": "m",\n  "messages": [\n    %s\n  ]\n}\n',
    ],
)
def test_unusual_bodies_are_read_as_json_body_reads_them(raw: bytes) -> None:
    bodies = Bodies()
    first = orjson.dumps(SYSTEM)
    grown = first + b', {"role": "user", "content": "new"}'
    _same(bodies, raw % first)
    _same(bodies, raw % grown)
    _same(bodies, raw % (grown + b', {"role": "user", "content": "newer"}'))


@pytest.mark.parametrize(
    ("new", "field"),
    [
        (b'{"role": "user", "content": "a\\u0000b"}', "messages[2].content"),
        (b'{"role": "user", "content": ' + b"[" * 260 + b"1" + b"]" * 260 + b"}", None),
        (b'{"role": "user", "content": "unterminated}', "body"),
        (b"", "body"),  # a trailing comma
    ],
)
def test_a_bad_new_message_gets_json_bodys_error(new: bytes, field: str | None) -> None:
    bodies = Bodies()
    first = b'{"messages": [' + orjson.dumps(SYSTEM) + b', {"role": "user", "content": "hi"}'
    _same(bodies, first + b'], "model": "m"}')
    with pytest.raises(InputError) as caught:
        bodies.read(first + b", " + new + b'], "model": "m"}', CALLER)
    if field is not None:
        assert caught.value.field == field
    assert bodies.continued == 0


def test_bodies_are_kept_per_caller_and_bounded() -> None:
    bodies = Bodies(runs=3)
    raw = orjson.dumps({"messages": [SYSTEM, {"role": "user", "content": "hi"}], "model": "m"})
    assert len(raw) > KEY_BYTES
    bodies.read(raw, ("a", None, None))[1]()
    bodies.read(raw, ("b", None, None))  # another caller: read whole
    assert bodies.continued == 0
    bodies.read(raw, ("a", None, None))
    assert bodies.continued == 1
    for tenant in "cdef":
        bodies.read(raw, (tenant, None, None))[1]()
    assert len(bodies) == 3


@pytest.fixture
def proxy_rig() -> Iterator[tuple[Any, ScriptedServer, openai.OpenAI]]:
    with (
        ScriptedServer(["ok"] * 30) as upstream,
        Engine.open(":memory:") as engine,
        LLMClient(upstream.url, max_retries=0, timeout=5) as llm,
    ):
        app = create_proxy_app(engine, llm, ProxyConfig(probe_window=False))
        with (
            serve(app) as url,
            openai.OpenAI(base_url=url + "/v1", api_key="sk", max_retries=0) as client,
        ):
            yield app.state.proxy, upstream, client


@pytest.mark.parametrize("session", [None, "s-1"])
def test_through_the_proxy_a_growing_conversation_goes_upstream_as_sent(
    proxy_rig: tuple[Any, ScriptedServer, openai.OpenAI], session: str | None
) -> None:
    proxy, upstream, client = proxy_rig
    headers = {"X-Ctxwarden-Session": session} if session else {}
    messages: list[Any] = [SYSTEM, {"role": "user", "content": "start"}]
    for turn in range(12):
        client.chat.completions.create(
            model="gpt-4o", messages=messages, extra_headers=headers, temperature=0.5
        )
        sent = upstream.chat_requests()[-1].body
        assert isinstance(sent, dict)
        assert sent["messages"] == messages
        assert sent["temperature"] == 0.5
        if turn == 0:  # learned once the first answer was sent
            deadline = time.monotonic() + 10
            while not len(proxy.bodies) and time.monotonic() < deadline:
                time.sleep(0.01)
        messages = [
            *messages,
            {"role": "assistant", "content": f'done {turn} "messages": []}}'},
            {"role": "user", "content": f"next {turn} 日本"},
        ]
    assert proxy.bodies.continued == 11
    # a NUL in a new message: 400 naming it, as for a body read whole
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(
            model="gpt-4o",
            messages=[*messages, {"role": "user", "content": "a\x00b"}],
            extra_headers=headers,
        )
    assert f"messages[{len(messages)}].content" in str(caught.value)
