"""The erasure flow: deleting a memory, a session or a tenant, leaving content-free tombstones.

:class:`Erasure` is the service behind :meth:`ctxwarden.engine.Engine.delete`,
:meth:`~ctxwarden.engine.Engine.delete_session` and
:meth:`~ctxwarden.engine.Engine.delete_tenant`. Each waits for the inclusion-log entries queued
before it (none may be written after the erasure), deletes in one transaction (summaries built
from an erased memory are rewritten without its lines, or removed), empties the engine's
in-process caches of what was erased (analysed aggregates, token counts) and scrubs the store's
files of the erased text, retrying the scrub until it finishes. Each returns an
:class:`~ctxwarden.store.base.ErasureReceipt`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ctxwarden.engine_config import EngineConfig
from ctxwarden.errors import NotFound
from ctxwarden.store.base import ErasureReceipt, Store, scrub_until_done
from ctxwarden.types import Memory

__all__ = ["Erasure", "ErasureFaces"]


@dataclass(eq=False)
class Erasure:
    """Deletes memories, sessions and tenants from the ``store``, leaving tombstones: what
    :meth:`Engine.delete` and its siblings delegate to (see :mod:`ctxwarden.erasure`)."""

    store: Store
    config: EngineConfig
    clock: Callable[[], float]
    flush_log: Callable[[], None]
    #: The scoped read (``Engine.get``): :class:`NotFound` for a memory outside the scope named.
    get: Callable[..., Memory]
    #: Each empties one of the engine's caches of stored rows (analysed aggregates, counts).
    caches: Sequence[Callable[[], None]]

    def _forget(self) -> None:
        for clear in self.caches:
            clear()

    def _scrub(self) -> None:
        # The erasure has committed: its text must still leave the files, so a scrub that
        # cannot finish yet (a reader holds the WAL) is retried, not reported as a failure.
        scrub_until_done(self.store)

    def delete(
        self,
        id: str,
        *,
        tenant: str | None,
        reason: str,
        user: str | None,
        session: str | None,
    ) -> ErasureReceipt:
        """Erase a memory, or an id compacted into a summary, from everything derived from it
        (see :meth:`Engine.delete`); what was removed."""
        tenant = tenant or self.config.tenant
        if user is not None or session is not None:
            self.get(id, tenant=tenant, user=user, session=session)  # NotFound outside it
        self.flush_log()  # no entry of an earlier assemble may be written after the erasure
        with self.store.write() as writer:
            receipt = writer.erase_id(tenant, id, deleted_at=self.clock(), reason=reason)
        if receipt is None:
            raise NotFound(f"no memory with id {id!r} in tenant {tenant!r}: check the id")
        self._forget()
        self._scrub()
        return receipt

    def delete_session(self, session: str, *, tenant: str | None, reason: str) -> ErasureReceipt:
        """Erase a session and its inclusion log (see :meth:`Engine.delete_session`)."""
        tenant = tenant or self.config.tenant
        self.flush_log()  # no entry of an earlier assemble may be written after the erasure
        with self.store.write() as writer:
            receipt = writer.erase_session(tenant, session, deleted_at=self.clock(), reason=reason)
        self._forget()
        self._scrub()
        return receipt

    def delete_tenant(self, *, tenant: str | None, reason: str) -> ErasureReceipt:
        """Erase a tenant and its inclusion log (see :meth:`Engine.delete_tenant`)."""
        tenant = tenant or self.config.tenant
        self.flush_log()  # no entry of an earlier assemble may be written after the erasure
        with self.store.write() as writer:
            receipt = writer.erase_tenant(tenant, deleted_at=self.clock(), reason=reason)
        self._forget()
        self._scrub()
        return receipt


class ErasureFaces:
    """The engine's erasure methods (mixed into ``Engine``), each delegating to its
    :class:`Erasure`."""

    _erasure: Erasure

    def delete(
        self,
        id: str,
        *,
        tenant: str | None = None,
        reason: str = "deleted",
        user: str | None = None,
        session: str | None = None,
    ) -> ErasureReceipt:
        """Erase a memory by its id, an alias's id, or the id of a memory compacted into a
        summary: its text leaves every table and index and the vector index files, and every
        summary built from it is rewritten without the lines citing it (removed when none is
        left); content-free tombstones remain. A compacted memory goes with the repeats that
        were folded into it, whichever of their ids is named (the summary's metadata records,
        as ``alias_sources``, which source each alias compaction moved onto it came from).
        Returns the receipt of what was removed. :class:`NotFound` if none, or (with ``user``
        or ``session``) if it is not that end user's or session's."""
        return self._erasure.delete(id, tenant=tenant, reason=reason, user=user, session=session)

    def delete_session(
        self, session: str, *, tenant: str | None = None, reason: str = "session deleted"
    ) -> int:
        """Erase every memory of ``session`` (see :meth:`erase_session`); how many memories
        were removed."""
        return len(self.erase_session(session, tenant=tenant, reason=reason).rowids)

    def erase_session(
        self, session: str, *, tenant: str | None = None, reason: str = "session deleted"
    ) -> ErasureReceipt:
        """Erase every memory of ``session`` (and what summaries hold of them) and its
        inclusion log, leaving tombstones; the receipt of what was removed."""
        return self._erasure.delete_session(session, tenant=tenant, reason=reason)

    def delete_tenant(self, *, tenant: str | None = None, reason: str = "tenant deleted") -> int:
        """Erase every memory of ``tenant`` (see :meth:`erase_tenant`); how many memories were
        removed."""
        return len(self.erase_tenant(tenant=tenant, reason=reason).rowids)

    def erase_tenant(
        self, *, tenant: str | None = None, reason: str = "tenant deleted"
    ) -> ErasureReceipt:
        """Erase every memory of ``tenant`` and its inclusion log, leaving tombstones; the
        receipt of what was removed. Its API keys are revoked in the same transaction. Tool
        keys (``EngineConfig.verifier``) come from configuration: remove the tenant's there."""
        return self._erasure.delete_tenant(tenant=tenant, reason=reason)
