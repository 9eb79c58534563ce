"""`[log.kafka]` as capture uses it: configuration only, no Kafka client imported (the CLI and
the settings import this; `log/kafka/writer.py` loads confluent-kafka when a Kafka log is built)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

__all__ = ["OFFSETS_TOPIC", "VIEW_TIMEOUT_S", "KafkaOptions"]

OFFSETS_TOPIC = "__tributary_offsets"


@dataclass(frozen=True, slots=True)
class KafkaOptions:
    """`[log.kafka]` as capture uses it."""

    bootstrap_servers: str
    client: Mapping[str, str] = field(default_factory=dict)  # librdkafka settings (security included)
    partitions: int = 4
    replication_factor: int = 3
    create_topics: bool = True
    transactional_id: str = "tributary-capture"
    offsets_topic: str = OFFSETS_TOPIC
    # How long one commit keeps retrying while the cluster cannot take it (down, restarting, a
    # leader moving) before capture stops with one line.
    commit_timeout_s: float = 300.0


# What an operator's view (`project status`, `/projections`, `/topics`, `/metrics`) waits at most
# for an unreachable Kafka cluster before it says so, instead of a run's 30 s.
VIEW_TIMEOUT_S = 5.0
