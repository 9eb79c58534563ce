"""The log cleaner: which partitions to compact and when, tombstone horizons, and its record.

The writer (the capture daemon between batches, or `tributary log compact` while capture is
stopped) owns a `Cleaner`. Like Kafka's log cleaner it tracks, per partition, a *clean end*: every
sealed segment below it was compacted by an earlier pass. The records at or after it are the
*dirty* section; a partition is cleaned when its sealed dirty bytes reach
`min_cleanable_dirty_ratio` of its sealed bytes (Kafka's `min.cleanable.dirty.ratio`), or when a
tombstone it kept becomes old enough to drop. What it did is kept in `<root>/cleaner.json`
(replaced atomically), which `tributary log compact` and `GET /topics` read.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from tributary.log.local import _fileio
from tributary.log.local.compaction import compact_partition
from tributary.log.local.manifest import PartitionState
from tributary.log.local.reader import committed_segments, partition_dir
from tributary.log.local.segment import list_segments, log_path, parquet_path
from tributary.log.local.types import COMPACTED_POLICIES, CompactionStats, TopicConfig

__all__ = ["CHECKPOINT", "Cleaner", "CleanerPolicy", "CleanedLog", "PartitionCheckpoint", "read_checkpoint"]

CHECKPOINT = "cleaner.json"
_log = logging.getLogger(__name__)


class CleanedLog(Protocol):
    """What the cleaner needs of the log it cleans (a `Log` opened as the writer). A protocol,
    so that the log can own a cleaner (`Log.compact`) without the two modules importing each other."""

    @property
    def root(self) -> Path: ...

    @property
    def home(self) -> Path: ...  # where the writer's own files are: the cleaner's record goes there

    @property
    def index_interval_bytes(self) -> int: ...

    def topics(self) -> dict[str, TopicConfig]: ...

    def topic_config(self, topic: str) -> TopicConfig: ...

    def partition_state(self, topic: str, partition: int) -> PartitionState: ...

    def enforce_retention(
        self,
        *,
        now_ms: int,
        default_retention_ms: int | None = None,
        default_retention_bytes: int | None = None,
        on_removed: Callable[[Path], object] | None = None,
    ) -> int: ...


@dataclass(frozen=True, slots=True)
class CleanerPolicy:
    """How the cleaner paces itself; None retention values defer to each topic's config."""

    interval_ms: int = 15_000
    min_cleanable_dirty_ratio: float = 0.5
    delete_retention_ms: int | None = None
    retention_ms: int | None = None
    retention_bytes: int | None = None
    file_delete_delay_ms: int = 60_000


