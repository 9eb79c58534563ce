"""`KafkaLog`, capture's writer on Kafka, against a Kafka cluster: a commit is one Kafka
transaction holding the records up to a mark and the positions; nothing else is visible to
read_committed consumers, and positions are read back by the next writer."""

from __future__ import annotations

import pytest
from confluent_kafka import TopicPartition

from tests.integration.kafka.helpers import read_committed
from tests.kafka_fixtures import ON_BROKER, KafkaCluster
from tributary.log.kafka.read import committed_reader, watermarks
from tributary.log.kafka.writer import OFFSETS_TOPIC, KafkaLog, ProducerFenced, transactional_id
from tributary.log.local import LogError, TopicConfig

pytestmark = pytest.mark.integration


def test_commit_upto_a_mark_is_one_transaction_with_the_positions(kafka: KafkaCluster) -> None:
    kafka.make_topics("shop.public.t")
    log = KafkaLog(kafka.options("t1"), ["shop"])
    assert log.positions() == {}
    shop = log.source("shop")
    shop.create_topic("shop.public.t", TopicConfig(partitions=3, policy="compact"))
    assert log.topics()["shop.public.t"].partitions == 3
    shop.append("shop.public.t", 1, [(b"k1", b"v1", 1_000, b'{"correlation_id":"c-1"}')])
    shop.append("shop.public.t", 2, [(b"k2", None, 2_000, None)])
    mark = log.mark()
    shop.append("shop.public.t", 0, [(b"k3", b"after the mark", 3_000, None)])
    log.commit(positions={"shop": "0/16B3748"}, upto=mark)
    seen = read_committed(kafka.bootstraps, ["shop.public.t"])
    assert sorted((p, k, v, h, ts) for _, p, _, k, v, h, ts in seen) == [
        (1, b"k1", b"v1", [("correlation_id", b"c-1")], 1_000),
        (2, b"k2", None, None, 2_000),
    ]
    log.close()  # the record after the mark was never committed: dropped
    again = KafkaLog(kafka.options("t1"), ["shop"])
    try:
        assert again.positions() == {"shop": "0/16B3748"}
        assert sorted(read_committed(kafka.bootstraps, ["shop.public.t"])) == sorted(seen)  # type: ignore[type-var]
    finally:
        again.close()


def test_each_source_commits_through_its_own_producer(kafka: KafkaCluster) -> None:
    """One commit of two sources: each source's records and positions in its own transaction,
    produced by the producer whose transactional id is `<prefix>-<source>`."""
    kafka.make_topics("a.public.t", "b.public.t")
    log = KafkaLog(kafka.options("t5"), ["a", "b"])
    try:
        log.source("a").append("a.public.t", 0, [(b"ka", b"from a", 1, None)])
        log.source("b").append("b.public.t", 0, [(b"kb", b"from b", 2, None)])
        log.commit(positions={"a": "0/10", "b": "0/20", "a#snapshot": "{}"})
        assert transactional_id(kafka.options("t5"), "a") == "t5-a"
        seen = read_committed(kafka.bootstraps, ["a.public.t", "b.public.t"])
        assert sorted((t, v) for t, _, _, _, v, _, _ in seen) == [("a.public.t", b"from a"), ("b.public.t", b"from b")]
        offsets = read_committed(kafka.bootstraps, [OFFSETS_TOPIC])
        assert sorted((k, v) for _, _, _, k, v, _, _ in offsets) == [
            (b"a", b"0/10"),
            (b"a#snapshot", b"{}"),
            (b"b", b"0/20"),
        ]
    finally:
        log.close()
    again = KafkaLog(kafka.options("t5"), ["b"])  # a process for b only reads every position back
    try:
        assert again.positions() == {"a": "0/10", "a#snapshot": "{}", "b": "0/20"}
    finally:
        again.close()


