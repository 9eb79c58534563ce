"""Kafka clusters for the Kafka backend's tests: Apache Kafka's own broker (KRaft, the jars `make
setup` fetches; api/devkafka), one node for the session and a cluster of three for the fault tests;
librdkafka's mock cluster (tests/kafka_mock.py) where it adds something, pure client behaviour fast.
TRIBUTARY_TEST_KAFKA=docker runs the single broker through testcontainers instead."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tributary.api.devdb import free_port
from tributary.api.devkafka import EmbeddedKafka
from tributary.log.kafka.clients import with_logger
from tributary.log.kafka.options import OFFSETS_TOPIC, KafkaOptions

MOCK = Path(__file__).resolve().parent / "kafka_mock.py"
# For tests where the mock only stood in for a broker: `kafka` is the real broker alone.
ON_BROKER = pytest.mark.parametrize("kafka", ["broker"], indirect=True)
KAFKA_INTERNAL = ("__consumer_offsets", "__transaction_state", "__cluster_metadata")


@dataclass
class KafkaCluster:
    """Where a test's clients connect, and how topics get made there."""

    bootstraps: str
    kind: str  # "mock" | "broker" | "docker"
    proc: subprocess.Popen[str] | None = None
    broker: EmbeddedKafka | None = None  # the nodes, for tests that stop or kill them
    replicas: int = 1  # replication factor of the topics tests make

    @property
    def creates_topics(self) -> bool:
        """Whether clients may create topics (AdminClient): not on the mock."""
        return self.kind != "mock"

    @property
    def hides_open_transactions(self) -> bool:
        """Whether read_committed consumers are kept from records of a transaction that never
        committed: not on the mock (it shows whatever reached it of a killed writer's open
        transaction, and never aborts it), so a kill -9 landing between a flush and the commit shows
        those records, and the restarted writer sends them again."""
        return self.kind != "mock"

    def options(self, transactional_id: str) -> KafkaOptions:
        """`[log.kafka]` for this cluster: 3 partitions, topics made by capture where it may."""
        return KafkaOptions(
            bootstrap_servers=self.bootstraps,
            client={"log_level": "3"},
            partitions=3,
            replication_factor=self.replicas,
            create_topics=self.creates_topics,
            transactional_id=transactional_id,
        )

    def prepare(self, *topics: str) -> None:
        """The offsets topic and `topics` (3 partitions) made by an operator where clients may not
        create topics (the mock)."""
        if not self.creates_topics:
            self.create(OFFSETS_TOPIC, 1)
            for topic in topics:
                self.create(topic, 3)

    def make_topics(self, *topics: str) -> None:
        """`topics` (3 partitions, compacted) as capture makes them before it writes, for tests that
        write through KafkaLog without capture; on the mock, as an operator would (`prepare`)."""
        if not self.creates_topics:
            self.prepare(*topics)
            return
        from confluent_kafka.admin import AdminClient, NewTopic

        admin = AdminClient(with_logger({"bootstrap.servers": self.bootstraps}))
        news = [NewTopic(t, 3, self.replicas, config={"cleanup.policy": "compact"}) for t in topics]
        for future in admin.create_topics(news).values():
            future.result(30)

    def create(self, topic: str, partitions: int) -> None:
        """Make a topic as an operator would (the mock's own call; AdminClient elsewhere)."""
        if self.proc is not None:
            assert self.proc.stdin is not None and self.proc.stdout is not None
            self.proc.stdin.write(f"create {topic} {partitions} 1\n")
            self.proc.stdin.flush()
            answer = self.proc.stdout.readline().strip()
            assert answer == "ok", answer
            return
        from confluent_kafka.admin import AdminClient, NewTopic

        admin = AdminClient(with_logger({"bootstrap.servers": self.bootstraps}))
        admin.create_topics([NewTopic(topic, partitions, self.replicas)])[topic].result(30)

    def clear(self) -> None:
        """Delete every topic but Kafka's own and wait until no broker lists one: each test starts on
        an empty cluster, as on a fresh mock."""
        from confluent_kafka.admin import AdminClient

        admin = AdminClient(with_logger({"bootstrap.servers": self.bootstraps}))

        def ours() -> list[str]:
            return [t for t in admin.list_topics(timeout=30).topics if t not in KAFKA_INTERNAL]

        doomed = ours()
        if doomed:
            for future in admin.delete_topics(doomed, operation_timeout=30).values():
                future.result(60)
        deadline = time.monotonic() + 120  # deletion is one metadata record: brokers see it within a second
        while ours():
            assert time.monotonic() < deadline, f"topics still listed after deletion: {ours()}"
            time.sleep(0.1)


