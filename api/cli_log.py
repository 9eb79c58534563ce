"""`tributary log …`: inspect the log (topics, cat, compact, verify).

Each command is a thin typer wrapper around a plain function taking the log root, so the lead can
supply the root from `--config` later. Errors print one line on stderr and exit 1.
"""

from __future__ import annotations

import heapq
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Annotated, Any, BinaryIO

import typer

from api.cli_common import ConfigOption
from api.config import Settings
from capture.log import (
    CompactionStats,
    Log,
    LogError,
    LogLockedError,
    Problem,
    Record,
)
from capture.log.cleaner import CleanerPolicy, PartitionCheckpoint, read_checkpoint

__all__ = [
    "CompactedInBackground",
    "background_state",
    "cat",
    "cleaner_policy",
    "compact",
    "compaction_state",
    "log_app",
    "register",
    "repair",
    "topics",
    "verify",
]

DEFAULT_ROOT = Path(".tributary/log")

log_app = typer.Typer(
    help="Inspect the log: list topics, print records, compact, verify checksums.",
    no_args_is_help=True,
)


def register(app: typer.Typer) -> None:
    """Called by api.cli: mounts these commands as `tributary log …`."""
    app.add_typer(log_app, name="log")


RootOption = Annotated[
    Path | None, typer.Option("--root", help="Log root directory (default: [log] root of the config).")
]


def _root(root: Path | None, config: Path | None) -> Path:
    """`--root` if given, else the config's `[log] root`."""
    if root is not None:
        return root
    from api.cli_common import settings_from

    return settings_from(config).log.root


# -- plain functions (the work) -------------------------------------------------------------


def topics(root: Path) -> list[dict[str, object]]:
    """Each topic's config, committed offsets and, for `compact` topics, what the cleaner last did."""
    doc = read_checkpoint(root)
    checkpoints = doc.get("partitions", {})
    with Log.open(root) as log:
        out: list[dict[str, object]] = []
        for name, cfg in sorted(log.topics().items()):
            starts, ends = log.start_offsets(name), log.end_offsets(name)
            spans = zip(range(cfg.partitions), starts, ends, strict=True)
            out.append(
                {
                    "topic": name,
                    "partitions": cfg.partitions,
                    "policy": cfg.policy,
                    "records": sum(
                        PartitionCheckpoint.from_json(checkpoints.get(f"{name}/{p}") or {}).records(s, e)
                        for p, s, e in spans
                    ),
                    "start_offsets": starts,
                    "end_offsets": ends,
                    "compaction": compaction_state(doc, name, cfg.partitions) if cfg.policy == "compact" else None,
                }
            )
        return out


def compaction_state(doc: dict[str, Any], topic: str, partitions: int) -> dict[str, Any]:
    """A topic's compaction as the cleaner recorded it (`cleaner.json`): when each partition was
    last compacted and the records/bytes before → after of those compactions, summed."""
    parts = doc.get("partitions", {})
    lasts = [parts[k]["last"] for k in (f"{topic}/{p}" for p in range(partitions)) if (parts.get(k) or {}).get("last")]
    at = max((f["at_ms"] for f in lasts), default=None)
    return {
        "last_compaction_ms": at,
        "last_compaction": None if at is None else _utc(at),
        "partitions_compacted": len(lasts),
        **_summed(lasts),
        "cleaner_pid": doc.get("pid"),
        "cleaner_interval_s": None if "interval_ms" not in doc else doc["interval_ms"] / 1000,
        "cleaner_last_pass_ms": doc.get("last_pass_ms"),
    }


def _merged(parts: Iterable[Iterator[Record]]) -> Iterator[Record]:
    """Partitions merged by timestamp, then partition, then offset (each is offset-ordered)."""
    return heapq.merge(*parts, key=lambda r: (r.timestamp, r.partition, r.offset))


def _latest(records: Iterable[Record]) -> list[Record]:
    """The table view: the latest record per key (keys whose latest is a tombstone are gone)."""
    latest: dict[tuple[int, bytes], Record] = {}
    keyless: list[Record] = []
    for r in records:
        if r.key is None:
            keyless.append(r)
        else:
            latest[(r.partition, r.key)] = r
    kept = [r for r in latest.values() if r.value is not None] + keyless
    return sorted(kept, key=lambda r: (r.timestamp, r.partition, r.offset))


