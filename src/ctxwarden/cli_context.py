"""What every ``ctxwarden`` command shares: the global options, the settings and the engine.

The app's callback (:mod:`ctxwarden.cli`) fills ``_state`` from ``--db``, ``--config``,
``--default-model`` and ``--debug``; :func:`_settings` and :func:`_engine` read it.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ctxwarden.config import SERVER_COMPACT_EVERY, SERVER_STORE_TIMEOUT, Settings, load_settings
from ctxwarden.engine import Engine
from ctxwarden.engine_config import STORE_TIMEOUT_SECONDS

_state: dict[str, Any] = {}


def _settings() -> Settings:
    return load_settings(_state.get("config"), **_state.get("flags", {}))


def _engine(
    settings: Settings | None = None,
    *,
    server: bool = False,
    inclusion_log: str | None = None,
    compact_every: str | None = None,
) -> Engine:
    """The engine of a command. ``inclusion_log`` (a server's ``--inclusion-log``) wins over
    the setting, which wins over the default: ``deferred`` for a server (the log write leaves
    the request path), ``sync`` for a one-shot command. A server's engine also compacts every
    6 hours and makes window summaries in the background unless the settings say otherwise."""
    settings = settings or _settings()
    if inclusion_log is not None:
        settings = settings.model_copy(update={"inclusion_log": inclusion_log})
    if compact_every is not None:  # a server's --compact-every
        settings = settings.model_copy(update={"compact_every": compact_every})
    default = "deferred" if server else "sync"
    config = settings.engine_config(
        inclusion_log=default,
        store_timeout=SERVER_STORE_TIMEOUT if server else STORE_TIMEOUT_SECONDS,
        # a server compacts on a schedule and summarises windows in the background
        compact_every=SERVER_COMPACT_EVERY if server else None,
        window_summaries="background" if server else "off",
    )
    if settings.summarizer == "llm":
        # the scheduled compactor and window summaries use the configured model too (falling
        # back to the extractive summary per cluster, as `ctxwarden compact` does)
        config = dataclasses.replace(config, summarizer=_summarizer(settings))
    return Engine.open(settings.db, config=config)


def _summarizer(
    settings: Settings, *, kind: str | None = None, url: str | None = None, model: str | None = None
) -> Any:
    """The summariser the settings (or a command's flags) name: the extractive one, or the LLM
    one over an :class:`~ctxwarden.llm.LLMClient` with the settings' key, timeout and retries.
    The caller closes ``summarizer.client`` when it has one."""
    from ctxwarden.errors import InputError
    from ctxwarden.summarize import ExtractiveSummarizer

    kind = kind or settings.summarizer
    if kind == "extractive":
        return ExtractiveSummarizer()
    if kind != "llm":
        raise InputError(f"{kind!r} is not extractive or llm", field="summarizer")
    url = url or settings.summarizer_url
    if not url:
        raise InputError(
            "the llm summariser needs an endpoint: pass --llm-url or set summarizer_url "
            "(CTXWARDEN_SUMMARIZER_URL)",
            field="summarizer_url",
        )
    from ctxwarden.llm import LLMClient
    from ctxwarden.summarize_llm import LLMSummarizer

    model = model or settings.summarizer_model
    if not model:
        raise InputError(
            "the llm summariser needs a model name: pass --llm-model or set summarizer_model "
            "(CTXWARDEN_SUMMARIZER_MODEL)",
            field="summarizer_model",
        )
    client = LLMClient(
        url,
        api_key=settings.summarizer_api_key,
        model=model,
        timeout=settings.summarizer_timeout,
        max_retries=settings.summarizer_retries,
    )
    return LLMSummarizer(
        client,
        model,
        structured_output=settings.summarizer_structured_output,
        retries=settings.summarizer_retries,
    )
