"""Capture's guarantees on every log backend, as a user runs it (the CLI, a real Postgres): the
snapshot hands over to the stream under writes, kill -9 at random moments loses and duplicates
nothing for a read_committed reader, SIGTERM commits and exits 0, captures of two sources run side
by side and each resumes from its own position."""

from __future__ import annotations

import json
import os
import random
import signal
import threading
import time
from functools import partial
from pathlib import Path

import psycopg
import pytest

from tests.backends import LogBackend, changes, table_state, write_backend_config
from tests.integration.capture.helpers import capture_progress, cli, source_status, spawn_capture, wait_for
from tributary.capture.decoding.lsn import Lsn

pytestmark = pytest.mark.integration

# (kills, shortest life s, longest life s): a Kafka capture spends its first second starting its
# transactional producer, so shorter lives would kill it before it commits anything.
KILLS = {"local": (20, 0.8, 2.0), "kafka": (8, 1.5, 3.0)}


def _expected_rows(dsn: str) -> dict[str, dict[str, object]]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute("SELECT id, n::text, note FROM items ORDER BY id").fetchall()
    return {f'{{"id":{r[0]}}}': {"id": r[0], "n": r[1], "note": r[2]} for r in rows}


def _random_writes(dsn: str, stop: threading.Event, seed: int) -> int:
    """Inserts, updates and deletes of random rows until `stop`: how many transactions."""
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


def test_snapshot_hand_over_under_concurrent_writes(fresh_db: str, tmp_path: Path, backend: LogBackend) -> None:
    topic = "shop.public.items"
    backend.prepare(topic)
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE items (id int PRIMARY KEY, n numeric(30, 3), note text)")
        conn.execute("INSERT INTO items SELECT g, g * 1.5, 'seed' FROM generate_series(1, 5000) g")
    log_root = tmp_path / "log"
    config = write_backend_config(backend, tmp_path / "t.toml", dsn=fresh_db, log_root=log_root)
    stop = threading.Event()
    writer = threading.Thread(target=_random_writes, args=(fresh_db, stop, 1))
    writer.start()
    proc = spawn_capture(config, "--until-idle", "3")
    try:
        wait_for(  # the snapshot handed over to the stream while the writer writes
            lambda: source_status(log_root, proc.pid).get("changes", 0) > 0,
            what="changes streamed after the snapshot",
            progress=lambda: capture_progress(log_root),
        )
    finally:
        stop.set()
        writer.join()
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    records = backend.records(log_root, topic)
    got = table_state(records)
    want = _expected_rows(fresh_db)
    assert got.keys() == want.keys()
    for key, row in want.items():
        assert {k: got[key][k] for k in row} == row, key
    snap = [c for c in changes(records) if c["op"] == "r"]
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
            time.sleep(0.001)


def test_kill_9_at_random_moments_loses_and_duplicates_nothing(
    fresh_db: str, tmp_path: Path, backend: LogBackend
) -> None:
    backend.prepare("shop.public.ledger", "shop.public.counters")
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE ledger (id int PRIMARY KEY, amount int)")
        conn.execute("CREATE TABLE counters (k int PRIMARY KEY, v int NOT NULL)")
        conn.execute("INSERT INTO counters SELECT g, 0 FROM generate_series(0, 4) g")
    log_root = tmp_path / "log"
    config = write_backend_config(backend, tmp_path / "t.toml", dsn=fresh_db, log_root=log_root)
    stop, committed = threading.Event(), list[int]()
    writer = threading.Thread(target=_ledger_writer, args=(fresh_db, stop, committed))
    writer.start()
    rng = random.Random(42)
    kills, shortest, longest = KILLS[backend.name]
    try:
        for _ in range(kills):
            proc = spawn_capture(config)
            time.sleep(rng.uniform(shortest, longest))
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
    finally:
        stop.set()
        writer.join()
    final = cli("capture", "--config", str(config), "--until-idle", "2")
    assert final.returncode == 0, final.stderr
    ledger = [c for c in changes(backend.records(log_root, "shop.public.ledger")) if c["op"] in ("c", "r")]
    ids = [c["after"]["id"] for c in ledger]
    assert len(ids) == len(set(ids)), "a change was captured twice"
    assert sorted(ids) == sorted(committed), "a committed change is missing"
    # Per key, the counter's updates arrive in commit order: values strictly increase.
    per_key: dict[int, list[int]] = {}
    for c in changes(backend.records(log_root, "shop.public.counters")):
        per_key.setdefault(c["after"]["k"], []).append(c["after"]["v"])
    for k, values in per_key.items():
        assert values == sorted(set(values)), f"counter {k} out of order or duplicated"
    with psycopg.connect(fresh_db) as conn:
        final_counts: dict[int, int] = dict(conn.execute("SELECT k, v FROM counters").fetchall())
    assert {k: v[-1] for k, v in per_key.items()} == final_counts


