"""Settings for the CLI and the servers: flags > ``CTXWARDEN_*`` environment > TOML file > defaults.

The library never reads the environment; ``main()`` functions build one :class:`Settings` and pass
what it says down as typed value objects (:meth:`Settings.engine_config`).

A config file (``--config PATH``, else ``$CTXWARDEN_CONFIG``, else
``~/.config/ctxwarden/config.toml`` if it exists)::

    db = "/var/lib/ctxwarden/memory.db"
    default_model = "qwen2.5-7b-instruct"
    exact_ttl_seconds = 3600
    near_window_seconds = 3600
    exact_scope = "session"
    semantic_dedupe = true          # fold near-identical embeddings after each embed batch
    semantic_threshold = 0.98      # default: the line measured for the store's vectors

    [budget]
    preset = "chat"
    reserve_share = 8

    [[models]]
    name = "my-finetune"
    tokenizer = "qwen"
    window = 32768
    chat_format = "chatml"
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationError
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from ctxwarden.budget import policy_from_mapping
from ctxwarden.compact import CompactionPolicy
from ctxwarden.dedupe import DedupeConfig
from ctxwarden.engine import DEFAULT_DEDUPE, EngineConfig
from ctxwarden.engine_config import STORE_TIMEOUT_SECONDS
from ctxwarden.errors import ConfigError
from ctxwarden.models import ModelSpec
from ctxwarden.provenance import Verifier
from ctxwarden.retrieve import MAX_QUERY_CHARS, RetrievalWeights
from ctxwarden.semantic import SemanticConfig

__all__ = [
    "SERVER_COMPACT_EVERY",
    "SERVER_STORE_TIMEOUT",
    "Settings",
    "default_config_path",
    "default_db_path",
    "load_settings",
]

#: The servers' wait for the store's write lock unless ``store_timeout`` is set (seconds): a
#: request gives up (503 with ``Retry-After``) well before a client's own timeout.
SERVER_STORE_TIMEOUT = 5.0

#: How often the servers compact unless ``compact_every`` is set (seconds): 6 hours. Compaction
#: takes memories at least 14 days old, so a run every 6 hours lags that age by under 2 %, while
#: a run with nothing to do costs one read of the candidates, four times a day.
SERVER_COMPACT_EVERY = 6 * 3600.0

_SEMANTIC = SemanticConfig()
_RETRIEVAL = RetrievalWeights()


def default_db_path(environ: Mapping[str, str] | None = None) -> Path:
    """``$XDG_DATA_HOME/ctxwarden/ctxwarden.db`` (``~/.local/share/...`` by default)."""
    env = os.environ if environ is None else environ
    base = env.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "ctxwarden" / "ctxwarden.db"


def default_config_path(environ: Mapping[str, str] | None = None) -> Path:
    """``$XDG_CONFIG_HOME/ctxwarden/config.toml`` (``~/.config/...`` by default)."""
    env = os.environ if environ is None else environ
    base = env.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "ctxwarden" / "config.toml"


class _FileSource(PydanticBaseSettingsSource):
    def __init__(self, settings_cls: type[BaseSettings], data: Mapping[str, Any]) -> None:
        super().__init__(settings_cls)
        self._data = dict(data)

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return self._data.get(field_name), field_name, False

    def __call__(self) -> dict[str, Any]:
        return dict(self._data)


class Settings(BaseSettings):
    """Every setting of the CLI and the servers."""

    model_config = SettingsConfigDict(env_prefix="CTXWARDEN_", extra="forbid")

    #: The store: a SQLite file path (default ``$XDG_DATA_HOME/ctxwarden/ctxwarden.db``, i.e.
    #: ``~/.local/share/ctxwarden/ctxwarden.db``), ``:memory:``, or a ``postgresql://`` URL.
    db: str = Field(default_factory=lambda: str(default_db_path()))
    #: The model assemble fits for when a call names none (its window and tokenizer).
    default_model: str = "gpt-4o"
    #: Tokenizers whose counts are cached at ingest (default: the default model's).
    tokenizers: list[str] = Field(default_factory=list)
    #: How far back layer A (exact de-dup) looks for the same message, in seconds.
    exact_ttl_seconds: float = DEFAULT_DEDUPE.exact_ttl_seconds
    #: How far back layer B (near de-dup) looks, in seconds.
    near_window_seconds: float = DEFAULT_DEDUPE.near_window_seconds
    #: Where layer A looks for an earlier copy: the record's channel, else its session.
    exact_scope: Literal["channel_or_session", "channel", "session"] = DEFAULT_DEDUPE.exact_scope
    #: The tenant of the CLI's commands and of requests without an API key (``--no-auth``).
    tenant: str = "default"
    #: The budget policy: ``{preset = "chat", reserve_share = 5, blocks = [...]}`` (see budgets).
    budget: dict[str, Any] = Field(default_factory=dict)
    #: Extra models: ``[{name, tokenizer, window, chat_format, max_output}]``.
    models: list[dict[str, Any]] = Field(default_factory=list)
    #: The proxy's upstream (an OpenAI-compatible API root, e.g. http://127.0.0.1:8080/v1) and
    #: its key; requests can never change either.
    upstream: str | None = None
    #: The upstream's API key (``CTXWARDEN_UPSTREAM_API_KEY``); never sent anywhere else.
    upstream_api_key: str | None = Field(default=None, repr=False)
    #: The proxy's Anthropic Messages upstream (``/v1/messages``; e.g.
    #: https://api.anthropic.com/v1) and its key, sent as ``x-api-key``; whether to ask its
    #: ``/messages/count_tokens`` to size conversations near the window.
    anthropic_upstream: str | None = None
    anthropic_api_key: str | None = Field(default=None, repr=False)
    anthropic_count_tokens: bool = True
    #: Tool-name patterns the proxy holds for approval (``delete_*``, ``post_*``).
    destructive_tools: list[str] = Field(default_factory=list)
    #: The proxy stores tool results over this many tokens as memories and sends a preview
    #: naming the id (``expand`` brings them back); unset: off (conversations go as sent).
    offload_tokens: int | None = Field(default=None, ge=1)
    #: What ``ctxwarden compact`` does with the originals: ``delete``, or ``archive`` (kept
    #: compressed for ``archive_days``, returned by ``expand``).
    keep_originals: Literal["delete", "archive"] = "delete"
    #: Days archived originals are kept (``keep_originals = "archive"``).
    archive_days: float = Field(default=30.0, gt=0)
    #: Per-tenant keys that sign tool results (:mod:`ctxwarden.provenance`), at least 16
    #: characters each; kept out of ``repr`` and logs.
    tool_keys: dict[str, str] = Field(default_factory=dict, repr=False)
    #: How old a tool-result signature may be (seconds).
    tool_signature_max_age: float = 300.0
    #: When memories are embedded: ``background`` (default: a worker thread after ingest),
    #: ``sync`` or ``off`` (only by ``ctxwarden embed``; retrieval by words alone).
    embed: str = "background"
    #: Memories still pending that ``assemble`` embeds before retrieving (0: never waits).
    assemble_embed_limit: int = 32
    #: The longest ``assemble`` spends on that, in seconds (0: never waits); see
    #: :attr:`EngineConfig.assemble_embed_seconds`.
    assemble_embed_seconds: float = Field(default=0.25, ge=0, allow_inf_nan=False)
    #: The embedder: ``minilm`` (``minilm-l6-int8@2``, or ``@1`` on a store made with it),
    #: ``minilm-l6-int8@1`` or ``@2``, ``minilm-static`` or ``openai:<model>``.
    embedder: str = "minilm"
    #: Layer C of de-dup after each embedding batch (:class:`~ctxwarden.semantic.SemanticConfig`).
    semantic_dedupe: bool = _SEMANTIC.enabled
    #: The least cosine similarity at which layer C folds two memories (unset: the line
    #: measured for the store's vector model, 0.98 for MiniLM's int8 path, 0.985 otherwise).
    semantic_threshold: float | None = _SEMANTIC.threshold
    #: How long after an aggregate was last seen layer C may still fold into it, in seconds.
    semantic_window_seconds: float = _SEMANTIC.window_seconds
    #: How assemble writes the inclusion log (``sync`` or ``deferred``, see
    #: :attr:`EngineConfig.inclusion_log`); unset: ``deferred`` in the servers, ``sync`` in
    #: one-shot commands.
    inclusion_log: Literal["sync", "deferred"] | None = None
    #: How long a request waits for the store's write lock before it fails (HTTP 503 with
    #: ``Retry-After``), in seconds; unset: :data:`SERVER_STORE_TIMEOUT` in the servers, 30 in
    #: one-shot commands (see :attr:`EngineConfig.store_timeout`).
    store_timeout: float | None = Field(default=None, gt=0)
    #: The longest query assemble and search take, in characters (longer: 422 naming
    #: ``query``); see :attr:`EngineConfig.max_query_chars`.
    max_query_chars: int = Field(default=MAX_QUERY_CHARS, ge=1)
    #: Only the query's first this many characters drive retrieval
    #: (:attr:`RetrievalWeights.query_chars`).
    retrieval_query_chars: int = Field(default=_RETRIEVAL.query_chars, ge=1)

    #: How often the servers compact in the background, a duration (``6h``, ``90m``) or
    #: ``off``; unset: every 6 hours in ``serve``, ``proxy`` and ``mcp``
    #: (:data:`SERVER_COMPACT_EVERY`), never in one-shot commands (:mod:`ctxwarden.scheduler`).
    compact_every: str | None = None
    #: What compaction takes: memories older than this duration (and rarely used). The
    #: ``compact_*`` settings, ``keep_originals`` and ``archive_days`` are the policy of
    #: scheduled runs, of ``ctxwarden compact`` and of the HTTP compact endpoints; a CLI flag
    #: or a request field overrides one for that call (:meth:`compaction_policy`).
    compact_older_than: str = "14d"
    #: The most of its cluster's tokens a summary may keep; a cluster whose facts need more
    #: is packed or left alone.
    compact_max_summary_share: float = Field(default=CompactionPolicy.max_summary_share, gt=0, lt=1)
    #: Whether a cluster whose facts need more is kept whole in one summary (a lossless pack,
    #: :mod:`ctxwarden.pack`) when that saves ``compact_min_pack_saving`` of its store bytes.
    compact_lossless_packs: bool = CompactionPolicy.lossless_packs
    compact_min_pack_saving: float = Field(default=CompactionPolicy.min_pack_saving, gt=0, lt=1)
    #: Window summaries of sessions near their recent block (90 %): ``off``, ``sync`` (in
    #: ingest) or ``background`` (a thread; ingest and assemble never wait on a summariser);
    #: unset: ``background`` in the servers, ``off`` in one-shot commands.
    window_summaries: Literal["off", "sync", "background"] | None = None
    #: The summariser of ``ctxwarden compact``: ``extractive`` (offline) or ``llm`` (a model
    #: behind an OpenAI-compatible endpoint, ``summarizer_url``; see
    #: :mod:`ctxwarden.summarize_llm`).
    summarizer: Literal["extractive", "llm"] = "extractive"
    #: The LLM summariser's endpoint (an API root such as http://127.0.0.1:8080/v1) and model.
    summarizer_url: str | None = None
    summarizer_model: str | None = None
    #: Its API key (``CTXWARDEN_SUMMARIZER_API_KEY``), sent as ``Authorization: Bearer`` to
    #: ``summarizer_url`` only; kept out of ``repr``, logs and error messages.
    summarizer_api_key: str | None = Field(default=None, repr=False)
    #: How long one summary request may take before the cluster falls back to the extractive
    #: summary, in seconds.
    summarizer_timeout: float = Field(default=60.0, gt=0)
    #: How many times a rejected reply is asked again (and a failed connection or 5xx retried).
    summarizer_retries: int = Field(default=2, ge=0, le=10)
    #: The structured-output request field: ``auto`` (the first the server takes),
    #: ``json_schema``, ``json_object_schema``, ``json_object`` or ``off``.
    summarizer_structured_output: Literal[
        "auto", "json_schema", "json_object_schema", "json_object", "off"
    ] = "auto"

    _file_data: dict[str, Any] = {}

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings, env_settings, _FileSource(settings_cls, cls._file_data))

    def engine_config(
        self,
        *,
        inclusion_log: str = "sync",
        store_timeout: float = STORE_TIMEOUT_SECONDS,
        compact_every: float | None = None,
        window_summaries: str = "off",
    ) -> EngineConfig:
        """The engine's typed configuration; :class:`ConfigError` names a bad field.
        ``inclusion_log``, ``store_timeout``, ``compact_every`` (seconds, None for off) and
        ``window_summaries`` are the caller's defaults when the settings are unset."""
        models = tuple(ModelSpec.from_mapping(m) for m in self.models)
        if self.compact_every is not None:
            every = self.compact_every.strip().lower()
            compact_every = None if every == "off" else _duration(every, "compact_every")
            if compact_every == 0:
                raise ConfigError("compact_every: 0 is no interval; write e.g. 6h, or off")
        windows = self.window_summaries or window_summaries
        return EngineConfig(
            default_model=self.default_model,
            tokenizers=tuple(self.tokenizers),
            policy=policy_from_mapping(self.budget) if self.budget else EngineConfig().policy,
            dedupe=DedupeConfig(
                exact_ttl_seconds=self.exact_ttl_seconds,
                near_window_seconds=self.near_window_seconds,
                exact_scope=self.exact_scope,
            ),
            tenant=self.tenant,
            models=models,
            verifier=(
                Verifier(
                    dict(self.tool_keys),
                    max_age_seconds=self.tool_signature_max_age,
                )
                if self.tool_keys
                else None
            ),
            embed=self.embed,
            embedder=self.embedder,
            assemble_embed_limit=self.assemble_embed_limit,
            assemble_embed_seconds=self.assemble_embed_seconds,
            semantic=SemanticConfig(
                enabled=self.semantic_dedupe,
                threshold=self.semantic_threshold,
                window_seconds=self.semantic_window_seconds,
            ),
            inclusion_log=self.inclusion_log or inclusion_log,
            store_timeout=self.store_timeout or store_timeout,
            max_query_chars=self.max_query_chars,
            retrieval=RetrievalWeights(query_chars=self.retrieval_query_chars),
            compact_every=compact_every,
            compact_policy=self.compaction_policy(),
            auto_summarize=windows != "off",
            window_summaries="sync" if windows == "off" else windows,
        )

    def compaction_policy(self, **overrides: Any) -> CompactionPolicy:
        """The compaction policy these settings configure, with ``overrides`` (a CLI flag's or
        a request's fields; ``None`` values are ignored) in place of the settings."""
        policy = CompactionPolicy(
            older_than=_duration(self.compact_older_than, "compact_older_than"),
            max_summary_share=self.compact_max_summary_share,
            keep_originals=self.keep_originals,
            archive_days=self.archive_days,
            lossless_packs=self.compact_lossless_packs,
            min_pack_saving=self.compact_min_pack_saving,
        )
        given = {name: value for name, value in overrides.items() if value is not None}
        return dataclasses.replace(policy, **given) if given else policy


