"""`tributary init`, `tributary capture`, `tributary capture status` and `tributary capture snapshot`."""

from __future__ import annotations

import json
import logging
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Annotated

import typer
from rich.console import Console, Group
from rich.live import Live
from rich.text import Text

from tributary.api.cli.common import ConfigOption, UserError, settings_from
from tributary.api.cli.help import SentenceGroup
from tributary.api.cli.output import console as make_console
from tributary.api.cli.output import count, is_terminal, literal
from tributary.api.settings.config import Settings
from tributary.api.settings.log import cleaner_policy, kafka_options, log_admin
from tributary.api.settings.sources import OUTBOX_SOURCE, source_specs, source_statuses
from tributary.capture.daemon import CaptureDaemon, DaemonOptions
from tributary.capture.prerequisites import Outcome, SourceReport, allow_line, check_source
from tributary.capture.spec import SourceSpec
from tributary.capture.status import SourceStatus, snapshot_summary

__all__ = ["register"]

capture_app = typer.Typer(
    cls=SentenceGroup,
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
        typer.Option(
            "--replica-identity-full",
            help="Set REPLICA IDENTITY FULL on included tables that have no key, and on those whose row_filter reads non-key columns.",
        ),
    ] = False,
    allow_without_key: Annotated[
        list[str] | None,
        typer.Option(
            "--allow-without-key",
            help="schema.table whose lost UPDATEs/DELETEs you accept, for this run, beside [[sources]] "
            "allow_without_key (repeatable).",
        ),
    ] = None,
) -> None:
    """Check every source's prerequisites, create slots, run the service migrations; say what is missing.

    The sources are the [[sources]] entries of the config (and the event store's outbox); the service
    database is [service] dsn, else the running embedded cluster."""
    settings = settings_from(config)
    console = make_console()
    failed = []
    _domains(settings, console)
    _migrate(settings, console)
    specs = source_specs(settings, with_outbox=True)
    if not settings.sources:
        console.print(
            literal(
                "no [[sources]] configured: nothing to capture yet (see README, 'Pointing it at your own database')"
            )
        )
    positions = _log_positions(settings)
    keeps_values = log_admin(settings).compaction_keeps_unchanged_values
    for spec in specs:
        report = check_source(
            spec,
            replica_identity_full=replica_identity_full,
            allow_without_key=allow_without_key or (),
            position=positions.get(spec.name),
            kafka=not keeps_values and spec.router is None,  # an outbox carries events
        )
        tables = count(len(report.tables), "table")
        console.print(f"[bold]source {literal(spec.name)}[/] ({tables if report.connected else 'could not connect'})")
        for finding in report.findings:
            console.print(f"  {_MARKS[finding.outcome]:>8} {literal(finding.message)}")
        kept = _allowed_this_run_only(spec, report, allow_without_key or ())
        if kept:
            console.print(
                f"  {_MARKS[Outcome.WARNING]:>8} "
                + literal(
                    f"{', '.join(kept)} allowed without a key for this run only: to keep it, add "
                    f"`{allow_line(spec, *kept)}` to the config's [[sources]] entry {spec.name!r}"
                )
            )
        if not report.ok:
            failed.append(spec.name)
    if failed:
        raise UserError(f"init: source(s) {', '.join(failed)} cannot be captured until the problems above are fixed")


def _log_positions(settings: Settings) -> dict[str, str]:
    """Each source's position in the log ({} when there is no log yet), or the later position the
    last capture confirmed to its slot (its status file): `init` must not make a slot that would
    start after it without saying so."""
    from tributary.capture.decoding.lsn import Lsn
    from tributary.capture.resume import confirmed_in_status
    from tributary.log import LogError

    admin = log_admin(settings)
    try:
        if not admin.exists():
            return {}
        positions = admin.positions()
    except LogError:
        return {}
    confirmed = confirmed_in_status(settings.log.root)
    out: dict[str, str] = {}
    for name, text in positions.items():
        try:
            lsn = Lsn.parse(text)  # 0/0: a re-snapshot under way, kept as it is
            out[name] = str(max(lsn, confirmed.get(name, Lsn.ZERO)) if lsn else lsn)
        except ValueError:  # not a source's position (a snapshot's context)
            continue
    return out


