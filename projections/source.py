"""The log as a Spark DataFrame: sealed segments as Parquet, the rest as row splits.

Sealed segments are immutable, so each gets a Parquet copy (the log's format 2, made once the
first time a run needs it: the log plans and installs it, `Log.make_copies`; Spark tasks write
it) that Spark reads natively: the default event time is a column of it (computed by the row
path's own Python when the copy is made), the value is also a shredded VARIANT, so a DataFrame
projection runs no Python and parses no JSON per record. An active segment's committed prefix may
have a tail copy of the same format (`TailCopy`, made by a run that reads the whole segment); what
is committed after it is read by `mapInArrow` tasks with the log's `read_split`.
The driver plans from one manifest snapshot and ships only file names and byte ranges: nothing of
the log passes through the driver. Both paths give the same rows (tests/integration/projections).
"""

from __future__ import annotations

import contextlib
import operator
import os
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import reduce
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from orjson import loads

from tributary.log.local import (
    COPY_SCHEMA,
    Log,
    LogError,
    PartitionEnd,
    Record,
    SegmentCopy,
    Split,
    TailCopy,
    TopicNotFoundError,
    copy_records,
    read_split,
    read_split_columns,
)
from tributary.log.local import (
    RECORD_SCHEMA as LOG_RECORD,
)
from tributary.projections.engine import prepare, unit_key
from tributary.projections.loader import resolve
from tributary.projections.records import SCHEMA_KEY, decode, default_event_time

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

    from tributary.projections.definition import Projection

__all__ = [
    "RECORD_SCHEMA",
    "TP",
    "LocalSource",
    "LogSource",
    "RawRecord",
    "RecordReader",
    "driver_frame",
    "plan",
    "read_range",
    "records_frame",
    "rows_frame",
]

TP = tuple[str, int]
ArrowMap = Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]  # a `mapInArrow` function
# The log's record columns, then the two every projection gets: its event time and its key.
_ARROW = LOG_RECORD.append(pa.field("event_time", pa.int64())).append(pa.field("pkey", pa.string()))
_SPARK_TYPES = {pa.string(): "string", pa.int32(): "int", pa.int64(): "long"}


def _ddl(schema: pa.Schema) -> str:
    """An Arrow schema as the Spark DDL string `mapInArrow` and `createDataFrame` take."""
    return ", ".join(f"{f.name} {_SPARK_TYPES[f.type]}" for f in schema)


RECORD_SCHEMA = _ddl(_ARROW)
_SPLIT_SCHEMA = (
    "topic string, partition int, path string, start_byte long, end_byte long, first_offset long, lo long, hi long, "
    "end_offset long"
)
_BATCH = 8192
# A run that reads all of an active segment has a tail copy made of its committed bytes
# (`TailCopy`) once this many of them are in no copy yet; later runs read it from
# Parquet and only what was committed after it as rows.
TAIL_COPY_BYTES = 16 << 20
TAIL_GRACE_S = 600.0  # a superseded tail copy is deleted this long after its successor was made


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
            base = s.base
            if base != ends[tp].segment:  # sealed: immutable until a compaction rewrites it
                if not sealed or sealed[-1].path != s.path:
                    sealed.append(Segment(topic, s.partition, base, s.path, start, stop, [], stop=stops[s.path]))
                sealed[-1].splits.append(row)
                continue
            active.setdefault(tp, []).append(row)
    for tp, splits_ in active.items():
        copy, rest = _tail(log, splits_, ends[tp])
        if copy is not None:
            sealed.append(copy)
        rows += rest
    return rows, sealed


def _tail(log: Log, splits: list[tuple[Any, ...]], at: PartitionEnd) -> tuple[Segment | None, list[tuple[Any, ...]]]:
    """An active segment's planned row splits (committed end `at`) → (the Parquet
    part, the splits still read as rows). With a valid tail copy the rows start at its end, at
    its byte position; a new copy is planned instead when this run reads the whole segment
    (a rebuild, a DataFrame projection's run: making the copy reads it once more) and at least
    TAIL_COPY_BYTES of it are not in a copy yet. An incremental run starting inside the segment
    makes none: it would read the whole segment to copy it for the sake of its new records."""
    topic, partition, path, _, _, _, lo, hi, _ = splits[0]
    base, end, nbytes = at.segment, at.end, at.nbytes
    copy = log.tail_copy(topic, partition, at)
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
    def copy(self) -> SegmentCopy:
        """Its Parquet copy, as the log names it."""
        return SegmentCopy(self.topic, self.partition, self.path, self.tail)

    @property
    def copy_path(self) -> Path:
        return self.copy.path

    def copied(self) -> bool:
        """Its copy exists, is complete and is current (format 2)."""
        return self.copy.current()


