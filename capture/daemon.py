"""The capture daemon: every configured source (and the event store's outbox) into one log.

One process, one writer of the log root (an OS lock), one replication connection per source,
served by a single select loop. Source transactions are appended whole and in order, one source
transaction at a time, so a commit at a transaction boundary never exposes half of another one.
"""

from __future__ import annotations

import gc
import logging
import os
import select
import signal
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

from tributary.capture.errors import CaptureError, TransientSourceError
from tributary.capture.log import Cleaner, CleanerPolicy, GroupCommitter, Log, LogError, Mark
from tributary.capture.replication import Keepalive
from tributary.capture.source import SourceSession, SourceSpec
from tributary.capture.status import LatencyHistogram, SourceState, write_status

__all__ = ["CaptureDaemon", "DaemonOptions"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class DaemonOptions:
    log_root: Path
    default_partitions: int = 4
    segment_bytes: int = 128 << 20
    linger_ms: int = 5
    batch_records: int = 10_000
    status_interval_s: float = 5.0
    max_backoff_s: float = 30.0
    until_idle_s: float | None = None  # exit 0 after this long with no new change
    cleaner: CleanerPolicy | None = None  # background compaction/retention; None = off


class CaptureDaemon:
    def __init__(
        self,
        specs: list[SourceSpec],
        options: DaemonOptions,
        *,
        clock: Callable[[], float] = time.time,
        on_progress: Callable[[object], None] | None = None,
    ) -> None:
        self.specs = specs
        self.opts = options
        self.clock = clock
        self.on_progress = on_progress
        self.log = self._open_log()
        self._cleaner_pool: ThreadPoolExecutor | None = None
        self._cleaning: Future[object] | None = None  # the compaction running on the cleaner thread
        self.cleaner = self._new_cleaner()
        self.sessions = [SourceSession(spec, self.log, clock=clock) for spec in specs]
        self.committer = GroupCommitter(linger_ms=options.linger_ms, max_records=options.batch_records)
        self._mark: Mark | None = None  # the log's end at the newest transaction boundary
        self.commit_seconds = LatencyHistogram()  # log commit latency, for /metrics
        self._stopping = False
        self._last_change = clock()
        self._last_status = 0.0
        self._last_status_file = 0.0
        self._rate_window: tuple[float, int] = (clock(), 0)

    def _open_log(self) -> Log:
        return Log.open(
            self.opts.log_root,
            writer=True,
            default_partitions=self.opts.default_partitions,
            segment_bytes=self.opts.segment_bytes,
        )

    def _new_cleaner(self) -> Cleaner | None:
        if self.opts.cleaner is None:
            return None
        return Cleaner(self.log, self.opts.cleaner, pid=os.getpid())

    # -- the commit protocol ------------------------------------------------------------
    def commit(self) -> None:
        """Make every whole transaction appended so far durable, then confirm it to its source:
        steps 3 and 4 of the exactly-once story (capture/offsets.py). Never confirm first: a crash
        between the two merely re-sends what the manifest already holds, and the sources skip it.
        """
        if self._mark is None:
            return
        positions = {s.spec.name: str(s.boundary) for s in self.sessions if s.has_boundary}
        started = time.perf_counter()
        self.log.commit(positions=positions, upto=self._mark)  # step 3: fsync, then the manifest
        self.commit_seconds.observe(time.perf_counter() - started)
        self._mark = None
        now = self.clock()
        self.committer.committed(int(now * 1000))
        for session in self.sessions:
            session.committed()
            session.confirm(now_us=int(now * 1_000_000))  # step 4: only now

    # -- lifecycle ----------------------------------------------------------------------------
    def request_stop(self, *_: object) -> None:
        self._stopping = True

    def install_signal_handlers(self) -> None:
        def handler(signum: int, frame: FrameType | None) -> None:
            self.request_stop()

        signal.signal(signal.SIGTERM, handler)
        signal.signal(signal.SIGINT, handler)

    def run(self) -> int:
        """Run until stopped (or idle for `until_idle_s`); returns the exit status."""
        try:
            self._open_sessions()
            # Everything alive now (modules, config, catalog) lives as long as the process: out of
            # the collector's sight, so the collections the per-change allocations trigger stay small.
            gc.freeze()
            backoff = 0.5
            while not self._stopping:
                try:
                    self._loop()
                    break
                except TransientSourceError as exc:
                    log.warning("%s; reconnecting in %.1fs", exc, backoff)
                    self._reconnect(str(exc), backoff)
                    backoff = min(backoff * 2, self.opts.max_backoff_s)
            self.commit()
            for s in self.sessions:
                s.status.state = SourceState.STOPPED
            return 0
        except (CaptureError, LogError) as exc:
            for s in self.sessions:
                if s.status.state != SourceState.STOPPED:
                    s.status.state = SourceState.FAILED
                    s.status.error = str(exc)
            raise
        finally:
            self._write_status(force=True)
            for s in self.sessions:
                s.close()
            self._finish_cleaning()
            if self._cleaner_pool is not None:
                self._cleaner_pool.shutdown()
            self.log.close()

    def _open_sessions(self) -> None:
        for session in self.sessions:
            session.open(on_progress=self._progress)
            if session.has_boundary:  # a snapshot was taken: commit it whole, with its LSN
                self._mark = self.log.mark()
                self.commit()
        self._write_status(force=True)

    def _reconnect(self, reason: str, backoff: float) -> None:
        """Drop uncommitted appends (reopen the log: recovery truncates them) and start again."""
        for s in self.sessions:
            s.close()
            s.status.state = SourceState.RECONNECTING
            s.status.error = reason
        self._write_status(force=True)
        self._finish_cleaning()
        self.log.close()
        deadline = self.clock() + backoff
        while self.clock() < deadline and not self._stopping:
            time.sleep(0.05)
        self.log = self._open_log()
        self.cleaner = self._new_cleaner()
        self._mark = None
        self.sessions = [SourceSession(spec, self.log, clock=self.clock) for spec in self.specs]
        attempt_until = self.clock() + self.opts.max_backoff_s * 4
        while not self._stopping:
            try:
                self._open_sessions()
                for s in self.sessions:
                    s.status.error = None
                return
            except TransientSourceError as exc:
                if self.clock() > attempt_until:
                    raise CaptureError(f"gave up reconnecting: {exc}") from None
                for s in self.sessions:
                    s.close()
                time.sleep(min(backoff, self.opts.max_backoff_s))

    # -- the loop -------------------------------------------------------------------------------
    def _loop(self) -> None:
        while not self._stopping:
            busy = self._pump()
            now = self.clock()
            now_ms = int(now * 1000)
            if self._mark is not None and self.committer.due(now_ms):
                self.commit()
            if now - self._last_status >= self.opts.status_interval_s:
                for s in self.sessions:
                    s.confirm(now_us=int(now * 1_000_000))
                self._last_status = now
            self._write_status()
            self._clean(now_ms)
            if busy:
                self._last_change = now
            elif self.opts.until_idle_s is not None and now - self._last_change >= self.opts.until_idle_s:
                return

    def _clean(self, now_ms: int) -> None:
        """Background compaction and retention, paced so capture comes first.

        Scans (retention commits new start offsets, so they run on this, the writer's, thread)
        happen only between source transactions with everything appended already committed; the
        compaction of one partition at a time runs on the cleaner thread, touching only sealed,
        committed segments (never the active ones capture appends to), its fsyncs and most of its
        reading off the capture loop."""
        if self.cleaner is None:
            return
        if self._cleaning is not None:
            if not self._cleaning.done():
                return
            self._finish_cleaning()
        if self._mark is not None or any(s.in_transaction for s in self.sessions):
            return
        try:
            job = self.cleaner.next_job(now_ms)
        except OSError as exc:  # a cleaner problem is logged; it never stops capture
            log.error("background cleaner scan failed (retried at the next scan): %s", exc)
            return
        if job is not None:
            if self._cleaner_pool is None:
                self._cleaner_pool = ThreadPoolExecutor(1, thread_name_prefix="log-cleaner")
            self._cleaning = self._cleaner_pool.submit(self.cleaner.clean_and_save, *job, now_ms)

    def _finish_cleaning(self) -> None:
        """Wait for the partition being compacted (before the log closes) and report a failure:
        a failed compaction leaves its segments as they were, so capture goes on."""
        future, self._cleaning = self._cleaning, None
        if future is None:
            return
        try:
            future.result()
        except (LogError, OSError) as exc:
            log.error("background compaction failed (capture goes on; retried at the next scan): %s", exc)

    def _pump(self) -> bool:
        """Read what the sources have sent; True if any change was appended."""
        in_tx = [s for s in self.sessions if s.in_transaction]
        # One source transaction at a time: while one is open, read only its source.
        candidates = in_tx or self.sessions
        wait = self._wait_budget()
        ready, _, _ = select.select([s.conn for s in candidates if s.conn is not None], [], [], wait)
        ready_set = {id(r) for r in ready}
        appended = False
        for session in candidates:
            if session.conn is None or id(session.conn) not in ready_set and not session.in_transaction:
                continue
            stream = session.stream
            assert stream is not None  # open sessions stream
            before = stream.seen
            handle = stream.handle
            for message in session.conn.read(timeout=0, held=stream.held_run):
                if handle(message):
                    self._mark = self.log.mark()
                    self.committer.record_appended(max(stream.last_tx_changes, 1), int(self.clock() * 1000))
                elif type(message) is Keepalive and message.reply_requested:
                    session.confirm(now_us=int(self.clock() * 1_000_000), reply=False)
                if in_tx and session.in_transaction is False:
                    break  # the open transaction ended: let other sources in
            appended = appended or stream.seen != before
        return appended

    def _wait_budget(self) -> float:
        if self._mark is not None:
            return max(self.opts.linger_ms / 1000.0, 0.0005)
        return 0.2

    # -- status ---------------------------------------------------------------------------------
    def _progress(self, status: object) -> None:
        self._write_status(force=True)
        if self.on_progress is not None:
            self.on_progress(status)

    def _write_status(self, force: bool = False) -> None:
        now = self.clock()
        if not force and now - self._last_status_file < 1.0:
            return
        start, _ = self._rate_window
        if now - start >= 1.0:
            for s in self.sessions:
                s.status.changes_per_s = round((s.status.changes - s.rate_base) / (now - start), 1)
                s.rate_base = s.status.changes
            self._rate_window = (now, 0)
        self._last_status_file = now
        write_status(
            self.opts.log_root,
            pid=os.getpid(),
            updated_ms=int(now * 1000),
            sources=[s.status for s in self.sessions],
            commit_seconds=self.commit_seconds,
        )
