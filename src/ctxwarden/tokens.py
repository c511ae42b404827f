"""Token counting: the :class:`Tokenizer` protocol, offline tokenizers, chat-format overhead.

Every count here is either exact (the model's own tokenizer) or a documented over-estimate, never
an under-estimate, because the engine's first rule is "a context never exceeds its budget".

>>> tok = get_tokenizer("cl100k_base")
>>> tok.count("hello world")
2
>>> fmt = get_chat_format("openai", tok)
>>> count_messages(tok, fmt, [{"role": "user", "content": "hello world"}])
9

The parts live in their own modules, re-exported here: :mod:`ctxwarden.tokenizers` (the
:class:`Tokenizer` protocol and the offline tokenizers, with the list of names),
:mod:`ctxwarden.chatformats` (chat-template overheads, :func:`count_messages`) and
:mod:`ctxwarden.models` (which tokenizer, window and chat format a model has). The first two
import nothing from the registry, so the registry can build on them without a cycle.
"""

from __future__ import annotations

from ctxwarden.chatformats import (
    CHAT_FORMATS,
    ChatFormat,
    count_messages,
    get_chat_format,
    get_format,
)
from ctxwarden.errors import TokenizerError as TokenizerError  # what these functions raise

# The model registry, re-exported for the callers that found it here (not in __all__: its home
# is ctxwarden.models).
from ctxwarden.models import ModelRegistry as ModelRegistry
from ctxwarden.models import ModelSpec as ModelSpec
from ctxwarden.models import default_registry as default_registry
from ctxwarden.tokenizers import (
    GEMMA_FALLBACK_FACTOR,
    GGUF_PREFIX,
    MAX_TEXT_CHARS,
    RUN_LIMIT,
    TOKENIZER_NAMES,
    FallbackTokenizer,
    Tokenizer,
    get_tokenizer,
)

__all__ = [
    "CHAT_FORMATS",
    "GEMMA_FALLBACK_FACTOR",
    "GGUF_PREFIX",
    "MAX_TEXT_CHARS",
    "RUN_LIMIT",
    "TOKENIZER_NAMES",
    "ChatFormat",
    "FallbackTokenizer",
    "Tokenizer",
    "count_messages",
    "get_chat_format",
    "get_format",
    "get_tokenizer",
]