@pytest.fixture
def kafka_mock() -> Iterator[KafkaCluster]:
    """A fresh mock cluster (3 brokers) in a process of its own, killed after the test."""
    proc = subprocess.Popen(
        [sys.executable, str(MOCK)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1
    )
    try:
        assert proc.stdout is not None
        bootstraps = proc.stdout.readline().strip()
        assert bootstraps, "the mock cluster did not start"
        yield KafkaCluster(bootstraps, "mock", proc)
    finally:
        proc.kill()
        proc.wait()
        for pipe in (proc.stdin, proc.stdout):
            if pipe is not None:
                pipe.close()


def _docker_broker() -> Iterator[KafkaCluster]:
    """A real Kafka broker (testcontainers), for TRIBUTARY_TEST_KAFKA=docker."""
    if shutil.which("docker") is None or subprocess.run(["docker", "info"], capture_output=True).returncode != 0:
        pytest.skip("TRIBUTARY_TEST_KAFKA=docker but no usable Docker here")
    from testcontainers.community.kafka import KafkaContainer

    container = KafkaContainer().with_kraft()
    container.start()
    try:
        yield KafkaCluster(container.get_bootstrap_server(), "docker")
    finally:
        container.stop()


def _embedded(nodes: int) -> Iterator[EmbeddedKafka]:
    """A KRaft cluster of `nodes` on free loopback ports in a new directory; every node stopped
    after (kill -9 where a clean stop fails), the directory removed."""
    root = Path(tempfile.mkdtemp(prefix=f"tributary-kafka{nodes}-"))
    cluster = EmbeddedKafka(root, brokers=nodes)
    try:
        cluster.up(port=free_port())  # never the 9092 that `tributary kafka up` prefers
        yield cluster
    finally:
        try:
            cluster.down(timeout=30)
        finally:
            for node in cluster.nodes if (root / "tributary-kafka.json").exists() else []:
                if cluster.node_alive(node.node_id):
                    cluster.kill(node.node_id)
            shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def kafka_broker_session() -> Iterator[KafkaCluster]:
    """One real broker for the session's Kafka tests."""
    if os.environ.get("TRIBUTARY_TEST_KAFKA") == "docker":
        yield from _docker_broker()
        return
    for cluster in _embedded(1):
        yield KafkaCluster(cluster.bootstraps, "broker", broker=cluster)


@pytest.fixture
def kafka_broker(kafka_broker_session: KafkaCluster) -> KafkaCluster:
    """The session's real broker, emptied of the topics earlier tests made."""
    kafka_broker_session.clear()
    return kafka_broker_session


@pytest.fixture(scope="session")
def kafka_cluster3_session() -> Iterator[KafkaCluster]:
    """Three real brokers (each also a KRaft controller): topics with 3 replicas, min.insync.replicas=2."""
    for cluster in _embedded(3):
        yield KafkaCluster(cluster.bootstraps, "broker", broker=cluster, replicas=3)


@pytest.fixture
def kafka_cluster3(kafka_cluster3_session: KafkaCluster) -> KafkaCluster:
    """The three brokers, every node running again (a test may have killed some) and no topics."""
    cluster = kafka_cluster3_session.broker
    assert cluster is not None
    cluster.up()
    kafka_cluster3_session.clear()
    return kafka_cluster3_session


@pytest.fixture(params=["mock", "broker"])
def kafka(request: pytest.FixtureRequest) -> KafkaCluster:
    """Each Kafka test on the mock and on a real broker (ON_BROKER: on the broker only)."""
    cluster: KafkaCluster = request.getfixturevalue(f"kafka_{request.param}")
    return cluster
