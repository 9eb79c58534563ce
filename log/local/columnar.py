"""The log's Parquet (zstd) copies of its segments — the form Spark reads natively — and the
record's Arrow schema (`RECORD_SCHEMA`, defined here once).

A copy is `<base>.parquet` beside `<base>.log`: the same records, same offsets, key/value/headers
as JSON text. It records the byte size of the segment it was made from, so a copy made before a
compaction rewrote the segment is recognisably stale (and is deleted by the compaction anyway).
The row-form `.log` stays the source of truth. Two formats:

1. written by `write_parquet` (pyarrow, `Log.write_parquet`): the columns of `SCHEMA`; the size in
   the footer's key-value metadata.
2. made by `make_copies` (`Log.make_copies`): the log plans the copy (`SegmentCopy`: which bytes,
   which file), reads the records (`copy_records`, the columns of `COPY_SCHEMA`: format 1's plus
   `topic`, `partition` and `segment_bytes`), and installs the finished file atomically; the
   Parquet writer is the caller's (the projection runner's Spark tasks, which add the default
   `event_time` and `value_v`, the value as a shredded Parquet VARIANT, so a field read is a
   column read). The size is the constant column `segment_bytes` (Spark's writer has no custom
   footer keys), checked through the row groups' statistics.

An active segment's committed prefix may have a format-2 *tail copy* (`TailCopy`, below).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import uuid
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from tributary.log.local import _fileio
from tributary.log.local.reader import open_segment
from tributary.log.local.segment import SegmentRef, claims_below, iter_records, log_path, parquet_path, starts_at
from tributary.log.local.types import Split, segment_base

__all__ = [
    "COPY_SCHEMA",
    "RECORD_SCHEMA",
    "SCHEMA",
    "STALE_COPY_DIR_S",
    "SegmentCopy",
    "TailCopy",
    "copy_format",
    "copy_records",
    "decode_lines",
    "decode_split",
    "is_current",
    "make_copies",
    "parquet_path",
    "read_split_columns",
    "sweep_stale_copy_dirs",
    "sweep_tail_copies",
    "tail_copies",
    "tail_copy_valid",
    "text_spans",
    "write_parquet",
]

# A `Record` as Arrow columns: key, value and headers as JSON text (null: JSON null).
RECORD_SCHEMA = pa.schema(
    [
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("timestamp", pa.int64()),
        ("key", pa.string()),
        ("value", pa.string()),
        ("headers", pa.string()),
    ]
)
# One partition's records (topic and partition are the file's): format 1, `decode_lines`.
SCHEMA = pa.schema([RECORD_SCHEMA.field(n) for n in RECORD_SCHEMA.names[2:]])
# What a format-2 copy is made of (`copy_records`): the records and the segment's byte size.
COPY_SCHEMA = RECORD_SCHEMA.append(pa.field("segment_bytes", pa.int64()))
STALE_COPY_DIR_S = 86400.0  # a copy job's staging directory this old was left by a killed job
_BATCH = 8192
_T = TypeVar("_T")
_SIZE = b"tributary.segment_bytes"


def copy_format(pdir: Path, base: int) -> int | None:
    """The format (1 or 2, above) of the segment's Parquet copy, or None when there is no copy
    or it was made from other bytes than the segment's as they are now."""
    try:
        meta = pq.read_metadata(parquet_path(pdir, base))
        size = log_path(pdir, base).stat().st_size
    except (FileNotFoundError, pa.ArrowInvalid):
        return None
    footer = meta.metadata or {}
    if _SIZE in footer:
        return 1 if footer[_SIZE] == str(size).encode() else None
    return 2 if _constant(meta, "segment_bytes", size) else None


def is_current(pdir: Path, base: int) -> bool:
    """A Parquet copy exists (either format) and was made from the segment as it is now."""
    return copy_format(pdir, base) is not None


