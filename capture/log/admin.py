"""The log's admin operations: topics, cat, compact, verify, repair.

The command line (`tributary log …`) and the HTTP API (`GET /topics`) both call these; each takes
the log's root directory and works on committed data only.
"""

from __future__ import annotations

import heapq
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

from tributary.capture.log.cleaner import PartitionCheckpoint, read_checkpoint
from tributary.capture.log.errors import LogError, LogLockedError
from tributary.capture.log.log import Log
from tributary.capture.log.types import CompactionStats, Problem, Record

__all__ = [
    "CompactedInBackground",
    "background_state",
    "cat",
    "compact",
    "compaction_state",
    "repair",
    "topics",
    "verify",
]


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
