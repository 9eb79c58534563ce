"""Helpers for capture tests: run the real CLI, read the log back, fold it into table state."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Callable, Hashable
from pathlib import Path
from typing import Any

import psycopg

from tests import backends
from tests.waiting import STALL_S, size_of, wait_exit, wait_progress
from tributary.capture.decoding.lsn import Lsn
from tributary.capture.status import STATUS_FILE, read_status
from tributary.log.local import Log

ROOT = Path(__file__).resolve().parents[3]


def write_config(
    path: Path,
    *,
    dsn: str,
    log_root: Path,
    name: str = "shop",
    extra: str = "",
    source_extra: str = "",
    log: str | None = None,
) -> Path:
    """A capture config with one source; `log` replaces the default `[log]` table (the local log
    under `log_root`), e.g. with a backend's (tests/backends.py `LogBackend.log_toml`)."""
    log = log if log is not None else f'[log]\nroot = "{log_root}"\npartitions = 3\nlinger_ms = 2\n'
    path.write_text(
        f"""
{log}
[capture]
status_interval_s = 1.0
max_backoff_s = 2.0
capture_eventstore = false

[[sources]]
name = "{name}"
dsn = "{dsn}"
slot = "slot_{name}_{abs(hash(str(log_root))) % 100000}"
include = ["public.*"]
{source_extra}
{extra}
"""
    )
    return path


