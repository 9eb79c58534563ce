"""The log's admin operations: topics, cat, compact, verify, repair.

The command line (`tributary log …`) and the HTTP API (`GET /topics`) both call these; each takes
the log's root directory and works on committed data only.
"""

from __future__ import annotations

import heapq
import os
import re
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, BinaryIO

from tributary.log.local.cleaner import read_checkpoint
from tributary.log.local.errors import LogError, LogLockedError
from tributary.log.local.keys import SCHEMA_KEY
from tributary.log.local.log import Log
from tributary.log.local.manifest import PartitionState
from tributary.log.local.owners import describe, owner_names
from tributary.log.local.placeholders import Carry, fill, holes, observe
from tributary.log.local.reader import committed_segments, open_segment, partition_dir
from tributary.log.local.segment import log_path
from tributary.log.local.types import (
    COMPACTED_POLICIES,
    CompactionState,
    CompactionStats,
    Problem,
    Record,
    TopicSummary,
    Verified,
)

__all__ = [
    "SCHEMA_KEY",
    "CompactedInBackground",
    "LocalAdmin",
    "background_state",
    "cat",
    "compact",
    "compaction_state",
    "latest_per_key",
    "repair",
    "topics",
    "verify",
]


_CHUNK = 4 << 20
_SEALED: dict[tuple[bytes, int, int, int, int], tuple[int, int]] = {}
"""Counts of sealed segments by (key, device, inode, size, mtime): a sealed segment changes only
by being replaced (compaction renames a new file over it), so a long-running reader (the HTTP
API's `GET /topics`) reads each version once."""
_ACTIVE: dict[tuple[bytes, str, int, int], tuple[int, bytes, int, int]] = {}
"""Counts of active segments' committed prefixes by (key, path, device, inode): (bytes counted,
the bytes just before that point, records, keyed). An active segment only grows at its end, so a
later call counts only what was committed since; a prefix that no longer ends in the same bytes
(a repair cut it) is counted again from the start."""
_TAIL = 32


def _line_head(key: bytes) -> re.Pattern[bytes]:
    """A record line's head up to the end of a given key (the codec's line format)."""
    return re.compile(
        rb'\{"offset":\d+,"timestamp":-?\d+,"lens":\[%d,\d+,\d+\],"key":%b\Z' % (len(key), re.escape(key))
    )


def _count_lines(f: BinaryIO, limit: int | None, needle: bytes, head: re.Pattern[bytes]) -> tuple[int, int]:
    """(records, records with the key) in the first `limit` bytes of a segment (all: None).

    Reads whole lines in chunks; counts newlines (`bytes.count`) and finds `,"key":<key>,"value":`
    (`bytes.find`), both at memory speed, and checks each find against its line's head, so a value
    that happens to contain the same bytes is not counted."""
    records = keyed = 0
    carry = b""
    remaining = limit
    while remaining is None or remaining > 0:
        chunk = f.read(_CHUNK if remaining is None else min(_CHUNK, remaining))
        if not chunk:
            break
        if remaining is not None:
            remaining -= len(chunk)
        cut = chunk.rfind(b"\n") + 1
        if not cut:  # inside one long line
            carry += chunk
            continue
        block, carry = carry + chunk[:cut], chunk[cut:]
        records += block.count(b"\n")
        at = block.find(needle)
        while at >= 0:
            start = block.rfind(b"\n", 0, at) + 1
            end = at + len(needle) - len(b',"value":')
            keyed += head.match(block, start, end) is not None
            at = block.find(needle, at + 1)
    return records, keyed


