"""`envelope = "debezium"` read by a Debezium consumer nobody here wrote: Debezium's JDBC sink connector
(Kafka Connect standalone, JSON with schemas) copies tributary's topics into a second database of the
same server, whose tables must then equal the source's, row by row, after a snapshot and a stream of
inserts, updates, deletes, a primary-key change and a truncate."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.debezium import run_jdbc_sink
from tests.integration.capture.helpers import cli
from tests.integration.kafka.helpers import write_kafka_config
from tests.kafka_fixtures import KafkaCluster
from tests.pg import PgServer, fresh_database
from tests.waiting import size_of, wait_progress

pytestmark = pytest.mark.integration

SOURCE = "shop"
# Each table with its key, in the order rows are compared.
TABLES = {"t_kinds": "id", "t_time": "id", "t_pair": "b, a", "t_gone": "id"}

SCHEMA = """
CREATE TABLE t_kinds (id bigint PRIMARY KEY, s smallint, i integer, n numeric(20, 5), big numeric, t text,
                      v varchar(20), ok boolean, d double precision, u uuid, jb jsonb);
CREATE TABLE t_time (id int PRIMARY KEY, d date, ts timestamp, ts0 timestamp(0), tstz timestamptz, tm time,
                     tz timetz, iv interval, j json);
CREATE TABLE t_pair (b int, a text, note text, PRIMARY KEY (b, a));
CREATE TABLE t_gone (id int PRIMARY KEY, note text);
"""

SNAPSHOT_ROWS = """
INSERT INTO t_kinds VALUES (1, -32768, 2147483647, 1.5, 12345678901234567890.123456789, 'héllo "q" \\ b', 'v',
                            true, 0.1, 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', '{"b": 1, "a": [1, 2]}'),
                           (2, 0, 0, 0, 0, '', '', false, -2.5, NULL, NULL);
INSERT INTO t_time VALUES (1, '2024-01-02', '2024-01-02 03:04:05.123456', '2024-01-02 03:04:05',
                           '2024-01-02 03:04:05.5+02', '03:04:05.123456', '03:04:05+02',
                           '1 year 2 mons 3 days 04:05:06.789', '{"b": 1, "a": [1, 2]}');
INSERT INTO t_pair VALUES (2, 'x', 'seed'), (1, 'y', 'seed');
INSERT INTO t_gone VALUES (1, 'seed'), (2, 'seed'), (3, 'seed');
"""

STREAM = """
INSERT INTO t_kinds VALUES (3, 7, -1, -0.00001, 1e-20, 'new', 'w', NULL, 1e300, '00000000-0000-0000-0000-000000000000',
                            '{"n": 12345678901234567890, "s": "ü"}');
UPDATE t_kinds SET t = 'changed', jb = '[1, "x", null]' WHERE id = 1;
UPDATE t_kinds SET id = 4 WHERE id = 2;
DELETE FROM t_kinds WHERE id = 3;
INSERT INTO t_time VALUES (2, '1970-01-01', '1999-12-31 23:59:59', '2024-06-30 12:00:00', '2024-06-30 12:00:00+00',
                           '23:59:59.999999', '00:00:00-05:30', '-1 days +00:00:01', '[1, "x", null]');
UPDATE t_time SET tstz = '2000-02-29 23:59:59.999999-08' WHERE id = 1;
INSERT INTO t_pair VALUES (3, 'z', 'new');
UPDATE t_pair SET note = 'changed' WHERE b = 2;
UPDATE t_pair SET a = 'w' WHERE b = 1;
DELETE FROM t_pair WHERE b = 3;
INSERT INTO t_gone VALUES (4, 'streamed');
TRUNCATE t_gone;
INSERT INTO t_gone VALUES (9, 'after the truncate');
"""


def _rows(dsn: str) -> dict[str, list[tuple[Any, ...]]]:
    """Every table's rows in key order (a timetz compares as the instant: Debezium's ZonedTime is in UTC)."""
    with psycopg.connect(dsn) as conn:
        return {t: conn.execute(f"SELECT * FROM {t} ORDER BY {key}").fetchall() for t, key in TABLES.items()}


def test_debeziums_jdbc_sink_copies_our_debezium_records_into_equal_tables(
    fresh_db: str, pg_server: PgServer, tmp_path: Path, kafka_broker: KafkaCluster
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
    # One partition: a truncate is one record (on the first partition, as Debezium writes it), and a
    # sink applies the records of different partitions in no set order (docs/envelope.md).
    config.write_text(config.read_text() + 'envelope = "debezium"\npartitions = 1\n')  # the last table: the source's
    done = cli("capture", "--config", str(config), "--until-idle", "1")  # the snapshot
    assert done.returncode == 0, done.stderr
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        conn.execute(STREAM)
    done = cli("capture", "--config", str(config), "--until-idle", "1")  # the stream
    assert done.returncode == 0, done.stderr
    source = _rows(fresh_db)
    with fresh_database(pg_server) as target:
        with psycopg.connect(target, autocommit=True) as conn:
            conn.execute(SCHEMA)  # the same tables: the sink writes into them (its schema evolution adds none)
        rename = (f"{SOURCE}\\.public\\.(.*)", "$1")
        with run_jdbc_sink(
            target, kafka_broker.bootstraps, tmp_path / "sink", topics_regex=f"{SOURCE}\\.public\\..*", rename=rename
        ) as connect:

            def copied() -> bool:
                connect.running()  # a failed task fails the wait with its trace
                return _rows(target) == source

            wait_progress(copied, lambda: (size_of(connect.log), str(_rows(target))), what="the JDBC sink to copy")
        copy = _rows(target)
    for table, rows in source.items():
        assert copy[table] == rows, table
    assert (
        len(source["t_kinds"]) == 2 and len(source["t_pair"]) == 2 and source["t_gone"] == [(9, "after the truncate")]
    )
