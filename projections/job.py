"""The Spark side of a fold: route records to units, shuffle by unit, fold each unit in order.

`repartition(unit)` + `sortWithinPartitions(unit, topic, partition, offset)` (log order; the fold
merges a unit's topic-partitions by event time, `engine.fold_order`) + a `mapInArrow` fold that
carries state across batches: far cheaper than `applyInPandas`, which
pays a pandas round trip per group. The folding itself is `projections.engine`, the same code the
single-process reference runs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

import orjson
import pyarrow as pa

from tributary.eventstore.keys import DatabaseKeys, reveal_values
from tributary.jsonvalue import JsonValue
from tributary.projections.engine import Item, Prior, UnitOut, applies_truncates, fold_units, plan_items
from tributary.projections.joins import TableIndex, enrich, order_time
from tributary.projections.loader import resolve
from tributary.projections.records import ProjectionRecord, decode

if TYPE_CHECKING:
    import psycopg
    from pyspark import Broadcast
    from pyspark.sql import Column, DataFrame, SparkSession

ArrowMap = Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]  # a `mapInArrow` function

__all__ = [
    "ITEM_SCHEMA",
    "SUMMARY_SCHEMA",
    "TRUNCATE_COLUMNS",
    "TRUNCATE_SCHEMA",
    "deliveries",
    "fold_frame",
    "is_truncate",
    "item_of",
    "record_of",
    "items_frame",
    "stage_units",
]

TRUNCATE_SCHEMA = (
    "topic string, partition int, offset long, timestamp long, key string, value string, headers string, "
    "event_time long"
)
ITEM_SCHEMA = (
    TRUNCATE_SCHEMA
    + ", unit string, wstart long, wend long, admitted boolean, ukey string, watermark long, joined string"
)
_ITEM = pa.schema(
    [
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("timestamp", pa.int64()),
        ("key", pa.string()),
        ("value", pa.string()),
        ("headers", pa.string()),
        ("event_time", pa.int64()),
        ("unit", pa.string()),
        ("wstart", pa.int64()),
        ("wend", pa.int64()),
        ("admitted", pa.bool_()),
        ("ukey", pa.string()),
        ("watermark", pa.int64()),
        ("joined", pa.string()),
    ]
)
_REC = ("topic", "partition", "offset", "timestamp", "key", "value", "headers")


def _loads(raw: str | None) -> JsonValue:
    return None if raw is None else orjson.loads(raw)


def _record(row: Mapping[str, Any]) -> ProjectionRecord:
    r = decode(*(row[c] for c in _REC))
    joined = _loads(row.get("joined"))
    return ProjectionRecord(
        r.topic, r.partition, r.offset, r.timestamp, r.key, r.value, r.headers, row["event_time"], _joined(joined)
    )


def _joined(value: JsonValue) -> dict[str, JsonValue] | None:
    """An item's `joined` column (JSON object or null) as `ProjectionRecord.joined`."""
    return value if isinstance(value, dict) else None


def record_of(row: Mapping[str, Any]) -> ProjectionRecord:
    """A records-frame row (TRUNCATE_COLUMNS at least, as a dict) as a `ProjectionRecord`."""
    return _record(row)


def item_of(row: Mapping[str, Any]) -> Item:
    """An items-frame row (ITEM_SCHEMA, as a dict) as the engine's `Item`."""
    rec = _record(row)
    return Item(row["unit"], row["ukey"], row["wstart"], row["wend"], row["admitted"], rec, row["watermark"])


