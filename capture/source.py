"""One captured database: its slot, snapshot, replication stream, and the records it appends.

The session turns wal2json messages into log appends and remembers, per source transaction, the
LSN that the next durable commit will cover. It never commits or confirms by itself: the daemon's
commit protocol (capture/daemon.py) decides when records become durable and only then lets the
session confirm the LSN to the server.
"""

from __future__ import annotations

import functools
import logging
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from itertools import groupby
from typing import Any, Literal

import psycopg

from tributary.capture import envelope as env
from tributary.capture import wal2json
from tributary.capture.catalog import TableInfo, list_tables
from tributary.capture.errors import SlotLost, SlotMissing, SourceMisconfigured
from tributary.capture.insert_template import SPLIT, InsertTemplate, table_tag, table_tags
from tributary.capture.log import Log, TopicConfig, encode_plain, partition_for, split_partitions
from tributary.capture.lsn import Lsn
from tributary.capture.replication import (
    Keepalive,
    ReplicationConnection,
    XLogData,
    connect_options,
    translate_connect_error,
)
from tributary.capture.routing import TableFilter
from tributary.capture.schema_tracker import SchemaTracker
from tributary.capture.snapshot import SnapshotReader
from tributary.capture.status import SourceState, SourceStatus

__all__ = ["SourceSession", "SourceSpec"]

log = logging.getLogger(__name__)

_FLUSH_RECORDS = 5_000  # bound memory inside one huge source transaction
_RUN_CHANGES = 200  # INSERTs held back to be encoded column-wise in one go


@dataclass(frozen=True, slots=True)
class SourceSpec:
    name: str
    dsn: str
    slot: str
    include: tuple[str, ...]
    exclude: tuple[str, ...]
    snapshot: str  # initial | never | when_needed
    partitions: int
    # Outbox sources: each inserted row → records (capture.outbox), instead of CDC envelopes.
    router: Callable[[dict[str, Any]], list[env.Output]] | None = None
    columnar_snapshot: bool = True  # False: the row/JSON paths only (tests compare the two)
    insert_templates: bool = True  # False: every change takes the generic path (tests compare the two)


