"""Triggered re-snapshots: `tributary capture snapshot TABLE` and an INSERT into the signal table
make capture read that table again, chunked, beside the stream (its rows arrive again as
`op: "r"`), whether capture runs at the time or starts later; other tables are not re-read."""

from __future__ import annotations

import signal
import time
from collections import Counter
from pathlib import Path

import orjson
import psycopg
import pytest

from tests.integration.capture.helpers import (
    capture_progress,
    cli,
    records,
    spawn_capture,
    table_state,
    wait_for,
    write_config,
)
from tributary.capture.status import read_status, snapshot_under_way
from tributary.log.local import LogError

pytestmark = pytest.mark.integration

ROWS = 300


def _setup(dsn: str, tmp_path: Path) -> Path:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
        conn.execute("INSERT INTO t SELECT g, 'v' || g FROM generate_series(1, %s) g", (ROWS,))
        conn.execute("CREATE TABLE u (id int PRIMARY KEY)")
        conn.execute("INSERT INTO u SELECT generate_series(1, 10)")
        conn.execute("CREATE TABLE public.tributary_signal (id text PRIMARY KEY, type text NOT NULL, data text)")
    return write_config(
        tmp_path / "t.toml",
        dsn=dsn,
        log_root=tmp_path / "log",
        source_extra='signal_table = "public.tributary_signal"\nsnapshot_chunk_rows = 100',
    )


def _reads(log_root: Path, table: str) -> Counter[bytes]:
    """How often each key of `table` was read by a snapshot (`op: "r"`)."""
    try:
        recs = records(log_root, f"shop.public.{table}")
    except LogError:
        return Counter()
    return Counter(r.key for r in recs if r.key and r.value and b'"op":"r"' in r.value)


def _each_read(log_root: Path, table: str, times: int, rows: int) -> bool:
    reads = _reads(log_root, table)
    return len(reads) == rows and all(n == times for n in reads.values())


def _done(log_root: Path, pid: int, since_ms: float) -> bool:
    """This capture's status, written after `since_ms`, shows no snapshot under way."""
    doc = read_status(log_root) or {}
    src = next(iter(doc.get("sources") or []), None)
    fresh = doc.get("pid") == pid and doc.get("updated_ms", 0) > since_ms
    return fresh and src is not None and not snapshot_under_way(src)


def _table(dsn: str) -> dict[str, dict[str, object]]:
    with psycopg.connect(dsn) as conn:
        rows = [r[0] for r in conn.execute("SELECT row_to_json(t) FROM t").fetchall()]
    return {orjson.dumps({"id": row["id"]}).decode(): row for row in rows}


def test_capture_snapshot_and_the_signal_table_reread_a_table_while_capture_runs(fresh_db: str, tmp_path: Path) -> None:
    config = _setup(fresh_db, tmp_path)
    log_root = tmp_path / "log"
    proc = spawn_capture(config)
    try:
        wait_for(
            lambda: _each_read(log_root, "t", 1, ROWS),
            timeout=60,
            what="the initial snapshot",
            progress=lambda: capture_progress(log_root),
        )
        res = cli("capture", "snapshot", "public.t", "--config", str(config))
        assert res.returncode == 0, res.stderr
        assert "snapshot of public.t requested from source shop" in res.stdout
        with psycopg.connect(fresh_db, autocommit=True) as conn:
            conn.execute("UPDATE t SET v = 'changed' WHERE id % 10 = 0")
        wait_for(
            lambda: _each_read(log_root, "t", 2, ROWS),
            timeout=60,
            what="t read again (capture snapshot)",
            progress=lambda: capture_progress(log_root),
        )
        # (a request for a table whose snapshot is still under way joins it: wait for its end)
        seen = time.time() * 1000
        wait_for(
            lambda: _done(log_root, proc.pid, seen),
            timeout=60,
            what="the snapshot's end in the status",
            progress=lambda: capture_progress(log_root),
        )

        with psycopg.connect(fresh_db, autocommit=True) as conn:
            conn.execute(
                """INSERT INTO tributary_signal VALUES ('ad-hoc-1', 'execute-snapshot', '{"tables": ["public.t"]}')"""
            )
            conn.execute("INSERT INTO t VALUES (%s, 'new')", (ROWS + 1,))
        wait_for(
            lambda: _reads(log_root, "t")[b'{"id":1}'] == 3,
            timeout=60,
            what="t read again (signal table)",
            progress=lambda: capture_progress(log_root),
        )
        wait_for(
            lambda: table_state(log_root, "shop.public.t") == _table(fresh_db),
            timeout=60,
            what="t in the log",
            progress=lambda: capture_progress(log_root),
        )
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert _reads(log_root, "u") == Counter({k: 1 for k in _reads(log_root, "u")}), "u was not re-read"
    assert len(_reads(log_root, "u")) == 10
    assert "chunked snapshot of public.t requested by signal message at" in err
    assert "chunked snapshot of public.t requested by public.tributary_signal row 'ad-hoc-1'" in err
    assert table_state(log_root, "shop.public.t") == _table(fresh_db)


def test_capture_snapshot_while_capture_is_stopped(fresh_db: str, tmp_path: Path) -> None:
    """The signal waits in the slot: the next start reads it where it was written."""
    config = _setup(fresh_db, tmp_path)
    log_root = tmp_path / "log"
    res = cli("capture", "--config", str(config), "--until-idle", "1")
    assert res.returncode == 0, res.stderr
    res = cli("capture", "snapshot", "public.u", "--config", str(config))
    assert res.returncode == 0, res.stderr
    res = cli("capture", "--config", str(config), "--until-idle", "2")
    assert res.returncode == 0, res.stderr
    assert _each_read(log_root, "u", 2, 10)
    assert _each_read(log_root, "t", 1, ROWS)
