"""Chunked snapshots beside streaming: DBLog's watermarks, as Debezium's incremental snapshots.

A table is read in primary-key chunks while its source keeps streaming; each chunk's rows enter
the log at the place in the stream where they are exactly as new as the streamed changes before
them, so a chunk row never overwrites a newer streamed change:

1. On the capture loop, between source transactions, the table's topic is *watched*: every key
   staged to it from now on is collected by transaction (`Staging.watch`).
2. Off the loop (a thread, its own connection), one REPEATABLE READ transaction reads
   `pg_current_snapshot()` and the chunk — the rows whose key is past the last key read, up to
   `snapshot_chunk_rows` of them, never past the table's largest key when its first chunk was read
   (later rows are in the stream) — and commits; then a *watermark* goes into the WAL
   (`pg_logical_emit_message(false, 'tributary.watermark', …)`, non-transactional).
3. When the stream reaches the watermark, every transaction visible to the chunk's snapshot has
   been streamed. The chunk's rows are staged there, minus each key that a transaction the
   snapshot did not see (in its `xip`, or at/after its `xmax`) changed while watched: that
   streamed change is newer. A truncate or schema change of the table while watched, or a
   transaction of the snapshot's `xip` that the stream committed *before* the watch began (its
   commit decoded, not yet visible), makes the chunk be read again.
4. The snapshot's context (tables pending, the last key read, the tables ever snapshotted) is
   committed with the log commit that covers the watermark: an entry `<source>#snapshot` of the
   manifest's positions. A crash resumes from the last committed chunk.

A table re-snapshotted (its topic already holds keys: a re-snapshot after a lost slot, a
requested one) ends with a check of the keys its topic holds, in batches read the same way: each
key the table no longer has gets a delete + tombstone (capture/snapshot/initial.py).
"""

from __future__ import annotations

import bisect
import contextlib
import logging
import threading
import time
import uuid
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import orjson
import psycopg
from psycopg import sql

from tributary.capture.database.catalog import TableInfo, table_info
from tributary.capture.database.source_tables import SourceTables
from tributary.capture.decoding.lsn import Lsn
from tributary.capture.decoding.values import type_family
from tributary.capture.errors import CaptureError, TransientSourceError
from tributary.capture.records import envelope as env
from tributary.capture.records.routing import table_keys, without_field
from tributary.capture.records.staging import Staging, Watch
from tributary.capture.snapshot.initial import SnapshotSource
from tributary.capture.snapshot.reader import SnapshotReader
from tributary.capture.snapshot.signals import EXECUTE_SNAPSHOT, PAUSE_SNAPSHOT, RESUME_SNAPSHOT, STOP_SNAPSHOT
from tributary.capture.spec import SourceSpec
from tributary.capture.status import SourceStatus
from tributary.log import Mark

if TYPE_CHECKING:
    import pyarrow as pa  # loaded on first use: the CLI imports this module without it

    from tributary.capture.snapshot.columnar import ColumnPlan

__all__ = [
    "RECENT_XIDS",
    "WATERMARK_PREFIX",
    "ChunkedSnapshot",
    "SnapshotContext",
    "absent_query",
    "check_query",
    "context_key",
    "filter_refusal",
    "key_lines",
]

log = logging.getLogger(__name__)

WATERMARK_PREFIX = "tributary.watermark"
RECENT_XIDS = 100_000  # the transactions the stream committed last, by order (the race check)
_XID_MOD = 1 << 32


def context_key(source: str) -> str:
    """The manifest positions' entry holding a source's snapshot context (never a source name:
    those are identifiers)."""
    return f"{source}#snapshot"


@dataclass
class SnapshotContext:
    """What a source has snapshotted and where a chunked snapshot under way stands (JSON, durable)."""

    pending: list[str] = field(default_factory=list)  # tables to read, the first being read
    last: list[str | None] | None = None  # the last key read of pending[0] (PostgreSQL text values)
    # pending[0]'s largest key when its first chunk was read: rows past it were inserted later and
    # are in the stream, so the chunks stop there (else a table growing at its end is chased forever)
    high: list[str | None] | None = None
    phase: str = "rows"  # of pending[0]: "rows", then "absent" (its topic's keys checked)
    check: list[str] = field(default_factory=list)  # pending tables whose topic's keys are checked after
    done: list[str] | None = field(default_factory=list)  # tables ever snapshotted; None: unknown
    rows: int = 0  # rows staged by the snapshot under way
    chunks: int = 0  # chunks staged by the snapshot under way
    checked: str | None = None  # phase "absent": the last key checked (its JSON text)
    # the rows the snapshot under way is estimated to stage (its tables' catalog estimates when
    # requested; 0: unknown, estimated again when capture starts)
    total: int = 0
    keyless: list[str] = field(default_factory=list)  # tables refused for having no key (said once)
    # the key columns each table's records are keyed by ([] = the whole row): a table whose key
    # changed while capture was stopped is re-snapshotted at start (records keyed the old way go)
    keys: dict[str, list[str]] = field(default_factory=dict)
    # pending tables read only where a condition holds (`capture snapshot --where`): no key check
    filters: dict[str, str] = field(default_factory=dict)
    paused: bool = False  # `pause-snapshot`: no chunk is started until `resume-snapshot`

    def to_json(self) -> str:
        return orjson.dumps(
            {
                "pending": self.pending,
                "last": self.last,
                "high": self.high,
                "phase": self.phase,
                "check": self.check,
                "done": self.done,
                "rows": self.rows,
                "chunks": self.chunks,
                "checked": self.checked,
                "total": self.total,
                "keyless": self.keyless,
                "keys": self.keys,
                "filters": self.filters,
                "paused": self.paused,
            }
        ).decode()

    @classmethod
    def from_json(cls, text: str) -> SnapshotContext:
        doc = orjson.loads(text)
        return cls(
            pending=list(doc.get("pending") or []),
            last=doc.get("last"),
            high=doc.get("high"),
            phase=str(doc.get("phase") or "rows"),
            check=list(doc.get("check") or []),
            done=None if doc.get("done") is None else list(doc["done"]),
            rows=int(doc.get("rows") or 0),
            chunks=int(doc.get("chunks") or 0),
            checked=doc.get("checked"),
            total=int(doc.get("total") or 0),
            keyless=list(doc.get("keyless") or []),
            keys={str(k): list(v) for k, v in (doc.get("keys") or {}).items()},
            filters={str(k): str(v) for k, v in (doc.get("filters") or {}).items()},
            paused=bool(doc.get("paused")),
        )


