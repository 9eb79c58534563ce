"""`tributary init` warns about a row filter over non-key columns on a table without REPLICA
IDENTITY FULL (its DELETEs and out-of-filter UPDATEs become delete + tombstone), and
`--replica-identity-full` sets it; a filter over key columns, or a FULL table, is quiet."""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest

from tests.integration.capture.helpers import cli, write_config

pytestmark = pytest.mark.integration

RULES = '[[sources.rules]]\ntables = ["public.*"]\nrow_filter = "region = \'eu\' and id > 0"\n'


def _identity(dsn: str, table: str) -> str:
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT relreplident FROM pg_class WHERE oid = %s::regclass", (table,)).fetchone()
    assert row is not None
    return str(row[0])


def test_init_warns_about_a_row_filter_beyond_the_key_and_sets_full_identity_when_asked(
    fresh_db: str, tmp_path: Path
) -> None:
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE orders (id int PRIMARY KEY, region text)")
        conn.execute("CREATE TABLE regions (id int, region text, PRIMARY KEY (id, region))")
    config = write_config(tmp_path / "t.toml", dsn=fresh_db, log_root=tmp_path / "log", source_extra=RULES)

    warned = cli("init", "--config", str(config))
    assert warned.returncode == 0, warned.stdout + warned.stderr
    assert "public.orders: its row_filter reads region, which the WAL's old rows lack" in warned.stdout
    assert "--replica-identity-full" in warned.stdout
    assert "public.regions: its row_filter" not in warned.stdout  # the filter reads key columns only
    assert _identity(fresh_db, "orders") == "d"

    fixed = cli("init", "--config", str(config), "--replica-identity-full")
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr
    assert "public.orders: its row_filter reads region; set REPLICA IDENTITY FULL" in fixed.stdout
    assert _identity(fresh_db, "orders") == "f"

    quiet = cli("init", "--config", str(config))
    assert "its row_filter" not in quiet.stdout
