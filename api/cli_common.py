"""What every `tributary` command shares: the --config option, settings, the user-error type."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from api.config import Settings, load_settings
from api.embedded_pg import EmbeddedPostgres

__all__ = ["ConfigOption", "UserError", "service_dsn", "settings_from"]

ConfigOption = Annotated[
    Path | None,
    typer.Option("--config", "-c", help="Config file (default ./tributary.toml, else built-in defaults)."),
]


class UserError(Exception):
    """An error meant for the user: printed as one line, exit status 1."""


def settings_from(config: Path | None) -> Settings:
    return load_settings(config)


def service_dsn(settings: Settings) -> str:
    """The service database: `[service] dsn`, else the running embedded cluster."""
    if settings.service.dsn:
        return settings.service.dsn
    cluster = EmbeddedPostgres(settings.pg_data_dir)
    if not cluster.is_running():
        raise UserError("no service database: set [service] dsn in tributary.toml or start one with `tributary pg up`")
    return cluster.dsn()
