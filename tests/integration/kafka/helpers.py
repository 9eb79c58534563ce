"""Reading Kafka as a consumer would, and capture configs on the Kafka backend."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import orjson
from confluent_kafka import Consumer, KafkaError, TopicPartition

from tributary.log.kafka.clients import with_logger

Seen = tuple[str, int, int, bytes | None, bytes | None, list[tuple[str, bytes]] | None, int]


def read_committed(bootstraps: str, topics: list[str]) -> list[Seen]:
    """Every record a read_committed consumer sees in `topics`, from the start to the end:
    (topic, partition, offset, key, value, headers, timestamp_ms)."""
    consumer = Consumer(
        with_logger(
            {
                "bootstrap.servers": bootstraps,
                "group.id": f"test-{time.monotonic_ns()}",
                "isolation.level": "read_committed",
                "enable.partition.eof": True,
                "enable.auto.commit": False,
            }
        )
    )
    try:
        meta = consumer.list_topics(timeout=30)
        parts = [TopicPartition(t, p, 0) for t in topics if t in meta.topics for p in meta.topics[t].partitions]
        if not parts:
            return []
        consumer.assign(parts)
        pending = {(p.topic, p.partition) for p in parts}
        from tests.waiting import wait_progress

        out = []

        def at_the_ends() -> bool:
            msg = consumer.poll(0.5)
            if msg is None:
                return not pending
            if msg.error() is not None:
                if msg.error().code() == KafkaError._PARTITION_EOF:
                    pending.discard((msg.topic(), msg.partition()))
                    return not pending
                raise AssertionError(msg.error().str())
            out.append(
                (msg.topic(), msg.partition(), msg.offset(), msg.key(), msg.value(), msg.headers(), msg.timestamp()[1])
            )
            return False

        if pending:
            wait_progress(at_the_ends, lambda: (len(out), len(pending)), what=f"the end of {sorted(pending)}", poll=0)
        return out
    finally:
        consumer.close()


Change = tuple[str, bytes | None, dict[str, Any]]


def without_replays(changes: list[Change]) -> tuple[list[Change], int]:
    """(topic, key, change; {} for a tombstone) in offset order → the changes with every replay of an earlier one left
    out (same topic, key, op, source LSN and row), and how many were left out. Only for a cluster
    that shows open transactions (the mock): there a kill -9 mid-commit leaves records visible that
    the restarted capture sends again; a real broker shows no replay, and tests assert none."""
    seen: set[bytes] = set()
    kept: list[Change] = []
    for topic, key, change in changes:
        if not change:  # a tombstone: harmless when sent again
            kept.append((topic, key, change))
            continue
        ident = orjson.dumps(
            [
                topic,
                None if key is None else key.decode(),
                change.get("op"),
                change.get("source", {}).get("lsn"),
                change.get("before"),
                change.get("after"),
            ]
        )
        if ident in seen:
            continue
        seen.add(ident)
        kept.append((topic, key, change))
    return kept, len(changes) - len(kept)


def write_kafka_config(
    path: Path,
    *,
    dsn: str,
    log_root: Path,
    bootstraps: str,
    create_topics: bool,
    name: str = "shop",
    replication_factor: int = 1,
) -> Path:
    """A capture config on the Kafka backend (3 partitions per topic, `replication_factor` replicas), one source."""
    path.write_text(
        f"""
[log]
backend = "kafka"
root = "{log_root}"
partitions = 3
linger_ms = 2

[log.kafka]
bootstrap_servers = "{bootstraps}"
partitions = 3
replication_factor = {replication_factor}
create_topics = {"true" if create_topics else "false"}
transactional_id = "capture-{abs(hash(str(log_root))) % 100000}"
client = {{ "log_level" = "3" }}

[capture]
status_interval_s = 1.0
max_backoff_s = 2.0
capture_eventstore = false

[[sources]]
name = "{name}"
dsn = "{dsn}"
slot = "slot_{name}_{abs(hash(str(log_root))) % 100000}"
include = ["public.*"]
"""
    )
    return path