# A copy job's rows: the segment's index in the job, then what the log makes a copy of.
_COPY = pa.schema([pa.field("seg", pa.int32()), *COPY_SCHEMA])
_COPY_SCHEMA = _ddl(_COPY)
_LISTED_SCHEMA = "seg int, topic string, partition int, segment string, tail_end long, tail_nbytes long"


def _segment_rows(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """Spark task: the records of each copy it is given (`copy_records`: a sealed segment whole,
    an active one's committed prefix), all or nothing (a segment that cannot be read — compacted
    away meanwhile — is left to the row path)."""
    for batch in batches:
        for s in batch.to_pylist():
            copy = SegmentCopy(s["topic"], s["partition"], s["segment"])
            if s["tail_end"] is not None:
                copy = replace(copy, tail=TailCopy(copy.base, s["tail_end"], s["tail_nbytes"]))
            table = copy_records(copy)
            if table is None:
                continue
            seg = pa.array(np.full(table.num_rows, s["seg"], np.int32))
            yield from pa.Table.from_arrays([seg, *table.columns], schema=_COPY).to_batches(_BATCH)


def _event_time() -> Column:
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

    def integer(path: str) -> Column:  # a JSON integer; true/false too, as Python's isinstance(x, int) says
        return F.coalesce(
            F.expr(typed(path, "BIGINT", "bigint")), F.expr(typed(path, "BOOLEAN", "boolean")).cast("long")
        )

    cdc = F.coalesce(integer("$.source.ts_ms"), integer("$.ts_ms"))
    chosen = F.when(F.col("topic").startswith("events."), occurred_ms).otherwise(cdc)
    return F.coalesce(chosen, F.col("timestamp")).cast("long")


def _spark_writer(spark: SparkSession) -> Callable[[Path, Sequence[SegmentCopy]], None]:
    """The Parquet writer of the log's copy jobs (`Log.make_copies`): Spark tasks read each copy's
    records (`_segment_rows`); Spark adds the VARIANT value and the default event time, shreds
    the VARIANT and writes one file per copy under the job's staging directory."""

    def write(staging: Path, copies: Sequence[SegmentCopy]) -> None:
        from pyspark.sql import functions as F

        listed = spark.createDataFrame(
            [
                (i, c.topic, c.partition, c.segment, *((None, None) if c.tail is None else (c.tail.end, c.tail.nbytes)))
                for i, c in enumerate(copies)
            ],
            _LISTED_SCHEMA,
        )
        rows = listed.repartition(len(copies)).mapInArrow(_segment_rows, _COPY_SCHEMA)
        copies_ = rows.withColumn("value_v", F.expr("try_parse_json(value)")).withColumn("event_time", _event_time())
        writer = copies_.write.partitionBy("seg").option("compression", "zstd").option("maxRecordsPerFile", 0)
        writer.parquet(str(staging))

    return write


def columnar_segments(
    spark: SparkSession, log: Log, segments: Sequence[Segment]
) -> tuple[list[Segment], list[Segment]]:
    """(segments with a current format-2 Parquet copy, segments without one) — making missing
    or older-format copies first, in parallel Spark tasks. A copy is made once per sealed
    segment (and per planned tail copy); later runs find it. If the copies cannot be written
    (a read-only log directory), those segments are read as rows."""
    from py4j.protocol import Py4JJavaError
    from pyspark.errors import PySparkException

    missing = [s for s in segments if not s.copied()]
    if missing:
        with contextlib.suppress(OSError, LogError, PySparkException, Py4JJavaError):  # checked below:
            log.make_copies([s.copy for s in missing], _spark_writer(spark))  # the rest is read as rows
    failed = [s for s in missing if not s.copied()]
    for topic, partition in {(s.topic, s.partition) for s in segments if s.tail is not None}:
        with contextlib.suppress(OSError):  # a read-only log directory keeps its copies
            log.sweep_tail_copies(topic, partition, now=time.time(), grace_s=TAIL_GRACE_S)
    return [s for s in segments if s not in failed], failed


def _native_records(spark: SparkSession, segments: Sequence[Segment], variant: bool, schema_records: bool) -> DataFrame:
    """The records of sealed segments from their format-2 Parquet copies: one scan of the copies
    the run reads whole (a rebuild's: no per-row filter, so the offset, topic and partition
    columns are not even decoded), one of the others with offsets limited to the run's [lo, hi)
    per topic-partition by literal predicates (Parquet pushes them down to row groups); key and
    event time are columns of the copy. Schema records are dropped (unless `schema_records`)
    by a per-row filter only in copies whose key statistics admit one (`may_hold_schema_records`):
    in the others (every `events.*` topic's) a projection that does not use the key never reads it."""
    from pyspark.sql import functions as F

    pkey = F.coalesce(F.col("key"), F.lit("null")).alias("pkey")
    columns = [*_ARROW.names[:8], pkey, *(["value_v"] if variant else [])]
    groups: dict[tuple[bool, bool], list[Segment]] = {}
    for s in segments:
        filtered = not schema_records and may_hold_schema_records(s.copy_path)
        groups.setdefault((s.whole, filtered), []).append(s)
    scans = []
    for (whole, filtered), group in sorted(groups.items()):
        scan = spark.read.parquet(*(str(s.copy_path) for s in group))
        if not whole:
            ranges = sorted({(s.topic, s.partition, s.lo, s.hi) for s in group})
            scan = scan.where(
                reduce(
                    operator.or_,
                    (
                        (F.col("topic") == topic)
                        & (F.col("partition") == partition)
                        & F.col("offset").between(lo, hi - 1)
                        for topic, partition, lo, hi in ranges
                    ),
                )
            )
        if filtered:
            scan = scan.where(_not_schema())
        scans.append(scan.select(*columns))
    return reduce(lambda a, b: a.unionByName(b), scans)


def may_hold_schema_records(path: Path) -> bool:
    """Whether a Parquet copy may hold a schema record, by its key column's statistics: a row
    group whose key range excludes `SCHEMA_KEY` has none (an event topic's keys are JSON
    strings, `"…"`, all below `{`). Missing or unreadable statistics say it may. Truncated
    statistics stay bounds (min ≤ every key ≤ max), so the answer is never a wrong "no"."""
    try:
        meta = pq.read_metadata(path)
    except (OSError, pa.ArrowInvalid):
        return True
    leaf = next((i for i in range(meta.num_columns) if meta.schema.column(i).path == "key"), None)
    if leaf is None:
        return True
    for g in range(meta.num_row_groups):
        stats = meta.row_group(g).column(leaf).statistics
        if meta.row_group(g).num_rows == 0:
            continue
        if stats is None or not stats.has_min_max:
            return True
        lo, hi = (v.decode() if isinstance(v, bytes) else v for v in (stats.min, stats.max))
        if lo <= SCHEMA_KEY <= hi:
            return True
    return False


_MANIFEST = "manifest.json"  # the local log's commit point: each commit replaces this file

RawRecord = tuple[str, int, int, int, str | None, str | None, str | None]  # topic … headers, JSON as text


def _not_schema() -> Column:
    """Records that are not schema records (a keyless truncate is kept)."""
    from pyspark.sql import functions as F

    return F.col("key").isNull() | (F.col("key") != F.lit(SCHEMA_KEY))


def _custom(p: Projection) -> bool:
    """The projection brings its own key or event time (Python), instead of the log's defaults."""
    return p.key is not None or p.event_time is not None


def _batches(p: Projection, records: Iterable[RawRecord]) -> Iterator[pa.RecordBatch]:
    """Arrow batches of RECORD_SCHEMA: each record with its key and event time (Python path)."""
    custom = _custom(p)
    cols: dict[str, list[Any]] = {f: [] for f in _ARROW.names}

    def flush() -> pa.RecordBatch:
        batch = pa.RecordBatch.from_pydict(cols, schema=_ARROW)
        for v in cols.values():
            v.clear()
        return batch

    skip_schema = not p.schema_records
    for topic, partition, offset, timestamp, key, value, headers in records:
        if skip_schema and key == SCHEMA_KEY:
            continue
        if custom:
            r = prepare(p, decode(topic, partition, offset, timestamp, key, value, headers))
            event_time = r.event_time
            found = unit_key(p, r)
            if found is None:  # the projection's key function dropped it
                continue
            pkey = found
        else:  # log keys are canonical JSON already (sorted keys, no whitespace)
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
    return _in_range(read_split(_split(s)), s["lo"], s["hi"])


def _in_range(records: Iterable[Record], lo: int, hi: int) -> Iterator[RawRecord]:
    """The records of offsets [lo, hi) of a partition's records in offset order, as RawRecord."""
    for rec in records:
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


_RAW = LOG_RECORD
_RAW_SCHEMA = _ddl(_RAW)


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


RecordsOf = Callable[[Iterator[pa.RecordBatch]], Iterator[RawRecord]]  # planned rows → their records


def _reader(
    modules: tuple[str, ...],
    mirror: tuple[str, ...],
    name: str,
    columns: bool = False,
    records: RecordsOf | None = None,
) -> ArrowMap:
    """A mapInArrow function: row splits (or Parquet rows, `columns=True`; or what `records`
    reads from its planned rows) → RECORD_SCHEMA."""

    def read(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        p = resolve(modules, mirror, name)
        found = records if records is not None else _column_records if columns else _split_records
        yield from _batches(p, found(batches))

    return read


def rows_frame(p: Projection, planned: DataFrame, raw: ArrowMap, reader: ArrowMap) -> DataFrame:
    """The records of planned rows (a DataFrame of splits, or of Kafka offset ranges) as
    RECORD_SCHEMA (+ `value_v` for a DataFrame projection): `raw` maps them to the log's seven
    record columns (a DataFrame projection with the log's key and event time: those and the
    VARIANT are then SQL, computed only if used), `reader` to RECORD_SCHEMA (Python)."""
    from pyspark.sql import functions as F

    variant = p.build is not None
    if variant and not _custom(p):  # key, event time and VARIANT in SQL, computed only if used
        return _decoded(p, planned.mapInArrow(raw, _RAW_SCHEMA))
    frame = planned.mapInArrow(reader, RECORD_SCHEMA)
    if variant:
        frame = frame.withColumn("value_v", F.expr("try_parse_json(value)"))
    return frame


def _decoded(p: Projection, rows: DataFrame) -> DataFrame:
    """The log's seven record columns → RECORD_SCHEMA + `value_v`, in SQL: schema records
    dropped (unless the projection wants them), the log's key and default event time."""
    from pyspark.sql import functions as F

    if not p.schema_records:
        rows = rows.where(_not_schema())
    rows = rows.withColumn("value_v", F.expr("try_parse_json(value)"))
    pkey = F.coalesce(F.col("key"), F.lit("null")).alias("pkey")
    return rows.select(*_ARROW.names[:7], _event_time().alias("event_time"), pkey, "value_v")


def driver_frame(spark: SparkSession, p: Projection, records: Iterable[RawRecord]) -> DataFrame:
    """A DataFrame projection's records read in the driver (few of them) as the frame `rows_frame`
    makes of the same records: an in-memory Arrow table in one partition, decoded by the same
    SQL (or, with the projection's own key or event time, the same Python), so `build` sees
    the same schema and values without a task reading the log."""
    from pyspark.sql import functions as F

    if not _custom(p):
        return _decoded(p, _arrow_frame(spark, _raw_batches(records), _RAW, _RAW_SCHEMA))
    frame = _arrow_frame(spark, _batches(p, records), _ARROW, RECORD_SCHEMA)
    return frame.withColumn("value_v", F.expr("try_parse_json(value)"))


def _arrow_frame(spark: SparkSession, batches: Iterable[pa.RecordBatch], schema: pa.Schema, ddl: str) -> DataFrame:
    """Arrow batches as a one-partition DataFrame of `ddl` (the schema `mapInArrow` declares)."""
    table = pa.Table.from_batches(list(batches), schema=schema)
    return spark.createDataFrame(table, ddl).coalesce(1)


def records_frame(
    spark: SparkSession,
    log: Log,
    *,
    modules: Sequence[str],
    mirror: Sequence[str],
    name: str,
    topics: Sequence[str],
    lo: Mapping[TP, int],
    hi: Mapping[TP, int],
    max_bytes: int = 16 << 20,
) -> DataFrame:
    """A DataFrame of the records in [lo, hi) of each topic-partition (schema RECORD_SCHEMA; for a
    DataFrame projection also `value_v`, the value as a VARIANT — shredded columns when read
    from a Parquet copy, `try_parse_json(value)` for the tail)."""
    from pyspark.sql import functions as F

    p = resolve(tuple(modules), tuple(mirror), name)
    variant = p.build is not None
    rows, sealed = plan(log, topics, lo, hi, max_bytes)
    native = None
    if sealed:
        columnar, rows_only = columnar_segments(spark, log, sealed)
        rows += [r for seg in rows_only for r in seg.splits]
        if columnar:
            native = _native_records(spark, columnar, variant and not _custom(p), p.schema_records)
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
    frame = rows_frame(p, splits, _raw_rows, _reader(tuple(modules), tuple(mirror), name))
    return frame if native is None else native.unionByName(frame)


class RecordReader(Protocol):
    """A log the driver can read records of (`LocalSource`, `KafkaSource`)."""

    def read(self, topic: str, partition: int, lo: int, hi: int) -> Iterator[RawRecord]:
        """The records of offsets [lo, hi) of one topic-partition, in offset order."""
        ...


def read_range(log: RecordReader, lo: Mapping[TP, int], hi: Mapping[TP, int]) -> Iterator[RawRecord]:
    """The records from `lo` to `hi` of each topic-partition, read in this process (no Spark
    task), in topic-partition then offset order."""
    for tp in sorted(hi):
        if hi[tp] > lo.get(tp, 0):
            yield from log.read(tp[0], tp[1], lo.get(tp, 0), hi[tp])


class LogSource(Protocol):
    """What a run reads the log through: the local log (`LocalSource`) or Kafka
    (`kafka_source.KafkaSource`), chosen by `[log] backend`."""

    def ends(self, topics: Sequence[str]) -> dict[TP, int]:
        """The committed end offset of each partition of `topics` (topics not there yet: none)."""
        ...

    def refresh(self) -> None:
        """See what was committed since (the next `ends`)."""
        ...

    watch_interval_s: float  # how often a run waiting for new records may ask for `stamp`

    def stamp(self, topics: Sequence[str]) -> object:
        """Something that changes whenever records may have been committed to `topics` since: a
        continuous run waits for new records by comparing stamps instead of running passes."""
        ...

    def records_frame(
        self,
        spark: SparkSession,
        *,
        modules: Sequence[str],
        mirror: Sequence[str],
        name: str,
        topics: Sequence[str],
        lo: Mapping[TP, int],
        hi: Mapping[TP, int],
        max_bytes: int = 16 << 20,
    ) -> DataFrame:
        """`records_frame` over this log."""
        ...

    def close(self) -> None: ...


class LocalSource:
    """The local log under `[log] root` as a `LogSource`."""

    watch_interval_s = 0.01  # a stat of one file

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.log = Log.open(root)

    def ends(self, topics: Sequence[str]) -> dict[TP, int]:
        out: dict[TP, int] = {}
        for t in topics:
            try:
                out.update({(t, i): e for i, e in enumerate(self.log.end_offsets(t))})
            except TopicNotFoundError:
                continue  # nothing captured on it yet
        return out

    def refresh(self) -> None:
        self.log.refresh()

    def stamp(self, topics: Sequence[str]) -> object:
        """The manifest file's identity: every commit replaces it (`os.replace`, a new inode)."""
        try:
            st = os.stat(self.root / _MANIFEST)
        except FileNotFoundError:
            return None
        return (st.st_ino, st.st_mtime_ns, st.st_size)

    def read(self, topic: str, partition: int, lo: int, hi: int) -> Iterator[RawRecord]:
        """The committed records of offsets [lo, hi) of one partition, read in this process."""
        return _in_range(self.log.read(topic, partition, lo), lo, hi)

    def records_frame(
        self,
        spark: SparkSession,
        *,
        modules: Sequence[str],
        mirror: Sequence[str],
        name: str,
        topics: Sequence[str],
        lo: Mapping[TP, int],
        hi: Mapping[TP, int],
        max_bytes: int = 16 << 20,
    ) -> DataFrame:
        return records_frame(
            spark, self.log, modules=modules, mirror=mirror, name=name, topics=topics, lo=lo, hi=hi, max_bytes=max_bytes
        )

    def close(self) -> None:
        self.log.close()
