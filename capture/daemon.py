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
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

import psycopg
from psycopg.conninfo import conninfo_to_dict

from tributary.capture.database.replication import Keepalive
from tributary.capture.database.slot import sql_connection
from tributary.capture.errors import (
    CaptureError,
    SlotInUse,
    SlotLost,
    SlotMissing,
    SourceMisconfigured,
    SourceUnreachable,
    TransientSourceError,
)
from tributary.capture.resume import confirmed_in_status
from tributary.capture.source import SourceSession, SourceSpec
from tributary.capture.status import LatencyHistogram, SourceState, write_status
from tributary.log import (
    BackgroundCleaner,
    CaptureWriter,
    CleanerPolicy,
    GroupCommitter,
    KafkaOptions,
    LogError,
    Mark,
    SourceWriter,
    open_writer,
)

__all__ = ["CaptureDaemon", "DaemonOptions", "SourcesFailed"]

log = logging.getLogger(__name__)

FIRST_BACKOFF_S = 0.5  # a failed source's first wait; doubled per failure up to `max_backoff_s`

# SQLSTATE classes/codes of errors that waiting does not cure: wal_level (55000), a missing
# plugin file such as wal2json (58P01), privileges and missing objects (class 42), and
# authentication (28): such a source retries at the backoff ceiling.
_CONFIG_SQLSTATES = ("55000", "58P01", "42", "28", "3D000")
# The same refusals while connecting, where libpq gives only the server's text.
_CONFIG_TEXTS = ("must be superuser or replication role", "permission denied", "wal_level", "could not access file")


class SourcesFailed(CaptureError):
    """`until_idle_s` ended while some source was still failing (a batch run that missed data)."""


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
    kafka: KafkaOptions | None = None  # [log] backend = "kafka": records go there (log_root keeps the status)


@dataclass(slots=True)
class _Retry:
    """A failed source's schedule: the current wait, when to try again, the connection attempt in flight."""

    backoff: float
    at: float
    probe: _Probe | None = None


