"""The statement primitives of the SQL backends' writers: every write of
:class:`~ctxwarden.store.writes.MemoryWrites` (archive, erasure, memory writes) is written with
SQLite's ``?`` placeholders over these; each backend's writer implements the first three.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

__all__ = ["StatementWrites"]


class StatementWrites:
    """The statement primitives every SQL write uses (archive, erasure, memory writes); each
    backend's writer implements the first three."""

    #: Values per membership test (:meth:`_in`): SQLite binds each value (short statements
    #: plan faster); PostgreSQL binds one array, so it sets no real limit.
    _CHUNK = 400

    def _rows(self, sql: str, params: Sequence[Any]) -> list[Any]:
        """Run one statement written with ``?`` placeholders; its rows."""
        raise NotImplementedError

    def _run(self, sql: str, params: Sequence[Any]) -> None:
        """Run one statement written with ``?`` placeholders that returns no rows."""
        raise NotImplementedError

    def _run_many(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        """Run one statement written with ``?`` placeholders once per row of parameters."""
        raise NotImplementedError

    def _in(self, values: Sequence[Any]) -> tuple[str, list[Any]]:
        """``values`` as the right side of a membership test (``IN (?, ?, ...)``) and its
        parameters; at most :attr:`_CHUNK` values."""
        return f"IN ({','.join('?' * len(values))})", list(values)

    def _chunks(self, values: Sequence[Any]) -> Iterator[list[Any]]:
        """``values`` in pieces of at most :attr:`_CHUNK` (none when empty)."""
        for start in range(0, len(values), self._CHUNK):
            yield list(values[start : start + self._CHUNK])