def _allowed_this_run_only(spec: SourceSpec, report: SourceReport, flagged: Sequence[str]) -> list[str]:
    """Tables without a key that `--allow-without-key` allowed but the config does not (yet)."""
    if spec.name == OUTBOX_SOURCE:
        return []
    keyless = {t for t in report.tables if any(f.message.startswith(f"{t}: no primary key") for f in report.findings)}
    return sorted(t for t in set(flagged) & keyless if t not in spec.allow_without_key)


def _domains(settings: Settings, console: Console) -> None:
    """Load `[eventstore] modules` (a broken one stops `init` with one line naming it) and say what the API will serve."""
    from tributary.eventstore.loader import load_aggregates

    aggregates = load_aggregates(settings.eventstore.modules)
    if not aggregates:
        console.print(
            "[bold]event store[/]: " + literal("no [eventstore] modules configured: the API serves no command types")
        )
        return
    for stream_type, agg in sorted(aggregates.items()):
        console.print(
            f"[bold]event store[/]: stream type {literal(stream_type)} (commands: {literal(', '.join(sorted(agg.commands)))})"
        )


def _migrate(settings: Settings, console: Console) -> None:
    """Run the service database's migrations (event store, projection bookkeeping); skipped when there is none yet."""
    from tributary.api.cli.common import service_dsn
    from tributary.eventstore.migrate import run_migrations

    try:
        dsn = service_dsn(settings)
    except UserError as exc:
        console.print(f"[yellow]service database skipped[/]: {literal(exc)}")
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
        kafka=kafka_options(settings),
    )
    if not is_terminal():  # a service manager, a pipe, a file: its logs, and a progress line now and then
        logging.basicConfig(level=logging.INFO, format=_LOG_FORMAT, stream=sys.stderr)
        daemon = CaptureDaemon(specs, options)
        daemon.install_signal_handlers()
        progress = _ProgressLog(lambda: [s.status for s in daemon.sessions], settings.capture.progress_interval_s)
        progress.start()
        try:
            raise typer.Exit(daemon.run())
        finally:
            progress.stop.set()
    live = Console(stderr=True, highlight=False)
    handler = _ConsoleLogHandler(live)
    handler.setFormatter(logging.Formatter(_LOG_FORMAT))
    logging.basicConfig(level=logging.INFO, handlers=[handler])
    daemon = CaptureDaemon(specs, options)
    daemon.install_signal_handlers()
    status = _LiveStatus(str(settings.log.root), lambda: [s.status for s in daemon.sessions])
    with Live(get_renderable=status.render, console=live, refresh_per_second=2, redirect_stdout=False):
        raise typer.Exit(daemon.run())


_LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def _require_init(settings: Settings) -> None:
    """Refuse before `tributary init` (the outbox table and slots do not exist yet)."""
    from tributary.api.cli.common import service_dsn
    from tributary.eventstore.migrate import require_initialized

    try:
        dsn = service_dsn(settings)
    except UserError:
        return  # no service database: only [[sources]] to capture, nothing of ours to check
    require_initialized(dsn)


_STATE_STYLES = {
    "streaming": "green",
    "snapshotting": "cyan",
    "starting": "yellow",
    "reconnecting": "yellow",
    "stopped": "dim",
    "failed": "bold red",
}


class _ConsoleLogHandler(logging.Handler):
    """Log lines printed through the live display's console, so they scroll above it whole."""

    def __init__(self, console: Console) -> None:
        super().__init__()
        self.console = console

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.console.print(Text(self.format(record)), soft_wrap=True)
        except Exception:  # noqa: BLE001 - logging must never stop capture
            self.handleError(record)


def progress_line(s: SourceStatus) -> str:
    """One source's progress, as the live display shows it, for a log."""
    detail = snapshot_summary(s.to_json()) or f"lsn {s.last_lsn or '-'}"
    error = f" ({s.error})" if s.error else ""
    return f"source {s.name}: {s.state.value}{error}, {count(s.changes, 'change')} ({s.changes_per_s:,.1f}/s), {detail}"


class _ProgressLog(threading.Thread):
    """Off a terminal, where there is no live display: every `interval_s`, a log line per source
    (its state, changes, changes/s, the snapshot under way), so a log shows capture is alive."""

    def __init__(self, sources: Callable[[], Sequence[SourceStatus]], interval_s: float) -> None:
        super().__init__(name="capture-progress", daemon=True)
        self.sources, self.interval_s = sources, interval_s
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(self.interval_s):
            for status in list(self.sources()):
                _progress_log.info("%s", progress_line(status))