def write_parquet(ref: SegmentRef) -> int:
    """Write (atomically: temp file, fsync, rename) the format-1 copy of a sealed segment; returns
    its row count. The caller fsyncs the directory."""
    size = log_path(ref.pdir, ref.base).stat().st_size
    table = _records_table(ref)
    schema = SCHEMA.with_metadata(
        {
            b"tributary.topic": ref.topic.encode(),
            b"tributary.partition": str(ref.partition).encode(),
            b"tributary.segment": ref.name.encode(),
            _SIZE: str(size).encode(),
        }
    )
    final = parquet_path(ref.pdir, ref.base)
    tmp = final.with_name(final.name + ".tmp")
    pq.write_table(table.replace_schema_metadata(schema.metadata), tmp, compression="zstd")
    _sync_file(tmp)
    os.replace(tmp, final)
    return int(table.num_rows)


def _records_table(ref: SegmentRef, limit: int | None = None) -> pa.Table:
    """The segment's records (its first `limit` bytes) as SCHEMA columns, record by record:
    `iter_records` checks each one and names a bad one in the CorruptRecordError it raises."""
    cols: tuple[list[int], list[int], list[str | None], list[str | None], list[str | None]] = ([], [], [], [], [])
    offs, tss, keys, values, headers = cols
    for off, ts, key, value, hdr in iter_records(ref, 0, limit):
        offs.append(off)
        tss.append(ts)
        keys.append(None if key is None else key.decode())
        values.append(None if value is None else value.decode())
        headers.append(None if hdr is None else hdr.decode())
    return pa.Table.from_arrays([pa.array(c, type=f.type) for c, f in zip(cols, SCHEMA, strict=True)], schema=SCHEMA)


def _sync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        _fileio.fsync(fd, f"syncing {path}")
    finally:
        os.close(fd)


# A line's head up to its key (codec.py's format); the lengths locate key, value and headers.
_HEAD = (
    r'^(?P<head>\{"offset":(?P<offset>\d+),"timestamp":(?P<timestamp>-?\d+),'
    r'"lens":\[(?P<kl>\d+),(?P<vl>\d+),(?P<hl>\d+)\],"key":)'
)
_HEAD_INTS = ("offset", "timestamp", "kl", "vl", "hl")
_NEWLINE = ord("\n")


def _is(buf: np.ndarray, at: np.ndarray, text: bytes) -> np.ndarray:
    """Per position: buf[at : at + len(text)] == text (positions are within buf)."""
    same: np.ndarray = (buf[at[:, None] + np.arange(len(text))] == np.frombuffer(text, np.uint8)).all(axis=1)
    return same


def text_spans(data: bytes, buf: np.ndarray, start: np.ndarray, stop: np.ndarray) -> pa.Array:
    """The byte ranges [start, stop) of data as one string column (JSON `null` → null), built as
    Arrow binary views into `data` (no Python object per value), then cast (which checks UTF-8)."""
    n = len(start)
    lengths = stop - start
    head = buf[np.minimum(start[:, None] + np.arange(12), len(buf) - 1)]  # a view inlines up to 12 bytes
    views = np.zeros((n, 16), np.uint8)
    views[:, 4:] = np.where(np.arange(12) < lengths[:, None], head, 0)
    words = views.view("<i4")  # length, then 12 inline bytes, or a 4-byte prefix, buffer 0, offset
    words[:, 0] = lengths
    long = lengths > 12
    words[long, 2] = 0
    words[long, 3] = start[long]
    null = (lengths == 4) & (head[:, :4] == np.frombuffer(b"null", np.uint8)).all(axis=1)
    valid = pa.array(~null, pa.bool_()).buffers()[1] if null.any() else None
    parts = pa.Array.from_buffers(
        pa.binary_view(), n, [valid, pa.py_buffer(views), pa.py_buffer(data)], int(null.sum())
    )
    return parts.cast(pa.string())