class SourceSession:
    """Appends one source's changes to the log, transaction by transaction."""

    def __init__(self, spec: SourceSpec, log_: Log, *, clock: Callable[[], float] = time.time) -> None:
        self.spec = spec
        self.log = log_
        self.clock = clock
        self.filter = TableFilter(spec.include, spec.exclude)
        self.status = SourceStatus(name=spec.name, slot=spec.slot)
        self.schemas = SchemaTracker()
        self.conn: ReplicationConnection | None = None
        self.durable: Lsn = Lsn.ZERO  # covered by the committed manifest
        self.boundary: Lsn | None = None  # end of the last whole transaction appended, not yet durable
        self.idle_lsn: Lsn = Lsn.ZERO  # a position past which nothing of ours is pending
        self.in_transaction = False
        self._skip_tx = False
        self._hold_inserts = False  # inside a transaction we append, with templates on: INSERTs go to `_run`
        self._tx: dict[str, Any] = {}
        self._pending: dict[tuple[str, int], list[tuple[bytes | None, bytes | None, int, bytes | None]]] = defaultdict(
            list
        )
        self._pending_count = 0
        self._db = ""
        self.last_tx_changes = 0
        self._identity: dict[tuple[str, str], tuple[str, ...]] = {}
        self._ctx: dict[str, Any] = {
            "source_name": spec.name,
            "db": "",
            "lsn": None,
            "tx_id": None,
            "commit_ts_ms": None,
            "now_ms": 0,
        }
        self._partitions: dict[str, int] = {}  # topic -> partition count, once known
        self._templates: dict[bytes, InsertTemplate | None] = {}  # table tag -> INSERT template (None: never)
        self._tx_part: bytes | None = None  # the transaction's `source` fields, for the templates
        self._run: list[bytes] = []  # INSERT documents not yet encoded (only ever inside a transaction)
        self._last_tag = b""  # the table tag of the last run: most runs are all that table's
        self.templated = 0  # changes encoded by INSERT templates (the rest took the generic path)
        self.rate_base = 0  # status.changes at the start of the current rate window

    # -- start-up ------------------------------------------------------------------
    def open(self, *, on_progress: Callable[[SourceStatus], None] | None = None) -> None:
        """Connect; take the initial snapshot if the log holds no position; start streaming."""
        self.status.state = SourceState.STARTING
        position = self.log.positions().get(self.spec.name)
        slot = self._slot_state()
        start: Lsn
        if position is not None and slot is not None and slot != "lost":
            start = Lsn.parse(position)
        elif position is None and self.spec.snapshot == "never" and slot is not None and slot != "lost":
            start = Lsn.ZERO  # the server starts at the slot's confirmed_flush_lsn
        elif position is not None and self.spec.snapshot != "when_needed":
            what = "was invalidated (wal_status = lost)" if slot == "lost" else "does not exist"
            err = SlotLost if slot == "lost" else SlotMissing
            raise err(
                f"source {self.spec.name!r}: slot {self.spec.slot!r} {what}, so changes since "
                f'{position} may be gone; set snapshot = "when_needed" to re-snapshot, or recreate it'
            )
        else:
            if position is not None:
                log.warning(
                    "source %s: slot %s %s; taking a new snapshot", self.spec.name, self.spec.slot, slot or "missing"
                )
                self.status.warnings.append(f"slot {self.spec.slot} was {slot or 'missing'}: re-snapshotted")
            start = self._snapshot_then_slot(slot, on_progress)
        self.durable = self.idle_lsn = start
        self.status.confirmed_lsn = str(start)
        self._seed_catalog()
        self.conn = ReplicationConnection(self.spec.dsn, label=self.spec.name)
        options = dict(wal2json.WAL2JSON_OPTIONS)
        options.update(self.filter.wal2json_options())
        self.conn.start(self.spec.slot, start, options)
        self.status.state = SourceState.STREAMING

    def _seed_catalog(self) -> None:
        """Each table's columns and identity from the catalog: to recognise omitted TOAST values
        and to key tables whose identity is an index or the whole row."""
        with self._sql() as conn:
            for table in list_tables(conn, self.filter.matches):
                self.schemas.seed(table.schema, table.table, [(c.name, c.type, c.typeoid) for c in table.columns])
                self._identity[(table.schema, table.table)] = table.identity_columns
                numeric = [c.name for c in table.columns if c.type.startswith("numeric")]
                if numeric:
                    # Trap 1: wal2json 2.5 prints NaN/±Infinity numerics as null, like SQL NULL.
                    self.status.warnings.append(
                        f"{table.qualified}: numeric column(s) {', '.join(numeric)}: NaN and Infinity are captured as null (wal2json 2.5)"
                    )
                if table.loses_updates:
                    self.status.warnings.append(
                        f"{table.qualified} has no primary key or replica identity: its UPDATEs and DELETEs are not captured"
                    )

    def _sql(self) -> psycopg.Connection[Any]:
        try:
            return psycopg.connect(self.spec.dsn, autocommit=True, connect_timeout=10, **connect_options())
        except psycopg.OperationalError as exc:
            raise translate_connect_error(exc, f"source {self.spec.name!r}") from None

    def _slot_state(self) -> str | None:
        """None = missing, 'lost' = invalidated, else the slot's wal_status."""
        with self._sql() as conn:
            self._db = str(conn.info.dbname)
            row = conn.execute(
                "SELECT plugin, wal_status, database FROM pg_replication_slots WHERE slot_name = %s",
                (self.spec.slot,),
            ).fetchone()
        if row is None:
            return None
        plugin, wal_status, database = row
        if plugin != "wal2json" or database != self._db:
            raise SourceMisconfigured(
                f"source {self.spec.name!r}: slot {self.spec.slot!r} exists but is not a wal2json slot of database {self._db!r}"
            )
        return "lost" if wal_status == "lost" else str(wal_status)

    def _snapshot_then_slot(self, slot_state: str | None, on_progress: Callable[[SourceStatus], None] | None) -> Lsn:
        """(Re)create the slot; if asked, copy every table inside its exported snapshot.

        The snapshot's records are appended but not committed here: the daemon commits them in
        one go with the slot's consistent point, so a crash mid-snapshot leaves nothing visible
        and the next start snapshots again from scratch.
        """
        with ReplicationConnection(self.spec.dsn, label=self.spec.name) as repl:
            if slot_state is not None:
                repl.drop_slot(self.spec.slot)
            take = self.spec.snapshot != "never"
            info = repl.create_slot(self.spec.slot, export_snapshot=take)
            if take:
                assert info.snapshot_name is not None
                self.status.state = SourceState.SNAPSHOTTING
                with SnapshotReader(self.spec.dsn, info.snapshot_name, label=self.spec.name) as reader:
                    # The exported snapshot lives until `repl` runs its next command; imported now.
                    with self._sql() as conn:
                        tables = list_tables(conn, self.filter.matches)
                    self._copy_tables(reader, tables, info.consistent_point, on_progress)
        self.boundary = info.consistent_point
        self.status.last_lsn = str(info.consistent_point)
        return info.consistent_point

    def _copy_tables(
        self,
        reader: SnapshotReader,
        tables: list[TableInfo],
        lsn: Lsn,
        on_progress: Callable[[SourceStatus], None] | None,
    ) -> None:
        self.status.snapshot_rows_total = sum(max(t.estimated_rows, 0) for t in tables)
        now_ms = int(self.clock() * 1000)
        # One unit (a chunk, a batch's last row, a row) of lookahead: the very last row of the
        # snapshot is marked "last"; `previous(marker)` stages the held unit.
        previous: Callable[[str], None] | None = None

        def advance(rows: int) -> None:
            done = self.status.snapshot_rows_done
            self.status.snapshot_rows_done = done + rows
            if on_progress is not None and (done + rows) // 10_000 != done // 10_000:
                on_progress(self.status)

        for table in tables:
            self.status.snapshot_table = table.qualified
            columns = [(c.name, c.type, c.typeoid) for c in table.columns]
            self._observe_schema(
                table.schema, table.table, columns, complete=True, key=table.identity_columns, now_ms=now_ms
            )
            encoder = env.SnapshotEncoder(
                schema=table.schema,
                table=table.table,
                columns=columns,
                primary_key=table.identity_columns,
                source_name=self.spec.name,
                db=self._db,
                lsn=lsn,
                now_ms=now_ms,
            )
            # Columnar where every column has an exact vector spelling (capture/snapshot_columns.py);
            # else PostgreSQL builds the JSON where it can spell it as we would (snapshot.py);
            # else the per-value Python path. All three give the same bytes (tests).
            plan = self._columnar_plan(table)
            if plan is not None:
                for chunk in reader.text_chunks(table):
                    if previous is not None:
                        previous("true")
                    previous = functools.partial(self._snapshot_chunk, encoder, plan, chunk, now_ms)
                    advance(chunk.count(b"\n") - 1)
                continue
            fast = None if self.spec.router is not None else reader.json_rows(table, table.identity_columns)
            if fast is not None:
                for batch in fast:
                    if previous is not None:
                        previous("true")
                    self._snapshot_json(encoder, batch[:-1], now_ms)
                    previous = functools.partial(self._snapshot_json, encoder, batch[-1:], now_ms)
                    advance(len(batch))
                continue
            for row in reader.rows(table, ordered=self.spec.router is not None):
                if previous is not None:
                    previous("true")
                previous = functools.partial(self._snapshot_row, encoder, row, now_ms)
                advance(1)
        if previous is not None:
            previous("last")
        self._flush()
        self.status.snapshot_table = None
        self.status.snapshot_rows_total = self.status.snapshot_rows_done
        if on_progress is not None:
            on_progress(self.status)

    def _columnar_plan(self, table: TableInfo) -> Any:
        """The table's columnar plan, or None (outbox routing, a type without a vector spelling).
        pyarrow is imported here, not at start-up: only a snapshot pays for it."""
        if self.spec.router is not None or not self.spec.columnar_snapshot:
            return None
        from tributary.capture import snapshot_columns

        return snapshot_columns.plan([(c.name, c.type) for c in table.columns], table.identity_columns)

    def _snapshot_chunk(
        self, encoder: env.SnapshotEncoder, plan: Any, chunk: bytes, now_ms: int, marker: str = "true"
    ) -> None:
        """Append a chunk of COPY text as records, column-wise, straight into the log's partitions
        (lines encoded by codec_arrow; staged records go first, to keep the order)."""
        from tributary.capture import snapshot_columns
        from tributary.capture.log import encode_columns

        topic = encoder.topic
        count = self._partitions.get(topic) or self._ensure_topic(topic)
        self._flush()
        recs = snapshot_columns.encode_chunk(plan, chunk, count)
        tail = b"}" + encoder.tail("true")
        for partition in range(count):
            rows = snapshot_columns.rows_of(recs.partitions, partition)
            if not len(rows):
                continue
            value_args = snapshot_columns.value_args(plan, recs, rows)
            if marker != "true" and rows[-1] == recs.rows - 1:
                value_args.append(snapshot_columns.last_tail(len(rows), tail, b"}" + encoder.tail(marker)))
            else:
                value_args.append(snapshot_columns.scalar(tail))
            keys = recs.keys.take(rows)
            self.log.append_encoded(
                topic,
                partition,
                functools.partial(encode_columns, timestamp_ms=now_ms, keys=keys, value_args=value_args),
                now_ms,
            )

    def _snapshot_json(
        self, encoder: env.SnapshotEncoder, rows: list[tuple[bytes, bytes]], now_ms: int, marker: str = "true"
    ) -> None:
        """Stage (key, after) rows from `json_rows`: the hot loop of a snapshot, what
        `_stage(encoder.encode_json(...))` does minus the Output objects and the generic loop (a
        snapshot record has no headers; its timestamp is the read time), lookups hoisted."""
        topic = encoder.topic
        count = self._partitions.get(topic) or self._ensure_topic(topic)
        pending = self._pending
        value = encoder.value_json
        for key, after in rows:
            pending[(topic, partition_for(key, count))].append((key, value(after, marker), now_ms, None))
        self._pending_count += len(rows)
        if self._pending_count >= _FLUSH_RECORDS:
            self._flush()

    def _snapshot_row(self, encoder: env.SnapshotEncoder, row: Any, now_ms: int, marker: str = "true") -> None:
        """`row`: text values from `SnapshotReader.rows`."""
        if self.spec.router is not None:
            self._stage(self.spec.router(encoder.row(row)), now_ms)
        else:
            self._stage((encoder.encode(row, marker),), now_ms)

    # -- streaming -------------------------------------------------------------------
    def handle(self, message: XLogData | Keepalive) -> bool:
        """Apply one replication message; True when it closed a transaction (a commit point)."""
        if isinstance(message, Keepalive):
            if not self.in_transaction and message.wal_end > self.idle_lsn:
                self.idle_lsn = message.wal_end
            return False
        payload = message.payload
        if self._hold_inserts and payload[11:12] == b"I":
            # Held back; every other message first encodes what is held, so the order stays.
            self._run.append(payload)
            if len(self._run) >= _RUN_CHANGES:
                self._drain_run()
            return False
        if self._run:
            self._drain_run()
        return self._apply(payload)

    def held_run(self) -> tuple[list[bytes], int] | None:
        """Where the connection may put INSERT documents straight away (`ReplicationConnection.read`
        in compiled code) and how many, as `handle` would hold them: the run (encoded first when
        full) and its room; None while INSERTs are not held back."""
        if not self._hold_inserts:
            return None
        if len(self._run) >= _RUN_CHANGES:
            self._drain_run()
        return self._run, _RUN_CHANGES - len(self._run)

    def _apply(self, payload: bytes) -> bool:
        """One wal2json document through the generic path (parse, envelopes, stage)."""
        parsed = wal2json.parse_message(payload)
        if isinstance(parsed, wal2json.Begin):
            self.in_transaction = True
            # A transaction that ends at or before the durable position is already in the log.
            self._skip_tx = parsed.nextlsn <= self.durable
            self._hold_inserts = not self._skip_tx and self.spec.insert_templates and self.spec.router is None
            self._tx = {"xid": parsed.xid, "ts_ms": parsed.timestamp_ms, "lsn": parsed.lsn, "changes": 0}
            self._tx_part = None
            self._ctx = {
                "source_name": self.spec.name,
                "db": self._db,
                "lsn": parsed.lsn,
                "tx_id": parsed.xid,
                "commit_ts_ms": parsed.timestamp_ms,
                "now_ms": 0,
            }
            return False
        if isinstance(parsed, wal2json.Commit):
            self.in_transaction = False
            self._hold_inserts = False
            end = parsed.nextlsn
            if self._skip_tx:
                self._skip_tx = False
                return False
            if self._tx.get("changes", 0) == 0:
                # Nothing of ours in it (another table, a DDL): advance without forcing a commit.
                if self.boundary is None:
                    self.idle_lsn = max(self.idle_lsn, end)
                else:
                    self.boundary = end
                return False
            self._flush()
            self.last_tx_changes = self._tx.get("changes", 0)
            self.boundary = end
            self.status.last_lsn = str(end)
            self.status.transactions += 1
            return True
        if self._skip_tx:
            return False
        now_ms = int(self.clock() * 1000)
        if isinstance(parsed, wal2json.Change):
            if not self.filter.matches(parsed.schema, parsed.table):
                return False
            if self.spec.router is not None:
                if parsed.action != "I":
                    return False  # events are immutable: only inserts carry news
                outputs = self.spec.router(env.stream_row(parsed.raw_columns))
            else:
                if parsed.action != "D":
                    self._observe_schema(
                        parsed.schema,
                        parsed.table,
                        parsed.column_types(),
                        complete=parsed.action == "I",
                        key=parsed.pk,
                        now_ms=now_ms,
                    )
                outputs = self._envelopes(parsed, now_ms)
                if parsed.action == "I" and self.spec.insert_templates and self.in_transaction:
                    self._learn_template(parsed, payload, outputs, now_ms)
            self._stage(outputs, now_ms)
            self._tx["changes"] = self._tx.get("changes", 0) + 1
            self.status.changes += 1
        elif isinstance(parsed, wal2json.Truncate):
            if self.filter.matches(parsed.schema, parsed.table):
                for out in env.truncate_envelope(parsed, **self._context()):
                    self._to_all_partitions(out.topic, out.key, out.value, now_ms)
                self._tx["changes"] = self._tx.get("changes", 0) + 1
        elif isinstance(parsed, wal2json.LogicalMessage):
            self._stage(env.message_envelope(parsed, **self._context()), now_ms)
            if not self.in_transaction and parsed.lsn is not None:
                # A non-transactional message stands alone: it is its own commit point.
                self._flush()
                self.last_tx_changes = 1
                self.boundary = max(parsed.lsn, self.boundary or Lsn.ZERO)
                return True
            self._tx["changes"] = self._tx.get("changes", 0) + 1
        return False

    def _drain_run(self) -> None:
        """Encode the held INSERTs: each run of one table's, column-wise by its template; what a
        template is not sure of, one by one (template, else the generic path), in order."""
        run, self._run = self._run, []
        at = 0
        for tag, same in groupby(table_tags(run, self._last_tag)):
            n = len(list(same))
            payloads = run[at : at + n]
            at += n
            template = self._templates.get(tag)
            self._last_tag = tag
            if template is not None and template.announced == self.schemas.version:
                tx_part = self._tx_part
                if tx_part is None:
                    tx_part = self._tx_part = template.tx_part(self._ctx["tx_id"], self._ctx["commit_ts_ms"])
                now_ms = int(self.clock() * 1000)
                records = template.encode_many(payloads, tx_part, now_ms)
                if records is not None:
                    self._stage_run(template.topic, *records, self._tx["ts_ms"] or now_ms)
                    self.templated += n
                    continue
            for payload in payloads:
                if not self._insert_fast(payload):
                    self._apply(payload)

    def _stage_run(self, topic: str, keys: list[bytes], values: list[bytes], timestamp_ms: int) -> None:
        """A run of one topic's records (no headers, one timestamp) straight into the log's
        partitions as encoded lines (`codec.encode_plain`), each after what is staged for the same
        partition (so every partition keeps the stream's order)."""
        count = self._partitions.get(topic) or self._ensure_topic(topic)
        pending = self._pending
        runs = split_partitions(keys, values, count) if count > 1 else [(keys, values)]
        for partition, (ks, vs) in enumerate(runs):
            if not ks:
                continue
            staged = pending.pop((topic, partition), None)
            if staged:
                self.log.append(topic, partition, staged)
                self._pending_count -= len(staged)
            encode = functools.partial(encode_plain, timestamp_ms=timestamp_ms, keys=ks, values=vs)
            self.log.append_encoded(topic, partition, encode, timestamp_ms)
        n = len(keys)
        self._tx["changes"] += n
        self.status.changes += n

    def _insert_fast(self, payload: bytes) -> bool:
        """An INSERT of a table with a template: key and value spliced from the document's bytes,
        staged as `_stage` would (same partition, the transaction's time). False: not handled."""
        parts = payload.split(SPLIT)
        template = self._templates.get(table_tag(parts[0]))
        if template is None or template.announced != self.schemas.version:
            return False
        tx_part = self._tx_part
        if tx_part is None:
            tx_part = self._tx_part = template.tx_part(self._ctx["tx_id"], self._ctx["commit_ts_ms"])
        now_ms = int(self.clock() * 1000)
        record = template.encode(payload, parts, tx_part, now_ms)
        if record is None:
            return False
        key, value = record
        topic = template.topic
        count = self._partitions.get(topic) or self._ensure_topic(topic)
        self._pending[(topic, partition_for(key, count))].append((key, value, self._tx["ts_ms"] or now_ms, None))
        self._tx["changes"] += 1
        self.status.changes += 1
        self.templated += 1
        self._pending_count += 1
        if self._pending_count >= _FLUSH_RECORDS:
            self._flush()
        return True

    def _learn_template(self, change: wal2json.Change, payload: bytes, outputs: list[env.Output], now_ms: int) -> None:
        """After the generic path handled an INSERT: make (or remake) its table's template, and
        keep it only if it gives this very change the same bytes."""
        parts = payload.split(SPLIT)
        tag = table_tag(parts[0])
        if tag in self._templates:
            old = self._templates[tag]
            if old is None or old.announced == self.schemas.version:
                return  # refused before, or current (it declined one value: the next change may suit it)
        template = InsertTemplate.build(
            change,
            payload,
            source_name=self.spec.name,
            db=self._db,
            key_columns=self._identity.get((change.schema, change.table), ()),
            announced=self.schemas.version,
        )
        if template is None or len(outputs) != 1:
            self._templates[tag] = None
            return
        got = template.encode(payload, parts, template.tx_part(self._ctx["tx_id"], self._ctx["commit_ts_ms"]), now_ms)
        if got is None:
            return  # a value it is not sure of: try again with the next change
        if got != (outputs[0].key, outputs[0].value) or template.topic != outputs[0].topic:
            log.warning(
                "source %s: INSERT template for %s.%s disagrees; not used", self.spec.name, change.schema, change.table
            )
            self._templates[tag] = None
            return
        if len(self._templates) >= 4096:
            self._templates.clear()
        self._templates[tag] = template

    def _context(self) -> dict[str, Any]:
        """The envelope's transaction context: built once per transaction, `now_ms` refreshed."""
        ctx = self._ctx
        ctx["now_ms"] = int(self.clock() * 1000)
        return ctx

    def _envelopes(self, change: Any, now_ms: int) -> list[env.Output]:
        ctx = self._ctx
        ctx["now_ms"] = now_ms  # the clock read once per change, not once per use
        return env.envelopes_for(
            change,
            known_columns=self.schemas.columns(change.schema, change.table) if change.action == "U" else None,
            key_columns=self._identity.get((change.schema, change.table)),
            **ctx,
        )

    def _observe_schema(
        self, schema: str, table: str, columns: Iterable[Any], *, complete: bool, key: Iterable[str], now_ms: int
    ) -> None:
        if self.spec.router is not None:
            return
        record = self.schemas.observe(
            self.spec.name, schema, table, list(columns), complete=complete, key=tuple(key), now_ms=now_ms
        )
        if record is not None:
            self._to_all_partitions(record.topic, record.key, record.value, now_ms)

    def _to_all_partitions(self, topic: str, key: bytes | None, value: bytes | None, now_ms: int) -> None:
        for partition in range(self._ensure_topic(topic)):
            self._pending[(topic, partition)].append((key, value, now_ms, None))
            self._pending_count += 1

    # -- staging into the log -------------------------------------------------------------
    def _ensure_topic(self, topic: str) -> int:
        """Create the topic on first use; returns its partition count."""
        count = self._partitions.get(topic)
        if count is not None:
            return count
        if topic not in self.log.topics():
            policy: Literal["delete", "compact", "none"] = "delete" if topic.endswith(".messages") else "compact"
            if topic.startswith("events."):
                policy = "none"
            self.log.create_topic(topic, TopicConfig(partitions=self.spec.partitions, policy=policy))
        count = self._partitions[topic] = self.log.topics()[topic].partitions
        return count

    def _stage(self, outputs: Iterable[env.Output], now_ms: int) -> None:
        # A streamed record's timestamp is its transaction's commit time (event time); a
        # snapshot row's is the time it was read.
        now_ms = self._tx.get("ts_ms") or now_ms if self.in_transaction else now_ms
        pending = self._pending
        counts = self._partitions
        staged = 0
        for out in outputs:
            topic = out.topic
            count = counts.get(topic) or self._ensure_topic(topic)
            partition = partition_for(out.key, count)
            ts = now_ms if out.timestamp_ms is None else out.timestamp_ms
            pending[(topic, partition)].append((out.key, out.value, ts, out.headers))
            staged += 1
        self._pending_count += staged
        if self._pending_count >= _FLUSH_RECORDS:
            self._flush()

    def _flush(self) -> None:
        """Write staged records to the log's files (not yet committed: the daemon decides)."""
        for (topic, partition), records in self._pending.items():
            if records:
                self.log.append(topic, partition, records)
        self._pending.clear()
        self._pending_count = 0

    @property
    def seen(self) -> int:
        """Changes taken in so far, appended or held back for their template (activity, for idling)."""
        return self.status.changes + len(self._run)

    # -- after a durable commit ---------------------------------------------------------------
    @property
    def has_boundary(self) -> bool:
        return self.boundary is not None

    def committed(self) -> None:
        """The daemon made everything up to `boundary` durable."""
        if self.boundary is not None:
            self.durable = self.boundary
            self.idle_lsn = max(self.idle_lsn, self.boundary)
            self.boundary = None

    def confirmable(self) -> Lsn:
        """The LSN the slot may be advanced to: durable, or further while nothing of ours is pending."""
        if self.in_transaction or self.boundary is not None:
            return self.durable
        return max(self.durable, self.idle_lsn)

    def confirm(self, *, now_us: int, reply: bool = False) -> None:
        if self.conn is None:
            return
        lsn = self.confirmable()
        self.conn.send_status(lsn, now_us=now_us, reply=reply)
        self.status.confirmed_lsn = str(lsn)

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None
