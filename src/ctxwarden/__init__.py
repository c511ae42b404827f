"""ctxwarden: the context and memory engine for long-lived LLM agents.

Exact token budgets per block, counted with the model's real tokenizer; de-duplication at
ingest; retrieval of the related past; an inclusion log that explains every context.

>>> from ctxwarden import Engine
>>> engine = Engine.open(":memory:")
>>> engine.ingest([{"id": "m1", "session": "s", "content": "hello"}]).counts["stored"]
1
>>> engine.close()
"""

from ctxwarden.budget import Block, BudgetPolicy, chat_policy, research_policy
from ctxwarden.compact import CompactionPlan, CompactionPolicy
from ctxwarden.dedupe import DedupeConfig
from ctxwarden.engine import Engine, EngineConfig
from ctxwarden.errors import (
    AuthError,
    BudgetError,
    ConfigError,
    ConflictError,
    CtxwardenError,
    EmbedError,
    InputError,
    NotFound,
    StoreError,
    StoreUnavailable,
    SummarizeError,
    TokenizerError,
    UpstreamError,
)
from ctxwarden.models import ModelRegistry, ModelSpec
from ctxwarden.scope import ReadScope
from ctxwarden.semantic import SemanticConfig
from ctxwarden.tokens import Tokenizer, get_tokenizer
from ctxwarden.types import Context, IngestOutcome, IngestResult, Memory, Record, Report

__version__ = "0.1.0"

__all__ = [
    "AuthError",
    "Block",
    "BudgetError",
    "BudgetPolicy",
    "CompactionPlan",
    "CompactionPolicy",
    "ConfigError",
    "ConflictError",
    "Context",
    "CtxwardenError",
    "DedupeConfig",
    "EmbedError",
    "Engine",
    "EngineConfig",
    "IngestOutcome",
    "IngestResult",
    "InputError",
    "Memory",
    "ModelRegistry",
    "ModelSpec",
    "NotFound",
    "ReadScope",
    "Record",
    "Report",
    "SemanticConfig",
    "StoreError",
    "StoreUnavailable",
    "SummarizeError",
    "Tokenizer",
    "TokenizerError",
    "UpstreamError",
    "chat_policy",
    "get_tokenizer",
    "research_policy",
]
