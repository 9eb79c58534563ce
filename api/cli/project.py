"""`tributary project list | status | run | rebuild`."""

from __future__ import annotations

import dataclasses
import json
import logging
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from logging.handlers import RotatingFileHandler
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from tributary.api.cli.common import ConfigOption, service_dsn, settings_from
from tributary.api.cli.help import SentenceGroup
from tributary.api.cli.output import count

if TYPE_CHECKING:
    from tributary.projections.runner import RunResult, RunSettings


__all__ = ["register"]

_LOG = logging.getLogger("tributary.projections.cli")
_LOG.propagate = False  # the trace goes to project.log; the terminal gets the one line
TRACE_BYTES = 10 << 20  # project.log past this size becomes project.log.1 (replacing an older one)

project_app = typer.Typer(
    cls=SentenceGroup, help="Projections: fold the log into derived tables (PySpark).", no_args_is_help=True
)


def _run_settings(config: Path | None, *, skip_errors: bool = False) -> RunSettings:
    # projections.runner is imported when a project command runs (here and in each command): it
    # pulls in pyarrow and the Spark glue, which every other `tributary` command would pay for at start.
    from tributary.projections.runner import RunSettings

    settings = settings_from(config)
    run_settings = RunSettings.from_settings(settings, dsn=service_dsn(settings))
    return dataclasses.replace(run_settings, skip_errors=True) if skip_errors else run_settings


@contextmanager
def _reporting(settings: RunSettings) -> Iterator[None]:
    """Keep a run's terminal to its result or one line: the JVM's output goes to `spark.log` and
    a failure's full trace (the Python worker's, Spark's) to `project.log`, both beside the log
    root; the one line names the projection, the record, the exception and that file. Each is
    capped: past 10 MB it becomes `<name>.1`, replacing the previous one."""
    from tributary.api.settings.logs import JsonFormatter
    from tributary.projections.errors import ProjectionError, RunError
    from tributary.projections.spark import log_jvm_to

    home = Path(settings.log_root).resolve().parent
    log_jvm_to(home / "spark.log")
    trace = home / "project.log"
    try:
        yield
    except ProjectionError as exc:
        if exc.__cause__ is None:  # ours from the start (a bad file, a lock): the line says it all
            raise
        home.mkdir(parents=True, exist_ok=True)
        handler = RotatingFileHandler(trace, maxBytes=TRACE_BYTES, backupCount=1, encoding="utf-8")
        handler.setFormatter(JsonFormatter())
        _LOG.addHandler(handler)
        try:
            _LOG.error("%s", exc, exc_info=exc)
        finally:
            _LOG.removeHandler(handler)
            handler.close()
        raise RunError(f"{exc} (full trace in {trace})") from exc


@contextmanager
def _progress() -> Iterator[Any]:
    """A rich progress bar on a terminal; a no-op callback otherwise."""
    if not sys.stderr.isatty():
        yield None
        return
    bar = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed:,}/{task.total:,}"),
        TimeElapsedColumn(),
        console=Console(stderr=True),
    )
    tasks: dict[str, Any] = {}

    def update(stage: str, done: int, total: int) -> None:
        if stage not in tasks:
            tasks[stage] = bar.add_task(stage, total=total or None)
        bar.update(tasks[stage], completed=done, total=total or None)

    with bar:
        yield update


def _print_result(result: RunResult) -> None:
    what = "rebuilt" if result.rebuilt else "caught up"
    typer.echo(
        f"{result.name}: {what} build {result.build} ({result.table}): "
        f"{count(result.records, 'record')} read, {count(result.rows, 'row')} written in {result.seconds:.1f}s"
    )


def _require_init(dsn: str) -> None:
    """Refuse to run before `tributary init` instead of folding an empty log into fresh tables."""
    from tributary.eventstore.migrate import require_initialized

    require_initialized(dsn)


@project_app.command("list")
def list_cmd(config: ConfigOption = None) -> None:
    """Every configured projection: name, version, source topics, kind, window, mode (incremental or why not)."""
    from tributary.projections.runner import list_projections

    rows = list_projections(_run_settings(config))
    if not rows:
        typer.echo("no projections configured: add files or modules to [projections] modules (see README)")
    for p in rows:
        window = f" window={p['window']}" if p["window"] else ""
        typer.echo(f"{p['name']} v{p['version']} {p['kind']} topics={','.join(p['topics'])}{window} mode={p['mode']}")


@project_app.command("status")
def status_cmd(
    name: Annotated[str | None, typer.Argument(help="One projection (default: all).")] = None,
    config: ConfigOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Serving build, state, lag behind the log, late records dropped, whether a rebuild is due."""
    from tributary.projections.runner import status

    rows = status(_run_settings(config), name)
    if as_json:
        typer.echo(
            json.dumps([r.__dict__ if hasattr(r, "__dict__") else _asdict(r) for r in rows], indent=1, default=str)
        )
        return
    for r in rows:
        flag = "  (version changed: next run rebuilds)" if r.needs_rebuild and r.build is not None else ""
        typer.echo(
            f"{r.name} v{r.version}: {r.label} build={r.build} table={r.table} records={r.records:,} "
            f"lag={r.lag:,} late_dropped={r.late_dropped:,}{'' if r.stream is None else ' stream=' + r.stream}"
            f" mode={r.mode}{flag}"
        )


def _asdict(obj: Any) -> dict[str, Any]:
    return {k: getattr(obj, k) for k in obj.__slots__}


@project_app.command("run")
def run_cmd(
    name: Annotated[str, typer.Argument(help="Projection name.")],
    config: ConfigOption = None,
    continuous: Annotated[bool, typer.Option("--continuous", help="Keep catching up until Ctrl-C/SIGTERM.")] = False,
    freshness: Annotated[
        float,
        typer.Option(help="With --continuous: most seconds between passes while idle (a commit wakes it at once)."),
    ] = 5.0,
    skip_errors: Annotated[
        bool, typer.Option("--skip-errors", help="Send records the projection fails on to a dead-letter table.")
    ] = False,
) -> None:
    """Catch the projection up to the log end (rebuilding first if its version changed)."""
    from tributary.projections.runner import run, run_continuous

    settings = _run_settings(config, skip_errors=skip_errors)
    _require_init(settings.dsn)
    if not continuous:
        with _reporting(settings), _progress() as progress:
            _print_result(run(name, settings, progress=progress))
        return
    stopping = {"flag": False}

    def stop(*_: object) -> None:
        stopping["flag"] = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    with _reporting(settings):
        passes = run_continuous(name, settings, freshness_s=freshness, stop=lambda: stopping["flag"])
    typer.echo(f"{name}: stopped after {passes} passes")


@project_app.command("rebuild")
def rebuild_cmd(name: Annotated[str, typer.Argument(help="Projection name.")], config: ConfigOption = None) -> None:
    """Build a new table from offset 0 while the old one serves, then swap the view atomically."""
    from tributary.projections.runner import rebuild

    settings = _run_settings(config)
    _require_init(settings.dsn)
    with _reporting(settings), _progress() as progress:
        _print_result(rebuild(name, settings, progress=progress))


def register(app: typer.Typer) -> None:
    app.add_typer(project_app, name="project")
