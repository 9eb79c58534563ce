"""Prometheus metrics: one registry per app; gauges refreshed in the background (`status.Status`)
from the capture daemon's status file, the sources' slots, the log and the projections' state tables.
Every label comes from a bounded set: route templates, HTTP's methods, configured sources and
projections, the log's topics, the command handler's stream types, the consumer groups in the service database.

The capture daemon is another process: its commit-latency histogram travels in its status file
(cumulative bucket counts) and is exposed here as a real histogram.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import psycopg
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, InfoMetricFamily, Metric
from prometheus_client.registry import Collector

from tributary.capture.status import ERROR_KINDS, SourceState, build_info, read_status, snapshot_under_way
from tributary.consumers import GroupCoordinator
from tributary.log import VIEW_TIMEOUT_S, LogError

if TYPE_CHECKING:  # imported where used: the API's metrics load without the projections' modules
    from tributary.api.settings.config import Settings
    from tributary.projections.definition import Projection

M = TypeVar("M", Counter, Gauge, Histogram)

__all__ = ["Metrics"]

_SNAPSHOT_METHODS = ("consistent", "chunked")  # `[[sources]] snapshot_method`: a bounded label
_SNAPSHOT_CONTROLS = ("paused", "stopped", "finished")  # `SourceStatus.snapshot_control`: a bounded label


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.capture_changes = Gauge(
            "tributary_capture_changes_total", "Changes captured (per source, this daemon run)", ["source"], registry=r
        )
        self.capture_rate = Gauge("tributary_capture_changes_per_second", "Recent capture rate", ["source"], registry=r)
        self.capture_up = Gauge(
            "tributary_capture_source_state", "1 for the source's current state", ["source", "state"], registry=r
        )
        self.source_failures = Gauge(
            "tributary_capture_source_failures_total",
            "Failed connection attempts and broken streams per source (this daemon run)",
            ["source"],
            registry=r,
        )
        self.source_error = Gauge(
            "tributary_capture_source_error",
            "1 for why a source is failed or reconnecting (kind: "
            + ", ".join(ERROR_KINDS)
            + "); the reason is in GET /sources",
            ["source", "kind"],
            registry=r,
        )
        self.snapshot_running = Gauge(
            "tributary_capture_snapshot_running",
            "1 while the source takes a snapshot by that method (consistent, chunked)",
            ["source", "method"],
            registry=r,
        )
        self.snapshot_rows = Gauge(
            "tributary_capture_snapshot_rows", "Rows read by the snapshot under way", ["source"], registry=r
        )
        self.snapshot_rows_estimated = Gauge(
            "tributary_capture_snapshot_rows_estimated",
            "Rows the snapshot under way expects (the catalog's estimate)",
            ["source"],
            registry=r,
        )
        self.snapshot_chunks = Gauge(
            "tributary_capture_snapshot_chunks", "Chunks done by the chunked snapshot under way", ["source"], registry=r
        )
        self.snapshot_tables_pending = Gauge(
            "tributary_capture_snapshot_tables_pending",
            "Tables the snapshot under way has still to read (the one being read included)",
            ["source"],
            registry=r,
        )
        self.snapshot_control = Gauge(
            "tributary_capture_snapshot_control",
            "1 while the source's snapshot is paused (capture snapshot --pause), stopped (--stop, until the next "
            "snapshot request) or finished (snapshot = initial_only: the source no longer streams)",
            ["source", "state"],
            registry=r,
        )
        self.slot_lag = Gauge(
            "tributary_slot_lag_bytes", "pg_current_wal_lsn() - confirmed_flush_lsn", ["source"], registry=r
        )
        self.log_bytes = Gauge("tributary_log_bytes", "Bytes on disk per topic", ["topic"], registry=r)
        self.log_records = Gauge(
            "tributary_log_records",
            "Committed records per topic (on Kafka: offsets, transaction markers included)",
            ["topic"],
            registry=r,
        )
        self.projection_lag = Gauge(
            "tributary_projection_lag_records", "Records behind the log", ["projection"], registry=r
        )
        self.rebuild_progress = Gauge(
            "tributary_rebuild_progress_ratio", "Progress of the running rebuild", ["projection"], registry=r
        )
        self.consumer_lag = Gauge(
            "tributary_consumer_lag_records",
            "Records between a consumer group's committed offset and the log's end",
            ["group", "topic", "partition"],
            registry=r,
        )
        self.consumer_committed = Gauge(
            "tributary_consumer_committed_offset",
            "A consumer group's committed offset (the next offset it reads)",
            ["group", "topic", "partition"],
            registry=r,
        )
        self.consumer_members = Gauge(
            "tributary_consumer_group_members", "Live members of a consumer group", ["group"], registry=r
        )
        self.consumer_generation = Gauge(
            "tributary_consumer_group_generation",
            "A consumer group's generation (+1 per rebalance)",
            ["group"],
            registry=r,
        )
        self.sink_delivered = Gauge(
            "tributary_sink_delivered_records_total", "Records an HTTP sink delivered (all runs)", ["sink"], registry=r
        )
        self.sink_failed = Gauge(
            "tributary_sink_failed_attempts_total", "Failed POSTs of an HTTP sink (all runs)", ["sink"], registry=r
        )
        self.sink_dead = Gauge(
            "tributary_sink_dead_letters_total", "Records an HTTP sink gave up on (dead letters)", ["sink"], registry=r
        )
        self.sink_state = Gauge(
            "tributary_sink_state", "1 for the HTTP sink's current state", ["sink", "state"], registry=r
        )
        self.stream_types: frozenset[str] = frozenset()
        self.commands = _KnownStreamTypes(
            Counter("tributary_commands_total", "Commands handled by outcome", ["stream_type", "outcome"], registry=r),
            self,
        )
        self.command_seconds = _KnownStreamTypes(
            Histogram(
                "tributary_command_seconds",
                "Command latency",
                ["stream_type"],
                registry=r,
                buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
            ),
            self,
        )
        self.http_requests = _RequestCounts()
        r.register(self.http_requests)
        self.capture_commits = _CommitLatency()
        r.register(self.capture_commits)
        self.capture_build = _BuildInfo()
        r.register(self.capture_build)

    def known_stream_types(self, names: Iterable[str]) -> None:
        """The stream types that may label command series; any other (a client's typo, a scan) is "other"."""
        self.stream_types = frozenset(names)

    def count_request(self, method: str, route: str, status: int) -> None:
        """`tributary_http_requests_total` += 1 (on the event loop, which serves every request).
        `route` is a route template or "unmatched"; a method outside HTTP's own is "other"."""
        counts = self.http_requests.counts
        key = (method if method in _METHODS else "other", route, status)
        counts[key] = counts.get(key, 0) + 1

    def refresh(
        self,
        settings: Settings,
        *,
        dsn: str | None = None,
        rebuilds: Iterable[Mapping[str, Any]] = (),
        groups: GroupCoordinator | None = None,
        projections: Mapping[str, Projection] | None = None,
    ) -> None:
        """Read every source of truth once (called by the background refresh, off the event loop);
        `projections`: the definitions the API serves."""
        from tributary.api.settings.sources import source_statuses

        root = Path(settings.log.root)
        current = read_status(root) or {}
        self.capture_commits.status = current
        self.capture_build.status = current
        _, sources = source_statuses(settings, current)
        for s in sources:
            self.capture_changes.labels(s["name"]).set(s.get("changes", 0))
            self.capture_rate.labels(s["name"]).set(s.get("changes_per_s", 0))
            for state in SourceState:
                self.capture_up.labels(s["name"], state.value).set(1 if s.get("state") == state.value else 0)
            self.source_failures.labels(s["name"]).set(s.get("failures", 0))
            failing = s.get("state") in (SourceState.FAILED.value, SourceState.RECONNECTING.value)
            for kind in ERROR_KINDS:
                self.source_error.labels(s["name"], kind).set(1 if failing and s.get("error_kind") == kind else 0)
            self._snapshot(s)
            if isinstance(s.get("slot_lag_bytes"), int):
                self.slot_lag.labels(s["name"]).set(s["slot_lag_bytes"])
        with contextlib.suppress(LogError):  # no log yet, or Kafka unreachable: the other figures still count
            self._refresh_topics(settings)
        self._refresh_projections(settings, dsn, rebuilds, projections)
        if groups is not None:
            self._refresh_groups(groups)
        if dsn is not None and settings.sinks:
            self._refresh_sinks(settings, dsn)

    def _refresh_topics(self, settings: Settings) -> None:
        """Records per topic (offsets from start to end); on the local log also its bytes on disk
        (on Kafka they are the broker's to report)."""
        from tributary.api.settings.log import log_admin

        for topic, (records, nbytes) in log_admin(settings, timeout_s=VIEW_TIMEOUT_S).topic_sizes().items():
            self.log_records.labels(topic).set(records)
            if nbytes is not None:
                self.log_bytes.labels(topic).set(nbytes)

    def _refresh_sinks(self, settings: Settings, dsn: str) -> None:
        """The configured sinks' status rows (`tributary sinks run` writes them after every batch)."""
        from tributary.sinks import SinkStore

        try:
            store = SinkStore(dsn)
            try:
                rows = {row.sink: row for row in store.statuses()}
            finally:
                store.close()
        except psycopg.Error:  # unreachable, or before `tributary init`: nothing to report
            return
        for sink in settings.sinks:
            row = rows.get(sink.name)
            state = row.state if row else "never run"
            self.sink_delivered.labels(sink.name).set(row.delivered if row else 0)
            self.sink_failed.labels(sink.name).set(row.failed_attempts if row else 0)
            self.sink_dead.labels(sink.name).set(row.dead_letters if row else 0)
            for known in ("running", "retrying", "stopped", "never run"):
                self.sink_state.labels(sink.name, known).set(1 if state == known else 0)

    def _refresh_groups(self, coordinator: GroupCoordinator) -> None:
        """Lag and committed offset per group and partition; members and generation per group. Series
        of groups and partitions that are gone disappear (the gauges are rebuilt each refresh)."""
        try:
            rows = coordinator.lag_rows()
            summary = coordinator.groups()
        except psycopg.Error:  # before `tributary init`: no consumer tables yet
            return
        for gauge in (self.consumer_lag, self.consumer_committed, self.consumer_members, self.consumer_generation):
            gauge.clear()
        for group, topic, partition, committed, end in rows:
            self.consumer_lag.labels(group, topic, str(partition)).set(max(end - committed, 0))
            self.consumer_committed.labels(group, topic, str(partition)).set(committed)
        for g in summary:
            self.consumer_members.labels(g["group"]).set(g["members"])
            self.consumer_generation.labels(g["group"]).set(g["generation"])

    def _snapshot(self, s: Mapping[str, Any]) -> None:
        """The snapshot under way, zero when none (a chunked one runs while the state is streaming)."""
        name = s["name"]
        running = snapshot_under_way(s)
        method = s.get("snapshot_method") or "consistent"
        for m in _SNAPSHOT_METHODS:
            self.snapshot_running.labels(name, m).set(1 if running and method == m else 0)
        self.snapshot_rows.labels(name).set(s.get("snapshot_rows_done", 0) if running else 0)
        self.snapshot_rows_estimated.labels(name).set(s.get("snapshot_rows_total", 0) if running else 0)
        self.snapshot_chunks.labels(name).set(s.get("snapshot_chunk", 0) if running else 0)
        self.snapshot_tables_pending.labels(name).set(len(s.get("snapshot_tables_pending") or ()) if running else 0)
        control = s.get("snapshot_control")
        for state in _SNAPSHOT_CONTROLS:
            self.snapshot_control.labels(name, state).set(1 if control == state else 0)

    def _refresh_projections(
        self,
        settings: Settings,
        dsn: str | None,
        rebuilds: Iterable[Mapping[str, Any]],
        projections: Mapping[str, Projection] | None = None,
    ) -> None:
        from tributary.projections.errors import RunError
        from tributary.projections.runner import RunSettings, status

        try:
            for st in status(RunSettings.from_settings(settings, dsn=dsn), projections=projections):
                self.projection_lag.labels(st.name).set(st.lag)
        except (RunError, LogError):
            # The service database or Kafka cannot be reached, or the log cannot be read (/readyz and
            # /topics say which): no lag to report, the other figures still count. A query that fails
            # or times out once connected is the refresh's error, which its loop logs.
            pass
        for b in rebuilds:
            if b.get("state") == "running":
                total = b.get("total") or 0
                self.rebuild_progress.labels(b["projection"]).set(b.get("done", 0) / total if total else 0.0)
            elif b.get("state") == "done":
                self.rebuild_progress.labels(b["projection"]).set(1.0)

    def render(self) -> bytes:
        return generate_latest(self.registry)


_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "TRACE", "CONNECT"})


