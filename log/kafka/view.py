"""`LogReader` (tributary.log.contracts) over a Kafka cluster, read_committed: the log as consumer
groups, sinks and `/streams` see it on `[log] backend = "kafka"`.

- `refresh()` asks the cluster for the bounds of the partitions of the topics in use (asked for in
  the last `wanted_s`) in two batched ListOffsets requests (earliest, and latest under
  read_committed = the last stable offset), and for the topic list at most every
  `metadata_interval_s`; `version` moves when a bound or the topic set changed. A topic's first
  `bounds()` asks the cluster at once.
- `read()` takes a reader from a small pool of `Consumer`s (never one per read): a reader that
  stopped exactly where the next read starts goes on with what it already fetched, any other is
  assigned the partition at the offset. Reads end at the last stable offset seen by the last refresh.
- Offsets are not contiguous on Kafka (transaction markers take one each): `compacted()` is True for
  every topic (a read moves to the next existing offset), and `skips_markers` tells the coordinator
  that a read which ended by itself reached the partition's end, so a position at a marker moves on.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition

from tributary.log.kafka.clients import consumer_config
from tributary.log.kafka.codec import as_record, one_line
from tributary.log.kafka.options import KafkaOptions
from tributary.log.local import LogError, Record

__all__ = ["KafkaView"]

_TIMEOUT_S = 10.0  # one request to the cluster
_READ_IDLE_S = 10.0  # a read that gets nothing for this long (the cluster is gone) fails
_BATCH = 500  # messages taken from a reader's queue at once
_WANTED_S = 600.0  # a topic no one asked about for this long is no longer polled


@dataclass(slots=True)
class _Reader:
    consumer: Consumer
    at: tuple[str, int, int] | None = None  # (topic, partition, next offset) where it stopped
    pending: deque[Message] = field(default_factory=deque)


class KafkaView:
    """Partitions, bounds (low watermark, last stable offset), reads and time lookups on Kafka;
    thread-safe."""

    root = None  # no local files to watch: waiters poll (`refresh`)
    skips_markers = True

    def __init__(self, options: KafkaOptions, *, max_readers: int = 8, metadata_interval_s: float = 1.0) -> None:
        self.options = options
        self.where = f"Kafka at {options.bootstrap_servers}"
        self.max_readers = max_readers
        self.metadata_interval_s = metadata_interval_s
        self._lock = threading.Lock()  # the metadata client and the caches
        self._meta = Consumer(consumer_config(options, purpose="groups"))
        self._topics: dict[str, int] = {}
        self._topics_at = -1e9
        self.ends: dict[tuple[str, int], tuple[int, int]] = {}
        self._wanted: dict[str, float] = {}  # topic -> when its bounds were last asked for
        self.refreshed_at = 0.0
        self.version = 0
        self._readers: list[_Reader] = []
        self._idle: list[_Reader] = []
        self._readers_free = threading.Condition()
        self._closed = False

    # -- the cluster's state ------------------------------------------------------------------

    def refresh(self) -> bool:
        """Ask the cluster for the bounds of the topics in use; True when something changed since the last call."""
        with self._lock:
            if self._closed:
                return False
            try:
                now = time.monotonic()
                if now - self._topics_at >= self.metadata_interval_s:
                    meta = self._meta.list_topics(timeout=_TIMEOUT_S)
                    self._topics = {
                        name: len(t.partitions)
                        for name, t in meta.topics.items()
                        if not name.startswith("__") and t.error is None and t.partitions
                    }
                    self._topics_at = now
                fresh = now - _WANTED_S
                topics = [t for t in sorted(self._topics) if self._wanted.get(t, -1e18) >= fresh]
                ends = self._bounds(topics, keep=True)
            except KafkaException as exc:
                raise LogError(f"{self.where}: {one_line(exc)}") from None
            self.refreshed_at = time.monotonic()
            return self._swap(ends)

    def _swap(self, ends: dict[tuple[str, int], tuple[int, int]]) -> bool:
        if ends == self.ends:
            return False
        self.ends = ends
        self.version += 1
        return True

    def _bounds(self, topics: list[str], *, keep: bool) -> dict[tuple[str, int], tuple[int, int]]:
        """The bounds of `topics`' partitions; with `keep`, of those only (the others are dropped),
        else merged into the known ones."""
        tps = [(t, p) for t in topics for p in range(self._topics.get(t, 0))]
        if not tps:
            return {} if keep else dict(self.ends)
        # ListOffsets at "earliest" (-2) and "latest" (-1); under read_committed latest is the LSO
        low = self._meta.offsets_for_times([TopicPartition(t, p, -2) for t, p in tps], _TIMEOUT_S)
        high = self._meta.offsets_for_times([TopicPartition(t, p, -1) for t, p in tps], _TIMEOUT_S)
        out: dict[tuple[str, int], tuple[int, int]] = {}
        for lo, hi in zip(low, high, strict=True):
            if lo.error is not None or hi.error is not None:
                continue  # e.g. a leader moving: the partition keeps its last known bounds
            out[(lo.topic, lo.partition)] = (max(lo.offset, 0), max(hi.offset, 0))
        wanted = set(topics)
        for tp, old in self.ends.items():
            if tp not in out and (tp[0] in wanted or not keep) and tp[0] in self._topics:
                out[tp] = old
        return out

    def _want(self, topic: str) -> None:
        """Poll `topic`'s bounds from now on; the first time, ask the cluster at once."""
        now = time.monotonic()
        first = self._wanted.get(topic, -1e18) < now - _WANTED_S  # new, or no longer polled
        self._wanted[topic] = now
        if not first or topic not in self._topics:
            return  # (a topic that does not exist yet is polled once the topic list shows it)
        with self._lock:
            if self._closed:
                return
            try:
                self._swap(self._bounds([topic], keep=False))
            except KafkaException as exc:
                raise LogError(f"{self.where}: {one_line(exc)}") from None

    def refresh_if_older(self, seconds: float) -> None:
        if time.monotonic() - self.refreshed_at >= seconds:
            self.refresh()

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._meta.close()
        with self._readers_free:
            for reader in self._readers:
                reader.consumer.close()
            self._readers.clear()
            self._idle.clear()

    # -- what a group needs -------------------------------------------------------------------

    def partitions(self, topic: str) -> int:
        """The topic's partition count; 0 while it does not exist (yet)."""
        return self._topics.get(topic, 0)

    def bounds(self, topic: str, partition: int) -> tuple[int, int]:
        """(low watermark, last stable offset) of one partition; (0, 0) while it does not exist."""
        self._want(topic)
        return self.ends.get((topic, partition), (0, 0))

    def compacted(self, topic: str) -> bool:
        """Always True: transaction markers leave gaps in every topic's offsets."""
        return True

    def topic_owner(self, topic: str) -> str | None:
        """None: any transactional producer writes any Kafka topic, none owns one."""
        return None

    def offset_for_time(self, topic: str, partition: int, timestamp_ms: int) -> int:
        """The first offset whose record timestamp is >= timestamp_ms (Kafka's time index), else the end."""
        with self._lock:
            try:
                [found] = self._meta.offsets_for_times([TopicPartition(topic, partition, timestamp_ms)], _TIMEOUT_S)
            except KafkaException as exc:
                raise LogError(f"{self.where}: {one_line(exc)}") from None
        if found.error is not None or found.offset < 0:
            return self.bounds(topic, partition)[1]
        return int(found.offset)

    def read(self, topic: str, partition: int, from_offset: int) -> Iterator[Record]:
        """The committed records of one partition from `from_offset` up to its last stable offset (as
        of the last refresh), in offset order."""
        end = self.bounds(topic, partition)[1]
        if from_offset >= end:
            return iter(())
        return self._read(topic, partition, from_offset, end)

    def _read(self, topic: str, partition: int, position: int, end: int) -> Iterator[Record]:
        reader = self._take(topic, partition, position)
        try:
            idle_since = time.monotonic()
            while position < end:
                if not reader.pending:
                    got = reader.consumer.consume(_BATCH, 0)  # what is queued (a timeout would wait it out)
                    if not got:
                        one = reader.consumer.poll(0.1)  # returns as soon as one arrives
                        got = [one] if one is not None else []
                    if not got:
                        if time.monotonic() - idle_since > _READ_IDLE_S:
                            raise LogError(f"{self.where}: timed out reading {topic}/{partition} at {position}")
                        continue
                    idle_since = time.monotonic()
                    reader.pending.extend(got)
                msg = reader.pending.popleft()
                if msg.topic() != topic or msg.partition() != partition:
                    continue  # left over from the reader's previous assignment
                offset = msg.offset()
                assert offset is not None  # a message consumed has one
                error = msg.error()
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        # nothing to read below `offset` (markers or aborted records lay between); an
                        # end reported before this read's end (left queued by an earlier read) is passed
                        position = max(position, offset)
                        if offset >= end:
                            break
                        continue
                    raise LogError(f"{self.where}: reading {topic}/{partition}: {error.str()}")
                if offset < position:
                    continue  # fetched twice (a seek over prefetched data)
                position = offset + 1
                yield as_record(topic, msg)
        except (KafkaException, RuntimeError) as exc:  # RuntimeError: the view was closed meanwhile
            raise LogError(f"{self.where}: {one_line(exc)}") from None
        finally:
            reader.at = (topic, partition, position)
            self._give(reader)

    # -- the reader pool ----------------------------------------------------------------------

    def _take(self, topic: str, partition: int, offset: int) -> _Reader:
        with self._readers_free:
            while True:
                if self._closed:
                    raise LogError(f"{self.where}: the consumer groups' reader is closed")
                for reader in self._idle:
                    if reader.at == (topic, partition, offset):
                        self._idle.remove(reader)
                        return reader  # goes on with what it already fetched
                if len(self._readers) < self.max_readers:  # keep the others where they stopped
                    reader = _Reader(self._new_consumer())
                    self._readers.append(reader)
                    break
                if self._idle:
                    reader = self._idle.pop(0)  # the one idle longest
                    break
                self._readers_free.wait()
        reader.pending.clear()
        reader.at = None
        try:
            reader.consumer.assign([TopicPartition(topic, partition, offset)])
        except KafkaException as exc:
            self._give(reader)
            raise LogError(f"{self.where}: {one_line(exc)}") from None
        return reader

    def _give(self, reader: _Reader) -> None:
        with self._readers_free:
            if self._closed:
                return
            self._idle.append(reader)
            self._readers_free.notify()

    def _new_consumer(self) -> Consumer:
        return Consumer(
            consumer_config(
                self.options,
                purpose="groups",
                extra={
                    "enable.partition.eof": True,
                    "fetch.wait.max.ms": 10,
                    "auto.offset.reset": "error",  # never a silent jump: the coordinator checks bounds first
                    "queued.max.messages.kbytes": 8192,
                },
            )
        )
