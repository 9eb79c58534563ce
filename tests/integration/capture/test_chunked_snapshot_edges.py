"""Chunked snapshots' edges (capture/snapshot/chunked.py): the row estimate after a resume, a pending
delete check kept across `log verify --repair`, a keyless table refused once (and snapshotted once
it has a key), a refused signal logged as a refusal."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import orjson
import psycopg
import pytest

from tests import waiting
from tests.integration.capture.helpers import (
    changes,
    cli,
    confirmed_past,
    status_progress,
    wait_for,
    wal_position,
    write_config,
)
from tests.integration.capture.test_chunked_snapshot import _chunked, _drop_slots, _spec
from tests.integration.capture.test_resnapshot import FILL, TABLES, _change_while_slot_gone, _compacted, _slot, _table
from tests.pg import REPO_ROOT
from tributary.capture.daemon import CaptureDaemon, DaemonOptions
from tributary.capture.snapshot.chunked import ChunkedSnapshot
from tributary.log.local import Log

pytestmark = pytest.mark.integration

# A capture that dies (as kill -9) when it has read its third chunk of rows.
_CRASH_IN_ROWS = """
import os, sys
from tributary.capture.snapshot.chunked import ChunkedSnapshot
seen = []
def crash(table, phase):
    seen.append(phase)
    if seen.count("rows") == 3:
        os._exit(9)
