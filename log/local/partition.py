"""One partition's writer: the active segment, buffering, index upkeep, rolling, recovery.

Only the writer process uses this. Appends go to an in-memory buffer that is written with one
`write` per flush; the committed state (what readers see) only moves in `Log.commit`.
"""

from __future__ import annotations

import bisect
import os
from collections.abc import Callable, Sequence
from itertools import accumulate
from pathlib import Path

from tributary.log.local import _fileio
from tributary.log.local.codec import BadLine, RecordIn, decode_line, encode_batch
from tributary.log.local.errors import LogError
from tributary.log.local.index import pack_offsets, pack_times
from tributary.log.local.manifest import PartitionState
from tributary.log.local.scan import NO_TS, first_timestamp, increasing, rebuild_indexes, scan_segment
from tributary.log.local.segment import (
    SegmentRef,
    index_path,
    iter_lines,
    list_segments,
    load_offset_index,
    load_time_index,
    log_path,
    parquet_path,
    seek_position,
    timeindex_path,
)
from tributary.log.local.types import PartitionEnd

__all__ = ["PartitionWriter"]

FLUSH_BYTES = 1 << 20
_NO_TS = NO_TS


class PartitionWriter:
    """Appends to a partition's active segment; rolls by size or by record-time age."""

    def __init__(self, ref: SegmentRef, *, segment_bytes: int, segment_ms: int, index_interval: int) -> None:
        self.ref = ref
        self.pdir = ref.pdir
        self.segment_bytes = segment_bytes
        self.segment_ms = segment_ms
        self.index_interval = index_interval
        self.base = 0
        self.next_offset = 0
        self.size = 0  # bytes of the active segment including the unflushed buffer
        self.first_ts = _NO_TS
        self.max_ts = _NO_TS
        self.since_index = 0
        self.index: list[tuple[int, int]] = []
        self.times: list[tuple[int, int]] = []
        self.index_written = 0
        self.buf: list[bytes] = []
        self.buflen = 0
        self.fd = -1
        self.dirty = False  # written since the last sync
        self.dir_dirty = False  # a segment file was created since the last sync

    # -- lifecycle -------------------------------------------------------------------------

    @classmethod
    def recover(
        cls,
        ref: SegmentRef,
        state: PartitionState,
        *,
        segment_bytes: int,
        segment_ms: int,
        index_interval: int,
        repair: list[str] | None = None,
    ) -> PartitionWriter:
        """Open for writing at the manifest's committed end, cutting away anything after it.

        With `repair` (a list that collects what was done), a partition whose committed tail is
        damaged or missing is cut back to its last intact record instead of refusing to open;
        appends then continue at the old committed end (the lost offsets stay a gap, never reused).
        """
        w = cls(ref, segment_bytes=segment_bytes, segment_ms=segment_ms, index_interval=index_interval)
        pdir = ref.pdir
        if not pdir.is_dir() and repair is not None and state.end > state.start:
            repair.append(f"directory {pdir} was missing: offsets {state.start}..{state.end - 1} lost")
            state = PartitionState(state.end, state.end, state.end, 0)
        if not pdir.is_dir():
            if state.end > state.start:
                raise LogError(
                    f"partition directory {pdir} is missing but the manifest says it holds "
                    f"offsets {state.start}..{state.end - 1}"
                )
            pdir.mkdir(parents=True)
            w.dir_dirty = True
        for name in os.listdir(pdir):
            if name.endswith((".compacting", ".parquet.tmp")):
                os.unlink(pdir / name)
        bases = list_segments(pdir)
        for i, base in enumerate(bases):
            beyond = base > state.segment
            below = i + 1 < len(bases) and bases[i + 1] <= state.start and base < state.segment
            if beyond or below:  # rolled after the last commit, or deleted by retention already
                for p in (log_path(pdir, base), index_path(pdir, base), timeindex_path(pdir, base)):
                    p.unlink(missing_ok=True)
                parquet_path(pdir, base).unlink(missing_ok=True)
                w.dir_dirty = True
        for base in list_segments(pdir):
            if base < state.segment and not index_path(pdir, base).exists():
                rebuild_indexes(SegmentRef(ref.topic, ref.partition, pdir, base), index_interval)
        try:
            w._open_active(state)
        except LogError as exc:
            if repair is None:
                raise
            w.close()
            w._repair_active(state, exc, repair)
        return w

    def _repair_active(self, state: PartitionState, why: LogError, notes: list[str]) -> None:
        """Cut the active segment after its last intact record, then continue at state.end."""
        path = log_path(self.pdir, state.segment)
        ref = SegmentRef(self.ref.topic, self.ref.partition, self.pdir, state.segment)
        good_pos, last = 0, state.segment - 1
        if path.exists():
            limit = min(path.stat().st_size, state.nbytes)
            for pos, line in iter_lines(path, 0, limit):
                try:
                    off = decode_line(line)[0]
                except BadLine:
                    break
                if off <= last or pos + len(line) + 1 > limit:
                    break
                good_pos, last = pos + len(line) + 1, off
        for p in (index_path(self.pdir, state.segment), timeindex_path(self.pdir, state.segment)):
            p.unlink(missing_ok=True)
        with open(path, "ab") as f:
            f.truncate(good_pos)
            _fileio.fsync(f.fileno(), f"repairing {path}")
        self._open_active(PartitionState(state.start, last + 1, state.segment, good_pos))
        lost = f"offsets {last + 1}..{state.end - 1} lost" if last + 1 < state.end else "no offset lost"
        notes.append(f"{ref.topic}/{ref.partition} {ref.name}: {why}; cut at byte {good_pos}, {lost}")
        if self.next_offset < state.end:
            self.next_offset = state.end  # the next segment starts at the old end: no reuse
            self.roll()

    def _open_active(self, state: PartitionState) -> None:
        base, committed = state.segment, state.nbytes
        path = log_path(self.pdir, base)
        self.base = base
        self.ref = SegmentRef(self.ref.topic, self.ref.partition, self.pdir, base)
        if not path.exists():
            if committed:
                raise LogError(f"segment {path} is missing but the manifest says it holds {committed} committed bytes")
            self.dir_dirty = True
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        size = os.fstat(fd).st_size
        if size < committed:
            os.close(fd)
            raise LogError(
                f"the manifest points past the data: {path} has {size} bytes but {committed} are "
                f"committed (truncated or replaced segment); run `tributary log verify`"
            )
        if size > committed:
            os.ftruncate(fd, committed)
            _fileio.fsync(fd, f"truncating {path} to its committed length")
        self.fd = fd
        os.lseek(fd, 0, os.SEEK_END)
        self.size = committed
        self.next_offset = state.end
        self._load_active_indexes(committed, state.end)
        if self.next_offset < base:
            self.next_offset = base

    def _load_active_indexes(self, committed: int, end: int) -> None:
        """Keep the index entries inside committed data (checked against it) and re-derive the
        rest — tail entries, max timestamp — by scanning from the last good entry."""
        pos = seek_position(self.pdir, self.base, end, committed) if committed else 0
        index = increasing([e for e in load_offset_index(self.pdir, self.base) if 0 < e[1] <= pos])
        rels = {rel for rel, _ in index}
        times = [t for t in load_time_index(self.pdir, self.base) if t[1] in rels]
        if [t[1] for t in times] != [rel for rel, _ in index]:  # files disagree: rebuild both
            pos, index, times = 0, [], []
        start_max = times[-1][0] if times else _NO_TS
        scan = scan_segment(self.ref, self.index_interval, pos, committed, start_max)
        if committed and scan.last + 1 != end:
            raise LogError(
                f"the manifest says {self.ref.topic}/{self.ref.partition} ends at offset {end} "
                f"but its data ends at {scan.last + 1}; run `tributary log verify`"
            )
        index += scan.index
        times += scan.times
        self.index, self.times = index, times
        self.index_written = len(index)
        self.max_ts = scan.max_ts
        self.first_ts = scan.first_ts if pos == 0 else first_timestamp(self.ref)
        self.since_index = scan.since
        for p, data in (
            (index_path(self.pdir, self.base), pack_offsets(index)),
            (timeindex_path(self.pdir, self.base), pack_times(times)),
        ):
            with open(p, "wb") as f:
                f.write(data)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        self.buf, self.buflen = [], 0

    # -- appending -------------------------------------------------------------------------

    def end(self) -> PartitionEnd:
        return PartitionEnd(self.next_offset, self.base, self.size)

    def append(self, records: Sequence[RecordIn]) -> int:
        """Encode and buffer records; returns the first one's offset."""
        first = self.next_offset
        if not records:
            return first
        data, sizes, tss = encode_batch(first, records)
        self._buffer(data, sizes, tss)
        return first

    def append_encoded(self, encode: Callable[[int], tuple[bytes, list[int]]], timestamp_ms: int) -> int:
        """Buffer lines another encoder made (the columnar snapshot: codec_arrow), all with one
        timestamp; `encode(first_offset)` returns the lines and their sizes. The segment, index
        and durability rules are `append`'s."""
        first = self.next_offset
        data, sizes = encode(first)
        if sizes:
            self._buffer(data, sizes, (timestamp_ms,) * len(sizes))
        return first

    def _buffer(self, data: bytes, sizes: list[int], tss: Sequence[int]) -> None:
        if not self._place_fast(len(data), sizes, tss):
            self._place_split(data, tss, sizes)
        else:
            self.buf.append(data)
            self.buflen += len(data)
        self.dirty = True
        if self.buflen >= FLUSH_BYTES:
            self.flush()

    def _place_fast(self, total: int, sizes: list[int], tss: Sequence[int]) -> bool:
        """The whole batch fits the active segment: index it by bisection instead of a loop."""
        size = self.size
        first_ts = self.first_ts if size else tss[0]
        batch_max = max(tss)
        n = len(sizes)
        too_big = size + total > self.segment_bytes and (size or n > 1)
        if too_big or batch_max - first_ts >= self.segment_ms:
            return False
        starts = list(accumulate(sizes, initial=size))
        interval, base, off0 = self.index_interval, self.base, self.next_offset
        last_entry = size - self.since_index
        max_ts = self.max_ts
        done = 0
        uniform = tss.count(batch_max) == n  # one timestamp (a snapshot chunk): no slicing per entry
        j = bisect.bisect_left(starts, last_entry + interval, 0, n)
        while j < n:
            if starts[j] == 0:
                j += 1
                continue
            if j > done:
                max_ts = max(max_ts, batch_max if uniform else max(tss[done:j]))
                done = j
            self.index.append((off0 + j - base, starts[j]))
            self.times.append((max_ts, off0 + j - base))
            last_entry = starts[j]
            j = bisect.bisect_left(starts, last_entry + interval, j + 1, n)
        self.max_ts = max(max_ts, batch_max)
        self.first_ts = first_ts
        self.size = starts[n]
        self.since_index = starts[n] - last_entry
        self.next_offset = off0 + n
        return True

    def _place_split(self, data: bytes, tss: Sequence[int], sizes: list[int]) -> None:
        """Slow path: place record by record, rolling segments where needed."""
        i, n, cut = 0, len(tss), 0
        while i < n:
            j = self._place(tss, sizes, i)
            if j == i:
                self.roll()
                continue
            piece = sum(sizes[i:j])
            self.buf.append(data[cut : cut + piece])
            self.buflen += piece
            cut += piece
            i = j

    def _place(self, tss: Sequence[int], sizes: list[int], i: int) -> int:
        """Account records i.. into the active segment until one does not fit; returns the stop."""
        pos, since, off = self.size, self.since_index, self.next_offset
        base, limit, age, interval = (
            self.base,
            self.segment_bytes,
            self.segment_ms,
            self.index_interval,
        )
        first_ts, max_ts = self.first_ts, self.max_ts
        index, times = self.index, self.times
        n = len(tss)
        j = i
        while j < n:
            ts = tss[j]
            sz = sizes[j]
            if pos:
                if pos + sz > limit or ts - first_ts >= age:
                    break
                if since >= interval:
                    index.append((off - base, pos))
                    times.append((max_ts, off - base))
                    since = 0
            else:
                first_ts = ts
            if ts > max_ts:
                max_ts = ts
            pos += sz
            since += sz
            off += 1
            j += 1
        self.size, self.since_index, self.next_offset = pos, since, off
        self.first_ts, self.max_ts = first_ts, max_ts
        return j

    def flush(self) -> None:
        """Write the buffer (one write) and any new index entries."""
        if self.buflen:
            data = self.buf[0] if len(self.buf) == 1 else b"".join(self.buf)
            self.buf, self.buflen = [], 0
            _fileio.write_all(self.fd, data, f"appending to {log_path(self.pdir, self.base)}")
        if self.index_written < len(self.index):
            new = self.index[self.index_written :]
            newt = self.times[self.index_written :]
            self._append_file(index_path(self.pdir, self.base), pack_offsets(new))
            self._append_file(timeindex_path(self.pdir, self.base), pack_times(newt))
            self.index_written = len(self.index)

    @staticmethod
    def _append_file(path: Path, data: bytes) -> None:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            _fileio.write_all(fd, data, f"writing {path}")
        finally:
            os.close(fd)

    def roll(self) -> None:
        """Seal the active segment (final time entry, everything fsynced) and start a new one."""
        self.flush()
        if self.max_ts != _NO_TS:
            self._append_file(
                timeindex_path(self.pdir, self.base),
                pack_times([(self.max_ts, self.next_offset - self.base)]),
            )
        for p in (index_path(self.pdir, self.base), timeindex_path(self.pdir, self.base)):
            fd = os.open(p, os.O_RDONLY)
            try:
                _fileio.fsync(fd, f"sealing {p}")
            finally:
                os.close(fd)
        _fileio.fsync(self.fd, f"sealing {log_path(self.pdir, self.base)}")
        os.close(self.fd)
        self.base = self.next_offset
        self.ref = SegmentRef(self.ref.topic, self.ref.partition, self.pdir, self.base)
        for p in (index_path(self.pdir, self.base), timeindex_path(self.pdir, self.base)):
            open(p, "wb").close()
        self.fd = os.open(log_path(self.pdir, self.base), os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        self.size, self.since_index, self.index_written = 0, 0, 0
        self.first_ts, self.max_ts = _NO_TS, _NO_TS
        self.index, self.times = [], []
        self.dir_dirty = True
        self.dirty = True

    def sync_handle(self) -> int:
        """A dup of the active fd for a commit to fsync (the writer may roll meanwhile)."""
        return os.dup(self.fd)
