"""Debezium as the oracle for our envelope: Debezium's PostgreSQL connector (Kafka Connect standalone,
pgoutput, JSON without schemas) and tributary capture the same database and workload into the same
Kafka cluster; every change is paired and its key, op, before, after and shared `source` fields are
compared. What differs is data (`EXPECTED`), asserted exactly: a new difference fails, and so does one
that disappears. docs/envelope.md ("Compared with Debezium") documents the same table."""

from __future__ import annotations

import os
from pathlib import Path

import psycopg
import pytest

from tests.debezium import DEBEZIUM_PREFIX, run_debezium
from tests.integration.capture.helpers import cli
from tests.integration.kafka.helpers import read_committed, write_kafka_config
from tests.integration.kafka.oracle import (
    EXPECTED,
    EXPECTED_DEBEZIUM,
    EXPECTED_DEBEZIUM_CHUNKED,
    Difference,
    Expected,
    changes_of,
    diff,
)
from tests.kafka_fixtures import KafkaCluster
from tests.waiting import size_of, wait_progress

pytestmark = pytest.mark.integration

SOURCE = "shop"
TABLES = [
    "t_int",
    "t_numeric",
    "t_text",
    "t_bool",
    "t_float",
    "t_bytea",
    "t_time",
    "t_uuid",
    "t_json",
    "t_array",
    "t_array2",
    "t_enum",
    "t_other",
    "t_full",
    "t_pair",
    "t_trunc",
    "t_end",
]

SCHEMA = """
CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy');
CREATE TABLE t_int (id int PRIMARY KEY, s smallint, i integer, b bigint, o oid);
CREATE TABLE t_numeric (id int PRIMARY KEY, n numeric, p numeric(20, 5), big numeric);
CREATE TABLE t_text (id int PRIMARY KEY, t text, v varchar(20), c char(5), doc text);
CREATE TABLE t_bool (id int PRIMARY KEY, b boolean);
CREATE TABLE t_float (id int PRIMARY KEY, r real, d double precision);
CREATE TABLE t_bytea (id int PRIMARY KEY, b bytea);
CREATE TABLE t_time (id int PRIMARY KEY, d date, t time, tz timetz, ts timestamp, tstz timestamptz,
                     ts0 timestamp(0), iv interval);
CREATE TABLE t_uuid (id int PRIMARY KEY, u uuid);
CREATE TABLE t_json (id int PRIMARY KEY, j json, jb jsonb);
CREATE TABLE t_array (id int PRIMARY KEY, ia int[], ta text[], na numeric[], ba boolean[], m int[][]);
CREATE TABLE t_array2 (id int PRIMARY KEY, fa float8[], tsa timestamptz[], ja jsonb[], da date[], ua uuid[]);
CREATE TABLE t_enum (id int PRIMARY KEY, m mood);
CREATE TABLE t_other (id int PRIMARY KEY, money money, inet inet, mac macaddr, bits bit(4), x xml);
CREATE TABLE t_full (id int PRIMARY KEY, note text, doc text);
ALTER TABLE t_full REPLICA IDENTITY FULL;
CREATE TABLE t_pair (b int, a int, note text, PRIMARY KEY (b, a));
CREATE TABLE t_trunc (id int PRIMARY KEY, note text);
CREATE TABLE t_end (id int PRIMARY KEY);
"""

# A value PostgreSQL stores out of line and cannot compress (random digits): an UPDATE that leaves it
# unchanged omits it from the change.
TOASTED = "(SELECT string_agg(md5(random()::text), '') FROM generate_series(1, 300))"

