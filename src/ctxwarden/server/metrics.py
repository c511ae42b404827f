"""Prometheus metrics of a server: requests, assembly latency, budget use per block, de-dup,
compaction (asked for and scheduled: ``ctxwarden_compactor_*``).

Each app owns its :class:`Metrics` (its own registry, nothing global), exposed at ``/metrics``
in the Prometheus text format. Paths are labelled by route template (``/v1/memories/{memory_id}``),
never by a raw path, so ids do not grow the label set.

>>> metrics = Metrics()
>>> metrics.observe_ingest({"stored": 2, "duplicate": 1})
>>> b'ctxwarden_ingest_records_total{status="duplicate"} 1.0' in metrics.render()
True
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST as CONTENT_TYPE
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from ctxwarden.logwriter import LogCounters
from ctxwarden.scheduler import CompactorStats
from ctxwarden.types import Context

__all__ = ["CONTENT_TYPE", "Metrics"]

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class _LogCollector(Collector):
    """The engine's inclusion-log writer (:meth:`Engine.log_counters`), read at each scrape."""

    def __init__(self, counters: Callable[[], LogCounters]) -> None:
        self._counters = counters

    def collect(self) -> Iterator[Metric]:
        c = self._counters()
        yield GaugeMetricFamily(
            "ctxwarden_inclusion_log_pending", "Inclusion-log entries queued, not written yet.",
            value=c.pending,
        )  # fmt: skip
        entries = CounterMetricFamily(
            "ctxwarden_inclusion_log_entries",
            "Inclusion-log entries by how they ended (written in the background, failed, "
            "written by assemble itself because the queue was full).",
            labels=["outcome"],
        )
        entries.add_metric(["written"], c.written)
        entries.add_metric(["failed"], c.failed)
        entries.add_metric(["synchronous"], c.synchronous)
        yield entries


class _CompactorCollector(Collector):
    """The engine's background compactor (:meth:`Compactor.stats`), read at each scrape."""

    def __init__(self, stats: Callable[[], CompactorStats]) -> None:
        self._stats = stats

    def collect(self) -> Iterator[Metric]:
        s = self._stats()
        for name, text, value in (
            ("runs", "Scheduled compaction runs that ran (or found nothing to do).", s.runs),
            ("skipped", "Compaction runs skipped: another compactor held the lease.", s.skipped),
            ("failures", "Compaction runs that failed (logged; finished clusters stay).",
             s.failures),
            ("clusters", "Clusters compacted by scheduled runs.", s.clusters),
            ("memories", "Memories compacted by scheduled runs.", s.compacted),
            ("tokens_saved", "Tokens saved by scheduled runs (the plans' estimate).",
             s.tokens_saved),
            ("window_summaries", "Window summaries written in the background.",
             s.window_summaries),
            ("window_failures", "Background window-summary checks that failed (logged).",
             s.window_failures),
        ):  # fmt: skip
            yield CounterMetricFamily(f"ctxwarden_compactor_{name}", text, value=value)
        yield GaugeMetricFamily(
            "ctxwarden_compactor_last_run_timestamp_seconds",
            "When the last compaction run that held the lease started (0: none yet).",
            value=s.last_run_at or 0.0,
        )
        yield GaugeMetricFamily(
            "ctxwarden_compactor_window_pending",
            "Sessions queued for a window-summary check.",
            value=s.window_pending,
        )


class Metrics:
    """The counters and histograms of one server; with ``log_counters`` (the engine's
    :meth:`~ctxwarden.engine.Engine.log_counters`) also its inclusion-log writer's, with
    ``compactor_stats`` (``engine.compactor.stats``) its background compactor's."""

    def __init__(
        self,
        log_counters: Callable[[], LogCounters] | None = None,
        compactor_stats: Callable[[], CompactorStats] | None = None,
    ) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        if log_counters is not None:
            r.register(_LogCollector(log_counters))
        if compactor_stats is not None:
            r.register(_CompactorCollector(compactor_stats))
        self.requests = Counter(
            "ctxwarden_http_requests", "HTTP requests answered.", ["route", "status"], registry=r
        )
        self.request_seconds = Histogram(
            "ctxwarden_http_request_seconds", "Time to answer a request.", ["route"],
            buckets=_LATENCY_BUCKETS, registry=r,
        )  # fmt: skip
        self.assemble_seconds = Histogram(
            "ctxwarden_assemble_seconds", "Time to assemble a context.",
            buckets=_LATENCY_BUCKETS, registry=r,
        )  # fmt: skip
        self.context_tokens = Counter(
            "ctxwarden_context_tokens", "Tokens in assembled contexts.", registry=r
        )
        self.block_used = Counter(
            "ctxwarden_block_tokens_used", "Tokens used per budget block.", ["block"], registry=r
        )
        self.block_budget = Counter(
            "ctxwarden_block_tokens_budget", "Tokens budgeted per block.", ["block"], registry=r
        )
        self.ingest = Counter(
            "ctxwarden_ingest_records",
            "Ingested records by outcome (duplicate and near_duplicate are de-dup folds).",
            ["status"],
            registry=r,
        )
        self.compaction_summaries = Counter(
            "ctxwarden_compaction_summaries", "Summaries written by compaction.", registry=r
        )
        self.compacted = Counter(
            "ctxwarden_compacted_memories",
            "Memories replaced by summaries (each left a tombstone).",
            registry=r,
        )
        self.rejected = Counter(
            "ctxwarden_http_rejected", "Requests refused by a limit.", ["reason"], registry=r
        )
        # label children looked up once (prometheus_client's .labels() per observation cost
        # more than the observation; the label sets are small and fixed)
        self._request_children: dict[tuple[str, int], tuple[Any, Any]] = {}
        self._block_children: dict[str, tuple[Any, Any]] = {}

    def observe_request(self, route: str, status: int, seconds: float) -> None:
        """Count one answered request."""
        children = self._request_children.get((route, status))
        if children is None:
            children = (
                self.requests.labels(route=route, status=str(status)),
                self.request_seconds.labels(route=route),
            )
            self._request_children[(route, status)] = children
        count, latency = children
        count.inc()
        latency.observe(seconds)

    def observe_context(self, context: Context, seconds: float) -> None:
        """Record one assembly: latency, tokens and each block's use of its budget."""
        self.assemble_seconds.observe(seconds)
        self.context_tokens.inc(context.tokens)
        for block in context.report.blocks:
            children = self._block_children.get(block.name)
            if children is None:
                children = (
                    self.block_used.labels(block=block.name),
                    self.block_budget.labels(block=block.name),
                )
                self._block_children[block.name] = children
            used, budget = children
            used.inc(block.used)
            budget.inc(block.budget)

    def observe_ingest(self, counts: Mapping[str, int]) -> None:
        """Count ingest outcomes (stored, duplicate, near_duplicate, known)."""
        for status, count in counts.items():
            if count:
                self.ingest.labels(status=status).inc(count)

    def observe_compaction(self, summaries: int, compacted: int) -> None:
        """Count one compaction run: summaries written, memories compacted."""
        self.compaction_summaries.inc(summaries)
        self.compacted.inc(compacted)

    def render(self) -> bytes:
        """The Prometheus text exposition."""
        return generate_latest(self.registry)
