"""Settings: flags over environment over file, errors naming the field."""

from __future__ import annotations

from pathlib import Path

import pytest

from ctxwarden.config import load_settings
from ctxwarden.errors import BudgetError, ConfigError


def test_file_env_and_flags(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "c.toml"
    config.write_text(
        'db = "from-file.db"\ndefault_model = "gpt-4"\n[budget]\nreserve_share = 5\n'
        '[[models]]\nname = "house-model"\ntokenizer = "qwen"\nwindow = 16384\n'
        'chat_format = "chatml"\n'
    )
    settings = load_settings(config)
    assert (settings.db, settings.default_model) == ("from-file.db", "gpt-4")
    monkeypatch.setenv("CTXWARDEN_DEFAULT_MODEL", "gpt-4o")
    assert load_settings(config).default_model == "gpt-4o"
    assert load_settings(config, default_model="qwen3-8b").default_model == "qwen3-8b"
    engine_config = load_settings(config).engine_config()
    assert engine_config.policy.reserve_share == 5
    assert engine_config.models[0].window == 16384


def test_errors_name_the_field(tmp_path: Path) -> None:
    config = tmp_path / "c.toml"
    config.write_text("exact_ttl_seconds = 'soon'\n")
    with pytest.raises(ConfigError, match=r"config.exact_ttl_seconds"):
        load_settings(config)
    config.write_text("[budget]\nreserve_share = 140\n")
    with pytest.raises(BudgetError, match=r"budget.reserve_share"):
        load_settings(config).engine_config()
    config.write_text(
        "[[models]]\nname = 'x'\ntokenizer = 'qwen'\nwindow = -1\nchat_format = 'chatml'\n"
    )
    with pytest.raises(ConfigError, match="window"):
        load_settings(config).engine_config()
    with pytest.raises(ConfigError, match="does not exist"):
        load_settings(tmp_path / "missing.toml")


def test_inclusion_log_defaults_to_deferred_in_the_servers_only(tmp_path: Path) -> None:
    from ctxwarden.cli import _engine

    config = tmp_path / "c.toml"
    config.write_text(f'db = "{tmp_path / "x.db"}"\n')
    settings = load_settings(config)
    assert settings.engine_config().inclusion_log == "sync"
    for server, flag, expected in [
        (False, None, "sync"),
        (True, None, "deferred"),
        (True, "sync", "sync"),
    ]:
        with _engine(settings, server=server, inclusion_log=flag) as engine:
            assert engine.config.inclusion_log == expected
    config.write_text(f'db = "{tmp_path / "x.db"}"\ninclusion_log = "sync"\n')
    with _engine(load_settings(config), server=True) as engine:
        assert engine.config.inclusion_log == "sync"  # the setting wins over the default
    with pytest.raises(ConfigError, match="inclusion_log"):
        _engine(settings, server=True, inclusion_log="later")
    config.write_text("inclusion_log = 'later'\n")
    with pytest.raises(ConfigError, match="config.inclusion_log"):
        load_settings(config)
