"""Proof by breaking it, on the Kafka backend: pgbench writes while capture is killed -9 several
times and restarted. A read_committed consumer then sees every change exactly once — each
pgbench_history insert once by key, each account update once by its LSN — and the compacted state
(the latest record per key) equals every table, row for row."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import psycopg
import pytest

from tests.integration.capture.helpers import Capture, capture_progress, cli, spawn_capture, wait_for
from tests.integration.capture.test_chunked_pgbench import _pgbench, _table
from tests.integration.kafka.helpers import Change, read_committed, without_replays, write_kafka_config
from tests.kafka_fixtures import ON_BROKER, KafkaCluster
from tests.waiting import run_process, size_of, wait_exit
from tributary.capture.status import read_status

# pgbench and kill -9s on a slow machine; on the real broker, where a killed writer's open transaction is aborted
pytestmark = [pytest.mark.integration, pytest.mark.timeout(1800), ON_BROKER]

TABLES = ("pgbench_accounts", "pgbench_branches", "pgbench_tellers", "pgbench_history")
TOPICS = [f"shop.public.{t}" for t in TABLES]
KILLS = 4
RATE = 150  # pgbench transactions per second (-R): enough changes per run, little CPU
ACCOUNTS = 2_000  # the accounts kept: the mock cluster keeps only the newest records of a partition (a few MB)
# pgbench's built-in TPC-B-like transaction, on the accounts kept.
SCRIPT = f"""\\set aid random(1, {ACCOUNTS})
\\set bid 1
\\set tid random(1, 10)
\\set delta random(-5000, 5000)
BEGIN;
UPDATE pgbench_accounts SET abalance = abalance + :delta WHERE aid = :aid;
SELECT abalance FROM pgbench_accounts WHERE aid = :aid;
UPDATE pgbench_tellers SET tbalance = tbalance + :delta WHERE tid = :tid;
UPDATE pgbench_branches SET bbalance = bbalance + :delta WHERE bid = :bid;
INSERT INTO pgbench_history (tid, bid, aid, delta, mtime) VALUES (:tid, :bid, :aid, :delta, CURRENT_TIMESTAMP);
END;
"""


def _streaming(status_root: Path, pid: int) -> bool:
    """This capture process reports the source streaming (its snapshot, if any, committed)."""
    doc = read_status(status_root) or {}
    if doc.get("pid") != pid:
        return False
    return any(s["name"] == "shop" and s.get("state") == "streaming" for s in doc.get("sources", []))


def _changes(status_root: Path, pid: int) -> int:
    """Changes this capture process has streamed (0 before it streams)."""
    doc = read_status(status_root) or {}
    if doc.get("pid") != pid:
        return 0
    return sum(s.get("changes", 0) for s in doc.get("sources", []) if s["name"] == "shop")


def _kill(proc: Capture) -> None:
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)


def _prepare(dsn: str, tmp_path: Path, kafka: KafkaCluster) -> tuple[Path, Path]:
    """pgbench's tables (ACCOUNTS accounts, a key on history), its script and a capture config of
    them on `kafka` (topics with the cluster's replication factor): (script, config)."""
    init = run_process([_pgbench(), "-i", "-s", "1", "-q", dsn], what="pgbench -i")
    assert init.returncode == 0, init.stderr
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("ALTER TABLE pgbench_history ADD COLUMN id bigserial PRIMARY KEY")  # a key to capture by
        conn.execute("DELETE FROM pgbench_accounts WHERE aid > %s", (ACCOUNTS,))
    script = tmp_path / "tpcb.sql"
    script.write_text(SCRIPT)
    kafka.prepare(*TOPICS)
    config = write_kafka_config(
        tmp_path / "kafka.toml",
        dsn=dsn,
        log_root=tmp_path / "kstatus",
        bootstraps=kafka.bootstraps,
        create_topics=kafka.creates_topics,
        replication_factor=kafka.replicas,
    )
    config.write_text(config.read_text().replace('include = ["public.*"]', 'include = ["public.pgbench_*"]'))
    return script, config


def test_pgbench_with_kill_9s_is_exactly_once_on_kafka(fresh_db: str, tmp_path: Path, kafka: KafkaCluster) -> None:
    pgbench = _pgbench()
    script, config = _prepare(fresh_db, tmp_path, kafka)
    status_root = tmp_path / "kstatus"

    proc = spawn_capture(config)
    bench: subprocess.Popen[bytes] | None = None
    bench_err = tmp_path / "pgbench.err"
    rng = random.Random(21)
    kills = 0
    try:
        wait_for(
            lambda: _streaming(status_root, proc.pid),
            timeout=60,
            what="the snapshot to be committed",
            progress=lambda: (capture_progress(status_root), size_of(proc.err_path)),
        )
        with bench_err.open("wb") as err:  # every pgbench transaction commits after the snapshot point
            bench = subprocess.Popen(
                [pgbench, "-n", "-c", "2", "-R", str(RATE), "-T", "3600", "-f", str(script), fresh_db],
                stdout=subprocess.DEVNULL,
                stderr=err,
            )
        for _ in range(KILLS):
            pid = proc.pid
            wait_for(
                lambda pid=pid: _streaming(status_root, pid),
                timeout=60,
                what="capture streaming again",
                progress=lambda: capture_progress(status_root),
            )
            # pgbench's changes flow through capture meanwhile: some hundreds, then a kill at a random moment
            some = rng.randint(RATE, 3 * RATE)
            wait_for(
                lambda pid=pid, some=some: _changes(status_root, pid) >= some,
                what=f"{some} changes streamed",
                progress=lambda: capture_progress(status_root),
            )
            time.sleep(rng.uniform(0.0, 0.5))
            assert bench.poll() is None, f"pgbench ended early: {bench_err.read_text()}"
            _kill(proc)
            kills += 1
            proc = spawn_capture(config)
        pid = proc.pid  # pgbench goes on against the restarted capture, until that streamed some of it
        wait_for(
            lambda: _streaming(status_root, pid) and _changes(status_root, pid) > 0,
            what="the restarted capture streaming pgbench",
            progress=lambda: capture_progress(status_root),
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
    assert kills == KILLS
    final = cli("capture", "--config", str(config), "--until-idle", "2", progress=lambda: capture_progress(status_root))
    assert final.returncode == 0, final.stderr

    assert_exactly_once(kafka, fresh_db)


def assert_exactly_once(kafka: KafkaCluster, dsn: str) -> None:
    """The oracle: what a read_committed consumer sees holds every committed change once, and
    the latest record per key equals every table, row for row."""
    seen = read_committed(kafka.bootstraps, TOPICS)
    records: list[Change] = []
    for topic, _, _, key, value, _, _ in sorted(seen, key=lambda s: (s[0], s[1], s[2])):  # offset order
        change = {} if value is None else orjson.loads(value)  # {}: a tombstone
        if value is None or "op" in change:  # not a schema record
            records.append((topic, key, change))
    if not kafka.hides_open_transactions:  # the mock: a kill mid-commit shows what is sent again
        records, _ = without_replays(records)
    changes: dict[str, list[dict[str, Any]]] = {t: [] for t in TABLES}
    state: dict[str, dict[bytes, dict[str, Any] | None]] = {t: {} for t in TABLES}
    for topic, key, change in records:
        table = topic.rsplit(".", 1)[1]
        assert key is not None
        if change:
            changes[table].append(change)
        state[table][key] = change.get("after")  # None for a tombstone

    # Every change exactly once: each history row's insert once by key ...
    history = _table(dsn, "pgbench_history")
    assert len(history) > 300, "pgbench ran"
    inserts = Counter(orjson.dumps({"id": c["after"]["id"]}).decode() for c in changes["pgbench_history"])
    assert not [k for k, n in inserts.items() if n != 1], "a history insert was seen twice"
    assert inserts.keys() == history.keys(), f"{len(inserts)} history inserts seen, {len(history)} rows"
    # ... each account update once (by its LSN), one per pgbench transaction naming the account ...
    updates = [(c["source"]["lsn"], c["after"]["aid"]) for c in changes["pgbench_accounts"] if c["op"] == "u"]
    assert len(updates) == len(set(updates)), "an account update was seen twice"
    assert Counter(aid for _, aid in updates) == Counter(row["aid"] for row in history.values())
    reads = [c["after"]["aid"] for c in changes["pgbench_accounts"] if c["op"] == "r"]
    assert len(reads) == len(set(reads)) == ACCOUNTS, "the snapshot's rows once each"
    # ... and the compacted state (the latest record per key) equals every table, row for row.
    for table in TABLES:
        latest = {k.decode(): row for k, row in state[table].items() if row is not None}
        want = _table(dsn, table)
        assert latest.keys() == want.keys(), f"{table}: {len(latest)} keys on Kafka, {len(want)} rows"
        assert latest == want, table
