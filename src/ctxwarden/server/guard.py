"""What a caller may read beyond a route's own scope check (issue 20, item 5).

- ``/metrics`` (the HTTP API's and the proxy's) answers a loopback client, or any other client
  with a key holding the ``read`` scope: counts and latencies carry no memory, but request and
  token volumes per outcome are still the tenants' business (:func:`require_metrics_access`).
- A key with ``write`` but not ``read`` (an ingest-only bot) reads nothing: pin and unpin answer
  it with the memory's id and pin state, never its content (:func:`memory_view`), and the proxy
  adds no retrieved-memory block to its conversations (``Who.reads``), since that block quotes
  stored memories back to the caller.
- Nor does an ingest's answer tell it what the store held: to a write-only key every record
  is ``accepted`` (:func:`ingest_view`), where a reader sees ``stored``, ``duplicate`` with
  the ``duplicate_of`` id of the record that held the text already, ``known`` and the rest.
  Those say that a text or an id existed, which another writer of the tenant may have stored.

>>> from ctxwarden.server.http import Principal
>>> can_read(Principal(tenant="t", scopes=frozenset({"write"})))
False
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable
from typing import Any, Protocol

from ctxwarden.types import IngestResult, Memory

__all__ = ["can_read", "ingest_view", "is_loopback", "memory_view", "require_metrics_access"]


class _Scoped(Protocol):
    @property
    def scopes(self) -> frozenset[str]: ...

    def require(self, scope: str) -> None: ...


def can_read(principal: _Scoped) -> bool:
    """Whether ``principal`` may read memories (``read`` or ``admin``)."""
    return "read" in principal.scopes or "admin" in principal.scopes


def ingest_view(principal: _Scoped, result: IngestResult) -> dict[str, Any]:
    """``result`` as an ingest response may show it to ``principal``: every outcome and the
    counts per status for a reader; for a write-only key each record's own id with status
    ``accepted`` (what became of it would tell what the store held).

    >>> from ctxwarden.server.http import Principal
    >>> from ctxwarden.types import IngestOutcome
    >>> dup = IngestOutcome(id="m2", status="duplicate", duplicate_of="m1")
    >>> done = IngestResult(outcomes=(dup,))
    >>> ingest_view(Principal(tenant="t", scopes=frozenset({"write"})), done)
    {'outcomes': [{'id': 'm2', 'status': 'accepted'}], 'counts': {'accepted': 1}}
    """
    if can_read(principal):
        return {"outcomes": [o.to_dict() for o in result.outcomes], "counts": result.counts}
    return {
        "outcomes": [{"id": o.id, "status": "accepted"} for o in result.outcomes],
        "counts": {"accepted": len(result.outcomes)},
    }


def is_loopback(client: Any) -> bool:
    """Whether an ASGI client address (``request.client``: host and port, or None) is this
    machine (127.0.0.0/8, ::1). A host that is not an IP address (a test client's name) is not.

    >>> is_loopback(("127.0.0.1", 5000)), is_loopback(("203.0.113.7", 5000)), is_loopback(None)
    (True, False, False)
    """
    if client is None:
        return False
    try:
        return ipaddress.ip_address(str(client[0])).is_loopback
    except ValueError:
        return False


def require_metrics_access(client: Any, principal: Callable[[], _Scoped]) -> None:
    """Let a loopback ``client`` through; otherwise ``principal()`` (which authenticates the
    request's key, raising :class:`~ctxwarden.errors.AuthError` without one) must hold
    ``read``."""
    if not is_loopback(client):
        principal().require("read")


def memory_view(principal: _Scoped, memory: Memory) -> dict[str, Any]:
    """``memory`` as a response may show it to ``principal``: whole for a reader, else only its
    id and pin state (a write-only key learns what it changed, not what the memory says)."""
    if can_read(principal):
        return memory.to_dict()
    return {"id": memory.id, "pinned": memory.pinned}
