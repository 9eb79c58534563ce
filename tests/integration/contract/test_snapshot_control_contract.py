"""Snapshot modes (`[[sources]] snapshot`) and a filtered snapshot (`capture snapshot --where`),
on every log backend, against a real PostgreSQL: `initial_only` snapshots and stops, `no_data`
writes the tables' schema records and streams from its start, `always` snapshots at every start,
and a filtered snapshot re-reads only the rows its condition selects, deleting none outside it."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import orjson
import psycopg
import pytest

from tests.backends import LogBackend, changes, table_state, write_backend_config
from tests.integration.capture.helpers import cli
from tributary.capture.records.schema_tracker import SCHEMA_KEY
from tributary.capture.status import read_status

pytestmark = pytest.mark.integration

TOPIC = "shop.public.orders"
ROWS = 600


def _orders(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE orders (id int PRIMARY KEY, status text NOT NULL)")
        conn.execute(
            "INSERT INTO orders SELECT g, CASE WHEN g %% 3 = 0 THEN 'open' ELSE 'closed' END "
            "FROM generate_series(1, %s) g",
            (ROWS,),
        )


def _table(dsn: str) -> dict[str, dict[str, object]]:
    """The table as its topic should fold: {canonical key: row}."""
    with psycopg.connect(dsn) as conn:
        rows = conn.execute("SELECT id, status FROM orders").fetchall()
    return {orjson.dumps({"id": i}).decode(): {"id": i, "status": s} for i, s in rows}


def _config(backend: LogBackend, tmp_path: Path, dsn: str, extra: str) -> tuple[Path, Path]:
    backend.prepare(TOPIC)
    log_root = tmp_path / "log"
    config = write_backend_config(backend, tmp_path / "t.toml", dsn=dsn, log_root=log_root, source_extra=extra)
    return config, log_root


def _capture(config: Path, *args: str) -> str:
    """One run of capture (to its own exit, or idle); its stderr."""
    res = cli("capture", "--config", str(config), *args, timeout=300)
    assert res.returncode == 0, res.stderr
    return res.stderr


def _reads(backend: LogBackend, log_root: Path) -> Counter[int]:
    """How many times each id was read by a snapshot (`op: "r"`)."""
    return Counter(c["after"]["id"] for c in changes(backend.records(log_root, TOPIC)) if c["op"] == "r")


@pytest.mark.parametrize("method", ["consistent", "chunked"])
def test_initial_only_snapshots_then_capture_stops_on_its_own(
    fresh_db: str, tmp_path: Path, backend: LogBackend, method: str
) -> None:
    _orders(fresh_db)
    config, log_root = _config(
        backend,
        tmp_path,
        fresh_db,
        f'snapshot = "initial_only"\nsnapshot_method = "{method}"\nsnapshot_chunk_rows = 100',
    )
    _capture(config)  # no --until-idle: it exits 0 by itself once the snapshot is committed
    assert table_state(backend.records(log_root, TOPIC)) == _table(fresh_db)
    assert set(_reads(backend, log_root).values()) == {1}
    entry = (read_status(log_root) or {})["sources"][0]
    assert entry["state"] == "stopped" and entry["snapshot_control"] == "finished", entry
    status = cli("capture", "status", "--config", str(config))
    assert "snapshot finished (initial_only): not streaming" in status.stdout, status.stdout + status.stderr

    # Its snapshot is taken: a later start neither streams nor snapshots again.
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        conn.execute("INSERT INTO orders VALUES (100001, 'open')")
    _capture(config)
    state = table_state(backend.records(log_root, TOPIC))
    assert len(state) == ROWS and '{"id":100001}' not in state
    assert set(_reads(backend, log_root).values()) == {1}


def test_no_data_writes_schema_records_only_and_streams_from_its_start(
    fresh_db: str, tmp_path: Path, backend: LogBackend
) -> None:
    _orders(fresh_db)
    config, log_root = _config(backend, tmp_path, fresh_db, 'snapshot = "no_data"')
    _capture(config, "--until-idle", "1")
    first = backend.records(log_root, TOPIC)
    assert first and {r.key for r in first} == {SCHEMA_KEY}, "the table's schema record, no row"
    schema = orjson.loads(next(r.value for r in first if r.value))
    assert [c["name"] for c in schema["schema"]["columns"]] == ["id", "status"], schema

    with psycopg.connect(fresh_db, autocommit=True) as conn:
        conn.execute("INSERT INTO orders VALUES (100001, 'open')")
        conn.execute("UPDATE orders SET status = 'open' WHERE id = 1")
    _capture(config, "--until-idle", "1")
    got = changes(backend.records(log_root, TOPIC))
    assert [(c["op"], c["after"]["id"]) for c in got] == [("c", 100001), ("u", 1)]


@pytest.mark.parametrize("method", ["consistent", "chunked"])
def test_always_snapshots_at_every_start_and_the_topic_equals_the_table(
    fresh_db: str, tmp_path: Path, backend: LogBackend, method: str
) -> None:
    _orders(fresh_db)
    extra = f'snapshot = "always"\nsnapshot_method = "{method}"\nsnapshot_chunk_rows = 100'
    config, log_root = _config(backend, tmp_path, fresh_db, extra)
    _capture(config, "--until-idle", "1")
    assert set(_reads(backend, log_root).values()) == {1}
    with psycopg.connect(fresh_db, autocommit=True) as conn:  # while capture is stopped
        conn.execute("DELETE FROM orders WHERE id <= 10")
        conn.execute("INSERT INTO orders VALUES (100001, 'open')")
    _capture(config, "--until-idle", "1")
    reads = _reads(backend, log_root)
    assert all(reads[i] == 2 for i in range(11, ROWS + 1)), "every row read again at the second start"
    assert reads[100001] == 1 and all(reads[i] == 1 for i in range(1, 11))
    records = backend.records(log_root, TOPIC)
    assert table_state(records) == _table(fresh_db)
    deleted = sorted(c["before"]["id"] for c in changes(records) if c["op"] == "d")
    assert deleted == list(range(1, 11)), "the rows deleted meanwhile, each once"


@pytest.mark.parametrize("method", ["consistent", "chunked"])
def test_a_filtered_snapshot_rereads_only_its_rows_and_deletes_none_outside_it(
    fresh_db: str, tmp_path: Path, backend: LogBackend, method: str
) -> None:
    _orders(fresh_db)
    config, log_root = _config(backend, tmp_path, fresh_db, f'snapshot_method = "{method}"\nsnapshot_chunk_rows = 100')
    _capture(config, "--until-idle", "1")
    res = cli(
        "capture",
        "snapshot",
        "public.orders",
        "--where",
        "status = 'open' AND id % 3 = 0 AND id > 300",
        "--config",
        str(config),
    )
    assert res.returncode == 0 and "where status = 'open' AND id % 3 = 0 AND id > 300" in res.stdout, (
        res.stdout + res.stderr
    )
    _capture(config, "--until-idle", "1")
    reads = _reads(backend, log_root)
    wanted = {i for i in range(301, ROWS + 1) if i % 3 == 0}
    assert {i for i, n in reads.items() if n == 2} == wanted, "only the rows the condition selects"
    assert set(reads.values()) == {1, 2}
    records = backend.records(log_root, TOPIC)
    assert not [c for c in changes(records) if c["op"] == "d"], "rows outside the condition are not absent"
    assert table_state(records) == _table(fresh_db)
    entry = (read_status(log_root) or {})["sources"][0]
    assert not entry["snapshot_tables_pending"]
