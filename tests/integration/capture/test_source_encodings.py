"""Values reach the log as the table holds them, whatever the database's settings and encoding:
output settings set on the database (`ALTER DATABASE … SET`) do not change a value's spelling in
the snapshot or the stream, a LATIN1/WIN1252 database's text arrives as correct UTF-8, a float's
-0 stays -0.0 on both paths, and a SQL_ASCII database is refused in one line."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import orjson
import psycopg
import pytest
from psycopg import sql

from tests.integration.capture.helpers import cli, records, table_state, write_config
from tests.pg import PgServer

pytestmark = pytest.mark.integration

TOPIC = "shop.public.t"
# Each of these would change how a value prints, were it not pinned by capture.
DATABASE_SETTINGS = {
    "bytea_output": "escape",
    "DateStyle": "SQL, DMY",
    "IntervalStyle": "sql_standard",
    "extra_float_digits": "0",
    "TimeZone": "Asia/Kolkata",
}


@contextmanager
def _database(server: PgServer, encoding: str, settings: dict[str, str] | None = None) -> Iterator[str]:
    name = f"enc_{encoding.lower()}_{uuid.uuid4().hex[:8]}"
    with server.admin() as conn:
        conn.execute(
            sql.SQL("CREATE DATABASE {} ENCODING {} LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0").format(
                sql.Identifier(name), sql.Literal(encoding)
            )
        )
        for key, value in (settings or {}).items():
            conn.execute(
                sql.SQL("ALTER DATABASE {} SET {} = {}").format(sql.Identifier(name), sql.SQL(key), sql.Literal(value))
            )
    try:
        yield server.dsn(name)
    finally:
        server.drop_database(name)


def _oracle(dsn: str, query: str) -> bytes:
    """The table, spelt by the test itself: {key: row} as canonical JSON (a float's sign shows)."""
    with psycopg.connect(dsn, options="-c client_encoding=UTF8") as conn:
        cur = conn.cursor(binary=True)  # exact values, whatever the database's output settings
        rows = cur.execute(query).fetchall()
        names = [d.name for d in cur.description or []]
    state = {orjson.dumps({"id": r[0]}).decode(): dict(zip(names, r, strict=True)) for r in rows}
    return orjson.dumps(state, option=orjson.OPT_SORT_KEYS)


def _fold(root: Path) -> bytes:
    return orjson.dumps(table_state(root, TOPIC), option=orjson.OPT_SORT_KEYS)


def _capture(config: Path) -> None:
    res = cli("capture", "--config", str(config), "--until-idle", "1")
    assert res.returncode == 0, res.stderr


def test_database_output_settings_change_no_value(pg_server: PgServer, tmp_path: Path) -> None:
    insert = (
        "INSERT INTO t SELECT g, '\\x00ff41'::bytea || g::text::bytea, date '2024-03-04' + g,"
        " interval '1 day 2 hours' * g, CASE WHEN g % 2 = 0 THEN '-0'::float8 ELSE (g / 3.0)::float8 END,"
        " CASE WHEN g % 2 = 0 THEN '-0'::real ELSE (g / 10.0)::real END FROM generate_series({}, {}) g"
    )
    query = "SELECT id, encode(b, 'hex') AS b, to_char(d, 'YYYY-MM-DD') AS d, NULL AS i, f, NULL AS r FROM t"
    with _database(pg_server, "UTF8", DATABASE_SETTINGS) as dsn:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("CREATE TABLE t (id int PRIMARY KEY, b bytea, d date, i interval, f float8, r real)")
            conn.execute(insert.format(1, 20))
        config = write_config(tmp_path / "t.toml", dsn=dsn, log_root=tmp_path / "log")
        _capture(config)  # the snapshot
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(insert.format(21, 40))
            conn.execute("UPDATE t SET f = '-0', r = '-0' WHERE id IN (1, 3)")
        _capture(config)  # the stream
        with psycopg.connect(dsn, options="-c IntervalStyle=postgres -c extra_float_digits=1") as conn:
            # real read as its shortest text (what the stream and the snapshot print), then a float
            want = {
                row[0]: (row[1], float(row[2])) for row in conn.execute("SELECT id, i::text, r::text FROM t").fetchall()
            }
        got = table_state(tmp_path / "log", TOPIC)
        expected = orjson.loads(_oracle(dsn, query))
        for row in expected.values():
            row["i"], row["r"] = want[row["id"]]
        diff = {
            k: (got.get(k), v)
            for k, v in expected.items()
            if orjson.dumps(got.get(k), option=orjson.OPT_SORT_KEYS) != orjson.dumps(v, option=orjson.OPT_SORT_KEYS)
        }
        assert not diff and got.keys() == expected.keys(), list(diff.items())[:3]
        negative = [v for v in got.values() if str(v["f"]) == "-0.0"]
        assert len(negative) == 22, "both paths keep a float's -0"


@pytest.mark.parametrize(("encoding", "text"), [("LATIN1", "éÿ çà"), ("WIN1252", "é€ œ…")])
def test_a_non_utf8_database_arrives_as_utf8(pg_server: PgServer, tmp_path: Path, encoding: str, text: str) -> None:
    with _database(pg_server, encoding) as dsn:
        with psycopg.connect(dsn, autocommit=True, options="-c client_encoding=UTF8") as conn:
            conn.execute("CREATE TABLE t (id int PRIMARY KEY, s text, tags text[])")
            conn.execute("INSERT INTO t SELECT g, %s || g, ARRAY[%s, 'x'] FROM generate_series(1, 50) g", (text, text))
        config = write_config(tmp_path / "t.toml", dsn=dsn, log_root=tmp_path / "log")
        init = cli("init", "--config", str(config))
        assert init.returncode == 0 and "Traceback" not in init.stderr, init.stdout + init.stderr
        _capture(config)  # the snapshot
        with psycopg.connect(dsn, autocommit=True, options="-c client_encoding=UTF8") as conn:
            conn.execute(
                "INSERT INTO t SELECT g, %s || g, ARRAY[%s, 'y'] FROM generate_series(51, 100) g", (text, text)
            )
            conn.execute("UPDATE t SET s = s || %s WHERE id %% 3 = 0", (text,))
            conn.execute("DELETE FROM t WHERE id % 7 = 0")
        _capture(config)  # the stream
        for rec in records(tmp_path / "log", TOPIC):
            for part in (rec.key, rec.value):
                assert part is None or part.decode("utf-8")  # strict: no invalid UTF-8 in a record
        assert _fold(tmp_path / "log") == _oracle(dsn, "SELECT id, s, tags FROM t")
        assert text in _fold(tmp_path / "log").decode()


def test_a_sql_ascii_database_is_refused_in_one_line(pg_server: PgServer, tmp_path: Path) -> None:
    with _database(pg_server, "SQL_ASCII") as dsn:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("CREATE TABLE t (id int PRIMARY KEY, s text)")
            conn.execute("INSERT INTO t VALUES (1, convert_from('\\xe9'::bytea, 'SQL_ASCII'))")
        config = write_config(tmp_path / "t.toml", dsn=dsn, log_root=tmp_path / "log")
        init = cli("init", "--config", str(config))
        assert init.returncode != 0 and "Traceback" not in init.stderr, init.stderr
        assert "SQL_ASCII" in init.stdout and "unknown encoding" in init.stdout, init.stdout
        res = cli("capture", "--config", str(config), "--until-idle", "1")
        assert res.returncode == 1 and "Traceback" not in res.stderr, res.stderr
        last = res.stderr.strip().splitlines()[-1]
        assert last.startswith("tributary: source 'shop'") and "SQL_ASCII" in last, last
        assert records(tmp_path / "log", TOPIC) == []
