"""bench/proxy.py at a tiny size: it replays, measures and prints its table."""

from __future__ import annotations

import re
from typing import Any

import pytest

from benchload import load_bench


def _bench() -> Any:
    return load_bench("proxy", "bench_proxy")


def test_bench_proxy_prints_its_table(capsys: pytest.CaptureFixture[str]) -> None:
    _bench().main(["--turns", "20", "--window", "16000", "--sizes", "40", "--runs", "2"])
    out = capsys.readouterr().out
    share = re.search(r"\| upstream prefix = previous request's \| ([\d.]+)% \|", out)
    assert share is not None
    assert 0.0 <= float(share.group(1)) <= 100.0
    trimmed = re.search(r"\| requests trimmed \| (\d+) of (\d+) \|", out)
    assert trimmed is not None
    assert int(trimmed.group(1)) > 0  # a 16,000-token window overflows within 20 turns
    sent = re.search(r"\| tokens sent upstream / sending everything \| ([\d,]+) / ([\d,]+)", out)
    assert sent is not None
    assert int(sent.group(1).replace(",", "")) < int(sent.group(2).replace(",", ""))
    assert "| 40 | nobody |" in out
    assert "| 40 | session |" in out


def test_the_generated_session_has_tool_rounds_and_is_valid() -> None:
    from ctxwarden.server.chatfit import validate_messages

    requests = list(_bench().session(30))
    assert any(m["role"] == "tool" for m in requests[-1])
    for messages in requests:
        validate_messages(messages)
