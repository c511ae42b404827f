"""Provenance of tool results: HMAC-SHA256 signatures an agent attaches, the engine checks.

Every memory records who wrote it (``author_kind``: human, bot, agent or tool). A record that
claims to be a tool result (``role == "tool"`` or ``author_kind == "tool"``) is trusted only when
it carries a valid signature under its tenant's tool key: an HMAC-SHA256 over the tenant, the
session, the tool's name, the tool call id, the SHA-256 of the content and the signing time.
Anything else that claims to be a tool result is kept, marked untrusted
(``metadata["provenance"]``), and is never placed in the system message; when retrieved it is
rendered as quoted data with its author (see :mod:`ctxwarden.render`).

An agent signs its tool results with :func:`sign` and sends the dict it returns as the record's
``metadata["signature"]``::

    >>> key = b"k" * 32
    >>> sig = sign(key, tenant="acme", session="s1", tool="search", call_id="call_1",
    ...            content="3 results", signed_at=1_800_000_000)
    >>> sorted(sig)
    ['alg', 'mac', 'signed_at']
    >>> verifier = Verifier({"acme": key}, clock=lambda: 1_800_000_010.0)
    >>> verifier.check(tenant="acme", session="s1", tool="search", call_id="call_1",
    ...                content="3 results", signature=sig).trusted
    True

Keys are per tenant and never appear in a ``repr``, a log line or an error message.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ctxwarden.errors import ConfigError, InputError

__all__ = [
    "ALGORITHM",
    "PROVENANCE_KEY",
    "SIGNATURE_KEY",
    "Verdict",
    "Verifier",
    "claims_tool_result",
    "is_untrusted",
    "sign",
]

#: The signature scheme's name, sent in the signature dict.
ALGORITHM = "hmac-sha256-v1"
#: The metadata key a record's signature travels in.
SIGNATURE_KEY = "signature"
#: The metadata key where the engine records its verdict (callers cannot set it).
PROVENANCE_KEY = "provenance"


def _key_bytes(key: bytes | str) -> bytes:
    data = key.encode("utf-8") if isinstance(key, str) else bytes(key)
    if len(data) < 16:
        raise ConfigError("tool key: shorter than 16 bytes; use at least 32 random bytes")
    return data


def _message(
    *, tenant: str, session: str, tool: str, call_id: str, content: str, signed_at: float
) -> bytes:
    digest = hashlib.sha256(content.strip().encode("utf-8", "surrogatepass")).hexdigest()
    # JSON array: unambiguous field boundaries whatever the strings contain.
    return json.dumps(
        [ALGORITHM, tenant, session, tool, call_id, digest, f"{float(signed_at):.3f}"],
        ensure_ascii=True,
        separators=(",", ":"),
    ).encode("ascii")


def sign(
    key: bytes | str,
    *,
    tenant: str,
    session: str,
    tool: str,
    call_id: str,
    content: str,
    signed_at: float | None = None,
) -> dict[str, Any]:
    """The signature of one tool result, to send as ``metadata["signature"]``.

    ``content`` is signed as ingest stores it (stripped of surrounding whitespace); ``tool`` is
    the record's ``name`` and ``call_id`` its ``tool_call_id``; ``signed_at`` (epoch seconds)
    defaults to now.
    """
    at = time.time() if signed_at is None else float(signed_at)
    if not math.isfinite(at):
        raise InputError("is not a finite time", field="signed_at")
    mac = hmac.new(
        _key_bytes(key),
        _message(
            tenant=tenant, session=session, tool=tool, call_id=call_id, content=content,
            signed_at=at,
        ),
        hashlib.sha256,
    ).hexdigest()  # fmt: skip
    return {"alg": ALGORITHM, "signed_at": round(at, 3), "mac": mac}


def claims_tool_result(role: str, author_kind: str) -> bool:
    """Whether a record presents itself as a tool's output (and so needs a signature)."""
    return role == "tool" or author_kind == "tool"


@dataclass(frozen=True, kw_only=True, slots=True)
class Verdict:
    """The outcome of checking one record: trusted or not, and why."""

    trusted: bool
    reason: str

    def to_metadata(self) -> dict[str, Any]:
        """What the engine stores under ``metadata["provenance"]``."""
        return {"trusted": self.trusted, "reason": self.reason}


class Verifier:
    """Checks tool-result signatures with per-tenant keys.

    ``keys`` maps a tenant to its tool key (bytes or text, 16 bytes at least). A signature is
    accepted when its time lies within ``max_age_seconds`` before now (and at most
    ``max_skew_seconds`` after it). The keys are kept out of ``repr``.
    """

    def __init__(
        self,
        keys: Mapping[str, bytes | str],
        *,
        max_age_seconds: float = 300.0,
        max_skew_seconds: float = 30.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if max_age_seconds <= 0:
            raise ConfigError(f"max_age_seconds: {max_age_seconds} must be positive")
        if max_skew_seconds < 0:
            raise ConfigError(f"max_skew_seconds: {max_skew_seconds} is negative")
        self._keys = {tenant: _key_bytes(key) for tenant, key in keys.items()}
        self.max_age_seconds = max_age_seconds
        self.max_skew_seconds = max_skew_seconds
        self.clock = clock

    def __repr__(self) -> str:
        return f"Verifier(tenants={len(self._keys)}, max_age_seconds={self.max_age_seconds})"

    def check(
        self,
        *,
        tenant: str,
        session: str,
        tool: str | None,
        call_id: str | None,
        content: str,
        signature: object,
    ) -> Verdict:
        """Whether ``signature`` proves this tool result; never raises for a bad signature."""
        if signature is None:
            return Verdict(trusted=False, reason="unsigned tool result")
        if not isinstance(signature, Mapping):
            return Verdict(trusted=False, reason="signature is not an object")
        if signature.get("alg") != ALGORITHM:
            return Verdict(trusted=False, reason="unknown signature algorithm")
        mac = signature.get("mac")
        signed_at = signature.get("signed_at")
        if (
            not isinstance(mac, str)
            or isinstance(signed_at, bool)
            or not isinstance(signed_at, int | float)
            or not math.isfinite(signed_at)
        ):
            return Verdict(trusted=False, reason="malformed signature")
        key = self._keys.get(tenant)
        if key is None:
            return Verdict(trusted=False, reason="no tool key configured for this tenant")
        expected = hmac.new(
            key,
            _message(
                tenant=tenant, session=session, tool=tool or "", call_id=call_id or "",
                content=content, signed_at=float(signed_at),
            ),
            hashlib.sha256,
        ).hexdigest()  # fmt: skip
        if not hmac.compare_digest(expected, mac):
            return Verdict(trusted=False, reason="signature does not match")
        age = self.clock() - float(signed_at)
        if age > self.max_age_seconds:
            return Verdict(trusted=False, reason="signature is stale")
        if age < -self.max_skew_seconds:
            return Verdict(trusted=False, reason="signature time is in the future")
        return Verdict(trusted=True, reason="valid signature")


def is_untrusted(metadata: Mapping[str, Any] | None) -> bool:
    """Whether a stored memory's metadata marks it untrusted."""
    if not metadata:
        return False
    verdict = metadata.get(PROVENANCE_KEY)
    return isinstance(verdict, Mapping) and verdict.get("trusted") is False
