"""Opening the configured backend: the one place outside a backend that names both. Kafka's
modules (and confluent-kafka) load only when Kafka is configured."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from tributary.log.contracts import CaptureWriter
from tributary.log.kafka.options import KafkaOptions
from tributary.log.local import Log

__all__ = ["open_writer"]


def open_writer(
    *,
    root: Path,
    kafka: KafkaOptions | None,
    sources: Sequence[str],
    default_partitions: int = 4,
    segment_bytes: int = 128 << 20,
) -> CaptureWriter:
    """Capture's writer: on Kafka (`kafka` given, `[log] backend = "kafka"`) a transactional
    producer per source in `sources` (fencing older processes of those sources); else the local log
    under `root`, its writer lock taken (recovery cuts what no commit covered)."""
    if kafka is not None:
        from tributary.log.kafka.writer import KafkaLog

        return KafkaLog(kafka, sources)
    return Log.open(root, writer=True, default_partitions=default_partitions, segment_bytes=segment_bytes)