def cli(
    *args: str,
    timeout: float = 120,
    env: dict[str, str] | None = None,
    progress: Callable[[], Hashable] | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run the CLI. `timeout` is how long it may make no progress: its output, its CPU time (and
    its children's: Spark), `progress` or, for `capture --config`, the log. A slow machine makes a
    long snapshot or Spark job slower, not a failure."""
    moving = progress or _capture_log_progress(args) or (lambda: None)
    return _cli_following(args, env=env, progress=moving, stall=max(timeout, STALL_S))


def _capture_log_progress(args: tuple[str, ...]) -> Callable[[], Hashable] | None:
    """For `capture ... --config FILE`: the progress of the log FILE names; None for anything else."""
    if not args or args[0] != "capture" or "--config" not in args[:-1]:
        return None
    try:
        doc = tomllib.loads(Path(args[args.index("--config") + 1]).read_text())
        root = Path(doc["log"]["root"])
    except (OSError, ValueError, KeyError, TypeError):
        return None  # a test of a bad config: a plain run
    return lambda: capture_progress(root)


def _cli_following(
    args: tuple[str, ...], *, env: dict[str, str] | None, progress: Callable[[], Hashable], stall: float
) -> subprocess.CompletedProcess[str]:
    """Run the CLI with its output in files (no pipe to fill) and wait while it or `progress` moves."""
    with tempfile.TemporaryDirectory() as tmp:
        out_path, err_path = Path(tmp) / "out", Path(tmp) / "err"
        cmd = [sys.executable, "-c", "from tributary.api.cli.main import main; main()", *args]
        with out_path.open("wb") as out, err_path.open("wb") as err:
            proc = subprocess.Popen(cmd, stdout=out, stderr=err, cwd=ROOT, env={**os.environ, **(env or {})})
        try:
            code = wait_exit(
                proc,
                what=f"tributary {' '.join(args[:1])}",
                progress=lambda: (progress(), size_of(out_path, err_path)),
                stall=stall,
            )
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        return subprocess.CompletedProcess(cmd, code, out_path.read_text(), err_path.read_text())


class Capture:
    """A `tributary capture` subprocess; stderr goes to a file so pipes never fill or leak."""

    def __init__(self, config: Path, *args: str) -> None:
        self.err_path = config.with_suffix(f".{time.monotonic_ns()}.err")
        with self.err_path.open("wb") as err:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-c",
                    "from tributary.api.cli.main import main; main()",
                    "capture",
                    "--config",
                    str(config),
                    *args,
                ],
                stdout=subprocess.DEVNULL,
                stderr=err,
                cwd=ROOT,
            )
        self.pid = self.proc.pid
        self._log_progress = _capture_log_progress(("capture", "--config", str(config)))

    @property
    def returncode(self) -> int | None:
        return self.proc.returncode

    def send_signal(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def wait(self, timeout: float | None = None) -> int:
        """Wait for the exit; `timeout` is how long its log and stderr may stand still meanwhile."""
        if timeout is None:
            return self.proc.wait()
        log = self._log_progress or (lambda: None)
        return wait_exit(
            self.proc,
            what="capture to exit",
            progress=lambda: (log(), size_of(self.err_path)),
            stall=max(timeout, STALL_S),
        )

    def communicate(self, timeout: float | None = None) -> tuple[str, str]:
        self.wait(timeout=timeout)
        return "", self.err_path.read_text()


def spawn_capture(config: Path, *args: str) -> Capture:
    return Capture(config, *args)


def records(log_root: Path, topic: str) -> list[Any]:
    """Every committed record of a topic, in offset order per partition."""
    with Log.open(log_root) as log:
        if topic not in log.topics():
            return []
        out = []
        for p in range(log.topics()[topic].partitions):
            out.extend(log.read(topic, p))
        return out


def table_state(log_root: Path, topic: str) -> dict[str, dict[str, Any]]:
    """Fold a CDC topic into {canonical key: row} (what a consumer would rebuild)."""
    return backends.table_state(records(log_root, topic))


def changes(log_root: Path, topic: str) -> list[dict[str, Any]]:
    return backends.changes(records(log_root, topic))


def wait_for(
    predicate: Any, timeout: float = 30.0, what: str = "condition", *, progress: Callable[[], Hashable] | None = None
) -> None:
    """Wait for `predicate()`. With `progress`, `timeout` is how long progress may stall (see tests/waiting.py)."""
    if progress is not None:
        wait_progress(predicate, progress, what=what, stall=max(timeout, STALL_S))
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def dump(obj: Any) -> str:
    return json.dumps(obj, indent=1, default=str)


PROGRESS_FIELDS = ("state", "confirmed_lsn", "changes", "snapshot_chunk", "snapshot_rows_done", "snapshot_rows_read")


def capture_progress(log_root: Path) -> tuple[Any, ...]:
    """What moves while capture works: the log's bytes (status file aside) and each source's counters.

    The status file's timestamp alone is no progress: a stuck capture rewrites it every second too.
    """
    logged = size_of(log_root, skip=STATUS_FILE)
    doc = read_status(log_root) or {}
    sources = tuple(tuple(s.get(k) for k in PROGRESS_FIELDS) for s in doc.get("sources", []))
    return logged, doc.get("pid"), sources


def status_progress(log_root: Path, *statuses: Any) -> Callable[[], Hashable]:
    """Progress of an in-process capture: its log's bytes and its sources' `SourceStatus` counters."""
    return lambda: (
        size_of(log_root, skip=STATUS_FILE),
        tuple(tuple(str(getattr(s, k)) for k in PROGRESS_FIELDS) for s in statuses),
    )


def wal_position(dsn: str) -> Lsn:
    """The source's current WAL position: every transaction committed so far lies before it."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()
    assert row is not None
    return Lsn.parse(row[0])


def confirmed_past(status: Any, lsn: Lsn) -> bool:
    """An in-process source confirmed `lsn`: what was committed before it is durable in the log."""
    return status.confirmed_lsn is not None and Lsn.parse(status.confirmed_lsn) >= lsn


def source_status(log_root: Path, pid: int, name: str = "shop") -> dict[str, Any]:
    """Source `name`'s entry in the status file of capture process `pid` ({} before it wrote one)."""
    doc = read_status(log_root) or {}
    if doc.get("pid") != pid:
        return {}
    return next((s for s in doc.get("sources", []) if s.get("name") == name), {})
