"""tributary's log: topics → partitions → segments of JSON lines under one root directory, one
writer process per topic owner (capture, or a named owner beside it), any number of readers; a
commit is fsync + an atomic replace of the owner's manifest.

This package's names (`__all__`) are its whole public API; its modules are its own business.
See docs/log.md.

Writing (one process per owner holds its writer lock):
    `Log.open(root, writer=True)` (capture; `owner=name` for a writer of its own topics beside it), `create_topic(name, TopicConfig(...))`, `append`/`append_encoded`
    then `commit` (or `commit_async`, `mark` + `commit(upto=...)`); `GroupCommitter` batches
    commits of concurrent producers. Keys: `canonical_json`, `partition_for` (Kafka's murmur2
    partitioning, `murmur2`, `hashes`, `split_partitions`); bulk writers pre-encode lines with
    `encode_plain` (rows) or `encode_columns` (Arrow columns); `decode_line` reads one such line
    back (another writer, e.g. Kafka's, takes pre-encoded lines that way). `Cleaner` with a `CleanerPolicy`
    compacts and applies retention between batches; `Log.compact`, `Log.enforce_retention` and
    `Log.write_parquet` do it on demand.

Reading (any process, committed data only):
    `Log.open(root)`, `read`/`read_from_time` → `Record`s; `ends()`, `end_offsets`,
    `start_offsets`, `positions`; `refresh()` to see newer commits. `LogView`: one reader that
    threads share (consumer groups, sinks, `/streams`), refreshed on demand.

Parallel readers (Spark): `Log.splits(topic)` → `Split`s (byte ranges of whole records), read
    anywhere with `read_split` (records) or `read_split_columns` (Arrow columns).

Columnar copies: `RECORD_SCHEMA` is a record's Arrow schema. Sealed segments — and an active
    segment's committed prefix (`Log.tail_copy`) — get Parquet copies that the log plans
    (`SegmentCopy`), reads (`copy_records`, `COPY_SCHEMA`) and installs (`Log.make_copies`, whose
    caller brings the Parquet writer); `SegmentCopy.path` is the file to read once `current()`.

Admin operations (what `tributary log …` and `GET /topics` run): `tributary.log.local.admin`.
Errors: every failure is a `LogError`; the subclasses say what a caller may handle.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tributary.log.local import admin
from tributary.log.local.cleaner import Cleaner, CleanerPolicy
from tributary.log.local.codec import RecordIn, decode_line, encode_plain
from tributary.log.local.errors import (
    CorruptRecordError,
    DiskFullError,
    LogError,
    LogLockedError,
    MissingMetadataError,
    TopicNotFoundError,
    TopicOwnedError,
    WriterFenced,
)
from tributary.log.local.group_commit import GroupCommitter
from tributary.log.local.log import Log
from tributary.log.local.owners import describe as describe_owner
from tributary.log.local.partitioner import canonical_json, hashes, murmur2, partition_for, split_partitions
from tributary.log.local.splits import read_split
from tributary.log.local.types import (
    CompactionState,
    CompactionStats,
    Mark,
    PartitionEnd,
    Policy,
    Problem,
    Record,
    Split,
    TopicConfig,
    TopicSummary,
    Verified,
)
from tributary.log.local.view import LogView

if TYPE_CHECKING:
    from tributary.log.local.codec_arrow import encode_columns
    from tributary.log.local.columnar import (
        COPY_SCHEMA,
        RECORD_SCHEMA,
        SegmentCopy,
        TailCopy,
        copy_records,
        read_split_columns,
    )

__all__ = [
    "COPY_SCHEMA",
    "RECORD_SCHEMA",
    "Cleaner",
    "CleanerPolicy",
    "CompactionState",
    "CompactionStats",
    "CorruptRecordError",
    "DiskFullError",
    "GroupCommitter",
    "Log",
    "LogError",
    "LogLockedError",
    "MissingMetadataError",
    "Mark",
    "PartitionEnd",
    "Policy",
    "Problem",
    "Record",
    "RecordIn",
    "SegmentCopy",
    "Split",
    "TailCopy",
    "TopicConfig",
    "TopicNotFoundError",
    "TopicOwnedError",
    "TopicSummary",
    "Verified",
    "WriterFenced",
    "admin",
    "canonical_json",
    "copy_records",
    "decode_line",
    "describe_owner",
    "encode_columns",
    "encode_plain",
    "hashes",
    "murmur2",
    "partition_for",
    "read_split",
    "read_split_columns",
    "split_partitions",
    "LogView",
]

# Names whose modules load pyarrow: imported on first use, so that opening a log, the CLI and
# the capture daemon's start do not pay for it.
_LAZY = {
    "COPY_SCHEMA": "columnar",
    "RECORD_SCHEMA": "columnar",
    "SegmentCopy": "columnar",
    "TailCopy": "columnar",
    "copy_records": "columnar",
    "read_split_columns": "columnar",
    "encode_columns": "codec_arrow",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from importlib import import_module

    value = getattr(import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value
