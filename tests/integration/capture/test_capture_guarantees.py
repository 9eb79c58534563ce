"""Capture as a user runs it (the CLI, a real Postgres): snapshot hand-over, exactly once across
kill -9, server restarts and killed connections."""

from __future__ import annotations

import json
import os
import random
import signal
import threading
import time
from pathlib import Path

import psycopg
import pytest

from tests.integration.capture.helpers import (
    capture_progress,
    changes,
    cli,
    records,
    source_status,
    spawn_capture,
    table_state,
    wait_for,
    write_config,
)
from tests.pg import PgServer
from tributary.capture.decoding.lsn import Lsn

pytestmark = pytest.mark.integration


def _expected_rows(dsn: str) -> dict[str, dict[str, object]]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute("SELECT id, n::text, note FROM items ORDER BY id").fetchall()
    return {f'{{"id":{r[0]}}}': {"id": r[0], "n": r[1], "note": r[2]} for r in rows}


def _random_writes(dsn: str, stop: threading.Event, seed: int) -> int:
    rng = random.Random(seed)
    done = 0
    with psycopg.connect(dsn, autocommit=True) as conn:
        while not stop.is_set():
            k = rng.randint(1, 800)
            op = rng.random()
            with conn.transaction():
                if op < 0.5:
                    conn.execute(
                        "INSERT INTO items VALUES (%s, %s, 'w') ON CONFLICT (id) DO UPDATE SET n = items.n + 1",
                        (k, f"{rng.randint(0, 10**9)}.{rng.randint(0, 999):03d}"),
                    )
                elif op < 0.8:
                    conn.execute("UPDATE items SET note = note || 'u' WHERE id = %s", (k,))
                else:
                    conn.execute("DELETE FROM items WHERE id = %s", (k,))
            done += 1
            time.sleep(0.001)
    return done


def test_snapshot_hand_over_under_concurrent_writes(fresh_db: str, tmp_path: Path) -> None:
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE items (id int PRIMARY KEY, n numeric(30, 3), note text)")
        conn.execute("INSERT INTO items SELECT g, g * 1.5, 'seed' FROM generate_series(1, 5000) g")
    config = write_config(tmp_path / "t.toml", dsn=fresh_db, log_root=tmp_path / "log")
    stop = threading.Event()
    writer = threading.Thread(target=_random_writes, args=(fresh_db, stop, 1))
    writer.start()
    proc = spawn_capture(config, "--until-idle", "3")
    wait_for(  # the snapshot handed over to the stream while the writer writes
        lambda: source_status(tmp_path / "log", proc.pid).get("changes", 0) > 0,
        what="changes streamed after the snapshot",
        progress=lambda: capture_progress(tmp_path / "log"),
    )
    stop.set()
    writer.join()
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    got = table_state(tmp_path / "log", "shop.public.items")
    want = _expected_rows(fresh_db)
    assert got.keys() == want.keys()
    for key, row in want.items():
        assert {k: got[key][k] for k in row} == row, key
    snap = [c for c in changes(tmp_path / "log", "shop.public.items") if c["op"] == "r"]
    assert snap, "no snapshot rows"
    assert len(snap) == len({c["after"]["id"] for c in snap}) > 4000, "each row once (batches of 2,000)"
    assert sum(1 for c in snap if c["source"]["snapshot"] == "last") == 1


def _ledger_writer(dsn: str, stop: threading.Event, committed: list[int]) -> None:
    """Each transaction inserts one ledger row and bumps a counter; remembers what committed."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        i = 0
        while not stop.is_set():
            i += 1
            with conn.transaction():
                conn.execute("INSERT INTO ledger (id, amount) VALUES (%s, %s)", (i, i % 97))
                conn.execute("UPDATE counters SET v = v + 1 WHERE k = %s", (i % 5,))
            committed.append(i)


def test_kill_9_at_random_moments_loses_and_duplicates_nothing(fresh_db: str, tmp_path: Path) -> None:
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE ledger (id int PRIMARY KEY, amount int)")
        conn.execute("CREATE TABLE counters (k int PRIMARY KEY, v int NOT NULL)")
        conn.execute("INSERT INTO counters SELECT g, 0 FROM generate_series(0, 4) g")
    config = write_config(tmp_path / "t.toml", dsn=fresh_db, log_root=tmp_path / "log")
    stop, committed = threading.Event(), []
    writer = threading.Thread(target=_ledger_writer, args=(fresh_db, stop, committed))
    writer.start()
    rng = random.Random(42)
    try:
        for _ in range(20):
            proc = spawn_capture(config)
            time.sleep(rng.uniform(0.8, 2.0))
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
    finally:
        stop.set()
        writer.join()
    final = cli("capture", "--config", str(config), "--until-idle", "2")
    assert final.returncode == 0, final.stderr
    ledger = [c for c in changes(tmp_path / "log", "shop.public.ledger") if c["op"] in ("c", "r")]
    ids = [c["after"]["id"] for c in ledger]
    assert len(ids) == len(set(ids)), "a change was captured twice"
    assert sorted(ids) == sorted(committed), "a committed change is missing"
    # Per key, the counter's updates arrive in commit order: values strictly increase.
    per_key: dict[int, list[int]] = {}
    for c in changes(tmp_path / "log", "shop.public.counters"):
        per_key.setdefault(c["after"]["k"], []).append(c["after"]["v"])
    for k, values in per_key.items():
        assert values == sorted(set(values)), f"counter {k} out of order or duplicated"
    with psycopg.connect(fresh_db) as conn:
        final_counts = dict(conn.execute("SELECT k, v FROM counters").fetchall())
    assert {k: v[-1] for k, v in per_key.items()} == final_counts


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


def test_sigterm_commits_and_exits_zero(fresh_db: str, tmp_path: Path) -> None:
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY)")
        conn.execute("INSERT INTO t SELECT generate_series(1, 100)")
    config = write_config(tmp_path / "t.toml", dsn=fresh_db, log_root=tmp_path / "log")
    proc = spawn_capture(config)
    wait_for(
        lambda: source_status(tmp_path / "log", proc.pid).get("state") == "streaming",
        what="capture streaming",
        progress=lambda: capture_progress(tmp_path / "log"),
    )
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        conn.execute("INSERT INTO t SELECT generate_series(101, 150)")
    wait_for(
        lambda: source_status(tmp_path / "log", proc.pid).get("changes", 0) >= 50,
        what="the inserts received",
        progress=lambda: capture_progress(tmp_path / "log"),
    )
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert len(table_state(tmp_path / "log", "shop.public.t")) == 150
    status = cli("capture", "status", "--config", str(config), "--json")
    assert status.returncode == 0, status.stderr
    (source,) = json.loads(status.stdout)["sources"]
    assert source["name"] == "shop" and source["state"] == "stopped"
    assert source["changes"] == 50 and source["snapshot_rows_done"] == 100
    assert Lsn.parse(source["confirmed_lsn"]) >= Lsn.parse(source["last_lsn"])  # idle: may confirm further
    assert isinstance(source["slot_lag_bytes"], int) and source["slot_lag_bytes"] >= 0
