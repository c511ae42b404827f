"""Which optional extra a face needs, and the error that names it when it is missing.

``pip install ctxwarden`` gives the library and the CLI's offline commands; the servers need
``ctxwarden[server]`` and a PostgreSQL store ``ctxwarden[postgres]``. :func:`require` checks that
an extra's modules can be imported (without importing them) and raises
:class:`~ctxwarden.errors.MissingExtraError` naming the extra to install.

>>> extra_for("fastapi.routing")
'server'
>>> extra_for("numpy") is None
True
"""

from __future__ import annotations

import importlib.util

from ctxwarden.errors import MissingExtraError

__all__ = ["EXTRAS", "extra_for", "require"]

#: The top-level modules each extra installs (pyproject.toml's optional dependencies; uvicorn
#: uses httptools and uvloop when present, so they are not required).
EXTRAS: dict[str, tuple[str, ...]] = {
    "server": ("fastapi", "starlette", "uvicorn", "mcp", "prometheus_client", "fastapi_offline"),
    "postgres": ("psycopg", "psycopg_pool", "pgvector"),
    # the framework adapters (ctxwarden.adapters): one extra per framework
    "langchain": ("langchain_core",),
    "langgraph": ("langgraph", "langchain_core"),
    "llamaindex": ("llama_index",),
    "agents": ("agents",),
}


def extra_for(module: str | None) -> str | None:
    """The extra that installs ``module`` (a dotted name), or None when no extra does."""
    root = (module or "").partition(".")[0]
    return next((extra for extra, roots in EXTRAS.items() if root in roots), None)


def require(extra: str) -> None:
    """Raise :class:`MissingExtraError` unless every module of ``extra`` can be imported.

    >>> require("server")  # where fastapi is not installed  # doctest: +SKIP
    Traceback (most recent call last):
    ...
    ctxwarden.errors.MissingExtraError: this needs the 'server' extra (fastapi is missing): ...
    """
    missing = [name for name in EXTRAS[extra] if importlib.util.find_spec(name) is None]
    if missing:
        raise MissingExtraError(extra, missing)
