"""Kafka as capture's log: the writer side of `[log] backend = "kafka"` (docs/kafka.md).

`KafkaLog` offers what the daemon and `Staging` use of `Log` (append per partition, `mark`,
`commit(positions=…, upto=…)`, `positions()`, `topics()`, `create_topic`, `close`) with ONE
transactional producer per source (`transactional.id` = `<[log.kafka] transactional_id>-<source>`):
each source appends through its own view (`KafkaLog.source(name)`, a `KafkaSourceLog`), so every
record carries its source. Records appended wait in memory until the commit that covers them; a
commit produces, per source named, its records and its positions (to the compacted offsets topic,
key = position name) inside one Kafka transaction of that source's producer: `commit_transaction`
is the durable commit, and the daemon confirms the slots only after `commit` returned. A crash
before it leaves an open transaction that the source's next producer (`init_transactions`) aborts:
`read_committed` consumers see each change exactly once. Two capture processes with the same
source fence each other (the newer wins, the older stops with one line); different sources never
do. Positions are read back (read_committed) after the producers are initialised. Partitioning is
the caller's (Kafka's murmur2, as on the local log).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import enum
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from confluent_kafka import IsolationLevel, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import (  # type: ignore[attr-defined]  # their documented home (re-exported)
    AdminClient,
    NewTopic,
    OffsetSpec,
)

from tributary.log.kafka.clients import admin_config, producer_config, transactional_config
from tributary.log.kafka.codec import kafka_headers, kafka_key, one_line
from tributary.log.kafka.options import OFFSETS_TOPIC, KafkaOptions
from tributary.log.kafka.read import committed_reader, kafka_live_keys, watermarks
from tributary.log.local import (
    CleanerPolicy,
    LogError,
    Mark,
    RecordIn,
    TopicConfig,
    TopicNotFoundError,
    WriterFenced,
    decode_line,
)

__all__ = [
    "OFFSETS_TOPIC",
    "KafkaLog",
    "KafkaMark",
    "KafkaOptions",
    "KafkaSourceLog",
    "ProducerFenced",
    "position_owner",
    "transactional_id",
]

_TIMEOUT_S = 30.0  # metadata, topic creation, reading the offsets topic back
_ATTEMPT_S = 10.0  # one wait for a commit or an abort; retried until [log.kafka] commit_timeout_s
_VISIBLE_S = 10.0  # how long `close` waits for the last commit's markers (see `await_visible`)

_Buffered = tuple[str, str, int, bytes | None, bytes | None, int, bytes | None]  # source first
log = logging.getLogger(__name__)
_FENCED = (KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH)


@dataclass(frozen=True, slots=True)
class KafkaMark(Mark):
    """How many records had been appended: `commit(upto=…)` produces exactly those."""

    appended: int = 0


class _Step(enum.Enum):
    """Where a source's transaction stands while it is retried (`KafkaLog._transaction`)."""

    RENEW = "a new producer"
    ABORT = "abort"
    BEGIN = "begin and produce"
    COMMIT = "commit"


def _following(error: KafkaError, step: _Step) -> _Step | None:
    """The step that may cure a failed one (None: nothing will): a fatal error needs a new
    producer, a transaction that must be aborted an abort, and a retriable error of a call that
    waits on the cluster the same call again."""
    if error.fatal():
        return _Step.RENEW
    if error.txn_requires_abort():
        return _Step.ABORT
    if error.retriable() and step is not _Step.BEGIN:
        return step
    return None


