"""Kafka clusters for the Kafka backend's tests: librdkafka's mock cluster (tests/kafka_mock.py),
always; a real broker through testcontainers where Docker runs (skipped elsewhere, never faked)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tributary.log.kafka.clients import with_logger
from tributary.log.kafka.options import OFFSETS_TOPIC, KafkaOptions

MOCK = Path(__file__).resolve().parents[2] / "kafka_mock.py"


@dataclass
class KafkaCluster:
    """Where a test's clients connect, and how topics get made there."""

    bootstraps: str
    kind: str  # "mock" | "docker"
    proc: subprocess.Popen[str] | None = None

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
        """`[log.kafka]` for this cluster: 3 partitions, one replica, topics made by capture where it may."""
        return KafkaOptions(
            bootstrap_servers=self.bootstraps,
            client={"log_level": "3"},
            partitions=3,
            replication_factor=1,
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
        admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(30)


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


@pytest.fixture(scope="session")
def kafka_docker() -> Iterator[KafkaCluster]:
    """A real Kafka broker (testcontainers), where Docker runs."""
    if shutil.which("docker") is None or subprocess.run(["docker", "info"], capture_output=True).returncode != 0:
        pytest.skip("no usable Docker here: the real-broker variant runs where Docker exists")
    try:
        from testcontainers.community.kafka import KafkaContainer
    except ImportError:
        pytest.skip("testcontainers' Kafka module is not installed")
    try:
        container = KafkaContainer().with_kraft()
        container.start()
    except Exception as exc:  # Docker present but unusable (no daemon, no permission)
        pytest.skip(f"Docker cannot start Kafka here: {exc}")
    try:
        yield KafkaCluster(container.get_bootstrap_server(), "docker")
    finally:
        container.stop()


@pytest.fixture(params=["mock", "docker"])
def kafka(request: pytest.FixtureRequest) -> KafkaCluster:
    """Each Kafka test on the mock and on a real broker."""
    cluster: KafkaCluster = request.getfixturevalue(f"kafka_{request.param}")
    return cluster
