"""Storage backends behind the :class:`~ctxwarden.store.base.Store` protocol."""

from ctxwarden.store.base import Store
from ctxwarden.store.sqlite import SQLiteStore

__all__ = ["SQLiteStore", "Store"]
