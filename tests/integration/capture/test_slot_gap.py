"""A slot that starts after the log's position (recreated behind capture's back) is refused in one
line, or re-snapshotted under `snapshot = "when_needed"`; `init` does not silently make one; and
capture's own slot, confirmed while idle, is never mistaken for such a slot."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import psycopg
import pytest

from tests.integration.capture.helpers import cli, records, table_state, write_config
from tributary.capture.decoding.lsn import Lsn
from tributary.log.local import Log

pytestmark = pytest.mark.integration

TOPIC = "shop.public.items"


def _slot(config: Path) -> str:
    return next(line.split('"')[1] for line in config.read_text().splitlines() if line.startswith("slot ="))


def _table(dsn: str) -> dict[str, dict[str, Any]]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute("SELECT id, note FROM items").fetchall()
    return {orjson.dumps({"id": i}).decode(): {"id": i, "note": note} for i, note in rows}


def _captured_then_slot_dropped_and_changed(dsn: str, tmp_path: Path, extra: str = "") -> Path:
    """Capture 3000 rows, then drop the slot and update/delete thousands of rows."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE items (id int PRIMARY KEY, note text)")
        conn.execute("INSERT INTO items SELECT g, 'seed' FROM generate_series(1, 3000) g")
    config = write_config(tmp_path / "t.toml", dsn=dsn, log_root=tmp_path / "log", source_extra=extra)
    res = cli("capture", "--config", str(config), "--until-idle", "1")
    assert res.returncode == 0, res.stderr
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT pg_drop_replication_slot(%s)", (_slot(config),))
        conn.execute("UPDATE items SET note = 'changed' WHERE id % 2 = 0")
        conn.execute("DELETE FROM items WHERE id % 3 = 0")
    return config


def _recreate_behind_capture(dsn: str, config: Path) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT pg_create_logical_replication_slot(%s, 'wal2json')", (_slot(config),))


def _slot_exists(dsn: str, config: Path) -> bool:
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT count(*) FROM pg_replication_slots WHERE slot_name = %s", (_slot(config),))
        return bool(row.fetchone()[0])  # type: ignore[index]


def test_a_recreated_slot_is_refused_and_init_does_not_make_one(fresh_db: str, tmp_path: Path) -> None:
    config = _captured_then_slot_dropped_and_changed(fresh_db, tmp_path)
    before = table_state(tmp_path / "log", TOPIC)

    init = cli("init", "--config", str(config))
    assert init.returncode != 0, init.stdout
    assert "is missing but capture has a position for this source" in init.stdout, init.stdout
    assert not _slot_exists(fresh_db, config), "init made a slot that would skip the changes"

    _recreate_behind_capture(fresh_db, config)
    init = cli("init", "--config", str(config))
    assert init.returncode != 0 and "after the log's position" in init.stdout, init.stdout

    res = cli("capture", "--config", str(config), "--until-idle", "1")
    assert res.returncode == 1, res.stderr
    last = res.stderr.strip().splitlines()[-1]
    assert last.startswith("tributary: source 'shop': slot") and "after the log's position" in last, last
    assert 'snapshot = "when_needed"' in last and "new [log] root" in last and "recreate it" not in last
    lsns = [w.rstrip(":,") for w in last.split() if "/" in w and w.rstrip(":,").replace("/", "").isalnum()]
    assert len(lsns) == 2 and Lsn.parse(lsns[0]) > Lsn.parse(lsns[1]), last  # the slot's start, the log's
    assert table_state(tmp_path / "log", TOPIC) == before, "nothing was streamed from the recreated slot"


@pytest.mark.parametrize("method", ["consistent", "chunked"])
def test_when_needed_resnapshots_a_recreated_slot(fresh_db: str, tmp_path: Path, method: str) -> None:
    extra = f'snapshot = "when_needed"\nsnapshot_method = "{method}"'
    config = _captured_then_slot_dropped_and_changed(fresh_db, tmp_path, extra=extra)
    init = cli("init", "--config", str(config))
    assert init.returncode == 0 and "capture re-snapshots" in init.stdout, init.stdout
    _recreate_behind_capture(fresh_db, config)

    res = cli("capture", "--config", str(config), "--until-idle", "1")
    assert res.returncode == 0, res.stderr
    assert "recreated" in res.stderr and "taking a new snapshot" in res.stderr
    want = _table(fresh_db)
    assert len(want) == 2000
    assert table_state(tmp_path / "log", TOPIC) == want  # updates in, deleted rows gone

    with psycopg.connect(fresh_db, autocommit=True) as conn:  # and it streams on from the new slot
        conn.execute("UPDATE items SET note = 'later' WHERE id < 100")
        conn.execute("DELETE FROM items WHERE id > 2900")
    res = cli("capture", "--config", str(config), "--until-idle", "1")
    assert res.returncode == 0, res.stderr
    assert table_state(tmp_path / "log", TOPIC) == _table(fresh_db)


