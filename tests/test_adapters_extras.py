"""Each adapter imports its framework lazily: ``import ctxwarden`` and ``ctxwarden.adapters``
pull in no framework, and an adapter whose framework is missing raises an ImportError that names
the extra to install. The framework is hidden in a subprocess (``sys.modules[name] = None``)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from ctxwarden.extras import EXTRAS

_HIDE = "import sys\nfor name in {names!r}:\n    sys.modules[name] = None\n"
FRAMEWORKS = ("langchain_core", "langgraph", "llama_index", "agents")


def _python(code: str, hidden: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", _HIDE.format(names=hidden) + code],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.mark.parametrize(
    ("module", "extra"),
    [
        ("langchain", "langchain"),
        ("langgraph", "langgraph"),
        ("llamaindex", "llamaindex"),
        ("openai_agents", "agents"),
    ],
)
def test_a_missing_framework_names_its_extra(module: str, extra: str) -> None:
    code = (
        "try:\n"
        f"    import ctxwarden.adapters.{module}\n"
        "except ImportError as exc:\n"
        "    print(type(exc).__name__, exc)\n"
    )
    result = _python(code, EXTRAS[extra])
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"MissingExtraError this needs the '{extra}' extra")
    assert result.stdout.strip().endswith(f"pip install 'ctxwarden[{extra}]'")


def test_the_library_and_the_adapter_core_import_no_framework() -> None:
    code = (
        "import sys\nimport ctxwarden, ctxwarden.adapters\n"
        f"print(sorted(n for n in {FRAMEWORKS!r} if n in sys.modules))\n"
    )
    result = _python(code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
