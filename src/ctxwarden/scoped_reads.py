"""The engine's reads that take a scope: ``get``, ``pinned``, ``stats``, ``search``, ``pin``.

A mixin of :class:`~ctxwarden.engine.Engine` (kept apart from the composition root, which is
large enough): each resolves what the caller named into a :class:`~ctxwarden.scope.ReadScope`
and passes it to the store, whose queries filter by it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ctxwarden.assemble import query_terms
from ctxwarden.errors import InputError, NotFound
from ctxwarden.retrieve import check_query_length
from ctxwarden.scope import ReadScope, in_scope
from ctxwarden.scope import resolve as resolve_scope
from ctxwarden.textcheck import check_text
from ctxwarden.types import SCOPES, Memory, Scope

if TYPE_CHECKING:
    from ctxwarden.engine_config import EngineConfig
    from ctxwarden.store.base import Store

__all__ = ["ScopedReads", "store_scope"]


def store_scope(scope: ReadScope) -> ReadScope | None:
    """The store's filter for a read scope: None for the whole tenant."""
    return None if scope.kind == "tenant" else scope


class ScopedReads:
    """Reads of one tenant's memories in the scope the caller named (mixed into ``Engine``)."""

    store: Store
    config: EngineConfig

    def flush_log(self) -> None:
        """Wait for queued inclusion-log entries (the engine's own)."""
        raise NotImplementedError

    def get(
        self,
        id: str,
        *,
        tenant: str | None = None,
        user: str | None = None,
        session: str | None = None,
    ) -> Memory:
        """The memory with caller id ``id``, or the aggregate it was folded into.

        With ``user`` or ``session``: :class:`NotFound` unless the memory is in that scope
        (the same answer as for an id that does not exist, so ids are not probed across users).
        """
        tenant = tenant or self.config.tenant
        self.flush_log()  # its access stats
        memory = self.store.get(tenant, id)
        if user is not None or session is not None:
            wanted = resolve_scope(session=session, user=user, scope=None)
            if not in_scope(memory, wanted):
                raise NotFound(f"no memory with id {id!r} in tenant {tenant!r}")
        return memory

    def pinned(
        self,
        *,
        tenant: str | None = None,
        session: str | None = None,
        user: str | None = None,
        scope: Scope | None = None,
    ) -> list[Memory]:
        """Pinned memories and facts visible in the narrowest scope named (what the pinned
        block of :meth:`assemble` draws on), oldest first."""
        read_scope = resolve_scope(session=session, user=user, scope=scope)
        self.flush_log()
        return self.store.pinned(tenant or self.config.tenant, scope=store_scope(read_scope))

    def stats(
        self,
        *,
        tenant: str | None = None,
        session: str | None = None,
        user: str | None = None,
        scope: Scope | None = None,
    ) -> dict[str, Any]:
        """Counts per channel: records seen, memories stored, duplicates folded; top families.

        Of the narrowest scope named (:func:`ctxwarden.scope.resolve`): a session's, an end
        user's, or the whole tenant's when neither is named.
        """
        read_scope = resolve_scope(session=session, user=user, scope=scope)
        self.flush_log()  # the count of contexts
        return self.store.stats(tenant or self.config.tenant, scope=store_scope(read_scope))

    def search(
        self,
        query: str,
        *,
        tenant: str | None = None,
        limit: int = 20,
        session: str | None = None,
        user: str | None = None,
        scope: Scope | None = None,
    ) -> list[tuple[Memory, float]]:
        """Full-text search for ``query``'s terms, best first, in the narrowest scope named:
        ``session``'s memories, ``user``'s, or the tenant's when neither is named (a wider
        scope than named needs ``scope=``: ``"user"`` or ``"tenant"``)."""
        if limit < 1:
            raise InputError(f"{limit} must be at least 1", field="limit")
        check_query_length(query, self.config.max_query_chars)
        if not isinstance(query, str):
            raise InputError(f"expected a string, got {type(query).__name__}", field="query")
        check_text(query, "query")
        read_scope = resolve_scope(session=session, user=user, scope=scope)
        terms = query_terms(query[: self.config.retrieval.query_chars])
        self.flush_log()  # the access stats of the memories returned
        return self.store.search(
            tenant or self.config.tenant, terms, limit=limit, scope=store_scope(read_scope)
        )

    def pin(
        self,
        id: str,
        *,
        pinned: bool = True,
        tenant: str | None = None,
        scope: Scope | None = None,
    ) -> Memory:
        """Pin (or with ``pinned=False`` unpin) a memory; returns it. :class:`NotFound` if none.

        ``scope``: where the pin shows (the pinned block of :meth:`assemble`): the memory's own
        session (the default, ``"session"``), its end user's sessions (``"user"``; the memory
        must have a user) or every context of the tenant (``"tenant"``, an explicit choice).
        """
        if scope is not None and scope not in SCOPES:
            raise InputError(f"{scope!r} is not one of {', '.join(sorted(SCOPES))}", field="scope")
        tenant = tenant or self.config.tenant
        self.flush_log()  # the access stats of the memory returned
        if scope == "user" and pinned and self.store.get(tenant, id).user is None:
            raise InputError(
                f"memory {id!r} has no end user: pin it for its session or the tenant",
                field="scope",
            )
        with self.store.write() as writer:
            found = writer.set_pinned(tenant, id, pinned, scope=scope)
        if not found:
            raise NotFound(f"no memory with id {id!r} in tenant {tenant!r}: check the id")
        return self.store.get(tenant, id)
