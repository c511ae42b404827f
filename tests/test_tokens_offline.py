"""Every real tokenizer loads and counts with no network at all."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

# Runs in the child: any connection attempt fails loudly even if the namespace were not empty.
CHILD = r"""
import socket

def refuse(*args, **kwargs):
    raise RuntimeError("network access attempted while counting tokens")

socket.socket.connect = refuse
socket.socket.connect_ex = refuse
socket.create_connection = refuse

from ctxwarden.tokens import TOKENIZER_NAMES, get_tokenizer

for name in TOKENIZER_NAMES:
    tok = get_tokenizer(name)
    assert tok.count("hello world, 你好 😀 {\"a\": 1}") > 3, name
print("ok", len(TOKENIZER_NAMES))
"""


def _network_namespace_works() -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", "-n", "true"], capture_output=True, check=False)
    return probe.returncode == 0


@pytest.mark.skipif(
    not _network_namespace_works(),
    reason="`unshare -n` is unavailable (needs root or user namespaces); cannot cut the network",
)
def test_every_tokenizer_loads_without_network() -> None:
    result = subprocess.run(
        ["unshare", "-n", sys.executable, "-c", CHILD],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.startswith("ok ")