@dataclass
class _Job:
    """One chunk (or one batch of keys checked) read off the loop."""

    id: str
    table: TableInfo
    phase: str
    watch: Watch
    watch_seq: int  # `RecentXids.seq` when the watch began
    thread: threading.Thread | None = None
    error: BaseException | None = None
    ready: bool = False  # the read is over (result or error), the watermark emitted
    xmax: int = 0
    xip: frozenset[int] = frozenset()
    units: list[Any] = field(default_factory=list)  # rows: encoded units; absent: keys absent
    rows: int = 0
    upper: list[str | None] | None = None  # the chunk's last key (text), None: the table's end
    high: list[str | None] | None = None  # the table's largest key at its first chunk (`SnapshotContext.high`)
    checked: str | None = None  # absent: the last key of the batch
    final: bool = False  # the last chunk (or batch) of the phase
    encoder: env.SnapshotEncoder | None = None
    plan: ColumnPlan | None = None
    now_ms: int = 0
    partitions: int = 1
    where: str | None = None  # the table's filter (`SnapshotContext.filters`)
    gen: int = 0  # `ChunkedSnapshot._gen` when started: a stop since discards the job


@dataclass
class _Request:
    """A queued signal: a snapshot of `tables` (each of `filters`' only where its condition
    holds), or a stop (of `tables`, or all), pause or resume."""

    tables: list[str]
    origin: str
    kind: str = EXECUTE_SNAPSHOT
    filters: dict[str, str] = field(default_factory=dict)


@dataclass
class _Kept:
    """A re-snapshot this process began at its table's first chunk: every key staged to the
    table's topic since (streamed ones in `streamed`, kept by `Staging.keep`; the chunks' in
    `read`) names a record at least as new as the table, so the check deletes exactly the topic's
    live keys outside them — with no query of the table. `need`: the log's appended ends when it
    began; the check waits until the log has committed them (a key staged just before is then in
    the log's live keys with its latest record)."""

    table: str
    topic: str
    need: Mark
    streamed: set[bytes]
    read: list[pa.Array] = field(default_factory=list)
    frozen: pa.Array | None = None  # `streamed` as it was when the check began (copied on the loop)

    def absent(self, live: set[bytes]) -> list[bytes]:
        """The live keys no record staged since names, sorted (off the loop: a key the loop
        stages after `frozen` was taken is left out when the deletes are staged)."""
        import pyarrow as pa
        import pyarrow.compute as pc

        staged = self.frozen if self.frozen is not None else pa.array([], pa.binary())
        seen = pa.concat_arrays([*self.read, staged])
        keys = pa.array(list(live), pa.binary())
        return sorted(keys.filter(pc.invert(pc.is_in(keys, value_set=seen))).to_pylist())


class RecentXids:
    """The transactions the stream committed last, each with its order: the last `bound` at
    least, `2 * bound` at most (two generations: adding stays O(1), nothing is copied)."""

    def __init__(self, bound: int = RECENT_XIDS) -> None:
        self.bound = bound
        self.seq = 0
        self._new: dict[int, int] = {}
        self._old: dict[int, int] = {}

    def add(self, xid: int) -> None:
        """Once per streamed transaction."""
        self.seq += 1
        new = self._new
        new[xid] = self.seq
        if len(new) >= self.bound:
            self._old, self._new = new, {}

    def before(self, xids: frozenset[int], seq: int) -> bool:
        """Did the stream commit any of `xids` before order `seq`?"""
        for x in xids:
            at = self._new.get(x)
            if at is None:
                at = self._old.get(x)
            if at is not None and at < seq:
                return True
        return False


def _invisible(xid: int, xmax: int, xip: frozenset[int]) -> bool:
    """Was a transaction (32-bit id) not visible to a snapshot (xmax and xip as 32-bit ids)?"""
    return xid in xip or (xid - xmax) % _XID_MOD < (1 << 31)


