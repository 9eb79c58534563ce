"""Prometheus metrics: one registry per app; gauges refreshed from the log and status on scrape."""

from __future__ import annotations

from pathlib import Path

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from capture.log import Log, LogError
from capture.status import read_status

__all__ = ["Metrics"]


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
        self.slot_lag = Gauge(
            "tributary_slot_lag_bytes", "pg_current_wal_lsn() - confirmed_flush_lsn", ["source"], registry=r
        )
        self.log_bytes = Gauge("tributary_log_bytes", "Bytes on disk per topic", ["topic"], registry=r)
        self.log_records = Gauge("tributary_log_records", "Committed records per topic", ["topic"], registry=r)
        self.projection_lag = Gauge(
            "tributary_projection_lag_records", "Records behind the log", ["projection"], registry=r
        )
        self.rebuild_progress = Gauge(
            "tributary_rebuild_progress_ratio", "Progress of the running rebuild", ["projection"], registry=r
        )
        self.commands = Counter(
            "tributary_commands_total", "Commands handled by outcome", ["stream_type", "outcome"], registry=r
        )
        self.command_seconds = Histogram(
            "tributary_command_seconds",
            "Command latency",
            ["stream_type"],
            registry=r,
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
        )
        self.http_requests = Counter(
            "tributary_http_requests_total", "HTTP requests", ["method", "route", "status"], registry=r
        )

    def refresh(self, log_root: Path) -> None:
        status = read_status(log_root) or {"sources": []}
        for s in status.get("sources", []):
            self.capture_changes.labels(s["name"]).set(s.get("changes", 0))
            self.capture_rate.labels(s["name"]).set(s.get("changes_per_s", 0))
            for state in ("starting", "snapshotting", "streaming", "reconnecting", "stopped", "failed"):
                self.capture_up.labels(s["name"], state).set(1 if s.get("state") == state else 0)
        try:
            with Log.open(log_root) as log:
                for topic in log.topics():
                    self.log_records.labels(topic).set(
                        sum(e - b for b, e in zip(log.start_offsets(topic), log.end_offsets(topic), strict=True))
                    )
                    self.log_bytes.labels(topic).set(_dir_bytes(log_root / topic))
        except LogError:
            pass

    def render(self) -> bytes:
        return generate_latest(self.registry)


def _dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.exists() else 0
