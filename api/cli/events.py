"""`tributary events delete STREAM [--hard] | scavenge`: the event store's stream lifecycle,
straight on the service database (no server needed)."""

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
        "The event store's streams: delete one, or scavenge (remove for good what stream metadata and deletes hide).\n\n"
        "A delete hides the stream at once and tells capture (its topic gets a delete marker and a tombstone); "
        "its events go at the next scavenge, which `tributary serve` also runs every `[eventstore] scavenge_interval_s`."
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
    deletes hide, in short transactions: appends go on meanwhile."""
    with _store(config) as store:
        removed = store.scavenge(batch=batch)
    typer.echo(f"scavenge: {removed} event(s) removed")


def register(app: typer.Typer) -> None:
    app.add_typer(events_app, name="events")
