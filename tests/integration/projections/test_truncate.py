"""TRUNCATE through real capture and Spark: the table mirror drops the rows the truncate removed,
keeps those written after it, and an incremental run equals a rebuild byte for byte."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.integration.capture.helpers import cli, write_config
from tests.integration.projections.helpers import capture_until_idle, dump, run_sql
from tributary.eventstore.migrate import head_revision
from tributary.log.local import canonical_json
from tributary.projections.runner import RunSettings, rebuild, run

pytestmark = pytest.mark.integration
TOPIC = "shop.public.orders"
VIEW = "views.shop_public_orders"


def _source(dsn: str) -> dict[str, dict[str, Any]]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute("SELECT id, total::text, note FROM public.orders").fetchall()
    return {canonical_json({"id": i}).decode(): {"id": i, "total": t, "note": n} for i, t, n in rows}


def _mirror(dsn: str) -> dict[str, dict[str, Any]]:
    with psycopg.connect(dsn) as conn:
        return {k: r for k, r in conn.execute(f"SELECT key, row FROM {VIEW}")}


def test_truncate_applied_incrementally_and_by_rebuild(spark: Any, fresh_db: str, tmp_path: Path) -> None:
    run_sql(fresh_db, "CREATE TABLE public.orders (id int PRIMARY KEY, total numeric(12,2), note text)")
    config = write_config(
        tmp_path / "t.toml",
        dsn=fresh_db,
        log_root=tmp_path / "log",
        source_extra='snapshot = "never"',
        extra=f'[service]\ndsn = "{fresh_db}"',
    )
    init = cli("init", "--config", str(config))  # slot, and the service migrations (0002: projections)
    assert init.returncode == 0, init.stdout + init.stderr
    assert f"migrations at {head_revision()}" in init.stdout
    s = RunSettings(
        dsn=fresh_db, log_root=tmp_path / "log", mirror=(TOPIC,), spark_master="local[2]", shuffle_partitions=2
    )

    run_sql(
        fresh_db,
        "INSERT INTO orders SELECT i, i * 1.25, 'before ' || i FROM generate_series(1, 30) i",
        "UPDATE orders SET note = 'updated' WHERE id % 7 = 0",
        "DELETE FROM orders WHERE id IN (3, 4)",
    )
    capture_until_idle(config)
    run("shop_public_orders", s, spark=spark)
    assert _mirror(fresh_db) == _source(fresh_db) and len(_source(fresh_db)) == 28

    run_sql(
        fresh_db,
        "TRUNCATE orders",
        "INSERT INTO orders VALUES (5, 5.55, 'back after the truncate'), (100, 1.00, 'new')",
        "UPDATE orders SET total = 2.00 WHERE id = 100",
        # one transaction: a row written before the truncate goes, one written after it stays
        "BEGIN; INSERT INTO orders VALUES (200, 2.00, 'gone'); TRUNCATE orders; "
        "INSERT INTO orders VALUES (201, 2.01, 'stays'), (6, 6.00, 'again'); COMMIT",
        "INSERT INTO orders VALUES (7, 7.00, 'after both')",
    )
    capture_until_idle(config)
    done = run("shop_public_orders", s, spark=spark)
    assert not done.rebuilt and done.records > 0
    expected = _source(fresh_db)
    assert set(expected) == {canonical_json({"id": i}).decode() for i in (6, 7, 201)}
    assert _mirror(fresh_db) == expected, "incremental run"
    incremental = dump(fresh_db, VIEW)

    rebuild("shop_public_orders", s, spark=spark)
    assert _mirror(fresh_db) == expected, "rebuild"
    assert dump(fresh_db, VIEW) == incremental
