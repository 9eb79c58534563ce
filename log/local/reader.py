"""Committed-data reads of one partition, bounded by a manifest snapshot (any process)."""

from __future__ import annotations

import bisect
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from tributary.log.local.errors import LogError
from tributary.log.local.index import lookup_time
from tributary.log.local.manifest import PartitionState
from tributary.log.local.segment import (
    SegmentRef,
    claims_below,
    iter_records,
    list_segments,
    load_time_index,
    log_path,
    seek_position,
)
from tributary.log.local.types import Record

__all__ = [
    "committed_segments",
    "open_segment",
    "partition_dir",
    "read_partition",
    "read_partition_from_time",
]


def partition_dir(root: Path, topic: str, partition: int) -> Path:
    return root / topic / str(partition)


def open_segment(path: Path) -> BinaryIO | None:
    """The segment file opened for reading (unbuffered), or None if it is gone."""
    try:
        return open(path, "rb", buffering=0)  # noqa: SIM115 - the caller closes it (with ...)
    except FileNotFoundError:
        return None


def committed_segments(pdir: Path, state: PartitionState) -> list[int]:
    """Bases of segments with committed data: up to the manifest's (later ones are uncommitted)."""
    try:
        bases = list_segments(pdir)
    except FileNotFoundError:
        return []
    return [b for b in bases if b <= state.segment]


def read_partition(
    root: Path, topic: str, partition: int, state: PartitionState, from_offset: int, to_offset: int
) -> Iterator[Record]:
    """Records with from_offset <= offset < min(to_offset, committed end), in offset order.

    A from_offset that compaction or retention removed continues at the next existing offset."""
    end = min(to_offset, state.end)
    start = max(from_offset, state.start)
    if start >= end:
        return
    pdir = partition_dir(root, topic, partition)
    if not pdir.is_dir():
        raise LogError(
            f"partition directory {pdir} is missing but the manifest says it holds "
            f"offsets {state.start}..{state.end - 1}"
        )
    bases = committed_segments(pdir, state)
    i = max(bisect.bisect_right(bases, start) - 1, 0)
    for base in bases[i:]:
        if base >= end:
            return
        limit = state.nbytes if base == state.segment else None
        ref = SegmentRef(topic, partition, pdir, base)
        f = open_segment(log_path(pdir, base))
        if f is None:
            continue  # removed by retention or emptied by compaction: on to the next segment
        # One open file per segment: the position found through the index is validated on it and
        # read from it, so a compaction renaming a new version over the name meanwhile cannot
        # mix two versions (docs/log.md, "Readers during compaction").
        with f:
            pos = seek_position(pdir, base, start, limit, file=f)
            for off, ts, key, value, headers in iter_records(ref, pos, limit, file=f):
                if off < start:
                    continue
                if off >= end:
                    return
                yield Record(topic, partition, off, ts, key, value, headers)
                start = off + 1
                if off + 1 >= end:
                    return  # do not even decode what lies beyond the range
            if limit is not None and claims_below(f, limit, end):
                raise ref.corrupt(
                    f"segment rewritten since the manifest was read: offsets from {start} lie past byte {limit}", start
                )


def read_partition_from_time(
    root: Path, topic: str, partition: int, state: PartitionState, timestamp_ms: int
) -> Iterator[Record]:
    """Everything from the first committed record whose timestamp is >= timestamp_ms."""
    pdir = partition_dir(root, topic, partition)
    for base in committed_segments(pdir, state):
        times = load_time_index(pdir, base)
        # a sealed segment's last time entry (written when it was sealed) covers all its records
        if base < state.segment and times and times[-1][0] < timestamp_ms:
            continue
        rel = lookup_time(times, timestamp_ms)
        for rec in read_partition(root, topic, partition, state, base + rel, state.end):
            if rec.timestamp >= timestamp_ms:
                yield rec
                yield from read_partition(root, topic, partition, state, rec.offset + 1, state.end)
                return
        return
