"""The `tributary` command line (typer + rich).

Every command takes `--config PATH` and, on failure, exits non-zero with one clear line on stderr.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from tributary import __version__
from tributary.api.cli.common import ConfigOption, UserError, service_dsn, settings_from
from tributary.api.cli.help import SentenceGroup
from tributary.api.devdb.embedded import EmbeddedPostgres, PgError
from tributary.api.settings.config import ConfigError, Settings
from tributary.impl import ImplError, selection

__all__ = ["ConfigOption", "UserError", "app", "main", "service_dsn", "settings_from"]


app = typer.Typer(
    cls=SentenceGroup,
    name="tributary",
    help=(
        "Change-data capture and event sourcing on PostgreSQL.\n\n"
        "Start here: `tributary pg up` (a local Postgres with wal2json), `tributary init`, "
        "`tributary capture`, then `tributary log cat <topic>`. Or just `tributary demo`."
    ),
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
    # Help is plain text: rich markup would read `[api] host` as a style tag and print ` host`.
    rich_markup_mode=None,
)
pg_app = typer.Typer(
    cls=SentenceGroup,
    help="The embedded PostgreSQL (wal2json, wal_level=logical) for demos and tests.",
    no_args_is_help=True,
)
app.add_typer(pg_app, name="pg")


def version_line() -> str:
    """`tributary 0.1.0 (compiled: capture._hotpath, log._typed)`: a bug report's first line says
    whether the compiled twins or their pure-Python references ran."""
    return f"tributary {__version__} ({selection()})"


def _print_version(value: bool) -> None:
    if value:
        typer.echo(version_line())
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option(
            "--version",
            help="Print the version and which implementation runs (compiled or python), then exit.",
            callback=_print_version,
            is_eager=True,
        ),
    ] = False,
) -> None:
    # no docstring: the group's help is the `help=` given to typer.Typer above
    pass


def _embedded(settings: Settings, data_dir: Path | None) -> EmbeddedPostgres:
    return EmbeddedPostgres(data_dir or settings.pg_data_dir)


DataDirOption = Annotated[Path | None, typer.Option("--data-dir", help="Cluster directory (default .tributary/pg).")]


@pg_app.command("up")
def pg_up(
    config: ConfigOption = None,
    data_dir: DataDirOption = None,
    port: Annotated[int | None, typer.Option(help="TCP port on 127.0.0.1 (default 5433 or a free one).")] = None,
) -> None:
    """Start (initialising on first use) the embedded cluster and print its DSN."""
    cluster = _embedded(settings_from(config), data_dir)
    typer.echo(cluster.up(port=port))


@pg_app.command("down")
def pg_down(config: ConfigOption = None, data_dir: DataDirOption = None) -> None:
    """Stop the embedded cluster (its data stays)."""
    stopped = _embedded(settings_from(config), data_dir).down()
    typer.echo("stopped" if stopped else "not running", err=not stopped)


@pg_app.command("dsn")
def pg_dsn(
    config: ConfigOption = None,
    data_dir: DataDirOption = None,
    database: Annotated[
        str | None,
        typer.Option("--database", "-d", help="Another database of the cluster (default: the service database)."),
    ] = None,
) -> None:
    """Print the embedded cluster's DSN (fails if it is not running), e.g. for psql or [[sources]] dsn."""
    cluster = _embedded(settings_from(config), data_dir)
    if not cluster.is_running():
        raise UserError(f"the embedded cluster in {cluster.data_dir} is not running: run `tributary pg up`")
    typer.echo(cluster.dsn() if database is None else cluster.dsn(database))


def _register_subcommands() -> None:
    """Mount the command modules, kept apart by concern (each exposes `register(app)`)."""
    import importlib

    for name in (
        "tributary.api.cli.log",
        "tributary.api.cli.capture",
        "tributary.api.cli.project",
        "tributary.api.cli.service",
        "tributary.api.cli.groups",
        "tributary.api.cli.events",
        "tributary.api.cli.sinks",
        "tributary.api.cli.kafka",
        "tributary.api.demo.demo",
    ):
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name == name:  # not written yet in this checkout
                continue
            raise
        module.register(app)


try:
    _register_subcommands()
except ImplError as exc:  # TRIBUTARY_IMPL=compiled without the build, or a bad value: before any command
    sys.exit(f"tributary: {exc}")

_USER_ERRORS: tuple[type[BaseException], ...] = (UserError, ConfigError, PgError, ImplError)


def user_errors() -> tuple[type[BaseException], ...]:
    """Every package's error root: these print as one line instead of a traceback."""
    roots: list[type[BaseException]] = list(_USER_ERRORS)
    for mod, name in (
        ("tributary.log", "LogError"),
        ("tributary.capture.errors", "CaptureError"),
        ("tributary.eventstore.errors", "EventStoreError"),
        ("tributary.projections.errors", "ProjectionError"),
        ("tributary.sinks", "SinkError"),
        ("tributary.consumers.errors", "ConsumerError"),
    ):
        try:
            module = __import__(mod, fromlist=[name])
        except ImportError:
            continue
        root = getattr(module, name, None)
        if isinstance(root, type) and issubclass(root, BaseException):
            roots.append(root)
    return tuple(roots)


def main() -> None:
    """Console-script entry: run the app; our errors become one line on stderr and exit 1."""
    try:
        app(prog_name="tributary")  # also under `python -c`/`-m`, where argv[0] is not the command's name
    except user_errors() as exc:
        print(f"tributary: {exc}", file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt:
        sys.exit(130)