SNAPSHOT_ROWS = f"""
INSERT INTO t_int VALUES (1, -32768, 2147483647, 9223372036854775807, 4294967295);
INSERT INTO t_numeric VALUES (1, 12345678901234567890.123456789, 1.5, 'NaN');
INSERT INTO t_text VALUES (1, 'héllo "quoted" \\ back', 'var', 'ab', {TOASTED});
INSERT INTO t_bool VALUES (1, true);
INSERT INTO t_float VALUES (1, 0.1, -0.0), (2, 'NaN', 'Infinity');
INSERT INTO t_bytea VALUES (1, '\\xdeadbeef00');
INSERT INTO t_time VALUES (1, '2024-01-02', '03:04:05.123456', '03:04:05+02', '2024-01-02 03:04:05.123456',
                           '2024-01-02 03:04:05.5+02', '2024-01-02 03:04:05', '1 year 2 mons 3 days 04:05:06.789');
INSERT INTO t_uuid VALUES (1, 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11');
INSERT INTO t_json VALUES (1, '{{"b": 1, "a": [1, 2]}}', '{{"b": 1, "a": [1, 2]}}');
INSERT INTO t_array VALUES (1, '{{1,NULL,3}}', '{{"a b",NULL,"c"}}', '{{1.50,2}}', '{{t,f}}', '{{{{1,2}},{{3,4}}}}');
INSERT INTO t_array2 VALUES (1, '{{1.5,-0}}', '{{"2024-01-02 03:04:05+00"}}', ARRAY['{{"a": 1}}'::jsonb],
                            '{{2024-01-02}}', '{{a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11}}');
INSERT INTO t_enum VALUES (1, 'happy');
INSERT INTO t_other VALUES (1, 12.34, '192.168.0.1/24', '08:00:2b:01:02:03', B'1010', '<a>1</a>');
INSERT INTO t_full VALUES (1, 'seed', {TOASTED});
INSERT INTO t_pair VALUES (2, 1, 'seed');
INSERT INTO t_trunc VALUES (1, 'seed'), (2, 'seed');
"""

STREAM = """
INSERT INTO t_int VALUES (2, 0, -1, -9223372036854775808, 0);
UPDATE t_int SET s = 7 WHERE id = 1;
UPDATE t_int SET id = 3 WHERE id = 2;
DELETE FROM t_int WHERE id = 3;
INSERT INTO t_numeric VALUES (2, -0.000001, 123456789012345.12345, 'Infinity');
UPDATE t_numeric SET n = 1e-20 WHERE id = 1;
INSERT INTO t_text VALUES (2, '', 'x', 'abcde', 'short');
UPDATE t_text SET t = 'changed' WHERE id = 1;
DELETE FROM t_text WHERE id = 2;
INSERT INTO t_bool VALUES (2, false);
UPDATE t_bool SET b = NULL WHERE id = 1;
INSERT INTO t_float VALUES (3, 3.4028235e38, 1.7976931348623157e308), (4, '-Infinity', 1e-300);
UPDATE t_float SET d = 2.5 WHERE id = 2;
INSERT INTO t_bytea VALUES (2, '\\x');
INSERT INTO t_time VALUES (2, '1970-01-01', '23:59:59.999999', '00:00:00-05:30', '1999-12-31 23:59:59',
                           '2024-06-30 12:00:00+00', '2024-06-30 12:00:00', '-1 days 00:00:01');
INSERT INTO t_uuid VALUES (2, '00000000-0000-0000-0000-000000000000');
INSERT INTO t_json VALUES (2, '[1, "x", null]', '{"n": 12345678901234567890}');
UPDATE t_json SET jb = '{"z": true}' WHERE id = 1;
INSERT INTO t_array VALUES (2, '{}', '{}', '{NaN}', '{}', NULL);
INSERT INTO t_array2 VALUES (2, '{NaN}', '{}', '{}', '{}', '{}');
INSERT INTO t_enum VALUES (2, 'sad');
INSERT INTO t_other VALUES (2, -0.5, '::1', 'ff:ff:ff:ff:ff:ff', B'0001', '<b/>');
UPDATE t_full SET note = 'changed' WHERE id = 1;
DELETE FROM t_full WHERE id = 1;
INSERT INTO t_pair VALUES (3, 4, 'new');
UPDATE t_pair SET note = 'changed' WHERE b = 2;
TRUNCATE t_trunc;
"""


def _has_end_marker(bootstraps: str, topic: str) -> bool:
    """The end marker (the workload's last change) is in `topic`, so everything before it too."""
    return any(value is not None for *_, value, _, _ in read_committed(bootstraps, [topic]))


