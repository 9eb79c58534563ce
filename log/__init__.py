"""The log: where capture writes and every reader reads, behind one set of contracts.

Two backends: `tributary.log.local` (tributary's own segment log on one machine's disk, docs/log.md)
and `tributary.log.kafka` (an existing Kafka cluster, docs/kafka.md). What the rest of tributary
uses of either is typed in `tributary.log.contracts`; `open_writer`, `open_admin`, `open_reader`
and `open_group_offsets` open the configured one.
This layer imports nothing from capture, the event store, projections, consumers, sinks or the
API: they build on it.
"""

from __future__ import annotations

from tributary.log.backends import open_admin, open_group_offsets, open_reader, open_writer
from tributary.log.contracts import (
    BackgroundCleaner,
    CaptureWriter,
    Encode,
    GroupOffsets,
    GroupPartition,
    LogAdmin,
    LogReader,
    PositionsFrom,
    RebuiltLog,
    SourceWriter,
)
from tributary.log.kafka.options import VIEW_TIMEOUT_S, KafkaOptions
from tributary.log.local import (
    CleanerPolicy,
    CompactionState,
    GroupCommitter,
    LogError,
    Mark,
    MissingMetadataError,
    Record,
    TopicConfig,
    TopicOwnedError,
    TopicSummary,
    Verified,
    WriterFenced,
    describe_owner,
    encode_plain,
    hashes,
    partition_for,
    split_partitions,
)

__all__ = [
    "VIEW_TIMEOUT_S",
    "BackgroundCleaner",
    "CaptureWriter",
    "CleanerPolicy",
    "CompactionState",
    "Encode",
    "GroupCommitter",
    "GroupOffsets",
    "GroupPartition",
    "KafkaOptions",
    "LogAdmin",
    "LogReader",
    "LogError",
    "Mark",
    "MissingMetadataError",
    "PositionsFrom",
    "RebuiltLog",
    "Record",
    "SourceWriter",
    "TopicConfig",
    "TopicOwnedError",
    "TopicSummary",
    "Verified",
    "WriterFenced",
    "describe_owner",
    "encode_plain",
    "hashes",
    "open_admin",
    "open_group_offsets",
    "open_reader",
    "open_writer",
    "partition_for",
    "split_partitions",
]
