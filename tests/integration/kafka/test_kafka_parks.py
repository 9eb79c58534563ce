"""Parks on Kafka: one transactional producer per server process writes every park (initialised
once, not per park), a new one only after the old one was fenced or failed, closed at shutdown; a
park is visible to read_committed readers when it returns."""

from __future__ import annotations

import os
import socket
from datetime import UTC, datetime
from pathlib import Path

import orjson
import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from tests.integration.kafka.helpers import read_committed
from tests.kafka_fixtures import KafkaCluster
from tributary.consumers.parked_topic import Park, ParkedTopic, parked_topic
from tributary.log import Record
from tributary.log.kafka.clients import transactional_config
from tributary.log.kafka.read import committed_reader, watermarks

pytestmark = pytest.mark.integration


def _park(n: int) -> Park:
    record = Record("shop.public.items", 0, n, 1_700_000_000_000 + n, b'"k"', orjson.dumps({"n": n}), None)
    return Park(record, f"park-{n}", "no", 1, datetime(2026, 1, 1, tzinfo=UTC), "m")


def _parked_offsets(kafka: KafkaCluster, group: str) -> list[int]:
    seen = read_committed(kafka.bootstraps, [parked_topic(group)])
    return sorted(orjson.loads(value or b"null")["n"] for _, _, _, _, value, _, _ in seen)


def _settled(committed: Consumer, uncommitted: Consumer) -> bool:
    """Whether no transaction on the parked topic is undecided for readers: its last stable offset
    (asked first) is its high watermark."""
    tp = TopicPartition(parked_topic("ledger"), 0)
    return watermarks(committed, tp)[1] == watermarks(uncommitted, tp)[1]


def test_parks_share_one_producer_and_a_fenced_one_is_replaced(kafka_broker: KafkaCluster, tmp_path: Path) -> None:
    options = kafka_broker.options("tp")
    topic = ParkedTopic(tmp_path, options)
    committed = committed_reader(options)
    uncommitted = committed_reader(options, **{"isolation.level": "read_uncommitted"})
    try:
        for n in range(20):
            topic.append("ledger", [_park(n)])
            assert _settled(committed, uncommitted), n  # visible to read_committed readers on return
        assert topic.writers_opened == 1
        assert _parked_offsets(kafka_broker, "ledger") == list(range(20))

        # Another producer with the parks' transactional id fences this process's producer.
        tid = f"{options.transactional_id}-groups.{socket.gethostname()}.{os.getpid()}"
        usurper = Producer(transactional_config(options, tid))
        usurper.init_transactions(30)
        topic.append("ledger", [_park(20)])  # the fenced producer is replaced, the park goes through
        topic.append("ledger", [_park(21)])
        assert topic.writers_opened == 2
        assert _parked_offsets(kafka_broker, "ledger") == [*range(20), 20, 21]
    finally:
        topic.close()
        committed.close()
        uncommitted.close()
    topic.close()  # closing twice is harmless
