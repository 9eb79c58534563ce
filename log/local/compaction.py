"""Compaction (latest record per key) and retention (whole old segments) of sealed segments.

Both touch only segments that are sealed *and* committed (below the manifest's segment), so the
writer's active segment and anything uncommitted are never rewritten. Each rewrite is atomic per
segment: new files are written and fsynced beside the old ones, then renamed over them.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from tributary.log.local import _fileio
from tributary.log.local.codec import BadLine, Decoded, decode_line, encode_batch
from tributary.log.local.index import pack_offsets, pack_times
from tributary.log.local.manifest import PartitionState
from tributary.log.local.placeholders import Carry, CarryForward, fill
from tributary.log.local.reader import committed_segments, open_segment, partition_dir, read_partition
from tributary.log.local.segment import (
    SegmentRef,
    index_path,
    iter_lines,
    load_time_index,
    log_path,
    parquet_path,
    timeindex_path,
)
from tributary.log.local.types import CompactionStats, TopicConfig

__all__ = ["compact_partition", "expired_segments", "keep_record", "keep_untombstoned", "remove_segments"]

_SUFFIX = ".compacting"


def keep_record(
    offset: int,
    timestamp: int,
    key: bytes | None,
    is_tombstone: bool,
    latest: dict[bytes, int],
    now_ms: int,
    delete_retention_ms: int,
    covered_since: int | None = -(1 << 62),
) -> bool:
    """The compaction rule (pure): keep a key's latest record (a key absent from `latest` has no
    newer record); drop a latest tombstone once it is `delete_retention_ms` old *and* has stood
    alone — every older record of its key gone — for that long (`covered_since`: when a pass
    first left it so; None = not yet). Records without a key are always kept."""
    if key is None:
        return True
    if latest.get(key, offset) != offset:
        return False
    if not is_tombstone:
        return True
    if covered_since is None:
        return True
    return now_ms - timestamp < delete_retention_ms or now_ms - covered_since < delete_retention_ms


def keep_untombstoned(
    offset: int,
    timestamp: int,
    key: bytes | None,
    is_tombstone: bool,
    tombstones: dict[bytes, int],
    now_ms: int,
    delete_retention_ms: int,
    covered_since: int | None = -(1 << 62),
) -> bool:
    """The `tombstones` policy's rule (pure): keep every record except a key's records before its
    last tombstone (`tombstones`: key → that offset, from the records a pass reads); a tombstone
    itself goes as a latest one does under `compact` (`keep_record`: once old and alone for the
    retention). Records after it (the key used again) are kept."""
    if key is None:
        return True
    last = tombstones.get(key)
    if last is not None and offset < last:
        return False
    if not is_tombstone:
        return True
    return keep_record(offset, timestamp, key, True, {key: offset}, now_ms, delete_retention_ms, covered_since)


def compact_partition(
    root: Path,
    topic: str,
    partition: int,
    state: PartitionState,
    cfg: TopicConfig,
    now_ms: int,
    interval: int,
    stats: CompactionStats,
    *,
    clean_end: int = 0,
    delete_retention_ms: int | None = None,
    covered_since: Callable[[int], int | None] | None = None,
    superseded: list[Path] | None = None,
) -> int | None:
    """Compact the partition's sealed, committed segments; returns when the earliest tombstone it
    kept may be dropped (None: none kept).

    `clean_end`: everything below it was compacted by an earlier pass, so the latest-offset map is
    built from the records at or after it only (as Kafka's cleaner does with its dirty section).
    `covered_since(offset)`: when a pass first covered that offset (None: never) — a tombstone is
    dropped only once it has stood alone for the retention, so a reader that saw an older value
    and reaches the tombstone within `delete_retention_ms` always sees it. Parquet copies of the
    segments rewritten or removed are left in place (a stale copy still holds valid records of
    the old version, which a running reader may be using) and appended to `superseded`.

    A kept record whose `after` holds unchanged-TOAST placeholders gets the values that the
    records dropped before it held (`placeholders.CarryForward`): its value is rewritten, its
    offset stays, and a placeholder never outlives the value it stands for."""
    retention = cfg.delete_retention_ms if delete_retention_ms is None else delete_retention_ms
    since = covered_since or (lambda _offset: -(1 << 62))
    pdir = partition_dir(root, topic, partition)
    sealed = [b for b in committed_segments(pdir, state) if b < state.segment]
    if not sealed:
        return None
    latest: dict[bytes, int] = {}
    carrying = CarryForward(clean_end=clean_end, sealed_end=state.segment)
    untombstoned = cfg.policy == "tombstones"  # latest: each key's last tombstone; no placeholders
    for rec in read_partition(root, topic, partition, state, clean_end, state.end):
        if rec.key is None:
            continue
        if untombstoned:
            if rec.value is None:
                latest[rec.key] = rec.offset
            continue
        carrying.latest(rec.key, rec.offset, rec.value, latest.get(rec.key))
        latest[rec.key] = rec.offset
    keep_rule = keep_untombstoned if untombstoned else keep_record
    due: int | None = None
    for base in sealed:
        ref = SegmentRef(topic, partition, pdir, base)
        kept: list[tuple[int, int, bytes]] = []
        first_filled: tuple[int, Decoded, Carry] | None = None  # padded if the size comes out the same
        before = size = 0
        f = open_segment(log_path(pdir, base))
        if f is None:
            continue
        with f:  # streamed: a 128 MiB segment is never held whole, only what it keeps
            for pos, line in iter_lines(log_path(pdir, base), file=f):
                try:
                    record = off, ts, key, value, _h = decode_line(line)
                except BadLine as exc:
                    raise ref.corrupt(f"{exc} (at byte {pos}); compaction stopped", exc.offset) from None
                before += 1
                size += len(line) + 1
                covered = since(off)
                keep = keep_rule(off, ts, key, value is None, latest, now_ms, retention, covered)
                if key is not None and key in carrying.wanted:  # its latest record holds placeholders
                    keep, carry = carrying.decide(off, key, value, keep, latest[key])
                    if keep and carry and (filled := _filled_line(record, carry)) is not None:
                        line = filled
                        first_filled = first_filled or (len(kept), record, carry)
                if not keep:
                    continue
                kept.append((off, ts, line))
                if value is None and key is not None:
                    ready = max(ts, now_ms if covered is None else covered) + retention
                    due = ready if due is None else min(due, ready)
        stats.records_before += before
        stats.bytes_before += size
        if len(kept) == before and first_filled is None:
            stats.records_after += before
            stats.bytes_after += size
            continue
        if superseded is not None and parquet_path(pdir, base).exists():
            superseded.append(parquet_path(pdir, base))
        if not kept:
            remove_segments(pdir, [base], parquet=superseded is None)
            stats.segments_deleted += 1
            continue
        if first_filled is not None and sum(len(line) + 1 for _o, _t, line in kept) == size:
            # never the old size: a Parquet copy made from the old bytes must look stale
            i, record, carry = first_filled
            kept[i] = (kept[i][0], kept[i][1], _filled_line(record, carry, pad=True) or kept[i][2])
        data = _rewrite(ref, kept, interval, parquet=superseded is None)
        stats.segments_rewritten += 1
        stats.records_after += len(kept)
        stats.bytes_after += data
    return due


def _filled_line(record: Decoded, carry: Carry, *, pad: bool = False) -> bytes | None:
    """The record's line (no newline) with its placeholders filled from `carry`; None if none was."""
    off, ts, key, value, headers = record
    if value is None:
        return None
    filled = fill(value, carry, pad=pad)
    if filled is value:
        return None
    data, _sizes, _ts = encode_batch(off, [(key, filled, ts, headers)])
    return data[:-1]


def _rewrite(ref: SegmentRef, kept: list[tuple[int, int, bytes]], interval: int, *, parquet: bool = True) -> int:
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
    if parquet:
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
    sizes = {b: (state.nbytes if b == state.segment else log_path(pdir, b).stat().st_size) for b in bases}
    total = sum(sizes.values())
    doomed: list[int] = []
    for b in bases:
        if b >= state.segment:
            break
        times = load_time_index(pdir, b)
        max_ts = times[-1][0] if times else None
        by_time = cfg.retention_ms is not None and (max_ts is None or now_ms - max_ts > cfg.retention_ms)
        by_size = cfg.retention_bytes is not None and total - sizes[b] >= cfg.retention_bytes
        if not (by_time or by_size):
            break
        doomed.append(b)
        total -= sizes[b]
    new_start = bases[len(doomed)] if doomed else state.start
    return doomed, new_start


def remove_segments(pdir: Path, bases: list[int], *, parquet: bool = True) -> None:
    """Unlink whole segments (and, with `parquet`, their copies; else the caller defers that)."""
    for b in bases:
        for p in (log_path(pdir, b), index_path(pdir, b), timeindex_path(pdir, b)):
            p.unlink(missing_ok=True)
        if parquet:
            parquet_path(pdir, b).unlink(missing_ok=True)
    _fileio.fsync_dir(pdir)