def _planner(ref: tuple[tuple[str, ...], tuple[str, ...], str], tables: Broadcast[TableIndex] | None) -> ArrowMap:
    """A task's routing: records (with `max_before`) → the items they become (ITEM_SCHEMA); with
    `tables`, each record first looks them up as of its order key (`joins.enrich`)."""

    def plan(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        p = resolve(*ref)
        index = tables.value if tables is not None else None
        truncating = applies_truncates(p)
        for batch in batches:
            out: list[dict[str, Any]] = []
            for row in batch.to_pylist():
                rec = _record(row)
                if index is not None and not p.is_table(rec.topic):
                    rec = enrich(p, rec, order_time(row["max_before"], rec), index)
                joined = None if rec.joined is None else orjson.dumps(rec.joined).decode()
                items = plan_items(p, rec, row["max_before"])
                if not items and truncating and rec.is_truncate and not p.is_table(rec.topic):
                    items = [Item("null", "null", None, None, True, rec)]  # delivered by the runner
                for it in items:
                    out.append(
                        {
                            **{c: row[c] for c in _REC},
                            "event_time": rec.event_time,
                            "unit": it.unit,
                            "wstart": it.start,
                            "wend": it.end,
                            "admitted": it.admitted,
                            "ukey": it.key,
                            "watermark": it.watermark,
                            "joined": joined,
                        }
                    )
            if out:
                yield pa.RecordBatch.from_pylist(out, schema=_ITEM)

    return plan


def items_frame(
    spark: SparkSession,
    records: DataFrame,
    ref: tuple[tuple[str, ...], tuple[str, ...], str],
    windowed: bool,
    base_max: Mapping[tuple[str, int], int | None],
    tables: Broadcast[TableIndex] | None = None,
) -> DataFrame:
    """Records → items (ITEM_SCHEMA). Windowed projections, and those with `tables` (the
    broadcast index of their tables), first get each record's `max_before` (its partition's max
    event time before it, continuing from `base_max`)."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    if not windowed and tables is None:
        return records.select(
            *_REC,
            "event_time",
            F.col("pkey").alias("unit"),
            F.lit(None).cast("long").alias("wstart"),
            F.lit(None).cast("long").alias("wend"),
            F.lit(True).alias("admitted"),
            F.col("pkey").alias("ukey"),
            F.lit(None).cast("long").alias("watermark"),
            F.lit(None).cast("string").alias("joined"),
        )
    w = Window.partitionBy("topic", "partition").orderBy("offset").rowsBetween(Window.unboundedPreceding, -1)
    before = F.max("event_time").over(w)
    bases = [(t, p, m) for (t, p), m in base_max.items() if m is not None]
    if bases:
        base_df = spark.createDataFrame(bases, "topic string, partition int, base long")
        records = records.join(F.broadcast(base_df), ["topic", "partition"], "left")
        before = F.greatest(before, F.col("base"))
    with_wm = records.withColumn("max_before", before)
    return with_wm.mapInArrow(_planner(ref, tables), ITEM_SCHEMA)


TRUNCATE_COLUMNS = (*_REC, "event_time")


def is_truncate() -> Column:
    """`ProjectionRecord.is_truncate` over a records/items frame (false, never null)."""
    from pyspark.sql import functions as F

    cond = (
        (F.coalesce(F.col("key"), F.lit("null")) == "null")
        & ~F.col("topic").startswith("events.")
        & (F.get_json_object("value", "$.op") == "t")
    )
    return F.coalesce(cond, F.lit(False))


def deliveries(truncates: DataFrame, holders: DataFrame) -> DataFrame:
    """Items (ITEM_SCHEMA) delivering each truncate (TRUNCATE_COLUMNS) to each holder
    (unit, topic, partition) of its topic-partition: `engine.truncate_items` as a join."""
    from pyspark.sql import functions as F

    return holders.join(truncates, ["topic", "partition"]).select(
        *_REC,
        "event_time",
        "unit",
        F.lit(None).cast("long").alias("wstart"),
        F.lit(None).cast("long").alias("wend"),
        F.lit(True).alias("admitted"),
        F.col("unit").alias("ukey"),
        F.lit(None).cast("long").alias("watermark"),
        F.lit(None).cast("string").alias("joined"),
    )


SUMMARY_SCHEMA = "units long, rows long, errors string"
_SUMMARY = pa.schema([("units", pa.int64()), ("rows", pa.int64()), ("errors", pa.string())])


class _Stager:
    """COPY a task's folded units into the run's staging tables (one connection per task)."""

    def __init__(self, conn: psycopg.Connection[Any], names: tuple[str, ...], schema: str) -> None:
        from psycopg import sql

        self.conn = conn
        self.copies = [sql.SQL("COPY {} FROM STDIN").format(sql.Identifier(schema, n)) for n in names]
        self.rows = 0
        self.units = 0
        self.errors: list[tuple[str, int, int, str]] = []

    def write(self, chunk: list[UnitOut]) -> None:
        rows_copy, del_copy, state_copy = self.copies[:3]
        with self.conn.cursor() as cur:
            with cur.copy(rows_copy) as cp:
                lines = [line for u in chunk for line in u.rows]
                cp.write("".join(lines))  # one block: a write per line costs a libpq call and a wait each
                self.rows += len(lines)
            with cur.copy(del_copy) as cp:
                for u in chunk:
                    for key in u.deletes:
                        cp.write_row(key)
            with cur.copy(state_copy) as cp:
                for u in chunk:
                    cp.write_row(
                        (
                            u.unit,
                            u.state,
                            None if u.last is None else orjson.dumps(u.last).decode(),
                            orjson.dumps(u.pks).decode(),
                            u.dropped,
                            None if u.tps is None else orjson.dumps(u.tps).decode(),
                        )
                    )
                    self.errors.extend(u.errors)
            if len(self.copies) > 3:  # the projection emits: its records, staged like its rows
                with cur.copy(self.copies[3]) as cp:
                    for u in chunk:
                        for e in u.emits:
                            cp.write_row((u.unit, *e))
        self.units += len(chunk)


def stage_units(
    conn: psycopg.Connection[Any],
    names: tuple[str, ...],
    units: Iterable[UnitOut],
    schema: str = "tributary_projections",
) -> dict[str, Any]:
    """COPY folded units into the staging tables `names` over `conn`, as one task does; its
    summary row (SUMMARY_SCHEMA, as a dict): what `Store.commit_folds` reads of a task."""
    stager = _Stager(conn, names, schema)
    chunk: list[UnitOut] = []
    for u in units:
        chunk.append(u)
        if len(chunk) >= 4096:
            stager.write(chunk)
            chunk = []
    if chunk:
        stager.write(chunk)
    return {
        "units": stager.units,
        "rows": stager.rows,
        "errors": orjson.dumps(stager.errors).decode() if stager.errors else None,
    }


def _folder(
    ref: tuple[tuple[str, ...], tuple[str, ...], str],
    priors: Broadcast[dict[str, Prior]] | None,
    skip_errors: bool,
    dsn: str,
    names: tuple[str, ...],
    since: Mapping[tuple[str, int], int] | None = None,
) -> ArrowMap:
    def fold(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        p = resolve(*ref)
        known: Mapping[str, Prior] = priors.value if priors is not None else {}

        keys = DatabaseKeys.from_dsn(dsn)

        def items() -> Iterator[Item]:
            for batch in batches:
                c = {name: batch.column(i).to_pylist() for i, name in enumerate(batch.schema.names)}
                for t, part, off, ts, k, v, h, et, unit, ws, we, adm, ukey, jo in zip(
                    c["topic"],
                    c["partition"],
                    c["offset"],
                    c["timestamp"],
                    c["key"],
                    reveal_values(keys, c["topic"], [_loads(v) for v in c["value"]]),
                    c["headers"],
                    c["event_time"],
                    c["unit"],
                    c["wstart"],
                    c["wend"],
                    c["admitted"],
                    c["ukey"],
                    c["joined"],
                    strict=True,
                ):
                    yield Item(
                        unit,
                        ukey,
                        ws,
                        we,
                        adm,
                        ProjectionRecord(t, part, off, ts, _loads(k), v, _loads(h), et, _joined(_loads(jo))),
                    )

        import psycopg

        with psycopg.connect(dsn, autocommit=True) as conn:
            summary = stage_units(conn, names, fold_units(p, items(), known, skip_errors=skip_errors, since=since))
        yield pa.RecordBatch.from_pylist([summary], schema=_SUMMARY)

    return fold


def fold_frame(
    spark: SparkSession,
    items: DataFrame,
    ref: tuple[tuple[str, ...], tuple[str, ...], str],
    priors: Mapping[str, Prior],
    partitions: int,
    *,
    dsn: str,
    staging: tuple[str, ...],
    skip_errors: bool = False,
    since: Mapping[tuple[str, int], int] | None = None,
) -> DataFrame:
    """Items → folded units COPYed by the tasks into `staging` (rows, deletes, states, and the
    emitted records of a projection that emits, from `since`); one summary row per task
    (SUMMARY_SCHEMA) is all that comes back to the driver."""
    bc = spark.sparkContext.broadcast(dict(priors)) if priors else None
    ordered = items.repartition(partitions, "unit").sortWithinPartitions("unit", "topic", "partition", "offset")
    return ordered.mapInArrow(_folder(ref, bc, skip_errors, dsn, staging, since), SUMMARY_SCHEMA)
