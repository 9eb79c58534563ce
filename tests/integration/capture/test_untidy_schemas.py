"""Capture on schemas nobody tidied, with the database as the oracle: after capture catches up,
the latest record per key of each table's topic equals the table, row for row.

Partitioned tables (routed to the root's topic, or leaves as tables of their own), replica
identities other than the primary key, keys that change shape, keyless tables under REPLICA
IDENTITY FULL, and identifiers that are not valid topic names."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import psycopg
import pytest

from tests.integration.capture.helpers import cli, records, table_state, write_config
from tributary.capture.records.routing import topic_name
from tributary.log.local import Log

pytestmark = pytest.mark.integration


def _sql(dsn: str, *statements: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for s in statements:
            conn.execute(s)


def _canonical(row: dict[str, Any]) -> bytes:
    return orjson.dumps(row, option=orjson.OPT_SORT_KEYS)


def _rows(dsn: str, qualified: str) -> list[dict[str, Any]]:
    """The table as JSON objects (what the envelopes' `after` holds for these plain types)."""
    with psycopg.connect(dsn) as conn:
        got = conn.execute(f"SELECT to_jsonb(t)::text FROM {qualified} t").fetchall()
    return sorted((orjson.loads(r[0]) for r in got), key=_canonical)


def _fold(log: Path, topic: str) -> list[dict[str, Any]]:
    return sorted(table_state(log, topic).values(), key=_canonical)


def _config(dsn: str, tmp_path: Path, extra: str = "") -> Path:
    return write_config(tmp_path / "t.toml", dsn=dsn, log_root=tmp_path / "log", source_extra=extra)


def _capture(config: Path) -> None:
    run = cli("capture", "--config", str(config), "--until-idle", "2", timeout=600)
    assert run.returncode == 0, run.stderr


def _init(config: Path, *args: str) -> str:
    init = cli("init", "--config", str(config), *args)
    assert init.returncode == 0, init.stdout + init.stderr
    return init.stdout


def _topics(log: Path) -> set[str]:
    with Log.open(log) as opened:
        return set(opened.topics())


PARTITIONED = (
    "CREATE TABLE meas (id int, ts date, v text, PRIMARY KEY (id, ts)) PARTITION BY RANGE (ts)",
    "CREATE TABLE meas_2024 PARTITION OF meas FOR VALUES FROM ('2024-01-01') TO ('2025-01-01')",
    "CREATE TABLE meas_2025 PARTITION OF meas FOR VALUES FROM ('2025-01-01') TO ('2026-01-01')",
    "INSERT INTO meas SELECT g, DATE '2024-06-01' + g * 30, 'v' || g FROM generate_series(1, 12) g",
)
WORKLOAD = (
    "DELETE FROM meas WHERE id = 10",  # a row the snapshot wrote, deleted in a leaf
    "UPDATE meas SET v = 'changed' WHERE id IN (1, 11)",
    "INSERT INTO meas VALUES (100, '2024-02-02', 'new'), (101, '2025-02-02', 'new')",
    "UPDATE meas SET ts = '2025-03-03' WHERE id = 2",  # moves the row to the other partition
)


def test_partitioned_table_changes_go_to_the_root_topic_and_equal_the_table(fresh_db: str, tmp_path: Path) -> None:
    _sql(fresh_db, *PARTITIONED)
    config = _config(fresh_db, tmp_path)
    _init(config)
    _capture(config)
    _sql(fresh_db, *WORKLOAD)
    _capture(config)
    log = tmp_path / "log"
    assert not {t for t in _topics(log) if t.startswith("shop.public.meas_")}, _topics(log)
    assert _fold(log, "shop.public.meas") == _rows(fresh_db, "meas")
    streamed = [orjson.loads(r.value) for r in records(log, "shop.public.meas") if r.value and b'"op"' in r.value]
    assert {c["source"]["table"] for c in streamed} == {"meas"}  # the root's name, as the snapshot's

    # One partition emptied: its rows go (by a re-snapshot of the root), the others stay.
    _sql(fresh_db, "TRUNCATE meas_2024", "INSERT INTO meas VALUES (102, '2025-04-04', 'after')")
    _capture(config)
    assert _fold(log, "shop.public.meas") == _rows(fresh_db, "meas")

    # A partition attached later is routed too.
    _sql(
        fresh_db,
        "CREATE TABLE meas_2026 PARTITION OF meas FOR VALUES FROM ('2026-01-01') TO ('2027-01-01')",
        "INSERT INTO meas VALUES (200, '2026-05-05', 'late partition')",
        "DELETE FROM meas WHERE id = 101",
    )
    _capture(config)
    assert "shop.public.meas_2026" not in _topics(log)
    assert _fold(log, "shop.public.meas") == _rows(fresh_db, "meas")


def test_partitioned_tables_as_leaves_each_equal_their_partition(fresh_db: str, tmp_path: Path) -> None:
    _sql(fresh_db, *PARTITIONED)
    config = _config(fresh_db, tmp_path, 'partitioned_tables = "leaves"')
    _init(config)
    _capture(config)
    _sql(fresh_db, *WORKLOAD)
    _capture(config)
    log = tmp_path / "log"
    assert "shop.public.meas" not in _topics(log)
    for leaf in ("meas_2024", "meas_2025"):
        assert _fold(log, f"shop.public.{leaf}") == _rows(fresh_db, leaf)


def test_one_key_rule_whatever_the_replica_identity(fresh_db: str, tmp_path: Path) -> None:
    """Primary key + identity index, primary key + FULL: snapshot and stream key by the primary key."""
    _sql(
        fresh_db,
        "CREATE TABLE ri (id int PRIMARY KEY, code text NOT NULL UNIQUE, v text)",
        "ALTER TABLE ri REPLICA IDENTITY USING INDEX ri_code_key",
        "CREATE TABLE rf (id int PRIMARY KEY, v text)",
        "ALTER TABLE rf REPLICA IDENTITY FULL",
        "INSERT INTO ri VALUES (1, 'a', 'x'), (2, 'b', 'y')",
        "INSERT INTO rf VALUES (1, 'x'), (2, 'y')",
    )
    config = _config(fresh_db, tmp_path)
    out = _init(config)
    assert "has no primary key or replica identity index" not in out
    _capture(config)
    _sql(
        fresh_db,
        "UPDATE ri SET v = 'z' WHERE id = 1",
        "UPDATE ri SET code = 'c' WHERE id = 2",
        "UPDATE rf SET v = 'z' WHERE id = 1",
        "INSERT INTO ri VALUES (3, 'd', 'w')",
        "DELETE FROM rf WHERE id = 2",
    )
    _capture(config)
    log = tmp_path / "log"
    for table in ("ri", "rf"):
        state = table_state(log, f"shop.public.{table}")
        assert all(set(orjson.loads(k)) == {"id"} for k in state), sorted(state)
        assert _fold(log, f"shop.public.{table}") == _rows(fresh_db, table)
    schemas = [orjson.loads(r.value)["schema"] for r in records(log, "shop.public.ri") if b"__schema__" in r.key]
    assert schemas and all(s["key"] == ["id"] for s in schemas)


def test_a_primary_key_added_after_create_table_as_rekeys_the_topic(fresh_db: str, tmp_path: Path) -> None:
    _sql(fresh_db, "CREATE TABLE other (id int PRIMARY KEY)")
    config = _config(fresh_db, tmp_path)
    _init(config)
    _capture(config)
    _sql(fresh_db, "CREATE TABLE c AS SELECT g AS id, 'x' || g AS v FROM generate_series(1, 100) g")
    _sql(fresh_db, "ALTER TABLE c REPLICA IDENTITY FULL")
    _capture(config)  # streamed, keyed by the whole row
    _sql(
        fresh_db,
        "ALTER TABLE c ADD PRIMARY KEY (id)",
        "UPDATE c SET v = 'y' WHERE id <= 10",
        "DELETE FROM c WHERE id = 50",
    )
    _capture(config)
    log = tmp_path / "log"
    state = table_state(log, "shop.public.c")
    assert len(state) == 99, len(state)
    assert _fold(log, "shop.public.c") == _rows(fresh_db, "c")


def test_a_primary_key_added_while_capture_streams_rekeys_the_topic(fresh_db: str, tmp_path: Path) -> None:
    _sql(fresh_db, "CREATE TABLE c (id int NOT NULL, v text)", "ALTER TABLE c REPLICA IDENTITY FULL")
    _sql(fresh_db, "INSERT INTO c SELECT g, 'x' || g FROM generate_series(1, 50) g")
    config = _config(fresh_db, tmp_path)
    _init(config)
    _capture(config)  # the snapshot: keyed by the whole row
    # In one stream: more whole-row-keyed rows, then the key, then changes keyed by it.
    _sql(
        fresh_db,
        "INSERT INTO c SELECT g, 'x' || g FROM generate_series(51, 60) g",
        "ALTER TABLE c ADD PRIMARY KEY (id)",
        "UPDATE c SET v = 'y' WHERE id <= 5",
    )
    _capture(config)
    log = tmp_path / "log"
    assert len(table_state(log, "shop.public.c")) == 60
    assert _fold(log, "shop.public.c") == _rows(fresh_db, "c")


def test_keyless_table_with_full_identity_update_moves_the_whole_row_key(fresh_db: str, tmp_path: Path) -> None:
    _sql(
        fresh_db,
        "CREATE TABLE nk (a int, b text)",
        "ALTER TABLE nk REPLICA IDENTITY FULL",
        "INSERT INTO nk VALUES (1, 'x'), (2, 'y')",
    )
    config = _config(fresh_db, tmp_path)
    out = _init(config)
    assert "public.nk has no primary key: its records are keyed by the whole row" in out
    _capture(config)
    _sql(fresh_db, "UPDATE nk SET b = 'z' WHERE a = 1", "INSERT INTO nk VALUES (3, 'w')", "DELETE FROM nk WHERE a = 2")
    _capture(config)
    assert _fold(tmp_path / "log", "shop.public.nk") == _rows(fresh_db, "nk")


def test_odd_identifiers_map_to_valid_stable_topics_and_stop_nothing(fresh_db: str, tmp_path: Path) -> None:
    _sql(
        fresh_db,
        'CREATE SCHEMA "Other Schema"',
        'CREATE TABLE "Other Schema"."my table" (id int PRIMARY KEY, v text)',
        'CREATE TABLE "Other Schema"."tëst.ü$" (id int PRIMARY KEY, v text)',
        "CREATE TABLE plain (id int PRIMARY KEY, v text)",
        'INSERT INTO "Other Schema"."my table" VALUES (1, \'a\')',
    )
    config = write_config(
        tmp_path / "t.toml",
        dsn=fresh_db,
        log_root=tmp_path / "log",
        source_extra='include = ["public.*", "Other Schema.*"]',
    ).read_text()
    config_path = tmp_path / "t2.toml"
    config_path.write_text(config.replace('include = ["public.*"]\n', "", 1))
    out = _init(config_path)
    space = topic_name("shop", "Other Schema", "my table")
    odd = topic_name("shop", "Other Schema", "tëst.ü$")
    assert space in out and odd in out  # init shows where such tables go
    _capture(config_path)
    _sql(
        fresh_db,
        'INSERT INTO "Other Schema"."tëst.ü$" VALUES (1, \'b\')',
        'UPDATE "Other Schema"."my table" SET v = \'c\'',
        "INSERT INTO plain VALUES (1, 'p')",
    )
    _capture(config_path)
    log = tmp_path / "log"
    assert _fold(log, space) == _rows(fresh_db, '"Other Schema"."my table"')
    assert _fold(log, odd) == _rows(fresh_db, '"Other Schema"."tëst.ü$"')
    assert _fold(log, "shop.public.plain") == [{"id": 1, "v": "p"}]
    # A table dropped with its changes still in the WAL stops nothing at the next start.
    _sql(
        fresh_db,
        'INSERT INTO "Other Schema"."my table" VALUES (2, \'d\')',
        'DROP TABLE "Other Schema"."my table"',
        "INSERT INTO plain VALUES (2, 'q')",
    )
    _capture(config_path)
    assert _fold(log, "shop.public.plain") == [{"id": 1, "v": "p"}, {"id": 2, "v": "q"}]
