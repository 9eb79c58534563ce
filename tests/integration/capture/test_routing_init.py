"""`tributary init` checks `[[sources.routes]]` against the source's tables: tables that cannot
share their routed topic are refused, one line naming both."""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest

from tests.integration.capture.helpers import cli, write_config

pytestmark = pytest.mark.integration

ROUTES = '[[sources.routes]]\ntables = "public.shard_*"\ntopic = "{source}.orders"\n'


def test_init_refuses_routed_tables_of_different_shapes_and_accepts_alike_ones(fresh_db: str, tmp_path: Path) -> None:
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE shard_1 (id int PRIMARY KEY, v text)")
        conn.execute("CREATE TABLE shard_2 (id int PRIMARY KEY, v text, extra int)")
    config = write_config(tmp_path / "t.toml", dsn=fresh_db, log_root=tmp_path / "log", source_extra=ROUTES)
    res = cli("init", "--config", str(config))
    assert res.returncode == 1, res.stdout
    assert (
        "public.shard_1 and public.shard_2 cannot share topic shop.orders: their columns differ "
        "([[sources.routes]] of source 'shop')"
    ) in res.stdout

    with psycopg.connect(fresh_db, autocommit=True) as conn:
        conn.execute("ALTER TABLE shard_2 DROP COLUMN extra")
    res = cli("init", "--config", str(config))
    assert res.returncode == 0, res.stdout + res.stderr
    assert "public.shard_1 → topic shop.orders" in res.stdout and "public.shard_2 → topic shop.orders" in res.stdout
