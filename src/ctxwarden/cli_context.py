"""What every ``ctxwarden`` command shares: the global options, the settings and the engine.

The app's callback (:mod:`ctxwarden.cli`) fills ``_state`` from ``--db``, ``--config``,
``--default-model`` and ``--debug``; :func:`_settings` and :func:`_engine` read it.
"""

from __future__ import annotations

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
    return Engine.open(settings.db, config=config)
