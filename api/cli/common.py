"""What every `tributary` command shares: the --config option, settings, the user-error type."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from tributary.api.settings.config import Settings, load_settings
from tributary.api.settings.service import UserError, service_dsn

__all__ = ["ConfigOption", "UserError", "service_dsn", "settings_from"]

ConfigOption = Annotated[
    Path | None,
    typer.Option("--config", "-c", help="Config file (default ./tributary.toml, else built-in defaults)."),
]


def settings_from(config: Path | None) -> Settings:
    return load_settings(config)