class _Retry:
    """One commit's retries: each call waits at most `_ATTEMPT_S` (so a long outage is said in the
    log as it goes on), the waits between them back off, all within the deadline."""

    def __init__(self, source: str, deadline: float) -> None:
        self.source = source
        self.deadline = deadline
        self.pause = 0.2
        self.started = time.monotonic()
        self.waits = 0
        self.renewed_after_fence = False

    def expired(self) -> bool:
        return time.monotonic() >= self.deadline

    def attempt_s(self) -> float:
        return max(0.1, min(_ATTEMPT_S, self.deadline - time.monotonic()))

    def wait(self, error: KafkaError) -> None:
        left = self.deadline - time.monotonic()
        log.warning(
            "source %r: Kafka cannot take the commit yet (%s); retrying for up to %.0f s more",
            self.source,
            error.str(),
            max(0.0, left),
        )
        time.sleep(max(0.0, min(self.pause, left)))
        self.pause = min(self.pause * 2, 5.0)
        self.waits += 1

    def recovered(self) -> None:
        """Say that a commit went through after retries (the warnings before it end here)."""
        if self.waits:
            log.warning(
                "source %r: Kafka took the commit after %.0f s of retries", self.source, time.monotonic() - self.started
            )


class ProducerFenced(WriterFenced):
    """Another capture process took over a source's transactional id: this one must stop."""


def transactional_id(options: KafkaOptions, source: str) -> str:
    """The `transactional.id` of `source`'s producer: `[log.kafka] transactional_id` is its prefix."""
    return f"{options.transactional_id}-{source}"


def position_owner(name: str) -> str:
    """The source a position belongs to: its name, or a source's entry such as `shop#snapshot`."""
    return name.split("#", 1)[0]


def _policy_config(name: str, policy: str) -> dict[str, str]:
    if policy == "compact":
        return {"cleanup.policy": "compact"}
    if policy in ("none", "tombstones"):  # a broker cannot drop one key's records alone: kept whole
        return {"cleanup.policy": "delete", "retention.ms": "-1"}
    return {"cleanup.policy": "delete"}


