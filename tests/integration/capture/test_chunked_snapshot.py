"""Chunked snapshots beside streaming (capture/snapshot/chunked.py): chunk rows equal a consistent
snapshot's, a streamed change inside a chunk's window wins over the chunk row, a kill -9 resumes
from the last committed chunk, the other sources keep streaming, a widened `include` is
snapshotted."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import orjson
import psycopg
import pytest

from tests.integration.capture.helpers import (
    capture_progress,
    changes,
    cli,
    confirmed_past,
    records,
    spawn_capture,
    status_progress,
    wait_for,
    wal_position,
    write_config,
)
from tests.integration.capture.test_resnapshot import FILL, TABLES, _change_while_slot_gone, _compacted, _table
from tests.pg import REPO_ROOT
from tests.waiting import size_of, wait_threads
from tributary.capture.daemon import CaptureDaemon, DaemonOptions
from tributary.capture.snapshot.chunked import ChunkedSnapshot
from tributary.capture.spec import SourceSpec
from tributary.capture.status import read_status
from tributary.log.local import Log

pytestmark = pytest.mark.integration


def _chunked(config: Path, rows: int, extra: str = "") -> Path:
    text = config.read_text().replace(
        'include = ["public.*"]',
        f'include = ["public.*"]\nsnapshot_method = "chunked"\nsnapshot_chunk_rows = {rows}\n{extra}',
    )
    config.write_text(text)
    return config


def _without_position(value: dict[str, Any]) -> dict[str, Any]:
    """A snapshot record minus what says when and where it was read."""
    out = dict(value)
    out.pop("ts_ms", None)
    source = dict(out.pop("source"))
    for field in ("lsn", "ts_ms", "snapshot"):
        source.pop(field, None)
    out["source"] = source
    return out


def _by_key(log_root: Path, topic: str) -> dict[bytes, tuple[int, bytes]]:
    """Each key's snapshot record (its partition and value bytes)."""
    return {r.key: (r.partition, r.value) for r in records(log_root, topic) if r.value and b'"op":"r"' in r.value}


def test_chunked_records_equal_the_consistent_snapshots(fresh_db: str, tmp_path: Path) -> None:
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        for table, ddl in TABLES.items():
            conn.execute(ddl)
            conn.execute(FILL[table].format(n=2500))
    consistent = write_config(tmp_path / "c.toml", dsn=fresh_db, log_root=tmp_path / "c", name="shop")
    chunked = _chunked(write_config(tmp_path / "k.toml", dsn=fresh_db, log_root=tmp_path / "k", name="shop"), 700)
    for config in (consistent, chunked):
        res = cli("capture", "--config", str(config), "--until-idle", "1", timeout=300)
        assert res.returncode == 0, res.stderr
    markers = []
    for table in TABLES:
        topic = f"shop.public.{table}"
        want = _by_key(tmp_path / "c", topic)
        got = _by_key(tmp_path / "k", topic)
        assert len(want) == 2500 and got.keys() == want.keys(), table
        for key, (partition, value) in got.items():
            assert partition == want[key][0], "same partition"
            assert _without_position(orjson.loads(value)) == _without_position(orjson.loads(want[key][1])), table
        markers += [orjson.loads(v)["source"]["snapshot"] for _, v in got.values()]
        assert _compacted(chunked, topic) == _table(fresh_db, table)
    assert markers.count("last") == 1
    status = read_status(tmp_path / "k")
    assert status is not None
    source = status["sources"][0]
    assert source["snapshot_tables_pending"] == [] and source["snapshot_rows_read"] == 3 * 2500


