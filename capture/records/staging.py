"""Records on their way into the log: staged per partition, then appended to segment files.

Snapshot and stream stage alike: each record goes to its key's partition after whatever is
already staged there (each partition keeps the source's order), staged records are appended in
batches (a bound on memory inside a huge transaction) and topics are created on first use.
Appending is not committing: records stay invisible until the daemon commits (capture/streaming/positions.py).
"""

from __future__ import annotations

import functools
from collections import defaultdict
from collections.abc import Callable, Iterable
from typing import Literal

from tributary.capture.records import envelope as env
from tributary.capture.records.routing import is_side_topic
from tributary.log import SourceWriter, TopicConfig, encode_plain, partition_for, split_partitions

__all__ = ["FLUSH_RECORDS", "Staged", "Staging", "Watch"]

FLUSH_RECORDS = 5_000  # staged records that trigger an append: bounds memory in one huge transaction

Staged = tuple[bytes | None, bytes | None, int, bytes | None]
"""(key, value, timestamp_ms, headers), as `Log.append` takes them."""


Rewrite = Callable[[str, int, list[Staged]], list[Staged]]
"""(topic, partition, records in log order) → the records the log gets."""


class Watch:
    """The keys staged to one topic while a chunked snapshot's chunk is read (capture/snapshot/chunked.py),
    by the transaction that changed them; `invalid` when the topic saw a truncate or a schema
    change meanwhile (the chunk is read again)."""

    __slots__ = ("by_xid", "invalid", "topic")

    def __init__(self, topic: str) -> None:
        self.topic = topic
        self.by_xid: defaultdict[int | None, set[bytes]] = defaultdict(set)
        self.invalid = False


