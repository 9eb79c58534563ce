"""`KafkaLog`, capture's writer on Kafka, against a Kafka cluster: a commit is one Kafka
transaction holding the records up to a mark and the positions; nothing else is visible to
read_committed consumers, and positions are read back by the next writer."""

from __future__ import annotations

import pytest

from tests.integration.kafka.conftest import KafkaCluster
from tests.integration.kafka.helpers import read_committed
from tributary.capture.kafka_log import OFFSETS_TOPIC, KafkaLog, KafkaOptions
from tributary.capture.log import LogError, TopicConfig

pytestmark = pytest.mark.integration


def _options(kafka: KafkaCluster, tid: str) -> KafkaOptions:
    return KafkaOptions(
        bootstrap_servers=kafka.bootstraps,
        client={"log_level": "3"},
        partitions=3,
        replication_factor=1,
        create_topics=kafka.creates_topics,
        transactional_id=tid,
    )


def _prepare(kafka: KafkaCluster, *topics: str) -> None:
    if not kafka.creates_topics:
        kafka.create(OFFSETS_TOPIC, 1)
        for topic in topics:
            kafka.create(topic, 3)


def test_commit_upto_a_mark_is_one_transaction_with_the_positions(kafka: KafkaCluster) -> None:
    _prepare(kafka, "shop.public.t")
    log = KafkaLog(_options(kafka, "t1"))
    assert log.positions() == {}
    log.create_topic("shop.public.t", TopicConfig(partitions=3, policy="compact"))
    assert log.topics()["shop.public.t"].partitions == 3
    log.append("shop.public.t", 1, [(b"k1", b"v1", 1_000, b'{"correlation_id":"c-1"}')])
    log.append("shop.public.t", 2, [(b"k2", None, 2_000, None)])
    mark = log.mark()
    log.append("shop.public.t", 0, [(b"k3", b"after the mark", 3_000, None)])
    log.commit(positions={"shop": "0/16B3748"}, upto=mark)
    seen = read_committed(kafka.bootstraps, ["shop.public.t"])
    assert sorted((p, k, v, h, ts) for _, p, _, k, v, h, ts in seen) == [
        (1, b"k1", b"v1", [("correlation_id", b"c-1")], 1_000),
        (2, b"k2", None, None, 2_000),
    ]
    log.close()  # the record after the mark was never committed: dropped
    again = KafkaLog(_options(kafka, "t1"))
    try:
        assert again.positions() == {"shop": "0/16B3748"}
        assert sorted(read_committed(kafka.bootstraps, ["shop.public.t"])) == sorted(seen)  # type: ignore[type-var]
    finally:
        again.close()


def test_a_writer_that_dies_mid_transaction_is_aborted_by_the_next(kafka: KafkaCluster) -> None:
    if kafka.kind == "mock":
        pytest.skip("the mock cluster neither aborts a fenced transaction nor hides an open one (docs/kafka.md)")
    _prepare(kafka, "shop.public.t")
    log = KafkaLog(_options(kafka, "t2"))
    log.append("shop.public.t", 0, [(b"a", b"1", 1, None)])
    log.commit(positions={"shop": "0/10"})
    # Die between produce and commit: records produced inside an open transaction.
    log.producer.begin_transaction()
    log.producer.produce("shop.public.t", key=b"b", value=b"never committed", partition=0)
    log.producer.produce(OFFSETS_TOPIC, key=b"shop", value=b"0/20", partition=0)
    log.producer.flush(10)
    successor = KafkaLog(_options(kafka, "t2"))  # init_transactions fences and aborts the open one
    try:
        assert successor.positions() == {"shop": "0/10"}
        assert [(k, v) for _, _, _, k, v, _, _ in read_committed(kafka.bootstraps, ["shop.public.t"])] == [(b"a", b"1")]
        with pytest.raises(Exception):  # noqa: B017, PT011 — the fenced producer may not commit
            log.producer.commit_transaction(10)
    finally:
        successor.close()


def test_missing_topic_without_create_topics_is_one_clear_line(kafka_mock: KafkaCluster) -> None:
    kafka_mock.create(OFFSETS_TOPIC, 1)
    log = KafkaLog(_options(kafka_mock, "t3"))
    try:
        with pytest.raises(LogError, match="topic 'shop.public.x' does not exist on Kafka.*create_topics = false"):
            log.create_topic("shop.public.x", TopicConfig(partitions=3, policy="compact"))
    finally:
        log.close()


def test_missing_offsets_topic_without_create_topics_is_one_clear_line(kafka_mock: KafkaCluster) -> None:
    with pytest.raises(LogError, match="offsets topic '__tributary_offsets' does not exist"):
        KafkaLog(_options(kafka_mock, "t4"))