class KafkaLog:
    """Capture's writer on Kafka (see the module's doc). Not thread-safe: the capture loop's."""

    root = None  # no local files: features that read them say so (docs/kafka.md)

    def __init__(self, options: KafkaOptions, sources: Sequence[str] = ()) -> None:
        """Initialise the producer of each source in `sources` (fencing older processes of those
        sources and aborting their open transactions), then read the positions back."""
        self.opts = options
        self.default_partitions = options.partitions
        self._buffer: list[_Buffered] = []
        self._first = 0  # appended records before `_buffer[0]` (committed or dropped)
        self._positions: dict[str, str] = {}
        self._closed = False
        self._known: dict[str, TopicConfig] = {}
        self._producers: dict[str, Producer] = {}
        self._views: dict[str, KafkaSourceLog] = {}
        self._written: set[tuple[str, int]] = set()  # data partitions appended to (await_visible)
        self._admin: AdminClient | None = None  # made by the first await_visible
        try:
            self._client = Producer(producer_config(options))  # metadata only
            for name in sources:
                self._producers[name] = self._new_producer(name)
            self._ensure_offsets_topic()
            self._positions = self._read_positions()
        except KafkaException as exc:
            raise LogError(f"Kafka at {options.bootstrap_servers}: {one_line(exc)}") from None

    def _new_producer(self, source: str) -> Producer:
        producer = Producer(transactional_config(self.opts, transactional_id(self.opts, source)))
        producer.init_transactions(_TIMEOUT_S)  # fences an older capture of this source, aborts its open transaction
        return producer

    def source(self, name: str) -> KafkaSourceLog:
        """`name`'s view of the log: what it appends is produced by its own producer. A source not
        given at start gets its producer now (and the positions are read again after it)."""
        view = self._views.get(name)
        if view is None:
            if name not in self._producers:
                self._check()
                try:
                    self._producers[name] = self._new_producer(name)
                    self._positions = self._read_positions()
                except KafkaException as exc:
                    raise LogError(f"Kafka at {self.opts.bootstrap_servers}: {one_line(exc)}") from None
            view = self._views[name] = KafkaSourceLog(self, name)
        return view

    def producer(self, source: str) -> Producer:
        """`source`'s transactional producer (`source(name)` creates it)."""
        self.source(source)
        return self._producers[source]

    # -- topics ---------------------------------------------------------------------------------
    def _metadata(self, topic: str | None = None) -> Any:
        try:
            self._client.poll(0)  # hands its queued librdkafka log lines to the logger
            return self._client.list_topics(topic, timeout=_TIMEOUT_S)
        except KafkaException as exc:
            raise LogError(f"Kafka at {self.opts.bootstrap_servers}: {one_line(exc)}") from None

    def topics(self) -> dict[str, TopicConfig]:
        found: dict[str, TopicConfig] = {}
        for name, meta in self._metadata().topics.items():
            if name.startswith("__") or meta.error is not None or not meta.partitions:
                continue
            policy: Literal["delete", "compact", "none"] = "delete" if name.endswith(".messages") else "compact"
            found[name] = self._known.get(name) or TopicConfig(partitions=len(meta.partitions), policy=policy)
        for name, cfg in self._known.items():  # created here, maybe not in the metadata yet
            found.setdefault(name, cfg)
        return found

    def create_topic(self, name: str, config: TopicConfig | None = None) -> TopicConfig:
        """Create `name` (`create_topics = true`) with the partitions asked for (the source's
        `[[sources]] partitions`, else `[log.kafka] partitions`), or check that someone else did."""
        cfg = config or TopicConfig(partitions=self.default_partitions)
        existing = self.topics().get(name)
        if existing is not None:
            return existing
        if not self.opts.create_topics:
            raise TopicNotFoundError(
                f"topic {name!r} does not exist on Kafka and [log.kafka] create_topics = false: create it "
                f"({cfg.partitions} partitions, {_describe(_policy_config(name, cfg.policy))})"
            )
        self._create(name, cfg.partitions, _policy_config(name, cfg.policy))
        self._known[name] = cfg
        return cfg

    def _create(self, name: str, partitions: int, config: dict[str, str]) -> None:
        admin = AdminClient(admin_config(self.opts))
        topic = NewTopic(name, partitions, self.opts.replication_factor, config=config)
        try:
            admin.create_topics([topic], request_timeout=_TIMEOUT_S)[name].result(_TIMEOUT_S)
        except KafkaException as exc:
            error = exc.args[0] if exc.args else None
            if not (isinstance(error, KafkaError) and error.code() == KafkaError.TOPIC_ALREADY_EXISTS):
                raise LogError(f"cannot create Kafka topic {name!r}: {one_line(exc)}") from None

    def _ensure_offsets_topic(self) -> None:
        name = self.opts.offsets_topic
        meta = self._metadata(name).topics.get(name)
        if meta is not None and meta.error is None and meta.partitions:
            return
        if not self.opts.create_topics:
            raise TopicNotFoundError(
                f"the offsets topic {name!r} does not exist on Kafka and [log.kafka] create_topics = false: "
                "create it (1 partition, cleanup.policy=compact)"
            )
        self._create(name, 1, {"cleanup.policy": "compact"})

    def end_offsets(self, topic: str) -> list[int]:
        """Each partition's high watermark."""
        meta = self._metadata(topic).topics.get(topic)
        if meta is None or meta.error is not None:
            raise TopicNotFoundError(f"no topic {topic!r} on Kafka")
        consumer = committed_reader(self.opts)
        try:
            return [watermarks(consumer, TopicPartition(topic, p))[1] for p in meta.partitions]
        finally:
            consumer.close()

    # -- positions ------------------------------------------------------------------------------
    def _read_positions(self) -> dict[str, str]:
        """The offsets topic's last committed value per key (read_committed). Read up to the end
        as it is now, the producers being initialised: every position committed so far is before
        it; a transaction another source's process left open holds the read until it ends."""
        name = self.opts.offsets_topic
        meta = self._metadata(name).topics[name]
        consumer = committed_reader(self.opts)
        found: dict[str, str] = {}
        try:
            parts = [TopicPartition(name, p, 0) for p in meta.partitions]
            ends = {p.partition: watermarks(consumer, p)[1] for p in parts}
            pending = {p for p, end in ends.items() if end > 0}
            consumer.assign(parts)
            deadline = time.monotonic() + 3 * _TIMEOUT_S  # past librdkafka's default transaction timeout
            while pending:
                if time.monotonic() > deadline:
                    raise LogError(
                        f"timed out reading the offsets topic {name!r} from Kafka (a transaction stays open there)"
                    )
                msg = consumer.poll(0.5)
                if msg is None:
                    continue
                error = msg.error()
                partition, offset = msg.partition(), msg.offset()
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        if partition is not None and (offset is None or offset >= ends[partition]):
                            pending.discard(partition)
                        continue
                    raise LogError(f"reading the offsets topic {name!r}: {error.str()}")
                if partition is not None and offset is not None and offset + 1 >= ends[partition]:
                    pending.discard(partition)
                key = msg.key()
                if key is None:
                    continue
                value = msg.value()
                if value is None:
                    found.pop(key.decode(), None)
                else:
                    found[key.decode()] = value.decode()
        except KafkaException as exc:
            raise LogError(f"reading the offsets topic {name!r}: {one_line(exc)}") from None
        finally:
            consumer.close()
        return found

    def positions(self) -> dict[str, str]:
        return dict(self._positions)

    # -- writing --------------------------------------------------------------------------------
    def _check(self) -> None:
        if self._closed:
            raise LogError("the Kafka log is closed")

    def append(self, topic: str, partition: int, records: Sequence[RecordIn], *, source: str) -> int:
        """Buffer `source`'s records for the partition; produced by the commit that covers them."""
        self._check()
        first = self._first + len(self._buffer)
        self._buffer.extend((source, topic, partition, k, v, ts, h) for k, v, ts, h in records)
        self._written.add((topic, partition))
        return first

    def mark(self) -> KafkaMark:
        self._check()
        return KafkaMark(appended=self._first + len(self._buffer))

    def committed_through(self, mark: Mark) -> bool:
        """Is every record appended before `mark` produced and committed (or dropped)?"""
        return self._first >= (mark.appended if isinstance(mark, KafkaMark) else 0)

    def commit(self, *, positions: Mapping[str, str] | None = None, upto: Mark | None = None) -> None:
        """Produce the records appended up to `upto` (all if None) and `positions`: per source, its
        records and its positions in one transaction of its producer, committed in turn (the
        daemon's group commit: one Kafka transaction per source per commit). Durable on return;
        read_committed consumers see it once the brokers wrote its markers, moments later
        (`await_visible`, and `close`, wait for that)."""
        self._check()
        if upto is None:
            take = len(self._buffer)
        else:
            appended = upto.appended if isinstance(upto, KafkaMark) else 0
            take = max(0, min(appended - self._first, len(self._buffer)))
        records: dict[str, list[_Buffered]] = {}
        for item in self._buffer[:take]:
            records.setdefault(item[0], []).append(item)
        owned: dict[str, dict[str, str]] = {}
        for name, position in (positions or {}).items():
            owned.setdefault(position_owner(name), {})[name] = position
        for source in dict.fromkeys([*records, *owned]):
            self._transaction(source, records.get(source, []), owned.get(source, {}))
            self._positions.update(owned.get(source, {}))
        del self._buffer[:take]
        self._first += take

    def _transaction(self, source: str, records: list[_Buffered], positions: dict[str, str]) -> None:
        """`source`'s records and positions in one transaction of its producer, committed. What
        the cluster cannot take yet (brokers down or restarting, a leader moving, a transaction the
        coordinator timed out) is retried as librdkafka's transactional protocol says — a timed-out
        call is made again, a transaction that must be aborted is aborted and produced anew, a
        producer that hit a fatal error is replaced by a new one (whose `init_transactions` aborts
        what the old one left open) — until `commit_timeout_s`; then capture stops with one line,
        and a fenced producer (another process took the source) stops it at once."""
        if source not in self._producers:
            self.source(source)
        retry = _Retry(source, time.monotonic() + self.opts.commit_timeout_s)
        step = _Step.BEGIN
        while True:
            producer = self._producers[source]
            try:
                if step is _Step.RENEW:
                    producer = self._producers[source] = self._new_producer(source)
                    step = _Step.BEGIN
                if step is _Step.ABORT:
                    producer.abort_transaction(retry.attempt_s())
                    step = _Step.BEGIN
                if step is _Step.BEGIN:
                    producer.begin_transaction()
                    for _, topic, partition, key, value, ts, headers in records:
                        self._produce(producer, topic, partition, key, value, ts, kafka_headers(headers))
                    for name, position in positions.items():
                        self._produce(
                            producer, self.opts.offsets_topic, 0, name.encode(), position.encode(), None, None
                        )
                    step = _Step.COMMIT
                producer.commit_transaction(retry.attempt_s())
                retry.recovered()
                return
            except KafkaException as exc:
                step = self._next_step(source, producer, exc, retry, step)

    def _next_step(self, source: str, producer: Producer, exc: KafkaException, retry: _Retry, step: _Step) -> _Step:
        """What a failed step of a transaction calls for, after a pause; or raise: fenced, not an
        error retrying cures, or out of time (the open transaction aborted first, so nothing of
        it is ever read)."""
        error = exc.args[0] if exc.args else None
        if isinstance(error, KafkaError) and error.code() in _FENCED:
            # Fenced at once: another process took the source. Fenced after the cluster failed
            # this commit: the coordinator may have timed the transaction out meanwhile (its
            # epoch bumped as a newer producer's would be); one new producer, and if that one is
            # fenced again, it is another process.
            if not retry.waits or retry.renewed_after_fence or retry.expired():
                raise ProducerFenced(
                    f"source {source!r}: another capture process took over its Kafka producer "
                    f"(transactional id {transactional_id(self.opts, source)!r}): this one stops"
                ) from None
            retry.renewed_after_fence = True
            retry.wait(error)
            return _Step.RENEW
        following = _following(error, step) if isinstance(error, KafkaError) else None
        if following is None or retry.expired():
            if step is not _Step.RENEW:
                with contextlib.suppress(KafkaException):  # else the next process's init_transactions aborts it
                    producer.abort_transaction(_TIMEOUT_S)
            within = (
                "" if following is None else f" within [log.kafka] commit_timeout_s = {self.opts.commit_timeout_s:g}"
            )
            raise LogError(f"source {source!r}: Kafka transaction failed{within}: {one_line(exc)}") from None
        assert isinstance(error, KafkaError)
        retry.wait(error)
        return following

    @staticmethod
    def _produce(
        producer: Producer,
        topic: str,
        partition: int,
        key: bytes | None,
        value: bytes | None,
        ts: int | None,
        headers: list[tuple[str, bytes]] | None,
    ) -> None:
        kwargs: dict[str, Any] = {"partition": partition, "key": kafka_key(key), "value": value}
        if ts is not None:
            kwargs["timestamp"] = ts
        if headers:
            kwargs["headers"] = headers
        while True:
            try:
                producer.produce(topic, **kwargs)
                return
            except BufferError:
                producer.poll(0.05)  # the local queue is full: let deliveries drain

    def background_cleaner(self, policy: CleanerPolicy, *, pid: int) -> None:
        """None: the broker compacts and expires its topics itself (their `cleanup.policy`)."""
        return None

    def close(self) -> None:
        """Drop what no commit covered (the sources send it again) and let the producers go, once
        read_committed readers see every commit made (`await_visible`)."""
        if self._closed:
            return
        self._closed = True
        self._buffer.clear()
        for producer in self._producers.values():
            # A fenced or failed producer raises its fatal error again here: that error has already
            # stopped capture (ProducerFenced, one line), and nothing it still holds was committed.
            with contextlib.suppress(KafkaException):
                producer.flush(5)
        self.await_visible()

    def await_visible(self, timeout_s: float = _VISIBLE_S) -> None:
        """Return once read_committed readers see every commit made so far: the last stable offset
        of each partition appended to reaches its high watermark as it is now (what no commit
        covered is not in Kafka: not waited for).
        `commit_transaction` returns once the transaction is decided; the brokers write its markers
        after, and until then a read_committed reader's end (what `project run` plans to) stays
        before it. Bounded: past `timeout_s` (a broker gone) it is said, not waited."""
        if not self._written:
            return
        deadline = time.monotonic() + timeout_s
        parts = [TopicPartition(t, p) for t, p in sorted(self._written)]
        try:
            if self._admin is None:
                self._admin = AdminClient(admin_config(self.opts))
            target = _end_offsets(self._admin, parts, IsolationLevel.READ_UNCOMMITTED, deadline)
            while True:
                stable = _end_offsets(self._admin, parts, IsolationLevel.READ_COMMITTED, deadline)
                if all(stable[tp] >= end for tp, end in target.items()):
                    if not self._buffer:  # else what is still to commit is looked at next time
                        self._written.clear()
                    return
                if time.monotonic() > deadline:
                    break
                time.sleep(0.01)
        except (KafkaException, concurrent.futures.TimeoutError) as exc:
            why = one_line(exc) if isinstance(exc, KafkaException) else "timed out"
            log.warning("Kafka at %s: the last commit's visibility not checked: %s", self.opts.bootstrap_servers, why)
            return
        log.warning(
            "Kafka at %s: the last commit is not visible to read_committed readers yet", self.opts.bootstrap_servers
        )


