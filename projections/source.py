"""The log as a Spark DataFrame: committed splits read in parallel by `mapInArrow` tasks.

The driver plans splits (path, byte range) from one manifest snapshot and ships only those;
each task reads its byte ranges with `capture.log.read_split`, keeps offsets in the run's
[from, to) range per partition, decodes the JSON once to find the key and event time, and emits
Arrow batches. Nothing of the log passes through the driver.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import pyarrow as pa
from orjson import loads

from capture.log import Log, Split, read_split
from projections.codec import canonical
from projections.engine import prepare
from projections.loader import resolve
from projections.records import decode, default_event_time

__all__ = ["RECORD_SCHEMA", "TP", "plan", "records_frame"]

TP = tuple[str, int]
RECORD_SCHEMA = (
    "topic string, partition int, offset long, timestamp long, key string, "
    "value string, headers string, event_time long, pkey string"
)
_SPLIT_SCHEMA = (
    "topic string, partition int, path string, start_byte long, end_byte long, first_offset long, lo long, hi long"
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


def plan(
    log: Log, topics: Sequence[str], lo: Mapping[TP, int], hi: Mapping[TP, int], max_bytes: int
) -> list[tuple[Any, ...]]:
    """Splits holding offsets in [lo, hi) per topic-partition (splits wholly before lo skipped)."""
    rows: list[tuple[Any, ...]] = []
    for topic in topics:
        splits: list[Split] = log.splits(topic, max_bytes=max_bytes)
        for i, s in enumerate(splits):
            tp = (topic, s.partition)
            start, stop = lo.get(tp, 0), hi.get(tp, 0)
            nxt = splits[i + 1] if i + 1 < len(splits) and splits[i + 1].partition == s.partition else None
            if start >= stop or s.first_offset >= stop or (nxt is not None and nxt.first_offset <= start):
                continue
            rows.append(
                (
                    s.topic,
                    s.partition,
                    s.path,
                    s.start_byte,
                    s.end_byte,
                    s.first_offset,
                    start,
                    stop,
                )
            )
    return rows


def _reader(modules: tuple[str, ...], mirror: tuple[str, ...], name: str):  # type: ignore[no-untyped-def]
    def read(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        p = resolve(modules, mirror, name)
        custom = p.key is not None or p.event_time is not None
        cols: dict[str, list[Any]] = {f: [] for f in _ARROW.names}

        def flush() -> pa.RecordBatch:
            batch = pa.RecordBatch.from_pydict(cols, schema=_ARROW)
            for v in cols.values():
                v.clear()
            return batch

        for batch in batches:
            for s in batch.to_pylist():
                split = Split(
                    s["topic"],
                    s["partition"],
                    s["path"],
                    s["start_byte"],
                    s["end_byte"],
                    s["first_offset"],
                )
                lo, hi = s["lo"], s["hi"]
                for rec in read_split(split):
                    if rec.offset < lo:
                        continue
                    if rec.offset >= hi:
                        break
                    value = None if rec.value is None else rec.value.decode()
                    if custom:
                        r = prepare(
                            p,
                            decode(
                                rec.topic,
                                rec.partition,
                                rec.offset,
                                rec.timestamp,
                                rec.key,
                                rec.value,
                                rec.headers,
                            ),
                        )
                        event_time = r.event_time
                        pkey = canonical(p.key(r) if p.key is not None else r.key)
                    else:  # log keys are canonical JSON already (DESIGN.md "Topics, keys, records")
                        event_time = default_event_time(
                            rec.topic, None if value is None else loads(value), rec.timestamp
                        )
                        pkey = "null" if rec.key is None else rec.key.decode()
                    cols["topic"].append(rec.topic)
                    cols["partition"].append(rec.partition)
                    cols["offset"].append(rec.offset)
                    cols["timestamp"].append(rec.timestamp)
                    cols["key"].append(None if rec.key is None else rec.key.decode())
                    cols["value"].append(value)
                    cols["headers"].append(None if rec.headers is None else rec.headers.decode())
                    cols["event_time"].append(event_time)
                    cols["pkey"].append(pkey)
                    if len(cols["offset"]) >= _BATCH:
                        yield flush()
        if cols["offset"]:
            yield flush()

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
    """A DataFrame of the records in [lo, hi) of each topic-partition (schema RECORD_SCHEMA)."""
    rows = plan(log, topics, lo, hi, max_bytes)
    splits = spark.createDataFrame(rows, _SPLIT_SCHEMA)
    if rows:
        splits = splits.repartition(len(rows))
    return splits.mapInArrow(_reader(tuple(modules), tuple(mirror), name), RECORD_SCHEMA)
