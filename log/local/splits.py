"""Splitting a topic's committed data into byte ranges for parallel readers (Spark tasks).

A split names a file, a byte range and the offsets it stands for, [first_offset, end_offset).
The byte range is a fast path; the offsets are the truth. Compaction may rename a shorter version
over the file between planning and reading: the reader then finds the offsets in the version it
opened (validated on that one open file), so it yields whole, committed records, each offset of
the plan at most once, never a byte range of the wrong version (docs/log.md).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

from tributary.log.local.codec import peek_offset
from tributary.log.local.errors import LogError
from tributary.log.local.manifest import PartitionState
from tributary.log.local.reader import committed_segments, open_segment, partition_dir
from tributary.log.local.segment import (
    SegmentRef,
    iter_records,
    load_offset_index,
    log_path,
    seek_position,
    starts_at,
)
from tributary.log.local.types import Record, Split

__all__ = ["plan_splits", "read_split"]


def plan_splits(root: Path, topic: str, partition: int, state: PartitionState, max_bytes: int) -> list[Split]:
    """Cut each committed segment at index entries (line starts) into ranges of about max_bytes."""
    pdir = partition_dir(root, topic, partition)
    out: list[Split] = []
    bases = committed_segments(pdir, state)
    for i, base in enumerate(bases):
        path = log_path(pdir, base)
        f = open_segment(path)
        if f is None:
            continue  # emptied by compaction or removed by retention since it was listed
        with f:
            end = state.nbytes if base == state.segment else os.fstat(f.fileno()).st_size
            first = peek_offset(os.pread(f.fileno(), 40, 0)) if end > 0 else None
        if first is None:
            continue
        # every offset of this segment is below the next one's base (or the committed end)
        stop = state.end if base == state.segment or i + 1 == len(bases) else bases[i + 1]
        cuts = [(base + rel, pos) for rel, pos in load_offset_index(pdir, base) if 0 < pos < end]
        start, start_off = 0, first
        for off, pos in cuts:
            if pos - start >= max_bytes:
                out.append(Split(topic, partition, str(path), start, pos, start_off, off))
                start, start_off = pos, off
        out.append(Split(topic, partition, str(path), start, end, start_off, stop))
    return out


def read_split(split: Split) -> Iterator[Record]:
    """Records of one split; usable in any process (needs only the split itself)."""
    path = Path(split.path)
    ref = SegmentRef(split.topic, split.partition, path.parent, int(path.name[:20]))
    f = open_segment(path)
    if f is None:
        if split.end_offset is None:
            raise LogError(f"{path} is gone since the split was planned: plan the splits again") from None
        return  # every record of it was compacted away (or it aged out by retention)
    with f:
        unchanged = starts_at(f, split.start_byte, split.first_offset)
        if split.end_offset is None:  # a byte range alone can only be trusted as planned
            if not unchanged:
                raise LogError(f"{path} changed since the split was planned (compacted?): plan the splits again")
            for off, ts, key, value, headers in iter_records(ref, split.start_byte, split.end_byte, file=f):
                yield Record(split.topic, split.partition, off, ts, key, value, headers)
            return
        lo, hi = split.first_offset, split.end_offset
        # rewritten by compaction since planning: find the offsets in the version we hold open
        pos = split.start_byte if unchanged else seek_position(ref.pdir, ref.base, lo, None, file=f)
        for off, ts, key, value, headers in iter_records(ref, pos, None, file=f):
            if off >= hi:
                return
            if off >= lo:
                yield Record(split.topic, split.partition, off, ts, key, value, headers)
            if off + 1 >= hi:
                return  # never decode past the range (the active segment's uncommitted tail)