@ON_BROKER  # the mock neither fences producers nor aborts their transactions (docs/kafka.md)
def test_a_writer_that_dies_mid_transaction_is_aborted_by_the_next(kafka: KafkaCluster) -> None:
    kafka.make_topics("shop.public.t")
    log = KafkaLog(kafka.options("t2"), ["shop"])
    log.source("shop").append("shop.public.t", 0, [(b"a", b"1", 1, None)])
    log.commit(positions={"shop": "0/10"})
    # Die between produce and commit: records produced inside an open transaction.
    producer = log.producer("shop")
    producer.begin_transaction()
    producer.produce("shop.public.t", key=b"b", value=b"never committed", partition=0)
    producer.produce(OFFSETS_TOPIC, key=b"shop", value=b"0/20", partition=0)
    producer.flush(10)
    successor = KafkaLog(kafka.options("t2"), ["shop"])  # init_transactions fences and aborts the open one
    try:
        assert successor.positions() == {"shop": "0/10"}
        assert [(k, v) for _, _, _, k, v, _, _ in read_committed(kafka.bootstraps, ["shop.public.t"])] == [(b"a", b"1")]
        with pytest.raises(Exception):  # noqa: B017, PT011 — the fenced producer may not commit
            producer.commit_transaction(10)
    finally:
        successor.close()


@ON_BROKER  # the mock neither fences producers nor aborts their transactions (docs/kafka.md)
def test_the_same_source_fences_another_process_and_other_sources_do_not(kafka: KafkaCluster) -> None:
    kafka.make_topics("a.public.t", "b.public.t")
    first = KafkaLog(kafka.options("t6"), ["a"])
    other = KafkaLog(kafka.options("t6"), ["b"])  # another source: no fencing
    first.source("a").append("a.public.t", 0, [(b"k", b"1", 1, None)])
    first.commit(positions={"a": "0/10"})
    second = KafkaLog(kafka.options("t6"), ["a"])  # the same source: the first is fenced
    try:
        first.source("a").append("a.public.t", 0, [(b"k", b"2", 2, None)])
        with pytest.raises(ProducerFenced, match=r"^source 'a': another capture process took over .*'t6-a'"):
            first.commit(positions={"a": "0/20"})
        other.source("b").append("b.public.t", 0, [(b"k", b"b", 3, None)])
        other.commit(positions={"b": "0/30"})
        second.source("a").append("a.public.t", 0, [(b"k", b"3", 4, None)])
        second.commit(positions={"a": "0/40"})
        seen = read_committed(kafka.bootstraps, ["a.public.t", "b.public.t"])
        assert sorted((t, v) for t, _, _, _, v, _, _ in seen) == [
            ("a.public.t", b"1"),
            ("a.public.t", b"3"),
            ("b.public.t", b"b"),
        ]
    finally:
        for log in (first, other, second):
            log.close()


def test_missing_topic_without_create_topics_is_one_clear_line(kafka_mock: KafkaCluster) -> None:
    kafka_mock.create(OFFSETS_TOPIC, 1)
    log = KafkaLog(kafka_mock.options("t3"))
    try:
        # The partitions asked for (the source's), not [log.kafka] partitions (3 here).
        with pytest.raises(
            LogError, match=r"topic 'shop.public.x' does not exist on Kafka.*create_topics = false.*\(7 partitions"
        ):
            log.create_topic("shop.public.x", TopicConfig(partitions=7, policy="compact"))
    finally:
        log.close()


def test_missing_offsets_topic_without_create_topics_is_one_clear_line(kafka_mock: KafkaCluster) -> None:
    with pytest.raises(LogError, match="offsets topic '__tributary_offsets' does not exist"):
        KafkaLog(kafka_mock.options("t4"))


@ON_BROKER  # the brokers write a transaction's markers after commit_transaction returned
def test_what_a_closed_writer_committed_is_visible_to_read_committed_readers_at_once(kafka: KafkaCluster) -> None:
    """`capture --until-idle` then `project run`: the run's end offsets (the last stable offsets)
    already cover the writer's last commit when its close returned."""
    kafka.make_topics("v.public.t")
    reader = committed_reader(kafka.options("t9"))
    try:
        for i in range(30):
            log = KafkaLog(kafka.options("t9"), ["v"])
            log.source("v").append("v.public.t", 0, [(b"k", str(i).encode(), i, None)])
            log.commit(positions={"v": f"0/{i}"})
            log.close()
            # each transaction: its record and its commit marker
            assert watermarks(reader, TopicPartition("v.public.t", 0))[1] == 2 * (i + 1), i
    finally:
        reader.close()
