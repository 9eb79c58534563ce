"""librdkafka writes its own log lines (`%3|…|FAIL|rdkafka#producer-1| …`) straight to stderr unless
a client is given a Python logger. Every Kafka client tributary makes gets the logger below, so those
lines follow the process's logging set-up (its format, its level, a test's captured log) instead."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

__all__ = ["LIBRDKAFKA_LOGGER", "with_logger"]

LIBRDKAFKA_LOGGER = "tributary.kafka.librdkafka"


def with_logger(config: Mapping[str, Any]) -> dict[str, Any]:
    """`config` (a confluent-kafka client's) with librdkafka's log routed to `LIBRDKAFKA_LOGGER`;
    the lines arrive while the client is polled."""
    return {**config, "logger": logging.getLogger(LIBRDKAFKA_LOGGER)}
