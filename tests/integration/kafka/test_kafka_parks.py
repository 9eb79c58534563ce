"""Parks on Kafka: one transactional producer per server process writes every park (initialised
once, not per park), a new one only after the old one was fenced or failed, closed at shutdown."""

from __future__ import annotations

import os
import socket
from datetime import UTC, datetime
from pathlib import Path

import orjson
import pytest
from confluent_kafka import Producer

from tests.integration.kafka.helpers import read_committed
from tests.kafka_fixtures import KafkaCluster
from tributary.consumers.parked_topic import Park, ParkedTopic, parked_topic
from tributary.log import Record
from tributary.log.kafka.clients import transactional_config

pytestmark = pytest.mark.integration


def _park(n: int) -> Park:
    record = Record("shop.public.items", 0, n, 1_700_000_000_000 + n, b'"k"', orjson.dumps({"n": n}), None)
    return Park(record, f"park-{n}", "no", 1, datetime(2026, 1, 1, tzinfo=UTC), "m")


def _parked_offsets(kafka: KafkaCluster, group: str) -> list[int]:
    seen = read_committed(kafka.bootstraps, [parked_topic(group)])
    return sorted(orjson.loads(value or b"null")["n"] for _, _, _, _, value, _, _ in seen)


def test_parks_share_one_producer_and_a_fenced_one_is_replaced(kafka_broker: KafkaCluster, tmp_path: Path) -> None:
    options = kafka_broker.options("tp")
    topic = ParkedTopic(tmp_path, options)
    try:
        for n in range(5):
            topic.append("ledger", [_park(n)])
        assert topic.writers_opened == 1
        assert _parked_offsets(kafka_broker, "ledger") == [0, 1, 2, 3, 4]

        # Another producer with the parks' transactional id fences this process's producer.
        tid = f"{options.transactional_id}-groups.{socket.gethostname()}.{os.getpid()}"
        usurper = Producer(transactional_config(options, tid))
        usurper.init_transactions(30)
        topic.append("ledger", [_park(5)])  # the fenced producer is replaced, the park goes through
        topic.append("ledger", [_park(6)])
        assert topic.writers_opened == 2
        assert _parked_offsets(kafka_broker, "ledger") == [0, 1, 2, 3, 4, 5, 6]
    finally:
        topic.close()
    topic.close()  # closing twice is harmless
