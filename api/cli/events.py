"""`tributary events forget | rotate-key`: personal data in the event store (docs/eventstore.md)."""

from __future__ import annotations

from typing import Annotated

import typer

from tributary.api.cli.common import ConfigOption, service_dsn, settings_from
from tributary.api.cli.help import SentenceGroup

__all__ = ["register"]

events_app = typer.Typer(
    cls=SentenceGroup, help="The event store: forget a data subject, rotate its key.", no_args_is_help=True
)


@events_app.command("forget")
def forget_cmd(
    subject: Annotated[str, typer.Argument(help="The data subject's id.")],
    config: ConfigOption = None,
    rebuild: Annotated[
        bool, typer.Option("--rebuild/--no-rebuild", help="Rebuild the projections that read its streams.")
    ] = True,
) -> None:
    """Destroy the subject's keys: its personal data reads as erased everywhere from now on."""
    from tributary.eventstore.forget import forget, projections_reading
    from tributary.eventstore.migrate import require_initialized
    from tributary.eventstore.store import EventStore

    settings = settings_from(config)
    dsn = service_dsn(settings)
    require_initialized(dsn)
    store = EventStore.connect(dsn, max_size=2)
    try:
        done = forget(store, subject)
    finally:
        store.close()
    typer.echo(
        f"{subject}: {done.keys} key(s) destroyed; {len(done.streams)} stream(s) hold its data, their snapshots deleted"
    )
    if not rebuild or not done.streams:
        return
    from tributary.projections.loader import load_current
    from tributary.projections.runner import RunSettings, rebuild_process

    run_settings = RunSettings.from_settings(settings, dsn=dsn)
    defined = load_current(run_settings.modules, run_settings.mirror).values()
    for name in projections_reading(((p.name, p.topics) for p in defined), done.stream_types):
        result = rebuild_process(name, run_settings)
        typer.echo(f"{name}: rebuilt build {result.build} ({result.table}), {result.records:,} records")


@events_app.command("rotate-key")
def rotate_cmd(
    subject: Annotated[str, typer.Argument(help="The data subject's id.")], config: ConfigOption = None
) -> None:
    """A new key version for the subject: new events use it, older ones still read."""
    from tributary.eventstore.forget import rotate
    from tributary.eventstore.keys import DatabaseKeys
    from tributary.eventstore.migrate import require_initialized

    dsn = service_dsn(settings_from(config))
    require_initialized(dsn)
    typer.echo(f"{subject}: key version {rotate(DatabaseKeys.from_dsn(dsn), subject)}")


def register(app: typer.Typer) -> None:
    app.add_typer(events_app, name="events")
