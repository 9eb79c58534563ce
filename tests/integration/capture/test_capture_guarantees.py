"""Capture as a user runs it (the CLI, a real Postgres) against what the source does to it: a
server restart and a killed walsender are survived, an idle slot pins no WAL. What capture promises
of the log (snapshot hand-over, kill -9, SIGTERM, sources side by side) is checked on every backend
in tests/integration/contract/test_capture_contract.py."""

from __future__ import annotations

import time
from pathlib import Path

import psycopg
import pytest

from tests.integration.capture.helpers import (
    capture_progress,
    changes,
    records,
    source_status,
    spawn_capture,
    wait_for,
    write_config,
)
from tests.pg import PgServer

pytestmark = pytest.mark.integration


def test_server_restart_and_killed_walsender_are_survived(pg_server: PgServer, fresh_db: str, tmp_path: Path) -> None:
    if pg_server.embedded is None:
        pytest.skip("needs the embedded server to restart it")
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE ledger (id int PRIMARY KEY, amount int)")
    config = write_config(tmp_path / "t.toml", dsn=fresh_db, log_root=tmp_path / "log")
    proc = spawn_capture(config, "--until-idle", "6")
    written = 0

    def write(n: int) -> None:
        nonlocal written
        for attempt in range(50):
            try:
                with psycopg.connect(fresh_db, autocommit=True) as conn:
                    for _ in range(n):
                        conn.execute("INSERT INTO ledger VALUES (%s, 1)", (written + 1,))
                        written += 1
                return
            except psycopg.OperationalError:
                time.sleep(0.2 * (attempt + 1))
        raise AssertionError("could not write after restart")

    log_root = tmp_path / "log"

    def captured(n: int) -> None:
        wait_for(
            lambda: len(changes(log_root, "shop.public.ledger")) >= n,
            what=f"{n} rows captured",
            progress=lambda: capture_progress(log_root),
        )

    wait_for(
        lambda: source_status(log_root, proc.pid).get("state") == "streaming",
        what="capture streaming",
        progress=lambda: capture_progress(log_root),
    )
    write(200)
    captured(200)
    pg_server.restart()
    write(200)
    captured(400)
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        conn.execute(
            "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE active_pid IS NOT NULL AND database = current_database()"
        )
    write(200)
    _, err = proc.communicate(timeout=180)
    assert proc.returncode == 0, err
    ids = [c["after"]["id"] for c in changes(tmp_path / "log", "shop.public.ledger") if c["op"] in ("c", "r")]
    assert sorted(ids) == list(range(1, written + 1))
    assert "reconnecting" in err


def test_idle_slot_does_not_pin_wal(fresh_db: str, pg_server: PgServer, tmp_path: Path) -> None:
    """Trap 7: WAL written only to an uncaptured table must not accumulate behind our slot."""
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE captured (id int PRIMARY KEY)")
        conn.execute("CREATE SCHEMA other")
        conn.execute("CREATE TABLE other.noise (id serial PRIMARY KEY, pad text)")
    config = write_config(tmp_path / "t.toml", dsn=fresh_db, log_root=tmp_path / "log")
    proc = spawn_capture(config, "--until-idle", "5")
    wait_for(
        lambda: source_status(tmp_path / "log", proc.pid).get("state") == "streaming",
        what="capture streaming",
        progress=lambda: capture_progress(tmp_path / "log"),
    )
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        for _ in range(40):
            conn.execute("INSERT INTO other.noise (pad) SELECT repeat('x', 1000) FROM generate_series(1, 200)")
        noise_end = conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()

        def slot_confirmed() -> tuple[str, bool] | None:
            return conn.execute(
                "SELECT confirmed_flush_lsn::text, confirmed_flush_lsn >= %s::pg_lsn FROM pg_replication_slots"
                " WHERE database = current_database()",
                noise_end,
            ).fetchone()

        wait_for(  # capture confirms past the noise, of which it was sent nothing
            lambda: bool((slot_confirmed() or (None, False))[1]),
            what="the slot confirmed past the uncaptured WAL",
            progress=slot_confirmed,
        )
        lag = conn.execute(
            "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn) FROM pg_replication_slots WHERE database = current_database()"
        ).fetchone()
    proc.communicate(timeout=60)
    assert lag is not None and lag[0] < 1_000_000, f"slot still holds {lag[0]} bytes of WAL"
    assert records(tmp_path / "log", "shop.other.noise") == []
