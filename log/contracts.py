"""What the rest of tributary uses of the log, whichever backend holds it (`tributary.log.open_*`
returns these): written from capture's, the CLI's and the HTTP API's use of the two backends.

* `CaptureWriter`: the capture daemon's transactional writer. Records appended through a source's
  `SourceWriter` stay invisible until `commit`, which makes them durable together with the
  positions named (a source's LSN, a chunked snapshot's context): on the local log one fsync and
  an atomic manifest replace, on Kafka one transaction per source with its positions in the
  offsets topic. Capture confirms a slot only after `commit` returned.
  Fencing: one writer per source. The local log refuses a second writer of its root at open
  (`LogLockedError`); on Kafka the newer process fences the older, whose next commit raises
  `ProducerFenced`. Both are `LogError`s, which stop capture as a whole.
* `SourceWriter`: one source's side of it: topics created on first use, appends per partition,
  the positions committed so far, and reads of what is committed (end offsets, live keys).
* `BackgroundCleaner`: compaction and retention run by capture between batches, where the
  backend needs it done (the local log); Kafka's broker compacts its own topics, so there is none.
* `LogAdmin`: what an operator's view asks of the configured log from any process (the CLI, the
  HTTP API's `/topics` and `/metrics`): topics, their sizes, the positions capture committed,
  `log verify` (and `--repair`, the local log's).
* `RebuiltLog`: what `log verify --repair` hands to capture when it rebuilt a lost manifest, so
  that capture finds the source positions again (the local log only: Kafka repairs itself).
* `LogReader`: committed data as a long-lived reader shared by threads sees it (consumer groups,
  sinks, `/streams`): partitions, bounds, reads from an offset, time lookups, refreshed on demand.
* `GroupOffsets`: consumer groups' committed offsets where the backend keeps them itself (Kafka's
  group offsets, so Kafka's tools see them); the local log has none (the service database keeps them).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import BinaryIO, Protocol

from tributary.log.local import (
    CleanerPolicy,
    CompactionStats,
    Mark,
    PartitionEnd,
    Record,
    RecordIn,
    TopicConfig,
    TopicSummary,
    Verified,
)

__all__ = [
    "BackgroundCleaner",
    "CaptureWriter",
    "Encode",
    "GroupOffsets",
    "LogAdmin",
    "LogReader",
    "PositionsFrom",
    "RebuiltLog",
    "SourceWriter",
    "Verified",
]

Encode = Callable[[int], tuple[bytes, list[int]]]
"""Lines pre-encoded for the local log (`encode_plain`, `encode_columns`), given the first offset:
(the lines, each line's length)."""


class SourceWriter(Protocol):
    """One source's view of the capture writer (see the module's doc)."""

    def topics(self) -> dict[str, TopicConfig]:
        """Every topic with its configuration (partitions, cleanup policy)."""
        ...

    def create_topic(self, name: str, config: TopicConfig | None = None) -> TopicConfig:
        """Create `name` (or find it made by someone else): what it is now."""
        ...

    def end_offsets(self, topic: str) -> list[int]:
        """Each partition's committed end."""
        ...

    def positions(self) -> dict[str, str]:
        """The positions committed so far, by name (a source, or a source's entry `<source>#…`)."""
        ...

    def append(self, topic: str, partition: int, records: Sequence[RecordIn]) -> int:
        """Append to one partition (invisible until a commit covers it); the first record's offset
        on the local log, the writer's running count on Kafka."""
        ...

    def append_encoded(self, topic: str, partition: int, encode: Encode, timestamp_ms: int) -> int:
        """`append` for lines pre-encoded in the local log's format (a bulk snapshot's)."""
        ...

    def mark(self) -> Mark:
        """What has been appended so far, for `commit(upto=…)`."""
        ...

    def commit(self, *, positions: Mapping[str, str] | None = None, upto: Mark | None = None) -> None:
        """The writer's commit (`CaptureWriter.commit`)."""
        ...

    def live_keys(self, topic: str) -> set[bytes]:
        """The keys of `topic` whose latest committed record is not a tombstone (schema records and
        keyless records aside), as a compacted read shows them; none for an unknown topic. Safe
        from any thread: it reads through a reader of its own."""
        ...

    def committed_through(self, mark: Mark) -> bool:
        """Is every record appended before `mark` committed (and so seen by `live_keys` from now on)?"""
        ...


class BackgroundCleaner(Protocol):
    """Compaction and retention paced by capture: a scan on the writer's thread between source
    transactions, one partition's compaction at a time on a thread of its own."""

    def next_job(self, now_ms: int) -> tuple[str, int] | None:
        """The (topic, partition) to compact now, if any (retention applied on the way)."""
        ...

    def clean_and_save(self, topic: str, partition: int, now_ms: int) -> CompactionStats:
        """Compact one partition's sealed segments and record the pass."""
        ...


class CaptureWriter(Protocol):
    """The capture daemon's transactional writer (see the module's doc). Not thread-safe: the
    capture loop's."""

    def source(self, name: str) -> SourceWriter:
        """What `name` appends through (on Kafka: its own transactional producer)."""
        ...

    def mark(self) -> Mark:
        """What has been appended so far, by every source."""
        ...

    def commit(self, *, positions: Mapping[str, str] | None = None, upto: Mark | None = None) -> None:
        """Make the records appended up to `upto` (all if None) durable and visible, together with
        `positions`; an empty `Mark()` commits positions alone. On Kafka, read_committed readers
        see a commit moments after it returned (`await_visible`)."""
        ...

    def await_visible(self, timeout_s: float = 10.0) -> None:
        """Return once readers see every commit made so far (the local log's on return; Kafka's
        once the brokers wrote the transactions' markers), waiting at most `timeout_s`. `close`
        does it too."""
        ...

    def background_cleaner(self, policy: CleanerPolicy, *, pid: int) -> BackgroundCleaner | None:
        """The cleaner capture runs between batches with `policy`; None where the backend keeps its
        topics itself (Kafka's broker)."""
        ...

    def close(self) -> None:
        """Drop what no commit covered (recovery or the next producer does the same) and let go."""
        ...


class LogAdmin(Protocol):
    """Committed facts about the configured log, for operators (read-only, any process)."""

    @property
    def compaction_keeps_unchanged_values(self) -> bool:
        """Whether compacting a topic keeps an unchanged TOASTed value that a later update omitted
        (the local log fills it in from the record it removes; Kafka's broker compacts blind)."""
        ...

    def exists(self) -> bool:
        """Whether there is a log to read yet (the local log's root: capture made it)."""
        ...

    def topics(self) -> list[TopicSummary]:
        """Each topic (internal ones aside) as `GET /topics` and `tributary log topics` show it:
        `topic`, `partitions`, `policy`, `records`, `start_offsets`, `end_offsets`, `compaction`;
        the local log adds `data_records` and `schema_records`, Kafka's policy is "broker"."""
        ...

    def topic_sizes(self) -> dict[str, tuple[int, int | None]]:
        """Per topic: (offsets from start to end, bytes on disk or None where the broker keeps them)."""
        ...

    def positions(self) -> dict[str, str]:
        """The positions capture committed, by name."""
        ...

    def verify(self, sources: Sequence[str]) -> Verified:
        """Check what capture relies on: the local log reads every committed record (CRC, order);
        on Kafka, whose broker checks its own records, the offsets topic, each of `sources`'
        position and every topic's partitions."""
        ...

    def repair(self, positions_from: PositionsFrom) -> list[str]:
        """Repair what `verify` finds, saying what was done; a lost manifest is rebuilt with the
        positions `positions_from` finds (the local log; Kafka refuses: its broker repairs itself)."""
        ...

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
        """`log cat`: one JSON line per committed record (`Record.to_json`) of `topic` (one
        `partition`, or all merged by timestamp) from `from_offset`; `compacted`: the latest record
        per key of what the topic holds now; `follow`: then the records committed later, until
        `stop()` is true (checked at least every half second). Returns how many lines were written
        (to `out`, default standard output)."""
        ...


class RebuiltLog(Protocol):
    """The local log as `log verify --repair` rebuilt it from its segments, read by the hook that
    finds the source positions again (`admin.repair(positions_from=…)`)."""

    @property
    def root(self) -> Path:
        """The log's directory (capture's status file lies beside the topics)."""
        ...

    def ends(self) -> dict[tuple[str, int], PartitionEnd]:
        """Each partition's committed end and its newest segment."""
        ...

    def read(self, topic: str, partition: int, from_offset: int = 0) -> Iterator[Record]:
        """One partition's committed records from `from_offset`, in offset order."""
        ...


PositionsFrom = Callable[[RebuiltLog], Mapping[str, str]]
"""Capture's hook that finds the source positions in a log a repair rebuilt (capture/resume.py)."""


class LogReader(Protocol):
    """Committed data for long-lived readers that share one view (thread-safe). `version` moves
    whenever a committed end or the topic set changed at the last `refresh`; a topic that does
    not exist (yet) reads as one with no partitions."""

    version: int
    refreshed_at: float  # time.monotonic() of the last refresh

    @property
    def root(self) -> Path | None:
        """The directory whose manifest changes when something is committed (to watch instead of
        polling), or None where there is no file to watch (Kafka)."""
        ...

    @property
    def skips_markers(self) -> bool:
        """Whether offsets have holes that are no record (Kafka's transaction markers): a read that
        ended by itself then reached the partition's end."""
        ...

    def refresh(self) -> bool:
        """Ask the log for its committed ends; True when something changed since the last refresh."""
        ...

    def refresh_if_older(self, seconds: float) -> None:
        """`refresh` unless the last one is younger than `seconds`."""
        ...

    def close(self) -> None: ...

    def partitions(self, topic: str) -> int:
        """The topic's partition count; 0 while it does not exist."""
        ...

    def bounds(self, topic: str, partition: int) -> tuple[int, int]:
        """(first retained offset, committed end) of one partition; (0, 0) while it does not exist."""
        ...

    def compacted(self, topic: str) -> bool:
        """Whether a read may find gaps in the topic's offsets (compaction, markers)."""
        ...

    def topic_owner(self, topic: str) -> str | None:
        """The writer owner of a committed topic where topics have owners (the local log: "" is
        capture, the default owner), so a writer can tell before writing that a name is taken;
        None for a topic not committed yet, and on Kafka, whose topics have none."""
        ...

    def read(self, topic: str, partition: int, from_offset: int) -> Iterator[Record]:
        """Committed records of one partition from `from_offset`, in offset order, up to the end the
        last refresh saw."""
        ...

    def offset_for_time(self, topic: str, partition: int, timestamp_ms: int) -> int:
        """The first offset whose record's timestamp is >= `timestamp_ms`, else the end."""
        ...


GroupPartition = tuple[str, int]
"""(topic, partition) of a consumer group's committed offset."""


class GroupOffsets(Protocol):
    """Consumer groups' committed offsets (the next offset each reads) kept by the backend."""

    @property
    def where(self) -> str:
        """The store, for error messages ("Kafka at host:port")."""
        ...

    def committed(self, group: str, tps: Sequence[GroupPartition]) -> dict[GroupPartition, int]:
        """The committed offsets of `tps` that have one."""
        ...

    def commit(self, group: str, note: str, offsets: Sequence[tuple[GroupPartition, int]]) -> None:
        """Commit `offsets` for `group`, each with `note` (who, which generation) as metadata."""
        ...

    def close(self) -> None: ...
