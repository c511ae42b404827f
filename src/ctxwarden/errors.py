"""The one error tree of ctxwarden.

Every error the library raises on purpose is a :class:`CtxwardenError`; backend exceptions are
translated at the boundary (``raise StoreError(...) from exc``). Messages say what to do next.

::

    CtxwardenError
    ├── ConfigError        a setting, policy or registry entry is invalid
    │   └── BudgetError    a budget policy is invalid or cannot be met
    ├── MissingExtraError  an optional extra is not installed (also an ImportError)
    ├── InputError         a record, request or argument is invalid (names the field and line)
    ├── TokenizerError     no tokenizer can be had, or text cannot be counted
    ├── StoreError         the database failed or is in an unexpected state
    │   ├── ConflictError  a write lost a race or breaks a uniqueness rule
    │   └── StoreUnavailable  the store cannot be written now (disk full, read-only, locked,
    │                         I/O error): nothing was changed; retry later (HTTP 503)
    ├── EmbedError         the embedder failed or is not the one the store was built with
    ├── SummarizeError     the summariser failed or its output could not be validated
    ├── UpstreamError      an upstream model server failed (timeouts, bad status, bad body)
    │   └── UpstreamTimeoutError  no answer within the configured timeout (not retried)
    ├── OverloadedError    too much work queued: retry later (HTTP 429)
    ├── AuthError          a missing, unknown or revoked API key
    │   └── ScopeError     a valid key without the scope the operation needs
    └── NotFound           an id, session or tenant that does not exist
"""

from __future__ import annotations

__all__ = [
    "AuthError",
    "BudgetError",
    "ConfigError",
    "ConflictError",
    "CtxwardenError",
    "EmbedError",
    "InputError",
    "MissingExtraError",
    "NotFound",
    "OverloadedError",
    "ScopeError",
    "StoreError",
    "StoreUnavailable",
    "SummarizeError",
    "TokenizerError",
    "UpstreamError",
    "UpstreamTimeoutError",
]


class CtxwardenError(Exception):
    """Base of every error ctxwarden raises on purpose."""


class ConfigError(CtxwardenError):
    """A setting, policy or registry entry is invalid.

    >>> raise ConfigError("budget.reserve: 9000 must be below the window (8192)")
    Traceback (most recent call last):
    ...
    ctxwarden.errors.ConfigError: budget.reserve: 9000 must be below the window (8192)
    """


class BudgetError(ConfigError):
    """A budget policy is invalid (names the field) or cannot hold the fixed blocks."""


class MissingExtraError(CtxwardenError, ImportError):
    """A face or backend needs an optional extra that is not installed; says which to install.

    >>> print(MissingExtraError("server", ["fastapi"]))
    this needs the 'server' extra (fastapi is missing): pip install 'ctxwarden[server]'
    """

    def __init__(self, extra: str, missing: list[str]) -> None:
        what = f"{', '.join(missing)} {'is' if len(missing) == 1 else 'are'} missing"
        install = f"pip install 'ctxwarden[{extra}]'"
        super().__init__(f"this needs the {extra!r} extra ({what}): {install}")
        self.extra = extra
        self.missing = tuple(missing)
        self.name = missing[0] if missing else None  # ImportError's: the module not found


class InputError(CtxwardenError):
    """A record, request or argument is invalid.

    ``field`` names the offending field and ``line`` the 1-based line (or record index) where it
    came from, when known; both are also in the message.
    """

    def __init__(self, message: str, *, field: str | None = None, line: int | None = None) -> None:
        # the offending text may be quoted in either: a lone surrogate in it would make the
        # error itself unprintable as UTF-8 (and its HTTP answer a 500), so it is escaped
        message = printable(message)
        field = None if field is None else printable(field)
        where = []
        if line is not None:
            where.append(f"line {line}")
        if field is not None:
            where.append(f"field '{field}'")
        prefix = ", ".join(where)
        super().__init__(f"{prefix}: {message}" if prefix else message)
        self.field = field
        self.line = line
        self.reason = message


def printable(text: str) -> str:
    """``text`` with lone surrogates escaped (``\\ud800``), so it can be written as UTF-8.

    >>> printable("id '\\ud800'")
    "id '\\\\ud800'"
    """
    if text.isascii():
        return text
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


class TokenizerError(CtxwardenError):
    """No tokenizer can be had for a model, or a text cannot be counted."""


class StoreError(CtxwardenError):
    """The database failed or holds something unexpected."""


class ConflictError(StoreError):
    """A write lost a race or would break a uniqueness rule."""


class StoreUnavailable(StoreError):  # noqa: N818 - a state the caller waits out, named like NotFound
    """The store cannot do this now, for a cause outside ctxwarden: the disk is full, the file
    is read-only, another writer held the lock past the wait limit (or the lock was lost), or
    the disk answered an I/O error. The transaction was rolled back, so the store is as it was;
    reads go on. ``cause`` names it (``"disk full"``, ``"read-only"``, ``"locked"``,
    ``"lost lock"``, ``"I/O error"``; on PostgreSQL also ``"timeout"``, a statement past the
    wait limit, and ``"busy"``, no pooled connection free); ``retry_after`` is a hint in
    seconds (HTTP 503 with ``Retry-After``).

    >>> error = StoreUnavailable("disk full", "the disk holding x.db is full: free space")
    >>> error.cause, error.retry_after
    ('disk full', 1.0)
    """

    def __init__(self, cause: str, message: str, *, retry_after: float = 1.0) -> None:
        super().__init__(message)
        self.cause = cause
        self.retry_after = retry_after


class EmbedError(CtxwardenError):
    """The embedder failed, or differs from the one the store's vectors were built with."""


class SummarizeError(CtxwardenError):
    """The summariser failed or its output could not be validated and repaired.

    ``reason`` is a short code for reports (``invalid``, ``echo``, ``lost_facts``,
    ``dropped_ids``, ``timeout``, ``upstream``; empty when not given).

    >>> SummarizeError("no answer within 5s", reason="timeout").reason
    'timeout'
    """

    def __init__(self, message: str, *, reason: str = "") -> None:
        super().__init__(message)
        self.reason = reason


class UpstreamError(CtxwardenError):
    """An upstream model server failed: timeout, error status or an unusable body."""


class UpstreamTimeoutError(UpstreamError):
    """The upstream model server sent no answer within the timeout (a read timeout is not
    retried: the request may still be running upstream)."""


class OverloadedError(CtxwardenError):
    """Too much work is queued (turn slots full): retry after a moment."""


class AuthError(CtxwardenError):
    """A missing, unknown or insufficient API key."""


class ScopeError(AuthError):
    """A valid API key that lacks the scope (read, write, delete, admin) an operation needs."""


class NotFound(CtxwardenError):  # noqa: N818 - the house style names it so, like httpx's NotFound-style names
    """An id, session or tenant that does not exist."""
