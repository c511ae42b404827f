"""The file format of a :class:`~ctxwarden.vectors.VectorIndex` (``<db>.vectors/<model>.idx``).

Layout: ``CTXWVEC1``, an 8-byte little-endian header length, a JSON header (``format``, ``dim``,
``count``, ``connectivity``, ``expansion_add``, ``graph_bytes``), the live ids (int64), their
float16 vectors, then the serialised graph. :func:`write_index` writes one atomically (temporary
file, fsync, ``os.replace``); :func:`read_index` reads and checks one. A file this version cannot
read raises :class:`~ctxwarden.errors.StoreError` saying to delete it: the index is a cache of
the vectors in the store and is rebuilt from them.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

from ctxwarden.errors import StoreError

__all__ = ["REBUILD_HINT", "IndexFile", "read_index", "write_index"]

_MAGIC = b"CTXWVEC1"
_FORMAT = 1
#: What a message about an unreadable index file tells the reader to do.
REBUILD_HINT = "delete it to rebuild the index from the store"


class IndexFile(NamedTuple):
    """The parts of an index file, checked for length: ``vectors`` is the flat float16 array
    of ``rows * dim`` values, ``graph_bytes`` the serialised graph (not yet restored)."""

    header: dict[str, Any]
    dim: int
    rows: int
    ids: npt.NDArray[np.int64]
    vectors: npt.NDArray[Any]
    graph_bytes: bytes


def write_index(
    target: Path,
    *,
    dim: int,
    connectivity: int,
    expansion_add: int,
    ids: npt.NDArray[np.int64],
    vectors: npt.NDArray[Any],
    graph_bytes: bytes | bytearray,
) -> None:
    """Write an index file to ``target`` atomically (a reader sees the old file or the new one):
    the live ``ids``, their ``vectors`` (one row each) and the serialised graph."""
    temporary = target.with_name(f".{target.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    header = json.dumps(
        {
            "format": _FORMAT,
            "dim": dim,
            "count": int(ids.size),
            "connectivity": connectivity,
            "expansion_add": expansion_add,
            "graph_bytes": len(graph_bytes),
        }
    ).encode()
    try:
        with open(temporary, "wb") as handle:
            handle.write(_MAGIC + len(header).to_bytes(8, "little") + header)
            handle.write(ids.astype("<i8").tobytes())
            handle.write(vectors.astype("<f2").tobytes())
            handle.write(graph_bytes)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, target)
    except OSError as exc:
        temporary.unlink(missing_ok=True)
        raise StoreError(
            f"could not save the vector index to {target}: {exc}; check the directory "
            "exists, is writable and has free space"
        ) from exc


def read_index(source: Path) -> IndexFile:
    """Read the index file at ``source``. Raises :class:`~ctxwarden.errors.StoreError` if it is
    missing, truncated, of another format or not an index."""
    fix = REBUILD_HINT
    try:
        with open(source, "rb") as handle:
            if handle.read(len(_MAGIC)) != _MAGIC:
                raise StoreError(f"{source} is not a ctxwarden vector index: {fix}")
            header = json.loads(handle.read(int.from_bytes(handle.read(8), "little")))
            if header.get("format") != _FORMAT:
                raise StoreError(
                    f"{source} has vector index format {header.get('format')}, this version "
                    f"reads {_FORMAT}: {fix}"
                )
            dim, count = int(header["dim"]), int(header["count"])
            ids = np.frombuffer(handle.read(8 * count), dtype="<i8").astype(np.int64)
            matrix = np.frombuffer(handle.read(2 * count * dim), dtype="<f2")
            graph_bytes = handle.read(int(header["graph_bytes"]))
    except OSError as exc:
        raise StoreError(f"could not read the vector index {source}: {exc}; {fix}") from exc
    except (ValueError, KeyError, TypeError) as exc:
        raise StoreError(f"{source} has a damaged header ({exc}): {fix}") from exc
    if ids.size != count or matrix.size != count * dim or len(graph_bytes) != header["graph_bytes"]:
        raise StoreError(f"{source} is truncated: {fix}")
    return IndexFile(header, dim, count, ids, matrix, graph_bytes)