def test_sigterm_commits_and_exits_zero(fresh_db: str, tmp_path: Path, backend: LogBackend) -> None:
    backend.prepare("shop.public.t")
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY)")
        conn.execute("INSERT INTO t SELECT generate_series(1, 100)")
    log_root = tmp_path / "log"
    config = write_backend_config(backend, tmp_path / "t.toml", dsn=fresh_db, log_root=log_root)
    proc = spawn_capture(config)
    wait_for(
        lambda: source_status(log_root, proc.pid).get("state") == "streaming",
        what="capture streaming",
        progress=lambda: capture_progress(log_root),
    )
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        conn.execute("INSERT INTO t SELECT generate_series(101, 150)")
    wait_for(
        lambda: source_status(log_root, proc.pid).get("changes", 0) >= 50,
        what="the inserts received",
        progress=lambda: capture_progress(log_root),
    )
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert len(table_state(backend.records(log_root, "shop.public.t"))) == 150
    status = cli("capture", "status", "--config", str(config), "--json")
    assert status.returncode == 0, status.stderr
    (source,) = json.loads(status.stdout)["sources"]
    assert source["name"] == "shop" and source["state"] == "stopped"
    assert source["changes"] == 50 and source["snapshot_rows_done"] == 100
    assert Lsn.parse(source["confirmed_lsn"]) >= Lsn.parse(source["last_lsn"])  # idle: may confirm further
    assert isinstance(source["slot_lag_bytes"], int) and source["slot_lag_bytes"] >= 0


def _reached(log_root: Path, pid: int, name: str, field: str, want: object) -> bool:
    """Source `name` of capture `pid` shows `want` in `field` (a count: at least `want`)."""
    got = source_status(log_root, pid, name).get(field)
    if isinstance(want, int):
        return isinstance(got, int) and got >= want
    return bool(got == want)


def test_captures_of_different_sources_run_side_by_side(fresh_db: str, tmp_path: Path, backend: LogBackend) -> None:
    """Two capture processes, one source each, one writer name (Kafka's transactional-id prefix):
    each source has its own writer, so neither fences the other; each resumes from its own position."""
    backend.prepare("shop.public.orders", "crm.public.people")
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE orders (id int PRIMARY KEY)")
        conn.execute("CREATE TABLE people (id int PRIMARY KEY)")
    roots = {name: tmp_path / f"log-{name}" for name in ("shop", "crm")}
    configs = {
        name: write_backend_config(
            backend,
            tmp_path / f"{name}.toml",
            dsn=fresh_db,
            log_root=roots[name],
            name=name,
            writer_id="shared",
        )
        for name in roots
    }
    for name, table in (("shop", "orders"), ("crm", "people")):
        text = configs[name].read_text()
        configs[name].write_text(text.replace('include = ["public.*"]', f'include = ["public.{table}"]'))
    procs = {name: spawn_capture(config) for name, config in configs.items()}
    try:
        for name, proc in procs.items():
            wait_for(
                partial(_reached, roots[name], proc.pid, name, "state", "streaming"),
                what=f"{name} streaming",
                progress=partial(capture_progress, roots[name]),
            )
        for round_ in range(3):
            with psycopg.connect(fresh_db, autocommit=True) as conn:
                for i in range(20):
                    conn.execute("INSERT INTO orders VALUES (%s)", (round_ * 20 + i,))
                    conn.execute("INSERT INTO people VALUES (%s)", (round_ * 20 + i,))
            for name, proc in procs.items():  # each captured the round
                wait_for(
                    partial(_reached, roots[name], proc.pid, name, "changes", 20 * (round_ + 1)),
                    what=f"{name} capturing round {round_}",
                    progress=partial(capture_progress, roots[name]),
                )
            for proc in procs.values():
                assert proc.proc.poll() is None, proc.communicate(5)[1]
    finally:
        for proc in procs.values():
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=30)
    for name, proc in procs.items():
        assert proc.returncode == 0, f"{name}: {proc.communicate(5)[1]}"
    for config in configs.values():  # each resumes from its own position: nothing again
        again = cli("capture", "--config", str(config), "--until-idle", "1")
        assert again.returncode == 0, again.stderr
    for name, topic in (("shop", "shop.public.orders"), ("crm", "crm.public.people")):
        ids = [c["after"]["id"] for c in changes(backend.records(roots[name], topic))]
        assert sorted(ids) == list(range(60)), topic
