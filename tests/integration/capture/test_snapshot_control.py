"""Stop, pause and resume of a chunked snapshot (`capture snapshot --stop/--pause/--resume` and the
signal table, Debezium's stop-/pause-/resume-snapshot signals), against a real PostgreSQL: the
paused state survives a restart of capture, `capture status` shows it, and a condition that does
not parse is refused in one line (by the CLI) or with a warning (from the signal table).

The signals are written while capture is stopped: each lies in the WAL before any watermark of the
next run, so capture applies it before it could stage a chunk, whatever the machine's speed."""

from __future__ import annotations

import json
import signal
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import psycopg
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.capture.helpers import (
    Capture,
    capture_progress,
    cli,
    records,
    source_status,
    spawn_capture,
    table_state,
    wait_for,
    wal_position,
    write_config,
)
from tests.integration.capture.test_slot_gap import TOPIC as GAP_TOPIC
from tests.integration.capture.test_slot_gap import _captured_then_slot_dropped_and_changed
from tests.integration.capture.test_slot_gap import _table as _gap_table
from tributary.api.http.metrics import Metrics
from tributary.api.settings.config import load_settings
from tributary.capture.decoding.lsn import Lsn

pytestmark = pytest.mark.integration

ROWS = 1000
SIGNALS = "public.tributary_signal"


def _setup(dsn: str, tmp_path: Path) -> Path:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
        conn.execute("INSERT INTO t SELECT g, 'v' || g FROM generate_series(1, %s) g", (ROWS,))
        conn.execute(f"CREATE TABLE {SIGNALS} (id text PRIMARY KEY, type text NOT NULL, data text)")
    config = write_config(
        tmp_path / "t.toml",
        dsn=dsn,
        log_root=tmp_path / "log",
        source_extra=f'signal_table = "{SIGNALS}"\nsnapshot_chunk_rows = 100\nnotification_channels = ["sink"]',
    )
    res = cli("capture", "--config", str(config), "--until-idle", "1", timeout=300)  # the initial snapshot
    assert res.returncode == 0, res.stderr
    return config


def _reads(log_root: Path) -> Counter[bytes]:
    """How often each key of t was read by a snapshot (`op: "r"`)."""
    return Counter(r.key for r in records(log_root, "shop.public.t") if r.value and b'"op":"r"' in r.value)


def _notifications(log_root: Path) -> list[dict[str, Any]]:
    """The incremental snapshot's notifications on `shop.notifications`, in order."""
    docs = [orjson.loads(r.value) for r in records(log_root, "shop.notifications") if r.value]
    return [d for d in docs if d["aggregate_type"] == "Incremental Snapshot"]


def _notified(log_root: Path) -> list[str]:
    """Their types, but IN_PROGRESS (one per chunk: `_progress`)."""
    return [d["type"] for d in _notifications(log_root) if d["type"] != "IN_PROGRESS"]


def _progress(log_root: Path) -> list[tuple[str, str, str]]:
    """Each IN_PROGRESS's table, largest key and last key read."""
    return [
        (
            d["additional_data"]["current_collection_in_progress"],
            d["additional_data"]["maximum_key"],
            d["additional_data"]["last_processed_key"],
        )
        for d in _notifications(log_root)
        if d["type"] == "IN_PROGRESS"
    ]


def _control_gauges(config: Path) -> dict[str, float]:
    """`/metrics`' `tributary_capture_snapshot_control{source="shop"}` by state, from the status file."""
    metrics = Metrics()
    metrics.refresh(load_settings(config))
    families = text_string_to_metric_families(metrics.render().decode())
    samples = next(f for f in families if f.name == "tributary_capture_snapshot_control").samples
    return {s.labels["state"]: s.value for s in samples if s.labels["source"] == "shop"}


def _signal(config: Path, *args: str) -> None:
    res = cli("capture", "snapshot", *args, "--config", str(config))
    assert res.returncode == 0, res.stdout + res.stderr


def _applied(config: Path, proc: Capture, lsn: Lsn, shown: str) -> dict[str, Any]:
    """Once running capture `proc` confirmed `lsn` (the signals before it are applied and
    committed): its source's status entry, `capture status` having shown `shown`."""
    log_root = config.parent / "log"

    def confirmed() -> bool:
        at = source_status(log_root, proc.pid).get("confirmed_lsn")
        return at is not None and Lsn.parse(at) >= lsn

    wait_for(confirmed, timeout=60, what="capture to apply the signals", progress=lambda: capture_progress(log_root))
    status = cli("capture", "status", "--config", str(config))
    assert shown in status.stdout, status.stdout + status.stderr
    return source_status(log_root, proc.pid)


