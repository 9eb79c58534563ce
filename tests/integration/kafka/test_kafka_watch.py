"""A continuous projection run on Kafka learns of new records from the partitions' ends
(`KafkaSource.stamp`), without running a pass."""

from __future__ import annotations

import pytest

from tests.kafka_fixtures import KafkaCluster
from tributary.log.kafka.clients import with_logger
from tributary.projections.kafka_source import KafkaSource

pytestmark = pytest.mark.integration


def test_the_stamp_moves_when_a_record_is_committed_and_only_then(kafka_mock: KafkaCluster) -> None:
    from confluent_kafka import Producer

    kafka_mock.create("events.watched", 2)
    source = KafkaSource(kafka_mock.options("watch"))
    producer = Producer(with_logger({"bootstrap.servers": kafka_mock.bootstraps}))
    try:
        before = source.stamp(["events.watched", "events.not_yet"])
        assert source.stamp(["events.watched", "events.not_yet"]) == before
        producer.produce("events.watched", b"{}", b'"acc-1"', partition=1)
        assert producer.flush(30) == 0
        assert source.stamp(["events.watched", "events.not_yet"]) != before
    finally:
        source.close()
