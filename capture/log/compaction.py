"""Compaction (latest record per key) and retention (whole old segments) of sealed segments.

Both touch only segments that are sealed *and* committed (below the manifest's segment), so the
writer's active segment and anything uncommitted are never rewritten. Each rewrite is atomic per
segment: new files are written and fsynced beside the old ones, then renamed over them.
"""

from __future__ import annotations

import os
from pathlib import Path

from capture.log import _fileio
from capture.log.codec import BadLine, decode_line
from capture.log.index import pack_offsets, pack_times
from capture.log.manifest import PartitionState
from capture.log.reader import committed_segments, partition_dir, read_partition
from capture.log.segment import (
    SegmentRef,
    index_path,
    iter_lines,
    load_time_index,
    log_path,
    parquet_path,
    timeindex_path,
)
from capture.log.types import CompactionStats, TopicConfig

__all__ = ["compact_partition", "expired_segments", "keep_record", "remove_segments"]

_SUFFIX = ".compacting"


def keep_record(
    offset: int,
    timestamp: int,
    key: bytes | None,
    is_tombstone: bool,
    latest: dict[bytes, int],
    now_ms: int,
    delete_retention_ms: int,
) -> bool:
    """The compaction rule (pure): keep a key's latest record; drop a latest tombstone once it is
    `delete_retention_ms` old; records without a key are always kept."""
    if key is None:
        return True
    if latest.get(key) != offset:
        return False
    return not (is_tombstone and now_ms - timestamp >= delete_retention_ms)


def compact_partition(
    root: Path,
    topic: str,
    partition: int,
    state: PartitionState,
    cfg: TopicConfig,
    now_ms: int,
    interval: int,
    stats: CompactionStats,
) -> None:
    pdir = partition_dir(root, topic, partition)
    sealed = [b for b in committed_segments(pdir, state) if b < state.segment]
    if not sealed:
        return
    latest: dict[bytes, int] = {}
    for rec in read_partition(root, topic, partition, state, 0, state.end):
        if rec.key is not None:
            latest[rec.key] = rec.offset
    for base in sealed:
        ref = SegmentRef(topic, partition, pdir, base)
        kept: list[tuple[int, int, bytes]] = []
        before = size = 0
        for pos, line in iter_lines(log_path(pdir, base)):
            try:
                off, ts, key, value, _h = decode_line(line)
            except BadLine as exc:
                raise ref.corrupt(
                    f"{exc} (at byte {pos}); compaction stopped", exc.offset
                ) from None
            before += 1
            size += len(line) + 1
            if keep_record(off, ts, key, value is None, latest, now_ms, cfg.delete_retention_ms):
                kept.append((off, ts, line))
        stats.records_before += before
        stats.bytes_before += size
        if len(kept) == before:
            stats.records_after += before
            stats.bytes_after += size
            continue
        if not kept:
            remove_segments(pdir, [base])
            stats.segments_deleted += 1
            continue
        data = _rewrite(ref, kept, interval)
        stats.segments_rewritten += 1
        stats.records_after += len(kept)
        stats.bytes_after += data


def _rewrite(ref: SegmentRef, kept: list[tuple[int, int, bytes]], interval: int) -> int:
    """Write the kept lines and their indexes beside the segment, fsync, rename over it."""
    pdir, base = ref.pdir, ref.base
    index: list[tuple[int, int]] = []
    times: list[tuple[int, int]] = []
    pos = since = 0
    max_ts = -(1 << 62)
    for off, ts, line in kept:
        if pos and since >= interval:
            index.append((off - base, pos))
            times.append((max_ts, off - base))
            since = 0
        max_ts = max(max_ts, ts)
        pos += len(line) + 1
        since += len(line) + 1
    times.append((max_ts, kept[-1][0] + 1 - base))
    body = b"\n".join(line for _o, _t, line in kept) + b"\n"
    targets = [
        (index_path(pdir, base), pack_offsets(index)),
        (timeindex_path(pdir, base), pack_times(times)),
        (log_path(pdir, base), body),  # renamed last: the indexes are checked against it on use
    ]
    for final, data in targets:
        tmp = final.with_name(final.name + _SUFFIX)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            _fileio.write_all(fd, data, f"writing {tmp}")
            _fileio.fsync(fd, f"syncing {tmp}")
        finally:
            os.close(fd)
    parquet_path(pdir, base).unlink(missing_ok=True)  # made from the old bytes: now stale
    for final, _data in targets:
        os.replace(final.with_name(final.name + _SUFFIX), final)
    _fileio.fsync_dir(pdir)
    return len(body)


def expired_segments(
    root: Path, topic: str, partition: int, state: PartitionState, cfg: TopicConfig, now_ms: int
) -> tuple[list[int], int]:
    """Oldest sealed segments past retention_ms or beyond retention_bytes, and the new start."""
    pdir = partition_dir(root, topic, partition)
    bases = committed_segments(pdir, state)
    sizes = {
        b: (state.nbytes if b == state.segment else log_path(pdir, b).stat().st_size) for b in bases
    }
    total = sum(sizes.values())
    doomed: list[int] = []
    for b in bases:
        if b >= state.segment:
            break
        times = load_time_index(pdir, b)
        max_ts = times[-1][0] if times else None
        by_time = cfg.retention_ms is not None and (
            max_ts is None or now_ms - max_ts > cfg.retention_ms
        )
        by_size = cfg.retention_bytes is not None and total - sizes[b] >= cfg.retention_bytes
        if not (by_time or by_size):
            break
        doomed.append(b)
        total -= sizes[b]
    new_start = bases[len(doomed)] if doomed else state.start
    return doomed, new_start


def remove_segments(pdir: Path, bases: list[int]) -> None:
    for b in bases:
        for p in (log_path(pdir, b), index_path(pdir, b), timeindex_path(pdir, b)):
            p.unlink(missing_ok=True)
        parquet_path(pdir, b).unlink(missing_ok=True)
    _fileio.fsync_dir(pdir)
