"""The table mirror's view has the captured table's columns, typed from the schema records capture
writes (real capture, real Spark), follows a column change incrementally, and a rebuild agrees."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.integration.capture.helpers import cli, write_config
from tests.integration.projections.helpers import capture_until_idle, dump, run_sql
from tributary.projections.runner import RunSettings, rebuild, run

pytestmark = pytest.mark.integration
TOPIC = "shop.public.items"
NAME = "shop_public_items"
VIEW = f"views.{NAME}"


def _types(dsn: str) -> dict[str, str]:
    with psycopg.connect(dsn) as conn:
        return dict(
            conn.execute(
                "SELECT a.attname, format_type(a.atttypid, a.atttypmod) FROM pg_attribute a "
                "WHERE a.attrelid = %s::regclass AND a.attnum > 0 AND NOT a.attisdropped",
                (VIEW,),
            ).fetchall()
        )


def _rows(dsn: str, columns: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn) as conn:
        return conn.execute(f"SELECT {columns} FROM {VIEW} ORDER BY id").fetchall()  # noqa: S608


def test_mirror_view_is_typed_and_follows_a_column_change(spark: Any, fresh_db: str, tmp_path: Path) -> None:
    run_sql(
        fresh_db,
        "CREATE TYPE mood AS ENUM ('ok', 'sad')",
        "CREATE TABLE public.items (id int PRIMARY KEY, name varchar(20), price numeric(10,2), big bigint, "
        "ok boolean, at timestamptz, day date, raw bytea, doc jsonb, tags int[], feel mood, ratio double precision)",
        "INSERT INTO items VALUES (1, 'one', 1.50, 9007199254740993, true, '2024-01-02 03:04:05.123456+00', "
        "'2024-02-29', '\\xdeadbeef', '{\"a\": [1, 2.50]}', '{1,NULL,3}', 'sad', 0.25), "
        "(2, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL)",
    )
    config = write_config(
        tmp_path / "t.toml",
        dsn=fresh_db,
        log_root=tmp_path / "log",
        extra=f'[service]\ndsn = "{fresh_db}"',
    )
    init = cli("init", "--config", str(config))
    assert init.returncode == 0, init.stdout + init.stderr
    s = RunSettings(
        dsn=fresh_db, log_root=tmp_path / "log", mirror=(TOPIC,), spark_master="local[2]", shuffle_partitions=2
    )
    capture_until_idle(config)
    run(NAME, s, spark=spark)

    types = _types(fresh_db)
    assert types == {
        "id": "integer",
        "name": "character varying(20)",
        "price": "numeric(10,2)",
        "big": "bigint",
        "ok": "boolean",
        "at": "timestamp with time zone",
        "day": "date",
        "raw": "bytea",
        "doc": "jsonb",
        "tags": "jsonb",  # arrays: the documented jsonb fallback
        "feel": "jsonb",  # an enum of the source database: jsonb too
        "ratio": "double precision",
        "key": "text",
        "row": "jsonb",
    }
    with psycopg.connect(fresh_db) as conn:
        want = conn.execute(
            "SELECT id, name, price, big, ok, at, day, raw, doc, to_jsonb(tags), to_jsonb(feel), ratio "
            "FROM public.items ORDER BY id"
        ).fetchall()
    assert _rows(fresh_db, "id, name, price, big, ok, at, day, raw, doc, tags, feel, ratio") == want
    assert [r[0] for r in _rows(fresh_db, "key")] == ['{"id":1}', '{"id":2}']

    # a column added at the source: its schema record reaches the view in the next incremental run
    run_sql(fresh_db, "ALTER TABLE items ADD COLUMN note text", "INSERT INTO items (id, note) VALUES (3, 'new')")
    capture_until_idle(config)
    done = run(NAME, s, spark=spark)
    assert not done.rebuilt
    assert _types(fresh_db)["note"] == "text"
    assert _rows(fresh_db, "id, note") == [(1, None), (2, None), (3, "new")]
    incremental = dump(fresh_db, VIEW)

    rebuild(NAME, s, spark=spark)
    assert dump(fresh_db, VIEW) == incremental
    assert "note" in _types(fresh_db)
