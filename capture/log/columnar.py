"""Immutable Parquet (zstd) copies of sealed, committed segments — the form Spark reads natively.

A copy is `<base>.parquet` beside `<base>.log`: the same records, same offsets, key/value/headers
as JSON text. It records the byte size of the segment it was made from, so a copy made before a
compaction rewrote the segment is recognisably stale (and is deleted by the compaction anyway).
The row-form `.log` stays the source of truth. Two formats:

1. written here (`write_parquet`, pyarrow): the columns of `SCHEMA`; the size in the footer's
   key-value metadata.
2. written by the projection runner's Spark tasks (`projections.source`): format 1's columns plus
   `topic`, `partition`, the default `event_time` and `value_v` (the value as a shredded Parquet
   VARIANT, so a field read is a column read); the size is the constant column `segment_bytes`
   (Spark's writer has no custom footer keys), checked through the row groups' statistics.
"""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from capture.log import _fileio
from capture.log.segment import SegmentRef, iter_records, log_path, parquet_path

__all__ = ["SCHEMA", "copy_format", "is_current", "parquet_path", "write_parquet"]

SCHEMA = pa.schema(
    [
        ("offset", pa.int64()),
        ("timestamp", pa.int64()),
        ("key", pa.string()),
        ("value", pa.string()),
        ("headers", pa.string()),
    ]
)
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
    column = next((i for i in range(meta.num_columns) if meta.schema.column(i).path == "segment_bytes"), None)
    if column is None or meta.num_row_groups == 0:
        return None
    for g in range(meta.num_row_groups):
        stats = meta.row_group(g).column(column).statistics
        if stats is None or not stats.has_min_max or not stats.min == stats.max == size:
            return None
    return 2


def is_current(pdir: Path, base: int) -> bool:
    """A Parquet copy exists (either format) and was made from the segment as it is now."""
    return copy_format(pdir, base) is not None


def write_parquet(ref: SegmentRef) -> int:
    """Write (atomically: temp file, fsync, rename) the Parquet copy of a sealed segment; returns
    its row count. The caller fsyncs the directory."""
    size = log_path(ref.pdir, ref.base).stat().st_size
    cols: tuple[list[int], list[int], list[str | None], list[str | None], list[str | None]] = (
        [],
        [],
        [],
        [],
        [],
    )
    offs, tss, keys, values, headers = cols
    for off, ts, key, value, hdr in iter_records(ref):
        offs.append(off)
        tss.append(ts)
        keys.append(None if key is None else key.decode())
        values.append(None if value is None else value.decode())
        headers.append(None if hdr is None else hdr.decode())
    schema = SCHEMA.with_metadata(
        {
            b"tributary.topic": ref.topic.encode(),
            b"tributary.partition": str(ref.partition).encode(),
            b"tributary.segment": ref.name.encode(),
            _SIZE: str(size).encode(),
        }
    )
    table = pa.Table.from_arrays([pa.array(c, type=f.type) for c, f in zip(cols, SCHEMA, strict=True)], schema=schema)
    final = parquet_path(ref.pdir, ref.base)
    tmp = final.with_name(final.name + ".tmp")
    pq.write_table(table, tmp, compression="zstd")
    fd = os.open(tmp, os.O_RDONLY)
    try:
        _fileio.fsync(fd, f"syncing {tmp}")
    finally:
        os.close(fd)
    os.replace(tmp, final)
    return len(offs)