_MAX_CHILDREN = 4096  # labelled series kept at hand per command metric (types × outcomes)


class _KnownStreamTypes(Generic[M]):
    """A metric labelled by stream type first: a type the command handler does not know becomes
    "other", so URLs cannot add series (the URL's type reaches the metric even when the answer is 404).
    The labelled series are kept by their labels: prometheus' `labels()` checks and locks per call,
    and every command would pay for it. Bounded: past `_MAX_CHILDREN` series, lookups are not kept."""

    def __init__(self, metric: M, metrics: Metrics) -> None:
        self.metric: M = metric
        self.metrics = metrics
        self._children: dict[tuple[str, ...], M] = {}

    def labels(self, stream_type: str, *rest: str) -> M:
        key = (stream_type if stream_type in self.metrics.stream_types else "other", *rest)
        child = self._children.get(key)
        if child is None:
            child = self.metric.labels(*key)
            if len(self._children) < _MAX_CHILDREN:
                self._children[key] = child
        return child


class _RequestCounts(Collector):
    """`tributary_http_requests_total` by method, route template and status, kept as plain ints: a
    prometheus `Counter` child takes a lock and checks its labels per `inc()`.
    Only the event loop's thread counts; a scrape reads a copy made in one step."""

    def __init__(self) -> None:
        self.counts: dict[tuple[str, str, int], int] = {}

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily("tributary_http_requests", "HTTP requests", labels=["method", "route", "status"])
        for (method, route, status), count in sorted(self.counts.copy().items()):
            family.add_metric([method, route, str(status)], count)
        yield family


