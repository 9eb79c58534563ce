"""`GroupOffsets` (tributary.log.contracts) on Kafka: consumer groups' committed offsets in Kafka's
own group offsets (`__consumer_offsets`, group id = the group's name), so `kafka-consumer-groups
--describe --group G` shows them and a Kafka consumer can go on from them."""

from __future__ import annotations

import threading
import uuid
from collections import OrderedDict
from collections.abc import Sequence

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from tributary.log.contracts import GroupPartition
from tributary.log.kafka.clients import consumer_config
from tributary.log.kafka.codec import one_line
from tributary.log.kafka.options import KafkaOptions
from tributary.log.local import LogError

__all__ = ["KafkaGroupOffsets"]

_TIMEOUT_S = 10.0  # one request to the cluster
_MEMBERSHIP_ERRORS = frozenset(
    {KafkaError.UNKNOWN_MEMBER_ID, KafkaError.ILLEGAL_GENERATION, KafkaError.REBALANCE_IN_PROGRESS}
)


class KafkaGroupOffsets:
    """Committed offsets through one `Consumer` per group (kept, at most `max_groups` of them: the
    least recently used is closed). These consumers never subscribe: they commit and fetch offsets
    as Kafka's "simple" consumers do, outside any Kafka group membership."""

    def __init__(self, options: KafkaOptions, *, max_groups: int = 32) -> None:
        self.options = options
        self.where = f"Kafka at {options.bootstrap_servers}"
        self.max_groups = max_groups
        self._lock = threading.Lock()
        self._clients: OrderedDict[str, tuple[Consumer, threading.Lock]] = OrderedDict()

    def _client(self, group: str) -> tuple[Consumer, threading.Lock]:
        with self._lock:
            found = self._clients.get(group)
            if found is not None:
                self._clients.move_to_end(group)
                return found
            consumer = Consumer(
                consumer_config(self.options, group=group, extra={"client.id": f"tributary-{uuid.uuid4().hex[:8]}"})
            )
            self._clients[group] = found = (consumer, threading.Lock())
            while len(self._clients) > self.max_groups:
                _, (old, old_lock) = self._clients.popitem(last=False)
                with old_lock:
                    old.close()
            return found

    def committed(self, group: str, tps: Sequence[GroupPartition]) -> dict[GroupPartition, int]:
        if not tps:
            return {}
        consumer, lock = self._client(group)
        try:
            with lock:
                got = consumer.committed([TopicPartition(t, p) for t, p in tps], timeout=_TIMEOUT_S)
        except (KafkaException, RuntimeError) as exc:  # RuntimeError: closed by another thread
            raise LogError(f"{self.where}: reading the offsets of group {group!r}: {one_line(exc)}") from None
        out: dict[GroupPartition, int] = {}
        for tp in got:
            if tp.error is not None:
                raise LogError(f"{self.where}: reading the offsets of group {group!r}: {tp.error.str()}")
            if tp.offset >= 0:
                out[(tp.topic, tp.partition)] = int(tp.offset)
        return out

    def commit(self, group: str, note: str, offsets: Sequence[tuple[GroupPartition, int]]) -> None:
        if not offsets:
            return
        consumer, lock = self._client(group)
        try:
            with lock:
                done = consumer.commit(
                    offsets=[TopicPartition(t, p, o, metadata=note) for (t, p), o in offsets], asynchronous=False
                )
        except (KafkaException, RuntimeError) as exc:
            error = exc.args[0] if exc.args else None
            hint = ""
            if isinstance(error, KafkaError) and error.code() in _MEMBERSHIP_ERRORS:
                hint = f" (a Kafka consumer subscribed with group.id {group!r} makes Kafka refuse tributary's commits)"
            raise LogError(f"{self.where}: committing group {group!r}: {one_line(exc)}{hint}") from None
        for tp in done or []:
            if tp.error is not None:
                raise LogError(
                    f"{self.where}: committing group {group!r} on {tp.topic}/{tp.partition}: {tp.error.str()}"
                )

    def close(self) -> None:
        with self._lock:
            for consumer, lock in self._clients.values():
                with lock:
                    consumer.close()
            self._clients.clear()
