"""tributary's log storage engine: topics → partitions → segments of JSON lines, one writer,
commit = fsync + atomic manifest replace. See docs/log.md."""

from tributary.capture.log.errors import (
    CorruptRecordError,
    DiskFullError,
    LogError,
    LogLockedError,
    TopicNotFoundError,
)
from tributary.capture.log.group_commit import GroupCommitter
from tributary.capture.log.log import Log
from tributary.capture.log.partitioner import canonical_json, murmur2, partition_for
from tributary.capture.log.splits import read_split
from tributary.capture.log.types import (
    CompactionStats,
    Mark,
    PartitionEnd,
    Policy,
    Problem,
    Record,
    Split,
    TopicConfig,
)

__all__ = [
    "CompactionStats",
    "CorruptRecordError",
    "DiskFullError",
    "GroupCommitter",
    "Log",
    "LogError",
    "LogLockedError",
    "Mark",
    "PartitionEnd",
    "Policy",
    "Problem",
    "Record",
    "Split",
    "TopicConfig",
    "TopicNotFoundError",
    "canonical_json",
    "murmur2",
    "partition_for",
    "read_split",
]