def test_a_slot_confirmed_while_idle_is_still_capture_s_own(fresh_db: str, tmp_path: Path) -> None:
    """Capture confirms past its last record while only other tables change: the manifest holds
    that position first, so the next start streams on instead of refusing the slot."""
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE items (id int PRIMARY KEY, note text)")
        conn.execute("CREATE SCHEMA other")
        conn.execute("CREATE TABLE other.noise (id serial PRIMARY KEY)")
        conn.execute("INSERT INTO items SELECT g, 'seed' FROM generate_series(1, 10) g")
    config = write_config(tmp_path / "t.toml", dsn=fresh_db, log_root=tmp_path / "log", name="shop")
    config.write_text(config.read_text().replace('include = ["public.*"]', 'include = ["public.items"]'))
    from tests.integration.capture.helpers import capture_progress, spawn_capture, wait_for

    proc = spawn_capture(config, "--until-idle", "6")
    slot = _slot(config)
    with psycopg.connect(fresh_db, autocommit=True) as conn:

        def confirmed_past_the_records() -> bool:
            conn.execute("INSERT INTO other.noise DEFAULT VALUES")
            row = conn.execute(
                "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s", (slot,)
            ).fetchone()
            if not (tmp_path / "log" / "manifest.json").exists():
                return False  # the snapshot is not committed yet
            lsns = [
                orjson.loads(r.value)["source"]["lsn"]
                for r in records(tmp_path / "log", TOPIC)
                if r.value and b'"op"' in r.value
            ]
            return bool(row and row[0] and lsns and Lsn.parse(row[0]) > max(lsns))

        wait_for(
            confirmed_past_the_records,
            timeout=60,
            what="an idle confirm past the last record",
            progress=lambda: capture_progress(tmp_path / "log"),
        )
    proc.communicate(timeout=60)
    assert proc.returncode == 0
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        confirmed = conn.execute(
            "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s", (slot,)
        ).fetchone()
        conn.execute("UPDATE items SET note = 'later' WHERE id < 5")
    with Log.open(tmp_path / "log") as log:
        assert Lsn.parse(log.positions()["shop"]) >= Lsn.parse(confirmed[0])  # type: ignore[index]
    res = cli("capture", "--config", str(config), "--until-idle", "1")
    assert res.returncode == 0, res.stderr
    assert table_state(tmp_path / "log", TOPIC) == _table(fresh_db)


def test_a_slot_an_earlier_capture_confirmed_past_its_manifest_is_accepted(fresh_db: str, tmp_path: Path) -> None:
    """A log written by a capture that confirmed idle positions before committing them: the
    status file's confirmed LSN says the slot's later start is capture's own."""
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE items (id int PRIMARY KEY, note text)")
        conn.execute("CREATE TABLE noise (id int)")
        conn.execute("INSERT INTO items SELECT g, 'seed' FROM generate_series(1, 10) g")
    config = write_config(tmp_path / "t.toml", dsn=fresh_db, log_root=tmp_path / "log")
    config.write_text(config.read_text().replace('include = ["public.*"]', 'include = ["public.items"]'))
    res = cli("capture", "--config", str(config), "--until-idle", "1")
    assert res.returncode == 0, res.stderr
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        conn.execute("INSERT INTO noise SELECT generate_series(1, 100)")
        advanced = conn.execute(
            "SELECT end_lsn::text FROM pg_replication_slot_advance(%s, pg_current_wal_lsn())", (_slot(config),)
        ).fetchone()[0]  # type: ignore[index]
        conn.execute("UPDATE items SET note = 'later' WHERE id < 5")

    res = cli("capture", "--config", str(config), "--until-idle", "1")
    assert res.returncode == 1 and "after the log's position" in res.stderr, res.stderr  # nothing says it is ours

    status_file = tmp_path / "log" / "capture-status.json"
    doc = orjson.loads(status_file.read_bytes())
    doc["sources"][0]["confirmed_lsn"] = advanced  # as that capture wrote it after confirming
    status_file.write_bytes(orjson.dumps(doc))
    init = cli("init", "--config", str(config))
    assert init.returncode == 0 and "replication slot" in init.stdout and "exists" in init.stdout, init.stdout
    res = cli("capture", "--config", str(config), "--until-idle", "1")
    assert res.returncode == 0, res.stderr
    assert table_state(tmp_path / "log", TOPIC) == _table(fresh_db)