def decode_lines(data: bytes) -> pa.Table | None:
    """(offset, timestamp, key, value, headers) of whole segment lines — `codec.decode_line`
    over a buffer, with the per-line work done by pyarrow and numpy (one regex, vectorised
    slicing and structure checks, a CRC call per line) instead of Python per field. Returns
    None when any line is not an intact record, or offsets do not ascend: the caller then reads
    the row path (`read_split`), which says what is wrong."""
    buf = np.frombuffer(data, np.uint8)
    if not len(buf) or buf[-1] != _NEWLINE or len(buf) >= 1 << 31:  # views address 31 bits
        return None
    ends = np.flatnonzero(buf == _NEWLINE)  # each line's newline
    starts = np.concatenate(([0], ends[:-1] + 1))
    n = len(ends)
    lines = pa.Array.from_buffers(
        pa.large_binary(), n, [None, pa.py_buffer(np.concatenate(([0], ends + 1))), pa.py_buffer(data)]
    )
    heads = pc.extract_regex(lines, _HEAD)
    if heads.null_count:
        return None
    try:
        ints = {f: pc.cast(heads.field(f).cast(pa.large_string()), pa.int64()).to_numpy() for f in _HEAD_INTS}
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None
    off = ints["offset"]
    if n > 1 and not (np.diff(off) > 0).all():
        return None
    ks = starts + pc.binary_length(heads.field("head")).to_numpy()
    ke = ks + ints["kl"]
    vs = ke + 9
    ve = vs + ints["vl"]
    hs = ve + 11
    he = hs + ints["hl"]
    if not ((ke >= ks) & (ve >= vs) & (he >= hs) & (he + 8 < ends)).all():
        return None  # lengths running past the line (or negative): not an intact record
    if not (
        _is(buf, ke, b',"value":').all()
        and _is(buf, ve, b',"headers":').all()
        and _is(buf, he, b',"crc":').all()
        and (buf[ends - 1] == ord("}")).all()
    ):
        return None
    try:
        stored = pc.cast(text_spans(data, buf, he + 7, ends - 1), pa.int64()).to_numpy(zero_copy_only=False)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None
    view = memoryview(data)
    crcs = np.fromiter(map(zlib.crc32, map(view.__getitem__, map(slice, starts.tolist(), he.tolist()))), np.int64, n)
    if not (crcs == stored).all():
        return None
    try:
        texts = [text_spans(data, buf, ks, ke), text_spans(data, buf, vs, ve), text_spans(data, buf, hs, he)]
    except pa.ArrowInvalid:
        return None  # not UTF-8
    return pa.Table.from_arrays([pa.array(off), pa.array(ints["timestamp"]), *texts], schema=SCHEMA)


def read_split_columns(split: Split, lo: int, hi: int) -> pa.Table | None:
    """The records of a row split with offsets in [lo, hi) as SCHEMA columns, decoded by
    `decode_lines` from the split's byte range; None when that fast path does not apply (the
    file is gone or changed since planning, or a line is not intact): read it with `read_split`."""
    found = decode_split(
        split, hi, decode_lines, lambda table: (table["offset"][0].as_py(), table["offset"][-1].as_py())
    )
    if found is None:
        return None
    table, hi = found
    off = table["offset"].to_numpy()
    a, b = np.searchsorted(off, max(lo, split.first_offset)), np.searchsorted(off, hi)
    return table.slice(a, b - a)


def decode_split(
    split: Split, hi: int, decode: Callable[[bytes], _T | None], first_last: Callable[[_T], tuple[int, int]]
) -> tuple[_T, int] | None:
    """`decode` over the split's byte range, checked to be what was planned (the first offset;
    and, when the lines end below `hi`, that no record grown by a compaction follows them), and
    `hi` bounded by the split; None when the file is gone or changed, or `decode` refuses."""
    f = open_segment(Path(split.path))
    if f is None:
        return None
    if split.end_offset is not None:
        hi = min(hi, split.end_offset)
    with f:
        size = split.end_byte - split.start_byte
        if size <= 0 or not starts_at(f, split.start_byte, split.first_offset):
            return None
        data = os.pread(f.fileno(), size, split.start_byte)
        if len(data) != size:
            return None
        decoded = decode(data)
        if decoded is None:
            return None
        first, last = first_last(decoded)
        if first != split.first_offset:
            return None
        if last + 1 < hi and claims_below(f, split.end_byte, hi):
            return None  # rewritten since planning with a record grown (compaction filled it)
    return decoded, hi


# -- tail copies: the committed prefix of a partition's active segment ---------------------------
#
# `<base>.tail-<end>-<nbytes>.pq`: a format-2 copy of the active segment's first `nbytes` bytes,
# the records with offsets [base, end), all committed when it was made. The active segment only
# grows (appends; a crash truncates uncommitted bytes only), so the copy stays true while the
# segment is active and its line at byte `nbytes` still claims offset `end`. A newer copy (larger
# `end`) supersedes it; once the segment is sealed its full copy does. The name does not end in
# `.parquet`: capture's cleaner, compaction and recovery leave these files alone — their lifecycle
# is `sweep_tail_copies`, called by the projection runner.

