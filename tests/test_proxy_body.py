"""The proxy's body check (``json_body``): refuses exactly what it could not forward.

Without a NUL escape the check does no Python walk of the body; these tests hold it to the
rule the walk would keep: a body is accepted if and only if orjson (which serialises what goes
upstream) can write it again, and whatever is refused names a field.
"""

from __future__ import annotations

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ctxwarden.errors import InputError
from ctxwarden.server.agents import FORWARD_DEPTH, json_body


def _nested(depth: int, leaf: bytes, opener: bytes) -> bytes:
    close = b"]" if opener == b"[" else b"}"
    if opener == b"[":
        return b"[" * depth + leaf + close * depth
    return b'{"k":' * depth + leaf + close * depth


def _forwardable(raw: bytes) -> bool:
    try:
        orjson.dumps(orjson.loads(raw))
    except orjson.JSONEncodeError:
        return False
    return True


@settings(max_examples=300, deadline=None)
@given(
    depth=st.integers(min_value=0, max_value=300),
    opener=st.sampled_from([b"[", b"{"]),
    leaf=st.sampled_from([b"", b'"x"', b"1", b"null"]),
    where=st.sampled_from(["field", "content", "tool"]),
)
def test_accepted_exactly_when_forwardable(
    depth: int, opener: bytes, leaf: bytes, where: str
) -> None:
    if leaf == b"" and (opener == b"{" or depth == 0):
        leaf = b"1"  # an object, or a field, needs a value
    inner = _nested(depth, leaf, opener)
    if where == "field":
        raw = b'{"model": "m", "extra": ' + inner + b"}"
    elif where == "content":
        raw = b'{"model": "m", "messages": [{"role": "user", "content": ' + inner + b"}]}"
    else:
        raw = b'{"model": "m", "tools": [{"type": "function", "parameters": ' + inner + b"}]}"
    if _forwardable(raw):
        assert isinstance(json_body(raw), dict)
    else:
        with pytest.raises(InputError) as caught:
            json_body(raw)
        assert f"nested deeper than {FORWARD_DEPTH} levels" in str(caught.value)
        assert caught.value.field is not None
        assert caught.value.field.split(".")[0].split("[")[0] in ("extra", "messages", "tools")


@pytest.mark.parametrize("depth", [0, 10, 100, 250])
def test_nul_escape_is_refused_at_any_depth(depth: int) -> None:
    raw = (
        b'{"model": "m", "messages": [{"role": "user", "content": '
        + (b"[" * depth + b'"a\\u0000b"' + b"]" * depth)
        + b"}]}"
    )
    with pytest.raises(InputError) as caught:
        json_body(raw)
    assert "NUL" in str(caught.value)
    assert (caught.value.field or "").startswith("messages[0].content")


def test_escaped_backslash_before_u0000_is_not_a_nul() -> None:
    # the text holds a backslash followed by "u0000": the regex sees "\\u0000" in the bytes,
    # the walk then finds no NUL and the body is accepted as it is
    raw = b'{"model": "m", "messages": [{"role": "user", "content": "C:\\\\u0000"}]}'
    body = json_body(raw)
    assert body["messages"][0]["content"] == "C:\\u0000"