def test_pause_survives_a_restart_and_resume_finishes_the_snapshot(fresh_db: str, tmp_path: Path) -> None:
    config = _setup(fresh_db, tmp_path)
    log_root = tmp_path / "log"
    _signal(config, "public.t")
    _signal(config, "--pause")
    paused_at = wal_position(fresh_db)

    proc = spawn_capture(config)
    try:
        entry = _applied(config, proc, paused_at, "snapshot (chunked) paused public.t")
        assert entry["snapshot_control"] == "paused" and entry["snapshot_tables_pending"] == ["public.t"], entry
        assert _control_gauges(config) == {"paused": 1.0, "stopped": 0.0, "finished": 0.0}
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
    assert set(_reads(log_root).values()) == {1}, "no chunk is read while paused"

    proc = spawn_capture(config)
    try:
        wait_for(
            lambda: source_status(log_root, proc.pid).get("state") == "streaming",
            timeout=60,
            what="capture to stream again",
            progress=lambda: capture_progress(log_root),
        )
        entry = source_status(log_root, proc.pid)
        assert entry["snapshot_control"] == "paused" and entry["snapshot_tables_pending"] == ["public.t"], entry
        assert set(_reads(log_root).values()) == {1}, "still paused after the restart"
        _signal(config, "--resume")
        wait_for(
            lambda: set(_reads(log_root).values()) == {2},
            timeout=60,
            what="the resumed snapshot to read every row",
            progress=lambda: capture_progress(log_root),
        )
        wait_for(
            lambda: not source_status(log_root, proc.pid).get("snapshot_tables_pending"),
            timeout=60,
            what="the snapshot to end",
            progress=lambda: capture_progress(log_root),
        )
        assert source_status(log_root, proc.pid).get("snapshot_control") is None
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    assert len(table_state(log_root, "shop.public.t")) == ROWS
    assert _notified(log_root) == ["STARTED", "PAUSED", "RESUMED", "TABLE_SCAN_COMPLETED", "COMPLETED"]
    # One IN_PROGRESS per chunk that did not end the table (Debezium's), all after the resume.
    types = [d["type"] for d in _notifications(log_root)]
    assert types.index("RESUMED") < types.index("IN_PROGRESS") and types.count("IN_PROGRESS") >= ROWS // 100 - 1
    progress = _progress(log_root)
    assert {(table, high) for table, high, _ in progress} == {("public.t", f"[{ROWS}]")}
    lasts = [int(last.strip("[]")) for _, _, last in progress]
    assert lasts == sorted(lasts) and lasts[0] == 100, lasts


def test_stop_from_the_cli_and_the_signal_table_ends_the_snapshot_unread(fresh_db: str, tmp_path: Path) -> None:
    config = _setup(fresh_db, tmp_path)
    log_root = tmp_path / "log"
    _signal(config, "public.t")
    _signal(config, "--stop")
    with psycopg.connect(fresh_db, autocommit=True) as conn:  # Debezium's spelling, through the signal table
        conn.execute(
            f"INSERT INTO {SIGNALS} VALUES ('s1', 'execute-snapshot', %s), ('s2', 'stop-snapshot', %s)",
            (
                json.dumps({"data-collections": ["public.t"], "type": "incremental"}),
                json.dumps({"data-collections": ["public.t"], "type": "incremental"}),
            ),
        )
    stopped_at = wal_position(fresh_db)
    proc = spawn_capture(config)
    try:
        entry = _applied(config, proc, stopped_at, "snapshot stopped")
        assert entry["snapshot_control"] == "stopped" and not entry["snapshot_tables_pending"], entry
        assert _control_gauges(config) == {"paused": 0.0, "stopped": 1.0, "finished": 0.0}
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    assert set(_reads(log_root).values()) == {1}, "a stopped snapshot stages no chunk"
    # Each stop aborts the snapshot it finds pending (the second was requested and stopped in one
    # transaction of the signal table, before any chunk: no STARTED of its own).
    assert _notified(log_root) == ["STARTED", "ABORTED", "ABORTED"]
    # Stopped is not pending: a later start does not take it up again.
    res = cli("capture", "--config", str(config), "--until-idle", "1", timeout=300)
    assert res.returncode == 0, res.stderr
    assert set(_reads(log_root).values()) == {1}


def test_a_condition_that_does_not_parse_is_refused(fresh_db: str, tmp_path: Path) -> None:
    config = _setup(fresh_db, tmp_path)
    log_root = tmp_path / "log"
    res = cli("capture", "snapshot", "public.t", "--where", "nosuch = 1", "--config", str(config))
    assert res.returncode != 0 and res.stderr.count("\n") == 1, res.stderr
    assert "cannot be filtered by 'nosuch = 1'" in res.stderr and 'column "nosuch" does not exist' in res.stderr
    res = cli("capture", "snapshot", "public.t", "--where", "true; DROP TABLE t", "--config", str(config))
    assert res.returncode != 0 and res.stderr.count("\n") == 1, res.stderr
    with psycopg.connect(fresh_db, autocommit=True) as conn:  # the signal table: refused with a warning
        conn.execute(
            f"INSERT INTO {SIGNALS} VALUES ('w1', 'execute-snapshot', %s)",
            (
                json.dumps(
                    {
                        "data-collections": ["public.t"],
                        "additional-conditions": [{"data-collection": "public.t", "filter": "v >"}],
                    }
                ),
            ),
        )
        assert conn.execute("SELECT count(*) FROM t").fetchone() == (ROWS,)
    res = cli("capture", "--config", str(config), "--until-idle", "1", timeout=300)
    assert res.returncode == 0, res.stderr
    assert "snapshot of public.t (requested by public.tributary_signal row 'w1') refused" in res.stderr
    assert "cannot be filtered by 'v >'" in res.stderr
    assert set(_reads(log_root).values()) == {1}


def test_init_leaves_a_dropped_slot_to_capture_under_always(fresh_db: str, tmp_path: Path) -> None:
    """`snapshot = "always"` recreates the slot at every start: a slot dropped while capture was
    stopped is a warning for `init`, not a problem, and capture's next start restates the table."""
    config = _captured_then_slot_dropped_and_changed(fresh_db, tmp_path, extra='snapshot = "always"')
    init = cli("init", "--config", str(config))
    assert init.returncode == 0, init.stdout + init.stderr
    assert "capture re-snapshots and creates the slot (snapshot = always)" in init.stdout, init.stdout
    res = cli("capture", "--config", str(config), "--until-idle", "1", timeout=300)
    assert res.returncode == 0, res.stderr
    assert table_state(tmp_path / "log", GAP_TOPIC) == _gap_table(fresh_db)
