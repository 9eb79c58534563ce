"""`tributary init`, `tributary capture` and `tributary capture status`."""

from __future__ import annotations

import json
import logging
import sys
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

from tributary.api.cli.common import ConfigOption, UserError, settings_from
from tributary.api.settings.config import Settings
from tributary.api.settings.log import cleaner_policy
from tributary.api.settings.sources import source_specs, source_statuses
from tributary.capture.daemon import CaptureDaemon, DaemonOptions
from tributary.capture.prerequisites import Outcome, check_source
from tributary.capture.status import SourceStatus

__all__ = ["register"]

capture_app = typer.Typer(
    help="Run the capture daemon (every source, and the event store's outbox) into the log.",
    invoke_without_command=True,
)

_MARKS = {
    Outcome.OK: "[green]ok[/]",
    Outcome.FIXED: "[cyan]fixed[/]",
    Outcome.WARNING: "[yellow]warn[/]",
    Outcome.PROBLEM: "[red]PROBLEM[/]",
}


def init(
    config: ConfigOption = None,
    replica_identity_full: Annotated[
        bool,
        typer.Option("--replica-identity-full", help="Set REPLICA IDENTITY FULL on included tables that have no key."),
    ] = False,
    allow_without_key: Annotated[
        list[str] | None,
        typer.Option("--allow-without-key", help="schema.table whose lost UPDATEs/DELETEs you accept (repeatable)."),
    ] = None,
) -> None:
    """Check every source's prerequisites, create slots, run the service migrations; say what is missing."""
    settings = settings_from(config)
    console = Console(stderr=False, highlight=False)
    failed = []
    _migrate(settings, console)
    specs = source_specs(settings, with_outbox=True)
    if not settings.sources:
        console.print(
            "no [[sources]] configured: nothing to capture yet (see README, 'Pointing it at your own database')"
        )
    for spec in specs:
        report = check_source(
            spec, replica_identity_full=replica_identity_full, allow_without_key=allow_without_key or ()
        )
        console.print(f"[bold]source {spec.name}[/] ({len(report.tables)} tables)")
        for finding in report.findings:
            console.print(f"  {_MARKS[finding.outcome]:>8} {finding.message}")
        if not report.ok:
            failed.append(spec.name)
    if failed:
        raise UserError(f"init: source(s) {', '.join(failed)} cannot be captured until the problems above are fixed")


def _migrate(settings: Settings, console: Console) -> None:
    """Run the service database's migrations (event store, projection bookkeeping); skipped when there is none yet."""
    from tributary.api.cli.common import service_dsn
    from tributary.eventstore.migrate import run_migrations

    try:
        dsn = service_dsn(settings)
    except UserError as exc:
        console.print(f"[yellow]service database skipped[/]: {exc}")
        return
    revision = run_migrations(dsn)
    console.print(f"[bold]service database[/]: migrations at {revision}")


@capture_app.callback()
def capture(
    ctx: typer.Context,
    config: ConfigOption = None,
    until_idle: Annotated[
        float | None, typer.Option("--until-idle", metavar="SECONDS", help="Exit 0 after this long with no new change.")
    ] = None,
) -> None:
    """Run the capture daemon until SIGTERM/Ctrl-C (finishes the batch, commits, confirms, exits 0)."""
    if ctx.invoked_subcommand is not None:
        return
    settings = settings_from(config)
    specs = source_specs(settings, with_outbox=True)
    if not specs:
        raise UserError("nothing to capture: configure [[sources]] in tributary.toml (or start the service database)")
    _require_init(settings)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    options = DaemonOptions(
        log_root=settings.log.root,
        default_partitions=settings.log.partitions,
        segment_bytes=settings.log.segment_bytes,
        linger_ms=settings.log.linger_ms,
        batch_records=settings.log.batch_records,
        status_interval_s=settings.capture.status_interval_s,
        max_backoff_s=settings.capture.max_backoff_s,
        until_idle_s=until_idle,
        cleaner=cleaner_policy(settings),
    )
    with _SnapshotProgress(enabled=sys.stderr.isatty()) as progress:
        daemon = CaptureDaemon(specs, options, on_progress=progress.update)
        daemon.install_signal_handlers()
        raise typer.Exit(daemon.run())


def _require_init(settings: Settings) -> None:
    """Refuse before `tributary init` (the outbox table and slots do not exist yet)."""
    from tributary.api.cli.common import service_dsn
    from tributary.eventstore.migrate import NotInitializedError, require_initialized

    try:
        dsn = service_dsn(settings)
    except UserError:
        return  # no service database: only [[sources]] to capture, nothing of ours to check
    try:
        require_initialized(dsn)
    except NotInitializedError as exc:
        raise UserError(str(exc)) from None


class _SnapshotProgress:
    """A rich progress bar for snapshots, shown only on a terminal."""

    def __init__(self, *, enabled: bool) -> None:
        self.enabled = enabled
        self._progress: Progress | None = None
        self._tasks: dict[str, TaskID] = {}

    def __enter__(self) -> _SnapshotProgress:
        if self.enabled:
            self._progress = Progress(
                TextColumn("snapshot {task.description}"),
                BarColumn(),
                TextColumn("{task.completed:,}/{task.total:,} rows"),
                TimeElapsedColumn(),
                console=Console(stderr=True),
            )
            self._progress.start()
        return self

    def update(self, status: object) -> None:
        if self._progress is None or not isinstance(status, SourceStatus):
            return
        task = self._tasks.get(status.name)
        if task is None:
            task = self._tasks[status.name] = self._progress.add_task(
                status.name, total=status.snapshot_rows_total or None
            )
        self._progress.update(
            task,
            completed=status.snapshot_rows_done,
            total=max(status.snapshot_rows_total, status.snapshot_rows_done) or None,
        )

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._progress.stop()


@capture_app.command("status")
def status(
    config: ConfigOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
) -> None:
    """Each source's state, positions, slot lag and snapshot progress."""
    pid, rows = source_statuses(settings_from(config))
    if as_json:
        typer.echo(json.dumps({"pid": pid, "sources": rows}, indent=1))
        return
    console = Console(highlight=False)
    for r in rows:
        snap = ""
        if r.get("snapshot_rows_total"):
            snap = f" snapshot {r.get('snapshot_rows_done', 0):,}/{r['snapshot_rows_total']:,}"
        lag = r["slot_lag_bytes"]
        console.print(
            f"[bold]{r['name']}[/] {r.get('state')} slot={r.get('slot')} lsn={r.get('last_lsn')} "
            f"confirmed={r.get('confirmed_lsn')} lag={'?' if lag is None else f'{lag:,}B'} "
            f"changes={r.get('changes', 0):,} ({r.get('changes_per_s', 0)}/s){snap}"
            + (f" [red]{r['error']}[/]" if r.get("error") else "")
        )


def register(app: typer.Typer) -> None:
    app.command("init")(init)
    app.add_typer(capture_app, name="capture")
