"""Consumer groups on the Kafka backend where Kafka differs on purpose: tributary's groups commit to
Kafka's own group offsets, so a plain Kafka consumer in the same group id blocks those commits until
it leaves (the local log keeps offsets in Postgres, where no outside client takes part). What groups
do on every backend is in tests/integration/contract/test_groups_contract.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from confluent_kafka import Consumer

from tests import waiting
from tests.kafka_fixtures import KafkaCluster
from tributary.consumers import GroupCoordinator
from tributary.eventstore.migrate import run_migrations
from tributary.log.kafka.clients import with_logger
from tributary.log.kafka.options import KafkaOptions
from tributary.log.local import LogError

pytestmark = pytest.mark.integration


def test_a_kafka_member_of_the_same_group_id_blocks_commits_until_it_leaves(
    fresh_db: str, tmp_path: Path, kafka: KafkaCluster
) -> None:
    topic = "plain.topic"
    kafka.create(topic, 2)  # AdminClient where clients may create topics, kept alive until the topic is made
    run_migrations(fresh_db)
    options = KafkaOptions(bootstrap_servers=kafka.bootstraps, client={"log_level": "3"})
    with GroupCoordinator(fresh_db, tmp_path / "unused", kafka=options) as coordinator:
        me = coordinator.join("shared", [topic], member_id="m", session_timeout_ms=120_000)
        assert sorted(me.assignments) == [(topic, 0), (topic, 1)]
        member = Consumer(
            with_logger(
                {
                    "bootstrap.servers": kafka.bootstraps,
                    "group.id": "shared",
                    "session.timeout.ms": 6000,
                    "log_level": "3",
                }
            )
        )
        member.subscribe([topic])

        def assigned() -> bool:  # a live member of Kafka's own group "shared"
            member.poll(0.2)
            return bool(member.assignment())

        waiting.wait_progress(assigned, lambda: None, what="Kafka to assign the plain consumer its partitions")
        with pytest.raises(LogError, match="group.id 'shared'"):
            coordinator.commit("shared", "m", me.generation, [(topic, 0, 0)])
        member.close()  # leaves Kafka's group: once it is empty, tributary's commits go through
        if kafka.kind == "mock":
            return  # the mock cluster keeps refusing commits without a member once its group had one

        def committed() -> bool:  # Kafka refuses while it still counts the member that left
            try:
                coordinator.commit("shared", "m", me.generation, [(topic, 0, 0), (topic, 1, 0)])
            except LogError:
                return False
            return True

        waiting.wait_progress(committed, lambda: None, what="Kafka to take the commit after its member left", poll=0.5)
        assert coordinator.offsets.committed("shared", [(topic, 0), (topic, 1)]) == {(topic, 0): 0, (topic, 1): 0}