_TAIL = re.compile(r"^(\d{20})\.tail-(\d{20})-(\d{20})\.pq$")


@dataclass(frozen=True, slots=True)
class TailCopy:
    """A tail copy's name: segment base, end offset (exclusive) and the bytes it was made from."""

    base: int
    end: int
    nbytes: int

    def path(self, pdir: Path) -> Path:
        return pdir / f"{self.base:020d}.tail-{self.end:020d}-{self.nbytes:020d}.pq"


def tail_copies(pdir: Path) -> list[TailCopy]:
    """The tail copies in a partition directory (any segment), newest (largest end) first."""
    try:
        names = os.listdir(pdir)
    except FileNotFoundError:
        return []
    found = [TailCopy(*map(int, m.groups())) for m in map(_TAIL.match, names) if m is not None]
    return sorted(found, key=lambda c: (c.base, c.end), reverse=True)


def tail_copy_valid(pdir: Path, copy: TailCopy, committed: int, committed_bytes: int) -> bool:
    """The copy may stand for the records [copy.base, copy.end) of the active segment `copy.base`
    whose committed end is (`committed`, `committed_bytes`): it lies within the committed part,
    its footer says it holds exactly end - base rows made from `nbytes` bytes, and the segment's
    line at byte `nbytes` still claims offset `end` (or the copy ends where the commit does)."""
    if not (copy.base < copy.end <= committed and 0 < copy.nbytes <= committed_bytes):
        return False
    if (copy.end == committed) != (copy.nbytes == committed_bytes):
        return False
    try:
        meta = pq.read_metadata(copy.path(pdir))
    except (OSError, pa.ArrowInvalid):
        return False
    if meta.num_rows != copy.end - copy.base or not _constant(meta, "segment_bytes", copy.nbytes):
        return False
    if copy.nbytes == committed_bytes:
        return True
    f = open_segment(log_path(pdir, copy.base))
    if f is None:
        return False
    with f:
        return starts_at(f, copy.nbytes, copy.end)


def _constant(meta: pq.FileMetaData, name: str, value: int) -> bool:
    """Every row group's statistics say column `name` holds only `value`."""
    column = next((i for i in range(meta.num_columns) if meta.schema.column(i).path == name), None)
    if column is None or meta.num_row_groups == 0:
        return False
    for g in range(meta.num_row_groups):
        stats = meta.row_group(g).column(column).statistics
        if stats is None or not stats.has_min_max or not stats.min == stats.max == value:
            return False
    return True


def sweep_tail_copies(pdir: Path, active: int, now: float, grace_s: float) -> list[Path]:
    """Delete the partition's tail copies that nothing plans with any more, once `grace_s` has
    passed since they were superseded (a run that planned with one has had that long to read
    it): of the active segment, all but the newest, from the newest's making; of any other
    segment, all, from the making of its full copy — or at once if the segment is gone and the
    copy is older than `grace_s`. Returns the paths deleted."""
    removed: list[Path] = []
    newest: dict[int, float] = {}
    for copy in tail_copies(pdir):  # newest first per base
        path = copy.path(pdir)
        try:
            made = path.stat().st_mtime
        except FileNotFoundError:
            continue
        if copy.base == active:
            superseded = newest.get(copy.base)
            newest.setdefault(copy.base, made)
        elif log_path(pdir, copy.base).exists():
            try:
                superseded = parquet_path(pdir, copy.base).stat().st_mtime
            except FileNotFoundError:
                superseded = None  # sealed, no full copy yet: harmless until one is made
        else:
            superseded = made
        if superseded is not None and superseded < now - grace_s:
            path.unlink(missing_ok=True)
            removed.append(path)
    return removed


# -- format-2 copies: planned, read and installed by the log, written by the caller's engine -------


