"""The ``ctxwarden`` command: a thin face over :class:`~ctxwarden.engine.Engine`.

Errors print one line and exit non-zero (a traceback only with ``--debug``).
"""

from __future__ import annotations

import contextlib
import enum
import json
import sys
import tempfile
from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from ctxwarden.cli_context import _engine, _settings, _state, _summarizer
from ctxwarden.cli_serve import keys_app, mcp, proxy, serve
from ctxwarden.engine import Engine
from ctxwarden.errors import CtxwardenError, EmbedError, InputError, MissingExtraError
from ctxwarden.extras import extra_for
from ctxwarden.terminal import (
    check_records,
    count_pending,
    echo_json,
    parse_duration,
    progress_bar,
    read_lines,
    read_text,
    show_context,
)
from ctxwarden.types import Scope

if TYPE_CHECKING:
    from ctxwarden.compact import ClusterSummary, CompactionPolicy
    from ctxwarden.config import Settings
    from ctxwarden.summary import Summarizer

__all__ = ["app", "main", "parse_duration", "show_context"]

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="ctxwarden: token-exact context and memory for long-lived LLM agents.",
)


def _print_version(value: bool) -> None:
    if value:
        from ctxwarden import __version__

        typer.echo(f"ctxwarden {__version__}")
        raise typer.Exit()


@app.callback()
def _options(
    db: Annotated[
        str | None,
        typer.Option(
            "--db", help="Database path (default: ~/.local/share/ctxwarden/ctxwarden.db)."
        ),
    ] = None,
    config: Annotated[Path | None, typer.Option("--config", help="TOML config file.")] = None,
    model: Annotated[str | None, typer.Option("--default-model", help="Default model.")] = None,
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks.")] = False,
    version: Annotated[
        bool,
        typer.Option(
            "--version", is_eager=True, callback=_print_version, help="Print the version and exit."
        ),
    ] = False,
) -> None:
    _state["flags"] = {"db": db, "default_model": model}
    _state["config"] = config
    _state["debug"] = debug


class ScopeOption(enum.StrEnum):
    """The read scopes (:mod:`ctxwarden.scope`), as a CLI choice."""

    session = "session"
    user = "user"
    tenant = "tenant"


def _scope(option: ScopeOption | None) -> Scope | None:
    return None if option is None else option.value