@dataclass(slots=True)
class PartitionCheckpoint:
    """One partition's cleaning state: the clean end, the passes that moved it (offset, time),
    when a kept tombstone becomes droppable, the last compaction's figures, and `live`: how many
    records the offsets below `live_end` (the clean end the last pass reached) held after that pass
    (None: no pass yet)."""

    clean_end: int = 0
    passes: list[tuple[int, int]] = field(default_factory=list)
    tombstones_due_ms: int | None = None
    last: dict[str, float] | None = None
    live: int | None = None
    live_end: int = 0

    def records(self, start: int, end: int) -> int:
        """Records in the partition's committed offsets [start, end): the span, minus what the
        last pass removed below `live_end` (the span itself when the record does not fit the log)."""
        if self.live is None or not start <= self.live_end <= end or self.live > self.live_end - start:
            return end - start
        return self.live + end - self.live_end

    def covered_since(self, offset: int) -> int | None:
        """When a pass first covered `offset` (every older record of its key gone since)."""
        for end, at_ms in self.passes:
            if offset < end:
                return at_ms
        return None

    def record_pass(self, clean_end: int, now_ms: int, retention_ms: int) -> None:
        if clean_end > self.clean_end or not self.passes:
            self.passes.append((clean_end, now_ms))
        self.clean_end = max(self.clean_end, clean_end)
        # a pass old enough to release tombstones covers everything an older one did
        old = [i for i, (_end, at) in enumerate(self.passes) if now_ms - at >= retention_ms]
        if old:
            self.passes = self.passes[old[-1] :]

    def to_json(self) -> dict[str, Any]:
        return {
            "clean_end": self.clean_end,
            "passes": [list(p) for p in self.passes],
            "tombstones_due_ms": self.tombstones_due_ms,
            "last": self.last,
            "live": self.live,
            "live_end": self.live_end,
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> PartitionCheckpoint:
        return cls(
            int(d.get("clean_end", 0)),
            [(int(e), int(t)) for e, t in d.get("passes", [])],
            d.get("tombstones_due_ms"),
            d.get("last"),
            None if d.get("live") is None else int(d["live"]),
            int(d.get("live_end", 0)),
        )


def read_checkpoint(root: Path) -> dict[str, Any]:
    """The cleaner's record (`{}` if it never ran, or if the file is unreadable: then the next
    pass starts from a clean end of 0, which is slower but never wrong)."""
    try:
        data = json.loads((root / CHECKPOINT).read_text())
    except (FileNotFoundError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


class Cleaner:
    """Compaction and retention for one writer, a little at a time: `step(now_ms)` does at most
    one partition's compaction (or one retention sweep) and returns."""

    def __init__(self, log: CleanedLog, policy: CleanerPolicy, *, pid: int | None = None) -> None:
        self.log = log
        self.policy = policy
        self.pid = pid
        doc = read_checkpoint(log.home)
        self.partitions = {k: PartitionCheckpoint.from_json(v) for k, v in doc.get("partitions", {}).items()}
        self.retention: dict[str, Any] = doc.get("retention", {})
        self.last_pass_ms: int | None = doc.get("last_pass_ms")
        self.last_compaction_ms: int | None = doc.get("last_compaction_ms")
        self.queue: deque[tuple[str, int]] = deque()
        self.next_scan_ms = 0
        self.superseded: dict[Path, int] = {}  # stale Parquet copies → when to delete them
        self._checked: dict[Path, tuple[tuple[int, ...], bool]] = {}  # copy → (file identities, is_current)
        self.scanned_work = False

    # -- pacing -------------------------------------------------------------------------------

    def step(self, now_ms: int) -> bool:
        """One unit of background work if any is due, on this thread; True if something was done."""
        job = self.next_job(now_ms)
        if job is None:
            return self.scanned_work
        self.clean_and_save(*job, now_ms)
        return True

    def next_job(self, now_ms: int) -> tuple[str, int] | None:
        """The next partition to compact, scanning first if the queue is empty and a scan is due.

        The scan (retention, which commits new start offsets, and the list of cleanable
        partitions) runs on the caller's thread, which must be the writer's; the compaction of
        the partition returned may run on another (`clean_and_save`), but only one at a time
        and never while a scan runs."""
        self.scanned_work = False
        if not self.queue:
            if now_ms < self.next_scan_ms:
                return None
            self.next_scan_ms = now_ms + self.policy.interval_ms
            removed = self.apply_retention(now_ms)
            self._sweep_parquet(now_ms)
            self.queue.extend(self.cleanable(now_ms))
            self.last_pass_ms = now_ms
            self.save()
            self.scanned_work = bool(removed)
        while self.queue:
            topic, p = self.queue.popleft()
            if topic in self.log.topics():
                return topic, p
        return None

    def clean_and_save(self, topic: str, p: int, now_ms: int) -> CompactionStats:
        """`clean` one partition and record it (safe on a thread of its own, see `next_job`)."""
        try:
            return self.clean(topic, p, now_ms)
        finally:
            self.save()

    def cleanable(self, now_ms: int) -> list[tuple[str, int]]:
        """Partitions of `compact` topics whose sealed dirty bytes reach the ratio, or holding a
        tombstone that may now be dropped."""
        out = []
        for name, cfg in self.log.topics().items():
            if cfg.policy not in COMPACTED_POLICIES:
                continue
            for p in range(cfg.partitions):
                cp = self.partitions.get(f"{name}/{p}", PartitionCheckpoint())
                due = cp.tombstones_due_ms is not None and cp.tombstones_due_ms <= now_ms
                dirty, total = self.dirty_bytes(name, p, cp.clean_end)
                ratio = dirty / total if total else 0.0
                if due or (dirty and ratio >= self.policy.min_cleanable_dirty_ratio):
                    out.append((name, p))
        return out

    def dirty_bytes(self, topic: str, p: int, clean_end: int) -> tuple[int, int]:
        """(sealed bytes at or after the clean end, all sealed bytes) of a partition."""
        state = self.log.partition_state(topic, p)
        pdir = partition_dir(self.log.root, topic, p)
        dirty = total = 0
        for base in committed_segments(pdir, state):
            if base >= state.segment:
                break
            try:
                size = log_path(pdir, base).stat().st_size
            except FileNotFoundError:
                continue
            total += size
            if base >= clean_end:
                dirty += size
        return dirty, total

    # -- the work -----------------------------------------------------------------------------

    def clean(self, topic: str, p: int, now_ms: int) -> CompactionStats:
        """Compact one partition now (whatever its dirty ratio) and record the pass."""
        cfg = self.log.topics()[topic]
        retention = self.policy.delete_retention_ms
        retention = cfg.delete_retention_ms if retention is None else retention
        key = f"{topic}/{p}"
        cp = self.partitions.setdefault(key, PartitionCheckpoint())
        state = self.log.partition_state(topic, p)
        stats = CompactionStats()
        started = time.perf_counter()
        superseded: list[Path] = []
        due = compact_partition(
            self.log.root,
            topic,
            p,
            state,
            cfg,
            now_ms,
            self.log.index_interval_bytes,
            stats,
            clean_end=cp.clean_end,
            delete_retention_ms=retention,
            covered_since=cp.covered_since,
            superseded=superseded,
        )
        for path in superseded:
            self.superseded.setdefault(path, now_ms + self.policy.file_delete_delay_ms)
        cp.record_pass(state.segment, now_ms, retention)
        cp.tombstones_due_ms = due
        # the pass read every sealed committed segment, so this is all of [start, state.segment)
        cp.live, cp.live_end = stats.records_after, state.segment
        if stats.records_before:
            seconds = round(time.perf_counter() - started, 3)
            cp.last = {"at_ms": now_ms, **_figures(stats), "seconds": seconds}
            self.last_compaction_ms = now_ms
            _log.info(
                "compacted %s/%d: %d → %d records, %d → %d bytes in %.3fs",
                topic,
                p,
                stats.records_before,
                stats.records_after,
                stats.bytes_before,
                stats.bytes_after,
                seconds,
            )
        return stats

    def compact_now(self, topic: str | None, now_ms: int) -> CompactionStats:
        """Every partition of the `compact` topic(s) at once (`tributary log compact`)."""
        total = CompactionStats()
        topics = self.log.topics()
        names = [topic] if topic is not None else list(topics)
        for name in names:
            cfg = self.log.topic_config(name)
            if cfg.policy not in COMPACTED_POLICIES:
                continue
            for p in range(cfg.partitions):
                s = self.clean(name, p, now_ms)
                for f in _figures(total):
                    setattr(total, f, getattr(total, f) + getattr(s, f))
        self.last_pass_ms = now_ms
        self.save()
        return total

    def apply_retention(self, now_ms: int) -> int:
        """Time/size retention of `delete` topics (the cleaner's defaults where a topic has none)."""
        removed = self.log.enforce_retention(
            now_ms=now_ms,
            default_retention_ms=self.policy.retention_ms,
            default_retention_bytes=self.policy.retention_bytes,
            on_removed=lambda path: self.superseded.setdefault(path, now_ms + self.policy.file_delete_delay_ms),
        )
        if removed:
            self.retention = {"at_ms": now_ms, "segments_deleted": removed}
        return removed

    def _sweep_parquet(self, now_ms: int) -> None:
        """Delete superseded Parquet copies once `file_delete_delay_ms` has passed (a reader that
        planned with one has had that long to read it). Copies found stale after a restart get
        the same delay from the moment they are found."""
        for name, cfg in self.log.topics().items():
            for p in range(cfg.partitions):
                pdir = partition_dir(self.log.root, name, p)
                try:
                    names = [n for n in os.listdir(pdir) if n.endswith(".parquet")]
                except FileNotFoundError:
                    continue
                if not names:
                    continue
                live = set(list_segments(pdir))
                for n in names:
                    base = int(n[:20])
                    if base in live and self._is_current(pdir, base):
                        continue
                    self.superseded.setdefault(pdir / n, now_ms + self.policy.file_delete_delay_ms)
        for path, due in list(self.superseded.items()):
            if due > now_ms:
                continue
            del self.superseded[path]
            base = int(path.name[:20])
            if log_path(path.parent, base).exists() and self._is_current(path.parent, base):
                continue  # remade from the new version meanwhile
            path.unlink(missing_ok=True)
            self._checked.pop(path, None)

    def _is_current(self, pdir: Path, base: int) -> bool:
        """`columnar.is_current`, its footer read again only when the copy or the segment changed
        since the last scan (a copy is replaced by rename, so a new version is a new inode): the
        scans run on the writer's thread and would otherwise read every copy's footer each time."""
        from tributary.log.local.columnar import is_current  # loads pyarrow: only when there are copies

        path = parquet_path(pdir, base)
        try:
            copy = path.stat()
            seg_size = log_path(pdir, base).stat().st_size
        except FileNotFoundError:
            return is_current(pdir, base)
        ident = (copy.st_ino, copy.st_mtime_ns, copy.st_size, seg_size)
        seen = self._checked.get(path)
        if seen is not None and seen[0] == ident:
            return seen[1]
        current = is_current(pdir, base)
        self._checked[path] = (ident, current)
        return current

    # -- the record ---------------------------------------------------------------------------

    def save(self) -> None:
        """Replace `cleaner.json` atomically (temp file, fsync, rename)."""
        doc = {
            "format": 1,
            "pid": self.pid,
            "interval_ms": self.policy.interval_ms,
            "min_cleanable_dirty_ratio": self.policy.min_cleanable_dirty_ratio,
            "last_pass_ms": self.last_pass_ms,
            "last_compaction_ms": self.last_compaction_ms,
            "retention": self.retention,
            "partitions": {k: v.to_json() for k, v in sorted(self.partitions.items())},
        }
        path = self.log.home / CHECKPOINT
        tmp = path.with_name(CHECKPOINT + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            _fileio.write_all(fd, json.dumps(doc, indent=1).encode() + b"\n", f"writing {tmp}")
            _fileio.fsync(fd, f"syncing {tmp}")
        finally:
            os.close(fd)
        os.replace(tmp, path)


def _figures(stats: CompactionStats) -> dict[str, float]:
    return {
        "records_before": stats.records_before,
        "records_after": stats.records_after,
        "bytes_before": stats.bytes_before,
        "bytes_after": stats.bytes_after,
        "segments_rewritten": stats.segments_rewritten,
        "segments_deleted": stats.segments_deleted,
    }
