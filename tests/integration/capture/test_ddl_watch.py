"""Schema changes that touch rows no later change shows, against a real server and a running
capture: the catalog watcher's notice (capture/streaming/ddl_watch.py) puts a schema record at the change,
`resnapshot_on_rewrite` makes the topic equal the table again after a rewrite (also of a table
being snapshotted), and a renamed table's rows move to its new topic while its old topic folds to
empty (also across a crash); a rename while capture is stopped is said at start."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import psycopg
import pytest

from tests import waiting
from tests.integration.capture.helpers import (
    ROOT,
    Capture,
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

ROWS = 40
DEADLINE_S = 120.0  # generous: the machine is shared; every wait ends as soon as its state is reached


def _sql(dsn: str, *statements: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for s in statements:
            conn.execute(s)


def _table(dsn: str, table: str) -> dict[int, dict[str, Any]]:
    """The table's rows by id, as a folded topic shows them (column name → value)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        cur = conn.execute(f"SELECT * FROM {table}")
        names = [d.name for d in cur.description or ()]
        return {row[0]: dict(zip(names, row, strict=True)) for row in cur.fetchall()}


def _fold(log: Path, topic: str) -> dict[int, dict[str, Any]]:
    try:
        state = table_state(log, topic)
    except LogError:
        return {}  # capture has not made its log yet
    return {row["id"]: row for row in state.values()}


