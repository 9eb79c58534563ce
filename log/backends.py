"""Opening the configured backend: the one place outside a backend that names both. Kafka's
modules (and confluent-kafka) load only when Kafka is configured."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from tributary.log.contracts import CaptureWriter, GroupOffsets, LogAdmin, LogReader
from tributary.log.kafka.options import KafkaOptions
from tributary.log.local import Log, LogView
from tributary.log.local.admin import LocalAdmin

__all__ = ["open_admin", "open_group_offsets", "open_reader", "open_writer"]


def open_writer(
    *,
    root: Path,
    kafka: KafkaOptions | None,
    sources: Sequence[str],
    default_partitions: int = 4,
    segment_bytes: int = 128 << 20,
    owner: str | None = None,
    lock_timeout_s: float = 0.0,
) -> CaptureWriter:
    """A transactional writer: on Kafka (`kafka` given, `[log] backend = "kafka"`) a transactional
    producer per source in `sources` (fencing older processes of those sources); else the local log
    under `root`, its writer lock taken (recovery cuts what no commit covered).

    `owner` names a writer of the local log beside capture (the default owner, None): it has its
    own lock and manifest and writes only the topics it creates, while capture runs. Kafka ignores
    it: any transactional producer writes any topic, its transactional id names the writer.
    `lock_timeout_s`: how long the local log waits for the owner's lock held by another process
    (owners whose processes take turns); 0 refuses at once."""
    if kafka is not None:
        from tributary.log.kafka.writer import KafkaLog

        return KafkaLog(kafka, sources)
    return Log.open(
        root,
        writer=True,
        default_partitions=default_partitions,
        segment_bytes=segment_bytes,
        owner=owner,
        lock_timeout_s=lock_timeout_s,
    )


def open_admin(*, root: Path, kafka: KafkaOptions | None, timeout_s: float = 30.0) -> LogAdmin:
    """An operator's view of the configured log: Kafka's cluster (`kafka` given; a topic listing
    waits at most `timeout_s`), else the local log under `root`. Nothing is opened yet."""
    if kafka is not None:
        from tributary.log.kafka.admin import KafkaAdmin

        return KafkaAdmin(kafka, timeout_s=timeout_s)
    return LocalAdmin(root)


def open_reader(*, root: Path, kafka: KafkaOptions | None) -> LogReader:
    """A shared reader of committed data (consumer groups, sinks, `/streams`): Kafka's cluster,
    read_committed (`kafka` given), else the local log under `root` — which may not exist yet
    (capture never ran): it reads as a log without topics until it does."""
    if kafka is not None:
        from tributary.log.kafka.view import KafkaView

        return KafkaView(kafka)
    return LogView(root)


def open_group_offsets(*, kafka: KafkaOptions | None) -> GroupOffsets | None:
    """Where the backend keeps consumer groups' committed offsets itself (Kafka's group offsets, so
    Kafka's own tools see them); None for the local log, whose groups commit to the service database."""
    if kafka is None:
        return None
    from tributary.log.kafka.group_offsets import KafkaGroupOffsets

    return KafkaGroupOffsets(kafka)
