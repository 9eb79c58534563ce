"""Segment files on disk, read side: naming, listing, index loading, bounded line iteration."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from tributary.log.local.codec import BadLine, Decoded, decode_line, peek_offset
from tributary.log.local.errors import CorruptRecordError
from tributary.log.local.index import lookup_offset, unpack_offsets, unpack_times

__all__ = [
    "SegmentRef",
    "claims_below",
    "index_path",
    "iter_lines",
    "iter_records",
    "list_segments",
    "load_offset_index",
    "load_time_index",
    "log_path",
    "parquet_path",
    "segment_name",
    "seek_position",
    "timeindex_path",
]

CHUNK = 1 << 20


def segment_name(base: int) -> str:
    return f"{base:020d}"


def log_path(pdir: Path, base: int) -> Path:
    return pdir / f"{segment_name(base)}.log"


def index_path(pdir: Path, base: int) -> Path:
    return pdir / f"{segment_name(base)}.index"


def timeindex_path(pdir: Path, base: int) -> Path:
    return pdir / f"{segment_name(base)}.timeindex"


def parquet_path(pdir: Path, base: int) -> Path:
    """The segment's immutable columnar copy (see `columnar`), if one was written."""
    return pdir / f"{segment_name(base)}.parquet"


def list_segments(pdir: Path) -> list[int]:
    """Base offsets of the segment files present, ascending."""
    bases = []
    for name in os.listdir(pdir):
        if name.endswith(".log") and len(name) == 24 and name[:20].isdigit():
            bases.append(int(name[:20]))
    bases.sort()
    return bases


class SegmentRef:
    """Where a record iteration is, for error messages."""

    __slots__ = ("topic", "partition", "pdir", "base")

    def __init__(self, topic: str, partition: int, pdir: Path, base: int) -> None:
        self.topic, self.partition, self.pdir, self.base = topic, partition, pdir, base

    @property
    def name(self) -> str:
        return f"{segment_name(self.base)}.log"

    def corrupt(self, message: str, offset: int | None) -> CorruptRecordError:
        return CorruptRecordError(message, topic=self.topic, partition=self.partition, segment=self.name, offset=offset)


def load_offset_index(pdir: Path, base: int) -> list[tuple[int, int]]:
    try:
        return unpack_offsets(index_path(pdir, base).read_bytes())
    except FileNotFoundError:
        return []


def load_time_index(pdir: Path, base: int) -> list[tuple[int, int]]:
    try:
        return unpack_times(timeindex_path(pdir, base).read_bytes())
    except FileNotFoundError:
        return []


def seek_position(pdir: Path, base: int, offset: int, limit: int | None, *, file: BinaryIO | None = None) -> int:
    """Byte position of a line at or before `offset`, from the sparse index.

    The entry is checked against the data (a line start claiming that offset) so a stale index
    (crash between a compaction's renames) costs a scan from 0, never a wrong answer."""
    if offset <= base:
        return 0
    entries = load_offset_index(pdir, base)
    while entries:
        rel, pos = lookup_offset(entries, offset - base)
        if pos == 0:
            return 0
        if (limit is None or pos < limit) and _line_starts_at(log_path(pdir, base), pos, base + rel, file):
            return pos
        entries = [e for e in entries if e[1] < pos]
    return 0


def _line_starts_at(path: Path, pos: int, offset: int, file: BinaryIO | None = None) -> bool:
    if file is not None:  # the version the caller holds open, whatever the name points at now
        return starts_at(file, pos, offset)
    try:
        with open(path, "rb") as f:
            return starts_at(f, pos, offset)
    except OSError:
        return False


def starts_at(f: BinaryIO, pos: int, offset: int) -> bool:
    """The line at byte `pos` of the open file is a record claiming `offset`."""
    head = os.pread(f.fileno(), 41, max(pos - 1, 0))
    at = head[1:] if pos else head
    return (not pos or head[:1] == b"\n") and peek_offset(at) == offset


def claims_below(f: BinaryIO, pos: int, end: int) -> bool:
    """The line at byte `pos` of the open file claims an offset below `end`. Where a reader's plan
    (a manifest's committed bytes, a split's byte range) ends, that means the file was rewritten
    since with a record grown (compaction filled it), pushing offsets of the plan past those bytes.
    An unreadable head — the end of the file, or an append under way — claims nothing."""
    off = peek_offset(os.pread(f.fileno(), 40, pos))
    return off is not None and off < end


def iter_lines(
    path: Path, start: int = 0, limit: int | None = None, *, file: BinaryIO | None = None
) -> Iterator[tuple[int, bytes]]:
    """(byte position, line without newline) from `start` up to `limit` (default: end of file).

    A final line without its newline is yielded as is: the caller decides whether that is a torn
    tail or corruption. Raises FileNotFoundError if the segment is gone. With `file` (an open
    segment), that file is read instead of opening `path` again: a reader that validated a
    position on it keeps reading the same version even if compaction replaced the name."""
    with contextlib.nullcontext(file) if file is not None else open(path, "rb", buffering=0) as f:
        if start or file is not None:
            f.seek(start)
        pos = start
        tail = b""
        remaining = None if limit is None else limit - start
        while remaining is None or remaining > 0:
            chunk = f.read(CHUNK if remaining is None else min(CHUNK, remaining))
            if not chunk:
                break
            if remaining is not None:
                remaining -= len(chunk)
            lines = (tail + chunk).split(b"\n") if tail else chunk.split(b"\n")
            tail = lines.pop()
            for line in lines:
                yield pos, line
                pos += len(line) + 1
        if tail:
            yield pos, tail


def iter_records(
    ref: SegmentRef,
    start: int = 0,
    limit: int | None = None,
    after: int = -1,
    *,
    file: BinaryIO | None = None,
) -> Iterator[Decoded]:
    """Decoded records of one segment, failing loudly on anything that is not an intact record."""
    path = log_path(ref.pdir, ref.base)
    prev = after
    end_pos = start
    for pos, line in iter_lines(path, start, limit, file=file):
        try:
            rec = decode_line(line)
        except BadLine as exc:
            end = pos + len(line)
            torn = limit is None or end >= limit
            msg = str(exc)
            if torn and not line.endswith(b"}"):
                msg = f"segment truncated mid-record at byte {pos}"
            raise ref.corrupt(msg, exc.offset if exc.offset is not None else prev + 1) from None
        if rec[0] <= prev:
            raise ref.corrupt(f"offsets out of order ({rec[0]} after {prev})", rec[0])
        prev = rec[0]
        end_pos = pos + len(line) + 1
        yield rec
    if limit is not None and end_pos < limit:
        size = os.fstat(file.fileno()).st_size if file is not None else path.stat().st_size
        if size < limit:
            raise ref.corrupt(f"segment has {size} bytes but the manifest says {limit} are committed", None)
