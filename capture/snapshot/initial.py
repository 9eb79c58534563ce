"""`SnapshotSource`: the initial snapshot as records, every included table written as `op: "r"` in one pass.

Each table takes the first of three paths that can spell all its columns exactly; all three write
the same bytes (key, value, headers, partition, offsets: tests/integration/capture/
test_snapshot_columnar.py and test_snapshot_json.py). None exists for history only:

* **columnar** (capture/snapshot/columnar.py): COPY text in chunks, every column's JSON made by
  vector kernels, lines encoded per partition. The fast path, for tables of plain columns.
* **JSON from PostgreSQL** (`SnapshotReader.json_rows`): `row_to_json` over per-type SQL
  conversions. For json/jsonb columns, which must be embedded verbatim (their own whitespace)
  and have no vector spelling; the server builds the JSON, so such tables go faster than per row.
* **per row** (`SnapshotEncoder.encode` over `SnapshotReader.rows`): what neither can do — an
  outbox table (its router needs each row as values, in key order), floats and arrays (their
  text needs Python's conversion), a table without a key.

**A re-snapshot** (a lost or dropped slot under `snapshot = "when_needed"`) finds topics that
already hold rows; rows deleted while the slot was gone would stay in them forever. So each table
whose topic holds live keys (latest record not a tombstone) ends with a delete + tombstone for
every one of them that the snapshot did not read: the compacted topic equals the table again.
Those keys are held in a set while the table is read (one table at a time; the log's `live_keys`).

The records are appended, not committed: the daemon commits them in one go with the slot's
consistent point (capture/streaming/positions.py, step 2), so a crash mid-snapshot leaves nothing visible
and the next start snapshots again from scratch. A re-snapshot first makes that true of itself
too: before the old slot is replaced it commits the source's position as `0/0`, which a start
reads as "no position" (capture/source.py); otherwise a crash after the new slot was created
would resume streaming from it at the old position, skipping both the snapshot and the changes
made while the slot was gone.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tributary.capture.database.catalog import TableInfo
from tributary.capture.database.slot import Slot, SlotState, sql_connection
from tributary.capture.database.source_tables import SourceTables
from tributary.capture.decoding.lsn import Lsn
from tributary.capture.records import debezium
from tributary.capture.records import envelope as env
from tributary.capture.records.routing import table_keys, without_field
from tributary.capture.records.rules import TableRules
from tributary.capture.records.staging import Staging
from tributary.capture.snapshot.reader import SnapshotReader
from tributary.capture.spec import SourceSpec
from tributary.capture.status import SourceState, SourceStatus
from tributary.log import Mark

if TYPE_CHECKING:  # pyarrow is imported when a snapshot runs, not at start-up
    from tributary.capture.snapshot.columnar import ChunkRecords, ColumnPlan

__all__ = ["PROGRESS_ROWS", "SnapshotSource"]

PROGRESS_ROWS = 10_000  # `on_progress` is called each time this many more rows are copied
DELETE_BATCH = 2_000  # a re-snapshot's deletes are staged this many keys at a time

Progress = Callable[[SourceStatus], None]
Notify = Callable[[str, dict[str, str]], None]
"""(notification type, its additional data): capture/records/notifications.py, bound to a source."""

RESNAPSHOT_POSITION = str(Lsn.ZERO)  # a re-snapshot under way: a start takes the snapshot again


class SnapshotSource:
    """Copies a source's tables into the log (appended, not committed)."""

    def __init__(
        self,
        spec: SourceSpec,
        staging: Staging,
        tables: SourceTables,
        status: SourceStatus,
        *,
        db: str,
        clock: Callable[[], float] = time.time,
        columnar: bool = True,
    ) -> None:
        """`columnar=False` leaves the columnar path out (tests hold the paths equal)."""
        self.spec = spec
        self.staging = staging
        self.tables = tables
        self.status = status
        self.db = db
        self.clock = clock
        self.columnar = columnar
        self.notify: Notify | None = None  # each table scanned (TABLE_SCAN_COMPLETED)

    def take(self, slot: Slot, state: SlotState, on_progress: Progress | None = None) -> Lsn:
        """(Re)create the slot with an exported snapshot and copy every included table inside it;
        returns the slot's consistent point, where the stream takes over."""
        log = self.staging.log
        if self.spec.name in log.positions():
            # A re-snapshot: from now until the daemon commits it, a start must snapshot again.
            # Only the position: other sources' appends (an empty `Mark`) are the daemon's to
            # commit, with their own positions.
            log.commit(positions={self.spec.name: RESNAPSHOT_POSITION}, upto=Mark())
        with slot.recreate(state, export_snapshot=True) as info:
            assert info.snapshot_name is not None
            self.status.state = SourceState.SNAPSHOTTING
            with SnapshotReader(self.spec.dsn, info.snapshot_name, label=self.spec.name) as reader:
                with sql_connection(self.spec.dsn, label=self.spec.name) as conn:
                    included = self.tables.included(conn)
                if self.reference_only:  # Debezium's order: its first and last marks fall on the same rows
                    included.sort(key=lambda t: self.tables.filter.snapshot_rank(t.schema, t.table))
                self.copy(reader, included, info.consistent_point, on_progress)
        return info.consistent_point

    def copy(
        self, reader: SnapshotReader, tables: list[TableInfo], lsn: Lsn, on_progress: Progress | None = None
    ) -> None:
        """Every row of `tables`, the very last one marked `source.snapshot = "last"`."""
        status = self.status
        status.snapshot_rows_total = sum(max(t.estimated_rows, 0) for t in tables)
        now_ms = int(self.clock() * 1000)
        # One unit (a chunk, a batch, a row) of lookahead: a unit is staged once the next one (or
        # the end) says where it stood — its last row takes the marker of that place (`_Held`).
        held: _Held | None = None
        marker = debezium.snapshot_marker if self.reference_only else _marker
        first = True

        def stage(unit: _Held, *, last: bool) -> None:
            nonlocal first
            unit.stage(marker(first=first, last=last, first_in_table=unit.first, last_in_table=unit.last or last))
            first = False

        def advance(rows: int) -> None:
            done = status.snapshot_rows_done
            status.snapshot_rows_done = done + rows
            if on_progress is not None and (done + rows) // PROGRESS_ROWS != done // PROGRESS_ROWS:
                on_progress(status)

        for table in tables:
            status.snapshot_table = table.qualified
            rows_before = status.snapshot_rows_done
            columns = [(c.name, c.type, c.typeoid) for c in table.columns]
            self.tables.observe(
                table.schema, table.table, columns, complete=True, key=table.identity_columns, now_ms=now_ms
            )
            encoder = env.SnapshotEncoder(
                schema=table.schema,
                table=table.table,
                columns=columns,
                primary_key=table.identity_columns,
                source_name=self.spec.name,
                db=self.db,
                lsn=lsn,
                now_ms=now_ms,
                rules=self.table_rules(table),
                routing=self.spec.routing,
            )
            # A topic that holds keys already (a re-snapshot): those the table no longer has go.
            live = self.staging.live_keys(encoder.topic) if self.spec.router is None else set()
            gone = table_keys(live, encoder.key_field) if encoder.key_field is not None else live
            starts = True
            for unit, rows in self._units(reader, table, encoder, now_ms, gone or None):
                if held is not None:
                    stage(held, last=False)
                held, starts = _Held(unit, first=starts), False
                advance(rows)
            if gone:
                if held is not None:
                    stage(held, last=False)
                held = _Held(functools.partial(self.stage_deletes, encoder, sorted(gone), now_ms), first=starts)
                gone.clear()  # the sorted list is the one copy held
            if held is not None:
                held.last = True  # its table's last unit (the snapshot's too, if no later table has rows)
            if self.notify is not None:
                scanned = str(status.snapshot_rows_done - rows_before)
                self.notify(
                    "TABLE_SCAN_COMPLETED",
                    {"data_collection": table.qualified, "total_rows_scanned": scanned, "status": "SUCCEEDED"},
                )
        if held is not None:
            stage(held, last=True)
        self.staging.flush()
        status.snapshot_table = None
        status.snapshot_rows_total = status.snapshot_rows_done
        if on_progress is not None:
            on_progress(status)

    def _units(
        self,
        reader: SnapshotReader,
        table: TableInfo,
        encoder: env.SnapshotEncoder,
        now_ms: int,
        gone: set[bytes] | None = None,
    ) -> Iterator[tuple[Callable[[str], None], int]]:
        """The table's rows as units (stage, rows), by the first path that spells every column.
        `gone`: keys the topic holds; each key read is taken out of it as its unit is made."""
        plan = self.columnar_plan(table)
        if plan is not None:
            for chunk in reader.text_chunks(table):
                recs = None
                if gone:
                    from tributary.capture.snapshot import columnar

                    recs = columnar.encode_chunk(plan, chunk, self.staging.partitions(encoder.topic))
                    gone.difference_update(recs.keys.to_pylist())
                yield (
                    functools.partial(self.stage_chunk, encoder, plan, chunk, now_ms, recs=recs),
                    chunk.count(b"\n") - 1,
                )
            return
        batches = (
            None
            if self.spec.router is not None or self.per_row(table)
            else reader.json_rows(table, table.identity_columns)
        )
        if batches is not None:
            for batch in batches:
                if gone:
                    gone.difference_update(key for key, _ in batch)
                yield functools.partial(self.stage_json_rows, encoder, batch, now_ms), len(batch)
            return
        for row in reader.rows(table, ordered=self.spec.router is not None):
            out = None
            if gone or encoder.rules is not None:
                out = encoder.encode_ruled(row)
                if out is None:
                    continue  # outside the table's row filter
                if gone:
                    gone.discard(out.key)
            yield functools.partial(self.stage_row, encoder, row, now_ms, out=out), 1

    @property
    def reference_only(self) -> bool:
        """Rows only by the per-row reference path: records rewritten on their way into the log
        (`envelope = "debezium"`) cannot come as encoded lines, and take the reference's values."""
        return self.spec.envelope == "debezium"

    def table_rules(self, table: TableInfo) -> TableRules | None:
        """The table's column and row rules (capture/records/rules.py), None when it has none."""
        rules = self.spec.rules
        return None if rules is None else rules.for_table(table.schema, table.table, table.identity_columns)

    def per_row(self, table: TableInfo) -> bool:
        """Rows of this table only by the per-row reference path: `reference_only`; a table with
        rules (the one path that applies them: `SnapshotEncoder.encode_ruled`); or a routed
        table's, whose key carries the key field the fast paths do not make."""
        return self.reference_only or self.table_rules(table) is not None or self.spec.routed(table.schema, table.table)

    def columnar_plan(self, table: TableInfo) -> ColumnPlan | None:
        """The table's columnar plan, or None: another path (see the module's docstring).
        pyarrow is imported here, not at start-up: only a snapshot pays for it."""
        if self.spec.router is not None or not self.columnar or self.per_row(table):
            return None
        from tributary.capture.snapshot import columnar

        return columnar.plan([(c.name, c.type) for c in table.columns], table.identity_columns)

    def stage_chunk(
        self,
        encoder: env.SnapshotEncoder,
        plan: ColumnPlan,
        chunk: bytes,
        now_ms: int,
        marker: str,
        *,
        recs: ChunkRecords | None = None,
        last_row: int | None = None,
    ) -> None:
        """A chunk of COPY text as records, column-wise, straight into the log's partitions (lines
        encoded by codec_arrow), after everything staged so far, to keep the order. `recs`: the
        chunk already encoded (a re-snapshot needs its keys before it is staged), rows of partition
        -1 left out (capture/snapshot/chunked.py); `last_row`: the index of the row that takes `marker`."""
        from tributary.capture.snapshot import columnar
        from tributary.log.local import encode_columns

        topic = encoder.topic
        count = self.staging.partitions(topic)
        self.staging.flush()
        if recs is None:
            recs = columnar.encode_chunk(plan, chunk, count)
        tail = b"}" + encoder.tail("true")
        if last_row is None:
            last_row = recs.rows - 1
        for partition in range(count):
            rows = columnar.rows_of(recs.partitions, partition)
            if not len(rows):
                continue
            value_args = columnar.value_args(plan, recs, rows)
            if marker != "true" and rows[-1] == last_row:
                value_args.append(columnar.last_tail(len(rows), tail, b"}" + encoder.tail(marker)))
            else:
                value_args.append(columnar.scalar(tail))
            keys = recs.keys.take(rows)
            self.staging.append_encoded(
                topic,
                partition,
                functools.partial(encode_columns, timestamp_ms=now_ms, keys=keys, value_args=value_args),
                now_ms,
            )

    def stage_json_rows(
        self, encoder: env.SnapshotEncoder, rows: list[tuple[bytes, bytes]], now_ms: int, marker: str
    ) -> None:
        """A batch of (key, after) rows from `json_rows`: `encoder.encode_json` minus the Output objects."""
        value = encoder.value_json
        pairs = [(key, value(after)) for key, after in rows[:-1]]
        key, after = rows[-1]
        pairs.append((key, value(after, marker)))
        self.staging.stage_pairs(encoder.topic, pairs, now_ms)

    def stage_row(
        self,
        encoder: env.SnapshotEncoder,
        row: tuple[str | None, ...],
        now_ms: int,
        marker: str,
        *,
        out: env.Output | None = None,
    ) -> None:
        """`row`: text values from `SnapshotReader.rows`; a snapshot record's time is its read time.
        `out`: the row's record already encoded with marker "true" (a re-snapshot needs its key)."""
        if self.spec.router is not None:
            self.staging.stage(self.spec.router(encoder.row(row)), now_ms)
        else:
            self.staging.stage((out if out is not None and marker == "true" else encoder.encode(row, marker),), now_ms)

    def stage_deletes(self, encoder: env.SnapshotEncoder, keys: list[bytes], now_ms: int, marker: str) -> None:
        """A delete + tombstone per key the topic holds and the table no longer has, shaped as a
        streamed delete's (`before`: the key's columns) with the snapshot's `source` block (the
        last delete carries `marker`). `before` is the key, which already is the key's JSON."""
        tails = {m: _delete_tail(encoder.tail(m)) for m in ("true", marker)}
        topic = encoder.topic
        last = len(keys) - 1
        outputs: list[env.Output] = []
        field = encoder.key_field  # a routed table's key: `before` is its columns only
        for i, key in enumerate(keys):
            before = key if field is None else without_field(key, field[0])
            value = b'{"before":' + before + b',"after":null' + tails[marker if i == last else "true"]
            outputs += (env.Output(topic, key, value), env.Output(topic, key, None))
            if len(outputs) >= 2 * DELETE_BATCH:
                self.staging.stage(outputs, now_ms)
                outputs = []
        self.staging.stage(outputs, now_ms)


@dataclass(slots=True)
class _Held:
    """A unit of snapshot rows waiting for the next one: where it stands in its table."""

    stage: Callable[[str], None]
    first: bool  # its table's first unit
    last: bool = False  # its table's last unit


def _marker(*, first: bool, last: bool, first_in_table: bool, last_in_table: bool) -> str:
    """`source.snapshot` of a unit's last row: "last" for the snapshot's very last, else "true"."""
    return "last" if last else "true"


def _delete_tail(read_tail: bytes) -> bytes:
    """A snapshot read's `,"source":…,"op":"r","ts_ms":…}` as a delete's. The `"op":"r"` is the
    last one: inside the `source` strings a `"` is always escaped."""
    head, sep, rest = read_tail.rpartition(b',"op":"r",')
    assert sep, read_tail
    return head + b',"op":"d",' + rest
