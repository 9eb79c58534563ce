"""Heartbeats (`heartbeat_interval_ms`) on every log backend, against a real PostgreSQL: an idle
source writes `<source>.heartbeat` records at the interval, whose position follows the WAL that
other databases of the server write, and its slot is confirmed there."""

from __future__ import annotations

import signal
from pathlib import Path

import orjson
import psycopg
import pytest

from tests.backends import LogBackend, write_backend_config
from tests.integration.capture.helpers import capture_progress, source_status, spawn_capture, wait_for, wal_position
from tests.pg import PgServer, fresh_database
from tributary.capture.decoding.lsn import Lsn

pytestmark = pytest.mark.integration


def _slot_confirmed(dsn: str) -> Lsn:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE database = current_database()"
        ).fetchone()
    assert row is not None
    return Lsn.parse(row[0])


def test_heartbeats_move_with_the_wal_on_an_idle_source(
    fresh_db: str, pg_server: PgServer, tmp_path: Path, backend: LogBackend
) -> None:
    backend.prepare("shop.heartbeat", "shop.public.t")
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY)")
        conn.execute("INSERT INTO t SELECT generate_series(1, 10)")
    log_root = tmp_path / "log"
    config = write_backend_config(
        backend, tmp_path / "t.toml", dsn=fresh_db, log_root=log_root, source_extra="heartbeat_interval_ms = 300"
    )
    proc = spawn_capture(config)
    try:
        wait_for(
            lambda: source_status(log_root, proc.pid).get("state") == "streaming",
            what="capture streaming",
            progress=lambda: capture_progress(log_root),
        )
        with fresh_database(pg_server) as other, psycopg.connect(other, autocommit=True) as conn:
            conn.execute("CREATE TABLE busy (id int)")
            for _ in range(5):
                conn.execute("INSERT INTO busy SELECT generate_series(1, 2000)")
            target = wal_position(other)

        def beats() -> list[dict[str, int]]:
            return [orjson.loads(r.value) for r in backend.records(log_root, "shop.heartbeat")]

        wait_for(lambda: any(b["lsn"] >= int(target) for b in beats()), timeout=90, what="a heartbeat past the WAL")
        wait_for(lambda: _slot_confirmed(fresh_db) >= target, timeout=60, what="the slot confirmed past the WAL")
        wait_for(lambda: len(beats()) >= 4, timeout=60, what="heartbeats at the interval")
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    records = backend.records(log_root, "shop.heartbeat")
    assert len(records) >= 4
    assert {r.key for r in records} == {b'{"serverName":"shop"}'}
    values = [orjson.loads(r.value) for r in sorted(records, key=lambda r: r.offset)]
    assert all(set(v) == {"ts_ms", "lsn"} for v in values)
    times = [v["ts_ms"] for v in values]
    assert all(later - earlier >= 300 for earlier, later in zip(times, times[1:], strict=False)), times
    assert [v["lsn"] for v in values] == sorted(v["lsn"] for v in values)
