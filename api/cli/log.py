"""`tributary log …`: inspect the log (topics, cat, compact, verify).

Each command is a thin typer wrapper around the log's admin operations
(`tributary.log.open_admin`: the configured backend). Errors print one line on stderr and exit 1.
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType
from typing import Annotated

import typer

from tributary.api.cli.common import ConfigOption
from tributary.api.cli.help import SentenceGroup
from tributary.log import LogAdmin, LogError, TopicSummary, open_admin
from tributary.log.local.admin import CompactedInBackground, compact

__all__ = ["log_app", "register"]

DEFAULT_ROOT = Path(".tributary/log")

log_app = typer.Typer(
    cls=SentenceGroup,
    help="Inspect the log: list topics, print records, compact, verify checksums.",
    no_args_is_help=True,
)


def register(app: typer.Typer) -> None:
    """Called by the CLI's main module: mounts these commands as `tributary log …`."""
    app.add_typer(log_app, name="log")


RootOption = Annotated[
    Path | None, typer.Option("--root", help="Log root directory (default: [log] root of the config).")
]


def _admin(root: Path | None, config: Path | None) -> LogAdmin:
    """The config's log (`[log] backend`), or the local log at `--root` when one is given."""
    if root is not None:
        return open_admin(root=root, kafka=None)
    from tributary.api.cli.common import settings_from
    from tributary.api.settings.log import log_admin

    return log_admin(settings_from(config))


# -- typer wrappers -------------------------------------------------------------------------


def _fail(exc: Exception) -> typer.Exit:
    typer.echo(f"tributary: {exc}", err=True)
    return typer.Exit(1)


@log_app.command("topics")
def topics_cmd(root: RootOption = None, config: ConfigOption = None) -> None:
    """List topics with their partitions, policy, records (data and schema records apart) and
    committed offsets (on Kafka: partitions and end offsets)."""
    try:
        rows = _admin(root, config).topics()
    except LogError as exc:
        raise _fail(exc) from None
    if not rows:
        typer.echo("no topics yet", err=True)
    for r in rows:
        typer.echo(_topic_line(r))


def _topic_line(r: TopicSummary) -> str:
    """One topic as `log topics` prints it: its record counts where the log keeps them apart (data
    and schema records; on Kafka the broker counts none), and what compaction last did."""
    if "data_records" not in r:
        return f"{r['topic']}\tpartitions={r['partitions']}\tpolicy={r['policy']}\tend_offsets={r['end_offsets']}"
    c = r["compaction"]
    compacted = ""
    if c and c["last_compaction"]:
        compacted = f"\tlast_compaction={c['last_compaction']} ({c['records_before']} → {c['records_after']} records)"
    return (
        f"{r['topic']}\tpartitions={r['partitions']}\tpolicy={r['policy']}\t"
        f"records={r['records']}\tdata_records={r['data_records']}\tschema_records={r['schema_records']}\t"
        f"end_offsets={r['end_offsets']}{compacted}"
    )


@log_app.command("cat")
def cat_cmd(
    topic: Annotated[str, typer.Argument(help="Topic name, e.g. shop.public.orders.")],
    partition: Annotated[int | None, typer.Option("--partition", "-p", help="Only this partition.")] = None,
    from_offset: Annotated[int, typer.Option("--from", help="Start at this offset (per partition).")] = 0,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Keep printing new commits until Ctrl-C.")] = False,
    compacted: Annotated[
        bool, typer.Option("--compacted", help="Only the latest record per key, TOAST placeholders filled.")
    ] = False,
    root: RootOption = None,
    config: ConfigOption = None,
) -> None:
    """Print records as JSON lines: topic, partition, offset, timestamp, key, value, headers."""
    try:
        with _until_signalled(follow) as stopped:
            _admin(root, config).cat(
                topic, partition=partition, from_offset=from_offset, compacted=compacted, follow=follow, stop=stopped
            )
    except (BrokenPipeError, KeyboardInterrupt):
        return
    except LogError as exc:
        raise _fail(exc) from None


@contextlib.contextmanager
def _until_signalled(active: bool) -> Iterator[Callable[[], bool]]:
    """While active (`--follow`), Ctrl-C and SIGTERM only raise a flag: the reader sees it at its
    next poll and ends cleanly (its consumer closed, exit 0). The handlers are restored after."""
    raised: list[int] = []
    if not active:
        yield lambda: False
        return

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        raised.append(signum)

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield lambda: bool(raised)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@log_app.command("compact")
def compact_cmd(
    topic: Annotated[str | None, typer.Argument(help="Topic (default: every compacted topic).")] = None,
    root: RootOption = None,
    config: ConfigOption = None,
) -> None:
    """Compact sealed segments of `compact` topics now (while capture runs, its background
    cleaner does this: the command then says when it last did). On Kafka the brokers compact."""
    from tributary.api.cli.common import settings_from

    settings = settings_from(config)
    if root is None and settings.log.backend == "kafka":
        typer.echo(
            "the log is Kafka's: its brokers compact `compact` topics themselves "
            "(log.cleaner.enable, min.cleanable.dirty.ratio; docs/kafka.md); nothing to do here"
        )
        return
    root = root if root is not None else settings.log.root
    try:
        s = compact(root, topic, delete_retention_ms=settings.log.delete_retention_ms)
    except CompactedInBackground as exc:
        typer.echo(str(exc))
        return
    except LogError as exc:
        raise _fail(exc) from None
    typer.echo(
        f"compacted: {s.records_before} → {s.records_after} records, {s.bytes_before} → "
        f"{s.bytes_after} bytes ({s.segments_rewritten} segments rewritten, "
        f"{s.segments_deleted} removed)"
    )


@log_app.command("verify")
def verify_cmd(
    root: RootOption = None,
    config: ConfigOption = None,
    fix: Annotated[
        bool,
        typer.Option(
            "--repair",
            help="First cut damaged committed tails back to their last intact record "
            "(offsets lost there stay a gap) and rebuild a lost manifest.json from the segment "
            "files, with the source positions capture resumes from. Needs capture to be stopped.",
        ),
    ] = False,
) -> None:
    """Read every committed record and check its CRC and order; exit 1 if anything is wrong.
    On Kafka: the broker checks its own logs; this checks the offsets topic, each source's
    position and every topic's partitions (a leader each)."""
    sources: list[str] = []
    if root is None:
        from tributary.api.cli.common import settings_from
        from tributary.api.settings.log import log_admin

        settings = settings_from(config)
        admin, sources = log_admin(settings), [s.name for s in settings.sources]
    else:
        admin = open_admin(root=root, kafka=None)
    try:
        if fix:
            from tributary.capture.resume import positions_in

            for note in admin.repair(positions_in):
                typer.echo(f"repaired: {note}", err=True)
        check = admin.verify(sources)
    except LogError as exc:
        raise _fail(exc) from None
    for note in check.notes:
        typer.echo(note)
    for warning in check.warnings:
        typer.echo(f"warning: {warning}", err=True)
    for problem in check.problems:
        typer.echo(problem, err=True)
    if check.problems:
        typer.echo(f"tributary: {len(check.problems)} problem(s) found {check.where}", err=True)
        raise typer.Exit(1)
    typer.echo(check.ok)
