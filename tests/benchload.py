"""Load a script of bench/ as a module, the way the bench smoke tests and the reliability
suite drive them (bench/ is not a package; its scripts import their siblings by name)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parents[1] / "bench"


def load_bench(script: str, name: str) -> Any:
    """``bench/<script>.py`` loaded as the module ``name`` (registered in ``sys.modules``:
    dataclasses and forked children look their module up), with bench/ on ``sys.path`` for its
    sibling imports, as when it runs as a script."""
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{script}.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
