"""The log: where capture writes and every reader reads, behind one set of contracts.

Two backends: `tributary.log.local` (tributary's own segment log on one machine's disk, docs/log.md)
and `tributary.log.kafka` (an existing Kafka cluster, docs/kafka.md). What the rest of tributary
uses of either is typed in `tributary.log.contracts`; `open_writer` and `open_admin` open the
configured one.
This layer imports nothing from capture, the event store, projections, consumers, sinks or the
API: they build on it.
"""

from __future__ import annotations

from tributary.log.backends import open_admin, open_writer
from tributary.log.contracts import (
    BackgroundCleaner,
    CaptureWriter,
    Encode,
    LogAdmin,
    PositionsFrom,
    RebuiltLog,
    SourceWriter,
)
from tributary.log.kafka.options import KafkaOptions
from tributary.log.local import (
    CleanerPolicy,
    CompactionState,
    GroupCommitter,
    LogError,
    Mark,
    Record,
    TopicConfig,
    TopicSummary,
    Verified,
)

__all__ = [
    "BackgroundCleaner",
    "CaptureWriter",
    "CleanerPolicy",
    "CompactionState",
    "Encode",
    "GroupCommitter",
    "KafkaOptions",
    "LogAdmin",
    "LogError",
    "Mark",
    "PositionsFrom",
    "RebuiltLog",
    "Record",
    "SourceWriter",
    "TopicConfig",
    "TopicSummary",
    "Verified",
    "open_admin",
    "open_writer",
]
