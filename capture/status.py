"""Capture status: a lifecycle enum per source and a small JSON file the CLI and API read.

The daemon replaces `<log root>/capture-status.json` atomically every second or so; readers in
other processes never see a torn file.
"""

from __future__ import annotations

import enum
import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["SourceState", "SourceStatus", "read_status", "write_status", "STATUS_FILE"]

STATUS_FILE = "capture-status.json"


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
    error: str | None = None
    warnings: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["state"] = self.state.value
        return out


def write_status(root: Path, *, pid: int, updated_ms: int, sources: list[SourceStatus]) -> None:
    root.mkdir(parents=True, exist_ok=True)
    body = {"pid": pid, "updated_ms": updated_ms, "sources": [s.to_json() for s in sources]}
    tmp = root / (STATUS_FILE + ".tmp")
    tmp.write_text(json.dumps(body, indent=1) + "\n")
    os.replace(tmp, root / STATUS_FILE)


def read_status(root: Path) -> dict[str, Any] | None:
    try:
        return dict(json.loads((root / STATUS_FILE).read_text()))
    except FileNotFoundError:
        return None