def test_a_table_of_whole_chunks_still_marks_its_last_row(fresh_db: str, tmp_path: Path) -> None:
    """200 rows in chunks of 100: the second chunk reaches the table's end, so it is the last one
    and carries the snapshot's "last" mark (an empty third chunk would carry nothing)."""
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE whole (id int PRIMARY KEY, v text)")
        conn.execute("INSERT INTO whole SELECT i, 'v' || i FROM generate_series(1, 200) i")
    config = _chunked(write_config(tmp_path / "k.toml", dsn=fresh_db, log_root=tmp_path / "k", name="shop"), 100)
    res = cli("capture", "--config", str(config), "--until-idle", "1", timeout=300)
    assert res.returncode == 0, res.stderr
    got = _by_key(tmp_path / "k", "shop.public.whole")
    markers = [orjson.loads(v)["source"]["snapshot"] for _, v in got.values()]
    assert len(got) == 200 and markers.count("last") == 1


def _spec(name: str, dsn: str, **extra: Any) -> SourceSpec:
    fields: dict[str, Any] = {
        "name": name,
        "dsn": dsn,
        "slot": f"slot_{name}_{uuid.uuid4().hex[:8]}",
        "include": ("public.*",),
        "exclude": (),
        "snapshot": "initial",
        "partitions": 3,
        "snapshot_method": "chunked",
        "snapshot_chunk_rows": 100,
    }
    fields.update(extra)
    return SourceSpec(**fields)


def _drop_slots(dsn: str, *specs: SourceSpec) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for spec in specs:
            conn.execute(
                "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = %s",
                (spec.slot,),
            )


