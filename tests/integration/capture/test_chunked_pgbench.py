"""Proof by breaking it: pgbench writes while capture takes a chunked snapshot of its tables, and
capture is killed -9 several times (mid-snapshot and mid-stream) and restarted. At the end every
compacted topic equals its table row for row, and every pgbench transaction after the snapshot
point is in the log exactly once: each pgbench_history row's insert once, and the accounts'
balances are the sum of those inserts' deltas."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import psycopg
import pytest

from tests.integration.capture.helpers import (
    Capture,
    capture_progress,
    cli,
    records,
    spawn_capture,
    table_state,
    wait_for,
    write_config,
)
from tests.waiting import run_process, size_of, wait_exit
from tributary.api.devdb.embedded import find_bin_dir
from tributary.capture.status import read_status

pytestmark = [pytest.mark.integration, pytest.mark.timeout(1800)]  # pgbench and kill -9s on a slow machine

TABLES = {
    "pgbench_accounts": "aid",
    "pgbench_branches": "bid",
    "pgbench_tellers": "tid",
    "pgbench_history": "id",
}
SCALE = 2  # 200,000 accounts
CHUNK_ROWS = 4000  # pgbench_accounts: 50 chunks (a chunk waits for its watermark behind pgbench's stream)
PGBENCH_SECONDS = 3600  # an upper bound: the test stops pgbench once capture was killed mid-stream


def _pgbench() -> str:
    path = find_bin_dir() / "pgbench"
    found = str(path) if path.exists() else shutil.which("pgbench")
    if found is None:
        pytest.fail("pgbench (PostgreSQL 15 client binaries) is needed for this test")
    return found


def _table(dsn: str, table: str) -> dict[str, dict[str, Any]]:
    """{canonical key: row} as capture spells pgbench's columns (ints, text, timestamp)."""
    key = TABLES[table]
    with psycopg.connect(dsn) as conn:
        rows = [r[0] for r in conn.execute(f"SELECT row_to_json(t) FROM {table} t").fetchall()]  # noqa: S608
    return {orjson.dumps({key: row[key]}).decode(): row for row in rows}


def _source(log_root: Path, pid: int) -> dict[str, Any] | None:
    """This capture process's status entry (a killed one's file stays until the next writes)."""
    doc = read_status(log_root) or {}
    if doc.get("pid") != pid:
        return None
    return next((s for s in doc.get("sources", []) if s["name"] == "shop"), None)


def _kill(proc: Capture) -> None:
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)


