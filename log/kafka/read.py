"""Reading capture's topics back from Kafka (`[log] backend = "kafka"`, docs/kafka.md): what the
local log's readers do on its files, done here with `read_committed` consumers.

* `kafka_live_keys`: the keys of a topic whose latest committed record is not a tombstone, as a
  re-snapshot and a chunked snapshot's key check need them (capture/snapshot/initial.py
  `live_keys`). Records are fetched in batches into a prefetch queue of `SCAN_KBYTES` and dropped
  once their key is counted: what stays is the set of live keys, as on the local log.
* `kafka_positions`: the sources' positions in the offsets topic (latest value per key).
* `kafka_topics`, `kafka_records`, `kafka_cat` (`--follow` included): `tributary log topics` /
  `log cat`.
* `kafka_verify`: `tributary log verify` on Kafka. The broker checks its own log files (a batch's
  CRC on every fetch, replication): this checks what capture relies on instead — the offsets topic,
  each source's position, and every topic's partitions (a leader each, in sync replicas).

Each function opens a consumer of its own (no consumer group joined, nothing committed) and
closes it before it returns: any thread may call them, beside the capture loop's producer.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, BinaryIO

import orjson
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, TopicPartition

from tributary.log.kafka.clients import consumer_config
from tributary.log.kafka.codec import as_record, log_key, one_line
from tributary.log.kafka.options import KafkaOptions
from tributary.log.local import LogError, Record, TopicNotFoundError, TopicSummary
from tributary.log.local.admin import SCHEMA_KEY, latest_per_key

__all__ = [
    "committed_reader",
    "watermarks",
    "SCAN_KBYTES",
    "KafkaCheck",
    "kafka_cat",
    "kafka_live_keys",
    "kafka_positions",
    "kafka_records",
    "kafka_topics",
    "kafka_verify",
]

_TIMEOUT_S = 30.0  # metadata, watermarks; reading to the end without any progress
SCAN_KBYTES = 8192  # a key scan's prefetch queue (librdkafka `queued.max.messages.kbytes`)
_BATCH = 1000  # messages taken from the consumer at a time
_POLL_S = 0.5  # how long a poll waits: a `--follow` sees a stop request this often


# A topic just created whose leader has not learnt it yet, a leader moving after its broker died:
# the broker says so with these, and asked again a moment later it answers.
_MOVING = frozenset(
    {KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE}
)


def watermarks(consumer: Consumer, partition: TopicPartition, timeout_s: float = _TIMEOUT_S) -> tuple[int, int]:
    """A partition's (low, high) watermarks, asked again while its leader is moving (up to `timeout_s`)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            low, high = consumer.get_watermark_offsets(partition, timeout_s)
            return low, high
        except KafkaException as exc:
            error = exc.args[0] if exc.args else None
            if not isinstance(error, KafkaError) or error.code() not in _MOVING or time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def committed_reader(options: KafkaOptions, **extra: Any) -> Consumer:
    """A read_committed consumer that joins no group (partitions are assigned) and commits nothing:
    every reader of capture's topics and offsets topic (capture's own start included)."""
    settings = {"enable.partition.eof": True, "auto.offset.reset": "earliest", **extra}
    return Consumer(consumer_config(options, purpose="cli", extra=settings))


def _partition_count(consumer: Consumer, options: KafkaOptions, topic: str) -> int | None:
    """How many partitions `topic` has; None if the cluster has no such topic."""
    meta = consumer.list_topics(topic, timeout=_TIMEOUT_S).topics.get(topic)
    if meta is None or meta.error is not None or not meta.partitions:
        return None
    return len(meta.partitions)


def _messages(
    consumer: Consumer,
    topic: str,
    parts: list[int],
    *,
    ends: dict[int, int] | None = None,
    follow: bool = False,
    stop: Callable[[], bool] | None = None,
) -> Iterator[Any]:
    """The committed messages of the assigned `parts`, each partition in offset order. Yields None
    once, when every partition has reached its end (its end then, or `ends[p]` if given: records
    from there on are not yielded); without `follow` it returns there, with it it keeps waiting
    for new records until `stop()` is true."""
    pending = set(parts)
    deadline = time.monotonic() + _TIMEOUT_S
    if not pending:
        yield None
        return

    def reached(p: int) -> bool:
        pending.discard(p)
        return not pending

    while True:
        if stop is not None and stop():
            return
        msgs = consumer.consume(_BATCH, _POLL_S)
        if not msgs:
            if pending and time.monotonic() > deadline:
                raise LogError(f"timed out reading {topic!r} from Kafka")
            continue
        deadline = time.monotonic() + _TIMEOUT_S
        for msg in msgs:
            error = msg.error()
            p = msg.partition()
            if error is not None:
                if error.code() != KafkaError._PARTITION_EOF:
                    raise LogError(f"reading {topic!r} from Kafka: {error.str()}")
                if p in pending and reached(p):
                    yield None
                    if not follow:
                        return
                continue
            if ends is not None and p in ends:
                offset = msg.offset()
                assert offset is not None  # a record read has one
                if offset >= ends[p]:  # written after the scan began
                    if p in pending and reached(p):
                        yield None
                        return
                    continue
                if offset + 1 >= ends[p] and p in pending and reached(p):
                    yield msg
                    yield None
                    return
            yield msg


