"""The `[log]` settings as the log's own objects."""

from __future__ import annotations

from tributary.api.settings.config import Settings
from tributary.log import CleanerPolicy, KafkaOptions, LogAdmin, open_admin

__all__ = ["cleaner_policy", "kafka_options", "log_admin"]


def cleaner_policy(settings: Settings) -> CleanerPolicy | None:
    """The `[log]` cleaner keys as the capture daemon's cleaner policy; None when
    `cleaner_interval_s` is 0 (no background cleaner)."""
    s = settings.log
    if s.cleaner_interval_s <= 0:
        return None
    return CleanerPolicy(
        interval_ms=int(s.cleaner_interval_s * 1000),
        min_cleanable_dirty_ratio=s.min_cleanable_dirty_ratio,
        delete_retention_ms=s.delete_retention_ms,
        retention_ms=s.retention_ms,
        retention_bytes=s.retention_bytes,
        file_delete_delay_ms=s.file_delete_delay_ms,
    )


def kafka_options(settings: Settings) -> KafkaOptions | None:
    """`[log.kafka]` as capture's Kafka options when `[log] backend = "kafka"`, else None."""
    if settings.log.backend != "kafka":
        return None
    k = settings.log.kafka
    return KafkaOptions(
        bootstrap_servers=k.bootstrap_servers,
        client=dict(k.client),
        partitions=k.partitions,
        replication_factor=k.replication_factor,
        create_topics=k.create_topics,
        transactional_id=k.transactional_id,
        commit_timeout_s=k.commit_timeout_s,
    )


def log_admin(settings: Settings, *, timeout_s: float = 30.0) -> LogAdmin:
    """An operator's view of the configured log (`[log] backend`); `timeout_s` bounds a Kafka
    topic listing."""
    return open_admin(root=settings.log.root, kafka=kafka_options(settings), timeout_s=timeout_s)