def cat(
    root: Path,
    topic: str,
    *,
    partition: int | None = None,
    from_offset: int = 0,
    follow: bool = False,
    compacted: bool = False,
    out: BinaryIO | None = None,
    poll_s: float = 0.1,
    on_poll: Callable[[], bool] | None = None,
) -> int:
    """Write one JSON object per record; returns how many. With `follow`, keep polling the
    manifest every `poll_s` until interrupted (or until `on_poll` returns False, for tests)."""
    stream = out if out is not None else sys.stdout.buffer
    written = 0
    with Log.open(root) as log:
        n = len(log.end_offsets(topic))
        parts = [partition] if partition is not None else list(range(n))
        for p in parts:
            if not 0 <= p < n:
                raise LogError(f"topic {topic!r} has partitions 0..{n - 1}, not {p}")
        ends = {p: from_offset for p in parts}
        first = True
        while True:
            stops = log.end_offsets(topic)
            iters = [log.read(topic, p, ends[p], to_offset=stops[p]) for p in parts]
            records: Iterable[Record] = _merged(iters)
            if compacted and first:
                records = _latest(records)
            for r in records:
                stream.write(r.to_json() + b"\n")
                written += 1
            for p in parts:
                ends[p] = max(ends[p], stops[p])
            stream.flush()
            first = False
            if not follow or (on_poll is not None and not on_poll()):
                return written
            time.sleep(poll_s)
            log.refresh()


class CompactedInBackground(Exception):
    """`log compact` while capture runs: the daemon's cleaner does it; the message says how."""


def cleaner_policy(settings: Settings) -> CleanerPolicy | None:
    """The `[log]` cleaner keys as the capture daemon's cleaner policy; None when
    `cleaner_interval_s` is 0 (no background cleaner)."""
    s = settings.log
    if s.cleaner_interval_s <= 0:
        return None
    return CleanerPolicy(
        interval_ms=int(s.cleaner_interval_s * 1000),
        min_cleanable_dirty_ratio=s.min_cleanable_dirty_ratio,
        delete_retention_ms=s.delete_retention_ms,
        retention_ms=s.retention_ms,
        retention_bytes=s.retention_bytes,
        file_delete_delay_ms=s.file_delete_delay_ms,
    )


def _summed(figures: list[dict[str, Any]]) -> dict[str, int]:
    """Records and bytes before → after, summed over partitions' recorded compactions."""
    return {f: sum(x[f] for x in figures) for f in ("records_before", "records_after", "bytes_before", "bytes_after")}


def _utc(ms: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(ms / 1000))


def background_state(root: Path) -> str:
    """One line on the running daemon's cleaner, from `cleaner.json` (what it last recorded);
    LogError if whoever holds the log runs no cleaner."""
    doc = read_checkpoint(root)
    try:
        holder = (root / ".lock").read_text().strip() or "?"
    except OSError:
        holder = "?"
    if not doc or str(doc.get("pid")) != holder:
        raise LogError(
            f"cannot compact: pid {holder} holds the log at {root} without a background cleaner "
            "(capture with [log] cleaner_interval_s = 0?); stop it to compact by hand"
        )
    every = f"{doc.get('interval_ms', 0) / 1000:g}"
    line = f"capture (pid {holder}) is running and compacts in the background every {every} s"
    last = doc.get("last_compaction_ms")
    if last is None:
        return line + "; nothing compacted yet (no partition has enough sealed dirty data)"
    figures = [p["last"] for p in doc.get("partitions", {}).values() if p.get("last")]
    recent = [f for f in figures if f.get("at_ms") == last]
    s = _summed(recent)
    records, nbytes = f"{s['records_before']} → {s['records_after']}", f"{s['bytes_before']} → {s['bytes_after']}"
    return line + f"; last compaction {_utc(last)}: {records} records, {nbytes} bytes"


