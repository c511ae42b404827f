"""Which store a path opens: SQLite for a file path or ``":memory:"``, PostgreSQL for a
``postgresql://`` URL (needs ``ctxwarden[postgres]``). What :meth:`Engine.open
<ctxwarden.engine.Engine.open>` builds its engine on.

>>> open_store(":memory:").close()
"""

from __future__ import annotations

from pathlib import Path

from ctxwarden.errors import ConfigError
from ctxwarden.store.base import Store
from ctxwarden.store.sqlite import STORE_TIMEOUT_SECONDS, SQLiteStore

__all__ = ["open_store"]


def open_store(path: str | Path, *, timeout: float = STORE_TIMEOUT_SECONDS) -> Store:
    """The store at ``path`` (created if needed): a file path, ``":memory:"`` or a
    ``postgresql://`` URL; :class:`ConfigError` names the extra when the driver is missing.
    ``timeout``: how long a call waits on the store (seconds): for SQLite's write lock, for
    PostgreSQL's locks, statements and pooled connections."""
    text = str(path)
    if text.startswith(("postgresql://", "postgres://")):
        return _postgres_store(text, timeout)
    return SQLiteStore(text, timeout=timeout)


def _postgres_store(dsn: str, timeout: float) -> Store:
    try:
        from ctxwarden.store.postgres import PostgresStore
    except ImportError as exc:
        raise ConfigError(
            f"db: a postgresql:// URL needs the PostgreSQL driver ({exc.name} is missing); "
            "install it with: pip install 'ctxwarden[postgres]'"
        ) from exc
    return PostgresStore(dsn, timeout=timeout)
