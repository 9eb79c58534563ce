"""One captured database: its slot, its snapshot, its stream, and the positions they reach.

`SourceSession` only wires the parts together and decides where a start begins; each part
has one job:

* `Slot` (capture/database/slot.py): inspect, (re)create, stream from and confirm to the replication slot;
* `SnapshotSource` (capture/snapshot/initial.py): the initial snapshot;
* `StreamingSource` (capture/streaming/stream.py): wal2json messages → staged records;
* `OffsetContext` (capture/streaming/positions.py): what is appended, what is durable, what may be confirmed —
  the exactly-once story, step by step; `Staging` (capture/records/staging.py): records into the log.

The session never commits: the daemon's commit (capture/daemon.py) makes records durable and only
then lets the session confirm the LSN to the server.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from typing import Any

import psycopg

from tributary.capture.database.replication import ReplicationConnection
from tributary.capture.database.slot import Slot, SlotState, sql_connection
from tributary.capture.database.source_tables import SourceTables
from tributary.capture.decoding import encodings, wal2json
from tributary.capture.decoding.lsn import Lsn
from tributary.capture.errors import SlotLost, SlotMissing, SourceMisconfigured
from tributary.capture.records.debezium import DebeziumRewriter, canonical_key
from tributary.capture.records.heartbeats import heartbeat_record
from tributary.capture.records.notifications import INCREMENTAL, INITIAL, Notifier
from tributary.capture.records.routing import TableFilter
from tributary.capture.records.staging import Staging
from tributary.capture.resume import repaired_key
from tributary.capture.snapshot.chunked import ChunkedSnapshot, SnapshotContext, context_key
from tributary.capture.snapshot.initial import RESNAPSHOT_POSITION, SnapshotSource
from tributary.capture.snapshot.signals import EXECUTE_SNAPSHOT, SnapshotSignal
from tributary.capture.spec import SourceSpec
from tributary.capture.status import SourceState, SourceStatus
from tributary.capture.streaming.ddl_watch import CatalogWatcher, SchemaChanges
from tributary.capture.streaming.positions import OffsetContext
from tributary.capture.streaming.stream import StreamingSource
from tributary.log import Mark, SourceWriter

__all__ = ["SourceSession", "SourceSpec"]

log = logging.getLogger(__name__)


class SourceSession:
    """One source from start-up to close: snapshot if needed, then the stream."""

    def __init__(self, spec: SourceSpec, log_: SourceWriter, *, clock: Callable[[], float] = time.time) -> None:
        self.spec = spec
        self.clock = clock
        self.status = SourceStatus(name=spec.name, slot=spec.slot)
        self.rate_base = 0  # status.changes at the start of the current rate window (the daemon's)
        self.slot = Slot(spec.dsn, spec.slot, label=spec.name)
        self.chunked: ChunkedSnapshot | None = None  # once open (not for an outbox)
        # What the previous run confirmed to the slot (its status file): a slot starting there is ours.
        self.confirmed_before = Lsn.ZERO
        self._requests: list[SnapshotSignal] = []  # snapshot requests (and controls) made before `open`
        self._always_taken = False  # `snapshot = "always"`: this process took its snapshot
        self.finished = False  # `snapshot = "initial_only"`: its snapshot is committed, it streams no more
        self._unmark_repaired = False  # the position was rebuilt by a repair: say at the next commit it is ours
        self.watcher: CatalogWatcher | None = None  # once streaming (not for an outbox)
        self._last_heartbeat_ms = 0
        self.notifier = Notifier(spec.name, spec.notification_channels, clock=clock)
        self.reset(log_)

    def reset(self, log_: SourceWriter) -> None:
        """Forget the connection and everything not yet durable, keep the status: after a failure
        the source starts again from the log's position (its uncommitted appends are the daemon's
        to drop), like a new process would."""
        spec = self.spec
        self.slot.close()
        if self.chunked is not None:
            self.chunked.close()
            self.chunked = None
        if self.watcher is not None:
            self.watcher.stop()
        self.watcher = None
        self.ddl: SchemaChanges | None = None
        self.slot = Slot(spec.dsn, spec.slot, label=spec.name)
        self.offsets = OffsetContext()
        debezium = spec.envelope == "debezium" and spec.router is None
        self.staging = Staging(
            log_,
            partitions=spec.partitions,
            rewrite=DebeziumRewriter().rewrite if debezium else None,
            key_back=canonical_key if debezium else None,
        )
        # The signal table and outbox tables: never snapshotted nor captured as row changes.
        self.tables = SourceTables(
            spec.name,
            TableFilter(spec.include, spec.row_exclude),
            self.staging,
            schema_records=spec.router is None,
            leaves=spec.partitioned_tables == "leaves",
            topic=spec.topic if spec.routing is not None else None,
        )
        self.stream: StreamingSource | None = None  # once open
        self._chunked_start = False  # the new slot's snapshot is a chunked one
        self._opened_changes = False  # `open` changed the snapshot context: `snapshot_tick` says so once

    def rebind(self, log_: SourceWriter) -> None:
        """Append to `log_` from now on: the daemon reopened the log (to drop another source's
        uncommitted appends); this source has nothing uncommitted."""
        self.staging.log = log_

    def open(self, *, on_progress: Callable[[SourceStatus], None] | None = None) -> None:
        """Connect; take the initial snapshot if the log holds no position; start streaming."""
        self.status.state = SourceState.STARTING
        positions = self.staging.log.positions()
        position = positions.get(self.spec.name)
        saved = positions.get(context_key(self.spec.name))
        context = SnapshotContext.from_json(saved) if saved else None
        fresh = False  # a new slot: the context starts again
        if position == str(Lsn.ZERO):  # a re-snapshot that never committed (capture/snapshot/initial.py)
            position = None  # snapshot again, whatever the slot now is
        mode = self.spec.snapshot
        if mode == "initial_only" and position is not None and (context is None or not context.pending):
            self.finish()  # its snapshot was taken (and committed) by an earlier run
            return
        if mode == "always" and not self._always_taken:
            position = None  # Debezium's snapshot.mode=always: a new slot and snapshot at every start
        slot = self.slot.inspect()
        if (refused := encodings.refusal(slot.encoding, database=slot.database)) is not None:
            raise SourceMisconfigured(f"source {self.spec.name!r}: {refused}")
        behind = position is not None and slot.starts_after(max(Lsn.parse(position), self.confirmed_before))
        if positions.get(repaired_key(self.spec.name)):
            self._unmark_repaired = True  # the next commit says capture resumed from it
            if behind and slot.usable:
                text = (
                    f"the log's position {position} was rebuilt by `log verify --repair` and slot {self.spec.slot} "
                    f"starts later, at {slot.start}: continuing from the slot (a repair cannot see the positions "
                    "confirmed while idle); if the slot was also recreated, re-snapshot with `capture snapshot`"
                )
                log.warning("source %s: %s", self.spec.name, text)
                self.status.warnings.append(text)
                behind = False
        start: Lsn
        if position is not None and slot.usable and not behind:
            start = Lsn.parse(position)
        elif position is None and self.spec.snapshot == "never" and slot.usable:
            start = Lsn.ZERO  # the server starts at the slot's confirmed_flush_lsn
        elif position is not None and self.spec.snapshot != "when_needed":
            raise self._refusal(slot, position)
        else:
            if position is not None:
                was = f"recreated (it starts at {slot.start}, after {position})" if behind else slot.status or "missing"
                log.warning("source %s: slot %s %s; taking a new snapshot", self.spec.name, self.spec.slot, was)
                self.status.warnings.append(f"slot {self.spec.slot} was {was}: re-snapshotted")
            start = self._new_slot(slot, on_progress)
            fresh = True
            self._always_taken = True
        self.offsets.start(start)
        self.status.confirmed_lsn = str(start)
        self.stream = StreamingSource(
            self.spec,
            self.staging,
            self.tables,
            self.offsets,
            self.status,
            db=slot.database,
            clock=self.clock,
            on_signal=self._on_signal,
            encoding=encodings.python_codec(slot.encoding),
        )
        with sql_connection(self.spec.dsn, label=self.spec.name) as conn:
            self.status.warnings += self.tables.seed(conn)
            if self.spec.router is None:
                self._chunked(conn, context, fresh=fresh, db=slot.database)
                self._schema_changes(conn, positions, db=slot.database)
                if fresh and mode == "no_data":
                    self._schema_only(conn)
        if mode == "initial_only" and fresh and not self._chunked_start:
            self.finish()  # the consistent snapshot is taken: the daemon commits it, nothing streams
            return
        options = dict(wal2json.WAL2JSON_OPTIONS)
        if not self.tables.routes_partitions:  # a leaf's name need not match the patterns its root does
            options.update(self.tables.filter.wal2json_options())
        if self.spec.signal_table and "add-tables" in options:
            options["add-tables"] += "," + self.spec.signal_table  # its INSERTs are read, as signals
        if self.spec.outbox and "add-tables" in options:
            options["add-tables"] += "".join("," + t.table for t in self.spec.outbox)  # read, as events
        self.slot.start_streaming(start, options)
        if self.watcher is not None:
            self.watcher.start()
        self.status.state = SourceState.STREAMING

    def finish(self) -> None:
        """`snapshot = "initial_only"`: this source's snapshot is over; it does not stream (the
        slot stays, as Debezium leaves it: drop it once no longer needed, it holds WAL)."""
        self.finished = True
        self.status.state = SourceState.STOPPED
        self.status.snapshot_control = "finished"
        log.info("source %s: snapshot finished (snapshot = initial_only): not streaming", self.spec.name)

    @property
    def snapshot_only_done(self) -> bool:
        """An `initial_only` source streaming beside its chunked snapshot, now between source
        transactions with nothing left to read: the daemon commits it and stops the source."""
        return (
            self.spec.snapshot == "initial_only"
            and not self.finished
            and self.stream is not None
            and not self.in_transaction
            and not self.snapshotting
            and (self.chunked is None or self.chunked.job is None)
        )

    def _schema_only(self, conn: psycopg.Connection[Any]) -> None:
        """`snapshot = "no_data"` on a new slot: every included table's schema record, no rows
        (Debezium's no_data captures the structure only); committed with the slot's position."""
        now_ms = int(self.clock() * 1000)
        for table in self.tables.included(conn):
            columns = [(c.name, c.type, c.typeoid) for c in table.columns]
            self.tables.observe(
                table.schema, table.table, columns, complete=True, key=table.identity_columns, now_ms=now_ms
            )
        self.staging.flush()

    def _refusal(self, slot: SlotState, position: str) -> SlotLost | SlotMissing:
        """Why the slot cannot continue the log's position, and the two ways out that lose nothing."""
        name, ways = self.spec.name, 'set snapshot = "when_needed" to re-snapshot, or capture into a new [log] root'
        if slot.usable:
            return SlotLost(
                f"source {name!r}: slot {self.spec.slot!r} starts at {slot.start}, after the log's position "
                f"{position}: it was recreated, and changes in between are not in it; {ways}"
            )
        what = "was invalidated (wal_status = lost)" if slot.status == "lost" else "does not exist"
        err = SlotLost if slot.status == "lost" else SlotMissing
        return err(f"source {name!r}: slot {self.spec.slot!r} {what}, so changes since {position} may be gone; {ways}")

    def _schema_changes(self, conn: psycopg.Connection[Any], positions: dict[str, str], *, db: str) -> None:
        """The catalog watcher (its baseline read now) and the stream's side of its notices,
        with the old topics a previous run had still to end (capture/streaming/ddl_watch.py)."""
        ddl = self.ddl = SchemaChanges(
            self.spec,
            self.tables,
            self.staging,
            self.status,
            db=db,
            request=lambda tables, origin: self.request_snapshot(tables, origin=origin),
            restart=lambda name: self.chunked.restart(name) if self.chunked is not None else None,
            clock=self.clock,
        )
        ddl.load(positions)
        assert self.stream is not None
        self.stream.on_ddl = lambda content, tx_end, now_ms: ddl.on_notice(content, tx_end=tx_end, now_ms=now_ms)
        self.watcher = CatalogWatcher(self.spec, self.tables.matches)
        self.watcher.baseline(conn)
        for topic in ddl.orphans((t.schema, t.table) for t in self.watcher.shapes.values()):
            text = (
                f"topic {topic}: its table no longer exists (dropped, or renamed while capture was stopped): "
                "its rows stay in the topic (docs/capture.md, Schema changes)"
            )
            log.warning("source %s: %s", self.spec.name, text)
            if text not in self.status.warnings:
                self.status.warnings.append(text)

    def _on_signal(self, signal: SnapshotSignal) -> None:
        """A signal read from the stream (capture/snapshot/signals.py): re-snapshot those tables. The
        engine logs each table's request, or its refusal with the reason, when it applies them."""
        if self.spec.router is not None:
            raise ValueError("an outbox source's events are never snapshotted")
        if self.chunked is None:
            self._requests.append(signal)
        else:
            self._to_engine(self.chunked, signal)

    @staticmethod
    def _to_engine(engine: ChunkedSnapshot, signal: SnapshotSignal) -> None:
        """A signal (or a request made before `open`) queued on the chunked-snapshot engine."""
        if signal.kind == EXECUTE_SNAPSHOT:
            engine.request(list(signal.tables), origin=signal.origin, filters=dict(signal.filters))
        else:
            engine.control(signal.kind, list(signal.tables), origin=signal.origin)

    def _chunked(self, conn: psycopg.Connection[Any], context: SnapshotContext | None, *, fresh: bool, db: str) -> None:
        """The chunked-snapshot engine, its context resumed (or started: a new slot), tables
        included but never snapshotted requested (an `include` widened)."""
        spec = self.spec
        included = self.tables.included(conn)
        names = [t.qualified for t in included]
        if fresh or context is None:
            if fresh and self._chunked_start:
                log_ = self.staging.log
                topics = log_.topics()
                held = [
                    t.qualified
                    for t in included
                    if (topic := spec.topic(t.schema, t.table)) in topics and any(log_.end_offsets(topic))
                ]
                context = SnapshotContext(check=held)
                self._requests.insert(0, SnapshotSignal(tuple(names), "the initial snapshot"))
                self.status.snapshot_method = "chunked"
            else:  # a consistent snapshot was just taken, or a log from before contexts existed
                context = SnapshotContext(done=names)
                if fresh and spec.snapshots_data:
                    self.status.snapshot_method = "consistent"
        if context.done is None:  # unknown (a manifest rebuilt by `log verify --repair`): all but pending
            context.done = [n for n in names if n not in context.pending]
        # Keyless tables refused before (said once): asked for again only once they have a key.
        keyless = {t.qualified for t in included if not t.identity_columns}
        context.keyless = [n for n in context.keyless if n in names]
        engine = self.chunked = ChunkedSnapshot(
            spec,
            self.staging,
            self.tables,
            self.status,
            context,
            db=db,
            lsn=lambda: self.offsets.durable,
            clock=self.clock,
        )
        if self.notifier.sink or self.notifier.log:
            engine.notify = functools.partial(self.notifier, self.staging, INCREMENTAL)
        if spec.snapshots_data:
            known = set(context.done) | set(context.pending) | (set(context.keyless) & keyless)
            for name in (n for n in names if n not in known):
                if any(name in r.tables for r in self._requests if r.kind == EXECUTE_SNAPSHOT):
                    continue
                engine._warn(
                    f"{name} is included but was never snapshotted: snapshotting it (chunked) while the rest streams"
                )
                self._requests.append(SnapshotSignal((name,), "include"))
        if spec.snapshots_data:
            for table in included:  # keyed otherwise than when its records were written
                was = context.keys.get(table.qualified)
                if was is not None and was != list(table.identity_columns) and table.qualified in context.done:
                    engine._warn(
                        f"{table.qualified} is now keyed by ({', '.join(table.identity_columns) or 'the whole row'}), "
                        f"was ({', '.join(was) or 'the whole row'}): re-snapshotting it so records keyed the old way go"
                    )
                    self._requests.append(SnapshotSignal((table.qualified,), "a key change"))
        engine.note_keys(included)
        for req in self._requests:
            self._to_engine(engine, req)
        self._requests = []
        engine.estimate(conn)  # a resumed snapshot's progress shows against its tables' rows
        self._opened_changes = engine.apply_requests(conn)
        assert self.stream is not None
        self.stream.on_watermark = engine.on_watermark
        self.stream.on_commit = engine.on_commit
        self.stream.on_resnapshot = lambda tables, why: self.request_snapshot(tables, origin=why)

    def _new_slot(self, slot: SlotState, on_progress: Callable[[SourceStatus], None] | None) -> Lsn:
        """(Re)create the slot, with the initial snapshot unless `snapshot = "never"`; returns its
        consistent point, the first boundary (committed by the daemon right after `open`). A
        chunked snapshot only creates the slot: its chunks are read beside the stream."""
        self._chunked_start = (
            self.spec.snapshots_data and self.spec.snapshot_method == "chunked" and self.spec.router is None
        )
        if self._chunked_start:
            log_ = self.staging.log
            if self.spec.name in log_.positions():
                # A re-snapshot: until the new slot's position is committed, a start snapshots again.
                log_.commit(positions={self.spec.name: RESNAPSHOT_POSITION}, upto=Mark())
            with self.slot.recreate(slot, export_snapshot=False) as info:
                start = info.consistent_point
        elif self.spec.snapshots_data:
            snapshot = SnapshotSource(
                self.spec, self.staging, self.tables, self.status, db=slot.database, clock=self.clock
            )
            log.info("source %s: snapshot started (consistent)", self.spec.name)
            notify = snapshot.notify = functools.partial(self.notifier, self.staging, INITIAL)
            notify("STARTED", {})
            try:
                start = snapshot.take(self.slot, slot, on_progress)
            except BaseException as exc:  # said, then raised: its records are dropped with it
                notify("ABORTED", {"reason": type(exc).__name__})
                raise
            notify("COMPLETED", {})
            log.info(
                "source %s: snapshot finished: %s rows at %s",
                self.spec.name,
                f"{self.status.snapshot_rows_done:,}",
                start,
            )
        else:
            with self.slot.recreate(slot, export_snapshot=False) as info:
                start = info.consistent_point
        self.offsets.slot_created(start)
        self.status.last_lsn = str(start)
        return start

    # -- chunked snapshots (capture/snapshot/chunked.py) ------------------------------------------------
    def request_snapshot(self, tables: list[str], *, origin: str) -> None:
        """Snapshot `tables` ("schema.table") chunked, beside the stream. Applied between source
        transactions and made durable with the log commit after it (a crash neither loses nor
        repeats it); unknown, excluded or keyless tables are refused with a warning (log, status).
        Called on the capture loop's thread: from the stream (a signal), or by the daemon."""
        if self.chunked is None:
            self._requests.append(SnapshotSignal(tuple(tables), origin))
        else:
            self.chunked.request(tables, origin=origin)

    @property
    def snapshotting(self) -> bool:
        """A chunked snapshot is under way (or requested)."""
        return self.chunked is not None and self.chunked.active

    def snapshot_tick(self) -> bool:
        """Between source transactions: apply snapshot requests and start the next chunk read;
        True when the snapshot context changed (the daemon commits it)."""
        if self.in_transaction:
            return False
        ended = self.ddl is not None and self.ddl.tick(self.offsets.durable)  # old topics of renamed tables
        if self.chunked is None:
            return ended
        changed = self.chunked.apply_requests() or self._opened_changes or ended
        self._opened_changes = False  # what `open` applied (a keyless table refused) is committed now
        self.chunked.tick()
        return changed

    def heartbeat(self, now_ms: int) -> bool:
        """Between source transactions, once per `heartbeat_interval_ms`: stage a heartbeat record
        at the position the source reached (an idle one becomes the boundary, committed with it,
        so the slot is confirmed there); True when it staged one (the daemon commits it)."""
        interval = self.spec.heartbeat_interval_ms
        if not interval or self.stream is None or self.in_transaction or now_ms - self._last_heartbeat_ms < interval:
            return False
        self._last_heartbeat_ms = now_ms
        self.offsets.idle_boundary()
        lsn = self.offsets.boundary or self.offsets.durable
        self.staging.stage([heartbeat_record(self.spec.name, lsn, now_ms)], now_ms)
        self.staging.flush()
        return True

    def context_positions(self) -> dict[str, str]:
        """The snapshot context, for the daemon's next commit, if it changed."""
        out = self.ddl.positions() if self.ddl is not None else {}
        if self._unmark_repaired:
            out[repaired_key(self.spec.name)] = ""
        engine = self.chunked
        if engine is not None and engine.dirty:
            out[context_key(self.spec.name)] = engine.context.to_json()
        return out

    # -- what the daemon reads -------------------------------------------------------------
    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def conn(self) -> ReplicationConnection | None:
        """The streaming connection, once open (the daemon selects on it)."""
        return self.slot.conn

    @property
    def in_transaction(self) -> bool:
        return self.offsets.in_transaction

    @property
    def boundary(self) -> Lsn | None:
        return self.offsets.boundary

    @property
    def has_boundary(self) -> bool:
        return self.offsets.boundary is not None

    # -- after a durable commit --------------------------------------------------------------
    def committed(self) -> None:
        """The daemon made everything up to `boundary` durable (capture/streaming/positions.py, step 3)."""
        self.offsets.committed()
        self._unmark_repaired = False
        if self.chunked is not None:
            self.chunked.dirty = False
        if self.ddl is not None:
            self.ddl.dirty = False

    def idle_boundary(self) -> bool:
        """Make an idle position the boundary for the daemon to commit (capture/streaming/positions.py, step 4)."""
        return self.offsets.idle_boundary()

    def confirm(self, *, now_us: int, reply: bool = False) -> None:
        """Advance the slot to what may be confirmed (capture/streaming/positions.py, step 4)."""
        lsn = self.offsets.confirmable()
        if self.slot.confirm(lsn, now_us=now_us, reply=reply):
            self.status.confirmed_lsn = str(lsn)

    def close(self) -> None:
        self.slot.close()
        if self.watcher is not None:
            self.watcher.stop()
        if self.chunked is not None:
            self.chunked.close()
        if self.tables.catalog is not None:
            self.tables.catalog.close()  # the stream's catalog reads (column history, new tables' keys)