@app.command()
def ingest(
    file: Annotated[str, typer.Argument(help="JSONL records or a JSON message list; - for stdin.")],
    session: Annotated[str | None, typer.Option(help="Session for records without one.")] = None,
    tenant: Annotated[str | None, typer.Option(help="Tenant for records without one.")] = None,
    report: Annotated[
        Path | None, typer.Option("--report", help="Write one outcome per record (JSONL).")
    ] = None,
    user: Annotated[str | None, typer.Option(help="End user of records without one.")] = None,
    skip_bad_lines: Annotated[
        bool,
        typer.Option("--skip-bad-lines", help="Skip invalid lines (listed) and ingest the rest."),
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the counts as JSON.")] = False,
    batch: Annotated[int, typer.Option(help="Records written per transaction.")] = 10_000,
    embed_after: Annotated[
        bool,
        typer.Option(
            "--embed/--no-embed",
            help="Embed what was stored, with a progress bar (default unless embed = off).",
        ),
    ] = True,
) -> None:
    """Ingest records. Every line is checked before anything is written: a bad line stops the
    file naming its line and field, or with --skip-bad-lines is skipped and reported. Then the
    new memories are embedded in batches (resumable: `ctxwarden embed` finishes an interrupted
    run), so retrieval searches them by meaning."""
    if batch < 1:
        raise InputError(f"{batch} must be at least 1", field="batch")
    defaults = {k: v for k, v in (("session", session), ("tenant", tenant), ("user", user)) if v}
    good, bad = check_records(read_lines(read_text(file)), defaults, skip_bad=skip_bad_lines)
    counts = {"stored": 0, "edited": 0, "duplicate": 0, "near_duplicate": 0, "known": 0}
    outcomes: list[dict[str, Any]] = []
    settings = _settings()
    embed_after = embed_after and settings.embed != "off"
    # Ingest leaves the embedding to the batch pass below, with its own progress bar, instead
    # of a worker thread that the command's exit would stop half-way.
    with (
        _engine(settings.model_copy(update={"embed": "off"})) as engine,
        progress_bar("ingesting", "records") as progress,
    ):
        task = progress.add_task("ingest", total=len(good))
        for start in range(0, len(good), batch):
            chunk = good[start : start + batch]
            result = engine.ingest(
                [item.data for item in chunk], session=session, tenant=tenant, user=user
            )
            for key, value in result.counts.items():
                counts[key] = counts.get(key, 0) + value
            if report is not None:
                outcomes.extend(o.to_dict() for o in result.outcomes)
            progress.advance(task, len(chunk))
    embedded = _embed_stored(settings) if embed_after and counts["stored"] + counts["edited"] else 0
    if report is not None:
        with report.open("w", encoding="utf-8") as out:
            for outcome in outcomes:
                out.write(json.dumps(outcome) + "\n")
    skipped = [b.to_dict() for b in bad]
    if as_json:
        echo_json({"records": len(good), **counts, "embedded": embedded, "skipped": skipped})
        return
    typer.echo(
        f"{len(good)} records: {counts['stored']} stored, {counts['edited']} edited, "
        f"{counts['duplicate']} duplicates, "
        f"{counts['near_duplicate']} near-duplicates, {counts['known']} already known"
        + (f"; {len(bad)} bad lines skipped" if bad else "")
        + (f"; {embedded} embedded" if embedded else "")
    )
    for line in bad[:20]:
        where = f"line {line.line}" + (f", field '{line.field}'" if line.field else "")
        typer.echo(f"  skipped {where}: {line.error}", err=True)
    if len(bad) > 20:
        typer.echo(f"  ... and {len(bad) - 20} more (--json lists them all)", err=True)


@app.command()
def assemble(
    session: Annotated[str, typer.Option(help="Session to assemble for.")],
    query: Annotated[str | None, typer.Option(help="The current turn (drives retrieval).")] = None,
    model: Annotated[
        str | None, typer.Option(help="Model name (any; the registry gives window and tokenizer).")
    ] = None,
    budget: Annotated[int | None, typer.Option(help="Cap on the prompt's tokens.")] = None,
    system: Annotated[str | None, typer.Option(help="System prompt.")] = None,
    tenant: Annotated[str | None, typer.Option(help="Tenant.")] = None,
    tokenizer: Annotated[
        str | None,
        typer.Option(help="Tokenizer to count with: o200k_base, qwen, gguf:/path/model.gguf, ..."),
    ] = None,
    window: Annotated[
        int | None, typer.Option(help="The model's context window in tokens (as served).")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the context as JSON.")] = False,
    user: Annotated[str | None, typer.Option(help="End user whose session this is.")] = None,
    scope: Annotated[
        ScopeOption | None,
        typer.Option(help="What related memory may come from (default: the session)."),
    ] = None,
) -> None:
    """Assemble a context and print it (messages and the report)."""
    with _engine() as engine:
        context = engine.assemble(
            session=session,
            query=query,
            model=model,
            budget=budget,
            system=system,
            tenant=tenant,
            tokenizer=tokenizer,
            window=window,
            user=user,
            scope=_scope(scope),
        )
    if as_json:
        typer.echo(json.dumps(context.to_dict(), ensure_ascii=False, indent=2))
    else:
        show_context(Console(), context)


def _embed_stored(settings: Settings) -> int:
    """Embed what has no vector yet, with a progress bar; how many. A store holding another
    model's vectors is left as it is, with one line saying how to re-embed it."""
    with _engine(settings.model_copy(update={"embed": "off"})) as engine:
        total = count_pending(engine.store, engine.embedder.name)
        if not total:
            return 0
        with progress_bar("embedding", "memories") as progress:
            task = progress.add_task("embed", total=total)
            try:
                return engine.embed_pending(progress=lambda n: progress.update(task, completed=n))
            except EmbedError as exc:
                typer.echo(f"not embedded: {exc}", err=True)
                return 0


@app.command()
def embed(
    reembed: Annotated[
        bool,
        typer.Option("--reembed", help="Replace vectors made by another embedding model."),
    ] = False,
    batch_size: Annotated[int, typer.Option(help="Memories embedded per batch.")] = 32,
    embedder: Annotated[
        str | None, typer.Option(help="Embedder (minilm, minilm-static, openai:<model>).")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the count as JSON.")] = False,
) -> None:
    """Embed the store's memories that have no vector yet (resumable), with a progress bar."""
    settings = _settings()
    if embedder is not None:
        settings = settings.model_copy(update={"embedder": embedder})
    with _engine(settings) as engine:
        model = engine.embedder.name
        total = count_pending(engine.store, model)
        with progress_bar("embedding", "memories") as progress:
            task = progress.add_task("embed", total=total)
            done = engine.embed_pending(
                batch_size, reembed=reembed, progress=lambda n: progress.update(task, completed=n)
            )
    if as_json:
        echo_json({"embedded": done, "model": model})
    else:
        typer.echo(f"{done} memories embedded with {model}")


@app.command()
def dedupe(
    semantic: Annotated[
        bool,
        typer.Option("--semantic", help="Fold near-identical embeddings (layer C)."),
    ] = False,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Show what would be folded (writes nothing).")
    ] = False,
    threshold: Annotated[
        float | None,
        typer.Option(
            help="Least cosine (default: the config's, else the line of the store's vectors)."
        ),
    ] = None,
    window: Annotated[
        str | None, typer.Option(help="Window after the aggregate was last seen, e.g. 1h, 7d.")
    ] = None,
    tenant: Annotated[str | None, typer.Option(help="Tenant.")] = None,
    show: Annotated[int, typer.Option(help="Top folded families to print.")] = 10,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
) -> None:
    """Run a de-dup layer over an existing store (embed it first: `ctxwarden embed`)."""
    import dataclasses

    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    from ctxwarden.semantic import families, for_model

    if not semantic:
        raise InputError(
            "layers A and B run at ingest: pass --semantic for layer C", field="semantic"
        )
    settings = _settings()
    with _engine(settings) as engine:
        config = engine.config.semantic
        if threshold is not None:
            config = dataclasses.replace(config, threshold=threshold)
        if window is not None:
            config = dataclasses.replace(config, window_seconds=parse_duration(window))
        config = for_model(config, engine.embedder.name)  # the line of the store's vectors
        with Progress(
            SpinnerColumn(),
            TextColumn("semantic de-dup"),
            TextColumn("{task.completed} memories looked at"),
            TimeElapsedColumn(),
            console=Console(stderr=True),
        ) as progress:
            task = progress.add_task("dedupe", total=None)
            report = engine.dedupe_semantic(
                tenant=tenant,
                config=config,
                dry_run=dry_run,
                progress=lambda n: progress.update(task, completed=n),
            )
    if as_json:
        echo_json(
            {
                "examined": report.examined,
                "folds": len(report.folds),
                "refused": report.refused,
                "dry_run": dry_run,
                "threshold": config.threshold,
                "families": [
                    {"folded": count, "into": id_, "content": content}
                    for id_, count, content in families(report.folds, show)
                ],
            }
        )
        return
    verb = "would fold" if dry_run else "folded"
    typer.echo(
        f"{report.examined} memories looked at, {verb} {len(report.folds)}, "
        f"{report.refused} candidates above {config.threshold} refused by the fact guard"
    )
    if report.folds and show > 0:
        table = Table(title="top folded families")
        for column in ("folded", "into", "content"):
            table.add_column(column)
        for id_, count, content in families(report.folds, show):
            table.add_row(str(count), id_, content[:100])
        Console().print(table)


@app.command()
def search(
    query: Annotated[str, typer.Argument(help="Words to look for.")],
    session: Annotated[str | None, typer.Option(help="Search this session.")] = None,
    user: Annotated[str | None, typer.Option(help="Search this end user's memories.")] = None,
    scope: Annotated[
        ScopeOption | None,
        typer.Option(help="Wider than named: user or tenant (default: the narrowest named)."),
    ] = None,
    limit: Annotated[int, typer.Option(help="Most hits to print.")] = 20,
    tenant: Annotated[str | None, typer.Option(help="Tenant.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON lines.")] = False,
) -> None:
    """Full-text search of the memories of a session, an end user, or the tenant."""
    with _engine() as engine:
        hits = engine.search(
            query,
            tenant=tenant,
            limit=limit,
            session=session,
            user=user,
            scope=_scope(scope),
        )
    for memory, score in hits:
        if as_json:
            typer.echo(json.dumps({"memory": memory.to_dict(), "score": score}, ensure_ascii=False))
        else:
            typer.echo(f"{score:8.3f}  {memory.id}  {memory.content[:120]}")


@app.command()
def stats(
    tenant: Annotated[str | None, typer.Option(help="Tenant.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    session: Annotated[str | None, typer.Option(help="Count this session only.")] = None,
    user: Annotated[str | None, typer.Option(help="Count this end user only.")] = None,
    scope: Annotated[ScopeOption | None, typer.Option(help="session, user or tenant.")] = None,
) -> None:
    """Per channel: records seen, memories stored, duplicates folded; top spam families."""
    with _engine() as engine:
        data = engine.stats(
            tenant=tenant,
            session=session,
            user=user,
            scope=_scope(scope),
        )
    if as_json:
        typer.echo(json.dumps(data, ensure_ascii=False, indent=2))
        return
    console = Console()
    table = Table(
        title=f"ctxwarden store: {data['memories']} memories, {data['contexts']} contexts"
    )
    for column in ("channel", "seen", "stored", "folded", "exact", "near", "semantic"):
        table.add_column(column, justify="left" if column == "channel" else "right")
    for channel, row in data["channels"].items():
        table.add_row(
            channel or "-",
            str(row["seen"]),
            str(row["memories"]),
            str(row["folded"]),
            str(row["exact"]),
            str(row["near"]),
            str(row["semantic"]),
        )
    table.add_row(
        "all",
        str(data["seen"]),
        str(data["memories"]),
        str(data["folded"]),
        str(data["exact"]),
        str(data["near"]),
        str(data["semantic"]),
        style="bold",
    )
    console.print(table)
    if data["top_families"]:
        top = Table(title="top spam families")
        for column in ("count", "channel", "author", "content", "latest"):
            top.add_column(column)
        for fam in data["top_families"]:
            top.add_row(
                str(fam["count"]),
                fam["channel"] or "-",
                fam["author"] or "-",
                fam["content"],
                fam["latest"] or "",
            )
        console.print(top)


@app.command()
def scrub(
    full: Annotated[
        bool,
        typer.Option(
            "--full",
            help="PostgreSQL: VACUUM FULL, rewriting every table without deleted rows "
            "(locks each table while it runs: a maintenance window).",
        ),
    ] = False,
) -> None:
    """Remove deleted memories' text from the store's files: SQLite drops their terms from the
    full-text index and truncates the WAL, then VACUUMs; PostgreSQL VACUUMs (with --full, the
    tables are rewritten and the deleted rows' bytes leave the data files)."""
    with _engine() as engine:
        engine.store.scrub()
        engine.store.vacuum(full=full)
    typer.echo("scrubbed" + (" (VACUUM FULL)" if full else ""))


def _print_previews(console: Console, previews: Sequence[ClusterSummary]) -> None:
    """Each cluster's summary text and the sentences it drops (the first ten)."""
    from rich.markup import escape

    for p in previews:
        console.rule(escape(f"{p.summary_id}: {p.facts} facts"))
        if p.text is None:
            console.print(escape(f"left alone: {p.reason}"))
            for id_, sentence in p.lost[:10]:
                console.print(escape(f"  would lose [{id_}] {sentence}"))
            continue
        if p.fallback:
            console.print(escape(f"extractive summary instead: {p.fallback}"))
        if p.lossless:
            console.print(escape(p.reason))
        console.print(escape(p.text), highlight=False)
        if p.dropped:
            console.print(f"drops {len(p.dropped)} sentence(s):")
            for id_, sentence in p.dropped[:10]:
                console.print(escape(f"  [{id_}] {sentence}"), highlight=False)
            if len(p.dropped) > 10:
                console.print(f"  ... and {len(p.dropped) - 10} more (--json lists all)")


@app.command()
def compact(
    plan_only: Annotated[
        bool,
        typer.Option(
            "--plan",
            help="Show what would be compacted, each summary's text and what it drops "
            "(writes nothing).",
        ),
    ] = False,
    apply_it: Annotated[bool, typer.Option("--apply", help="Compact now.")] = False,
    older_than: Annotated[
        str | None,
        typer.Option(
            "--older-than",
            help="Only memories older than this (14d, 36h; default: the compact_older_than "
            "setting, 14d).",
        ),
    ] = None,
    keep_originals: Annotated[
        str | None,
        typer.Option(
            "--keep-originals",
            help="delete (default): the originals go; archive: kept compressed for "
            "--archive-days (ctxwarden expand and the API's /sources return them).",
        ),
    ] = None,
    archive_days: Annotated[
        float | None,
        typer.Option("--archive-days", help="Days archived originals are kept (default 30)."),
    ] = None,
    lossless_packs: Annotated[
        bool | None,
        typer.Option(
            "--lossless-packs/--no-lossless-packs",
            help="A cluster whose facts cannot be summarised smaller is kept whole in one "
            "summary when that saves compact_min_pack_saving (30 %) of its store bytes, or "
            "left alone (default: the compact_lossless_packs setting, on).",
            show_default=False,
        ),
    ] = None,
    summarizer: Annotated[
        str | None,
        typer.Option(help="extractive (offline) or llm (default: the summarizer setting)."),
    ] = None,
    llm_url: Annotated[
        str | None,
        typer.Option(
            "--llm-url",
            help="OpenAI-compatible base URL for llm (default: the summarizer_url setting).",
        ),
    ] = None,
    llm_model: Annotated[
        str | None, typer.Option("--llm-model", help="Model name for llm (summarizer_model).")
    ] = None,
    tenant: Annotated[str | None, typer.Option(help="Tenant.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the plan/result as JSON.")] = False,
    every: Annotated[
        str | None,
        typer.Option(
            "--every",
            help="Compact now and then every this long (6h), every tenant, until stopped "
            "(Ctrl-C or SIGTERM); skips a run while another compactor holds the store's lease.",
        ),
    ] = None,
) -> None:
    """Compact old, rarely used memories into summaries, leaving tombstones (plan or apply)."""

    if every is not None:
        apply_it = not plan_only  # --every applies
    if plan_only == apply_it:
        raise InputError("pass exactly one of --plan or --apply (or --every)", field="compact")
    settings = _settings()
    # The settings' policy with the flags given in place (keep_originals is checked by the
    # policy: a ConfigError naming compact.keep_originals).
    policy = settings.compaction_policy(
        older_than=None if older_than is None else parse_duration(older_than),
        keep_originals=keep_originals,
        archive_days=archive_days,
        lossless_packs=lossless_packs,
    )
    chosen: Summarizer = _summarizer(settings, kind=summarizer, url=llm_url, model=llm_model)
    console = Console(stderr=as_json)
    if every is not None:
        _compact_every(parse_duration(every), policy, chosen, tenant=tenant, as_json=as_json)
        return
    client = getattr(chosen, "client", None)  # the LLM summariser's connection pool
    with _engine(settings) as engine, client or contextlib.nullcontext():
        plan = engine.compact_plan(policy=policy, tenant=tenant)
        if plan_only:
            previews = engine.compact_preview(plan, summarizer=chosen)
            if as_json:
                data = plan.to_dict()
                data["summaries"] = [p.to_dict() for p in previews]
                typer.echo(json.dumps(data, indent=2, ensure_ascii=False))
                return
            table = Table(
                title=f"compaction plan: {plan.memories} memories in {len(plan.clusters)} "
                f"clusters, {plan.tokens} tokens, about {plan.tokens_saved} saved "
                f"({plan.tokenizer})"
            )
            for column in (
                "summary",
                "session",
                "channel",
                "from",
                "to",
                "size",
                "tokens",
                "saved",
            ):
                table.add_column(
                    column, justify="right" if column in {"size", "tokens", "saved"} else "left"
                )
            from ctxwarden.types import format_time

            for c in plan.clusters:
                table.add_row(
                    c.summary_id, c.session, c.channel or "-", format_time(c.time_range[0]),
                    format_time(c.time_range[1]), str(c.size), str(c.tokens), str(c.tokens_saved),
                )  # fmt: skip
            console.print(table)
            _print_previews(console, previews)
            skipped = ", ".join(f"{k} {v}" for k, v in plan.skipped.items() if v)
            console.print(f"considered {plan.considered}; left alone: {skipped or 'none'}")
            return
        with (
            engine.compactor.lease(),  # never beside a scheduled run (ConflictError names it)
            progress_bar("compacting", "clusters", console=Console(stderr=True)) as progress,
        ):
            task = progress.add_task("clusters", total=len(plan.clusters))
            result = engine.compact(
                plan, summarizer=chosen, progress=lambda _c, _o: progress.advance(task)
            )
    if as_json:
        data = {
            "summaries": list(result.summaries),
            "compacted": result.compacted,
            "already_done": result.already_done,
            "stale": result.stale,
            "left_alone": result.left_alone,
            "tokens_saved": result.tokens_saved,
            "archived": result.archived,
            "purged": result.purged,
            "fallbacks": [list(pair) for pair in result.fallbacks],
        }
        typer.echo(json.dumps(data))
    else:
        console.print(
            f"{result.compacted} memories compacted into {len(result.summaries)} summaries, "
            f"{result.tokens_saved} tokens saved ({plan.tokenizer})"
            + (f"; {result.stale} stale cluster(s) skipped (run again)" if result.stale else "")
            + (
                f"; {result.left_alone} cluster(s) left alone (a summary would lose a fact)"
                if result.left_alone
                else ""
            )
            + (f"; {result.archived} archived" if result.archived else "")
            + (f"; {result.purged} expired archived originals deleted" if result.purged else "")
        )
        from rich.markup import escape

        for summary_id, reason in result.fallbacks:
            console.print(escape(f"{summary_id}: extractive summary instead: {reason}"))


def _compact_every(
    every: float,
    policy: CompactionPolicy,
    summarizer: Summarizer,
    *,
    tenant: str | None,
    as_json: bool,
) -> None:
    """``compact --every``: the engine's compactor in the foreground, one line per run, until
    SIGINT or SIGTERM; then the run in progress ends between clusters and the command exits 0."""
    import signal
    import threading

    from ctxwarden.scheduler import CompactorRun

    if not every > 0:
        raise InputError(f"{every:g}: compact every how long? write e.g. 6h", field="every")
    stopping = threading.Event()

    def report(run: CompactorRun) -> None:
        if as_json:
            fields = ("outcome", "at", "holder", "clusters", "compacted", "tokens_saved", "error")
            echo_json({name: getattr(run, name) for name in fields}, indent=None)
        elif run.outcome == "skipped":
            typer.echo(f"compaction skipped: another compactor holds the lease ({run.holder})")
        else:
            typer.echo(
                f"compaction {run.outcome}: {run.compacted} memories in {run.clusters} clusters, "
                f"about {run.tokens_saved} tokens saved" + (f" ({run.error})" if run.error else "")
            )

    previous = {
        sig: signal.signal(sig, lambda *_: stopping.set())
        for sig in (signal.SIGINT, signal.SIGTERM)
    }
    try:
        with _engine() as engine:
            engine.compactor.start(
                every,
                now=True,
                policy=policy,
                summarizer=summarizer,
                report=report,
                tenants=[tenant] if tenant else None,
            )
            stopping.wait()
            typer.echo("compaction: stopping (the cluster in progress finishes)", err=True)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@app.command()
def expand(
    id: Annotated[str, typer.Argument(help="A summary's id, or an offloaded tool result's.")],
    tenant: Annotated[str | None, typer.Option(help="Tenant.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON lines.")] = False,
) -> None:
    """Print what an id stands for: the originals a summary was made from (archived by
    compact --keep-originals archive) or an offloaded tool result's whole text."""
    with _engine() as engine:
        found = engine.expand(id, tenant=tenant)
    for memory in found:
        if as_json:
            typer.echo(json.dumps(memory.to_dict(), ensure_ascii=False))
        else:
            typer.echo(f"[{memory.id}] {memory.author or memory.role}: {memory.content}")


@app.command()
def demo(
    query: Annotated[
        str, typer.Option(help="Question to assemble for.")
    ] = "When is the standup now, and who owns the release checklist?",
    budget: Annotated[
        int, typer.Option(help="Token budget (the default leaves the related block room).")
    ] = 450,
    model: Annotated[str, typer.Option(help="Model.")] = "gpt-4o",
    as_json: Annotated[
        bool, typer.Option("--json", help="Print counts and context as JSON.")
    ] = False,
) -> None:
    """Ingest a small bundled sample into a temporary store and show an assembled context."""
    from ctxwarden.engine_config import EngineConfig

    sample = resources.files("ctxwarden").joinpath("data/demo.jsonl").read_text(encoding="utf-8")
    records = [json.loads(line) for line in sample.splitlines() if line.strip()]
    console = Console()
    with (
        tempfile.TemporaryDirectory() as folder,
        # the demo shows a changed fact (free-text change detection is on by default)
        Engine.open(Path(folder) / "demo.db", config=EngineConfig()) as engine,
    ):
        result = engine.ingest(records)
        context = engine.assemble(
            session="team",
            query=query,
            model=model,
            budget=budget,
            system="You are the team's assistant. Answer from the conversation.",
        )
    counts = result.counts
    if as_json:
        echo_json({"ingested": len(result), **counts, "context": context.to_dict()})
        return
    console.print(
        f"[bold]ingested[/] {len(result)} records: {counts['stored']} stored, "
        f"{counts['duplicate']} verbatim duplicates folded"
    )
    show_context(console, context)


# The serving commands live in ctxwarden.cli_serve; registered here, after the offline ones.
app.command()(serve)
app.add_typer(keys_app, name="keys")
app.command()(proxy)
app.command()(mcp)


def _usage_line(exc: typer.TyperException) -> str:
    """A usage error in one line: what is wrong and where to look."""
    message = exc.format_message() if hasattr(exc, "format_message") else str(exc)
    message = " ".join(message.split())
    ctx = getattr(exc, "ctx", None)
    command = getattr(ctx, "command_path", None) or "ctxwarden"
    return f"error: {message} (see '{command} --help')"


def main() -> None:
    """Entry point: run the app. A usage error (typer's own vendored click exceptions: a
    mistyped flag, a bad value, a missing option) prints one line and exits 2; a ctxwarden error
    one line and exit code 1 (2 for a missing extra); tracebacks only with --debug."""
    try:
        code = app(standalone_mode=False)
    except ImportError as exc:
        # A server face without its extra: ctxwarden.server raises MissingExtraError, and a
        # command's own `import uvicorn` a plain ModuleNotFoundError that extra_for maps.
        missing = exc if isinstance(exc, MissingExtraError) else None
        extra = extra_for(exc.name)
        if missing is None and extra is not None:
            missing = MissingExtraError(extra, [str(exc.name)])
        if missing is None or _state.get("debug"):
            raise
        typer.echo(f"error: {missing}", err=True)
        sys.exit(2)
    except CtxwardenError as exc:
        if _state.get("debug"):
            raise
        typer.echo(f"error: {exc}", err=True)
        sys.exit(1)
    except (typer.Abort, KeyboardInterrupt):
        typer.echo("aborted", err=True)
        sys.exit(130)
    except typer.TyperException as exc:
        # typer 0.29 raises its vendored copies of click's exceptions (typer._click), which
        # `click.ClickException` does not catch; they carry click's exit codes (2 for usage).
        if _state.get("debug"):
            raise
        typer.echo(_usage_line(exc), err=True)
        sys.exit(getattr(exc, "exit_code", 2))
    if isinstance(code, int) and code != 0:
        sys.exit(code)  # a typer.Exit(code) inside a command


if __name__ == "__main__":
    main()
