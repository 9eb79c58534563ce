"""`tributary init` checks a source's outbox tables (`[[sources.outbox]]`): the table and every
column its entry names exist; an outbox needs no key (its UPDATEs and DELETEs are never records)."""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest

from tests.integration.capture.helpers import cli, write_config

pytestmark = pytest.mark.integration


def test_init_names_a_missing_outbox_column_and_needs_no_key(fresh_db: str, tmp_path: Path) -> None:
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE orders (id int PRIMARY KEY)")
        conn.execute("CREATE TABLE outbox (id uuid, kind text, aggregateid text, type text, payload jsonb)")
    entry = '[[sources.outbox]]\ntable = "public.outbox"\nheader_columns = ["tenant"]\n'
    config = write_config(tmp_path / "t.toml", dsn=fresh_db, log_root=tmp_path / "log", source_extra=entry)
    res = cli("init", "--config", str(config))
    assert res.returncode == 1
    assert (
        "outbox table public.outbox has no column for route_by_column = 'aggregatetype', header_columns = 'tenant' "
        "([[sources.outbox]] of source 'shop')"
    ) in res.stdout
    assert "no primary key" not in res.stdout  # not a table whose rows are captured

    entry = '[[sources.outbox]]\ntable = "public.outbox"\nroute_by_column = "kind"\n'
    config = write_config(tmp_path / "t.toml", dsn=fresh_db, log_root=tmp_path / "log", source_extra=entry)
    res = cli("init", "--config", str(config))
    assert res.returncode == 0, res.stdout + res.stderr
    assert "public.outbox: its INSERTs are events on outbox.event.{route}" in res.stdout
    assert "1 table(s) to capture" in res.stdout  # orders

    entry = '[[sources.outbox]]\ntable = "public.missing"\n'
    config = write_config(tmp_path / "t.toml", dsn=fresh_db, log_root=tmp_path / "log", source_extra=entry)
    res = cli("init", "--config", str(config))
    assert res.returncode == 1
    assert "outbox table public.missing does not exist ([[sources.outbox]] of source 'shop')" in res.stdout
