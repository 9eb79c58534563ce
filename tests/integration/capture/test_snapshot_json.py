"""The snapshot's PostgreSQL-built JSON (SnapshotReader.json_rows) against the Python path
(rows() → SnapshotEncoder.encode) and against the streamed record, on awkward values."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import psycopg
import pytest

from tests.integration.capture.helpers import cli, records, write_config
from tributary.capture.database.catalog import list_tables
from tributary.capture.database.replication import connect_options
from tributary.capture.decoding.lsn import Lsn
from tributary.capture.records import envelope as env
from tributary.capture.snapshot.reader import SnapshotReader

pytestmark = pytest.mark.integration

_TABLE = (
    'CREATE TABLE "we\\ird tab" (id int, "k ey" text, a text, k text, t text, j json, jb jsonb, n numeric, at timestamptz, '
    'ts timestamp, b bytea, ok bool, u uuid, d date, i interval, big bigint, PRIMARY KEY (id, "k ey"))'
)
# Columns named like short aliases (a, k), control characters, quotes, backslashes, tabs/newlines (escaped by COPY), non-ASCII, json
# with raw whitespace, extreme and infinite timestamps, empty and NULL values.
_ROWS = [
    "(1, 'a', NULL, NULL, E'q\"\\\\ \\t\\n\\r\\b\\f\\x01\\x1f\\x7f é \u2028 /', E'{\"a\":\\n\\t[1, 2.50]}', "
    '\'{"z": 1, "a": [1.0, "x\\"y"]}\', 12345678901234567890.123456789012345678901234567890, '
    "'2024-01-02 03:04:05.5+00', '2024-01-02 03:04:05.123456', '\\x00ff5c09', true, "
    "'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', '2024-02-29', '1 year 2 mons -3 days 04:05:06.7', -9223372036854775808)",
    "(2, E'b\\tc', 'a', 'k', '', 'null', '\"s\"', 'NaN', 'infinity', '-infinity', '', false, NULL, 'infinity', '0', 0)",
    "(3, 'c', 'x', NULL, NULL, NULL, NULL, NULL, '0044-03-15 12:00:00+00 BC', '0001-01-01 00:00:00 BC', NULL, NULL, NULL, "
    "'0001-01-01 BC', NULL, NULL)",
]


def _sql(dsn: str, *statements: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for s in statements:
            conn.execute(s)


def test_json_rows_equal_the_python_encoding(fresh_db: str) -> None:
    _sql(fresh_db, _TABLE, *(f'INSERT INTO "we\\ird tab" VALUES {r}' for r in _ROWS))
    with psycopg.connect(fresh_db, autocommit=True, **connect_options()) as conn:
        (table,) = list_tables(conn, lambda s, t: t == "we\\ird tab")
    holder = psycopg.connect(fresh_db, **connect_options())
    try:
        holder.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        row = holder.execute("SELECT pg_export_snapshot()").fetchone()
        assert row is not None
        with SnapshotReader(fresh_db, row[0], label="t") as reader:
            encoder = env.SnapshotEncoder(
                schema=table.schema,
                table=table.table,
                columns=[(c.name, c.type, c.typeoid) for c in table.columns],
                primary_key=table.identity_columns,
                source_name="shop",
                db="db",
                lsn=Lsn(1),
                now_ms=5,
            )
            fast = reader.json_rows(table, table.identity_columns)
            assert fast is not None, "every column type here has an exact SQL spelling"
            pairs = [pair for batch in fast for pair in batch]
            by_sql = sorted((o.key, o.value) for o in (encoder.encode_json(k, a, "last") for k, a in pairs))
            by_python = sorted((o.key, o.value) for o in (encoder.encode(v, "last") for v in reader.rows(table)))
    finally:
        holder.close()
    assert len(by_sql) == len(_ROWS)
    assert by_sql == by_python


def test_json_rows_decline_floats_arrays_and_alias_clashes(fresh_db: str) -> None:
    _sql(
        fresh_db,
        "CREATE TABLE fa (id int PRIMARY KEY, f float8)",
        "CREATE TABLE ar (id int PRIMARY KEY, a int[])",
        "CREATE TABLE cl (id int PRIMARY KEY, __tributary_row int)",
    )
    with psycopg.connect(fresh_db, autocommit=True, **connect_options()) as conn:
        tables = list_tables(conn, lambda s, t: t in ("fa", "ar", "cl"))
    assert len(tables) == 3
    holder = psycopg.connect(fresh_db)
    try:
        holder.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        row = holder.execute("SELECT pg_export_snapshot()").fetchone()
        assert row is not None
        with SnapshotReader(fresh_db, row[0], label="t") as reader:
            for table in tables:
                assert reader.json_rows(table, table.identity_columns) is None
    finally:
        holder.close()


def test_snapshot_record_equals_streamed_record_for_awkward_values(fresh_db: str, tmp_path: Path) -> None:
    # Not NaN: wal2json 2.5 prints a NaN numeric as null (trap 1, docs/envelope.md).
    rows = [r.replace("'NaN'", "'0.000000000000000000000000000001'") for r in _ROWS]
    _sql(fresh_db, _TABLE.replace('"we\\ird tab"', "awk"), *(f"INSERT INTO awk VALUES {r}" for r in rows))
    config = write_config(
        tmp_path / "t.toml",
        dsn=fresh_db,
        log_root=tmp_path / "log",
        source_extra='snapshot = "initial"',
    )
    assert cli("init", "--config", str(config)).returncode == 0
    assert cli("capture", "--config", str(config), "--until-idle", "1.5").returncode == 0
    # The same rows again, streamed: keys shifted by 10 (the key is (id, "k ey")).
    _sql(fresh_db, *(f"INSERT INTO awk VALUES (1{r[1:]}" for r in rows))
    assert cli("capture", "--config", str(config), "--until-idle", "1.5").returncode == 0
    afters: dict[str, dict[int, bytes]] = {"r": {}, "c": {}}
    for r in records(tmp_path / "log", "shop.public.awk"):
        if r.value and b'"after"' in r.value:
            envelope: dict[str, Any] = orjson.loads(r.value)
            after = r.value[r.value.index(b'"after":') : r.value.index(b',"source"')]
            afters[envelope["op"]][envelope["after"]["id"]] = after
    assert sorted(afters["r"]) == [1, 2, 3] and sorted(afters["c"]) == [11, 12, 13]
    for i in (1, 2, 3):
        assert afters["r"][i].replace(b'{"id":%d,' % i, b'{"id":1%d,' % i, 1) == afters["c"][10 + i]
