"""A source's outbox tables (`[[sources.outbox]]`) as init and capture see them: init checks the table
and every column its entry names (an outbox needs no key: its UPDATEs and DELETEs are never
records); capture reads an outbox table whatever the source's `include` says."""

from __future__ import annotations

from pathlib import Path

import orjson
import psycopg
import pytest

from tests.backends import table_state
from tests.integration.capture.helpers import cli, records, write_config

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


def test_an_outbox_table_is_read_though_include_names_only_other_tables(fresh_db: str, tmp_path: Path) -> None:
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE orders (id int PRIMARY KEY)")
        conn.execute("CREATE TABLE outbox (id int, aggregatetype text, aggregateid text, type text, payload text)")
    entry = 'snapshot = "never"\n[[sources.outbox]]\ntable = "public.outbox"\n'
    log_root = tmp_path / "log"
    config = write_config(tmp_path / "t.toml", dsn=fresh_db, log_root=log_root, source_extra=entry)
    config.write_text(config.read_text().replace('include = ["public.*"]', 'include = ["public.orders"]'))
    assert cli("init", "--config", str(config)).returncode == 0  # the slot: changes from now on
    with psycopg.connect(fresh_db, autocommit=True) as conn, conn.transaction():
        conn.execute("INSERT INTO orders VALUES (1)")
        conn.execute("INSERT INTO outbox VALUES (1, 'Order', '1', 'Placed', 'hello')")
        conn.execute("DELETE FROM outbox")
    res = cli("capture", "--config", str(config), "--until-idle", "1")
    assert res.returncode == 0, res.stderr
    (event,) = records(log_root, "outbox.event.Order")
    assert (event.key, event.value, orjson.loads(event.headers)) == (b'"1"', b'"hello"', {"id": "1", "type": "Placed"})
    assert table_state(records(log_root, "shop.public.orders")) == {'{"id":1}': {"id": 1}}
