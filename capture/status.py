"""Capture status: a lifecycle enum per source and a small JSON file the CLI and API read.

The daemon replaces `<log root>/capture-status.json` atomically every second or so; readers in
other processes never see a torn file.
"""

from __future__ import annotations

import enum
import json
import os
from bisect import bisect_left
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tributary import __version__
from tributary.impl import selection

__all__ = [
    "ERROR_KINDS",
    "build_info",
    "LatencyHistogram",
    "SourceState",
    "SourceStatus",
    "read_status",
    "snapshot_summary",
    "snapshot_under_way",
    "snapshot_view",
    "write_status",
    "STATUS_FILE",
]

STATUS_FILE = "capture-status.json"


ERROR_KINDS = ("unreachable", "connection_lost", "misconfigured", "slot_in_use", "error")
"""Why a source is not streaming: `unreachable` (cannot connect), `connection_lost` (the stream
broke), `misconfigured` (the server or slot cannot work as configured until someone fixes it),
`slot_in_use` (another process streams from the slot), `error` (anything else of that source)."""


class SourceState(enum.StrEnum):
    STARTING = "starting"
    SNAPSHOTTING = "snapshotting"
    STREAMING = "streaming"
    RECONNECTING = "reconnecting"
    STOPPED = "stopped"
    FAILED = "failed"


@dataclass
class SourceStatus:
    name: str
    slot: str
    state: SourceState = SourceState.STARTING
    last_lsn: str | None = None  # last commit LSN appended to the log
    confirmed_lsn: str | None = None  # last LSN confirmed to the server (durable in the log)
    changes: int = 0
    changes_per_s: float = 0.0
    transactions: int = 0
    snapshot_rows_done: int = 0
    snapshot_rows_total: int = 0
    snapshot_table: str | None = None
    snapshot_method: str | None = None  # consistent | chunked: the snapshot under way, or the last one
    snapshot_chunk: int = 0  # chunks staged by the chunked snapshot under way (across restarts)
    snapshot_tables_pending: list[str] = field(default_factory=list)  # the first is being read
    snapshot_rows_read: int = 0  # rows this process read for a chunked snapshot (re-reads included)
    snapshot_chunks_reread: int = 0  # chunks read again (a truncate, a schema change or the commit race)
    # "paused" (`capture snapshot --pause`), "stopped" (`--stop`, until the next snapshot request),
    # "finished" (`snapshot = "initial_only"`: the snapshot is committed, the source streams no more)
    snapshot_control: str | None = None
    error: str | None = None  # why the source is failed or reconnecting: one line, no password
    error_kind: str | None = None  # one of ERROR_KINDS (a bounded metrics label)
    failures: int = 0  # failed connection attempts and broken streams this run
    retry_at_ms: int | None = None  # when a failed source tries again (epoch ms)
    warnings: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["state"] = self.state.value
        return out


class LatencyHistogram:
    """Cumulative latency buckets (Prometheus' shape), carried to the API in the status file."""

    BOUNDS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)

    def __init__(self) -> None:
        self.counts = [0] * (len(self.BOUNDS) + 1)  # per bucket, the last one is +Inf
        self.sum = 0.0

    def observe(self, seconds: float) -> None:
        self.counts[bisect_left(self.BOUNDS, seconds)] += 1  # the first bucket with seconds <= le
        self.sum += seconds

    def to_json(self) -> dict[str, Any]:
        running, buckets = 0, []
        for le, n in zip((*self.BOUNDS, "+Inf"), self.counts, strict=True):
            running += n
            buckets.append([le, running])
        return {"buckets": buckets, "sum": self.sum, "count": running}


def build_info() -> dict[str, str]:
    """This process's version and which implementation runs its typed twins (`tributary.impl`):
    the daemon writes it into its status file, and /metrics shows it as `tributary_build_info`."""
    chosen = selection()
    return {"version": __version__, "impl": chosen.name, "compiled": ",".join(chosen.compiled)}


def write_status(
    root: Path,
    *,
    pid: int,
    updated_ms: int,
    sources: list[SourceStatus],
    commit_seconds: LatencyHistogram | None = None,
) -> None:
    root.mkdir(parents=True, exist_ok=True)
    body: dict[str, Any] = {"pid": pid, "updated_ms": updated_ms, "sources": [s.to_json() for s in sources]}
    body["build"] = build_info()
    if commit_seconds is not None:
        body["commit_seconds"] = commit_seconds.to_json()
    tmp = root / (STATUS_FILE + ".tmp")
    tmp.write_text(json.dumps(body, indent=1) + "\n")
    os.replace(tmp, root / STATUS_FILE)


def read_status(root: Path) -> dict[str, Any] | None:
    try:
        return dict(json.loads((root / STATUS_FILE).read_text()))
    except FileNotFoundError:
        return None


def snapshot_under_way(entry: Mapping[str, Any]) -> bool:
    """A source's status entry (`SourceStatus.to_json()`, or the status file's) shows a snapshot
    being taken: a consistent one (state `snapshotting`) or a chunked one beside the stream
    (tables pending)."""
    return entry.get("state") == SourceState.SNAPSHOTTING.value or bool(entry.get("snapshot_tables_pending"))


def snapshot_summary(entry: Mapping[str, Any]) -> str | None:
    """One line on the snapshot under way, None when there is none: table, method, chunks and
    rows done of estimated, tables pending (`capture status`, the live display)."""
    control = entry.get("snapshot_control")
    if not snapshot_under_way(entry):
        if control == "stopped":
            return "snapshot stopped"
        return "snapshot finished (initial_only): not streaming" if control == "finished" else None
    method = entry.get("snapshot_method")
    parts = [f"snapshot{f' ({method})' if method else ''}" + (" paused" if control == "paused" else "")]
    table = entry.get("snapshot_table")
    pending = [t for t in entry.get("snapshot_tables_pending") or () if t != table]
    if table:
        parts.append(str(table))
    if entry.get("snapshot_chunk"):
        parts.append(f"chunk {entry['snapshot_chunk']:,}")
    done, total = entry.get("snapshot_rows_done", 0), entry.get("snapshot_rows_total", 0)
    if total:
        parts.append(f"{done:,}/~{total:,} rows ({100 * done // max(total, 1)}%)")
    elif done:
        parts.append(f"{done:,} rows")
    if pending:
        shown = ", ".join(pending[:3]) + (f" +{len(pending) - 3}" if len(pending) > 3 else "")
        parts.append(f"pending {shown}")
    return " ".join(parts)


def snapshot_view(entry: Mapping[str, Any]) -> dict[str, Any] | None:
    """The snapshot under way as one object (`GET /sources`, `capture status --json`), None when none."""
    if not snapshot_under_way(entry):
        return None
    return {
        "method": entry.get("snapshot_method") or "consistent",
        "table": entry.get("snapshot_table"),
        "chunks_done": entry.get("snapshot_chunk", 0),
        "rows_done": entry.get("snapshot_rows_done", 0),
        "rows_estimated": entry.get("snapshot_rows_total", 0),
        "tables_pending": list(entry.get("snapshot_tables_pending") or ()),
        "paused": entry.get("snapshot_control") == "paused",
    }
