"""What a serving process does once before it takes requests.

Two stalls, measured in ``ctxwarden serve`` under ``bench/serve.py``'s open loop (docs/serving.md,
"Load"), are paid once per process and fell on whichever requests came first:

- **Lazy loading.** The first assemble loads the model's tokenizer (tiktoken builds its BPE
  tables in one call holding the GIL for ~0.8 s) and imports retrieval's modules: ~0.6 s of
  CPU during which no other request ran, ~1.1 s of delay for the ~40 requests queued behind it
  at 35 req/s, enough for a 2,500-request run's p99 by itself. :func:`warm_up` pays it before
  the port opens.
- **Full garbage collections over start-up objects.** Every generation-2 collection walks
  every tracked object, most of them the framework's, pydantic's and the tokenizer's, made at
  start-up and never freed (35-90 ms pauses of every thread, every ~10 s at 35 req/s).
  :func:`settle_heap` collects once and freezes what is left (:func:`gc.freeze`), so later
  collections walk only what requests made.
"""

from __future__ import annotations

import gc
import uuid

from ctxwarden.engine import Engine

__all__ = ["prepare", "settle_heap", "warm_up"]


def warm_up(engine: Engine) -> None:
    """Run one read-only assemble (nothing logged, a session nobody has) of the engine's
    default model and tenant, so its tokenizer, chat format and imports are loaded."""
    engine.assemble(
        session=f"warm-up-{uuid.uuid4().hex}",
        query="warm up",
        budget=1000,
        log_inclusions=False,
    )


def settle_heap() -> None:
    """Collect garbage once, then move every surviving object to the permanent generation
    (:func:`gc.freeze`): full collections stop walking start-up objects."""
    gc.collect()
    gc.freeze()


def prepare(engine: Engine) -> None:
    """:func:`warm_up` then :func:`settle_heap`: what ``ctxwarden serve``, ``proxy`` and
    ``mcp --transport http`` do before opening their port."""
    warm_up(engine)
    settle_heap()