def _counts(root: Path, topic: str, partition: int, state: PartitionState, key: bytes) -> tuple[int, int]:
    """(records, records whose key is `key`) committed in one partition."""
    needle = b',"key":' + key + b',"value":'
    head = _line_head(key)
    pdir = partition_dir(root, topic, partition)
    bases = committed_segments(pdir, state)
    records = keyed = 0
    for i, base in enumerate(bases):
        if i + 1 < len(bases) and bases[i + 1] <= state.start:
            continue  # below the start: retention is removing it
        f = open_segment(log_path(pdir, base))
        if f is None:
            continue  # removed by retention, or emptied by the cleaner, since listed
        with f:
            if base == state.segment:
                n, k = _count_active(f, str(log_path(pdir, base)), state.nbytes, key, needle, head)
            else:
                st = os.fstat(f.fileno())
                version = (key, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
                cached = _SEALED.get(version)
                if cached is None:
                    if len(_SEALED) >= 100_000:
                        _SEALED.clear()
                    cached = _SEALED[version] = _count_lines(f, None, needle, head)
                n, k = cached
        records, keyed = records + n, keyed + k
    return records, keyed


def _count_active(
    f: BinaryIO, path: str, nbytes: int, key: bytes, needle: bytes, head: re.Pattern[bytes]
) -> tuple[int, int]:
    """`_count_lines` over an active segment's committed `nbytes`, from where the last call stopped."""
    fd = f.fileno()
    st = os.fstat(fd)
    ident = (key, path, st.st_dev, st.st_ino)
    upto, tail, n, k = _ACTIVE.get(ident, (0, b"", 0, 0))
    if upto > nbytes or os.pread(fd, len(tail), upto - len(tail)) != tail:
        upto, n, k = 0, 0, 0
    f.seek(upto)
    more, keyed = _count_lines(f, nbytes - upto, needle, head)
    if len(_ACTIVE) >= 10_000:
        _ACTIVE.clear()
    size = min(_TAIL, nbytes)
    _ACTIVE[ident] = (nbytes, os.pread(fd, size, nbytes - size), n + more, k + keyed)
    return n + more, k + keyed


def topics(root: Path, *, schema_key: bytes = SCHEMA_KEY) -> list[TopicSummary]:
    """Each topic's config, committed offsets, records (`data_records` + `schema_records`, the
    latter keyed `schema_key`) and, for `compact` topics, what the cleaner last did.

    Counting reads the committed bytes (no record is decoded; a process that asks again reads
    only what was committed since, and sealed segments rewritten since): `records` counts the committed
    lines, `schema_records` the lines whose key field is `schema_key`, found as bytes and checked
    against the line's head (see `_count_lines`). The cleaner's record cannot tell schema
    records from data, so it is not used for the counts."""
    doc = read_checkpoint(root)
    with Log.open(root) as log:
        out: list[TopicSummary] = []
        for name, cfg in sorted(log.topics().items()):
            records = schema = 0
            for p in range(cfg.partitions):
                n, k = _counts(root, name, p, log.partition_state(name, p), schema_key)
                records, schema = records + n, schema + k
            out.append(
                {
                    "topic": name,
                    "partitions": cfg.partitions,
                    "policy": cfg.policy,
                    "records": records,
                    "data_records": records - schema,
                    "schema_records": schema,
                    "start_offsets": log.start_offsets(name),
                    "end_offsets": log.end_offsets(name),
                    "compaction": compaction_state(doc, name, cfg.partitions)
                    if cfg.policy in COMPACTED_POLICIES
                    else None,
                }
            )
        return out


def compaction_state(doc: dict[str, Any], topic: str, partitions: int) -> CompactionState:
    """A topic's compaction as the cleaner recorded it (`cleaner.json`): when each partition was
    last compacted and the records/bytes before → after of those compactions, summed."""
    parts = doc.get("partitions", {})
    lasts = [parts[k]["last"] for k in (f"{topic}/{p}" for p in range(partitions)) if (parts.get(k) or {}).get("last")]
    at = max((f["at_ms"] for f in lasts), default=None)
    summed = _summed(lasts)
    return {
        "last_compaction_ms": at,
        "last_compaction": None if at is None else _utc(at),
        "partitions_compacted": len(lasts),
        "records_before": summed["records_before"],
        "records_after": summed["records_after"],
        "bytes_before": summed["bytes_before"],
        "bytes_after": summed["bytes_after"],
        "cleaner_pid": doc.get("pid"),
        "cleaner_interval_s": None if "interval_ms" not in doc else doc["interval_ms"] / 1000,
        "cleaner_last_pass_ms": doc.get("last_pass_ms"),
    }


def _merged(parts: Iterable[Iterator[Record]]) -> Iterator[Record]:
    """Partitions merged by timestamp, then partition, then offset (each is offset-ordered)."""
    return heapq.merge(*parts, key=lambda r: (r.timestamp, r.partition, r.offset))


def latest_per_key(records: Iterable[Record]) -> list[Record]:
    """The table view: the latest record per key (keys whose latest is a tombstone are gone),
    its unchanged-TOAST placeholders filled from the key's earlier records as compaction does,
    so the view is the same before and after a compaction."""
    latest: dict[tuple[int, bytes], Record] = {}
    keyless: list[Record] = []
    for r in records:
        if r.key is None:
            keyless.append(r)
            continue
        at = (r.partition, r.key)
        previous = latest.get(at)
        cols = holes(r.value)
        if cols and previous is not None and r.value is not None:
            carry: Carry = {}
            observe(carry, previous.value, cols)  # `previous` is resolved already: the fold so far
            r = replace(r, value=fill(r.value, carry))
        latest[at] = r
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
    manifest every `poll_s` until `on_poll` returns False (the CLI: Ctrl-C or SIGTERM asked it to end)."""
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
                records = latest_per_key(records)
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
        log = Log.open(root, writer=True, create=False)
    except LogLockedError:
        raise CompactedInBackground(background_state(root)) from None
    with log:
        now = int(time.time() * 1000) if now_ms is None else now_ms
        return log.compact(topic, now_ms=now, delete_retention_ms=delete_retention_ms)


def verify(root: Path) -> list[Problem]:
    with Log.open(root) as log:
        return log.verify()


def repair(root: Path, *, positions_from: Callable[[Log], Mapping[str, str]] | None = None) -> list[str]:
    """Cut damaged committed tails back to the last intact record and rebuild a lost (or
    partial) manifest from the segments (needs the writer lock); returns what was done.

    Source positions are the writer's business: `positions_from` reads them back from the
    rebuilt log (see `Log.open`). Never creates a log: "no log at …" for a wrong root."""
    try:
        log = Log.open(root, writer=True, repair=True, create=False, positions_from=positions_from)
    except LogLockedError as exc:
        raise LogError(f"cannot repair while capture is running: {exc}") from None
    with log:
        done = list(log.repaired)
    for owner in owner_names(root):  # every other writer's topics and manifest, by its lock
        try:
            named = Log.open(root, writer=True, repair=True, create=False, owner=owner)
        except LogLockedError as exc:
            raise LogError(f"cannot repair while {describe(owner)} is writing: {exc}") from None
        with named:
            done += [f"{describe(owner)}: {note}" for note in named.repaired]
    return done


class LocalAdmin:
    """The operations above as `tributary.log.contracts.LogAdmin`: the local log under `root`."""

    compaction_keeps_unchanged_values = True  # compaction fills placeholders (placeholders.py)

    def __init__(self, root: Path) -> None:
        self.root = root

    def exists(self) -> bool:
        """Whether capture ever wrote here (the root is a directory)."""
        return self.root.is_dir()

    def topics(self) -> list[TopicSummary]:
        return topics(self.root)

    def topic_sizes(self) -> dict[str, tuple[int, int | None]]:
        """Per topic: the offsets between each partition's start and end, summed, and the bytes
        its files take on disk."""
        with Log.open(self.root) as log:
            return {
                topic: (
                    sum(e - b for b, e in zip(log.start_offsets(topic), log.end_offsets(topic), strict=True)),
                    log.disk_bytes(topic),
                )
                for topic in log.topics()
            }

    def positions(self) -> dict[str, str]:
        with Log.open(self.root) as log:
            return log.positions()

    def verify(self, sources: Sequence[str]) -> Verified:
        """Every committed record read back (CRC, order); `sources` are capture's business here."""
        found = Verified(where=f"in {self.root}", ok=f"ok: every committed record in {self.root} is intact")
        found.problems.extend(f"corrupt: {p}" for p in verify(self.root))
        return found

    def repair(self, positions_from: Callable[[Log], Mapping[str, str]]) -> list[str]:
        return repair(self.root, positions_from=positions_from)

    def cat(
        self,
        topic: str,
        *,
        partition: int | None = None,
        from_offset: int = 0,
        compacted: bool = False,
        follow: bool = False,
        stop: Callable[[], bool] | None = None,
        out: BinaryIO | None = None,
    ) -> int:
        return cat(
            self.root,
            topic,
            partition=partition,
            from_offset=from_offset,
            follow=follow,
            compacted=compacted,
            out=out,
            on_poll=None if stop is None else lambda: not stop(),
        )