def _duration(text: str, name: str) -> float:
    """Seconds in ``"14d"``, ``"6h"``, ``"90m"``, ``"30s"`` or a bare number of seconds."""
    units = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
    raw = text.strip().lower()
    scale = units.get(raw[-1:])
    try:
        value = float(raw[:-1] if scale is not None else raw) * (scale or 1.0)
    except ValueError:
        raise ConfigError(
            f"{name}: {text!r} is not a duration: write e.g. 6h, 14d or 90m"
        ) from None
    if not value >= 0:
        raise ConfigError(f"{name}: {text!r} must be zero or more")
    return value


def load_settings(config: str | Path | None = None, **flags: Any) -> Settings:
    """Settings from flags (``None`` values ignored), environment, and the config file."""
    path = Path(config) if config else None
    if path is None and os.environ.get("CTXWARDEN_CONFIG"):
        path = Path(os.environ["CTXWARDEN_CONFIG"])
    if path is None and default_config_path().is_file():
        path = default_config_path()
    data: dict[str, Any] = {}
    if path is not None:
        try:
            data = tomllib.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ConfigError(f"config: {path} does not exist") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"config: {path} is not valid TOML: {exc}") from None
    Settings._file_data = data
    try:
        return Settings(**{k: v for k, v in flags.items() if v is not None})
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise ConfigError(f"config.{where}: {first['msg']}") from None
    finally:
        Settings._file_data = {}
