"""The log's value objects: records as read back, topic configs, splits, problems, marks."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import PurePath
from typing import Any, Literal, NotRequired, TypedDict

import orjson

__all__ = [
    "COMPACTED_POLICIES",
    "CompactionState",
    "CompactionStats",
    "Mark",
    "PartitionEnd",
    "Policy",
    "Problem",
    "Record",
    "Split",
    "TopicConfig",
    "TopicSummary",
    "Verified",
]

# `tombstones`: every record is kept, except that a key's tombstone removes the key's earlier
# records (the event store's topics: a deleted stream goes, every other stream keeps its history).
Policy = Literal["delete", "compact", "none", "tombstones"]
_POLICIES = ("delete", "compact", "none", "tombstones")
COMPACTED_POLICIES = ("compact", "tombstones")  # compaction rewrites their segments (offsets may gap)


@dataclass(frozen=True, slots=True)
class Record:
    """One committed record as read back; key/value/headers are raw JSON bytes (None = null)."""

    topic: str
    partition: int
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: bytes | None

    def to_json(self) -> bytes:
        """The `log cat` line; key/value/headers are embedded as JSON, not as strings."""
        return orjson.dumps(
            {
                "topic": self.topic,
                "partition": self.partition,
                "offset": self.offset,
                "timestamp": self.timestamp,
                "key": None if self.key is None else orjson.Fragment(self.key),
                "value": None if self.value is None else orjson.Fragment(self.value),
                "headers": None if self.headers is None else orjson.Fragment(self.headers),
            }
        )


@dataclass(frozen=True, slots=True)
class TopicConfig:
    """Per-topic settings; None segment knobs mean "the log's defaults"."""

    partitions: int
    policy: Policy = "delete"
    retention_ms: int | None = None
    retention_bytes: int | None = None
    delete_retention_ms: int = 86_400_000
    segment_bytes: int | None = None
    segment_ms: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.partitions, int) or self.partitions < 1:
            raise ValueError(f"TopicConfig.partitions must be a positive int, got {self.partitions!r}")
        if self.policy not in _POLICIES:
            raise ValueError(f"TopicConfig.policy must be one of {_POLICIES}, got {self.policy!r}")
        if self.segment_bytes is not None and not 0 < self.segment_bytes < 1 << 32:
            raise ValueError(f"TopicConfig.segment_bytes must be in 1..2**32-1, got {self.segment_bytes}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TopicConfig:
        known = {k: data[k] for k in cls.__dataclass_fields__ if k in data}
        return cls(**known)


@dataclass(frozen=True, slots=True)
class Split:
    """A byte range of one segment file holding whole committed records (for parallel readers).

    `end_offset` (exclusive) bounds the offsets the split stands for, so a reader can still serve
    it by offset after a compaction rewrote the file (None: the byte range alone, checked)."""

    topic: str
    partition: int
    path: str
    start_byte: int
    end_byte: int
    first_offset: int
    end_offset: int | None = None

    @property
    def base(self) -> int:
        """The base offset of the segment the split is in."""
        return segment_base(self.path)


def segment_base(path: str) -> int:
    """The base offset of the segment file at `path` (segment files are named by it)."""
    return int(PurePath(path).name[:20])


@dataclass(frozen=True, slots=True)
class Problem:
    """One thing `verify` found wrong; `offset` is None when it is not about one record."""

    topic: str
    partition: int
    segment: str
    offset: int | None
    message: str

    def __str__(self) -> str:
        at = f" offset {self.offset}" if self.offset is not None else ""
        return f"{self.topic}/{self.partition} {self.segment}{at}: {self.message}"


@dataclass(frozen=True, slots=True)
class PartitionEnd:
    """Where a partition's data ends: next offset, the segment it ends in, bytes used there."""

    end: int
    segment: int
    nbytes: int


@dataclass(frozen=True, slots=True)
class Mark:
    """An opaque snapshot of every partition's appended end (commit a prefix with `upto=`)."""

    ends: dict[tuple[str, int], PartitionEnd] = field(default_factory=dict)


@dataclass(slots=True)
class CompactionStats:
    """What a compaction pass did."""

    segments_rewritten: int = 0
    segments_deleted: int = 0
    records_before: int = 0
    records_after: int = 0
    bytes_before: int = 0
    bytes_after: int = 0


class CompactionState(TypedDict):
    """A compact topic's compaction as its cleaner recorded it (`cleaner.json`): JSON for
    `GET /topics` and `tributary log topics`."""

    last_compaction_ms: int | None
    last_compaction: str | None  # the same instant, "YYYY-MM-DD HH:MM:SS UTC"
    partitions_compacted: int
    records_before: int
    records_after: int
    bytes_before: int
    bytes_after: int
    cleaner_pid: int | None
    cleaner_interval_s: float | None
    cleaner_last_pass_ms: int | None


class TopicSummary(TypedDict):
    """One topic as `GET /topics` and `tributary log topics` show it (`LogAdmin.topics`): the local
    log counts data and schema records apart; on Kafka `records` is the offsets from start to end."""

    topic: str
    partitions: int
    policy: str
    records: int
    data_records: NotRequired[int]
    schema_records: NotRequired[int]
    start_offsets: list[int]
    end_offsets: list[int]
    compaction: CompactionState | None


@dataclass
class Verified:
    """What a check of the log found, as `tributary log verify` says it (`LogAdmin.verify`,
    tributary.log.contracts)."""

    where: str  # the log checked, for the failure line: "in <root>", "on Kafka at <servers>"
    ok: str  # the line that says all is well
    notes: list[str] = field(default_factory=list)  # what was seen (stdout)
    warnings: list[str] = field(default_factory=list)  # worth a look, not a failure
    problems: list[str] = field(default_factory=list)  # each a whole line ("corrupt: …"): any fails the check
