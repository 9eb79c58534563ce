"""Snapshot notifications (`notification_channels`) on every log backend, against a real
PostgreSQL: the consistent snapshot, a chunked initial snapshot and a chunked re-snapshot asked
for by a signal each say started, each table scanned and completed, as records of
`<source>.notifications` in order and as log lines."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import orjson
import psycopg
import pytest

from tests.backends import LogBackend, write_backend_config
from tests.integration.capture.helpers import capture_progress, source_status, spawn_capture, wait_for

pytestmark = pytest.mark.integration

CHANNELS = 'notification_channels = ["sink", "log"]\nsignal_table = "public.tributary_signal"'


def _setup(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE a (id int PRIMARY KEY)")
        conn.execute("CREATE TABLE b (id int PRIMARY KEY)")
        conn.execute("INSERT INTO a SELECT generate_series(1, 30)")
        conn.execute("INSERT INTO b SELECT generate_series(1, 20)")
        conn.execute("CREATE TABLE tributary_signal (id text PRIMARY KEY, type text NOT NULL, data text)")


def _notifications(backend: LogBackend, log_root: Path) -> list[dict[str, Any]]:
    records = backend.records(log_root, "shop.notifications")
    assert {r.key for r in records} <= {b'{"source":"shop"}'}
    return [orjson.loads(r.value) for r in sorted(records, key=lambda r: r.offset)]


def _shape(notes: list[dict[str, Any]]) -> list[tuple[str, str, str]]:
    """(aggregate type, type, table or rows) of each notification, in order."""
    return [
        (
            n["aggregate_type"],
            n["type"],
            ":".join(
                n["additional_data"][k] for k in ("data_collection", "total_rows_scanned") if k in n["additional_data"]
            ),
        )
        for n in notes
    ]


def _run(backend: LogBackend, dsn: str, tmp_path: Path, extra: str) -> tuple[Path, str]:
    """Capture until the initial snapshot and a signalled chunked re-snapshot of b both completed."""
    backend.prepare("shop.notifications", "shop.public.a", "shop.public.b")
    _setup(dsn)
    log_root = tmp_path / "log"
    config = write_backend_config(
        backend, tmp_path / "t.toml", dsn=dsn, log_root=log_root, source_extra=f"{CHANNELS}\n{extra}"
    )
    proc = spawn_capture(config)
    try:
        wait_for(
            lambda: (
                source_status(log_root, proc.pid).get("state") == "streaming"
                and sum(n["type"] == "COMPLETED" for n in _notifications(backend, log_root)) == 1
            ),
            timeout=90,
            what="the initial snapshot completed",
            progress=lambda: capture_progress(log_root),
        )
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(
                """INSERT INTO tributary_signal VALUES ('1', 'execute-snapshot', '{"tables": ["public.b"]}')"""
            )
        wait_for(
            lambda: sum(n["type"] == "COMPLETED" for n in _notifications(backend, log_root)) == 2,
            timeout=90,
            what="the re-snapshot completed",
            progress=lambda: capture_progress(log_root),
        )
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    return log_root, err


RESNAPSHOT = [
    ("Incremental Snapshot", "STARTED", ""),
    ("Incremental Snapshot", "TABLE_SCAN_COMPLETED", "public.b"),
    ("Incremental Snapshot", "COMPLETED", ""),
]


def test_consistent_snapshot_and_resnapshot_notify(fresh_db: str, tmp_path: Path, backend: LogBackend) -> None:
    log_root, err = _run(backend, fresh_db, tmp_path, "")
    notes = _notifications(backend, log_root)
    assert _shape(notes) == [
        ("Initial Snapshot", "STARTED", ""),
        ("Initial Snapshot", "TABLE_SCAN_COMPLETED", "public.a:30"),
        ("Initial Snapshot", "TABLE_SCAN_COMPLETED", "public.b:20"),
        ("Initial Snapshot", "COMPLETED", ""),
        *RESNAPSHOT,
    ]
    assert len({n["id"] for n in notes}) == len(notes)
    assert all(n["additional_data"]["connector_name"] == "shop" and isinstance(n["timestamp"], int) for n in notes)
    logged = [line for line in err.splitlines() if "source shop: notification " in line]
    assert [orjson.loads(line.split("notification ", 1)[1])["id"] for line in logged] == [n["id"] for n in notes]


def test_chunked_snapshot_notifies(fresh_db: str, tmp_path: Path, backend: LogBackend) -> None:
    log_root, _ = _run(backend, fresh_db, tmp_path, 'snapshot_method = "chunked"')
    assert _shape(_notifications(backend, log_root)) == [
        ("Incremental Snapshot", "STARTED", ""),
        ("Incremental Snapshot", "TABLE_SCAN_COMPLETED", "public.a"),
        ("Incremental Snapshot", "TABLE_SCAN_COMPLETED", "public.b"),
        ("Incremental Snapshot", "COMPLETED", ""),
        *RESNAPSHOT,
    ]
