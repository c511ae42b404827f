"""The embedded PostgreSQL 18 + pgvector of ``scripts/pg.py``, for the benches that compare
backends (bench/backends.py, bench/lexical_agreement.py)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def pg_script() -> Any:
    """``scripts/pg.py`` loaded as a module (its ``start``/``stop`` run a throw-away server)."""
    spec = importlib.util.spec_from_file_location("pg_script", ROOT / "scripts" / "pg.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