class _CommitLatency(Collector):
    """`tributary_capture_commit_seconds`: the capture daemon's log-commit latency histogram."""

    def __init__(self) -> None:
        self.status: dict[str, Any] = {}

    def collect(self) -> Iterator[Metric]:
        # `capture.status.LatencyHistogram.to_json`: cumulative [le, count] pairs ending at "+Inf"
        h = self.status.get("commit_seconds") or {"buckets": [["+Inf", 0]], "sum": 0.0}
        family = HistogramMetricFamily(
            "tributary_capture_commit_seconds", "Capture's log commit latency (append to durable manifest)"
        )
        buckets = [(le if le == "+Inf" else repr(float(le)), count) for le, count in h["buckets"]]
        family.add_metric([], buckets, h["sum"])
        yield family


class _BuildInfo(Collector):
    """`tributary_build_info{process,version,impl,compiled}`: which implementation runs the typed
    twins (compiled, python or mixed) in this process ("api") and in the capture daemon ("capture",
    from its status file, once it has written one)."""

    def __init__(self) -> None:
        self.api = build_info()
        self.status: dict[str, Any] = {}

    def collect(self) -> Iterator[Metric]:
        family = InfoMetricFamily(
            "tributary_build", "Version, and which implementation runs the typed code", labels=["process"]
        )
        family.add_metric(["api"], self.api)
        capture = self.status.get("build")
        if isinstance(capture, dict):
            family.add_metric(["capture"], {k: str(v) for k, v in capture.items()})
        yield family
