"""What every `tributary` command shares: the --config option, settings, the user-error type."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from tributary.api.settings.config import ConfigError, Settings, load_settings
from tributary.api.settings.service import UserError, service_dsn

__all__ = ["ConfigOption", "UserError", "service_dsn", "settings_from"]

ConfigOption = Annotated[
    Path | None,
    typer.Option("--config", "-c", help="Config file (default ./tributary.toml, else built-in defaults)."),
]


def settings_from(config: Path | None) -> Settings:
    """The validated settings; on a bad config, every problem on its own line on stderr, exit 1
    (a user fixing a file wants all of its mistakes at once, not one per run)."""
    try:
        return load_settings(config)
    except ConfigError as exc:
        for problem in exc.problems:
            typer.echo(f"tributary: {problem}", err=True)
        raise typer.Exit(1) from None