@pytest.fixture
def running(fresh_db: str, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[tuple[str, Path]]:
    """Table t with ROWS rows, captured by a running capture (`resnapshot_on_rewrite` as the
    test's parameter says) whose log already equals it."""
    on = bool(request.param)
    _sql(
        fresh_db,
        "CREATE TABLE t (id int PRIMARY KEY, v int NOT NULL)",
        f"INSERT INTO t SELECT g, g FROM generate_series(1, {ROWS}) g",
    )
    log = tmp_path / "log"
    config = write_config(
        tmp_path / "t.toml",
        dsn=fresh_db,
        log_root=log,
        source_extra=f"resnapshot_on_rewrite = {'true' if on else 'false'}",
    )
    init = cli("init", "--config", str(config))
    assert init.returncode == 0, init.stdout + init.stderr
    proc = spawn_capture(config)
    try:
        wait_for(
            lambda: _fold(log, "shop.public.t") == _table(fresh_db, "t"),
            DEADLINE_S,
            "the snapshot",
            progress=lambda: capture_progress(log),
        )
        yield fresh_db, log
        _settle(log)
    finally:
        _stop(proc)


def _settle(log: Path) -> None:
    """Wait until a status written from now on shows no snapshot under way (capture stops between chunks)."""
    since_ms = time.time() * 1000

    def idle() -> bool:
        status = read_status(log) or {}
        entries = status.get("sources", [])
        return status.get("updated_ms", 0) > since_ms and not any(snapshot_under_way(e) for e in entries)

    wait_for(idle, DEADLINE_S, "the snapshots to end", progress=lambda: capture_progress(log))


def _stop(proc: Capture) -> None:
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err


def _schemas(log: Path, topic: str) -> list[tuple[int, int, list[str]]]:
    """(partition, offset, column names) of each schema record of the topic."""
    out = []
    for rec in records(log, topic):
        value = orjson.loads(rec.value) if rec.value else {}
        if "schema" in value:
            out.append((rec.partition, rec.offset, [c["name"] for c in value["schema"]["columns"]]))
    return out


@pytest.mark.parametrize("running", [True], indirect=True, ids=["resnapshot_on_rewrite"])
def test_alter_column_type_using_resnapshots_the_table(running: tuple[str, Path]) -> None:
    dsn, log = running
    _sql(dsn, "ALTER TABLE t ALTER COLUMN v TYPE text USING (v * 10)::text")
    wait_for(
        lambda: _fold(log, "shop.public.t") == _table(dsn, "t"),
        DEADLINE_S,
        "the retyped rows",
        progress=lambda: capture_progress(log),
    )
    assert _fold(log, "shop.public.t")[7]["v"] == "70"
    # Same type, new values: no new shape, but the table was rewritten.
    _sql(dsn, "ALTER TABLE t ALTER COLUMN v TYPE text USING v || '!'")
    wait_for(
        lambda: _fold(log, "shop.public.t") == _table(dsn, "t"),
        DEADLINE_S,
        "the rewritten rows",
        progress=lambda: capture_progress(log),
    )
    assert _fold(log, "shop.public.t")[7]["v"] == "70!"


@pytest.mark.parametrize("running", [True], indirect=True, ids=["resnapshot_on_rewrite"])
def test_add_column_default_resnapshots_so_every_row_shows_it(running: tuple[str, Path]) -> None:
    dsn, log = running
    _sql(dsn, "ALTER TABLE t ADD COLUMN c int NOT NULL DEFAULT 7")
    wait_for(
        lambda: _fold(log, "shop.public.t") == _table(dsn, "t"),
        DEADLINE_S,
        "every row with the new column",
        progress=lambda: capture_progress(log),
    )
    assert all(row["c"] == 7 for row in _fold(log, "shop.public.t").values())


@pytest.mark.parametrize("running", [False], indirect=True, ids=["default"])
def test_add_column_without_resnapshot_gives_a_schema_record_at_the_change(running: tuple[str, Path]) -> None:
    dsn, log = running
    before = {p: o for p, o, _ in _schemas(log, "shop.public.t")}
    _sql(dsn, "ALTER TABLE t ADD COLUMN c int NOT NULL DEFAULT 7")
    wait_for(
        lambda: any(cols == ["id", "v", "c"] for _, _, cols in _schemas(log, "shop.public.t")),
        DEADLINE_S,
        "the schema record of the new shape",
        progress=lambda: capture_progress(log),
    )
    new = [(p, o) for p, o, cols in _schemas(log, "shop.public.t") if cols == ["id", "v", "c"]]
    assert sorted(p for p, _ in new) == sorted(before)  # on every partition, after what it held
    assert all(o > before[p] for p, o in new)
    # No row changed: the rows keep their old shape (docs/capture.md, "Schema changes").
    assert all(set(row) == {"id", "v"} for row in _fold(log, "shop.public.t").values())


@pytest.mark.parametrize("running", [False], indirect=True, ids=["default"])
def test_rename_moves_the_rows_to_the_new_topic_and_empties_the_old(running: tuple[str, Path]) -> None:
    dsn, log = running
    _sql(dsn, "ALTER TABLE t RENAME TO t2", "INSERT INTO t2 VALUES (1000, 1000)", "UPDATE t2 SET v = -1 WHERE id = 3")
    wait_for(
        lambda: _fold(log, "shop.public.t") == {},
        DEADLINE_S,
        "the old topic to fold to empty",
        progress=lambda: capture_progress(log),
    )
    wait_for(
        lambda: _fold(log, "shop.public.t2") == _table(dsn, "t2"),
        DEADLINE_S,
        "the new topic to equal the table",
        progress=lambda: capture_progress(log),
    )
    assert len(_fold(log, "shop.public.t2")) == ROWS + 1
    # Tombstones, so compaction drops the old keys.
    old = records(log, "shop.public.t")
    assert sum(r.value is None for r in old) == ROWS


@pytest.mark.parametrize("running", [False], indirect=True, ids=["default"])
def test_rename_with_a_new_table_under_the_old_name(running: tuple[str, Path]) -> None:
    dsn, log = running
    with psycopg.connect(dsn) as conn:  # one transaction: the old name is never free
        conn.execute("ALTER TABLE t RENAME TO t_old")
        conn.execute("CREATE TABLE t (id int PRIMARY KEY, v int NOT NULL)")
        conn.execute("INSERT INTO t VALUES (1, 100), (500, 500)")
    wait_for(
        lambda: _fold(log, "shop.public.t_old") == _table(dsn, "t_old"),
        DEADLINE_S,
        "the renamed table",
        progress=lambda: capture_progress(log),
    )
    wait_for(
        lambda: _fold(log, "shop.public.t") == _table(dsn, "t"),
        DEADLINE_S,
        "the old topic to equal the new t",
        progress=lambda: capture_progress(log),
    )
    assert set(_fold(log, "shop.public.t")) == {1, 500}


def test_a_rename_while_capture_is_stopped_is_said_at_start(fresh_db: str, tmp_path: Path) -> None:
    _sql(fresh_db, "CREATE TABLE t (id int PRIMARY KEY, v int NOT NULL)", "INSERT INTO t VALUES (1, 1), (2, 2)")
    log = tmp_path / "log"
    config = write_config(tmp_path / "t.toml", dsn=fresh_db, log_root=log)
    init = cli("init", "--config", str(config))
    assert init.returncode == 0, init.stdout + init.stderr
    proc = spawn_capture(config)
    try:
        wait_for(
            lambda: _fold(log, "shop.public.t") == _table(fresh_db, "t"),
            DEADLINE_S,
            "the snapshot",
            progress=lambda: capture_progress(log),
        )
        _sql(fresh_db, "ALTER TABLE t RENAME TO t2")
        wait_for(
            lambda: _fold(log, "shop.public.t2") == _table(fresh_db, "t2"),
            DEADLINE_S,
            "the new topic",
            progress=lambda: capture_progress(log),
        )
        wait_for(
            lambda: _fold(log, "shop.public.t") == {},
            DEADLINE_S,
            "the old topic ended",
            progress=lambda: capture_progress(log),
        )
        _settle(log)
    finally:
        _stop(proc)
    # Ended while capture ran: nothing to say at the next start. Renamed while stopped: said.
    _sql(fresh_db, "ALTER TABLE t2 RENAME TO t3")
    run = cli("capture", "--config", str(config), "--until-idle", "3")
    assert run.returncode == 0, run.stderr
    assert "topic shop.public.t:" not in run.stderr
    assert "topic shop.public.t2: its table no longer exists" in run.stderr, run.stderr
    assert _fold(log, "shop.public.t3") == _table(fresh_db, "t3")  # snapshotted as a table added later
    assert _fold(log, "shop.public.t2") == _table(fresh_db, "t3")  # what the docs say stays


# A capture whose chunked snapshot, having read its third chunk of rows, waits (before that chunk's
# watermark) until the test creates the file `release` next to the config.
_PAUSE_IN_ROWS = """
import sys, time
from pathlib import Path
from tributary.capture.snapshot.chunked import ChunkedSnapshot
gate = Path(sys.argv[1]).parent
seen = []
def pause(table, phase):
    seen.append(phase)
    if seen.count("rows") == 3:
        (gate / "paused").touch()
        while not (gate / "release").exists():  # the test releases it, whatever happens
            time.sleep(0.05)
ChunkedSnapshot.after_read = pause
from tributary.api.cli.main import main
sys.argv = ["tributary", "capture", "--config", sys.argv[1]]
main()
"""


def test_a_rewrite_while_the_table_is_being_snapshotted_reads_it_again(fresh_db: str, tmp_path: Path) -> None:
    _sql(
        fresh_db,
        "CREATE TABLE t (id int PRIMARY KEY, v int NOT NULL)",
        "INSERT INTO t SELECT g, g FROM generate_series(1, 1000) g",
    )
    log = tmp_path / "log"
    extra = 'snapshot_method = "chunked"\nsnapshot_chunk_rows = 100\nresnapshot_on_rewrite = true'
    config = write_config(tmp_path / "t.toml", dsn=fresh_db, log_root=log, source_extra=extra)
    init = cli("init", "--config", str(config))
    assert init.returncode == 0, init.stdout + init.stderr
    err_path = tmp_path / "capture.err"
    with err_path.open("wb") as err_file:
        proc = subprocess.Popen(
            [sys.executable, "-c", _PAUSE_IN_ROWS, str(config)], stderr=err_file, stdout=subprocess.DEVNULL, cwd=ROOT
        )
    try:
        wait_for(
            (tmp_path / "paused").exists, DEADLINE_S, "the third chunk read", progress=lambda: capture_progress(log)
        )
        assert 0 < len(_fold(log, "shop.public.t")) < 1000  # two chunks staged, with the old values
        _sql(fresh_db, "ALTER TABLE t ALTER COLUMN v TYPE int USING v * 10")
        wait_for(
            lambda: "schema change of public.t seen" in err_path.read_text(),
            DEADLINE_S,
            "the notice",
            progress=lambda: capture_progress(log),
        )
        (tmp_path / "release").touch()
        wait_for(
            lambda: _fold(log, "shop.public.t") == _table(fresh_db, "t"),
            DEADLINE_S,
            "the rewritten rows",
            progress=lambda: capture_progress(log),
        )
        _settle(log)
    finally:
        (tmp_path / "release").touch()
        proc.send_signal(signal.SIGTERM)
        waiting.wait_exit(proc, what="capture to stop", progress=lambda: waiting.size_of(err_path))
    err = err_path.read_text()
    assert proc.returncode == 0, err
    # The request joined the snapshot under way (read again from its first key), rather than following it.
    assert "requested by a schema change" not in err, err


# A capture that dies (as kill -9) when it is about to end an old topic: the notice is committed.
_CRASH_BEFORE_ENDING = """
import os, sys
from tributary.capture.streaming.ddl_watch import SchemaChanges
from tributary.capture.decoding.lsn import Lsn
real = SchemaChanges.tick
def tick(self, durable):
    if any(Lsn.parse(e.lsn) <= durable for e in self.endings):
        os._exit(9)
    return real(self, durable)
SchemaChanges.tick = tick
from tributary.api.cli.main import main
sys.argv = ["tributary", "capture", "--config", sys.argv[1]]
main()
"""


def test_an_old_topic_is_ended_after_a_crash_once_its_notice_is_committed(fresh_db: str, tmp_path: Path) -> None:
    _sql(fresh_db, "CREATE TABLE t (id int PRIMARY KEY, v int NOT NULL)", "INSERT INTO t VALUES (1, 1), (2, 2)")
    log = tmp_path / "log"
    config = write_config(tmp_path / "t.toml", dsn=fresh_db, log_root=log)
    init = cli("init", "--config", str(config))
    assert init.returncode == 0, init.stdout + init.stderr
    err_path = tmp_path / "crash.err"
    with err_path.open("wb") as err_file:
        proc = subprocess.Popen(
            [sys.executable, "-c", _CRASH_BEFORE_ENDING, str(config)],
            stderr=err_file,
            stdout=subprocess.DEVNULL,
            cwd=ROOT,
        )
    try:
        wait_for(
            lambda: _fold(log, "shop.public.t") == _table(fresh_db, "t"),
            DEADLINE_S,
            "the snapshot",
            progress=lambda: capture_progress(log),
        )
        _sql(fresh_db, "ALTER TABLE t RENAME TO t2")
        code = waiting.wait_exit(
            proc, what="capture to crash", progress=lambda: (capture_progress(log), waiting.size_of(err_path))
        )
        assert code == 9, err_path.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
    assert len(_fold(log, "shop.public.t")) == 2  # not ended yet
    run = cli("capture", "--config", str(config), "--until-idle", "3")
    assert run.returncode == 0, run.stderr
    assert _fold(log, "shop.public.t") == {}
    assert _fold(log, "shop.public.t2") == _table(fresh_db, "t2")