class _Probe(threading.Thread):
    """One connection attempt to a failed source, off the capture loop: a host that drops packets
    holds a connect for `connect_timeout`, and the other sources must not wait for it."""

    def __init__(self, spec: SourceSpec) -> None:
        super().__init__(name=f"capture-probe-{spec.name}", daemon=True)
        self.spec = spec
        self.error: CaptureError | psycopg.Error | None = None

    def run(self) -> None:
        try:
            sql_connection(self.spec.dsn, label=self.spec.name).close()
        except (CaptureError, psycopg.Error) as exc:
            self.error = exc


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
        self._clean_mark = self.log.mark()  # the log's appended end when nothing was uncommitted
        self._cleaner_pool: ThreadPoolExecutor | None = None
        self._cleaning: Future[object] | None = None  # the compaction running on the cleaner thread
        self.cleaner = self._new_cleaner()
        self.sessions = [SourceSession(spec, self._log_of(spec.name), clock=clock) for spec in specs]
        confirmed = confirmed_in_status(options.log_root)  # the slot positions the last run confirmed
        for session in self.sessions:
            if session.name in confirmed:  # still true until this run confirms: kept in the status
                session.confirmed_before = confirmed[session.name]
                session.status.confirmed_lsn = str(confirmed[session.name])
        self.committer = GroupCommitter(linger_ms=options.linger_ms, max_records=options.batch_records)
        self._mark: Mark | None = None  # the log's end at the newest transaction boundary
        self.commit_seconds = LatencyHistogram()  # log commit latency, for /metrics
        self._retries: dict[str, _Retry] = {}  # failed sources by name: when each tries again
        self._broken: list[SourceSession] = []  # failed since the last `_settle`
        self._logged: dict[str, str] = {}  # the last failure logged per source (repeats go to debug)
        self._stopping = False
        self._last_change = clock()
        self._last_status = 0.0
        self._last_status_file = 0.0
        self._rate_window: tuple[float, int] = (clock(), 0)

    def _open_log(self) -> CaptureWriter:
        return open_writer(
            root=self.opts.log_root,
            kafka=self.opts.kafka,
            sources=[spec.name for spec in self.specs],  # on Kafka: a producer per source
            default_partitions=self.opts.default_partitions,
            segment_bytes=self.opts.segment_bytes,
        )

    def _log_of(self, source: str) -> SourceWriter:
        """What `source` appends to (on Kafka: its own producer)."""
        return self.log.source(source)

    def _new_cleaner(self) -> BackgroundCleaner | None:
        if self.opts.cleaner is None:
            return None
        return self.log.background_cleaner(self.opts.cleaner, pid=os.getpid())  # none on Kafka: the broker's

    # -- the commit protocol ------------------------------------------------------------
    def commit(self) -> None:
        """Make every whole transaction appended so far durable, then confirm it to its source:
        steps 3 and 4 of the exactly-once story (capture/streaming/positions.py). Never confirm first: a crash
        between the two merely re-sends what the manifest already holds, and the sources skip it.
        """
        if self._mark is None:
            return
        positions = {s.spec.name: str(s.boundary) for s in self.sessions if s.has_boundary}
        for s in self.sessions:
            positions.update(s.context_positions())  # a chunked snapshot's progress, with its rows
        started = time.perf_counter()
        self.log.commit(positions=positions, upto=self._mark)  # step 3: fsync, then the manifest
        self.commit_seconds.observe(time.perf_counter() - started)
        self._clean_mark, self._mark = self._mark, None
        now = self.clock()
        self.committer.committed(int(now * 1000))
        for session in self.sessions:
            session.committed()
            self._confirm(session, now)  # step 4: only now

    def _commit_idle(self) -> None:
        """Idle sources' later positions (capture/streaming/positions.py, step 4) into the manifest, so the
        slot is confirmed past nothing the manifest lacks; no records, so no mark (the log's end
        may hold a transaction still open). A commit already due covers them."""
        idle = [s for s in self.sessions if s.name not in self._retries and s.idle_boundary()]
        if not idle or self._mark is not None:
            return
        positions = {s.name: str(s.boundary) for s in idle}
        for s in idle:
            positions.update(s.context_positions())
        self.log.commit(positions=positions, upto=Mark())
        for s in idle:
            s.committed()

    def _confirm(self, session: SourceSession, now: float) -> None:
        try:
            session.confirm(now_us=int(now * 1_000_000))
        except (CaptureError, psycopg.Error) as exc:
            self._fail(session, exc)

    # -- lifecycle ----------------------------------------------------------------------------
    def request_stop(self, *_: object) -> None:
        self._stopping = True

    def install_signal_handlers(self) -> None:
        def handler(signum: int, frame: FrameType | None) -> None:
            self.request_stop()

        signal.signal(signal.SIGTERM, handler)
        signal.signal(signal.SIGINT, handler)

    def run(self) -> int:
        """Run until stopped (or idle for `until_idle_s`); returns the exit status.

        A source that fails is retried on its own while the others go on; only the log (a write
        or commit error, a full disk, the writer lock) stops capture as a whole (a `LogError`).
        After `until_idle_s`, a source still failing raises `SourcesFailed`."""
        missed: list[SourceSession] = []
        try:
            self._open_sessions()
            # Everything alive now (modules, config, catalog) lives as long as the process: out of
            # the collector's sight, so the collections the per-change allocations trigger stay small.
            gc.freeze()
            self._loop()
            self.commit()
            self._settle()
            missed = [s for s in self.sessions if s.name in self._retries]
            for s in self.sessions:
                if s.name not in self._retries:
                    s.status.state = SourceState.STOPPED
        except LogError as exc:
            reason = _one_line(exc)
            for s in self.sessions:
                if s.status.state != SourceState.STOPPED:
                    s.status.state = SourceState.FAILED
                    s.status.error, s.status.error_kind = reason, "error"
            raise
        finally:
            for s in self.sessions:
                s.status.retry_at_ms = None  # this process retries nothing more: no time to show
            self._write_status(force=True)
            for s in self.sessions:
                s.close()
            self._finish_cleaning()
            if self._cleaner_pool is not None:
                self._cleaner_pool.shutdown()
            self.log.close()
        if missed and not self._stopping:
            raise SourcesFailed(
                "; ".join(f"{s.status.error} (still {s.status.state} when capture went idle)" for s in missed)
            )
        return 0

    def _open_sessions(self) -> None:
        for session in self.sessions:
            self._open(session)
        self._settle()
        self._write_status(force=True)

    def _open(self, session: SourceSession) -> bool:
        """Connect one source (snapshot if needed, then stream); a failure schedules its retry."""
        try:
            session.open(on_progress=self._progress)
        except (CaptureError, psycopg.Error) as exc:
            self._fail(session, exc, opening=True)
            return False
        status = session.status
        if session.name in self._retries:
            del self._retries[session.name]
            self._logged.pop(session.name, None)
            log.info("source %r recovered after %s: streaming", session.name, status.error)
        status.error = status.error_kind = status.retry_at_ms = None
        if not session.finished:
            log.info("source %s: streaming from LSN %s", session.name, status.confirmed_lsn)
        if session.has_boundary:  # a snapshot was taken: commit it whole, with its LSN
            self._mark = self.log.mark()
            self.commit()
        if session.finished:  # `snapshot = "initial_only"`: committed, it streams no more
            session.close()
        return True

    def _finish_snapshot_only(self) -> bool:
        """`snapshot = "initial_only"` sources whose chunked snapshot is over: commit what they
        appended, then stop them. True when every source is so finished (capture exits 0)."""
        done = [s for s in self.sessions if s.name not in self._retries and s.snapshot_only_done]
        if done:
            self._mark = self.log.mark()
            self.commit()
            for session in done:
                session.close()
                session.finish()
        return all(s.finished for s in self.sessions)

    # -- one source failing ----------------------------------------------------------------------
    def _fail(self, session: SourceSession, exc: BaseException, *, opening: bool = False) -> None:
        """Take one source out: close it, say why (one line, no password), schedule its retry with
        exponential backoff; `_settle` then drops what it appended uncommitted. The others go on.

        A stream that broke is `reconnecting` and retries soon; a source that cannot connect is
        `failed`; an error that waiting does not cure (`misconfigured`) retries at the ceiling, so
        a fix (a grant, wal2json installed, a slot dropped) is picked up without a restart."""
        status = session.status
        was_streaming = status.state == SourceState.STREAMING and not opening
        session.close()
        if opening:  # a partial start (a snapshot cut short): its boundary must never be committed
            session.reset(self._log_of(session.name))
        kind = _error_kind(exc)
        if was_streaming and kind in ("unreachable", "error"):
            kind = "connection_lost"
        previous = self._retries.get(session.name)
        ceiling = self.opts.max_backoff_s
        if kind == "misconfigured":
            backoff = ceiling
        elif previous is None or was_streaming:
            backoff = min(FIRST_BACKOFF_S, ceiling)
        else:
            backoff = min(previous.backoff * 2, ceiling)
        now = self.clock()
        self._retries[session.name] = _Retry(backoff, now + backoff)
        reason = _redact(_one_line(exc, session.name), session.spec.dsn)
        status.state = SourceState.RECONNECTING if was_streaming else SourceState.FAILED
        status.error, status.error_kind = reason, kind
        status.failures += 1
        status.retry_at_ms = int((now + backoff) * 1000)
        level = logging.DEBUG if self._logged.get(session.name) == reason else logging.WARNING
        self._logged[session.name] = reason
        verb = "reconnecting" if was_streaming else "retrying"
        log.log(level, "%s; %s in %.1fs (the other sources go on)", reason, verb, backoff)
        self._broken.append(session)

    def _settle(self) -> None:
        """After sources failed: commit every whole transaction appended (theirs included: a
        failed source's boundary is covered by the mark taken at its commit point), then drop what
        is left uncommitted — only a failed source's cut-short transaction or snapshot, as one
        source transaction is appended at a time — by reopening the log (recovery truncates it)."""
        while self._broken:
            broken, self._broken = self._broken, []
            self.commit()
            if self.log.mark() != self._clean_mark:
                self._finish_cleaning()
                self.log.close()
                self.log = self._open_log()
                self.cleaner = self._new_cleaner()
                self._clean_mark = self.log.mark()
                for session in self.sessions:
                    session.rebind(self._log_of(session.name))
            for session in broken:
                session.reset(self._log_of(session.name))

    def _retry_due(self, now: float) -> None:
        """Failed sources whose wait is over: a connection attempt off the loop, then (when it
        connected, and no source transaction is half appended: opening commits) open them."""
        for session in self.sessions:
            retry = self._retries.get(session.name)
            if retry is None or self._stopping:
                continue
            if retry.probe is None:
                if now >= retry.at:
                    retry.probe = _Probe(session.spec)
                    retry.probe.start()
                continue
            if retry.probe.is_alive() or any(s.in_transaction for s in self.sessions):
                continue
            error, retry.probe = retry.probe.error, None
            if error is not None:
                self._fail(session, error, opening=True)
            elif self._open(session):
                self._last_change = now  # give a recovered source its time before an idle exit

    # -- the loop -------------------------------------------------------------------------------
    def _loop(self) -> None:
        while not self._stopping:
            busy = self._pump()
            busy = self._snapshots() or busy
            if self._finish_snapshot_only():
                return
            now = self.clock()
            now_ms = int(now * 1000)
            self._heartbeats(now_ms)
            if self._mark is not None and self.committer.due(now_ms):
                self.commit()
            if now - self._last_status >= self.opts.status_interval_s:
                self._commit_idle()
                for s in self.sessions:
                    self._confirm(s, now)
                self._last_status = now
            self._settle()
            if self._retries:
                self._retry_due(now)
                self._settle()
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
            conn = session.conn
            if conn is None or id(conn) not in ready_set and not session.in_transaction:
                continue
            stream = session.stream
            assert stream is not None  # open sessions stream
            before = stream.seen
            handle = stream.handle
            try:
                for message in conn.read(timeout=0, held=stream.held_run):
                    if handle(message):
                        self._mark = self.log.mark()
                        self.committer.record_appended(max(stream.last_tx_changes, 1), int(self.clock() * 1000))
                    elif type(message) is Keepalive and message.reply_requested:
                        session.confirm(now_us=int(self.clock() * 1_000_000), reply=False)
                    if in_tx and session.in_transaction is False:
                        break  # the open transaction ended: let other sources in
            except (CaptureError, psycopg.Error) as exc:
                self._fail(session, exc)  # `_settle` drops its cut-short transaction
                return True
            appended = appended or stream.seen != before
            if session.in_transaction:
                break  # it stopped mid-transaction: no other source appends until that one ends
        return appended

    def _snapshots(self) -> bool:
        """Chunked snapshots (capture/snapshot/chunked.py): between source transactions, apply requests and
        start each source's next chunk read (off the loop); True while one is under way."""
        if any(s.in_transaction for s in self.sessions):
            return any(s.snapshotting for s in self.sessions)
        under_way = False
        for session in self.sessions:
            if session.stream is None or session.name in self._retries or session.finished:
                continue
            try:
                if session.snapshot_tick():
                    self._mark = self.log.mark()  # the new context, committed with what is appended
            except (CaptureError, psycopg.Error) as exc:
                self._fail(session, exc)
                continue
            under_way = under_way or session.snapshotting
        return under_way

    def _heartbeats(self, now_ms: int) -> None:
        """Each source's heartbeat when due (`heartbeat_interval_ms`), only between source
        transactions (a mark then never splits one), committed like a transaction's records."""
        if any(s.in_transaction for s in self.sessions):
            return
        for session in self.sessions:
            if session.name not in self._retries and session.heartbeat(now_ms):
                self._mark = self.log.mark()
                self.committer.record_appended(1, now_ms)

    def _wait_budget(self) -> float:
        if self._mark is not None:
            return max(self.opts.linger_ms / 1000.0, 0.0005)
        if any(s.snapshotting for s in self.sessions):
            return 0.02  # a chunk read ends off the loop: start the next one soon
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


