"""Where the service database is: `[service] dsn`, else the running embedded cluster."""

from __future__ import annotations

from tributary.api.devdb.embedded import EmbeddedPostgres
from tributary.api.settings.config import Settings

__all__ = ["UserError", "service_dsn"]


class UserError(Exception):
    """An error meant for the user: printed as one line, exit status 1."""


def service_dsn(settings: Settings) -> str:
    """The service database: `[service] dsn`, else the running embedded cluster."""
    if settings.service.dsn:
        return settings.service.dsn
    cluster = EmbeddedPostgres(settings.pg_data_dir)
    if not cluster.is_running():
        raise UserError("no service database: set [service] dsn in tributary.toml or start one with `tributary pg up`")
    return cluster.dsn()
