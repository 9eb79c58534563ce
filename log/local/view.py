"""`LogReader` (tributary.log.contracts) over the local log: one shared reader of committed data,
refreshed on demand, as consumer groups, sinks and `/streams` see it.

Only the log's public API is used (`Log.open(root)`, `refresh`, `read`, `read_from_time`,
`start_offsets`, `end_offsets`, `topic_config`, `ends`). A root that holds no log yet (capture never
ran) reads as a log without topics, and is opened again on the next refresh.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

from tributary.log.local.errors import LogError, TopicNotFoundError
from tributary.log.local.log import Log
from tributary.log.local.types import COMPACTED_POLICIES, PartitionEnd, Record

__all__ = ["LogView"]


class LogView:
    """A reader `Log` that several threads share: `refresh()` re-reads the manifest (the reader swaps
    in a new snapshot at once; each read uses the snapshot current when it started)."""

    skips_markers = False  # offsets are contiguous but for compaction

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self._log: Log | None = None
        self._lock = threading.Lock()
        self.refreshed_at = 0.0
        self.ends: dict[tuple[str, int], PartitionEnd] = {}
        self.version = 0  # bumped whenever a committed end (or the topic set) changes

    def refresh(self) -> bool:
        """Re-read the manifest; True when something new was committed since the last refresh."""
        with self._lock:
            try:
                if self._log is None:
                    self._log = Log.open(self.root)
                else:
                    self._log.refresh()
                ends = self._log.ends()
            except LogError:
                if self._log is not None and self.root.is_dir():
                    raise  # a log that was there and cannot be read now (e.g. its manifest vanished)
                self._log, ends = None, {}
            self.refreshed_at = time.monotonic()
            if ends == self.ends:
                return False
            self.ends = ends
            self.version += 1
            return True

    def refresh_if_older(self, seconds: float) -> None:
        if time.monotonic() - self.refreshed_at >= seconds:
            self.refresh()

    def close(self) -> None:
        with self._lock:
            if self._log is not None:
                self._log.close()
                self._log = None

    # -- what a group needs -------------------------------------------------------------------

    def partitions(self, topic: str) -> int:
        """The topic's partition count; 0 while it does not exist (yet)."""
        log = self._log
        if log is None:
            return 0
        try:
            return len(log.end_offsets(topic))
        except (TopicNotFoundError, LogError):
            return 0

    def bounds(self, topic: str, partition: int) -> tuple[int, int]:
        """(first retained offset, committed end) of one partition; (0, 0) while it does not exist."""
        log = self._log
        if log is None:
            return 0, 0
        try:
            return log.start_offsets(topic)[partition], log.end_offsets(topic)[partition]
        except (TopicNotFoundError, LogError, IndexError):
            return 0, 0

    def compacted(self, topic: str) -> bool:
        """True when compaction may leave gaps in the topic's offsets (policy `compact` or `tombstones`)."""
        log = self._log
        if log is None:
            return False
        try:
            return log.topic_config(topic).policy in COMPACTED_POLICIES
        except (TopicNotFoundError, LogError):
            return False

    def topic_owner(self, topic: str) -> str | None:
        """The owner of a committed topic ("" for capture); None before any commit lists it."""
        log = self._log
        return None if log is None else log.owner_of(topic)

    def read(self, topic: str, partition: int, from_offset: int) -> Iterator[Record]:
        log = self._log
        if log is None:
            return iter(())
        return log.read(topic, partition, from_offset)

    def offset_for_time(self, topic: str, partition: int, timestamp_ms: int) -> int:
        """The first offset whose record timestamp is >= timestamp_ms (the log's time index), else the end."""
        log = self._log
        if log is None:
            return 0
        for record in log.read_from_time(topic, partition, timestamp_ms):
            return record.offset
        return self.bounds(topic, partition)[1]
