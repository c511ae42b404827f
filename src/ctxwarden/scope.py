"""Read scopes: which memories of a tenant a read may see (DESIGN rule 6).

Every read (the related block, summaries, pinned memory, search, stats) runs in one of three
scopes:

- ``"session"``: one conversation: the memories of that session (of that end user, when the
  caller names one). The default whenever a session is named.
- ``"user"``: one end user across their sessions (memories ingested with that ``user``).
  The default when a user but no session is named; ``scope="user"`` without a user is an error.
- ``"tenant"``: every memory of the tenant. Only when the caller says so, or names neither a
  session nor a user.

The tenant is always the hard boundary: no scope crosses it. :func:`resolve` turns what a
caller named into a :class:`ReadScope`, whose ``session`` and ``user`` are the filters every
store query applies in SQL (never a post-filter that could starve a result list).

>>> resolve(session="s1", user=None, scope=None)
ReadScope(kind='session', session='s1', user=None)
>>> resolve(session="s1", user="alice", scope="user")
ReadScope(kind='user', session=None, user='alice')
>>> resolve(session=None, user=None, scope=None).kind
'tenant'
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

from ctxwarden.errors import InputError
from ctxwarden.types import SCOPES, Memory, Scope, check_scope_name

__all__ = ["TENANT", "ReadScope", "in_scope", "resolve"]


@dataclass(frozen=True, slots=True)
class ReadScope:
    """The filter of one read: ``session`` and ``user`` are None when not filtered on.

    ``kind`` is what the caller asked for; ``session`` is set only for ``"session"``, and
    ``user`` for ``"user"`` and for ``"session"`` when the caller named a user.
    """

    kind: Scope
    session: str | None = None
    user: str | None = None


def in_scope(memory: Memory, scope: ReadScope | None) -> bool:
    """Whether ``memory`` (of the scope's tenant) is visible in ``scope`` (None: the tenant).

    The same rule as the stores' SQL filter, for memories already in hand.
    """
    if scope is None:
        return True
    if scope.session is not None and memory.session != scope.session:
        return False
    return scope.user is None or memory.user == scope.user


#: The whole tenant: no filter.
TENANT = ReadScope(kind="tenant")


def resolve(*, session: str | None, user: str | None, scope: str | None) -> ReadScope:
    """The scope of a read from what the caller named (module docstring).

    Raises :class:`InputError` naming ``scope`` for an unknown scope, ``user`` for
    ``scope="user"`` without a user, and ``session`` for ``scope="session"`` without one.
    """
    if session is not None:
        check_scope_name(session, "session")
    if user is not None:
        check_scope_name(user, "user")
    if scope is None:
        scope = "session" if session is not None else "user" if user is not None else "tenant"
    elif scope not in SCOPES:
        raise InputError(f"{scope!r} is not one of {', '.join(sorted(SCOPES))}", field="scope")
    if scope == "session":
        if session is None:
            raise InputError(
                "scope 'session' needs a session: name one, or ask for scope='user' or 'tenant'",
                field="session",
            )
        return ReadScope(kind="session", session=session, user=user)
    if scope == "user":
        if user is None:
            raise InputError(
                "scope 'user' needs a user: name the end user, or ask for scope='tenant'",
                field="user",
            )
        return ReadScope(kind="user", user=user)
    return ReadScope(kind=cast(Scope, scope))
