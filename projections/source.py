"""The log as a Spark DataFrame: sealed segments as Parquet, the rest as row splits.

Sealed segments are immutable, so each gets a Parquet copy (`capture.log.columnar` format 2,
made once by Spark tasks the first time a run needs it) that Spark reads natively: the default
event time is a column of it (computed by the row path's own Python when the copy is made), the
value is also a shredded VARIANT, so a DataFrame projection runs no Python and parses no JSON per
record. An active segment's committed prefix may have a tail copy of the same format
(`columnar.TailCopy`, made by a run that reads the whole segment); what is committed after it is
read by `mapInArrow` tasks with `capture.log.read_split`.
The driver plans from one manifest snapshot and ships only file names and byte ranges: nothing of
the log passes through the driver. Both paths give the same rows (tests/integration/projections).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
from orjson import loads

from tributary.capture.log import Log, LogError, Split, _fileio, read_split
from tributary.capture.log.columnar import (
    TailCopy,
    copy_format,
    decode_lines,
    parquet_path,
    read_split_columns,
    sweep_tail_copies,
    tail_copies,
    tail_copy_valid,
)
from tributary.capture.log.segment import SegmentRef, iter_records, log_path
from tributary.projections.codec import canonical
from tributary.projections.engine import prepare
from tributary.projections.loader import resolve
from tributary.projections.records import decode, default_event_time

__all__ = ["RECORD_SCHEMA", "TP", "plan", "records_frame"]

TP = tuple[str, int]
RECORD_SCHEMA = (
    "topic string, partition int, offset long, timestamp long, key string, "
    "value string, headers string, event_time long, pkey string"
)
_SPLIT_SCHEMA = (
    "topic string, partition int, path string, start_byte long, end_byte long, first_offset long, lo long, hi long, "
    "end_offset long"
)
_ARROW = pa.schema(
    [
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("timestamp", pa.int64()),
        ("key", pa.string()),
        ("value", pa.string()),
        ("headers", pa.string()),
        ("event_time", pa.int64()),
        ("pkey", pa.string()),
    ]
)
_BATCH = 8192
# A run that reads all of an active segment has a tail copy made of its committed bytes
# (`columnar.TailCopy`) once this many of them are in no copy yet; later runs read it from
# Parquet and only what was committed after it as rows.
TAIL_COPY_BYTES = 16 << 20
TAIL_GRACE_S = 600.0  # a superseded tail copy is deleted this long after its successor was made
STALE_COPY_DIR_S = 86400.0  # a copy job's temporary directory this old was left by a killed job


def plan(
    log: Log, topics: Sequence[str], lo: Mapping[TP, int], hi: Mapping[TP, int], max_bytes: int
) -> tuple[list[tuple[Any, ...]], list[Segment]]:
    """Row splits holding offsets in [lo, hi) per topic-partition, and the segments read from
    Parquet instead (one entry per segment instead of its splits): every sealed one, and the
    committed prefix of an active one that has a tail copy — or gets one made (`_tail`)."""
    rows: list[tuple[Any, ...]] = []
    sealed: list[Segment] = []
    active: dict[TP, list[tuple[Any, ...]]] = {}
    ends = log.ends()
    for topic in topics:
        splits: list[Split] = log.splits(topic, max_bytes=max_bytes)
        stops = {s.path: s.end_offset for s in splits}  # a file's last split ends where its offsets do
        for i, s in enumerate(splits):
            tp = (topic, s.partition)
            start, stop = lo.get(tp, 0), hi.get(tp, 0)
            nxt = splits[i + 1] if i + 1 < len(splits) and splits[i + 1].partition == s.partition else None
            if start >= stop or s.first_offset >= stop or (nxt is not None and nxt.first_offset <= start):
                continue
            # end_offset: a compaction that rewrites the file meanwhile leaves the split readable by offset
            row = (s.topic, s.partition, s.path, s.start_byte, s.end_byte, s.first_offset, start, stop, s.end_offset)
            base = int(Path(s.path).name[:20])
            if base != ends[tp].segment:  # sealed: immutable until a compaction rewrites it
                if not sealed or sealed[-1].path != s.path:
                    sealed.append(Segment(topic, s.partition, base, s.path, start, stop, [], stop=stops[s.path]))
                sealed[-1].splits.append(row)
                continue
            active.setdefault(tp, []).append(row)
    for tp, splits_ in active.items():
        copy, rest = _tail(splits_, ends[tp].end, ends[tp].nbytes)
        if copy is not None:
            sealed.append(copy)
        rows += rest
    return rows, sealed


def _tail(splits: list[tuple[Any, ...]], end: int, nbytes: int) -> tuple[Segment | None, list[tuple[Any, ...]]]:
    """An active segment's planned row splits (committed end `end`, `nbytes`) → (the Parquet
    part, the splits still read as rows). With a valid tail copy the rows start at its end, at
    its byte position; a new copy is planned instead when this run reads the whole segment
    (a rebuild, a DataFrame projection's run: making the copy reads it once more) and at least
    TAIL_COPY_BYTES of it are not in a copy yet. An incremental run starting inside the segment
    makes none: it would read the whole segment to copy it for the sake of its new records."""
    topic, partition, path, _, _, _, lo, hi, _ = splits[0]
    pdir, base = Path(path).parent, int(Path(path).name[:20])
    copy = next((c for c in tail_copies(pdir) if c.base == base and tail_copy_valid(pdir, c, end, nbytes)), None)
    covered_bytes = 0 if copy is None else copy.nbytes
    if lo <= base and nbytes - covered_bytes >= TAIL_COPY_BYTES:
        return Segment(topic, partition, base, path, lo, hi, splits, TailCopy(base, end, nbytes)), []
    if copy is None or lo >= copy.end:
        return None, splits
    rest = []
    for row in splits:  # the splits after the copy's end; the one holding it starts there
        first, stop = row[5], row[8]
        if stop is not None and stop <= copy.end:
            continue
        if first <= copy.end:
            row = (*row[:3], copy.nbytes, row[4], copy.end, max(row[6], copy.end), *row[7:])
        rest.append(row)
    return Segment(topic, partition, base, path, lo, hi, splits, copy), rest


@dataclass(frozen=True, slots=True, eq=False)
class Segment:
    """A segment a run reads from Parquet — a sealed one, or an active one's committed prefix
    (`tail`) — with the run's [lo, hi) offsets of its partition."""

    topic: str
    partition: int
    base: int
    path: str
    lo: int
    hi: int
    splits: list[tuple[Any, ...]]  # its row splits, read if no Parquet copy can be made
    tail: TailCopy | None = None  # an active segment: the copy of its committed prefix
    stop: int | None = None  # a sealed segment: its offsets are below this (the next one's base)

    @property
    def whole(self) -> bool:
        """Every offset its copy holds is in the run's [lo, hi): the copy needs no offset filter."""
        stop = self.tail.end if self.tail is not None else self.stop
        return stop is not None and self.lo <= self.base and stop <= self.hi

    @property
    def ref(self) -> SegmentRef:
        return SegmentRef(self.topic, self.partition, Path(self.path).parent, self.base)

    @property
    def copy_path(self) -> Path:
        pdir = Path(self.path).parent
        return parquet_path(pdir, self.base) if self.tail is None else self.tail.path(pdir)

    @property
    def limit(self) -> int | None:
        """The bytes a copy is made of (None: the whole, sealed, file)."""
        return None if self.tail is None else self.tail.nbytes

    def copied(self) -> bool:
        """Its copy exists, is complete and is current (format 2)."""
        pdir = Path(self.path).parent
        if self.tail is None:
            return copy_format(pdir, self.base) == 2
        return tail_copy_valid(pdir, self.tail, self.tail.end, self.tail.nbytes)


# A copy's rows: the segment's index in the job, the record's first seven columns, the segment's size.
_COPY = pa.schema([pa.field("seg", pa.int32()), *list(_ARROW)[:7], pa.field("segment_bytes", pa.int64())])
_COPY_SCHEMA = (
    "seg int, topic string, partition int, offset long, timestamp long, key string, value string, "
    "headers string, segment_bytes long"
)


def _segment_rows(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """Spark task: the records of each segment it is given — a sealed one whole, an active one's
    first `limit` (committed) bytes — all or nothing (a segment that cannot be read — compacted
    away meanwhile — is left to the row path). A segment is decoded as a whole
    (`columnar.decode_lines`); one it refuses, line by line."""
    for batch in batches:
        for s in batch.to_pylist():
            ref = SegmentRef(s["topic"], s["partition"], Path(s["path"]).parent, s["base"])
            limit = s["limit"]
            try:
                with open(log_path(ref.pdir, ref.base), "rb") as f:
                    size = os.fstat(f.fileno()).st_size if limit is None else limit
                    data = f.read() if limit is None else os.pread(f.fileno(), limit, 0)
            except OSError:
                continue
            table = decode_lines(data) if len(data) == size else None
            if table is None:
                yield from _segment_batches(s, ref, size, limit)
                continue
            n = table.num_rows
            const = [
                pa.array(np.full(n, s["seg"], np.int32)),
                pa.array([s["topic"]] * n, pa.string()),
                pa.array(np.full(n, s["partition"], np.int32)),
            ]
            sizes = pa.array(np.full(n, size, np.int64))
            columns = [*const, *(c.combine_chunks() for c in table.columns), sizes]
            yield from pa.Table.from_arrays(columns, schema=_COPY).to_batches(_BATCH)


def _segment_batches(s: Mapping[str, Any], ref: SegmentRef, size: int, limit: int | None) -> Iterator[pa.RecordBatch]:
    """`_segment_rows` record by record (CRC-checked by `iter_records`, which names a bad record)."""
    try:
        out = []
        cols: list[list[Any]] = [[] for _ in range(5)]
        for rec in iter_records(ref, 0, limit):
            for col, v in zip(cols, rec, strict=True):
                col.append(v)
            if len(cols[0]) >= _BATCH:
                out.append(_copy_batch(s, size, cols))
        if cols[0]:
            out.append(_copy_batch(s, size, cols))
    except OSError:
        return
    yield from out


def _copy_batch(s: Mapping[str, Any], size: int, cols: list[list[Any]]) -> pa.RecordBatch:
    offs, tss, keys, values, headers = cols
    n = len(offs)
    batch = pa.RecordBatch.from_arrays(
        [
            pa.array([s["seg"]] * n, pa.int32()),
            pa.array([s["topic"]] * n, pa.string()),
            pa.array([s["partition"]] * n, pa.int32()),
            pa.array(offs, pa.int64()),
            pa.array(tss, pa.int64()),
            pa.array([None if k is None else k.decode() for k in keys], pa.string()),
            pa.array([None if v is None else v.decode() for v in values], pa.string()),
            pa.array([None if h is None else h.decode() for h in headers], pa.string()),
            pa.array([size] * n, pa.int64()),
        ],
        schema=_COPY,
    )
    for c in cols:
        c.clear()
    return batch


def _event_time() -> Any:
    """`records.default_event_time` over (topic, value_v, timestamp): an event's `occurred_at`,
    a CDC envelope's `source.ts_ms` (else `ts_ms`), else the log time. The JSON types are checked
    as in Python: a JSON string is not an integer, a number is not an ISO-8601 time (the text
    must start with a date)."""
    from pyspark.sql import functions as F

    def typed(path: str, kind: str, sql_type: str) -> str:
        node = f"variant_get(value_v, '{path}')"
        return f"CASE WHEN schema_of_variant({node}) = '{kind}' THEN variant_get({node}, '$', '{sql_type}') END"

    occurred = typed("$.occurred_at", "STRING", "string")
    micros = f"unix_micros(try_to_timestamp({occurred}))"
    occurred_ms = F.expr(  # floor(µs / 1000) exactly, also before 1970, as Python's // does
        f"CASE WHEN {occurred} rlike '^[0-9]{{4}}-[0-9]{{2}}-[0-9]{{2}}' "
        f"THEN ({micros} - pmod({micros}, 1000L)) div 1000L END"
    )

    def integer(path: str) -> Any:  # a JSON integer; true/false too, as Python's isinstance(x, int) says
        return F.coalesce(
            F.expr(typed(path, "BIGINT", "bigint")), F.expr(typed(path, "BOOLEAN", "boolean")).cast("long")
        )

    cdc = F.coalesce(integer("$.source.ts_ms"), integer("$.ts_ms"))
    chosen = F.when(F.col("topic").startswith("events."), occurred_ms).otherwise(cdc)
    return F.coalesce(chosen, F.col("timestamp")).cast("long")


def sweep_stale_copy_dirs(root: Path, now: float, max_age_s: float = STALE_COPY_DIR_S) -> list[Path]:
    """Remove the temporary directories of copy jobs killed before their `finally` (kill -9, OOM):
    those untouched for `max_age_s` (a running job's is minutes old). Returns the paths removed."""
    removed = []
    for tmp in root.glob(".columnar-*.tmp"):
        with contextlib.suppress(FileNotFoundError):
            if tmp.stat().st_mtime < now - max_age_s:
                shutil.rmtree(tmp, ignore_errors=True)
                removed.append(tmp)
    return removed


def _write_copies(spark: Any, segments: Sequence[Segment]) -> None:
    """Format-2 copies (`capture.log.columnar`) of `segments`, written by Spark tasks: the rows
    read in Python; the VARIANT value, the default event time and the shredding by Spark, into a
    temporary directory under the log root; then each file renamed over `<base>.parquet`."""
    from pyspark.sql import functions as F

    root = Path(segments[0].path).parents[2]  # <root>/<topic>/<partition>/<base>.log
    sweep_stale_copy_dirs(root, time.time())
    tmp = root / f".columnar-{uuid.uuid4().hex}.tmp"
    try:
        listed = spark.createDataFrame(
            [(i, s.topic, s.partition, s.base, s.path, s.limit) for i, s in enumerate(segments)],
            "seg int, topic string, partition int, base long, path string, limit long",
        )
        rows = listed.repartition(len(segments)).mapInArrow(_segment_rows, _COPY_SCHEMA)
        copies = rows.withColumn("value_v", F.expr("try_parse_json(value)")).withColumn("event_time", _event_time())
        copies.write.partitionBy("seg").option("compression", "zstd").option("maxRecordsPerFile", 0).parquet(str(tmp))
        for i, s in enumerate(segments):
            made = list((tmp / f"seg={i}").glob("*.parquet"))
            if len(made) != 1:
                continue  # not read (row path): unreadable segment, or split over files
            fd = os.open(made[0], os.O_RDONLY)
            try:
                _fileio.fsync(fd, f"syncing {made[0]}")
            finally:
                os.close(fd)
            os.replace(made[0], s.copy_path)
        for pdir in {s.ref.pdir for s in segments}:
            _fileio.fsync_dir(pdir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def columnar_segments(spark: Any, segments: Sequence[Segment]) -> tuple[list[Segment], list[Segment]]:
    """(segments with a current format-2 Parquet copy, segments without one) — making missing
    or older-format copies first, in parallel Spark tasks. A copy is made once per sealed
    segment (and per planned tail copy); later runs find it. If the copies cannot be written
    (a read-only log directory), those segments are read as rows."""
    from py4j.protocol import Py4JJavaError
    from pyspark.errors import PySparkException

    missing = [s for s in segments if not s.copied()]
    if missing:
        with contextlib.suppress(OSError, LogError, PySparkException, Py4JJavaError):  # checked below:
            _write_copies(spark, missing)  # whatever was not made is read from its rows
    failed = [s for s in missing if not s.copied()]
    for pdir, active in {(s.ref.pdir, s.base) for s in segments if s.tail is not None}:
        with contextlib.suppress(OSError):  # a read-only log directory keeps its copies
            sweep_tail_copies(pdir, active, time.time(), TAIL_GRACE_S)
    return [s for s in segments if s not in failed], failed


def _native_records(spark: Any, segments: Sequence[Segment], variant: bool) -> Any:
    """The records of sealed segments from their format-2 Parquet copies: one scan of the copies
    the run reads whole (a rebuild's: no per-row filter, so the offset, topic and partition
    columns are not even decoded), one of the others with offsets limited to the run's [lo, hi)
    per topic-partition by literal predicates (Parquet pushes them down to row groups); key and
    event time are columns of the copy."""
    from pyspark.sql import functions as F

    whole = [s for s in segments if s.whole]
    part = [s for s in segments if not s.whole]
    pkey = F.coalesce(F.col("key"), F.lit("null")).alias("pkey")
    columns = [*_ARROW.names[:8], pkey, *(["value_v"] if variant else [])]
    scans = []
    if whole:
        scans.append(spark.read.parquet(*(str(s.copy_path) for s in whole)).select(*columns))
    if part:
        wanted = None
        for topic, partition, lo, hi in sorted({(s.topic, s.partition, s.lo, s.hi) for s in part}):
            one = (F.col("topic") == topic) & (F.col("partition") == partition) & F.col("offset").between(lo, hi - 1)
            wanted = one if wanted is None else wanted | one
        scans.append(spark.read.parquet(*(str(s.copy_path) for s in part)).where(wanted).select(*columns))
    return scans[0] if len(scans) == 1 else scans[0].unionByName(scans[1])


RawRecord = tuple[str, int, int, int, str | None, str | None, str | None]  # topic … headers, JSON as text


def _custom(p: Any) -> bool:
    """The projection brings its own key or event time (Python), instead of the log's defaults."""
    return p.key is not None or p.event_time is not None


def _batches(p: Any, records: Iterable[RawRecord]) -> Iterator[pa.RecordBatch]:
    """Arrow batches of RECORD_SCHEMA: each record with its key and event time (Python path)."""
    custom = _custom(p)
    cols: dict[str, list[Any]] = {f: [] for f in _ARROW.names}

    def flush() -> pa.RecordBatch:
        batch = pa.RecordBatch.from_pydict(cols, schema=_ARROW)
        for v in cols.values():
            v.clear()
        return batch

    for topic, partition, offset, timestamp, key, value, headers in records:
        if custom:
            r = prepare(p, decode(topic, partition, offset, timestamp, key, value, headers))
            event_time = r.event_time
            pkey = canonical(p.key(r) if p.key is not None else r.key)
        else:  # log keys are canonical JSON already (DESIGN.md "Topics, keys, records")
            event_time = default_event_time(topic, None if value is None else loads(value), timestamp)
            pkey = "null" if key is None else key
        cols["topic"].append(topic)
        cols["partition"].append(partition)
        cols["offset"].append(offset)
        cols["timestamp"].append(timestamp)
        cols["key"].append(key)
        cols["value"].append(value)
        cols["headers"].append(headers)
        cols["event_time"].append(event_time)
        cols["pkey"].append(pkey)
        if len(cols["offset"]) >= _BATCH:
            yield flush()
    if cols["offset"]:
        yield flush()


def _text(raw: bytes | None) -> str | None:
    return None if raw is None else raw.decode()


def _split(s: Mapping[str, Any]) -> Split:
    return Split(
        s["topic"], s["partition"], s["path"], s["start_byte"], s["end_byte"], s["first_offset"], s["end_offset"]
    )


def _split_records(batches: Iterator[pa.RecordBatch]) -> Iterator[RawRecord]:
    """The records of each planned row split, offsets limited to the run's [lo, hi)."""
    for batch in batches:
        for s in batch.to_pylist():
            yield from _records_of(s)


def _records_of(s: Mapping[str, Any]) -> Iterator[RawRecord]:
    lo, hi = s["lo"], s["hi"]
    for rec in read_split(_split(s)):
        if rec.offset < lo:
            continue
        if rec.offset >= hi:
            break
        yield (
            rec.topic,
            rec.partition,
            rec.offset,
            rec.timestamp,
            _text(rec.key),
            _text(rec.value),
            _text(rec.headers),
        )


def _column_records(batches: Iterator[pa.RecordBatch]) -> Iterator[RawRecord]:
    for batch in batches:
        for r in batch.to_pylist():
            yield (r["topic"], r["partition"], r["offset"], r["timestamp"], r["key"], r["value"], r["headers"])


_RAW = pa.schema(list(_ARROW)[:7])
_RAW_SCHEMA = ", ".join(RECORD_SCHEMA.split(", ")[:7])


def _raw_rows(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """A mapInArrow function: row splits → their records' first seven RECORD_SCHEMA columns.
    A split is decoded as a whole (`columnar.read_split_columns`: no Python step per field);
    one that path refuses (changed since planning, not intact) is read record by record."""
    for batch in batches:
        for s in batch.to_pylist():
            split = _split(s)
            table = read_split_columns(split, s["lo"], s["hi"])
            if table is None:
                yield from _raw_batches(_records_of(s))
                continue
            n = table.num_rows
            topic = pa.array([s["topic"]] * n, pa.string()) if n else pa.array([], pa.string())
            part = pa.array(np.full(n, s["partition"], np.int32))
            for b in table.to_batches(_BATCH):
                i = b.num_rows
                yield pa.RecordBatch.from_arrays([topic[:i], part[:i], *b.columns], schema=_RAW)


def _raw_batches(records: Iterable[RawRecord]) -> Iterator[pa.RecordBatch]:
    cols: list[list[Any]] = [[] for _ in _RAW.names]
    for rec in records:
        for col, v in zip(cols, rec, strict=True):
            col.append(v)
        if len(cols[0]) >= _BATCH:
            yield pa.RecordBatch.from_arrays(
                [pa.array(c, f.type) for c, f in zip(cols, _RAW, strict=True)], schema=_RAW
            )
            cols = [[] for _ in _RAW.names]
    if cols[0]:
        yield pa.RecordBatch.from_arrays([pa.array(c, f.type) for c, f in zip(cols, _RAW, strict=True)], schema=_RAW)


def _reader(modules: tuple[str, ...], mirror: tuple[str, ...], name: str, columns: bool = False):  # type: ignore[no-untyped-def]
    """A mapInArrow function: row splits (or Parquet rows, `columns=True`) → RECORD_SCHEMA."""

    def read(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        p = resolve(modules, mirror, name)
        yield from _batches(p, (_column_records if columns else _split_records)(batches))

    return read


def records_frame(
    spark: Any,
    log: Log,
    *,
    modules: Sequence[str],
    mirror: Sequence[str],
    name: str,
    topics: Sequence[str],
    lo: Mapping[TP, int],
    hi: Mapping[TP, int],
    max_bytes: int = 16 << 20,
) -> Any:
    """A DataFrame of the records in [lo, hi) of each topic-partition (schema RECORD_SCHEMA; for a
    DataFrame projection also `value_v`, the value as a VARIANT — shredded columns when read
    from a Parquet copy, `try_parse_json(value)` for the tail)."""
    from pyspark.sql import functions as F

    p = resolve(tuple(modules), tuple(mirror), name)
    variant = p.build is not None
    rows, sealed = plan(log, topics, lo, hi, max_bytes)
    native = None
    if sealed:
        columnar, rows_only = columnar_segments(spark, sealed)
        rows += [r for seg in rows_only for r in seg.splits]
        if columnar:
            native = _native_records(spark, columnar, variant and not _custom(p))
            if _custom(p):  # its own Python decides key and event time
                native = native.select(*_ARROW.names[:7]).mapInArrow(
                    _reader(tuple(modules), tuple(mirror), name, columns=True), RECORD_SCHEMA
                )
                if variant:
                    native = native.withColumn("value_v", F.expr("try_parse_json(value)"))
    if native is not None and not rows:
        return native
    splits = spark.createDataFrame(rows, _SPLIT_SCHEMA)
    if rows:
        splits = splits.repartition(len(rows))
    if variant and not _custom(p):  # key, event time and VARIANT in SQL, computed only if used
        raw = splits.mapInArrow(_raw_rows, _RAW_SCHEMA).withColumn("value_v", F.expr("try_parse_json(value)"))
        pkey = F.coalesce(F.col("key"), F.lit("null")).alias("pkey")
        frame = raw.select(*_ARROW.names[:7], _event_time().alias("event_time"), pkey, "value_v")
    else:
        frame = splits.mapInArrow(_reader(tuple(modules), tuple(mirror), name), RECORD_SCHEMA)
        if variant:
            frame = frame.withColumn("value_v", F.expr("try_parse_json(value)"))
    return frame if native is None else native.unionByName(frame)