ChunkedSnapshot.after_read = crash
from tributary.api.cli.main import main
sys.argv = ["tributary", "capture", "--config", sys.argv[1]]
main()
"""


def _crash_in_rows(config: Path) -> None:
    crashed = waiting.run_process(
        [sys.executable, "-c", _CRASH_IN_ROWS, str(config)],
        what="capture crashing in its rows",
        cwd=REPO_ROOT,
        progress=lambda: waiting.size_of(config.parent),  # its log and files
    )
    assert crashed.returncode == 9, crashed.stderr


def test_a_resumed_chunked_snapshot_shows_the_tables_estimate(
    fresh_db: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    total = 3000
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        conn.execute(TABLES["items"])
        conn.execute(FILL["items"].format(n=total))
        conn.execute("ANALYZE items")  # the estimate is the catalog's
    config = _chunked(write_config(tmp_path / "t.toml", dsn=fresh_db, log_root=tmp_path / "log"), 200)
    _crash_in_rows(config)
    with Log.open(tmp_path / "log") as log:
        saved = orjson.loads(log.positions()["shop#snapshot"])
    assert saved["pending"] == ["public.items"] and 0 < saved["rows"] < total, saved

    release = threading.Event()
    monkeypatch.setattr(ChunkedSnapshot, "after_read", lambda table, phase: release.wait(30))
    spec = _spec("shop", fresh_db, slot=_slot(config), snapshot_chunk_rows=200)
    daemon = CaptureDaemon([spec], DaemonOptions(log_root=tmp_path / "log", default_partitions=3))
    runner = threading.Thread(target=daemon.run)
    runner.start()
    try:
        session = daemon.sessions[0]
        moving = status_progress(tmp_path / "log", session.status)
        wait_for(
            lambda: session.chunked is not None and session.chunked.job is not None,
            what="the resumed chunk",
            progress=moving,
        )
        status = session.status
        assert status.snapshot_rows_done == saved["rows"]
        assert status.snapshot_rows_total >= total * 0.9, (status.snapshot_rows_done, status.snapshot_rows_total)
        release.set()
        wait_for(lambda: not session.snapshotting, timeout=60, what="the snapshot's end", progress=moving)
    finally:
        release.set()
        daemon.request_stop()
        waiting.wait_threads([runner], what="the daemon to stop", progress=lambda: waiting.size_of(tmp_path / "log"))
        _drop_slots(fresh_db, spec)
    assert _compacted(config, "shop.public.items") == _table(fresh_db, "items")


def test_a_pending_delete_check_survives_log_verify_repair(fresh_db: str, tmp_path: Path) -> None:
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        for ddl in TABLES.values():
            conn.execute(ddl)
        conn.execute(FILL["items"].format(n=2000))
    config = _chunked(write_config(tmp_path / "t.toml", dsn=fresh_db, log_root=tmp_path / "log"), 300)
    config.write_text(
        config.read_text().replace('include = ["public.*"]', 'include = ["public.items"]\nsnapshot = "when_needed"')
    )
    res = cli("capture", "--config", str(config), "--until-idle", "1")
    assert res.returncode == 0, res.stderr
    _change_while_slot_gone(fresh_db, config)  # deletes rows: the re-snapshot's check must delete them
    _crash_in_rows(config)
    with Log.open(tmp_path / "log") as log:
        saved = orjson.loads(log.positions()["shop#snapshot"])
    assert saved["pending"] == ["public.items"] and saved["check"] == ["public.items"], saved
    (tmp_path / "log" / "manifest.json").unlink()
    res = cli("log", "verify", "--repair", "--root", str(tmp_path / "log"))
    assert res.returncode == 0, res.stderr
    with Log.open(tmp_path / "log") as log:
        rebuilt = orjson.loads(log.positions()["shop#snapshot"])
    assert rebuilt["pending"] == ["public.items"] and rebuilt["check"] == ["public.items"], rebuilt
    res = cli("capture", "--config", str(config), "--until-idle", "1", timeout=300)
    assert res.returncode == 0, res.stderr
    assert _compacted(config, "shop.public.items") == _table(fresh_db, "items")


def test_a_keyless_table_is_refused_once_and_snapshotted_once_it_has_a_key(fresh_db: str, tmp_path: Path) -> None:
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        conn.execute(TABLES["items"])
        conn.execute(FILL["items"].format(n=500))
        conn.execute("CREATE TABLE keyless (a int NOT NULL, b text)")
        conn.execute("ALTER TABLE keyless REPLICA IDENTITY FULL")  # streamed whole; no key to chunk by
        conn.execute("INSERT INTO keyless SELECT g, 'k' || g FROM generate_series(1, 40) g")
    config = _chunked(write_config(tmp_path / "t.toml", dsn=fresh_db, log_root=tmp_path / "log"), 200)
    res = cli("capture", "--config", str(config), "--until-idle", "1")
    assert res.returncode == 0, res.stderr
    refusals = [line for line in res.stderr.splitlines() if "public.keyless" in line and "WARNING" in line]
    assert len(refusals) == 1, res.stderr
    assert "primary key" in refusals[0] and "next start" in refusals[0], refusals[0]
    with Log.open(tmp_path / "log") as log:
        assert orjson.loads(log.positions()["shop#snapshot"])["keyless"] == ["public.keyless"]

    res = cli("capture", "--config", str(config), "--until-idle", "1")
    assert res.returncode == 0, res.stderr
    assert "public.keyless" not in res.stderr, "said once, not at every start"
    assert not [c for c in changes(tmp_path / "log", "shop.public.keyless") if c["op"] == "r"]

    with psycopg.connect(fresh_db, autocommit=True) as conn:
        conn.execute("ALTER TABLE keyless ADD PRIMARY KEY (a), REPLICA IDENTITY DEFAULT")
    res = cli("capture", "--config", str(config), "--until-idle", "1", timeout=300)
    assert res.returncode == 0, res.stderr
    assert sum(1 for c in changes(tmp_path / "log", "shop.public.keyless") if c["op"] == "r") == 40
    with Log.open(tmp_path / "log") as log:
        saved = orjson.loads(log.positions()["shop#snapshot"])
    assert saved["keyless"] == [] and "public.keyless" in saved["done"], saved


def test_a_refused_signal_is_logged_as_a_refusal(fresh_db: str, tmp_path: Path) -> None:
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        conn.execute(TABLES["items"])
        conn.execute(FILL["items"].format(n=100))
        conn.execute("CREATE TABLE keyless (a int)")
    config = write_config(tmp_path / "t.toml", dsn=fresh_db, log_root=tmp_path / "log")
    config.write_text(
        config.read_text().replace('include = ["public.*"]', 'include = ["public.*"]\nexclude = ["public.hidden"]')
    )
    res = cli("capture", "--config", str(config), "--until-idle", "1")
    assert res.returncode == 0, res.stderr
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE hidden (id int PRIMARY KEY)")
        signal = {"type": "execute-snapshot", "tables": ["public.keyless", "public.hidden", "public.items"]}
        conn.execute("SELECT pg_logical_emit_message(true, 'tributary.signal', %s)", (orjson.dumps(signal).decode(),))
    res = cli("capture", "--config", str(config), "--until-idle", "1", timeout=300)
    assert res.returncode == 0, res.stderr
    lines = res.stderr.splitlines()
    for table, reason in (("public.keyless", "primary key"), ("public.hidden", "not an included table")):
        said = [line for line in lines if table in line]
        assert len(said) == 1, said
        assert "refused" in said[0] and reason in said[0] and "requested (" not in said[0], said[0]
    assert any("public.items" in line and "requested" in line for line in lines), res.stderr
    assert sum(1 for c in changes(tmp_path / "log", "shop.public.items") if c["op"] == "r") == 200


def test_a_schema_change_inside_a_chunks_window_makes_it_be_read_again(
    fresh_db: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        conn.execute(TABLES["items"])
        conn.execute(FILL["items"].format(n=1200))
    reads: list[str] = []

    def change_in_the_first_window(table: str, phase: str) -> None:
        reads.append(phase)
        if len(reads) == 1:  # after the first chunk's read, before its watermark
            with psycopg.connect(fresh_db, autocommit=True) as conn:
                conn.execute("ALTER TABLE items ADD COLUMN extra int DEFAULT 7")
                conn.execute("UPDATE items SET note = 'after the change' WHERE id = 1100")

    monkeypatch.setattr(ChunkedSnapshot, "after_read", change_in_the_first_window)
    spec = _spec("shop", fresh_db, snapshot_chunk_rows=200)
    daemon = CaptureDaemon([spec], DaemonOptions(log_root=tmp_path / "log", default_partitions=3))
    runner = threading.Thread(target=daemon.run)
    runner.start()
    try:
        session = daemon.sessions[0]
        moving = status_progress(tmp_path / "log", session.status)
        wait_for(lambda: session.status.snapshot_rows_done > 0, timeout=60, what="the first chunk", progress=moving)
        wait_for(lambda: not session.snapshotting, timeout=60, what="the snapshot's end", progress=moving)
        last = wal_position(fresh_db)  # committed
        wait_for(lambda: confirmed_past(session.status, last), what=f"capture confirming {last}", progress=moving)
    finally:
        daemon.request_stop()
        waiting.wait_threads([runner], what="the daemon to stop", progress=lambda: waiting.size_of(tmp_path / "log"))
        _drop_slots(fresh_db, spec)
    assert session.status.snapshot_chunks_reread >= 1
    assert len(reads) == 1200 // 200 + 1, "the first chunk read twice, every other once"
    config = write_config(tmp_path / "t.toml", dsn=fresh_db, log_root=tmp_path / "log")

    def without_extra(rows: dict[bytes, dict[str, object]]) -> dict[bytes, dict[str, object]]:
        # rows streamed before the column was added lack it (as any record before a schema change)
        return {k: {c: v for c, v in row.items() if c != "extra"} for k, row in rows.items()}

    logged = _compacted(config, "shop.public.items")
    assert without_extra(logged) == without_extra(_table(fresh_db, "items"))
    assert logged[b'{"id":1}']["extra"] == 7, "the first chunk read again, after the change"
    assert logged[b'{"id":1100}']["note"] == "after the change"