_progress_log = logging.getLogger("tributary.capture.progress")


class _LiveStatus:
    """What `capture` shows on a terminal: where it writes, then one line per source with its
    state, changes so far and changes/s (or its snapshot's progress), redrawn twice a second."""

    def __init__(self, root: str, sources: Callable[[], Sequence[SourceStatus]]) -> None:
        self.root = root
        self.sources = sources
        self.started = time.monotonic()

    def render(self) -> Group:
        elapsed = int(time.monotonic() - self.started)
        lines = [
            self._line(
                (f"capture → {self.root}", "bold"),
                (f"  {elapsed // 60}:{elapsed % 60:02d}  Ctrl-C stops after a commit", "dim"),
            )
        ]
        sources = list(self.sources())
        width = max((len(s.name) for s in sources), default=0)
        for s in sources:
            state = s.state.value
            detail = snapshot_summary(s.to_json()) or f"lsn {s.last_lsn or '-'}"
            lines.append(
                self._line(
                    (f"{s.name:<{width}}  ", "bold"),
                    (f"{state:<12}", _STATE_STYLES.get(state, "")),
                    (f"  {s.changes:>11,} changes  {s.changes_per_s:>9,.1f} changes/s  {detail}", ""),
                )
            )
            if s.error:
                lines.append(self._line((f"{'':<{width}}  {s.error}", "red")))
        return Group(*lines)

    @staticmethod
    def _line(*parts: tuple[str, str]) -> Text:
        """One screen line: never wrapped (a wrapped line would break the redraw), cut with … instead."""
        return Text.assemble(*parts, no_wrap=True, overflow="ellipsis")


@capture_app.command("status")
def status(
    config: ConfigOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
) -> None:
    """Each source's state, positions, slot lag and the snapshot under way (table, method, chunks and
    rows done of estimated, tables pending), which a chunked snapshot shows beside streaming."""
    pid, rows = source_statuses(settings_from(config))
    if as_json:
        typer.echo(json.dumps({"pid": pid, "sources": rows}, indent=1))
        return
    console = make_console()
    for r in rows:
        summary = snapshot_summary(r)
        snap = f" {summary}" if summary else ""
        lag = r["slot_lag_bytes"]
        line = (
            f"{r.get('state')} slot={r.get('slot')} lsn={r.get('last_lsn')} "
            f"confirmed={r.get('confirmed_lsn')} lag={'?' if lag is None else f'{lag:,}B'} "
            f"changes={r.get('changes', 0):,} ({r.get('changes_per_s', 0)}/s){snap}"
        )
        error = r.get("error")
        if error and r.get("retry_at_ms") and r.get("state") in ("failed", "reconnecting"):
            wait = max(0.0, r["retry_at_ms"] / 1000 - time.time())
            error = f"{error} (failures={r.get('failures', 0)}, next try in {wait:.0f}s)"
        console.print(
            f"[bold]{literal(r['name'])}[/] {literal(line)}" + (f" [red]{literal(error)}[/]" if error else "")
        )