class Staging:
    """One source's staged records, by (topic, partition)."""

    def __init__(
        self,
        log_: SourceWriter,
        *,
        partitions: int,
        rewrite: Rewrite | None = None,
        key_back: Callable[[bytes], bytes] | None = None,
    ) -> None:
        self.log = log_
        # Every partition's records on their way into the log, in order (`envelope = "debezium"`):
        # the fast paths that append encoded lines are then not taken. `key_back`: a rewritten key
        # → the key capture computed (`live_keys`).
        self.rewrite = rewrite
        self.key_back = key_back
        self.new_topic_partitions = partitions
        self.pending: defaultdict[tuple[str, int], list[Staged]] = defaultdict(list)
        self.count = 0  # records in `pending`
        self._partitions: dict[str, int] = {}  # topic -> partition count, once known
        self.watches: dict[str, Watch] = {}  # topics whose staged keys are collected (a chunk being read)
        self.kept: dict[str, set[bytes]] = {}  # topics whose staged keys are kept (a re-snapshot under way)
        self.xid: int | None = None  # the transaction being staged (the stream sets it), for `watches`
        self.event_topics: set[str] = set()  # topics of events (a service's outbox): kept whole, never compacted

    def watch(self, topic: str) -> Watch:
        """Collect every key staged to `topic` from now on, until `unwatch`."""
        watch = self.watches[topic] = Watch(topic)
        return watch

    def unwatch(self, topic: str) -> None:
        self.watches.pop(topic, None)

    def keep(self, topic: str) -> set[bytes]:
        """Keep every key staged to `topic` from now on (those staged and not yet appended too)
        in the set returned, until `unkeep`: a chunked re-snapshot's record of what it wrote."""
        kept = self.kept[topic] = set()
        for (name, _), records in self.pending.items():
            if name == topic:
                kept.update(r[0] for r in records if r[0] is not None)
        return kept

    def unkeep(self, topic: str) -> None:
        self.kept.pop(topic, None)

    def _watched(self, topic: str, keys: Iterable[bytes | None]) -> None:
        watch = self.watches.get(topic)
        kept = self.kept.get(topic)
        if watch is None and kept is None:
            return
        present = [k for k in keys if k is not None]
        if watch is not None:
            watch.by_xid[self.xid].update(present)
        if kept is not None:
            kept.update(present)

    def partitions(self, topic: str) -> int:
        """The topic's partition count, creating the topic on first use: CDC topics compacted
        (a key's last record is its state), a source's side topics (`.messages`, `.transactions`…)
        deleted by retention, events kept — the event store's (`events.*`) but for the streams
        deleted since (policy `tombstones`: a stream's tombstone removes its records)."""
        count = self._partitions.get(topic)
        if count is not None:
            return count
        if topic not in self.log.topics():
            retained = topic.endswith(".messages") or is_side_topic(topic)
            policy: Literal["delete", "compact", "none", "tombstones"] = "delete" if retained else "compact"
            if topic in self.event_topics:
                policy = "none"
            elif topic.startswith("events."):
                policy = "tombstones"
            self.log.create_topic(topic, TopicConfig(partitions=self.new_topic_partitions, policy=policy))
        count = self._partitions[topic] = self.log.topics()[topic].partitions
        return count

    def stage(self, outputs: Iterable[env.Output], timestamp_ms: int) -> None:
        """Each output to its key's partition; `timestamp_ms` for those that carry none."""
        pending = self.pending
        counts = self._partitions
        watches, kept = self.watches, self.kept
        collecting = bool(watches or kept)  # fixed for the batch: one test per record, not two
        staged = 0
        for out in outputs:
            topic = out.topic
            count = counts.get(topic) or self.partitions(topic)
            ts = timestamp_ms if out.timestamp_ms is None else out.timestamp_ms
            pending[(topic, partition_for(out.key, count))].append((out.key, out.value, ts, out.headers))
            staged += 1
            if collecting and (topic in watches or topic in kept):
                self._watched(topic, (out.key,))
        self.count += staged
        if self.count >= FLUSH_RECORDS:
            self.flush()

    def stage_record(self, topic: str, key: bytes, value: bytes, timestamp_ms: int) -> None:
        """One record without headers: `stage` minus the Output object (a templated INSERT)."""
        count = self._partitions.get(topic) or self.partitions(topic)
        self.pending[(topic, partition_for(key, count))].append((key, value, timestamp_ms, None))
        self.count += 1
        if self.watches or self.kept:
            self._watched(topic, (key,))
        if self.count >= FLUSH_RECORDS:
            self.flush()

    def stage_pairs(self, topic: str, pairs: list[tuple[bytes, bytes]], timestamp_ms: int) -> None:
        """(key, value) records of one topic, no headers, one timestamp (a snapshot's batch)."""
        pending = self.pending
        count = self._partitions.get(topic) or self.partitions(topic)
        for key, value in pairs:
            pending[(topic, partition_for(key, count))].append((key, value, timestamp_ms, None))
        self.count += len(pairs)
        if self.watches or self.kept:
            self._watched(topic, (key for key, _ in pairs))
        if self.count >= FLUSH_RECORDS:
            self.flush()

    def to_all_partitions(self, topic: str, key: bytes | None, value: bytes | None, timestamp_ms: int) -> None:
        """A record every partition's reader must see (a schema change, a truncate)."""
        watch = self.watches.get(topic)
        if watch is not None:
            watch.invalid = True
        for partition in range(self.partitions(topic)):
            self.pending[(topic, partition)].append((key, value, timestamp_ms, None))
            self.count += 1

    def append_run(self, topic: str, keys: list[bytes], values: list[bytes], timestamp_ms: int) -> None:
        """A run of one topic's records (no headers, one timestamp) straight into the log as
        encoded lines (`encode_plain`), each partition's after what is staged for it."""
        if self.rewrite is not None:
            for key, value in zip(keys, values, strict=True):
                self.stage_record(topic, key, value, timestamp_ms)
            return
        count = self._partitions.get(topic) or self.partitions(topic)
        if self.watches or self.kept:
            self._watched(topic, keys)
        runs = split_partitions(keys, values, count) if count > 1 else [(keys, values)]
        for partition, (ks, vs) in enumerate(runs):
            if not ks:
                continue
            self._append_staged(topic, partition)
            encode = functools.partial(encode_plain, timestamp_ms=timestamp_ms, keys=ks, values=vs)
            self.log.append_encoded(topic, partition, encode, timestamp_ms)

    def append_encoded(
        self, topic: str, partition: int, encode: Callable[[int], tuple[bytes, list[int]]], timestamp_ms: int
    ) -> None:
        """Lines encoded elsewhere (`Log.append_encoded`), after what is staged for the partition."""
        if self.rewrite is not None:
            raise AssertionError("encoded lines cannot be rewritten: the caller must stage records")
        self._append_staged(topic, partition)
        self.log.append_encoded(topic, partition, encode, timestamp_ms)

    def _append_staged(self, topic: str, partition: int) -> None:
        staged = self.pending.pop((topic, partition), None)
        if staged:
            self.count -= len(staged)
            self._append(topic, partition, staged)

    def _append(self, topic: str, partition: int, records: list[Staged]) -> None:
        if self.rewrite is not None and topic not in self.event_topics:  # events are no table's rows
            records = self.rewrite(topic, partition, records)
        if records:
            self.log.append(topic, partition, records)

    def live_keys(self, topic: str) -> set[bytes]:
        """The topic's live keys in the log (`Log.live_keys`), as capture keys records (before any rewriting)."""
        keys = self.log.live_keys(topic)
        back = self.key_back
        return keys if back is None else {back(key) for key in keys}

    def flush(self) -> None:
        """Append every staged record to the log's files (not committed: the daemon decides)."""
        for (topic, partition), records in self.pending.items():
            if records:
                self._append(topic, partition, records)
        self.pending.clear()
        self.count = 0
