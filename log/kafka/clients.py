"""Every Kafka client's settings, built here and nowhere else: `[log.kafka]`'s librdkafka settings
(security included) and bootstrap servers, then what each kind of client needs.

librdkafka writes its own log lines (`%3|…|FAIL|rdkafka#producer-1| …`) straight to stderr unless
a client is given a Python logger. Every client gets the logger below, so those lines follow the
process's logging set-up (its format, its level, a test's captured log) instead.

No Kafka client import: the projections' Spark tasks build their consumers' settings here too."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Mapping
from typing import Any

from tributary.log.kafka.options import KafkaOptions

__all__ = [
    "LIBRDKAFKA_LOGGER",
    "admin_config",
    "consumer_config",
    "producer_config",
    "transactional_config",
    "with_logger",
]

LIBRDKAFKA_LOGGER = "tributary.kafka.librdkafka"


def with_logger(config: Mapping[str, Any]) -> dict[str, Any]:
    """`config` (a confluent-kafka client's) with librdkafka's log routed to `LIBRDKAFKA_LOGGER`;
    the lines arrive while the client is polled."""
    return {**config, "logger": logging.getLogger(LIBRDKAFKA_LOGGER)}


def _client(options: KafkaOptions) -> dict[str, Any]:
    """What every client shares: the user's settings, the bootstrap servers, the logger."""
    return with_logger({**options.client, "bootstrap.servers": options.bootstrap_servers})


def consumer_config(
    options: KafkaOptions, *, group: str | None = None, purpose: str = "cli", extra: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """A consumer that reads committed data only (read_committed) and never commits by itself.
    `group`: the group whose offsets it commits and fetches (the consumer groups' offsets); None
    gives it a group id of its own, `tributary-<purpose>-<random>`, never joined: its partitions
    are assigned. `extra`: the settings of that one use (they win)."""
    return {
        **_client(options),
        "group.id": group if group is not None else f"tributary-{purpose}-{uuid.uuid4().hex}",
        "isolation.level": "read_committed",
        "enable.auto.commit": False,
        **(extra or {}),
    }


def producer_config(options: KafkaOptions) -> dict[str, Any]:
    """A producer that never creates a topic by producing to it (capture creates its topics with
    their partitions and cleanup policy); capture's writer asks the cluster's metadata with it."""
    return {**_client(options), "allow.auto.create.topics": False}


def transactional_config(options: KafkaOptions, transactional_id: str) -> dict[str, Any]:
    """A source's transactional, idempotent producer (`transactional_id`: see writer.py)."""
    return {
        **producer_config(options),
        "transactional.id": transactional_id,
        "enable.idempotence": True,
        "linger.ms": 5,
    }


def admin_config(options: KafkaOptions) -> dict[str, Any]:
    """An admin client (topic creation)."""
    return _client(options)