# -- live keys and positions (capture's own reads) -------------------------------------------------


def kafka_live_keys(options: KafkaOptions, topic: str) -> set[bytes]:
    """The keys of `topic` whose latest committed record is not a tombstone (schema records and
    keyless records aside), up to each partition's end when the scan began: what a compacted read
    shows, as `live_keys` of the local log. An unknown topic has none."""
    fetch = max(SCAN_KBYTES << 10, int(options.client.get("message.max.bytes", 0)))  # at least one record
    consumer = committed_reader(options, **{"queued.max.messages.kbytes": SCAN_KBYTES, "fetch.max.bytes": fetch})
    live: set[bytes] = set()
    add, discard = live.add, live.discard
    try:
        n = _partition_count(consumer, options, topic)
        if n is None:
            return live
        ends: dict[int, int] = {}
        for p in range(n):
            low, high = watermarks(consumer, TopicPartition(topic, p))
            if high > low:
                ends[p] = high
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in ends])
        for msg in _messages(consumer, topic, list(ends), ends=ends):
            if msg is None:
                break
            key = log_key(msg.key())
            if key is None or key == SCHEMA_KEY:
                continue
            if msg.value() is None:
                discard(key)
            else:
                add(key)
        return live
    except KafkaException as exc:
        raise LogError(f"Kafka at {options.bootstrap_servers}: {one_line(exc)}") from None
    finally:
        consumer.close()


def kafka_positions(options: KafkaOptions) -> dict[str, str]:
    """The offsets topic's latest committed value per key (a tombstone drops the key): each
    source's position, and a chunked snapshot's context (`<source>#snapshot`)."""
    topic = options.offsets_topic
    consumer = committed_reader(options)
    found: dict[str, str] = {}
    try:
        n = _partition_count(consumer, options, topic)
        if n is None:
            raise TopicNotFoundError(f"no offsets topic {topic!r} on Kafka at {options.bootstrap_servers}")
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(n)])
        for msg in _messages(consumer, topic, list(range(n))):
            if msg is None:
                break
            key, value = msg.key(), msg.value()
            if key is None:
                continue
            if value is None:
                found.pop(key.decode(), None)
            else:
                found[key.decode()] = value.decode()
        return found
    except KafkaException as exc:
        raise LogError(f"Kafka at {options.bootstrap_servers}: {one_line(exc)}") from None
    finally:
        consumer.close()


# -- `tributary log topics` / `log cat` -------------------------------------------------------------


def kafka_topics(options: KafkaOptions, *, timeout_s: float = _TIMEOUT_S) -> list[TopicSummary]:
    """Each topic (internal ones aside) in the shape of the local log's `admin.topics`:
    partitions, start and end offsets (low and high watermarks), and `records` = the offsets
    between them (transaction markers included: Kafka does not count records). `policy` is
    "broker": the topic's `cleanup.policy` is the cluster's to keep."""
    consumer = committed_reader(options)
    try:
        meta = consumer.list_topics(timeout=timeout_s)
        rows: list[TopicSummary] = []
        for name in sorted(meta.topics):
            topic = meta.topics[name]
            if name.startswith("__") or topic.error is not None:
                continue
            marks = [watermarks(consumer, TopicPartition(name, p), timeout_s) for p in sorted(topic.partitions)]
            starts, ends = [lo for lo, _ in marks], [hi for _, hi in marks]
            rows.append(
                {
                    "topic": name,
                    "partitions": len(marks),
                    "policy": "broker",
                    "records": sum(hi - lo for lo, hi in marks),
                    "start_offsets": starts,
                    "end_offsets": ends,
                    "compaction": None,
                }
            )
        return rows
    except KafkaException as exc:
        raise LogError(f"Kafka at {options.bootstrap_servers}: {one_line(exc)}") from None
    finally:
        consumer.close()


def _stream(
    options: KafkaOptions,
    topic: str,
    *,
    partition: int | None,
    from_offset: int,
    follow: bool,
    stop: Callable[[], bool] | None,
) -> Iterator[Record | None]:
    """`topic`'s committed records from `from_offset`; None once when caught up (see `_messages`)."""
    consumer = committed_reader(options)
    try:
        n = _partition_count(consumer, options, topic)
        if n is None:
            raise TopicNotFoundError(f"no topic {topic!r} on Kafka at {options.bootstrap_servers}")
        if partition is not None and not 0 <= partition < n:
            raise LogError(f"topic {topic!r} has partitions 0..{n - 1}, not {partition}")
        parts = [partition] if partition is not None else list(range(n))
        consumer.assign([TopicPartition(topic, p, from_offset) for p in parts])
        # Up to the end when the read began (what is committed now): a writer that goes on
        # committing (heartbeats, a busy table) must not keep the read from ever ending.
        ends = None if follow else {p: watermarks(consumer, TopicPartition(topic, p))[1] for p in parts}
        for msg in _messages(consumer, topic, parts, ends=ends, follow=follow, stop=stop):
            yield None if msg is None else as_record(topic, msg)
    except KafkaException as exc:
        raise LogError(f"Kafka at {options.bootstrap_servers}: {one_line(exc)}") from None
    finally:
        consumer.close()


