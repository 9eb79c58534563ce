"""The values consumer groups take and answer: offset-reset policies, what a join, a heartbeat and a
fetch return, and where a stream stands."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from tributary.consumers.assign import TopicPartition
from tributary.consumers.filters import EventFilter
from tributary.log import Record

__all__ = ["OFFSET_RESETS", "Batch", "Heartbeat", "Membership", "OffsetReset", "ResetTarget", "StreamCursor"]

OffsetReset = Literal["earliest", "latest", "error"]
OFFSET_RESETS: tuple[OffsetReset, ...] = ("earliest", "latest", "error")
ResetTarget = Literal["earliest", "latest", "datetime", "offset"]


@dataclass(frozen=True, slots=True)
class Membership:
    """What a join answers: the member's id, the group's generation and the member's partitions."""

    member_id: str
    generation: int
    assignments: list[TopicPartition]
    session_timeout_ms: int
    heartbeat_interval_ms: int


@dataclass(frozen=True, slots=True)
class Heartbeat:
    generation: int
    assignments: list[TopicPartition]
    rebalance: bool
    session_timeout_ms: int = 10_000


@dataclass(slots=True)
class Batch:
    """Records of one fetch, in offset order per partition; `version` is the log view's version the
    fetch read (wait for a newer one before fetching again when it came back empty)."""

    generation: int
    records: list[Record] = field(default_factory=list)
    version: int = 0
    resets: list[dict[str, Any]] = field(default_factory=list)
    session_timeout_ms: int = 10_000  # the member's: a waiting caller calls again well within it
    assignments: list[TopicPartition] = field(default_factory=list)
    auto_offset_reset: OffsetReset = "latest"
    auto_commit: bool = False
    record_filter: EventFilter | None = None  # the member's server-side filter


@dataclass(slots=True)
class StreamCursor:
    """Where one stream of a member stands (`GroupCoordinator.stream_fetch` reads and updates it): its
    generation, its delivery positions, and what the last check against the database answered."""

    group: str
    member_id: str
    generation: int
    positions: dict[TopicPartition, int] = field(default_factory=dict)
    assignments: list[TopicPartition] | None = None  # None: not checked yet
    auto_offset_reset: OffsetReset = "latest"
    session_timeout_ms: int = 10_000
    checked_at: float = 0.0  # time.monotonic() of the last check
    notices: tuple[int, int] = (-1, -1)  # RebalanceNotices.seen(group) before the last check
    checks: int = 0  # how many batches asked the database (for tests and diagnostics)
    record_filter: EventFilter | None = None  # the member's, as the last check found it
