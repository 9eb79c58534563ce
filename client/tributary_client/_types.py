"""The values the client hands out and the errors it raises: plain data, no I/O."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal, NamedTuple

__all__ = [
    "CommitFailedError",
    "ConsumerError",
    "OffsetOutOfRangeError",
    "OffsetReset",
    "Outcome",
    "Record",
    "TopicPartition",
]

OffsetReset = Literal["earliest", "latest", "error"]


class ConsumerError(Exception):
    """Every error of the client (one line, the server's message when it sent one)."""


class CommitFailedError(ConsumerError):
    """The group rebalanced before the commit: the partitions' records after their last commit
    will be delivered again (to this member or another)."""


class OffsetOutOfRangeError(ConsumerError):
    """The group's position fell behind the log's retention and `auto_offset_reset` is "error"."""


class TopicPartition(NamedTuple):
    """A partition of a topic (a tuple: `("shop.public.orders", 0)` is equal to it)."""

    topic: str
    partition: int


@dataclass(slots=True)
class Record:
    """One log record. `key` is the record key as text (a JSON document for CDC and event topics)
    or None; `value` the record's JSON, decoded (None for a tombstone); `headers` `{name: text}`.
    (Not frozen: a frozen dataclass costs several times more to build, and a batch builds thousands.)"""

    topic: str
    partition: int
    offset: int
    timestamp_ms: int
    key: str | None
    value: Any
    headers: dict[str, str]

    @property
    def timestamp(self) -> datetime:
        return datetime.fromtimestamp(self.timestamp_ms / 1000, tz=UTC)

    @property
    def topic_partition(self) -> TopicPartition:
        return TopicPartition(self.topic, self.partition)

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> Record:
        """A record of the pull API's (and the sink's) JSON shape."""
        return cls(
            raw["topic"],
            raw["partition"],
            raw["offset"],
            raw["timestamp_ms"],
            raw.get("key"),
            raw.get("value"),
            raw.get("headers") or {},
        )


@dataclass(frozen=True, slots=True)
class Outcome:
    """What the server did with one record a member said no to: `action` "retry" (it is delivered
    again in `retry_in_ms`, after `attempts` nacks) or "parked" (set aside; its partition moves on)."""

    topic: str
    partition: int
    offset: int
    action: Literal["retry", "parked"]
    attempts: int | None
    retry_in_ms: int | None

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> Outcome:
        return cls(
            raw["topic"],
            raw["partition"],
            raw["offset"],
            raw["action"],
            raw.get("attempts"),
            raw.get("retry_in_ms"),
        )
