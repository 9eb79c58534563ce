"""`tributary sinks …`: run the configured `[[sinks]]`, show their status and dead letters.

A sink is a consumer group like any other: `sinks run` joins each sink's group through the group
coordinator in-process (the service database and the log's files, like `tributary serve`) and
delivers what the group is given. Run several `sinks run` processes to share the partitions.
"""

from __future__ import annotations

import json
import logging
import signal
import threading
from typing import TYPE_CHECKING, Annotated

import typer

from tributary.api.cli.common import ConfigOption, UserError, service_dsn, settings_from
from tributary.api.cli.help import SentenceGroup
from tributary.api.settings.config import SinkSettings

if TYPE_CHECKING:  # imported where used: these commands start without loading what they do not run
    from tributary.sinks import HttpSinkConfig

__all__ = ["register", "sinks_app"]

sinks_app = typer.Typer(
    cls=SentenceGroup, help="HTTP sinks: consumer groups that POST the log's records elsewhere.", no_args_is_help=True
)


def register(app: typer.Typer) -> None:
    app.add_typer(sinks_app, name="sinks")


def sink_config(sink: SinkSettings) -> HttpSinkConfig:
    from tributary.sinks import HttpSinkConfig

    return HttpSinkConfig(
        name=sink.name,
        url=sink.url,
        topics=sink.topics,
        group=sink.group_name,
        headers=tuple(sink.headers.items()),
        auto_offset_reset=sink.auto_offset_reset,
        max_batch_records=sink.max_batch_records,
        max_batch_bytes=sink.max_batch_bytes,
        linger_ms=sink.linger_ms,
        max_attempts=sink.max_attempts,
        initial_backoff_ms=sink.initial_backoff_ms,
        max_backoff_ms=sink.max_backoff_ms,
        request_timeout_s=sink.request_timeout_s,
    )


@sinks_app.command("run")
def run(
    config: ConfigOption = None,
    name: Annotated[list[str] | None, typer.Option("--name", help="Run only these sinks (repeatable).")] = None,
) -> None:
    """Run the configured sinks until interrupted (SIGINT/SIGTERM): each joins its consumer group
    (`sink-<name>` unless `group` is set) and POSTs batches of its topics' records to its `url`."""
    from tributary.api.settings.log import kafka_options
    from tributary.api.settings.logs import configure_json_logging
    from tributary.consumers import GroupCoordinator
    from tributary.eventstore.migrate import require_initialized
    from tributary.sinks import GroupMember, HttpSink, SinkStore

    settings = settings_from(config)
    chosen = [s for s in settings.sinks if not name or s.name in name]
    unknown = sorted(set(name or ()) - {s.name for s in settings.sinks})
    if unknown:
        raise UserError(
            f"no sink named {', '.join(unknown)} in [[sinks]] (configured: "
            f"{', '.join(s.name for s in settings.sinks) or 'none'})"
        )
    if not chosen:
        raise UserError('no [[sinks]] configured: add one (type = "http", name, url, topics) to the config')
    dsn = service_dsn(settings)
    require_initialized(dsn)
    configure_json_logging()
    log = logging.getLogger("tributary.sinks")
    stores = [SinkStore(dsn) for _ in chosen]  # fails here, in one line, when the database is unreachable
    coordinator = GroupCoordinator(
        dsn,
        settings.log.root,
        session_timeout_ms=settings.consumers.session_timeout_ms,
        poll_interval_ms=settings.consumers.poll_interval_ms,
        max_connections=2 + 2 * len(chosen),
        kafka=kafka_options(settings),
        capture_sources=[s.name for s in settings.sources],
    )
    sinks: list[HttpSink] = []
    for sink in chosen:
        cfg = sink_config(sink)
        member = GroupMember(
            coordinator,
            group=cfg.group,
            topics=cfg.topics,
            auto_offset_reset=cfg.auto_offset_reset,
            max_records=cfg.max_batch_records,
            max_bytes=cfg.max_batch_bytes,
        )
        sinks.append(HttpSink(cfg, member, stores[len(sinks)]))

    def on_signal(signum: int, frame: object) -> None:
        for s in sinks:
            s.stop()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    threads = [threading.Thread(target=s.run, name=f"sink-{s.config.name}") for s in sinks]
    for t in threads:
        t.start()
    log.info("sinks running: %s", ", ".join(s.config.name for s in sinks))
    typer.echo(f"sinks running: {', '.join(s.config.name for s in sinks)}", err=True)
    while any(t.is_alive() for t in threads):
        for t in threads:
            t.join(timeout=0.5)
    for s in sinks:
        s.source.close()
        s.store.close()
    coordinator.close()


@sinks_app.command("status")
def status(
    config: ConfigOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per sink.")] = False,
) -> None:
    """Each sink's state, records delivered, requests, failed attempts, dead letters and last error."""
    from tributary.sinks import SinkStore

    settings = settings_from(config)
    store = SinkStore(service_dsn(settings))
    try:
        rows = {r.sink: r for r in store.statuses()}
    finally:
        store.close()
    for sink in settings.sinks:
        row = rows.get(sink.name)
        data = {
            "sink": sink.name,
            "group": sink.group_name,
            "url": sink.url,
            "state": row.state if row else "never run",
            "delivered": row.delivered if row else 0,
            "requests": row.requests if row else 0,
            "failed_attempts": row.failed_attempts if row else 0,
            "dead_letters": row.dead_letters if row else 0,
            "last_error": row.last_error if row else None,
            "last_delivery_at": row.last_delivery_at.isoformat() if row and row.last_delivery_at else None,
        }
        if as_json:
            typer.echo(json.dumps(data))
        else:
            typer.echo(
                f"{data['sink']}: {data['state']}, {data['delivered']} delivered in {data['requests']} requests, "
                f"{data['failed_attempts']} failed attempts, {data['dead_letters']} dead letters"
                + (f"; last error: {data['last_error']}" if data["last_error"] else "")
            )


@sinks_app.command("dead-letters")
def dead_letters(
    sink: Annotated[str, typer.Argument(help="The sink's name.")],
    config: ConfigOption = None,
    limit: Annotated[int, typer.Option(min=1, max=100_000, help="At most this many, oldest first.")] = 100,
) -> None:
    """The records a sink gave up on, one JSON object per line (the record, the error, the attempts)."""
    from tributary.sinks import SinkStore

    settings = settings_from(config)
    store = SinkStore(service_dsn(settings))
    try:
        rows = store.dead_letters(sink, limit=limit)
    finally:
        store.close()
    for r in rows:
        typer.echo(
            json.dumps(
                {
                    "topic": r.topic,
                    "partition": r.partition,
                    "offset": r.offset,
                    "timestamp_ms": r.timestamp_ms,
                    "key": r.key,
                    "value": r.value,
                    "headers": r.headers,
                    "error": r.error,
                    "attempts": r.attempts,
                    "failed_at": r.failed_at.isoformat(),
                }
            )
        )
