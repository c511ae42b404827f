"""The way back: a summary's archived originals and offloaded tool results.

:class:`Expansion` is the service behind :meth:`ctxwarden.engine.Engine.expand`,
:meth:`~ctxwarden.engine.Engine.purge_archive` and :meth:`~ctxwarden.engine.Engine.offload`:

- compaction with ``CompactionPolicy(keep_originals="archive")`` keeps the originals it replaces
  by a summary, compressed, in the store's archive for ``archive_days``; ``expand(summary_id)``
  returns them while they exist (expired ones are deleted by the next compaction or
  ``purge_archive``; erasure removes them with what it erases);
- ``offload(messages, max_tokens=...)`` stores each tool result over ``max_tokens`` as a memory
  of the caller's session and end user and replaces it by a preview naming its id
  (:mod:`ctxwarden.offload`); ``expand(id)`` returns it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ctxwarden import tokens
from ctxwarden.engine_config import EngineConfig
from ctxwarden.errors import InputError, NotFound
from ctxwarden.models import ModelRegistry
from ctxwarden.offload import Offloaded, offload_messages
from ctxwarden.store.base import Store, scrub_until_done
from ctxwarden.types import IngestResult, Memory

__all__ = ["Expansion", "ExpansionFaces"]


@dataclass(eq=False)
class Expansion:
    """Reads a summary's archived originals and offloads tool results (see the module doc)."""

    store: Store
    config: EngineConfig
    clock: Callable[[], float]
    registry: ModelRegistry
    #: The scoped read (``Engine.get``): :class:`NotFound` outside the scope named.
    get: Callable[..., Memory]
    #: ``Engine.ingest``.
    ingest: Callable[..., IngestResult]

    def expand(
        self, id: str, *, tenant: str | None, user: str | None, session: str | None
    ) -> tuple[Memory, ...]:
        """The originals of summary ``id`` (archived), or the offloaded tool result ``id``."""
        tenant = tenant or self.config.tenant
        memory = self.get(id, tenant=tenant, user=user, session=session)
        if memory.id == id and memory.metadata.get("offloaded") is True:
            return (memory,)
        if memory.kind != "summary":
            raise InputError(
                f"{id!r} is not a summary or an offloaded tool result: nothing to expand "
                "(read it with get)",
                field="id",
            )
        originals = self.store.archived(tenant, memory.id, now=self.clock())
        if memory.id != id:  # an id compacted into this summary: its own original
            originals = [m for m in originals if m.id == id]
        if not originals:
            raise NotFound(
                f"the originals of {id!r} are gone: compacted with keep_originals='delete', "
                "past their archive_days, or erased"
            )
        return tuple(originals)

    def purge_archive(self) -> int:
        """Delete the archived originals past their retention; how many."""
        with self.store.write() as writer:
            purged = writer.purge_archive(self.clock())
        if purged:
            scrub_until_done(self.store)  # their compressed text leaves the files too
        return purged

    def offload(
        self,
        messages: Sequence[Any],
        *,
        max_tokens: int,
        session: str,
        user: str | None,
        tenant: str | None,
        model: str | None,
        tokenizer: str | None,
        preview_chars: int,
    ) -> Offloaded:
        """Store the tool results of ``messages`` over ``max_tokens`` and replace them by
        previews (see :meth:`Engine.offload`)."""
        tenant = tenant or self.config.tenant
        spec = self.registry.resolve(model or self.config.default_model, tokenizer=tokenizer)
        tok = tokens.get_tokenizer(spec.tokenizer)
        out = offload_messages(
            messages,
            count=tok.count,
            max_tokens=max_tokens,
            preview_chars=preview_chars,
            tenant=tenant,
            user=user,
            session=session,
        )
        if out.records:
            self.ingest(list(out.records), tenant=tenant, session=session, user=user, fold=False)
        return out


class ExpansionFaces:
    """The engine's way-back methods (mixed into ``Engine``), each delegating to its
    :class:`Expansion`."""

    _expansion: Expansion

    def expand(
        self,
        id: str,
        *,
        tenant: str | None = None,
        user: str | None = None,
        session: str | None = None,
    ) -> tuple[Memory, ...]:
        """What ``id`` stands for: the originals of a summary written by compaction with
        ``CompactionPolicy(keep_originals="archive")`` (oldest first; for an id compacted into
        a summary, its own original), or the whole text of a tool result :meth:`offload`
        stored. :class:`NotFound` when they are gone (deleted at compaction, expired, erased)
        or ``id`` is not in the ``user`` or ``session`` named; :class:`InputError` naming
        ``id`` when it is neither a summary nor an offloaded result.

        >>> from ctxwarden import Engine
        >>> with Engine.open(":memory:") as engine:
        ...     out = engine.offload(
        ...         [{"role": "tool", "tool_call_id": "c1", "content": "log line " * 400}],
        ...         max_tokens=100, session="s",
        ...     )
        ...     engine.expand(out.ids[0])[0].content == ("log line " * 400).strip()
        True
        """
        return self._expansion.expand(id, tenant=tenant, user=user, session=session)

    def purge_archive(self) -> int:
        """Delete the archived originals past their ``archive_days`` (every tenant), scrubbing
        their text from the files; how many. :meth:`compact` does it too, before it plans."""
        return self._expansion.purge_archive()

    def offload(
        self,
        messages: Sequence[Any],
        *,
        max_tokens: int,
        session: str,
        user: str | None = None,
        tenant: str | None = None,
        model: str | None = None,
        tokenizer: str | None = None,
        preview_chars: int = 400,
    ) -> Offloaded:
        """Offload large tool results: each ``tool`` message of ``messages`` (OpenAI chat
        format) whose text counts more than ``max_tokens`` with ``model``'s tokenizer is
        stored as a memory of ``session`` (and end user ``user``) and replaced, in the returned
        ``messages``, by a preview of ``preview_chars`` characters naming its id;
        :meth:`expand` (HTTP ``GET /v1/memories/{id}/sources``, MCP ``expand``) brings it back.
        The same result gets the same id and preview every time (prompt caches keep hitting).
        """
        return self._expansion.offload(
            messages,
            max_tokens=max_tokens,
            session=session,
            user=user,
            tenant=tenant,
            model=model,
            tokenizer=tokenizer,
            preview_chars=preview_chars,
        )
