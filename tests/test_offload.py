"""ctxwarden.offload (pure): what is under the threshold is left as the caller's own objects;
what is over it becomes the same preview every time, and its record holds the whole text."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ctxwarden import InputError
from ctxwarden.offload import OFFLOAD_PREFIX, offload_messages
from ctxwarden.tokens import get_tokenizer

TOKENIZER = get_tokenizer("o200k_base")

texts = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=400)
messages = st.lists(
    st.one_of(
        st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant"]), "content": texts}),
        st.fixed_dictionaries(
            {"role": st.just("tool"), "tool_call_id": st.just("c1"), "content": texts}
        ),
    ),
    max_size=8,
)


def _offload(batch: list[dict[str, Any]], threshold: int, session: str = "s") -> Any:
    return offload_messages(
        batch, count=TOKENIZER.count, max_tokens=threshold, preview_chars=80,
        tenant="t", user="u", session=session,
    )  # fmt: skip


@given(messages, st.integers(1, 300))
def test_under_the_threshold_nothing_changes_and_over_it_the_same_preview(
    batch: list[dict[str, Any]], threshold: int
) -> None:
    out = _offload(batch, threshold)
    again = _offload(batch, threshold)
    assert again.messages == out.messages
    assert again.ids == out.ids
    records = {r["id"]: r for r in out.records}
    for before, after in zip(batch, out.messages, strict=True):
        over = before["role"] == "tool" and TOKENIZER.count(before["content"]) > threshold
        if not over:
            assert after is before  # the caller's own object, byte for byte
            continue
        id = after["content"].split(": ", 1)[0].rsplit(" ", 1)[1]
        assert id.startswith(OFFLOAD_PREFIX)
        assert records[id]["content"] == before["content"]
        assert after["tool_call_id"] == before["tool_call_id"]
    assert len(out.records) == len(out.ids)


def test_the_id_depends_on_the_scope() -> None:
    batch = [{"role": "tool", "tool_call_id": "c1", "content": "word " * 300}]
    assert _offload(batch, 10).ids != _offload(batch, 10, session="other").ids


@pytest.mark.parametrize(("field", "kw"), [("max_tokens", {"max_tokens": 0}),
                                           ("preview_chars", {"preview_chars": -1})])  # fmt: skip
def test_bad_arguments_name_the_field(field: str, kw: dict[str, int]) -> None:
    args: dict[str, Any] = {"max_tokens": 10, "preview_chars": 10, **kw}
    with pytest.raises(InputError) as caught:
        offload_messages([], count=len, tenant="t", user=None, session="s", **args)
    assert caught.value.field == field