def test_pgbench_during_a_chunked_snapshot_with_kill_9s(fresh_db: str, tmp_path: Path) -> None:
    pgbench = _pgbench()
    init = run_process([pgbench, "-i", "-s", str(SCALE), "-q", fresh_db], what="pgbench -i")
    assert init.returncode == 0, init.stderr
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        conn.execute("ALTER TABLE pgbench_history ADD COLUMN id bigserial PRIMARY KEY")  # a key to capture by
    log_root = tmp_path / "log"
    config = write_config(
        tmp_path / "t.toml",
        dsn=fresh_db,
        log_root=log_root,
        source_extra=f'snapshot_method = "chunked"\nsnapshot_chunk_rows = {CHUNK_ROWS}',
    )
    config.write_text(config.read_text().replace('include = ["public.*"]', 'include = ["public.pgbench_*"]'))
    slot = next(line.split('"')[1] for line in config.read_text().splitlines() if line.startswith("slot ="))

    proc = spawn_capture(config)
    bench: subprocess.Popen[bytes] | None = None
    bench_err = tmp_path / "pgbench.err"
    kills: list[str] = []
    try:

        def slot_exists() -> bool:
            with psycopg.connect(fresh_db, autocommit=True) as conn:
                return conn.execute("SELECT 1 FROM pg_replication_slots WHERE slot_name = %s", (slot,)).fetchone()

        wait_for(slot_exists, timeout=60, what="the slot (the snapshot point)", progress=lambda: size_of(proc.err_path))
        # Every pgbench transaction commits after the slot's consistent point.
        with bench_err.open("wb") as err:
            bench = subprocess.Popen(
                [pgbench, "-n", "-c", "2", "-T", str(PGBENCH_SECONDS), fresh_db], stdout=subprocess.DEVNULL, stderr=err
            )
        # kill -9 twice in the middle of the chunked snapshot, the second time further on
        at_least = 3
        for _ in range(2):
            pid = proc.pid

            def mid_snapshot(pid: int = pid, at_least: int = at_least) -> bool:
                src = _source(log_root, pid)
                return bool(src and src.get("snapshot_tables_pending") and src.get("snapshot_chunk", 0) >= at_least)

            wait_for(
                mid_snapshot,
                timeout=90,
                what=f"chunk {at_least} of the chunked snapshot",
                progress=lambda: capture_progress(log_root),
            )
            src = _source(log_root, pid) or {}
            kills.append(f"mid-snapshot: {src.get('snapshot_table')} chunk {src.get('snapshot_chunk')}")
            at_least = src.get("snapshot_chunk", 0) + 20
            _kill(proc)
            proc = spawn_capture(config)
        # ... and once mid-stream, the snapshot done, pgbench still writing
        pid = proc.pid

        def streaming(pid: int = pid) -> bool:
            src = _source(log_root, pid)
            return bool(src and src.get("state") == "streaming" and not src.get("snapshot_tables_pending"))

        wait_for(
            streaming, timeout=120, what="the chunked snapshot to finish", progress=lambda: capture_progress(log_root)
        )
        assert bench.poll() is None, f"pgbench ended early: {bench_err.read_text()}"
        kills.append("mid-stream")
        _kill(proc)
        proc = spawn_capture(config)
        pid = proc.pid

        def restarted_streams(pid: int = pid) -> bool:
            src = _source(log_root, pid)
            return bool(src and src.get("state") == "streaming" and src.get("changes", 0) > 0)

        # pgbench goes on against the restarted capture, until that captured some of it
        wait_for(
            restarted_streams,
            what="the restarted capture streaming pgbench",
            progress=lambda: capture_progress(log_root),
        )
        bench.send_signal(signal.SIGINT)  # its transaction in flight is rolled back, never half committed
        assert wait_exit(bench, what="pgbench to stop", progress=lambda: size_of(bench_err)) in (
            0,
            1,
            -signal.SIGINT,
        ), bench_err.read_text()
    finally:
        if bench is not None and bench.poll() is None:
            bench.kill()
            bench.wait()
        if proc.returncode is None:
            _kill(proc)
    assert len(kills) == 3, kills
    res = cli("capture", "--config", str(config), "--until-idle", "2", progress=lambda: capture_progress(log_root))
    assert res.returncode == 0, res.stderr

    # The compacted log equals every table, row for row.
    for table in TABLES:
        want = _table(fresh_db, table)
        got = table_state(log_root, f"shop.public.{table}")
        assert got.keys() == want.keys(), f"{table}: {len(got)} keys in the log, {len(want)} in the table"
        assert got == want, table

    # Every pgbench transaction is in the log once: its history insert exactly once by key ...
    history = [
        orjson.loads(r.value)
        for r in records(log_root, "shop.public.pgbench_history")
        if r.value and b'"op"' in r.value
    ]
    inserts = Counter(orjson.dumps(v["after"]["id"]) for v in history if v["op"] == "c")
    table_rows = _table(fresh_db, "pgbench_history")
    assert len(table_rows) > 1000, "pgbench ran"
    twice = [k for k, n in inserts.items() if n != 1]
    assert not twice, f"history rows inserted more than once in the log: {twice[:5]}"
    assert len(inserts) == len(table_rows), f"{len(inserts)} history inserts in the log, {len(table_rows)} rows"
    assert not [v for v in history if v["op"] in ("u", "d")]
    # ... and the accounts' balances are exactly the sum of the streamed deltas (all start at 0)
    deltas: Counter[int] = Counter()
    for v in history:
        if v["op"] == "c":
            deltas[v["after"]["aid"]] += v["after"]["delta"]
    accounts = table_state(log_root, "shop.public.pgbench_accounts")
    balances = {row["aid"]: row["abalance"] for row in accounts.values() if row["abalance"]}
    assert balances == {aid: d for aid, d in deltas.items() if d}
    # ... and each transaction's account update once: as many updates of an account as inserts naming it
    updates = Counter(
        orjson.loads(r.value)["after"]["aid"]
        for r in records(log_root, "shop.public.pgbench_accounts")
        if r.value and b'"op":"u"' in r.value
    )
    assert updates == Counter(v["after"]["aid"] for v in history if v["op"] == "c")
    # The chunked snapshot read every account, except those a newer streamed update overtook (a
    # chunk row never overwrites a newer change: it is dropped).
    reads = {
        orjson.loads(r.value)["after"]["aid"]
        for r in records(log_root, "shop.public.pgbench_accounts")
        if r.value and b'"op":"r"' in r.value
    }
    unread = set(range(1, 100_000 * SCALE + 1)) - reads
    assert len(reads) > 100_000 * SCALE * 0.9
    assert unread <= set(updates), f"accounts neither read nor updated: {sorted(unread - set(updates))[:5]}"
