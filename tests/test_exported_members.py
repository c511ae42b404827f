"""The public API is ctxwarden.__all__, pinned here so changes to it are deliberate."""

from __future__ import annotations

import ctxwarden


def test_all_is_pinned() -> None:
    assert sorted(ctxwarden.__all__) == sorted(
        [
            "AuthError", "Block", "BudgetError", "BudgetPolicy", "CompactionPlan",
            "CompactionPolicy",
            "ConfigError", "ConflictError",
            "Context", "CtxwardenError", "DedupeConfig", "EmbedError", "Engine", "EngineConfig",
            "IngestOutcome",
            "IngestResult", "InputError", "Memory", "ModelRegistry", "ModelSpec", "NotFound",
            "ReadScope", "Record", "Report", "SemanticConfig", "StoreError", "StoreUnavailable",
            "SummarizeError",
            "Tokenizer",
            "TokenizerError",
            "UpstreamError", "chat_policy", "get_tokenizer", "research_policy",
        ]
    )  # fmt: skip


def test_every_exported_member_is_documented() -> None:
    for name in ctxwarden.__all__:
        member = getattr(ctxwarden, name)
        assert member.__doc__, name
