"""`Log`: topics → partitions → segments under one root, one writer process per topic owner
(owners.py), any number of readers.

Durability lives in one place, `_commit_job` (numbered steps). Readers only ever see what the
manifest says is committed; the writer's recovery cuts everything else away on open.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING

from tributary.log.local import _fileio
from tributary.log.local.cleaner import Cleaner, CleanerPolicy
from tributary.log.local.codec import RecordIn
from tributary.log.local.compaction import expired_segments, remove_segments
from tributary.log.local.errors import (
    CorruptRecordError,
    LogError,
    LogLockedError,
    TopicNotFoundError,
    TopicOwnedError,
)
from tributary.log.local.keys import SCAN_BYTES
from tributary.log.local.manifest import (
    MANIFEST,
    Manifest,
    PartitionState,
    TopicState,
    encode_manifest,
    read_manifest,
)
from tributary.log.local.owners import CLAIM, LOCK, claim, claimed_by, describe, home, read_union
from tributary.log.local.partition import PartitionWriter
from tributary.log.local.partitioner import partition_for
from tributary.log.local.reader import committed_segments, partition_dir, read_partition, read_partition_from_time
from tributary.log.local.rebuild import read_checked, rebuild, require_metadata, topics_with_data, write_topic_meta
from tributary.log.local.segment import SegmentRef, parquet_path
from tributary.log.local.splits import plan_splits
from tributary.log.local.types import (
    CompactionStats,
    Mark,
    PartitionEnd,
    Problem,
    Record,
    Split,
    TopicConfig,
)
from tributary.log.local.verify import verify_log

if TYPE_CHECKING:  # the module loads pyarrow: imported where used
    from tributary.log.local.columnar import SegmentCopy, TailCopy

__all__ = ["Log"]

_TOPIC = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,248}$")


class Log:
    """A log root. Use `Log.open(root, writer=True)` in the one writer process of the default
    owner, `Log.open(root, writer=True, owner=name)` in a named owner's."""

    def __init__(
        self,
        root: Path,
        *,
        writer: bool,
        owner: str = "",
        default_partitions: int,
        segment_bytes: int,
        segment_ms: int,
        index_interval_bytes: int,
        fsync: bool,
    ) -> None:
        self.root = root
        self.writer = writer
        self.owner = owner  # "" is the default owner; a reader reads every owner's topics
        self.home = home(root, owner)  # this writer's lock and manifest
        self.default_partitions = default_partitions
        self.segment_bytes = segment_bytes
        self.segment_ms = segment_ms
        self.index_interval_bytes = index_interval_bytes
        self.fsync = fsync
        self._committed = Manifest()
        self._submitted = Manifest()
        self._writers: dict[tuple[str, int], PartitionWriter] = {}
        self._lock_fd = -1
        self._worker: ThreadPoolExecutor | None = None
        self._syncers: ThreadPoolExecutor | None = None
        self._failed: BaseException | None = None
        self.repaired: list[str] = []
        self._rebuilt = False  # the manifest was (partly) rebuilt from segments by this open's repair
        self._closed = False

    # -- opening ---------------------------------------------------------------------------

    @classmethod
    def open(
        cls,
        root: Path,
        *,
        writer: bool = False,
        default_partitions: int = 4,
        segment_bytes: int = 128 << 20,
        segment_ms: int = 7 * 86_400_000,
        index_interval_bytes: int = 4096,
        fsync: bool = True,
        repair: bool = False,
        create: bool = True,
        positions_from: Callable[[Log], Mapping[str, str]] | None = None,
        owner: str | None = None,
        lock_timeout_s: float = 0.0,
    ) -> Log:
        """Open a log root: a writer takes the lock and recovers; a reader reads the manifest.

        Segment files holding records that the manifest does not list (it was deleted, or is an
        older copy) are refused with a LogError naming `tributary log verify --repair`: taken for
        an empty log, they would be cut away by the writer.

        `repair=True` (writer only) cuts a partition whose committed tail is damaged back to its
        last intact record instead of refusing to open, and rebuilds the manifest's missing topics
        from their segments; what was done is in `log.repaired`. Source positions are the
        writer's, opaque to the log: on a rebuild, `positions_from(log)` supplies those the
        manifest lost, read from the rebuilt log before anything is committed.
        `create=False` (writer) opens only an existing log: "no log at …" otherwise; only the
        process that writes the log (capture) creates its root.

        `owner` (writer): a named owner's writer, beside the default one (capture) and other
        owners: its own lock, manifest and source positions; it writes only the topics it
        created (owners.py). Readers ignore it and see every owner's committed topics.
        `lock_timeout_s` (writer): how long to wait for a lock another process holds (an owner
        shared by processes taking turns, e.g. `groups`) before refusing; 0 refuses at once."""
        if not 0 < segment_bytes < 1 << 32:
            raise ValueError(f"segment_bytes must be in 1..2**32-1, got {segment_bytes}")
        log = cls(
            Path(root),
            writer=writer,
            default_partitions=default_partitions,
            segment_bytes=segment_bytes,
            segment_ms=segment_ms,
            index_interval_bytes=index_interval_bytes,
            fsync=fsync,
            owner=(owner or "") if writer else "",
        )
        if writer:
            if not create and not (
                log.root.is_dir() and ((log.root / MANIFEST).exists() or topics_with_data(log.root))
            ):
                raise LogError(f"no log at {log.root}")
            log._lock(lock_timeout_s)
            try:
                log._recover(repair=repair)
                log._worker = ThreadPoolExecutor(1, thread_name_prefix="log-commit")
                log._syncers = ThreadPoolExecutor(4, thread_name_prefix="log-fsync")
                if log._rebuilt:
                    found = dict(positions_from(log)) if positions_from is not None else {}
                    positions = {**found, **log._submitted.positions}
                    shown = ", ".join(f"{k} {v}" for k, v in sorted(positions.items())) or "none found"
                    log.repaired.append(f"source positions: {shown}")
                    rebuilt = replace(log._submitted, positions=positions)
                    log._submit(rebuilt, [], [log.root]).result()  # written even if nothing else changes
                if log.repaired:
                    log.commit()  # the repaired state becomes the committed one at once
            except BaseException:
                log.close()
                raise
        else:
            if not log.root.is_dir():
                raise LogError(f"no log at {log.root}")
            manifest, missing = read_checked(log.root, lambda: read_union(log.root))
            require_metadata(log.root, manifest, missing)
            log._committed = manifest or Manifest()
        return log

    def _lock(self, timeout_s: float = 0.0) -> None:
        """Take this owner's lock, waiting at most `timeout_s` for a holder to let go (short polls:
        flock has no timed wait, and a blocking one could hang a server's thread for ever)."""
        self.root.mkdir(parents=True, exist_ok=True)
        if self.owner and not self.home.is_dir():
            self.home.mkdir(parents=True, exist_ok=True)
            if self.fsync:  # the owner's directory survives a crash before its first commit
                _fileio.fsync_dir(self.home.parent)
                _fileio.fsync_dir(self.root)
        fd = os.open(self.home / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() < deadline:
                    time.sleep(0.005)
                    continue
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            os.close(fd)
            waited = f" (waited {timeout_s:g}s)" if timeout_s > 0 else ""
            if self.owner:
                raise LogLockedError(
                    f"{describe(self.owner)} of the log at {self.root} is locked by pid {holder}{waited}"
                ) from None
            raise LogLockedError(
                f"log root {self.root} is locked by pid {holder} (another tributary capture?){waited}"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._lock_fd = fd

    def _unlock(self) -> None:
        if self._lock_fd >= 0:
            os.close(self._lock_fd)  # closing the fd releases the flock (as does kill -9)
            self._lock_fd = -1

    def _recover(self, *, repair: bool = False) -> None:
        """Cut every partition back to the manifest's committed end and reopen it for appends."""
        (self.home / f"{MANIFEST}.tmp").unlink(missing_ok=True)
        found, missing = read_checked(
            self.root, lambda: read_manifest(self.home), lambda topic: claimed_by(self.root, topic) == self.owner
        )
        if repair and missing:
            found, notes = rebuild(self.root, found, missing)
            self.repaired += notes
            self._rebuilt = True
        else:
            require_metadata(self.root, found, missing)
        manifest = found or Manifest()
        for w in self._writers.values():
            w.close()
        self._writers = {}
        for name, topic in manifest.topics.items():
            for p, state in enumerate(topic.partitions):
                self._writers[(name, p)] = self._recover_partition(
                    name, p, topic.config, state, self.repaired if repair else None
                )
        self._committed = self._submitted = manifest
        self._failed = None

    def _recover_partition(
        self,
        topic: str,
        p: int,
        cfg: TopicConfig,
        state: PartitionState,
        repair: list[str] | None = None,
    ) -> PartitionWriter:
        ref = SegmentRef(topic, p, partition_dir(self.root, topic, p), state.segment)
        return PartitionWriter.recover(
            ref,
            state,
            segment_bytes=cfg.segment_bytes or self.segment_bytes,
            segment_ms=cfg.segment_ms or self.segment_ms,
            index_interval=self.index_interval_bytes,
            repair=repair,
        )

    def refresh(self) -> None:
        """Re-read the manifest (readers); the writer already knows its own commits. A manifest
        that vanished since is an error, not an empty log."""
        if not self.writer:
            manifest = read_union(self.root)
            if manifest is None and self._committed.topics:
                require_metadata(self.root, None, topics_with_data(self.root))  # it vanished since
            self._committed = manifest or Manifest()

    def close(self) -> None:
        """Release everything without committing (uncommitted appends are cut on the next open)."""
        if self._closed:
            return
        self._closed = True
        if self._worker is not None:
            self._worker.shutdown(wait=True)
        if self._syncers is not None:
            self._syncers.shutdown(wait=True)
        for w in self._writers.values():
            w.close()
        self._writers = {}
        self._unlock()

    def __enter__(self) -> Log:
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    # -- topics ----------------------------------------------------------------------------

    def topics(self) -> dict[str, TopicConfig]:
        return {name: t.config for name, t in self._committed.topics.items()}

    def _topic(self, topic: str) -> TopicState:
        try:
            return self._committed.topics[topic]
        except KeyError:
            raise TopicNotFoundError(f"no topic {topic!r} in the log at {self.root}") from None

    def create_topic(self, name: str, config: TopicConfig | None = None) -> TopicConfig:
        """Idempotent: an existing topic keeps its config. Durable before returning. The topic
        becomes this writer's owner's (claimed at once); another owner's topic is refused."""
        self._check_writer("create a topic")
        existing = self._submitted.topics.get(name)
        if existing is not None:
            return existing.config
        if not _TOPIC.match(name) or name in (".", ".."):
            raise LogError(f"invalid topic name {name!r}: use letters, digits, '.', '_' and '-'")
        cfg = config or TopicConfig(partitions=self.default_partitions)
        tdir = self.root / name
        tdir.mkdir(exist_ok=True)
        self._claim(name)
        write_topic_meta(tdir, cfg, sync=self.fsync)
        empty = PartitionState()
        for p in range(cfg.partitions):
            self._writers[(name, p)] = self._recover_partition(name, p, cfg, empty)
        dirs = [self.root, tdir] + [partition_dir(self.root, name, p) for p in range(cfg.partitions)]
        for p in range(cfg.partitions):
            self._writers[(name, p)].dir_dirty = False
        manifest = self._submitted.with_topic(name, TopicState(cfg, (empty,) * cfg.partitions))
        self._submit(manifest, [], dirs).result()
        return cfg

    def _claim(self, name: str) -> None:
        """Claim topic `name` for this owner, or refuse it naming the owner that holds it. A
        topic the default owner listed before topics were claimed is its own, claim or not."""
        holder = claim(self.root / name, self.owner, sync=self.fsync)
        if holder == self.owner and self.owner:
            legacy = read_manifest(self.root)
            if legacy is not None and name in legacy.topics:
                (self.root / name / CLAIM).unlink(missing_ok=True)
                holder = ""
        if holder != self.owner:
            raise self._not_ours(name, holder)

    def _not_ours(self, topic: str, holder: str) -> TopicOwnedError:
        return TopicOwnedError(
            f"topic {topic!r} in the log at {self.root} is written by {describe(holder)}, not by {describe(self.owner)}",
            topic=topic,
            holder=holder,
        )

    def owner_of(self, topic: str) -> str | None:
        """The owner of a committed topic ("" for the default owner); None when no commit lists it."""
        if topic not in self._committed.topics:
            return None
        return claimed_by(self.root, topic)

    def partition_for(self, topic: str, key: bytes | None) -> int:
        return partition_for(key, self._topic_any(topic).config.partitions)

    def _topic_any(self, topic: str) -> TopicState:
        t = self._submitted.topics.get(topic) if self.writer else None
        return t if t is not None else self._topic(topic)

    # -- writing ---------------------------------------------------------------------------

    def _check_writer(self, what: str) -> None:
        if self._closed:
            raise LogError(f"the log at {self.root} is closed")
        if not self.writer:
            raise LogError(f"cannot {what}: the log at {self.root} was opened read-only")
        if self._failed is not None:
            raise LogError(f"an earlier commit failed ({self._failed}); reopen the log to recover")

    def _writer_for(self, topic: str, partition: int) -> PartitionWriter:
        """The partition's writer, for an append (checks the log is writable and the partition exists)."""
        self._check_writer("append")
        w = self._writers.get((topic, partition))
        if w is None:
            if topic not in self._submitted.topics and (self.root / topic).is_dir():
                holder = claimed_by(self.root, topic)
                if holder != self.owner:
                    raise self._not_ours(topic, holder)
            t = self._topic_any(topic)
            raise LogError(f"topic {topic!r} has partitions 0..{t.config.partitions - 1}, not {partition}")
        return w

    def append(self, topic: str, partition: int, records: Sequence[RecordIn]) -> int:
        """Buffer records at the partition's end; returns the first offset (unseen until commit)."""
        w = self._writer_for(topic, partition)
        try:
            return w.append(records)
        except LogError:
            self._rollback()
            raise

    def append_encoded(
        self, topic: str, partition: int, encode: Callable[[int], tuple[bytes, list[int]]], timestamp_ms: int
    ) -> int:
        """`append` for lines made elsewhere (`encode(first_offset)` → lines, sizes; one timestamp):
        the columnar snapshot's entry. Same buffering, segments, index and commit rules."""
        w = self._writer_for(topic, partition)
        try:
            return w.append_encoded(encode, timestamp_ms)
        except LogError:
            self._rollback()
            raise

    def mark(self) -> Mark:
        """Every partition's appended end now: `commit(upto=mark)` commits exactly that prefix."""
        self._check_writer("mark")
        return Mark({k: w.end() for k, w in self._writers.items()})

    def commit(self, *, positions: Mapping[str, str] | None = None, upto: Mark | None = None) -> None:
        """Make appends (up to `upto`) and `positions` durable and visible; see `_commit_job`."""
        future = self.commit_async(positions=positions, upto=upto)
        try:
            future.result()
        except LogError:
            self._rollback()
            raise

    def commit_async(self, *, positions: Mapping[str, str] | None = None, upto: Mark | None = None) -> Future[None]:
        """Start a commit and return at once; appends may continue while it fsyncs.

        Commits complete in order. The future's result says the commit is durable: confirm a
        source position only then."""
        self._check_writer("commit")
        topics = dict(self._submitted.topics)
        for name, t in topics.items():
            parts = list(t.partitions)
            for p, old in enumerate(parts):
                end = upto.ends.get((name, p)) if upto is not None else self._writers[(name, p)].end()
                if end is None:
                    continue
                if end.end < old.end:
                    raise LogError(f"cannot commit {name}/{p} back to {end.end}: {old.end} is committed")
                parts[p] = PartitionState(old.start, end.end, end.segment, end.nbytes)
            topics[name] = TopicState(t.config, tuple(parts))
        fds: list[int] = []
        dirs: list[Path] = []
        try:
            for w in self._writers.values():
                if w.dirty:
                    w.flush()
                    fds.append(w.sync_handle())
                    w.dirty = False
                if w.dir_dirty:
                    dirs.append(w.pdir)
                    w.dir_dirty = False
        except LogError:
            for fd in fds:
                os.close(fd)
            self._rollback()
            raise
        merged = {**self._submitted.positions, **(positions or {})}
        unchanged = topics == self._submitted.topics and merged == self._submitted.positions
        if not fds and not dirs and unchanged:
            return self._worker_barrier()  # nothing new: durable once earlier commits are
        return self._submit(Manifest(self._submitted.generation, topics, merged), fds, dirs)

    def _submit(self, manifest: Manifest, fds: list[int], dirs: list[Path]) -> Future[None]:
        manifest = replace(manifest, generation=self._submitted.generation + 1)
        self._submitted = manifest
        assert self._worker is not None
        return self._worker.submit(self._commit_job, manifest, fds, dirs)

    def _commit_job(self, manifest: Manifest, fds: list[int], dirs: list[Path]) -> None:
        """THE commit protocol (runs on the commit thread, one commit at a time, in order):

        1. fsync the segment data of every partition written since the last commit, and the
           directories that gained segment files (in parallel: the kernel overlaps them);
        2. write the new manifest to `manifest.json.tmp` and fsync it (alongside step 1 — the temp
           file means nothing until it is renamed);
        3. `os.replace` it onto `manifest.json` — the commit point: readers now see the new ends;
        4. fsync the root directory so the rename itself survives a crash.
        Only then is the commit durable (the future resolves) and may a source be confirmed.
        """
        tmp = self.home / f"{MANIFEST}.tmp"
        try:
            if self._failed is not None:
                raise LogError(f"an earlier commit failed ({self._failed})")
            assert self._syncers is not None
            data = encode_manifest(manifest)
            jobs = [self._syncers.submit(self._sync_fd, fd, "syncing segment data") for fd in fds]
            jobs += [self._syncers.submit(self._sync_dir, d) for d in dirs]
            jobs.append(self._syncers.submit(self._write_tmp, tmp, data))  # 2
            for job in jobs:  # 1 + 2 done
                job.result()
            os.replace(tmp, self.home / MANIFEST)  # 3
            if self.fsync:
                _fileio.fsync_dir(self.home)  # 4
            self._committed = manifest
        except BaseException as exc:
            self._failed = exc
            tmp.unlink(missing_ok=True)
            if isinstance(exc, OSError):
                raise LogError(f"commit failed: {exc}") from exc
            raise
        finally:
            for fd in fds:
                os.close(fd)

    def _sync_fd(self, fd: int, what: str) -> None:
        if self.fsync:
            _fileio.fsync(fd, what)

    def _sync_dir(self, d: Path) -> None:
        if self.fsync:
            _fileio.fsync_dir(d)

    def _write_tmp(self, tmp: Path, data: bytes) -> None:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            _fileio.write_all(fd, data, f"writing {tmp}")
            self._sync_fd(fd, f"syncing {tmp}")
        finally:
            os.close(fd)

    def _rollback(self) -> None:
        """After a failed write or commit: wait for in-flight commits, then recover from the
        committed manifest so the log is usable again (every uncommitted append is dropped)."""
        if self._worker is not None:
            self._worker.submit(lambda: None).result()
        for w in self._writers.values():
            w.close()
        self._recover()

    # -- committed state -------------------------------------------------------------------

    def positions(self) -> dict[str, str]:
        return dict(self._committed.positions)

    def end_offsets(self, topic: str) -> list[int]:
        return [p.end for p in self._topic(topic).partitions]

    def committed_through(self, mark: Mark) -> bool:
        """Is every record appended before `mark` committed (durable, and seen by a reader opened
        from now on)? A topic gone since does not count."""
        for (topic, partition), end in mark.ends.items():
            state = self._committed.topics.get(topic)
            if state is not None and partition < len(state.partitions) and state.partitions[partition].end < end.end:
                return False
        return True

    def start_offsets(self, topic: str) -> list[int]:
        return [p.start for p in self._topic(topic).partitions]

    def topic_config(self, topic: str) -> TopicConfig:
        return self._topic(topic).config

    def partition_state(self, topic: str, partition: int) -> PartitionState:
        """The committed state of one partition (start, end, active segment and its bytes)."""
        return self._state(topic, partition)

    def _state(self, topic: str, partition: int) -> PartitionState:
        t = self._topic(topic)
        if not 0 <= partition < len(t.partitions):
            raise LogError(f"topic {topic!r} has partitions 0..{len(t.partitions) - 1}, not {partition}")
        return t.partitions[partition]

    def read(
        self, topic: str, partition: int, from_offset: int = 0, *, to_offset: int | None = None
    ) -> Iterator[Record]:
        """Committed records from `from_offset` (or the next existing one) up to `to_offset`."""
        state = self._state(topic, partition)
        stop = state.end if to_offset is None else min(to_offset, state.end)
        return self._read(topic, partition, from_offset, stop, state)

    def _read(self, topic: str, partition: int, start: int, stop: int, state: PartitionState) -> Iterator[Record]:
        """A reader whose manifest is older than a compaction of what it took for the active
        segment finds that file shorter than it expected: re-read the manifest and go on."""
        while True:
            try:
                for rec in read_partition(self.root, topic, partition, state, start, stop):
                    start = rec.offset + 1
                    yield rec
                return
            except CorruptRecordError:
                fresh = None if self.writer else read_union(self.root)
                if fresh is None or topic not in fresh.topics:
                    raise
                newer = fresh.partition(topic, partition)
                if newer.segment == state.segment:
                    raise
                state = newer

    def read_from_time(self, topic: str, partition: int, timestamp_ms: int) -> Iterator[Record]:
        """From the first committed record whose timestamp is >= timestamp_ms."""
        return read_partition_from_time(self.root, topic, partition, self._state(topic, partition), timestamp_ms)

    # -- maintenance -----------------------------------------------------------------------

    def compact(
        self, topic: str | None = None, *, now_ms: int, delete_retention_ms: int | None = None
    ) -> CompactionStats:
        """Compact the sealed, committed segments of `compact` topics (all of them by default)
        now, whatever their dirty ratio; the pass is recorded for the cleaner (`cleaner.py`)."""
        self._check_writer("compact (needs the writer lock)")
        if topic is not None:
            self._topic(topic)
        policy = CleanerPolicy(delete_retention_ms=delete_retention_ms)
        return Cleaner(self, policy).compact_now(topic, now_ms)

    def enforce_retention(
        self,
        *,
        now_ms: int,
        default_retention_ms: int | None = None,
        default_retention_bytes: int | None = None,
        on_removed: Callable[[Path], object] | None = None,
    ) -> int:
        """Delete whole sealed segments of `delete` topics past retention; returns how many.

        A topic without its own `retention_ms`/`retention_bytes` uses the defaults given.
        `on_removed(path)` takes over the Parquet copies of removed segments (the cleaner deletes
        them after a delay); without it they are deleted with the segment."""
        self._check_writer("enforce retention")
        self._worker_idle()
        plan: list[tuple[str, int, list[int]]] = []
        topics = dict(self._submitted.topics)
        for name, t in self._committed.topics.items():
            cfg = t.config
            if cfg.policy != "delete":
                continue
            if cfg.retention_ms is None and cfg.retention_bytes is None:
                if default_retention_ms is None and default_retention_bytes is None:
                    continue
                cfg = replace(cfg, retention_ms=default_retention_ms, retention_bytes=default_retention_bytes)
            parts = list(topics[name].partitions)
            for p, state in enumerate(t.partitions):
                doomed, new_start = expired_segments(self.root, name, p, state, cfg, now_ms)
                if doomed:
                    plan.append((name, p, doomed))
                    parts[p] = replace(parts[p], start=max(parts[p].start, new_start))
            topics[name] = TopicState(t.config, tuple(parts))
        if not plan:
            return 0
        # the new start offsets become durable first; recovery finishes unlinks a crash interrupted
        self._submit(replace(self._submitted, topics=topics), [], []).result()
        for name, p, doomed in plan:
            pdir = partition_dir(self.root, name, p)
            if on_removed is not None:
                for b in doomed:
                    if parquet_path(pdir, b).exists():
                        on_removed(parquet_path(pdir, b))
            remove_segments(pdir, doomed, parquet=on_removed is None)
        return sum(len(d) for _, _, d in plan)

    def write_parquet(self, topic: str | None = None) -> int:
        """Write the immutable Parquet (zstd) copy of every sealed, committed segment that lacks
        a current one (a maintenance step like `compact`); returns how many were written."""
        from tributary.log.local.columnar import is_current, write_parquet  # loads pyarrow: only when used

        self._check_writer("write Parquet copies")
        snapshot = self._committed
        written = 0
        for name in [topic] if topic is not None else list(snapshot.topics):
            t = snapshot.topics.get(name)
            if t is None:
                raise TopicNotFoundError(f"no topic {name!r} in the log at {self.root}")
            for p, state in enumerate(t.partitions):
                pdir = partition_dir(self.root, name, p)
                todo = [b for b in committed_segments(pdir, state) if b < state.segment and not is_current(pdir, b)]
                for base in todo:
                    write_parquet(SegmentRef(name, p, pdir, base))
                if todo:
                    _fileio.fsync_dir(pdir)
                    written += len(todo)
        return written

    def disk_bytes(self, topic: str) -> int:
        """Bytes the topic's files take (segments, indexes, Parquet copies): for monitoring, so a
        reading racing the writer or the cleaner may be off by a file."""
        total = 0
        dirs = [self.root / topic] + [
            partition_dir(self.root, topic, p) for p in range(len(self._topic(topic).partitions))
        ]
        for d in dirs:  # the topic's own files (its config), then each partition's
            with contextlib.suppress(FileNotFoundError):
                for entry in os.scandir(d):
                    with contextlib.suppress(FileNotFoundError):
                        if entry.is_file():
                            total += entry.stat().st_size
        return total

    def tail_copy(self, topic: str, partition: int, end: PartitionEnd) -> TailCopy | None:
        """The newest tail copy (format 2, see `columnar`) that stands for a prefix of the
        partition's active segment whose committed end is `end` (from `ends()`), or None."""
        from tributary.log.local.columnar import tail_copies, tail_copy_valid  # loads pyarrow: only when used

        pdir = partition_dir(self.root, topic, partition)
        return next(
            (c for c in tail_copies(pdir) if c.base == end.segment and tail_copy_valid(pdir, c, end.end, end.nbytes)),
            None,
        )

    def sweep_tail_copies(self, topic: str, partition: int, *, now: float, grace_s: float) -> list[Path]:
        """Delete the partition's tail copies nothing plans with any more, `grace_s` after they
        were superseded (by a newer tail copy, or by the full copy of the sealed segment);
        returns the paths deleted."""
        from tributary.log.local.columnar import sweep_tail_copies  # loads pyarrow: only when used

        active = self._state(topic, partition).segment
        return sweep_tail_copies(partition_dir(self.root, topic, partition), active, now, grace_s)

    def make_copies(
        self, copies: Sequence[SegmentCopy], write: Callable[[Path, Sequence[SegmentCopy]], None]
    ) -> list[SegmentCopy]:
        """Make the format-2 Parquet copies `copies`, written by `write` into a staging
        directory of the log's (`columnar.make_copies` says how) and installed atomically by
        the log; returns those that are current now."""
        from tributary.log.local.columnar import make_copies  # loads pyarrow: only when used

        return make_copies(self.root, copies, write, time.time())

    def _worker_idle(self) -> None:
        self._worker_barrier().result()

    def _worker_barrier(self) -> Future[None]:
        """Resolves when every commit submitted so far has finished (failing if one failed)."""
        assert self._worker is not None
        return self._worker.submit(self._raise_if_failed)

    def _raise_if_failed(self) -> None:
        if self._failed is not None:
            raise LogError(f"an earlier commit failed ({self._failed})")

    def verify(self) -> list[Problem]:
        return verify_log(self.root, self._committed)

    def splits(self, topic: str, *, max_bytes: int = 64 << 20) -> list[Split]:
        t = self._topic(topic)
        return [s for p, state in enumerate(t.partitions) for s in plan_splits(self.root, topic, p, state, max_bytes)]

    # -- as the capture writer (tributary.log.contracts) ------------------------------------

    def source(self, name: str) -> Log:
        """What a source appends through: the log itself (one manifest for all of this owner's sources)."""
        return self

    def await_visible(self, timeout_s: float = 10.0) -> None:
        """Nothing to wait for: readers see a commit when it returns (the manifest replaced)."""

    def background_cleaner(self, policy: CleanerPolicy, *, pid: int) -> Cleaner:
        """The cleaner capture runs between batches: compaction and retention of this log."""
        return Cleaner(self, policy, pid=pid)

    def live_keys(self, topic: str) -> set[bytes]:
        """The keys of `topic` whose latest committed record is not a tombstone (keys.py), read
        through a reader of its own: the writer's state stays the capture loop's, any thread may
        call this. An unknown topic has none."""
        if self.writer and topic not in self._committed.topics:  # the common case of a first snapshot
            return set()
        from tributary.log.local.keyscan import live_keys_in  # pyarrow: loaded when a scan runs

        reader = Log.open(self.root)
        try:
            if topic not in reader.topics():
                return set()
            return live_keys_in(reader.splits(topic, max_bytes=SCAN_BYTES), reader.end_offsets(topic))
        finally:
            reader.close()

    def ends(self) -> dict[tuple[str, int], PartitionEnd]:
        """Committed ends of every partition (for tools)."""
        return {
            (n, p): PartitionEnd(s.end, s.segment, s.nbytes)
            for n, t in self._committed.topics.items()
            for p, s in enumerate(t.partitions)
        }
