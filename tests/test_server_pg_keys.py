"""API keys on PostgreSQL: the CLI issues them, the HTTP API checks them (issue 7 parity)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from fastapi.testclient import TestClient

from ctxwarden.engine import Engine
from ctxwarden.server.auth import KeyAuth
from ctxwarden.server.http import ServerConfig, create_app
from ctxwarden.store.base import KeyStore

pytestmark = pytest.mark.postgres


def _cli(*args: str) -> str:
    result = subprocess.run(
        [sys.executable, "-m", "ctxwarden", *args],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_keys_from_the_cli_authenticate_http_over_postgres(pg_schema_dsn: str) -> None:
    key = _cli("--db", pg_schema_dsn, "keys", "create", "--tenant", "acme", "--scope", "read",
               "--scope", "write").strip()  # fmt: skip
    assert key.startswith("cw_")
    listed = _cli("--db", pg_schema_dsn, "keys", "list")
    key_id = key[3:].split("_", 1)[0]
    assert listed.startswith(f"{key_id}\tacme\tread,write\tactive")
    assert key.split("_", 2)[2] not in listed  # never the secret
    with Engine.open(pg_schema_dsn) as engine:
        assert isinstance(engine.store, KeyStore)
        client = TestClient(create_app(engine, ServerConfig(authenticate=KeyAuth(engine.store))))
        headers = {"Authorization": f"Bearer {key}"}
        body = {"records": [{"id": "m1", "session": "s", "content": "hello from acme"}]}
        assert client.post("/v1/ingest", json=body, headers=headers).status_code == 200
        assert client.get("/v1/memories/m1", headers=headers).json()["tenant"] == "acme"
        assert client.get("/v1/memories/m1").status_code == 401
        assert client.delete("/v1/memories/m1", headers=headers).status_code == 403
        _cli("--db", pg_schema_dsn, "keys", "revoke", key_id)
        assert client.get("/v1/memories/m1", headers=headers).status_code == 401
