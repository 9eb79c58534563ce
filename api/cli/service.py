"""`tributary serve`: the HTTP API and console under uvicorn."""

from __future__ import annotations

import asyncio
import logging
import os
from typing import TYPE_CHECKING, Annotated, TypedDict

import typer

from tributary.api.cli.common import ConfigOption, UserError, service_dsn, settings_from
from tributary.api.cli.help import SentenceGroup
from tributary.hosts import is_loopback

if TYPE_CHECKING:  # imported where used: these commands start without loading what they do not run
    from tributary.api.settings.config import Settings

__all__ = ["register"]


SHUTDOWN_GRACE_S = 3


class _ConnectionLimits(TypedDict):
    http: type[asyncio.Protocol]
    h11_max_incomplete_event_size: int
    proxy_headers: bool


class _ServeOptions(_ConnectionLimits):
    """uvicorn.run's keyword arguments, the same for one process and for several."""

    host: str
    port: int
    log_config: None
    access_log: bool
    timeout_graceful_shutdown: int


def _connection_limits(settings: Settings) -> _ConnectionLimits:
    """Uvicorn settings that bound what one client holds (`tributary.api.http.limits`): the HTTP parser
    (`[api] http`) under the connection guard (timeouts, connection limit), h11's cap on a head's bytes, and
    the peer address taken from the socket, never from `X-Forwarded-For` (the guard finds a request's
    connection by it)."""
    from tributary.api.http.limits import GuardedH11, GuardedHttpTools

    return {
        "http": GuardedH11 if settings.api.http == "h11" else GuardedHttpTools,
        "h11_max_incomplete_event_size": settings.api.max_header_bytes,
        "proxy_headers": False,
    }


def serve(
    config: ConfigOption = None,
    host: Annotated[str | None, typer.Option(help="Bind address (default [api] host = 127.0.0.1).")] = None,
    port: Annotated[int | None, typer.Option(help="Port (default [api] port = 8000).")] = None,
    workers: Annotated[
        int | None,
        typer.Option(
            min=1,
            help="Worker processes sharing the port (default [api] workers = 1). One worker is the right "
            "default when PostgreSQL shares a machine of few cores: a second worker serves more point lookups "
            "but spends more server CPU per request (bench/README.md). Add workers when cores are left over.",
        ),
    ] = None,
) -> None:
    """Serve the HTTP API, /metrics and the console page (open http://HOST:PORT/)."""
    import uvicorn

    from tributary.api.http.app import create_app
    from tributary.api.settings.logs import configure_json_logging

    settings = settings_from(config)
    host = host or settings.api.host
    port = settings.api.port if port is None else port
    workers = settings.api.workers if workers is None else workers
    if not settings.api.keys and not is_loopback(host):
        raise UserError(
            f"refusing to bind {host}: no API keys are configured, so the API only binds to loopback; "
            "add [api] keys to tributary.toml to serve other hosts"
        )
    from tributary.eventstore.loader import load_aggregates

    aggregates = load_aggregates(settings.eventstore.modules)  # a broken domain module stops here, in one line
    configure_json_logging()
    log = logging.getLogger("tributary.serve")
    if not aggregates:
        log.warning(
            "no [eventstore] modules configured: the API serves no command types (README: 'Writing an aggregate')"
        )
    if not settings.api.keys:
        log.warning("no API keys configured: the API is open to local users only (bound to %s)", host)
    dsn = service_dsn(settings)
    typer.echo(f"tributary API on http://{host}:{port}/ (console), http://{host}:{port}/docs (OpenAPI)", err=True)
    common: _ServeOptions = {
        "host": host,
        "port": port,
        "log_config": None,
        "access_log": False,
        **_connection_limits(settings),
        # Open subscriptions (`GET /all/subscribe`) never end by themselves: a stop waits this long for
        # requests in flight, then closes what is left (a subscriber resumes from its last event id).
        "timeout_graceful_shutdown": SHUTDOWN_GRACE_S,
    }
    if workers == 1:
        from tributary.api.http.definitions import config_file

        app = create_app(settings, dsn=dsn)
        app.state.config_path = config_file(config)  # `[projections]` changes are followed
        uvicorn.run(app, **common)
        return
    # Several processes need an import string: each worker rebuilds the app from the same config file
    # (and environment), so the settings are the ones validated here.
    from tributary.api.http.app import WORKER_CONFIG

    os.environ[WORKER_CONFIG] = "" if config is None else str(config.resolve())
    uvicorn.run("tributary.api.http.app:worker_app", factory=True, workers=workers, **common)


config_app = typer.Typer(
    cls=SentenceGroup, help="Configuration: the reference of every key, the effective settings.", no_args_is_help=True
)


@config_app.command("reference")
def config_reference() -> None:
    """Every key with its default and meaning, as TOML (generated from the settings model)."""
    from tributary.api.settings.reference import reference

    typer.echo(reference(), nl=False)


@config_app.command("show")
def config_show(config: ConfigOption = None) -> None:
    """The effective settings (file + environment), with API keys and passwords masked."""
    import json

    from tributary.api.settings.masking import masked

    typer.echo(json.dumps(masked(settings_from(config)), indent=1))


def register(app: typer.Typer) -> None:
    app.command("serve")(serve)
    app.add_typer(config_app, name="config")
