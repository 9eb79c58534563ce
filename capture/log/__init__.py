"""tributary's log storage engine: topics → partitions → segments of JSON lines, one writer,
commit = fsync + atomic manifest replace. See docs/log.md."""

from capture.log.errors import (
    CorruptRecordError,
    DiskFullError,
    LogError,
    LogLockedError,
    TopicNotFoundError,
)
from capture.log.group_commit import GroupCommitter
from capture.log.log import Log
from capture.log.partitioner import canonical_json, murmur2, partition_for
from capture.log.splits import read_split
from capture.log.types import (
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
