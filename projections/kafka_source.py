"""Kafka as the projections' log (`[log] backend = "kafka"`, docs/kafka.md).

The driver plans: per topic-partition the offset range [lo, hi) of a run, `lo` from the
checkpoints the Store keeps in the service database and `hi` the partition's end for a
read_committed reader — the last stable offset (a `read_committed` consumer's
`get_watermark_offsets` asks the broker with its isolation level: librdkafka ≥ 1.8), so an open
transaction is neither waited on nor read past. Nothing of the records passes through the driver.

The executors read: one row per (topic, partition, lo, hi) sub-range (a partition's range is cut
into pieces of at most `split_offsets` offsets so large partitions parallelise), and `mapInArrow`
tasks that each assign a read_committed consumer to their ranges (no group offsets: assigned,
never committed) and yield the records through the same paths as the local log's row splits
(`source.rows_frame`), so the DataFrame has the schema, event time and keys `records_frame` gives
for the local log. Offsets in Kafka are not contiguous (transaction markers, aborted records): a
range ends at the first record at or past `hi`, or at the partition's end.

confluent_kafka is imported where a client is made (the executors import this module).
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from tributary.log.kafka.clients import consumer_config
from tributary.log.kafka.codec import log_headers, log_key, one_line
from tributary.log.kafka.options import KafkaOptions
from tributary.projections.errors import RunError
from tributary.projections.loader import resolve
from tributary.projections.source import TP, ArrowMap, RawRecord, RecordsOf, _raw_batches, _reader, rows_frame

if TYPE_CHECKING:
    from confluent_kafka import Consumer
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["KafkaSource", "offset_ranges"]

SPLIT_OFFSETS = 100_000  # offsets per executor task, at most
TIMEOUT_S = 30.0  # metadata, end offsets; an executor waiting for its next record
_RANGE_SCHEMA = "topic string, partition int, lo long, hi long"
_CONSUME = 1000  # records per consume() call


def offset_ranges(
    topics: Sequence[str], lo: Mapping[TP, int], hi: Mapping[TP, int], split_offsets: int
) -> list[tuple[str, int, int, int]]:
    """(topic, partition, lo, hi) pieces of [lo, hi) per topic-partition of `topics` (lo
    defaults to 0), each at most `split_offsets` offsets wide."""
    out: list[tuple[str, int, int, int]] = []
    wanted = set(topics)
    for (topic, partition), stop in sorted(hi.items()):
        if topic not in wanted:
            continue
        start = lo.get((topic, partition), 0)
        while start < stop:
            end = min(start + split_offsets, stop)
            out.append((topic, partition, start, end))
            start = end
    return out


def _consumer_config(options: KafkaOptions, purpose: str) -> dict[str, Any]:
    """The planner's and the tasks' consumers: assigned partitions, nothing stored."""
    return consumer_config(
        options,
        purpose=purpose,
        extra={
            "enable.auto.offset.store": False,
            "enable.partition.eof": True,
            "auto.offset.reset": "earliest",  # a range below the log's start (retention) reads from its start
        },
    )


def _text(raw: bytes | None) -> str | None:
    return None if raw is None else raw.decode()


def _read_range(consumer: Consumer, topic: str, partition: int, lo: int, hi: int) -> Iterator[RawRecord]:
    """The committed records of offsets [lo, hi) of one partition: until the first record at or
    past `hi` or the partition's end (a read_committed reader's end: the last stable offset)."""
    from confluent_kafka import KafkaError, TopicPartition

    consumer.assign([TopicPartition(topic, partition, lo)])
    deadline = time.monotonic() + TIMEOUT_S
    while True:
        msgs = consumer.consume(_CONSUME, 0.5)
        if not msgs:
            if time.monotonic() > deadline:
                raise RunError(f"timed out reading {topic}/{partition} from Kafka at offset {lo} (range ends at {hi})")
            continue
        deadline = time.monotonic() + TIMEOUT_S
        for msg in msgs:
            error = msg.error()
            if msg.topic() != topic or msg.partition() != partition:
                continue  # not this range's (an earlier assignment's, already left)
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    at = msg.offset()
                    if at is not None and at < lo:
                        continue  # an end reached before this assignment's position
                    return
                raise RunError(f"reading {topic}/{partition} from Kafka: {error.str()}")
            offset = msg.offset()
            assert offset is not None  # a record read has one
            if offset < lo:
                continue
            if offset >= hi:
                return
            lo = offset + 1
            yield (
                topic,
                partition,
                offset,
                msg.timestamp()[1],
                _text(log_key(msg.key())),
                _text(msg.value()),
                _text(log_headers(msg.headers())),
            )


def _range_records(options: KafkaOptions) -> RecordsOf:
    """A function of planned offset ranges (Arrow batches of _RANGE_SCHEMA) → their records, read
    by one consumer per task."""

    def records(batches: Iterator[pa.RecordBatch]) -> Iterator[RawRecord]:
        from confluent_kafka import Consumer, KafkaException

        try:
            consumer = Consumer(_consumer_config(options, "projection"))
        except KafkaException as exc:
            raise RunError(f"Kafka at {options.bootstrap_servers}: {one_line(exc)}") from None
        try:
            for batch in batches:
                for r in batch.to_pylist():
                    yield from _read_range(consumer, r["topic"], r["partition"], r["lo"], r["hi"])
        except KafkaException as exc:
            raise RunError(f"Kafka at {options.bootstrap_servers}: {one_line(exc)}") from None
        finally:
            consumer.close()

    return records


def _raw_rows(options: KafkaOptions) -> ArrowMap:
    """A mapInArrow function: offset ranges → their records' first seven RECORD_SCHEMA columns."""
    records = _range_records(options)

    def rows(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        yield from _raw_batches(records(batches))

    return rows


class KafkaSource:
    """The topics of `[log.kafka]` as a `source.LogSource`: ends from the driver, records from
    the executors."""

    def __init__(self, options: KafkaOptions, *, split_offsets: int = SPLIT_OFFSETS, timeout_s: float = TIMEOUT_S):
        self.opts = options
        self.split_offsets = split_offsets
        self.timeout_s = timeout_s
        self._consumer: Consumer | None = None

    def _fail(self, exc: BaseException) -> RunError:
        return RunError(f"Kafka at {self.opts.bootstrap_servers}: {one_line(exc)}")

    def _driver(self) -> Consumer:
        from confluent_kafka import Consumer, KafkaException

        if self._consumer is None:
            try:
                self._consumer = Consumer(_consumer_config(self.opts, "planner"))
            except KafkaException as exc:
                raise self._fail(exc) from None
        return self._consumer

    def ends(self, topics: Sequence[str]) -> dict[TP, int]:
        """Each partition's last stable offset (read_committed end) of the `topics` that exist."""
        from confluent_kafka import KafkaException, TopicPartition

        from tributary.log.kafka.read import watermarks  # confluent_kafka at import: where a client is made

        consumer = self._driver()
        out: dict[TP, int] = {}
        try:
            meta = consumer.list_topics(timeout=self.timeout_s).topics
            for topic in topics:
                found = meta.get(topic)
                if found is None or found.error is not None or not found.partitions:
                    continue  # nothing captured on it yet
                for p in sorted(found.partitions):
                    out[(topic, p)] = watermarks(consumer, TopicPartition(topic, p), self.timeout_s)[
                        1
                    ]  # a leader moving: asked again
        except KafkaException as exc:
            raise self._fail(exc) from None
        return out

    def refresh(self) -> None:
        """Nothing to do: `ends` asks the brokers each time."""

    watch_interval_s = 0.1  # each stamp asks the brokers

    def stamp(self, topics: Sequence[str]) -> object:
        """The partitions' ends: they move when records are committed."""
        return self.ends(topics)

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
        """The records of offsets [lo, hi) per topic-partition (`source.records_frame`'s schema;
        `max_bytes` is the local log's and not used here)."""
        p = resolve(tuple(modules), tuple(mirror), name)
        rows = offset_ranges(topics, lo, hi, self.split_offsets)
        planned = spark.createDataFrame(rows, _RANGE_SCHEMA)
        if rows:
            planned = planned.repartition(len(rows))
        tasks = KafkaOptions(bootstrap_servers=self.opts.bootstrap_servers, client=dict(self.opts.client))  # shipped
        reader = _reader(tuple(modules), tuple(mirror), name, records=_range_records(tasks))
        return rows_frame(p, planned, _raw_rows(tasks), reader)

    def close(self) -> None:
        if self._consumer is not None:
            consumer, self._consumer = self._consumer, None
            consumer.close()
