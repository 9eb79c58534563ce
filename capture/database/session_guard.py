"""What ends capture's statements on a source when capture itself ends (kill -9, a lost host).

A backend runs its statement to the end even when its client is gone: it notices only when it
next sends. A capture killed while a statement waits on a lock, or computes, would leave it
running on the source. So every SQL session capture opens on a source (catalog reads, slot
checks, snapshot reads) asks the server to watch its client:

- `client_connection_check_interval` (PostgreSQL 14+): while a statement runs, the backend
  checks its socket at this interval and cancels the statement when the client closed it (a
  process that dies has its sockets closed by the kernel).
- the server's TCP keepalives (`tcp_keepalives_*`): a client host that vanished (no close ever
  arrives) fails its keepalives, which the same check then sees.
- libpq's keepalives: capture likewise notices a server that vanished while it waits.
- `statement_timeout`, for the sessions that only read catalogs and slots (never a snapshot's:
  a `COPY` of a big table may legitimately run long).

https://www.postgresql.org/docs/current/runtime-config-connection.html
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg import sql

__all__ = [
    "CATALOG_STATEMENT_TIMEOUT_MS",
    "CHECK_INTERVAL_MS",
    "client_params",
    "guard",
    "server_settings",
]

CHECK_INTERVAL_MS = 5_000  # how soon a statement of a dead capture is cancelled
CATALOG_STATEMENT_TIMEOUT_MS = 120_000  # catalog and slot reads take milliseconds
_KEEPALIVE_IDLE_S, _KEEPALIVE_INTERVAL_S, _KEEPALIVE_COUNT = 60, 10, 6  # a vanished peer: ~2 min
_CHECK_SINCE = 140_000  # server_version_num with client_connection_check_interval


def client_params() -> dict[str, Any]:
    """libpq connection parameters: keepalives, and the name capture's sessions show in
    pg_stat_activity when the DSN names none."""
    return {
        "keepalives": 1,
        "keepalives_idle": _KEEPALIVE_IDLE_S,
        "keepalives_interval": _KEEPALIVE_INTERVAL_S,
        "keepalives_count": _KEEPALIVE_COUNT,
        "fallback_application_name": "tributary-capture",
    }


def server_settings(server_version: int, *, statement_timeout_ms: int | None) -> dict[str, str]:
    """The session settings for a server of `server_version` (server_version_num): those it has."""
    settings = {
        "tcp_keepalives_idle": str(_KEEPALIVE_IDLE_S),
        "tcp_keepalives_interval": str(_KEEPALIVE_INTERVAL_S),
        "tcp_keepalives_count": str(_KEEPALIVE_COUNT),
    }
    if server_version >= _CHECK_SINCE:
        settings["client_connection_check_interval"] = f"{CHECK_INTERVAL_MS}ms"
    if statement_timeout_ms is not None:
        settings["statement_timeout"] = f"{statement_timeout_ms}ms"
    return settings


def guard(conn: psycopg.Connection[Any], *, statement_timeout_ms: int | None) -> None:
    """Apply `server_settings` to a new session, in one round trip (set_config, not startup
    options: a server before 14 refuses a connection naming a setting it does not have). On a
    connection that is not autocommit, the transaction it opens is committed (the settings stay).
    The connection is closed if this fails."""
    settings = server_settings(conn.info.server_version, statement_timeout_ms=statement_timeout_ms)
    calls = sql.SQL(", ").join(
        sql.SQL("set_config({}, {}, false)").format(sql.Literal(name), sql.Literal(value))
        for name, value in settings.items()
    )
    try:
        conn.execute(sql.SQL("SELECT {}").format(calls))
        if not conn.autocommit:
            conn.commit()
    except BaseException:
        conn.close()
        raise
