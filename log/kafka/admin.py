"""`tributary.log.contracts.LogAdmin` on Kafka: what an operator's view asks of the cluster,
through the readers of read.py (each with a consumer of its own)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import BinaryIO

from tributary.log.contracts import PositionsFrom
from tributary.log.kafka.options import KafkaOptions
from tributary.log.kafka.read import kafka_cat, kafka_positions, kafka_topics, kafka_verify
from tributary.log.local import LogError, TopicSummary, Verified

__all__ = ["KafkaAdmin"]


class KafkaAdmin:
    """The cluster of `options`; `timeout_s` bounds a topic listing (a view waits less than a run)."""

    compaction_keeps_unchanged_values = False  # the broker drops the record that held the value

    def __init__(self, options: KafkaOptions, *, timeout_s: float) -> None:
        self.options = options
        self.timeout_s = timeout_s

    def exists(self) -> bool:
        """Always: the cluster is there, or a read says why not."""
        return True

    def topics(self) -> list[TopicSummary]:
        return kafka_topics(self.options, timeout_s=self.timeout_s)

    def topic_sizes(self) -> dict[str, tuple[int, int | None]]:
        """Per topic: the offsets between the partitions' low and high watermarks (transaction
        markers included); the bytes are the broker's to report (None)."""
        return {row["topic"]: (row["records"], None) for row in self.topics()}

    def positions(self) -> dict[str, str]:
        return kafka_positions(self.options)

    def verify(self, sources: Sequence[str]) -> Verified:
        where = f"Kafka at {self.options.bootstrap_servers}"
        check = kafka_verify(self.options, list(sources))
        return Verified(
            where=f"on {where}",
            ok=f"ok: {where}: the offsets topic and every topic's partitions are in place "
            "(record checksums are the broker's to check)",
            notes=check.notes,
            warnings=check.warnings,
            problems=[f"problem: {p}" for p in check.problems],
        )

    def repair(self, positions_from: PositionsFrom) -> list[str]:
        """Refused: the broker repairs its own logs."""
        raise LogError("--repair applies to the local log: on Kafka the broker repairs its own logs")

    def cat(
        self,
        topic: str,
        *,
        partition: int | None = None,
        from_offset: int = 0,
        compacted: bool = False,
        follow: bool = False,
        stop: Callable[[], bool] | None = None,
        out: BinaryIO | None = None,
    ) -> int:
        return kafka_cat(
            self.options,
            topic,
            partition=partition,
            from_offset=from_offset,
            compacted=compacted,
            follow=follow,
            stop=stop,
            out=out,
        )
