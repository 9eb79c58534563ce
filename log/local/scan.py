"""Walking a segment's records to recover writer state and rebuild indexes (recovery side)."""

from __future__ import annotations

from dataclasses import dataclass, field

from tributary.log.local import _fileio
from tributary.log.local.codec import BadLine, decode_line
from tributary.log.local.index import pack_offsets, pack_times
from tributary.log.local.segment import (
    SegmentRef,
    index_path,
    iter_lines,
    iter_records,
    log_path,
    timeindex_path,
)

__all__ = ["NO_TS", "Scan", "first_timestamp", "increasing", "rebuild_indexes", "scan_segment"]

NO_TS = -(1 << 62)


def first_timestamp(ref: SegmentRef) -> int:
    for _off, ts, *_ in iter_records(ref, 0, None):
        return ts
    return NO_TS


def increasing(entries: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Drop entries that break the order (garbage left by a crash in an unsynced index file)."""
    out: list[tuple[int, int]] = []
    for rel, pos in entries:
        if not out or (rel > out[-1][0] and pos > out[-1][1]):
            out.append((rel, pos))
    return out


@dataclass(slots=True)
class Scan:
    index: list[tuple[int, int]] = field(default_factory=list)
    times: list[tuple[int, int]] = field(default_factory=list)
    last: int = -1
    max_ts: int = NO_TS
    first_ts: int = NO_TS
    since: int = 0


def scan_segment(ref: SegmentRef, interval: int, start: int = 0, limit: int | None = None, max_ts: int = NO_TS) -> Scan:
    """Walk a segment from a line start, checking every record and recomputing the sparse index
    entries after `start` by the same rule `PartitionWriter._place` applies."""
    scan = Scan(last=ref.base - 1, max_ts=max_ts)
    since = 0
    for pos, line in iter_lines(log_path(ref.pdir, ref.base), start, limit):
        try:
            off, ts, *_ = decode_line(line)
        except BadLine as exc:
            raise ref.corrupt(str(exc), exc.offset if exc.offset is not None else scan.last + 1) from None
        if off <= scan.last and pos > start:
            raise ref.corrupt(f"offsets out of order ({off} after {scan.last})", off)
        if pos > start and since >= interval:
            scan.index.append((off - ref.base, pos))
            scan.times.append((scan.max_ts, off - ref.base))
            since = 0
        if scan.first_ts == NO_TS:
            scan.first_ts = ts
        scan.max_ts = max(scan.max_ts, ts)
        scan.last = off
        since += len(line) + 1
    scan.since = since
    return scan


def rebuild_indexes(ref: SegmentRef, interval: int) -> None:
    """Write a sealed segment's index files from its data (fsynced), final time entry included."""
    scan = scan_segment(ref, interval)
    if scan.last >= ref.base:
        scan.times.append((scan.max_ts, scan.last + 1 - ref.base))
    for p, data in (
        (index_path(ref.pdir, ref.base), pack_offsets(scan.index)),
        (timeindex_path(ref.pdir, ref.base), pack_times(scan.times)),
    ):
        with open(p, "wb") as f:
            f.write(data)
            f.flush()
            _fileio.fsync(f.fileno(), f"writing {p}")