def compact(
    root: Path,
    topic: str | None = None,
    *,
    now_ms: int | None = None,
    delete_retention_ms: int | None = None,
) -> CompactionStats:
    """Compact now; while capture holds the log, raise `CompactedInBackground` saying what its
    cleaner does instead (it alone may rewrite segments)."""
    try:
        log = Log.open(root, writer=True)
    except LogLockedError:
        raise CompactedInBackground(background_state(root)) from None
    with log:
        now = int(time.time() * 1000) if now_ms is None else now_ms
        return log.compact(topic, now_ms=now, delete_retention_ms=delete_retention_ms)


def verify(root: Path) -> list[Problem]:
    with Log.open(root) as log:
        return log.verify()


def repair(root: Path) -> list[str]:
    """Cut damaged committed tails back to the last intact record (needs the writer lock)."""
    try:
        log = Log.open(root, writer=True, repair=True)
    except LogLockedError as exc:
        raise LogError(f"cannot repair while capture is running: {exc}") from None
    with log:
        return list(log.repaired)


# -- typer wrappers -------------------------------------------------------------------------


def _fail(exc: Exception) -> typer.Exit:
    typer.echo(f"tributary: {exc}", err=True)
    return typer.Exit(1)


@log_app.command("topics")
def topics_cmd(root: RootOption = None, config: ConfigOption = None) -> None:
    """List topics with their partitions, policy and committed offsets."""
    root = _root(root, config)
    try:
        rows = topics(root)
    except LogError as exc:
        raise _fail(exc) from None
    if not rows:
        typer.echo("no topics yet", err=True)
    for r in rows:
        c: Any = r["compaction"]
        compacted = ""
        if c and c["last_compaction"]:
            compacted = (
                f"\tlast_compaction={c['last_compaction']} ({c['records_before']} → {c['records_after']} records)"
            )
        typer.echo(
            f"{r['topic']}\tpartitions={r['partitions']}\tpolicy={r['policy']}\t"
            f"records={r['records']}\tend_offsets={r['end_offsets']}{compacted}"
        )


@log_app.command("cat")
def cat_cmd(
    topic: Annotated[str, typer.Argument(help="Topic name, e.g. shop.public.orders.")],
    partition: Annotated[int | None, typer.Option("--partition", "-p", help="Only this partition.")] = None,
    from_offset: Annotated[int, typer.Option("--from", help="Start at this offset (per partition).")] = 0,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Keep printing new commits until Ctrl-C.")] = False,
    compacted: Annotated[bool, typer.Option("--compacted", help="Only the latest record per key.")] = False,
    root: RootOption = None,
    config: ConfigOption = None,
) -> None:
    """Print records as JSON lines: topic, partition, offset, timestamp, key, value, headers."""
    root = _root(root, config)
    try:
        cat(
            root,
            topic,
            partition=partition,
            from_offset=from_offset,
            follow=follow,
            compacted=compacted,
        )
    except KeyboardInterrupt:
        return
    except (LogError, BrokenPipeError) as exc:
        if isinstance(exc, BrokenPipeError):
            return
        raise _fail(exc) from None


@log_app.command("compact")
def compact_cmd(
    topic: Annotated[str | None, typer.Argument(help="Topic (default: every compacted topic).")] = None,
    root: RootOption = None,
    config: ConfigOption = None,
) -> None:
    """Compact sealed segments of `compact` topics now (while capture runs, its background
    cleaner does this: the command then says when it last did)."""
    from api.cli_common import settings_from

    settings = settings_from(config)
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
            "(offsets lost there stay a gap). Needs capture to be stopped.",
        ),
    ] = False,
) -> None:
    """Read every committed record and check its CRC and order; exit 1 if anything is wrong."""
    root = _root(root, config)
    try:
        if fix:
            for note in repair(root):
                typer.echo(f"repaired: {note}", err=True)
        problems = verify(root)
    except LogError as exc:
        raise _fail(exc) from None
    for p in problems:
        typer.echo(f"corrupt: {p}", err=True)
    if problems:
        typer.echo(f"tributary: {len(problems)} problem(s) found in {root}", err=True)
        raise typer.Exit(1)
    typer.echo(f"ok: every committed record in {root} is intact")


if __name__ == "__main__":  # pragma: no cover - for `python -m api.cli_log`
    sys.exit(log_app())
