"""The settings file's compaction policy (``compact_older_than``, ``keep_originals``,
``archive_days``, ``compact_max_summary_share``, ``compact_lossless_packs``,
``compact_min_pack_saving``) is what scheduled runs, ``ctxwarden compact`` and the HTTP compact
endpoints do unless a flag or a request field says otherwise."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from conftest import Clock
from ctxwarden import ConfigError, Engine
from ctxwarden.config import load_settings
from ctxwarden.server.http import ServerConfig, create_app
from serving import serve
from test_archive import CHAT  # a week's chat with two facts in small talk
from test_compact import cli_on
from test_compact_pack import _dense  # a day where every message is a fact

DAY = 86400.0


def _records(start: float) -> list[dict[str, Any]]:
    return [
        {"id": f"a{i}", "session": "s1", "author": ["ana", "bo"][i % 2], "content": text,
         "created_at": start + i * 60}
        for i, text in enumerate(CHAT)
    ]  # fmt: skip


def _settings(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "ctxwarden.toml"
    path.write_text(text, encoding="utf-8")
    return path


ARCHIVE = 'keep_originals = "archive"\narchive_days = 5\ncompact_max_summary_share = 0.9\n'


def test_scheduled_compaction_archives_when_the_settings_say_so(tmp_path: Path) -> None:
    """A server's scheduled run takes the settings' policy: with ``keep_originals =
    "archive"`` the originals can be expanded afterwards (they were deleted before)."""
    settings = load_settings(_settings(tmp_path, ARCHIVE))
    config = settings.engine_config()
    assert config.compact_policy is not None
    assert config.compact_policy.keep_originals == "archive"
    assert config.compact_policy.archive_days == 5
    clock = Clock()
    with Engine.open(tmp_path / "s.db", config=config, clock=clock) as engine:
        engine.ingest(_records(clock.now - 20 * DAY))
        run = engine.compactor.run_once()
        (summary_id,) = (s.id for s in engine.store.summaries("default"))
        assert run.compacted == len(CHAT)
        assert [m.content for m in engine.expand(summary_id)] == CHAT


def test_http_compaction_defaults_to_the_servers_settings(tmp_path: Path) -> None:
    """``POST /v1/compact/apply`` with no policy fields follows the server's settings; a field
    in the request overrides them for that call."""
    settings = load_settings(_settings(tmp_path, ARCHIVE))
    clock = Clock()
    engine = Engine.open(tmp_path / "h.db", config=settings.engine_config(), clock=clock)
    with (
        engine,
        serve(create_app(engine, ServerConfig())) as url,
        httpx.Client(base_url=url) as http,
    ):
        start = clock.now - 20 * DAY
        records = _records(start)
        assert http.post("/v1/ingest", json={"records": records}).status_code == 200
        applied = http.post("/v1/compact/apply", json={})
        assert applied.status_code == 200, applied.text
        (summary_id,) = applied.json()["summaries"]
        sources = http.get(f"/v1/memories/{summary_id}/sources")
        assert sources.status_code == 200, sources.text
        assert [s["content"] for s in sources.json()["sources"]] == CHAT
        # the same history in another session, compacted with the request's own choice
        again = [{**r, "id": f"b{i}", "session": "s2"} for i, r in enumerate(records)]
        assert http.post("/v1/ingest", json={"records": again}).status_code == 200
        deleted = http.post("/v1/compact/apply", json={"keep_originals": "delete"})
        assert deleted.status_code == 200, deleted.text
        (other,) = deleted.json()["summaries"]
        assert http.get(f"/v1/memories/{other}/sources").status_code == 404
        plan = http.post("/v1/compact/plan", json={"older_than": 30 * DAY})
        assert plan.status_code == 200
        assert plan.json()["clusters"] == []


def test_cli_compaction_follows_the_settings_and_the_flag_wins(tmp_path: Path) -> None:
    config = _settings(tmp_path, "compact_lossless_packs = false\n")
    cli = cli_on(tmp_path, _dense(1_700_000_000.0), "--config", str(config))
    off = cli("compact", "--plan", "--json")
    assert off.exit_code == 0, off.output
    assert json.loads(off.output)["clusters"] == []
    assert json.loads(off.output)["skipped"]["facts"] == 6
    on = cli("compact", "--plan", "--json", "--lossless-packs")
    assert on.exit_code == 0, on.output
    [summary] = json.loads(on.output)["summaries"]
    assert summary["lossless"] is True
    _settings(tmp_path, 'compact_older_than = "100000d"\n')  # the same file, rewritten
    none = cli("compact", "--plan", "--json")
    assert json.loads(none.output)["clusters"] == []
    assert json.loads(none.output)["considered"] == 0


@pytest.mark.parametrize(
    ("line", "field"),
    [
        ("compact_min_pack_saving = 1.5", "compact_min_pack_saving"),
        ("compact_max_summary_share = 0", "compact_max_summary_share"),
        ('compact_lossless_packs = "sometimes"', "compact_lossless_packs"),
        ('compact_older_than = "soon"', "compact_older_than"),
    ],
)
def test_bad_compaction_settings_name_the_field(tmp_path: Path, line: str, field: str) -> None:
    with pytest.raises(ConfigError, match=field):
        load_settings(_settings(tmp_path, line + "\n")).engine_config()


def test_the_engines_configured_policy_is_its_default(tmp_path: Path) -> None:
    """``engine.compact()`` without a policy follows ``EngineConfig.compact_policy``."""
    from ctxwarden import EngineConfig
    from ctxwarden.compact import CompactionPolicy

    policy = CompactionPolicy(max_summary_share=0.9, keep_originals="archive")
    clock = Clock()
    config = EngineConfig(embed="off", compact_policy=policy)
    with Engine.open(tmp_path / "e.db", config=config, clock=clock) as engine:
        engine.ingest(_records(clock.now - 20 * DAY))
        result = engine.compact()
        assert result.archived == len(CHAT)
        (summary_id,) = result.summaries
        assert [m.content for m in engine.expand(summary_id)] == CHAT