@pytest.mark.parametrize(
    ("snapshot_method", "envelope"),
    [("consistent", "tributary"), ("chunked", "tributary"), ("consistent", "debezium"), ("chunked", "debezium")],
)
def test_our_records_equal_debeziums_but_for_the_documented_differences(
    fresh_db: str, tmp_path: Path, kafka_broker: KafkaCluster, snapshot_method: str, envelope: str
) -> None:
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        conn.execute(SCHEMA)
        conn.execute(SNAPSHOT_ROWS)
    config = write_kafka_config(
        tmp_path / "kafka.toml",
        dsn=fresh_db,
        log_root=tmp_path / "log",
        bootstraps=kafka_broker.bootstraps,
        create_topics=True,
        name=SOURCE,
    )
    include = ", ".join(f'"public.{t}"' for t in TABLES)  # Debezium's table.include.list, in its order
    config.write_text(
        config.read_text().replace('include = ["public.*"]', f"include = [{include}]")
        + f'snapshot_method = "{snapshot_method}"\nenvelope = "{envelope}"\n'
    )  # the last table: the source's
    done = cli("capture", "--config", str(config), "--until-idle", "1")  # snapshot, and our slot
    assert done.returncode == 0, done.stderr
    tables = [f"public.{t}" for t in TABLES]
    dbz = tmp_path / "debezium"
    with run_debezium(fresh_db, kafka_broker.bootstraps, dbz, source=SOURCE, tables=tables) as connect:
        with psycopg.connect(fresh_db, autocommit=True) as conn:
            conn.execute(STREAM)
            conn.execute("INSERT INTO t_end VALUES (1)")
        for _ in range(10):  # a capture idle for 1 s before the server sent the workload (a loaded machine) runs again
            done = cli("capture", "--config", str(config), "--until-idle", "1")
            assert done.returncode == 0, done.stderr
            if _has_end_marker(kafka_broker.bootstraps, f"{SOURCE}.public.t_end"):
                break
        else:
            raise AssertionError("capture did not write the workload's last change")
        end = f"{DEBEZIUM_PREFIX}.public.t_end"
        wait_progress(
            lambda: _has_end_marker(kafka_broker.bootstraps, end),
            lambda: size_of(connect.log),
            what="Debezium to write the workload",
            poll=1.0,
        )
    ours = changes_of(read_committed(kafka_broker.bootstraps, [f"{SOURCE}.public.{t}" for t in TABLES]), SOURCE)
    theirs = changes_of(
        read_committed(kafka_broker.bootstraps, [f"{DEBEZIUM_PREFIX}.public.{t}" for t in TABLES]), DEBEZIUM_PREFIX
    )
    placed = diff(ours, theirs, _column_types(fresh_db))
    found = [d for _, d in placed]
    if os.environ.get("PRINT_DEBEZIUM_DIFF"):  # to review a change of the table
        print(f"Debezium snapshotted and streamed {connect.ready_after_s:.1f} s after its JVM started")
        print("\n".join(sorted(map(repr, set(found)))))
        print("\n".join(f"{where}: {d}" for where, d in placed if d.field == "source.snapshot"))
    expected = {
        "tributary": EXPECTED,
        "debezium": EXPECTED_DEBEZIUM_CHUNKED if snapshot_method == "chunked" else EXPECTED_DEBEZIUM,
    }[envelope]
    assert set(found) == {e.difference for e in expected}, _explain(found, expected)


def _column_types(dsn: str) -> dict[tuple[str, str], str]:
    """(table, column) → the column's type as PostgreSQL names it, for the tables of `public`."""
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT c.relname, a.attname, format_type(a.atttypid, a.atttypmod) FROM pg_attribute a"
            " JOIN pg_class c ON c.oid = a.attrelid JOIN pg_namespace n ON n.oid = c.relnamespace"
            " WHERE n.nspname = 'public' AND c.relkind = 'r' AND a.attnum > 0 AND NOT a.attisdropped"
        ).fetchall()
    return {(table, column): type_name for table, column, type_name in rows}


def _explain(found: list[Difference], rows: list[Expected]) -> str:
    """What the run found that the table does not list, and what it lists that the run did not find."""
    expected = {e.difference for e in rows}
    extra = sorted(set(found) - expected)
    gone = sorted(expected - set(found))
    return (
        "new differences:\n"
        + "\n".join(map(repr, extra))
        + "\ndifferences no longer found:\n"
        + "\n".join(map(repr, gone))
    )