class KafkaSourceLog:
    """One source's view of a `KafkaLog`: what `Staging` and the source use of a log, its appends
    tagged with the source (produced by its own producer). Marks and commits are the log's."""

    root = None

    def __init__(self, log: KafkaLog, name: str) -> None:
        self.kafka = log
        self.name = name
        self.default_partitions = log.default_partitions

    def topics(self) -> dict[str, TopicConfig]:
        return self.kafka.topics()

    def create_topic(self, name: str, config: TopicConfig | None = None) -> TopicConfig:
        return self.kafka.create_topic(name, config)

    def end_offsets(self, topic: str) -> list[int]:
        return self.kafka.end_offsets(topic)

    def positions(self) -> dict[str, str]:
        return self.kafka.positions()

    def append(self, topic: str, partition: int, records: Sequence[RecordIn]) -> int:
        return self.kafka.append(topic, partition, records, source=self.name)

    def append_encoded(
        self, topic: str, partition: int, encode: Callable[[int], tuple[bytes, list[int]]], timestamp_ms: int
    ) -> int:
        """`append` for lines encoded for the local log (a columnar snapshot), decoded back."""
        data, _ = encode(0)
        records = []
        for line in data.splitlines():
            _, ts, key, value, headers = decode_line(line)
            records.append((key, value, ts, headers))
        return self.append(topic, partition, records)

    def live_keys(self, topic: str) -> set[bytes]:
        """Read back from the topic by a read_committed consumer of its own (read.py)."""
        return kafka_live_keys(self.kafka.opts, topic)

    def mark(self) -> KafkaMark:
        return self.kafka.mark()

    def committed_through(self, mark: Mark) -> bool:
        return self.kafka.committed_through(mark)

    def commit(self, *, positions: Mapping[str, str] | None = None, upto: Mark | None = None) -> None:
        self.kafka.commit(positions=positions, upto=upto)


def _end_offsets(
    admin: AdminClient, parts: list[TopicPartition], level: IsolationLevel, deadline: float
) -> dict[tuple[str, int], int]:
    """Each partition's end for a reader of `level` (the high watermark, or the last stable offset),
    in one request per broker, answered by `deadline`."""
    wait = max(0.1, deadline - time.monotonic())
    latest = OffsetSpec.latest()  # type: ignore[no-untyped-call]  # confluent-kafka leaves it unannotated
    asked = admin.list_offsets(dict.fromkeys(parts, latest), isolation_level=level, request_timeout=wait)
    return {(tp.topic, tp.partition): int(f.result(wait + 1).offset) for tp, f in asked.items()}


def _describe(config: dict[str, str]) -> str:
    return ", ".join(f"{k}={v}" for k, v in config.items())
