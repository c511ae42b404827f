"""API keys for the servers: issue, check, revoke. Only a SHA-256 of each secret is stored.

A key reads ``cw_<key_id>_<secret>``: ``key_id`` finds the row, the secret's hash is compared in
constant time. Secrets are 256 random bits, so a fast hash is enough (as for GitHub tokens); a
slow password hash would only slow every request. Keys never appear in logs, errors or reports:
errors name the key id at most.

>>> from ctxwarden.store.sqlite import SQLiteStore
>>> store = SQLiteStore(":memory:")
>>> key = issue_key(store, tenant="acme", scopes={"read"})
>>> KeyAuth(store)(key).tenant
'acme'
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from collections.abc import Collection

from ctxwarden.errors import AuthError, InputError
from ctxwarden.server.http import SCOPES, Principal
from ctxwarden.store.base import ApiKey, KeyStore

__all__ = ["KeyAuth", "issue_key"]

_PREFIX = "cw_"


def _hash(secret: str) -> str:
    return hashlib.sha256(secret.encode("utf-8")).hexdigest()


def issue_key(
    store: KeyStore,
    *,
    tenant: str,
    scopes: Collection[str],
    name: str | None = None,
    now: float | None = None,
) -> str:
    """Create a key for ``tenant`` with ``scopes``; returns the key, which is shown only once."""
    if not tenant.strip():
        raise InputError("is blank: name the tenant", field="tenant")
    unknown = sorted(set(scopes) - set(SCOPES))
    if unknown or not scopes:
        raise InputError(
            f"{unknown[0] if unknown else 'none'} is not a scope; use {', '.join(SCOPES)}",
            field="scopes",
        )
    key_id = secrets.token_hex(8)
    secret = secrets.token_urlsafe(32)
    store.put_api_key(
        ApiKey(
            key_id=key_id,
            tenant=tenant,
            scopes=frozenset(scopes),
            secret_hash=_hash(secret),
            name=name,
            created_at=time.time() if now is None else now,
        )
    )
    return f"{_PREFIX}{key_id}_{secret}"


class KeyAuth:
    """Maps a bearer token to a :class:`Principal`; :class:`AuthError` for anything else.

    Pass it as ``ServerConfig(authenticate=KeyAuth(store))``.
    """

    def __init__(self, store: KeyStore) -> None:
        self.store = store

    def __call__(self, token: str | None) -> Principal:
        if token is None:
            raise AuthError("missing API key: send 'Authorization: Bearer <key>'")
        key_id, secret = _split(token)
        key = self.store.api_key(key_id) if key_id else None
        # compare even when the id is unknown, so timing does not tell ids apart
        expected = key.secret_hash if key is not None else _hash("")
        matches = hmac.compare_digest(expected, _hash(secret))
        if key is None or not matches:
            raise AuthError("unknown API key: check the key or issue a new one")
        if key.revoked_at is not None:
            raise AuthError(f"API key {key.key_id} was revoked: issue a new one")
        return Principal(tenant=key.tenant, scopes=key.scopes)


def _split(token: str) -> tuple[str, str]:
    if not token.startswith(_PREFIX):
        return "", token
    key_id, _, secret = token[len(_PREFIX) :].partition("_")
    return key_id, secret
