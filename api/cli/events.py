"""`tributary events delete STREAM [--hard] | scavenge | forget SUBJECT | rotate-key SUBJECT`: the event
store's stream lifecycle and personal data, straight on the service database (no server needed)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from tributary.api.cli.common import ConfigOption, service_dsn, settings_from
from tributary.api.cli.help import SentenceGroup

if TYPE_CHECKING:  # imported where used: the CLI starts without loading what it does not run
    from tributary.eventstore.store import EventStore

__all__ = ["register"]

events_app = typer.Typer(
    cls=SentenceGroup,
    help=(
        "The event store's streams and personal data: delete a stream, scavenge (remove for good what stream "
        "metadata and deletes hide), forget a data subject, rotate its key.\n\n"
        "A delete hides the stream at once and tells capture (its topic gets a delete marker and a tombstone); "
        "its events go at the next scavenge, which `tributary serve` also runs every `[eventstore] scavenge_interval_s`. "
        "A forget destroys the subject's keys: its personal data reads as erased everywhere."
    ),
    no_args_is_help=True,
)


@contextmanager
def _store(config: Path | None) -> Iterator[EventStore]:
    from tributary.eventstore.migrate import require_initialized
    from tributary.eventstore.store import EventStore

    dsn = service_dsn(settings_from(config))
    require_initialized(dsn)
    store = EventStore.connect(dsn, max_size=1)
    try:
        yield store
    finally:
        store.close()


@events_app.command("delete")
def delete_cmd(
    stream: Annotated[str, typer.Argument(help="The stream id.")],
    hard: Annotated[bool, typer.Option("--hard", help="A tombstone: the stream id can never be used again.")] = False,
    config: ConfigOption = None,
) -> None:
    """Delete a stream: soft (a later append recreates it, versions continuing) or --hard (for good)."""
    with _store(config) as store:
        end = store.delete_stream(stream, hard=hard)
    kind = "deleted for good (tombstone)" if hard else f"deleted (an append recreates it from version {end + 1})"
    typer.echo(f"stream {stream!r} at version {end}: {kind}; its events go at the next scavenge")


@events_app.command("scavenge")
def scavenge_cmd(
    batch: Annotated[int, typer.Option("--batch", min=1, max=100_000, help="Events removed per transaction.")] = 500,
    config: ConfigOption = None,
) -> None:
    """Remove for good the events that stream metadata (max age, max count, truncate before) and
    deletes hide, in short transactions: appends go on meanwhile. Then forget the positions of
    events removed longer ago than `[eventstore] removed_positions_keep_s`."""
    keep_s = settings_from(config).eventstore.removed_positions_keep_s
    with _store(config) as store:
        removed = store.scavenge(batch=batch)
        pruned = store.prune_removed(keep_s)
    typer.echo(f"scavenge: {removed} event(s) removed; {pruned} position(s) removed over {keep_s:g} s ago forgotten")


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
