"""Real PostgreSQL servers for the tests: embedded (default), Docker (testcontainers) or a DSN.

Selected by TRIBUTARY_TEST_PG=embedded|docker|<dsn>. Never a mock.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
from psycopg import sql

from tributary.api.devdb.embedded import EmbeddedPostgres

__all__ = ["REPO_ROOT", "PgServer", "start_server"]

REPO_ROOT = Path(__file__).resolve().parent.parent  # the checkout: tests' own modules import from here


def _with_db(dsn: str, dbname: str) -> str:
    parts = urlsplit(dsn)
    return urlunsplit(parts._replace(path=f"/{dbname}"))


@dataclass
class PgServer:
    """A running server the tests may create databases on (and, if embedded, restart)."""

    base_dsn: str
    embedded: EmbeddedPostgres | None = None
    _container: Any = field(default=None, repr=False)

    def dsn(self, dbname: str = "tributary") -> str:
        return _with_db(self.base_dsn, dbname)

    def admin(self) -> psycopg.Connection[Any]:
        return psycopg.connect(self.dsn("postgres"), autocommit=True)

    def create_database(self, prefix: str = "t") -> str:
        name = f"{prefix}_{uuid.uuid4().hex[:10]}"
        with self.admin() as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        return name

    def drop_database(self, name: str) -> None:
        with self.admin() as conn:
            slots = conn.execute(
                "SELECT slot_name, active_pid FROM pg_replication_slots WHERE database = %s", (name,)
            ).fetchall()
            for slot, pid in slots:
                if pid:
                    conn.execute("SELECT pg_terminate_backend(%s)", (pid,))
                with contextlib.suppress(psycopg.Error):
                    conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))

    def restart(self) -> None:
        if self.embedded is None:
            raise RuntimeError("only the embedded server can be restarted by the tests")
        self.embedded.restart()

    def stop(self) -> None:
        if self.embedded is not None:
            self.embedded.destroy()
        if self._container is not None:
            self._container.stop()


def _docker() -> PgServer:
    from testcontainers.postgres import PostgresContainer  # only needed on machines with Docker

    # debezium/postgres ships wal2json; wal_level=logical is its default.
    container = PostgresContainer("debezium/postgres:15", username="postgres", password="postgres")
    container.with_command(
        "postgres -c wal_level=logical -c max_replication_slots=32 -c max_wal_senders=32 -c TimeZone=UTC"
    )
    container.start()
    host, port = container.get_container_host_ip(), container.get_exposed_port(5432)
    return PgServer(base_dsn=f"postgresql://postgres:postgres@{host}:{port}/postgres", _container=container)


def start_server(mode: str, workdir: Path) -> PgServer:
    """Start (or attach to) the server named by TRIBUTARY_TEST_PG's value."""
    if mode == "docker":
        return _docker()
    if mode != "embedded":
        return PgServer(base_dsn=mode)
    cluster = EmbeddedPostgres(workdir / "pg")
    cluster.up()
    return PgServer(base_dsn=cluster.dsn(), embedded=cluster)


@contextlib.contextmanager
def fresh_database(server: PgServer, prefix: str = "t") -> Iterator[str]:
    name = server.create_database(prefix)
    try:
        yield server.dsn(name)
    finally:
        server.drop_database(name)