def _one_line(exc: BaseException, source: str | None = None) -> str:
    """An error as one line a user reads (the first line of its message), naming its source."""
    text = next((line.strip() for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
    if source is not None and not text.startswith("source "):
        text = f"source {source!r}: {text}"
    return text


def _redact(text: str, dsn: str) -> str:
    """`text` without the DSN's password (a driver may quote connection parameters)."""
    try:
        password = conninfo_to_dict(dsn).get("password")
    except psycopg.ProgrammingError:  # an unparsable DSN: its connect error said so already
        return text
    return text.replace(str(password), "***") if password else text


def _error_kind(exc: BaseException) -> str:
    """`ERROR_KINDS` (capture/status.py) for one source's failure."""
    if isinstance(exc, SlotInUse):
        return "slot_in_use"
    if isinstance(exc, SourceMisconfigured | SourceUnreachable | SlotLost | SlotMissing):
        return "misconfigured"
    # The driver's error, raised as such or translated (its SQLSTATE survives as the context).
    cause = exc if isinstance(exc, psycopg.Error) else exc.__context__
    sqlstate = cause.sqlstate if isinstance(cause, psycopg.Error) else None
    if sqlstate is not None and sqlstate.startswith(_CONFIG_SQLSTATES):
        return "misconfigured"
    if any(text in str(exc) for text in _CONFIG_TEXTS):
        return "misconfigured"
    if isinstance(exc, TransientSourceError | psycopg.OperationalError):
        return "unreachable"
    return "error"