class ChunkedSnapshot:
    """One source's chunked snapshots: the context, the chunk being read, staging at watermarks."""

    # Called on the reading thread between a chunk's read and its watermark, with the table and
    # the phase: where a test makes changes land inside a chunk's window, or a chunk slow.
    after_read: Callable[[str, str], None] | None = None
    # Snapshot notifications (capture/records/notifications.py): started, each table done, completed.
    notify: Callable[[str, dict[str, str]], None] | None = None

    def __init__(
        self,
        spec: SourceSpec,
        staging: Staging,
        tables: SourceTables,
        status: SourceStatus,
        context: SnapshotContext,
        *,
        db: str,
        lsn: Callable[[], Lsn],
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.spec = spec
        self.staging = staging
        self.tables = tables
        self.status = status
        self.context = context
        self.lsn = lsn  # the source's durable position: the `source.lsn` of chunk records
        self.clock = clock
        self.writer = SnapshotSource(spec, staging, tables, status, db=db, clock=clock)
        self.recent = RecentXids()
        self.dirty = True  # the context changed since the last commit
        self.job: _Job | None = None
        self._run = uuid.uuid4().hex[:12]  # watermarks of this process (older ones are ignored)
        self._seq = 0
        self._reader: SnapshotReader | None = None
        self._infos: dict[str, TableInfo] = {}
        self._requested: list[_Request] = []
        self._gen = 0  # bumped by a stop: a chunk read started before it is discarded
        self._live: tuple[str, list[bytes]] | None = None  # phase "absent": the keys to check (or delete), sorted
        self._kept: _Kept | None = None  # the table re-snapshotted since its first chunk in this process
        self._unkept: set[str] = set()  # tables restarted mid-re-snapshot: their check queries the table
        self._closed = False
        self.rereads = 0
        self._show()

    # -- requests ------------------------------------------------------------------------
    def request(self, tables: list[str], *, origin: str, filters: dict[str, str] | None = None) -> None:
        """Queue a snapshot of `tables` (each of `filters`' only where its SQL condition holds);
        applied between source transactions (`apply_requests`)."""
        self._requested.append(_Request(list(tables), origin, filters=dict(filters or {})))

    def control(self, kind: str, tables: list[str], *, origin: str) -> None:
        """Queue a `stop-snapshot` (of `tables`, or all), `pause-snapshot` or `resume-snapshot`;
        applied in order with the requests."""
        self._requested.append(_Request(list(tables), origin, kind=kind))

    def apply_requests(self, conn: psycopg.Connection[Any] | None = None) -> bool:
        """Add the queued tables to the pending ones; True if the context changed. Unknown or
        excluded tables, and tables without a key, are refused with a warning (a keyless table is
        remembered in the context: `SourceSession` does not ask for it again until it has a key)."""
        if not self._requested:
            return False
        requested, self._requested = self._requested, []
        if conn is None:
            from tributary.capture.database.slot import sql_connection

            with sql_connection(self.spec.dsn, label=self.spec.name) as own:
                return self._apply(requested, own)
        return self._apply(requested, conn)

    def _apply(self, requested: list[_Request], conn: psycopg.Connection[Any]) -> bool:
        infos = self._catalog(conn)
        ctx = self.context
        idle = not ctx.pending
        changed = self.note_keys(infos.values())
        for req in requested:
            if req.kind != EXECUTE_SNAPSHOT:
                changed = self._control(req) or changed
                continue
            origin = req.origin
            for name in req.tables:
                info = infos.get(name)
                reason = None
                where = req.filters.get(name)
                if info is None:
                    reason = "is not an included table of this source"
                elif not info.identity_columns:
                    reason = (
                        "has no primary key or replica identity index, so it cannot be read in key chunks; "
                        "give it one and capture snapshots it at its next start (not said again until then)"
                    )
                    if name not in ctx.keyless:
                        ctx.keyless.append(name)
                        changed = True
                elif where is not None:
                    reason = filter_refusal(conn, info.schema, info.table, where)
                if info is None or reason is not None:
                    self._warn(f"snapshot of {name} (requested by {origin}) refused: {name} {reason}")
                    continue
                if name in ctx.keyless:
                    ctx.keyless.remove(name)
                    changed = True
                if name in ctx.pending:
                    continue
                ctx.pending.append(name)
                ctx.total += max(info.estimated_rows, 0)
                if where is not None:
                    # Rows outside the condition are not absent: the topic's keys are not checked.
                    ctx.filters[name] = where
                elif (name in (ctx.done or ()) or self._holds_records(info)) and name not in ctx.check:
                    ctx.check.append(name)  # its topic holds rows: deleted ones go
                cond = f" where {where}" if where is not None else ""
                log.info("source %s: chunked snapshot of %s%s requested by %s", self.spec.name, name, cond, origin)
                self.status.snapshot_control = None
                changed = True
        if changed:
            self.dirty = True
            self._show()
        if idle and ctx.pending and self.notify is not None:
            self.notify("STARTED", {"data_collections": ",".join(ctx.pending)})
        return changed

    def _control(self, req: _Request) -> bool:
        """Apply a stop, pause or resume of the chunked snapshot; True if the context changed."""
        ctx = self.context
        if req.kind in (PAUSE_SNAPSHOT, RESUME_SNAPSHOT):
            paused = req.kind == PAUSE_SNAPSHOT
            if paused and not ctx.pending:
                self._warn(f"{req.kind} (requested by {req.origin}) ignored: no chunked snapshot is under way")
                return False
            if ctx.paused == paused:
                return False
            ctx.paused = paused
            verb = "paused" if paused else "resumed"
            log.info("source %s: chunked snapshot %s by %s", self.spec.name, verb, req.origin)
            if self.notify is not None:
                self.notify(verb.upper(), {})
            self._show()
            return True
        if req.kind != STOP_SNAPSHOT:
            return False
        stopped = [t for t in ctx.pending if not req.tables or t in req.tables]
        if not stopped:
            return False
        self._stop(stopped, origin=req.origin)
        return True

    def _stop(self, tables: list[str], *, origin: str) -> None:
        """The snapshot aborted (`stop-snapshot`) for `tables`: they leave the pending ones
        unread (not marked snapshotted), a chunk being read of one of them is discarded."""
        ctx = self.context
        if ctx.pending[0] in tables:
            self._gen += 1  # the chunk in flight is of a stopped table
            ctx.last = ctx.high = ctx.checked = None
            ctx.phase = "rows"
            if self._kept is not None:
                self._drop_kept()
        ctx.pending = [t for t in ctx.pending if t not in tables]
        ctx.check = [t for t in ctx.check if t not in tables]
        for name in tables:
            ctx.filters.pop(name, None)
        log.info("source %s: chunked snapshot of %s stopped by %s", self.spec.name, ", ".join(tables), origin)
        if self.notify is not None:
            self.notify("ABORTED", {"data_collections": ",".join(tables)})
        if not ctx.pending:
            ctx.rows = ctx.chunks = ctx.total = 0
            ctx.paused = False
            self.status.snapshot_table = None
            self.status.snapshot_control = "stopped"
        self.dirty = True
        self._show()

    def _holds_records(self, info: TableInfo) -> bool:
        """Does the table's topic hold records already (streamed before any snapshot of it)?"""
        log_ = self.staging.log
        topic = self.spec.topic(info.schema, info.table)
        return topic in log_.topics() and any(log_.end_offsets(topic))

    def note_keys(self, infos: Iterable[TableInfo]) -> bool:
        """Remember the key each table is keyed by now; True if that changed the context."""
        changed = False
        for info in infos:
            key = list(info.identity_columns)
            if self.context.keys.get(info.qualified) != key:
                self.context.keys[info.qualified] = key
                changed = True
        self.dirty = self.dirty or changed
        return changed

    def restart(self, name: str) -> None:
        """Read `name` again from its first key if it is being read: its rows staged so far may
        predate a rewrite of the table (capture/streaming/ddl_watch.py); the chunk in flight is read again."""
        ctx = self.context
        if not ctx.pending or ctx.pending[0] != name:
            return
        ctx.last = ctx.high = ctx.checked = None
        ctx.phase = "rows"
        if self._kept is not None and self._kept.table == name:
            self._drop_kept()  # keys of an earlier shape may be staged since: the check queries the table
            self._unkept.add(name)
        if self.job is not None and self.job.table.qualified == name:
            self.job.watch.invalid = True
        self.dirty = True

    def _catalog(self, conn: psycopg.Connection[Any] | None = None) -> dict[str, TableInfo]:
        from tributary.capture.database.slot import sql_connection

        if conn is None:
            with sql_connection(self.spec.dsn, label=self.spec.name) as own:
                tables = self.tables.included(own)
        else:
            tables = self.tables.included(conn)
        self._infos = {t.qualified: t for t in tables}
        return self._infos

    def _warn(self, text: str) -> None:
        log.warning("source %s: %s", self.spec.name, text)
        if text not in self.status.warnings:
            self.status.warnings.append(text)

    # -- the loop's side ---------------------------------------------------------------------
    @property
    def active(self) -> bool:
        return bool(self.context.pending) or bool(self._requested)

    def tick(self) -> None:
        """Between source transactions: start reading the next chunk if none is under way; raise
        what a chunk read failed with (the daemon retries the source, which resumes)."""
        job = self.job
        if job is not None:
            if job.ready and job.error is not None:
                self.job = None
                self.staging.unwatch(job.watch.topic)
                error = job.error
                if isinstance(error, CaptureError):
                    raise error
                raise TransientSourceError(
                    f"source {self.spec.name!r}: chunked snapshot of {job.table.qualified} failed: {error}"
                ) from None
            return
        if self._closed or not self.context.pending or self.context.paused:
            return
        name = self.context.pending[0]
        info = self._infos.get(name)
        if info is None:
            info = self._catalog().get(name)
        if info is None or not info.identity_columns:
            self._warn(f"snapshot of {name} skipped: the table is gone, excluded, or has no key")
            self._table_done(name, "SKIPPED")
            return
        topic = self.spec.topic(info.schema, info.table)
        if not self._keep_keys(name, topic):
            return  # the check waits for the log to commit what was staged before the re-snapshot
        self._seq += 1
        partitions = self.staging.partitions(topic)  # created here, on the loop: the thread only reads
        job = _Job(
            id=f"{self.spec.name}:{self._run}:{self._seq}",
            table=info,
            phase=self.context.phase,
            watch=self.staging.watch(topic),
            watch_seq=self.recent.seq + 1,
            partitions=partitions,
            where=self.context.filters.get(name),
            gen=self._gen,
        )
        last, checked = self.context.last, self.context.checked
        job.high = self.context.high if last is not None else None
        job.thread = threading.Thread(
            target=self._read, args=(job, last, checked), name=f"capture-chunk-{self.spec.name}", daemon=True
        )
        self.job = job
        self.status.snapshot_table = name
        job.thread.start()

    def _keep_keys(self, name: str, topic: str) -> bool:
        """On the loop, before a job of `name`: at a re-snapshot's first chunk, begin keeping the
        keys staged to its topic (`_Kept`); before its check, False until the log committed what
        was appended when that began."""
        ctx, kept = self.context, self._kept
        if kept is not None and kept.table != name:
            self._drop_kept()
            kept = None
        first = ctx.phase == "rows" and ctx.last is None and name in ctx.check
        if kept is None and first and name not in self._unkept:
            self._kept = _Kept(name, topic, self.staging.log.mark(), self.staging.keep(topic))
        elif kept is not None and ctx.phase == "absent" and kept.frozen is None:
            if not self.staging.log.committed_through(kept.need):
                return False
            import pyarrow as pa

            kept.frozen = pa.array(list(kept.streamed), pa.binary())
        return True

    def _drop_kept(self) -> None:
        if self._kept is not None:
            self.staging.unkeep(self._kept.topic)
            self._kept = None

    def on_watermark(self, content: str) -> bool:
        """The stream reached a watermark; True when a chunk was staged (a commit point)."""
        job = self.job
        if job is None or content != job.id:
            return False  # another process's, or one from before a restart
        if job.thread is not None:
            job.thread.join()  # the watermark is the thread's last step
        self.job = None
        watch = job.watch
        self.staging.unwatch(watch.topic)
        if job.error is not None:
            self.job = job  # `tick` raises it
            return False
        if job.gen != self._gen:
            return False  # its table's snapshot was stopped while it was read
        if watch.invalid or self.recent.before(job.xip, job.watch_seq):
            self.rereads += 1
            self.status.snapshot_chunks_reread = self.rereads
            return False  # read again by the next tick, from the same key
        newer: set[bytes] = set()
        for xid, keys in watch.by_xid.items():
            if xid is not None and _invisible(xid % _XID_MOD, job.xmax, job.xip):
                newer |= keys
        if job.phase == "rows":
            self._stage_rows(job, newer)
        else:
            self._stage_absent(job, newer)
        self.dirty = True
        self._show()
        return True

    def _last_of_all(self, job: _Job) -> bool:
        """Is this the snapshot's last unit (its last record marked `snapshot = "last"`)?"""
        ctx = self.context
        if not job.final or len(ctx.pending) > 1 or any(r.kind == EXECUTE_SNAPSHOT for r in self._requested):
            return False
        return job.phase == "absent" or ctx.pending[0] not in ctx.check

    def _stage_rows(self, job: _Job, newer: set[bytes]) -> None:
        ctx = self.context
        info = job.table
        # The chunk's shape (read with it) announced first, if new: on its first chunk, or after
        # a schema change no streamed change has announced yet.
        columns = [(c.name, c.type, c.typeoid) for c in info.columns]
        self.tables.observe(
            info.schema, info.table, columns, complete=True, key=info.identity_columns, now_ms=job.now_ms
        )
        assert job.encoder is not None
        kept = _keep(job, newer)
        if self._kept is not None and self._kept.table == info.qualified:
            self._kept.read.extend(_unit_keys(kept))
        last_marker = "last" if self._last_of_all(job) else "true"
        for i, (kind, unit) in enumerate(kept):
            marker = last_marker if i == len(kept) - 1 else "true"
            if kind == "columnar":
                recs, last_row = unit
                assert job.plan is not None  # the unit was encoded with the job's plan
                self.writer.stage_chunk(job.encoder, job.plan, b"", job.now_ms, marker, recs=recs, last_row=last_row)
            elif kind == "json":
                self.writer.stage_json_rows(job.encoder, unit, job.now_ms, marker)
            else:
                row, out = unit
                self.writer.stage_row(job.encoder, row, job.now_ms, marker, out=out)
        self.staging.flush()
        ctx.rows += job.rows
        ctx.chunks += 1
        self.status.snapshot_rows_done = ctx.rows
        if job.final:
            name = info.qualified
            if name in ctx.check:
                ctx.phase, ctx.last, ctx.checked, ctx.high = "absent", None, None, None
            else:
                self._table_done(name)
        else:
            ctx.last, ctx.high = job.upper, job.high
            if self.notify is not None:
                self.notify("IN_PROGRESS", _progress(ctx.pending, info.qualified, job.high, job.upper))

    def _stage_absent(self, job: _Job, newer: set[bytes]) -> None:
        ctx = self.context
        streamed = self._kept.streamed if self._kept is not None else set()
        gone = [k for k in job.units if k not in newer and k not in streamed]
        if gone:
            assert job.encoder is not None
            marker = "last" if self._last_of_all(job) else "true"
            self.writer.stage_deletes(job.encoder, gone, job.now_ms, marker)
            self.staging.flush()
        if job.final:
            self._table_done(job.table.qualified)
        else:
            ctx.checked = job.checked

    def _table_done(self, name: str, outcome: str = "SUCCEEDED") -> None:
        ctx = self.context
        if self.notify is not None:
            self.notify("TABLE_SCAN_COMPLETED", {"data_collection": name, "status": outcome})
        if ctx.pending and ctx.pending[0] == name:
            ctx.pending.pop(0)
        if name in ctx.check:
            ctx.check.remove(name)
        self._live = None  # a later re-snapshot of the table reads its live keys afresh
        if self._kept is not None and self._kept.table == name:
            self._drop_kept()
        self._unkept.discard(name)
        if ctx.done is None:
            ctx.done = []
        if name not in ctx.done and ctx.filters.pop(name, None) is None:  # a filtered read is not the table
            ctx.done.append(name)
        ctx.last, ctx.checked, ctx.phase, ctx.high = None, None, "rows", None
        if not ctx.pending:
            ctx.rows = ctx.chunks = ctx.total = 0
            self.status.snapshot_table = None
            log.info("source %s: chunked snapshot done", self.spec.name)
            if self.notify is not None:
                self.notify("COMPLETED", {})
        self.dirty = True
        self._show()

    def _show(self) -> None:
        ctx, status = self.context, self.status
        status.snapshot_tables_pending = list(ctx.pending)
        if ctx.pending:
            status.snapshot_control = "paused" if ctx.paused else None
            status.snapshot_method = "chunked"
            status.snapshot_table = ctx.pending[0]
            status.snapshot_chunk = ctx.chunks
            status.snapshot_rows_done = ctx.rows
            status.snapshot_rows_total = max(ctx.rows, ctx.total)

    def estimate(self, conn: psycopg.Connection[Any]) -> None:
        """A context resumed without an estimate (written by an older version, or rebuilt by
        `log verify --repair`): the rows done plus the pending tables' catalog estimates (the
        table being read counted whole: a bound from above)."""
        ctx = self.context
        if not ctx.pending or ctx.total > ctx.rows:
            return
        infos = self._catalog(conn)
        ctx.total = ctx.rows + sum(max(infos[t].estimated_rows, 0) for t in ctx.pending if t in infos)
        self._show()

    def on_commit(self, xid: int | None) -> bool:
        """The stream committed a transaction: remember it (the race check) and apply the snapshot
        requests made inside it, so they are durable with the commit covering it; True if any."""
        if xid is not None:
            self.recent.add(xid)  # wal2json prints 32-bit ids
        return bool(self._requested) and self.apply_requests()

    def close(self) -> None:
        self._closed = True
        self._drop_kept()
        job, self.job = self.job, None
        if job is not None:
            self.staging.unwatch(job.watch.topic)
        if job is not None and job.thread is not None and job.thread.is_alive():
            # Cancel its statement and wait for it: a thread left inside libpq while the
            # interpreter exits aborts the process (PyGILState_Release).
            reader = self._reader
            if reader is not None:
                with contextlib.suppress(psycopg.Error):
                    reader.connection.cancel_safe(timeout=5.0)
            job.thread.join(timeout=30.0)
            if job.thread.is_alive():
                log.warning("source %s: a chunk read did not end within 30 s of the stop", self.spec.name)
            return  # the reading thread closes the connection when it ends
        reader, self._reader = self._reader, None
        if reader is not None:
            reader.close()

    # -- the thread's side -------------------------------------------------------------------
    def _read(self, job: _Job, last: list[str | None] | None, checked: str | None) -> None:
        try:
            if self._reader is None:
                self._reader = SnapshotReader(self.spec.dsn, None, label=self.spec.name)
            reader = self._reader
            conn = reader.connection
            text = conn.execute("SELECT pg_current_snapshot()::text").fetchone()
            assert text is not None
            xmin, xmax, xip = str(text[0]).split(":")
            job.xmax = int(xmax) % _XID_MOD
            job.xip = frozenset(int(x) % _XID_MOD for x in xip.split(",") if x)
            job.now_ms = int(self.clock() * 1000)
            # The table's columns now, in this transaction: a schema change between chunks shows.
            schema, name = job.table.schema, job.table.table
            found = table_info(conn, schema, name, leaves=self.tables.leaves)
            if found is None or not found.identity_columns:  # dropped (or its key) since: done
                job.final = True
                job.units, job.upper, job.checked = [], None, None
            else:
                job.table = found
            info = job.table
            job.encoder = env.SnapshotEncoder(
                schema=info.schema,
                table=info.table,
                columns=[(c.name, c.type, c.typeoid) for c in info.columns],
                primary_key=info.identity_columns,
                source_name=self.spec.name,
                db=self.writer.db,
                lsn=self.lsn(),
                now_ms=job.now_ms,
                rules=self.writer.table_rules(info),
                routing=self.spec.routing,
            )
            if job.final:
                pass
            elif job.phase == "rows":
                self._read_rows(job, reader, last)
                self.status.snapshot_rows_read += job.rows
            else:
                self._read_absent(job, reader, checked)
            conn.commit()
            hook = type(self).after_read
            if hook is not None:
                hook(job.table.qualified, job.phase)
            if self._closed:
                return
            conn.execute(
                "SELECT pg_logical_emit_message(false, %s, %s)", (WATERMARK_PREFIX, job.id)
            )  # the high watermark
            # A non-transactional message is not flushed by itself, and a walsender sends only
            # flushed WAL (the WAL writer would flush it within `wal_writer_delay`, 200 ms by
            # default, per chunk): a transaction id makes this commit write, and flush, a record.
            conn.execute("SELECT pg_current_xact_id()")
            conn.commit()
        except BaseException as exc:  # reported to the loop by `tick`
            job.error = exc
            broken, self._reader = self._reader, None
            if broken is not None:
                with contextlib.suppress(psycopg.Error):
                    broken.close()
        finally:
            job.ready = True
            if self._closed and self._reader is not None:
                self._reader.close()
                self._reader = None

    def _read_rows(self, job: _Job, reader: SnapshotReader, last: list[str | None] | None) -> None:
        info = job.table
        keys = info.identity_columns
        by_name = {c.name: c for c in info.columns}
        table = sql.SQL("{}.{}").format(sql.Identifier(info.schema), sql.Identifier(info.table))
        cols = [sql.SQL("{}.{}").format(table, sql.Identifier(k)) for k in keys]
        key_tuple = sql.SQL("({})").format(sql.SQL(", ").join(cols))

        def literal(values: list[str | None]) -> sql.Composable:
            return sql.SQL("({})").format(
                sql.SQL(", ").join(
                    sql.SQL("{}::{}").format(sql.Literal(v), sql.SQL(by_name[k].type))
                    for k, v in zip(keys, values, strict=True)
                )
            )

        order = sql.SQL(", ").join(cols)
        texts = sql.SQL(", ").join(sql.SQL("{}::text").format(c) for c in cols)
        # `capture snapshot --where`: the operator's condition, checked with EXPLAIN when requested
        # (`filter_refusal`); read, as every chunk, in a read-only transaction of capture's role.
        only = sql.SQL("({})").format(sql.SQL(job.where)) if job.where is not None else None
        if job.high is None:  # the table's first chunk: its largest key now bounds the snapshot
            top = reader.connection.execute(
                sql.SQL("SELECT {} FROM {}{} ORDER BY {} LIMIT 1").format(
                    texts,
                    table,
                    sql.SQL("") if only is None else sql.SQL(" WHERE ") + only,
                    sql.SQL(", ").join(sql.SQL("{} DESC").format(c) for c in cols),
                )
            ).fetchone()
            if top is None:  # an empty table: one chunk of nothing
                job.units, job.rows, job.plan, job.upper, job.final = [], 0, None, None, True
                return
            job.high = list(top)
        after = sql.SQL("{} > {}").format(key_tuple, literal(last)) if last is not None else None
        until = sql.SQL("{} <= {}").format(key_tuple, literal(job.high))
        if only is not None:
            until = sql.SQL("{} AND {}").format(until, only)
        n = self.spec.snapshot_chunk_rows
        # The chunk's last key, and whether a row up to `high` follows it: a chunk that reaches
        # `high` is the last one (its last row marked), even when the table holds a multiple of n rows.
        bound = sql.SQL("SELECT {} FROM {} WHERE {} ORDER BY {} LIMIT 2 OFFSET {}").format(
            texts,
            table,
            until if after is None else sql.SQL("{} AND {}").format(after, until),
            order,
            sql.Literal(n - 1),
        )
        found = reader.connection.execute(bound).fetchall()
        row = list(found[0]) if len(found) == 2 else None  # None: the rest, up to `high`
        job.upper = row
        job.final = row is None
        upper = until
        if row is not None:  # not the last chunk: up to its last key (and, filtered, where the condition holds)
            upper = sql.SQL("{} <= {}").format(key_tuple, literal(row))
            upper = upper if only is None else sql.SQL("{} AND {}").format(upper, only)
        parts = [after, upper]
        conds = [p for p in parts if p is not None]
        reader.where = sql.SQL(" AND ").join(conds) if conds else None
        try:
            job.units, job.rows, job.plan = self._units(job, reader)
        finally:
            reader.where = None

    def _units(self, job: _Job, reader: SnapshotReader) -> tuple[list[Any], int, Any]:
        """The chunk's rows as (kind, unit), encoded here (off the loop), by the consistent
        snapshot's paths (capture/snapshot/initial.py): the same bytes."""
        info = job.table
        encoder = job.encoder
        assert encoder is not None
        units: list[Any] = []
        rows = 0
        plan = self.writer.columnar_plan(info)
        if plan is not None:
            from tributary.capture.snapshot import columnar

            count = job.partitions
            for chunk in reader.text_chunks(info):
                recs = columnar.encode_chunk(plan, chunk, count)
                units.append(("columnar", recs))
                rows += recs.rows
            return units, rows, plan
        batches = None if self.writer.per_row(info) else reader.json_rows(info, info.identity_columns)
        if batches is not None:
            for batch in batches:
                units.append(("json", batch))
                rows += len(batch)
            return units, rows, None
        for row in reader.rows(info):
            out = encoder.encode_ruled(row)
            if out is not None:  # else outside the table's row filter
                units.append(("row", (row, out)))
                rows += 1
        return units, rows, None

    def _read_absent(self, job: _Job, reader: SnapshotReader, checked: str | None) -> None:
        """The next batch of the keys to check (sorted, past `checked`) and which of them the
        table no longer has: the topic's live keys, queried against the table in batches; or,
        when this process kept every key staged since the re-snapshot began (`_Kept`), the live
        keys outside those, deleted without a query. A table with rules (capture/records/rules.py)
        is read whole instead: its keys may be hashed or masked, and a row outside its filter is gone."""
        conn = reader.connection
        info = job.table
        assert job.encoder is not None
        name = info.qualified
        kept = self._kept if self._kept is not None and self._kept.table == name else None
        if self._live is None or self._live[0] != name:  # off the loop: `live_keys` reads on its own
            live = table_keys(self.staging.live_keys(job.encoder.topic), job.encoder.key_field)
            self._live = (name, kept.absent(live) if kept is not None else sorted(live))
        keys_to_check = self._live[1]
        start = 0 if checked is None else bisect.bisect_right(keys_to_check, checked.encode())  # sorted
        n = self.spec.snapshot_chunk_rows
        batch = keys_to_check[start : start + n]
        job.final = len(keys_to_check) - start <= n
        job.checked = batch[-1].decode() if batch else checked
        if not batch or kept is not None:
            job.units = batch
            return
        if job.encoder.rules is not None:
            encode = job.encoder.encode_ruled
            present = {out.key for row in reader.rows(info) if (out := encode(row)) is not None}
            job.units = [k for k in batch if k not in present]
            return
        keys = info.identity_columns
        field = job.encoder.key_field  # a routed table's keys: checked without their key field
        plain = {k: k if field is None else without_field(k, field[0]) for k in batch}
        # A key of another shape (the table was keyed otherwise when it was written) is gone.
        foreign = {k for k in batch if not _shaped(plain[k], keys)}
        batch = [k for k in batch if k not in foreign]
        if not batch:
            job.units = sorted(foreign)
            return
        query = check_query(conn, info)
        absent = {str(r[0]).encode() for r in conn.execute(query, (key_lines([plain[k] for k in batch]),))}
        job.units = sorted(foreign | {k for k in batch if plain[k] in absent})


def filter_refusal(conn: psycopg.Connection[Any], schema: str, table: str, where: str) -> str | None:
    """Why `where` cannot filter the table's rows (`capture snapshot --where`), in one line; None
    when PostgreSQL plans it: EXPLAIN, so nothing is read, one statement (psycopg's extended
    protocol refuses several), rolled back."""
    query = sql.SQL("EXPLAIN SELECT 1 FROM {}.{} WHERE ({})").format(
        sql.Identifier(schema),
        sql.Identifier(table),
        sql.SQL(where),  # the operator's SQL, by design (docs/capture.md)
    )
    try:
        with conn.transaction(force_rollback=True):
            conn.execute(query)
    except psycopg.Error as exc:
        first = next((line for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
        return f"cannot be filtered by {where!r}: {first.strip()}"
    return None


def _shaped(key: bytes, columns: tuple[str, ...]) -> bool:
    """Is `key` a JSON object with exactly the key columns (the shape records are keyed by now)?"""
    try:
        doc = orjson.loads(key)
    except orjson.JSONDecodeError:
        return False
    return isinstance(doc, dict) and len(doc) == len(columns) and all(c in doc for c in columns)


_NOT_NULL = """
SELECT a.attname FROM pg_attribute a
JOIN pg_class c ON c.oid = a.attrelid JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = %s AND c.relname = %s AND a.attnum > 0 AND NOT a.attisdropped AND a.attnotnull
"""


def key_lines(keys: list[bytes]) -> str:
    """A batch of keys as `absent_query`'s parameter: one text, a key (its JSON) a line. JSON
    holds no raw newline, and one text costs nothing to send where a text[] of 200,000 keys
    costs seconds of client CPU (psycopg escapes each element in Python)."""
    return b"\n".join(keys).decode()


def check_query(conn: psycopg.Connection[Any], info: TableInfo) -> sql.Composed:
    """`absent_query` for the table as it is now (which of its key columns are NOT NULL)."""
    return absent_query(info, {str(r[0]) for r in conn.execute(_NOT_NULL, (info.schema, info.table))})


def absent_query(info: TableInfo, not_null: Collection[str]) -> sql.Composed:
    """The keys of a batch (the one parameter: `key_lines`) that name no row of the table.

    A key column that is NOT NULL (every primary key or replica identity index column is) is
    matched with `=`, which lets the planner look each key up in the key's index, or hash the
    batch and read the table once when the batch is big beside it; IS NOT DISTINCT FROM allows
    neither (each key would scan the table) and is kept for a column that may hold NULL (a
    whole-row key), NULL matching NULL. A key's JSON spells bytea as hex without `\\x`
    (capture/decoding/values.py), which json_populate_record reads as escaped text, giving the hex digits'
    own bytes: re-decoded as hex (from `r`, so that the lookup depends on `r` alone)."""
    table = sql.SQL("{}.{}").format(sql.Identifier(info.schema), sql.Identifier(info.table))
    types = {c.name: c.type for c in info.columns}
    conds = []
    for key in info.identity_columns:
        col = sql.Identifier(key)
        value: sql.Composable = sql.SQL("r.{}").format(col)
        if type_family(types.get(key, "")) == "bytea":
            value = sql.SQL("decode(encode(r.{}, 'escape'), 'hex')").format(col)
        op = sql.SQL("=") if key in not_null else sql.SQL("IS NOT DISTINCT FROM")
        conds.append(sql.SQL("x.{} {} {}").format(col, op, value))
    return sql.SQL(
        "SELECT k FROM unnest(string_to_array(%s::text, E'\\n')) AS k, "
        "LATERAL json_populate_record(NULL::{t}, k::json) AS r "
        "WHERE NOT EXISTS (SELECT 1 FROM {t} AS x WHERE {match})"
    ).format(t=table, match=sql.SQL(" AND ").join(conds))


def _key_text(key: list[str | None] | None) -> str:
    """A chunk key as Debezium's notifications spell it (`Arrays.toString`): `[1, abc]`."""
    return "" if key is None else "[" + ", ".join("null" if v is None else v for v in key) + "]"


def _progress(
    pending: list[str], table: str, high: list[str | None] | None, last: list[str | None] | None
) -> dict[str, str]:
    """IN_PROGRESS's data after a chunk (Debezium's): the tables left, the one being read, its
    largest key when the snapshot began reading it and the chunk's last key."""
    return {
        "data_collections": ",".join(pending),
        "current_collection_in_progress": table,
        "maximum_key": _key_text(high),
        "last_processed_key": _key_text(last),
    }


def _keep(job: _Job, newer: set[bytes]) -> list[tuple[str, Any]]:
    """The job's units without the rows whose key a newer streamed change holds; columnar units
    as (records, index of their last row kept), empty units left out."""
    kept: list[tuple[str, Any]] = []
    for kind, unit in job.units:
        if kind == "columnar":
            recs = unit
            if newer:
                import numpy as np

                keys = recs.keys.to_pylist()
                drop = np.fromiter((k in newer for k in keys), bool, len(keys))
                if drop.any():
                    recs.partitions = recs.partitions.copy()
                    recs.partitions[drop] = -1
            left = (recs.partitions >= 0).nonzero()[0]
            if len(left):
                kept.append((kind, (recs, int(left[-1]))))
        elif kind == "json":
            batch = [pair for pair in unit if pair[0] not in newer] if newer else unit
            if batch:
                kept.append((kind, batch))
        else:
            row, out = unit
            if out.key not in newer:
                kept.append((kind, unit))
    return kept


def _unit_keys(kept: list[tuple[str, Any]]) -> list[pa.Array]:
    """The keys of the units `_keep` kept (what a chunk staged), as binary arrays."""
    import pyarrow as pa

    out: list[pa.Array] = []
    rows: list[bytes] = []  # the row path's keys, one array for all of them
    for kind, unit in kept:
        if kind == "columnar":
            recs, _ = unit
            keys = recs.keys.cast(pa.binary()) if recs.keys.type != pa.binary() else recs.keys
            out.append(keys.filter(pa.array(recs.partitions >= 0)))
        elif kind == "json":
            out.append(pa.array([pair[0] for pair in unit], pa.binary()))
        else:
            rows.append(unit[1].key)
    if rows:
        out.append(pa.array(rows, pa.binary()))
    return out
