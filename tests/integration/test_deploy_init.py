"""deploy/postgres/init.sql on a real PostgreSQL (with wal2json), then `tributary init` with the
compose file's own settings: the databases and tables the script creates are what the
configuration names, so `init` succeeds where it used to exit 1 (the database `shop` was missing).

The script's database names are made unique for the test server (it may be shared); the
settings are compose's, their DSNs pointed at those databases, the log local (no broker here)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest
import yaml

from tests.integration.capture.helpers import cli
from tests.pg import PgServer
from tests.waiting import run_process

pytestmark = pytest.mark.integration

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


@pytest.fixture
def compose_databases(pg_server: PgServer) -> Iterator[dict[str, str]]:
    suffix = uuid.uuid4().hex[:8]
    names = {"tributary": f"tributary_{suffix}", "shop": f"shop_{suffix}"}
    try:
        yield names
    finally:
        for name in names.values():
            pg_server.drop_database(name)


def _renamed(sql: str, names: dict[str, str]) -> str:
    for old, new in names.items():
        sql = sql.replace(f"CREATE DATABASE {old};", f"CREATE DATABASE {new};")
        sql = sql.replace(f"\\connect {old}\n", f"\\connect {new}\n")
    return sql


def _pointed(dsn: str, server_dsn: str, names: dict[str, str]) -> str:
    """A compose DSN (postgres:postgres@postgres:5432/<db>) on the test server's database."""
    db = urlsplit(dsn).path.lstrip("/")
    return urlunsplit(urlsplit(server_dsn)._replace(path=f"/{names[db]}"))


def test_init_script_then_tributary_init_succeeds(
    pg_server: PgServer, compose_databases: dict[str, str], tmp_path: Path
) -> None:
    sql = _renamed((DEPLOY / "postgres" / "init.sql").read_text(), compose_databases)
    assert all(name in sql for name in compose_databases.values())  # every database was renamed
    script = tmp_path / "init.sql"
    script.write_text(sql)
    ran = run_process(
        ["psql", "-X", "-v", "ON_ERROR_STOP=1", "-f", str(script), pg_server.dsn("postgres")], what="psql init.sql"
    )
    assert ran.returncode == 0, ran.stderr

    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    env = {k: str(v) for k, v in compose["services"]["init"]["environment"].items()}
    env.pop("TRIBUTARY_LOG__BACKEND")  # the local log: no broker on this machine
    env.pop("TRIBUTARY_LOG__KAFKA")
    env["TRIBUTARY_LOG__ROOT"] = str(tmp_path / "log")
    env["TRIBUTARY_SERVICE__DSN"] = _pointed(env["TRIBUTARY_SERVICE__DSN"], pg_server.base_dsn, compose_databases)
    sources = json.loads(env["TRIBUTARY_SOURCES"])
    for source in sources:
        source["dsn"] = _pointed(source["dsn"], pg_server.base_dsn, compose_databases)
    env["TRIBUTARY_SOURCES"] = json.dumps(sources)

    out = cli(*compose["services"]["init"]["command"][1:], env=env)
    assert out.returncode == 0, out.stdout + out.stderr

    with psycopg.connect(sources[0]["dsn"]) as conn:
        slots = conn.execute("SELECT slot_name, plugin FROM pg_replication_slots WHERE database = current_database()")
        assert slots.fetchall() == [("tributary_shop", "wal2json")]
        assert conn.execute("SELECT count(*) FROM orders").fetchone() == (3,)
    with psycopg.connect(env["TRIBUTARY_SERVICE__DSN"]) as conn:  # the migrations ran there
        assert conn.execute("SELECT to_regclass('eventstore.events') IS NOT NULL").fetchone() == (True,)