@dataclass(frozen=True, slots=True)
class SegmentCopy:
    """A format-2 copy of one segment's records: of the whole, sealed, segment (`tail` None), or
    of an active segment's committed prefix (`tail`, see `Log.tail_copy`). `segment` is the
    segment file as a `Split` names it (`Split.path`)."""

    topic: str
    partition: int
    segment: str
    tail: TailCopy | None = None

    @property
    def base(self) -> int:
        """The segment's base offset."""
        return segment_base(self.segment)

    @property
    def path(self) -> Path:
        """The copy's file (read it with any Parquet reader once `current()`)."""
        pdir = Path(self.segment).parent
        return parquet_path(pdir, self.base) if self.tail is None else self.tail.path(pdir)

    @property
    def nbytes(self) -> int | None:
        """The segment bytes the copy is made of (None: the whole, sealed, file)."""
        return None if self.tail is None else self.tail.nbytes

    def current(self) -> bool:
        """The copy exists, is complete, is format 2 and was made from the segment's bytes as
        they are now."""
        pdir = Path(self.segment).parent
        if self.tail is None:
            return copy_format(pdir, self.base) == 2
        return tail_copy_valid(pdir, self.tail, self.tail.end, self.tail.nbytes)


def copy_records(copy: SegmentCopy) -> pa.Table | None:
    """The records a copy is made of — a sealed segment whole, an active one's first
    `copy.nbytes` (committed) bytes — as COPY_SCHEMA columns; None when the segment file cannot
    be read (compacted away since the copy was planned: read its records as rows). Decoded as a
    whole (`decode_lines`); bytes that path refuses, record by record (a bad record raises
    CorruptRecordError, naming it)."""
    pdir, base, limit = Path(copy.segment).parent, copy.base, copy.nbytes
    try:
        with open(log_path(pdir, base), "rb") as f:
            size = os.fstat(f.fileno()).st_size if limit is None else limit
            data = f.read() if limit is None else os.pread(f.fileno(), limit, 0)
        table = decode_lines(data) if len(data) == size else None
        if table is None:
            table = _records_table(SegmentRef(copy.topic, copy.partition, pdir, base), limit)
    except OSError:
        return None
    n = table.num_rows
    columns = [
        pa.array([copy.topic] * n, pa.string()),
        pa.array(np.full(n, copy.partition, np.int32)),
        *(c.combine_chunks() for c in table.columns),
        pa.array(np.full(n, size, np.int64)),
    ]
    return pa.Table.from_arrays(columns, schema=COPY_SCHEMA)


def make_copies(
    root: Path, copies: Sequence[SegmentCopy], write: Callable[[Path, Sequence[SegmentCopy]], None], now: float
) -> list[SegmentCopy]:
    """Make the format-2 copies `copies` of the log at `root`. `write(staging, copies)` is the
    Parquet writer: it writes copy i's rows (`copy_records`, plus columns of its own) as one
    file `staging/seg=<i>/*.parquet`, or none for a copy it could not read. Each file found is
    synced and renamed over the copy's name, the directories synced, the staging directory (under
    `root`) removed; staging directories left by killed jobs are swept first. Returns the copies
    that are current now: the others' records are to be read as rows."""
    sweep_stale_copy_dirs(root, now)
    staging = root / f".columnar-{uuid.uuid4().hex}.tmp"
    try:
        write(staging, copies)
        for i, c in enumerate(copies):
            made = list((staging / f"seg={i}").glob("*.parquet"))
            if len(made) != 1:
                continue  # not read, or split over files: left to the row path
            _sync_file(made[0])
            os.replace(made[0], c.path)
        for pdir in {Path(c.segment).parent for c in copies}:
            _fileio.fsync_dir(pdir)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return [c for c in copies if c.current()]


def sweep_stale_copy_dirs(root: Path, now: float, max_age_s: float = STALE_COPY_DIR_S) -> list[Path]:
    """Remove the staging directories of copy jobs killed before their cleanup (kill -9, OOM):
    those untouched for `max_age_s` (a running job's is minutes old). Returns the paths removed."""
    removed = []
    for tmp in root.glob(".columnar-*.tmp"):
        with contextlib.suppress(FileNotFoundError):
            if tmp.stat().st_mtime < now - max_age_s:
                shutil.rmtree(tmp, ignore_errors=True)
                removed.append(tmp)
    return removed