@capture_app.command("snapshot")
def snapshot(
    tables: Annotated[
        list[str] | None,
        typer.Argument(metavar="TABLE", help="schema.table to re-read (one or more; with --stop: those only)."),
    ] = None,
    config: ConfigOption = None,
    source: Annotated[
        str | None, typer.Option("--source", help="The [[sources]] name (needed when there are several).")
    ] = None,
    where: Annotated[
        str | None,
        typer.Option(
            "--where",
            help="Re-read only the rows of TABLE (one) where this SQL condition holds (Debezium's "
            "additional-conditions); run as capture's role, read-only; keys outside it are left as they are.",
        ),
    ] = None,
    stop: Annotated[
        bool, typer.Option("--stop", help="Stop the chunked snapshot under way (of TABLEs, or all).")
    ] = False,
    pause: Annotated[bool, typer.Option("--pause", help="Pause the chunked snapshot under way.")] = False,
    resume: Annotated[bool, typer.Option("--resume", help="Resume a paused chunked snapshot.")] = False,
) -> None:
    """Re-snapshot tables, chunked, beside streaming: their rows arrive again as `op: "r"` records;
    or stop, pause or resume the chunked snapshot under way.

    Writes a signal into the source database's WAL (a transactional logical message), so the
    request is durable and ordered with the stream: a running capture acts on it when it reads
    that point, a stopped one when it next starts."""
    import psycopg

    from tributary.capture.database.slot import sql_connection
    from tributary.capture.records.routing import TableFilter
    from tributary.capture.snapshot.chunked import filter_refusal
    from tributary.capture.snapshot.signals import (
        PAUSE_SNAPSHOT,
        RESUME_SNAPSHOT,
        SIGNAL_PREFIX,
        STOP_SNAPSHOT,
        BadSignal,
        control_message,
        qualified_table,
        snapshot_message,
    )

    tables = tables or []
    controls = [k for k, on in ((STOP_SNAPSHOT, stop), (PAUSE_SNAPSHOT, pause), (RESUME_SNAPSHOT, resume)) if on]
    if len(controls) > 1:
        raise UserError("--stop, --pause and --resume: give one of them")
    control = controls[0] if controls else None
    if control is not None and where is not None:
        raise UserError(f"--where filters a snapshot to take: not with --{control.split('-')[0]}")
    if control in (PAUSE_SNAPSHOT, RESUME_SNAPSHOT) and tables:
        raise UserError(f"--{control.split('-')[0]} acts on the whole snapshot under way: name no TABLE")
    if control is None and not tables:
        raise UserError("name the TABLE(s) to snapshot (or give --stop, --pause or --resume)")
    if where is not None and (len(tables) != 1 or not where.strip()):
        raise UserError("--where filters one table: name exactly one TABLE and a non-empty condition")

    settings = settings_from(config)
    specs = source_specs(settings)
    if source is not None:
        spec = next((s for s in specs if s.name == source), None)
        if spec is None:
            known = ", ".join(s.name for s in specs) or "none configured"
            raise UserError(f"unknown source {source!r} (sources: {known})")
    elif len(specs) == 1:
        spec = specs[0]
    elif not specs:
        raise UserError("no [[sources]] configured: nothing to snapshot")
    else:
        raise UserError(f"several sources ({', '.join(s.name for s in specs)}): say which with --source NAME")
    try:
        names = [qualified_table(t) for t in tables]
    except BadSignal as exc:
        raise UserError(str(exc)) from None
    exclude = spec.row_exclude
    captured = TableFilter(spec.include, exclude)
    for name in names:
        if not captured.matches(*name.split(".", 1)):
            raise UserError(
                f"table {name} is not captured by source {spec.name!r} (include = {list(spec.include)}, "
                f"exclude = {list(exclude)})"
            )
    filters = {names[0]: where.strip()} if where is not None else {}
    message = control_message(control, names) if control is not None else snapshot_message(names, filters)
    try:
        with sql_connection(spec.dsn, label=spec.name) as conn:
            for name in names:
                row = conn.execute(
                    "SELECT 1 FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
                    "WHERE n.nspname = %s AND c.relname = %s AND c.relkind IN ('r', 'p')",
                    tuple(name.split(".", 1)),
                ).fetchone()
                if row is None:
                    raise UserError(f"table {name} does not exist in source {spec.name!r}")
            for name, condition in filters.items():
                schema, table = name.split(".", 1)
                if (refused := filter_refusal(conn, schema, table, condition)) is not None:
                    raise UserError(f"table {name} {refused}")
            with conn.transaction():
                lsn = conn.execute(
                    "SELECT pg_logical_emit_message(true, %s, %s)::text", (SIGNAL_PREFIX, message)
                ).fetchone()
    except psycopg.Error as exc:  # e.g. EXECUTE on pg_logical_emit_message revoked from the role
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UserError(f"source {spec.name!r}: cannot write the signal: {first}") from None
    at = lsn[0] if lsn else "?"
    if control is not None:
        what = f"{control.split('-')[0]} of the chunked snapshot" + (f" of {', '.join(names)}" if names else "")
        typer.echo(
            f"{what} requested from source {spec.name} (WAL {at}): capture applies it when it reaches that point"
        )
        return
    only = f" where {filters[names[0]]}" if filters else ""
    typer.echo(
        f"snapshot of {', '.join(names)}{only} requested from source {spec.name} (WAL {at}): "
        "capture re-reads it, chunked, when it reaches that point"
    )


def register(app: typer.Typer) -> None:
    app.command("init")(init)
    app.add_typer(capture_app, name="capture")