def kafka_records(
    options: KafkaOptions, topic: str, *, partition: int | None = None, from_offset: int = 0
) -> Iterator[Record]:
    """The committed records of `topic` (read_committed) from `from_offset` to the end now, each
    partition in offset order."""
    for record in _stream(options, topic, partition=partition, from_offset=from_offset, follow=False, stop=None):
        if record is not None:
            yield record


def kafka_cat(
    options: KafkaOptions,
    topic: str,
    *,
    partition: int | None = None,
    from_offset: int = 0,
    compacted: bool = False,
    follow: bool = False,
    stop: Callable[[], bool] | None = None,
    out: BinaryIO | None = None,
) -> int:
    """`log cat` on Kafka: one JSON line per committed record (`Record.to_json`); `compacted` =
    the latest record per key of what the topic holds now. `follow`: then keep printing the
    records committed later, each as soon as it is read, until `stop()` is true (checked at least
    every half second). Returns how many lines were written."""
    stream = out if out is not None else sys.stdout.buffer
    written = 0
    held: list[Record] | None = [] if compacted else None
    for record in _stream(options, topic, partition=partition, from_offset=from_offset, follow=follow, stop=stop):
        if record is None:  # caught up
            for r in latest_per_key(held) if held is not None else ():  # the local log's `cat --compacted` view
                stream.write(r.to_json() + b"\n")
                written += 1
            held = None
            stream.flush()
            continue
        if held is not None:
            held.append(record)
            continue
        stream.write(record.to_json() + b"\n")
        written += 1
        if follow:
            stream.flush()
    stream.flush()
    return written


# -- `tributary log verify` -----------------------------------------------------------------------


@dataclass
class KafkaCheck:
    """What `kafka_verify` found: `problems` fail the check, `notes` and `warnings` inform."""

    notes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def kafka_verify(options: KafkaOptions, sources: list[str]) -> KafkaCheck:
    """The offsets topic exists (one partition) and holds a position for each of `sources`;
    every topic's partitions are numbered 0..n-1, each with a leader (a partition without one can
    be neither written nor read); fewer in-sync replicas than replicas is a warning."""
    check = KafkaCheck()
    consumer = committed_reader(options)
    try:
        meta = consumer.list_topics(timeout=_TIMEOUT_S)
    except KafkaException as exc:
        raise LogError(f"Kafka at {options.bootstrap_servers}: {one_line(exc)}") from None
    finally:
        consumer.close()
    offsets = options.offsets_topic
    topics = 0
    partitions = 0
    for name in sorted(meta.topics):
        topic = meta.topics[name]
        if name.startswith("__") and name != offsets:
            continue
        if topic.error is not None:
            check.problems.append(f"topic {name}: {topic.error.str()}")
            continue
        ids = sorted(topic.partitions)
        if ids != list(range(len(ids))):
            check.problems.append(f"topic {name}: partitions {ids}, not 0..{len(ids) - 1}")
        for p in ids:
            part = topic.partitions[p]
            if part.error is not None:
                check.problems.append(f"{name}[{p}]: {part.error.str()}")
            elif part.leader < 0:
                check.problems.append(f"{name}[{p}]: no leader (neither writable nor readable)")
            elif len(part.isrs) < len(part.replicas):
                check.warnings.append(f"{name}[{p}]: {len(part.isrs)} of {len(part.replicas)} replicas in sync")
        if name != offsets:
            topics += 1
            partitions += len(ids)
    if offsets not in meta.topics or meta.topics[offsets].error is not None:
        check.problems.append(f"no offsets topic {offsets!r}: capture has not run against this cluster")
        return check
    count = len(meta.topics[offsets].partitions)
    if count != 1:
        check.warnings.append(f"the offsets topic {offsets!r} has {count} partitions (capture writes to the first)")
    if check.problems:
        return check
    positions = kafka_positions(options)
    for source in sources:
        position = positions.get(source)
        own = sum(1 for name in meta.topics if name.startswith(f"{source}."))
        if position is None:
            check.notes.append(f"source {source}: no position yet (capture has not committed for it), {own} topic(s)")
        elif position == "0/0":
            check.notes.append(
                f"source {source}: a new snapshot is under way (it restarts from scratch), {own} topic(s)"
            )
        else:
            check.notes.append(f"source {source}: position {position}, {own} topic(s)")
        if f"{source}#snapshot" in positions:
            context = orjson.loads(positions[f"{source}#snapshot"])
            if context.get("pending"):
                check.notes.append(f"source {source}: chunked snapshot pending for {', '.join(context['pending'])}")
    for name in sorted(positions):
        base = name.partition("#")[0]
        if base not in sources and name == base:
            check.notes.append(f"position of {name} (not a source of this config): {positions[name]}")
    check.notes.append(f"{topics} topic(s), {partitions} partition(s), each with a leader")
    return check