def test_a_streamed_change_inside_a_chunks_window_wins(
    fresh_db: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        for table in ("items", "docs", "points"):  # the columnar, JSON and per-row paths
            conn.execute(TABLES[table])
            conn.execute(FILL[table].format(n=450))
    changed: list[str] = []

    def between_read_and_watermark(table: str, phase: str) -> None:
        """Committed after the chunk's snapshot, streamed before its watermark: newer than the
        chunk's rows of the same keys, so those rows must not be staged after them."""
        low = changed.count(table) * 100 + 1  # the chunk just read: keys low .. low + 99
        changed.append(table)
        with psycopg.connect(fresh_db, autocommit=True) as conn:
            if table == "public.items":
                conn.execute("UPDATE items SET note = 'newer' WHERE id BETWEEN %s AND %s", (low, low + 9))
                conn.execute("DELETE FROM items WHERE id = %s", (low + 10,))
            elif table == "public.docs":
                conn.execute('UPDATE docs SET body = \'{"v": "newer"}\' WHERE id % 100 = 7')
                conn.execute("DELETE FROM docs WHERE id % 100 = 8")
            else:
                conn.execute("UPDATE points SET x = -2 WHERE a % 100 = 9")
                conn.execute("DELETE FROM points WHERE a % 100 = 10")

    monkeypatch.setattr(ChunkedSnapshot, "after_read", between_read_and_watermark)
    spec = _spec("shop", fresh_db)
    try:
        daemon = CaptureDaemon([spec], DaemonOptions(log_root=tmp_path / "log", default_partitions=3, until_idle_s=1.0))
        assert daemon.run() == 0
    finally:
        _drop_slots(fresh_db, spec)
    assert len(changed) >= 3 * 5
    config = write_config(tmp_path / "t.toml", dsn=fresh_db, log_root=tmp_path / "log")
    for table in TABLES:
        assert _compacted(config, f"shop.public.{table}") == _table(fresh_db, table), table


def test_other_sources_stream_while_a_slow_chunked_snapshot_runs(
    fresh_db: str, pg_server: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    other_db = pg_server.dsn(pg_server.create_database("other"))
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        conn.execute(TABLES["items"])
        conn.execute(FILL["items"].format(n=3000))
    with psycopg.connect(other_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE ticks (id int PRIMARY KEY)")
    slow = _spec("slow", fresh_db)  # 30 chunks of 100 rows
    other = _spec("other", other_db, snapshot_method="consistent")
    monkeypatch.setattr(ChunkedSnapshot, "after_read", lambda table, phase: time.sleep(0.3))
    daemon = CaptureDaemon([slow, other], DaemonOptions(log_root=tmp_path / "log", default_partitions=3))
    runner = threading.Thread(target=daemon.run)
    runner.start()
    try:
        source = daemon.sessions[0].status
        moving = status_progress(tmp_path / "log", *(s.status for s in daemon.sessions))
        wait_for(lambda: source.snapshot_rows_done > 0, what="the first chunk", progress=moving)
        with psycopg.connect(other_db, autocommit=True) as conn:
            for i in range(5):
                conn.execute("INSERT INTO ticks VALUES (%s)", (i,))
                wait_for(
                    lambda i=i: len(changes(tmp_path / "log", "other.public.ticks")) > i,
                    timeout=2.0,
                    what="the other source's insert in the log",
                    progress=moving,
                )
        assert source.snapshot_tables_pending == ["public.items"], "the snapshot still runs"
        assert source.snapshot_rows_done < 3000
        wait_for(lambda: not daemon.sessions[0].snapshotting, timeout=60, what="the snapshot's end", progress=moving)
    finally:
        daemon.request_stop()
        wait_threads([runner], what="the daemon to stop", progress=lambda: size_of(tmp_path / "log"))
        _drop_slots(fresh_db, slow)
        _drop_slots(other_db, other)
    config = write_config(tmp_path / "t.toml", dsn=fresh_db, log_root=tmp_path / "log", name="slow")
    assert _compacted(config, "slow.public.items") == _table(fresh_db, "items")


def test_a_table_growing_at_its_end_is_not_chased_forever(
    fresh_db: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each chunk of 100 rows lets 200 rows with larger keys in: the chunks stop at the table's
    largest key when its first chunk was read (the later rows arrive through the stream), so the
    snapshot ends while the table keeps growing, and the topic equals the table."""
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        conn.execute(TABLES["items"])
        conn.execute(FILL["items"].format(n=300))
    grown = [300]

    def grow(table: str, phase: str) -> None:
        with psycopg.connect(fresh_db, autocommit=True) as conn:
            conn.execute(FILL["items"].replace("1, {n}", "%s::int, %s::int"), (grown[0] + 1, grown[0] + 200))
        grown[0] += 200

    monkeypatch.setattr(ChunkedSnapshot, "after_read", grow)
    spec = _spec("shop", fresh_db)
    daemon = CaptureDaemon([spec], DaemonOptions(log_root=tmp_path / "log", default_partitions=3))
    runner = threading.Thread(target=daemon.run)
    runner.start()
    try:
        session = daemon.sessions[0]
        moving = status_progress(tmp_path / "log", session.status)
        wait_for(lambda: session.status.snapshot_rows_done > 0, timeout=60, what="the first chunk", progress=moving)
        wait_for(lambda: not session.snapshotting, timeout=60, what="the snapshot's end", progress=moving)
        assert session.status.snapshot_rows_read < grown[0]
        monkeypatch.setattr(ChunkedSnapshot, "after_read", None)
        last = wal_position(fresh_db)  # the last inserts streamed and committed
        wait_for(lambda: confirmed_past(session.status, last), what=f"capture confirming {last}", progress=moving)
    finally:
        daemon.request_stop()
        wait_threads([runner], what="the daemon to stop", progress=lambda: size_of(tmp_path / "log"))
        _drop_slots(fresh_db, spec)
    config = write_config(tmp_path / "t.toml", dsn=fresh_db, log_root=tmp_path / "log")
    assert _compacted(config, "shop.public.items") == _table(fresh_db, "items")


def test_kill_9_mid_chunked_snapshot_resumes_from_the_last_committed_chunk(fresh_db: str, tmp_path: Path) -> None:
    total = 200_000
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        conn.execute(TABLES["items"])
        conn.execute(FILL["items"].format(n=total))
    config = _chunked(write_config(tmp_path / "t.toml", dsn=fresh_db, log_root=tmp_path / "log"), 2000)
    capture = spawn_capture(config)
    try:

        def far_enough() -> bool:
            doc = read_status(tmp_path / "log")
            return bool(doc) and doc["sources"][0]["snapshot_rows_done"] >= total // 3

        wait_for(
            far_enough,
            timeout=120,
            what="a third of the chunked snapshot",
            progress=lambda: capture_progress(tmp_path / "log"),
        )
        with psycopg.connect(fresh_db, autocommit=True) as conn:  # streamed while it runs
            conn.execute("UPDATE items SET note = 'during' WHERE id % 1000 = 1")
            conn.execute("DELETE FROM items WHERE id % 1000 = 2")
        os.kill(capture.pid, signal.SIGKILL)
        capture.wait(timeout=30)
    finally:
        if capture.returncode is None:
            capture.send_signal(signal.SIGKILL)
            capture.wait(timeout=30)
    with Log.open(tmp_path / "log") as log:
        saved = orjson.loads(log.positions()["shop#snapshot"])
    assert saved["pending"] == ["public.items"] and saved["rows"] > 0, "a committed chunk survives the kill"
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        conn.execute("UPDATE items SET note = 'after' WHERE id % 1000 = 3")
        conn.execute("DELETE FROM items WHERE id % 1000 = 4")
    res = cli("capture", "--config", str(config), "--until-idle", "1", timeout=300)
    assert res.returncode == 0, res.stderr
    status = read_status(tmp_path / "log")
    assert status is not None
    source = status["sources"][0]
    assert source["snapshot_tables_pending"] == []
    assert 0 < source["snapshot_rows_read"] <= total - saved["rows"] + 2000, "resumed, not started again"
    assert _compacted(config, "shop.public.items") == _table(fresh_db, "items")


def test_a_table_added_to_include_is_snapshotted_while_the_others_stream(fresh_db: str, tmp_path: Path) -> None:
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        conn.execute(TABLES["items"])
        conn.execute(FILL["items"].format(n=500))
        conn.execute(TABLES["docs"])
        conn.execute(FILL["docs"].format(n=700))
    config = write_config(tmp_path / "t.toml", dsn=fresh_db, log_root=tmp_path / "log")
    config.write_text(config.read_text().replace('include = ["public.*"]', 'include = ["public.items"]'))
    res = cli("capture", "--config", str(config), "--until-idle", "1")
    assert res.returncode == 0, res.stderr
    assert not records(tmp_path / "log", "shop.public.docs")

    with psycopg.connect(fresh_db, autocommit=True) as conn:
        conn.execute("UPDATE items SET note = 'streamed' WHERE id <= 10")
        conn.execute('UPDATE docs SET body = \'{"v": "before widening"}\' WHERE id <= 10')
    config.write_text(config.read_text().replace('include = ["public.items"]', 'include = ["public.*"]'))
    res = cli("capture", "--config", str(config), "--until-idle", "1", timeout=300)
    assert res.returncode == 0, res.stderr
    assert "public.docs is included but was never snapshotted" in res.stderr
    status = read_status(tmp_path / "log")
    assert status is not None
    assert any("public.docs" in w for w in status["sources"][0]["warnings"])
    for table in ("items", "docs"):
        assert _compacted(config, f"shop.public.{table}") == _table(fresh_db, table), table
    docs = changes(tmp_path / "log", "shop.public.docs")
    assert sum(1 for c in docs if c["op"] == "r") == 700
    with Log.open(tmp_path / "log") as log:
        assert sorted(orjson.loads(log.positions()["shop#snapshot"])["done"]) == ["public.docs", "public.items"]


def test_a_chunked_resnapshot_deletes_what_the_table_no_longer_has(fresh_db: str, tmp_path: Path) -> None:
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        for table, ddl in TABLES.items():
            conn.execute(ddl)
            conn.execute(FILL[table].format(n=1500))
    config = _chunked(write_config(tmp_path / "t.toml", dsn=fresh_db, log_root=tmp_path / "log"), 400)
    config.write_text(
        config.read_text().replace('include = ["public.*"]', 'include = ["public.*"]\nsnapshot = "when_needed"')
    )
    res = cli("capture", "--config", str(config), "--until-idle", "1")
    assert res.returncode == 0, res.stderr
    _change_while_slot_gone(fresh_db, config)
    res = cli("capture", "--config", str(config), "--until-idle", "1", timeout=300)
    assert res.returncode == 0, res.stderr
    assert "taking a new snapshot" in res.stderr
    for table in TABLES:
        assert _compacted(config, f"shop.public.{table}") == _table(fresh_db, table), table


def test_request_snapshot_rereads_a_table_and_refuses_unknown_ones(fresh_db: str, tmp_path: Path) -> None:
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        conn.execute(TABLES["items"])
        conn.execute(FILL["items"].format(n=900))
        conn.execute("CREATE TABLE keyless (a int)")
    spec = _spec("shop", fresh_db, snapshot_method="consistent", snapshot_chunk_rows=250)
    daemon = CaptureDaemon([spec], DaemonOptions(log_root=tmp_path / "log", default_partitions=3))
    runner = threading.Thread(target=daemon.run)
    runner.start()
    topic = "shop.public.items"
    try:
        session = daemon.sessions[0]
        moving = status_progress(tmp_path / "log", session.status)
        wait_for(
            lambda: sum(1 for c in changes(tmp_path / "log", topic) if c["op"] == "r") == 900,
            what="the initial snapshot committed",
            progress=moving,
        )
        with psycopg.connect(fresh_db, autocommit=True) as conn:
            conn.execute("DELETE FROM items WHERE id > 800")
        session.request_snapshot(["public.items", "public.nope", "public.keyless"], origin="a test")
        wait_for(
            lambda: sum(1 for c in changes(tmp_path / "log", topic) if c["op"] == "r") == 900 + 800,
            timeout=60,
            what="the requested snapshot's rows",
            progress=moving,
        )
        wait_for(lambda: not session.snapshotting, what="the requested snapshot's end", progress=moving)
        warnings = " ".join(session.status.warnings)
        assert "public.nope (requested by a test) refused" in warnings
        assert "public.keyless (requested by a test) refused" in warnings
    finally:
        daemon.request_stop()
        wait_threads([runner], what="the daemon to stop", progress=lambda: size_of(tmp_path / "log"))
        _drop_slots(fresh_db, spec)
    with Log.open(tmp_path / "log") as log:
        saved = orjson.loads(log.positions()["shop#snapshot"])
    assert saved["pending"] == [] and "public.items" in saved["done"]
    config = write_config(tmp_path / "t.toml", dsn=fresh_db, log_root=tmp_path / "log")
    assert _compacted(config, topic) == _table(fresh_db, "items")


def test_concurrent_writes_during_a_chunked_snapshot_end_equal(
    fresh_db: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Transactions of inserts (the INSERT templates' path), updates and deletes run on every
    table while it is read in small chunks: each topic ends equal to its table."""
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        for table, ddl in TABLES.items():
            conn.execute(ddl)
            conn.execute(FILL[table].format(n=3000))
    stop = threading.Event()
    done = []

    errors: list[str] = []

    def write() -> None:
        try:
            write_until_stopped()
        except psycopg.Error as exc:
            errors.append(repr(exc))

    def write_until_stopped() -> None:
        rng = random.Random(7)
        with psycopg.connect(fresh_db, autocommit=True) as conn:
            n = 10_000
            while not stop.is_set():
                with conn.transaction():
                    for _ in range(rng.randint(1, 6)):
                        i = rng.randint(1, 3000)
                        op = rng.random()
                        if op < 0.3:
                            conn.execute("UPDATE items SET note = %s WHERE id = %s", (f"w{n}", i))
                            conn.execute("UPDATE points SET x = %s WHERE a = %s", (n / 7, i))
                        elif op < 0.45:
                            conn.execute("DELETE FROM items WHERE id = %s", (i,))
                            conn.execute("DELETE FROM docs WHERE id = %s", (i,))
                        elif op < 0.6:
                            conn.execute(
                                "UPDATE docs SET body = jsonb_build_object('w', %s::int) WHERE id = %s", (n, i)
                            )
                        else:
                            conn.execute(
                                "INSERT INTO items VALUES (%s, 1, 'new') ON CONFLICT (id) DO UPDATE SET note = 'upserted'",
                                (i,),
                            )
                            conn.execute(
                                "INSERT INTO items SELECT g, 2, 'run' FROM generate_series(%s::int, %s::int) g",
                                (n, n + 4),
                            )
                        n += 5
                    done.append(n)

    monkeypatch.setattr(ChunkedSnapshot, "after_read", lambda table, phase: time.sleep(0.05))  # a longer window
    writer = threading.Thread(target=write)
    writer.start()
    spec = _spec("shop", fresh_db, snapshot_chunk_rows=150)
    try:
        daemon = CaptureDaemon([spec], DaemonOptions(log_root=tmp_path / "log", default_partitions=3))
        runner = threading.Thread(target=daemon.run)
        runner.start()
        session = daemon.sessions[0]
        moving = status_progress(tmp_path / "log", session.status)
        wait_for(lambda: session.status.snapshot_rows_done > 0, timeout=60, what="the first chunk", progress=moving)
        wait_for(lambda: not session.snapshotting, timeout=120, what="the snapshot's end", progress=moving)
        stop.set()
        wait_threads([writer], what="the writer to stop", progress=lambda: None)
        last = wal_position(fresh_db)  # the writer's last transactions streamed and committed
        wait_for(lambda: confirmed_past(session.status, last), what=f"capture confirming {last}", progress=moving)
        daemon.request_stop()
        wait_threads([runner], what="the daemon to stop", progress=lambda: size_of(tmp_path / "log"))
    finally:
        stop.set()
        _drop_slots(fresh_db, spec)
    assert not errors
    assert len(done) > 10, "the writer ran during the snapshot"
    config = write_config(tmp_path / "t.toml", dsn=fresh_db, log_root=tmp_path / "log")
    for table in TABLES:
        assert _compacted(config, f"shop.public.{table}") == _table(fresh_db, table), table


_CRASH_IN_CHECK = """
import os, sys
from tributary.capture.snapshot.chunked import ChunkedSnapshot
seen = []
def crash(table, phase):
    seen.append(phase)
    if seen.count("absent") == 3:
        os._exit(9)  # as kill -9: nothing flushed, nothing committed
ChunkedSnapshot.after_read = crash
from tributary.api.cli.main import main
sys.argv = ["tributary", "capture", "--config", sys.argv[1]]
main()
"""


def test_a_crash_while_checking_keys_neither_deletes_a_live_key_nor_loses_a_delete(
    fresh_db: str, tmp_path: Path
) -> None:
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        for ddl in TABLES.values():
            conn.execute(ddl)
        conn.execute(FILL["items"].format(n=2000))
    config = _chunked(write_config(tmp_path / "t.toml", dsn=fresh_db, log_root=tmp_path / "log"), 400)
    config.write_text(
        config.read_text().replace('include = ["public.*"]', 'include = ["public.items"]\nsnapshot = "when_needed"')
    )
    res = cli("capture", "--config", str(config), "--until-idle", "1")
    assert res.returncode == 0, res.stderr
    _change_while_slot_gone(fresh_db, config)
    with psycopg.connect(fresh_db, autocommit=True) as conn:  # keys enough gone for three batches of deletes
        conn.execute("DELETE FROM items WHERE id % 2 = 0")
    crashed = subprocess.run(
        [sys.executable, "-c", _CRASH_IN_CHECK, str(config)], capture_output=True, text=True, timeout=120, cwd=REPO_ROOT
    )
    assert crashed.returncode == 9, crashed.stderr
    with Log.open(tmp_path / "log") as log:
        saved = orjson.loads(log.positions()["shop#snapshot"])
    assert saved["pending"] == ["public.items"] and saved["phase"] == "absent", saved
    assert saved["checked"] is not None, "a batch of keys checked before the crash was committed"
    res = cli("capture", "--config", str(config), "--until-idle", "1", timeout=300)
    assert res.returncode == 0, res.stderr
    assert _compacted(config, "shop.public.items") == _table(fresh_db, "items")
