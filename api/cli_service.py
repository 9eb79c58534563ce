"""`tributary serve`: the HTTP API and console under uvicorn."""

from __future__ import annotations

import ipaddress
import logging
from typing import Annotated

import typer

from api.cli_common import ConfigOption, UserError, service_dsn, settings_from

__all__ = ["register"]


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def serve(
    config: ConfigOption = None,
    host: Annotated[str | None, typer.Option(help="Bind address (default [api] host = 127.0.0.1).")] = None,
    port: Annotated[int | None, typer.Option(help="Port (default [api] port = 8000).")] = None,
) -> None:
    """Serve the HTTP API, /metrics and the console page (open http://HOST:PORT/)."""
    import uvicorn

    from api.app import create_app
    from api.logs import configure_json_logging

    settings = settings_from(config)
    host = host or settings.api.host
    port = settings.api.port if port is None else port
    if not settings.api.keys and not _is_loopback(host):
        raise UserError(
            f"refusing to bind {host}: no API keys are configured, so the API only binds to loopback; "
            "add [api] keys to tributary.toml to serve other hosts"
        )
    configure_json_logging()
    log = logging.getLogger("tributary.serve")
    if not settings.api.keys:
        log.warning("no API keys configured: the API is open to local users only (bound to %s)", host)
    app = create_app(settings, dsn=service_dsn(settings))
    typer.echo(f"tributary API on http://{host}:{port}/ (console), http://{host}:{port}/docs (OpenAPI)", err=True)
    uvicorn.run(app, host=host, port=port, log_config=None, access_log=False)


def register(app: typer.Typer) -> None:
    app.command("serve")(serve)
