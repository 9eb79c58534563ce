"""Splitting a topic's committed data into byte ranges for parallel readers (Spark tasks)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from capture.log.codec import peek_offset
from capture.log.errors import LogError
from capture.log.manifest import PartitionState
from capture.log.reader import committed_segments, partition_dir
from capture.log.segment import (
    SegmentRef,
    iter_records,
    load_offset_index,
    log_path,
)
from capture.log.types import Record, Split

__all__ = ["plan_splits", "read_split"]


def plan_splits(
    root: Path, topic: str, partition: int, state: PartitionState, max_bytes: int
) -> list[Split]:
    """Cut each committed segment at index entries (line starts) into ranges of about max_bytes."""
    pdir = partition_dir(root, topic, partition)
    out: list[Split] = []
    for base in committed_segments(pdir, state):
        path = log_path(pdir, base)
        end = state.nbytes if base == state.segment else path.stat().st_size
        if end <= 0:
            continue
        first = _first_offset(path)
        if first is None:
            continue
        cuts = [(base + rel, pos) for rel, pos in load_offset_index(pdir, base) if 0 < pos < end]
        start, start_off = 0, first
        for off, pos in cuts:
            if pos - start >= max_bytes:
                out.append(Split(topic, partition, str(path), start, pos, start_off))
                start, start_off = pos, off
        out.append(Split(topic, partition, str(path), start, end, start_off))
    return out


def _first_offset(path: Path) -> int | None:
    with open(path, "rb") as f:
        return peek_offset(f.read(40))


def read_split(split: Split) -> Iterator[Record]:
    """Records of one split; usable in any process (needs only the split itself)."""
    path = Path(split.path)
    with open(path, "rb") as f:
        f.seek(max(split.start_byte - 1, 0))
        head = f.read(41)
    at = head[1:] if split.start_byte else head
    if (split.start_byte and head[:1] != b"\n") or peek_offset(at) != split.first_offset:
        raise LogError(
            f"{path} changed since the split was planned (compacted?): plan the splits again"
        )
    ref = SegmentRef(split.topic, split.partition, path.parent, int(path.name[:20]))
    for off, ts, key, value, headers in iter_records(ref, split.start_byte, split.end_byte):
        yield Record(split.topic, split.partition, off, ts, key, value, headers)
