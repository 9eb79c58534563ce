"""The stream: wal2json messages from the slot → records staged for the log, transaction by transaction.

An INSERT takes one of two paths, which write the same bytes (topic, partition, offset, timestamp,
key, value, headers: tests/integration/capture/test_insert_templates.py):

* **template** (capture/streaming/insert_template.py, learnt by capture/streaming/template_cache.py): inside a
  transaction being appended, INSERTs are held back (at most `RUN_CHANGES`, and only until any
  other message) and encoded a run of one table at a time, straight into the log's partitions;
* **generic** (`wal2json.parse_message` → `envelope.envelopes_for`): everything else — updates,
  deletes, truncates, messages, an outbox's rows (the event store's, a service's outbox
  table's: capture/records/service_outbox.py), a table's first INSERT (which teaches its
  template), a value a template is not sure of.

Signals (capture/snapshot/signals.py) are recognised here, where they were committed: a logical message
with prefix `tributary.signal` and an INSERT into the source's signal table become a call of
`on_signal` (the session's `request_snapshot`); neither is written to the log. A malformed signal
is a warning, never a stop.

The source never commits or confirms: it reports each commit point (`handle` returns True) and
keeps the positions in an `OffsetContext` (capture/streaming/positions.py), which the daemon's commit reads.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from itertools import groupby
from typing import Any, TypedDict

from tributary.capture.database.catalog import CatalogConnection, ColumnHistory
from tributary.capture.database.replication import Keepalive, XLogData
from tributary.capture.database.source_tables import SourceTables
from tributary.capture.decoding import wal2json
from tributary.capture.decoding.lsn import Lsn
from tributary.capture.errors import SourceMisconfigured
from tributary.capture.records import envelope as env
from tributary.capture.records.outbox import STREAM_DELETED_PREFIX, route_stream_deleted
from tributary.capture.records.rules import TableRules
from tributary.capture.records.service_outbox import OutboxRowError, OutboxTable
from tributary.capture.records.staging import Staging
from tributary.capture.records.transactions import TransactionMonitor
from tributary.capture.snapshot import signals
from tributary.capture.snapshot.chunked import WATERMARK_PREFIX
from tributary.capture.spec import SourceSpec
from tributary.capture.status import SourceStatus
from tributary.capture.streaming.ddl_watch import DDL_PREFIX
from tributary.capture.streaming.insert_template import SPLIT, table_tag, table_tags
from tributary.capture.streaming.positions import OffsetContext
from tributary.capture.streaming.template_cache import TemplateCache

__all__ = ["RUN_CHANGES", "StreamingSource"]

RUN_CHANGES = 200  # INSERTs held back to be encoded column-wise in one go

log = logging.getLogger(__name__)


@dataclass(slots=True)
class _Transaction:
    """The transaction the stream is in (or last closed): what its records' envelopes name
    (`xid`, `lsn`, `ts_ms`), where it ends (`nextlsn`, a schema change notice's position) and how
    many of its changes count towards a commit point. Before the first BEGIN every field is empty."""

    xid: int | None = None
    ts_ms: int | None = None  # its commit time: the records' event time
    lsn: Lsn | None = None
    nextlsn: Lsn | None = None
    changes: int = 0
    tx_part: bytes | None = None  # its `source` fields as the INSERT templates splice them, made once


class _EnvelopeContext(TypedDict):
    """The transaction context every streamed envelope names (`envelope.envelopes_for` & co.)."""

    source_name: str
    db: str
    lsn: Lsn | None
    tx_id: int | None
    commit_ts_ms: int | None
    now_ms: int


class StreamingSource:
    """Applies one source's replication messages: stages records, advances its offsets."""

    def __init__(
        self,
        spec: SourceSpec,
        staging: Staging,
        tables: SourceTables,
        offsets: OffsetContext,
        status: SourceStatus,
        *,
        db: str,
        clock: Callable[[], float] = time.time,
        templates: bool = True,
        on_signal: Callable[[signals.SnapshotSignal], None] | None = None,
        encoding: str | None = None,
    ) -> None:
        """`templates=False` sends every change down the generic path (tests hold the two equal).
        `on_signal`: called with each valid signal where the stream reads it (it may raise
        ValueError to refuse one: logged as a warning). `encoding`: the Python codec wal2json
        writes in (the database's, capture/decoding/encodings.py); not UTF-8, each document is decoded
        from it first and every change takes the generic path."""
        self.spec = spec
        self.on_signal = on_signal
        self.signal_table = tuple(spec.signal_table.split(".", 1)) if spec.signal_table else None
        self.outboxes = {t.qualified: t for t in spec.outbox}  # (schema, table) → its event router
        self.staging = staging
        self.tables = tables
        self.offsets = offsets
        self.status = status
        self.db = db
        self.clock = clock
        if tables.catalog is None:  # catalog reads while streaming, opened on first use
            from tributary.capture.database.slot import sql_connection

            tables.catalog = CatalogConnection(lambda: sql_connection(spec.dsn, label=spec.name))
        self.history: ColumnHistory | None = None
        if spec.router is None and tables.schemas.existed is None:
            # Which columns an UPDATE omits because they did not exist at it (not unchanged TOAST).
            self.history = ColumnHistory(tables.catalog)
            tables.schemas.existed = self.history.existed
        # An outbox's rows are routed, not enveloped: no templates.
        self.templates = TemplateCache(spec.name, tables.schemas) if templates and spec.router is None else None
        # Transaction metadata: every change's value gets its `transaction` block (templated ones too).
        self.txmeta = TransactionMonitor(spec.name) if spec.transaction_metadata and spec.router is None else None
        self._collections: dict[str, str] = {}  # a template's topic → its table ("schema.table"), for the block
        self._codec = None if encoding in (None, "utf-8") else encoding
        if self._codec is not None:
            self.templates = None  # they splice the raw bytes: UTF-8 only
            self.handle = self._handle_transcoded  # type: ignore[method-assign]  # chosen once: no per-change branch
        self.templated = 0  # changes encoded by INSERT templates (the rest took the generic path)
        self.last_tx_changes = 0  # changes in the last transaction closed (the group commit counts them)
        self._hold_inserts = False  # inside a transaction being appended, with templates: INSERTs go to `_run`
        self._tx = _Transaction()
        self._run: list[bytes] = []  # INSERT documents not yet encoded (only ever inside a transaction)
        self._last_tag = b""  # the table tag of the last run: most runs are all that table's
        # A chunked snapshot (capture/snapshot/chunked.py): its watermarks, and each committed transaction.
        self.on_watermark: Callable[[str], bool] | None = None
        self.on_commit: Callable[[int], bool] | None = None  # True: a snapshot request was applied
        self.on_resnapshot: Callable[[list[str], str], None] | None = None  # tables, why
        # A schema change notice (capture/streaming/ddl_watch.py): (content, its transaction's end, now) → acted.
        self.on_ddl: Callable[[str, Any, int], bool] | None = None

    @property
    def seen(self) -> int:
        """Changes taken in so far, appended or held back for their template (activity, for idling)."""
        return self.status.changes + len(self._run)

    def handle(self, message: XLogData | Keepalive) -> bool:
        """Apply one replication message; True when it closed a transaction (a commit point)."""
        if isinstance(message, Keepalive):
            self.offsets.keepalive(message.wal_end)
            return False
        payload = message.payload
        if self._hold_inserts and payload[11:12] == b"I":
            # Held back; every other message first encodes what is held, so the order stays.
            self._run.append(payload)
            if len(self._run) >= RUN_CHANGES:
                self._drain_run()
            return False
        if self._run:
            self._drain_run()
        return self._apply(payload)

    def _handle_transcoded(self, message: XLogData | Keepalive) -> bool:
        """`handle` for a database whose encoding is not UTF-8: its documents re-encoded as UTF-8."""
        if isinstance(message, XLogData):
            assert self._codec is not None
            try:
                text = message.payload.decode(self._codec)
            except UnicodeDecodeError as exc:  # never written to the log as invalid text
                raise SourceMisconfigured(
                    f"source {self.spec.name!r}: a change at {Lsn(message.data_start)} is not valid "
                    f"{self._codec} text ({exc.reason})"
                ) from None
            message = XLogData(message.data_start, message.wal_end, text.encode())
        return StreamingSource.handle(self, message)

    def held_run(self) -> tuple[list[bytes], int] | None:
        """Where the connection may put INSERT documents straight away (`ReplicationConnection.read`
        in compiled code) and how many, as `handle` would hold them: the run (encoded first when
        full) and its room; None while INSERTs are not held back."""
        if not self._hold_inserts:
            return None
        if len(self._run) >= RUN_CHANGES:
            self._drain_run()
        return self._run, RUN_CHANGES - len(self._run)

    def _apply(self, payload: bytes) -> bool:
        """One wal2json document through the generic path (parse, envelopes, stage), by its kind;
        True when it was a commit point. While the offsets skip a transaction already in the log,
        only its BEGIN and COMMIT are read: they carry the offsets past it."""
        parsed = wal2json.parse_message(payload)
        if isinstance(parsed, wal2json.Begin):
            self._begin(parsed)
            return False
        if isinstance(parsed, wal2json.Commit):
            return self._commit(parsed)
        if self.offsets.skipping:
            return False
        now_ms = int(self.clock() * 1000)
        if isinstance(parsed, wal2json.Change):
            self._change(parsed, payload, now_ms)
        elif isinstance(parsed, wal2json.Truncate):
            self._truncate(parsed, now_ms)
        elif isinstance(parsed, wal2json.LogicalMessage):
            return self._message(parsed, now_ms)
        return False

    def _begin(self, begin: wal2json.Begin) -> None:
        """A transaction starts: fresh state for its records' envelopes, and its INSERTs held back
        for their templates only when it is appended (not one the offsets skip)."""
        appending = self.offsets.begin(begin.nextlsn)
        self._hold_inserts = appending and self.templates is not None
        self._tx = _Transaction(xid=begin.xid, ts_ms=begin.timestamp_ms, lsn=begin.lsn, nextlsn=begin.nextlsn)
        self.staging.xid = begin.xid
        if self.txmeta is not None:
            self.txmeta.begin(begin.xid, int(begin.lsn), begin.timestamp_ms)

    def _commit(self, commit: wal2json.Commit) -> bool:
        """A transaction ends: a commit point when changes of ours were in it (or a snapshot was
        requested in it, so that the request is stored with a position); its records are flushed
        to the staging before the daemon's commit reads the offsets."""
        self._hold_inserts = False
        self.staging.xid = None
        changes = self._tx.changes
        if self.on_commit is not None and self.on_commit(commit.xid) and not self.offsets.skipping:
            changes = max(changes, 1)  # a snapshot requested inside it: a commit point, with the request
        if not self.offsets.end(commit.nextlsn, changes=changes):
            return False  # skipped, or nothing of ours in it
        if self.txmeta is not None:
            self.staging.stage(self.txmeta.end(), self._tx.ts_ms or int(self.clock() * 1000))
        self.staging.flush()
        self.last_tx_changes = changes
        self.status.last_lsn = str(commit.nextlsn)
        self.status.transactions += 1
        return True

    def _change(self, change: wal2json.Change, payload: bytes, now_ms: int) -> None:
        """A row change: of the signal table, maybe a signal; of a captured table, its records (an
        outbox's as its router makes them: INSERTs only, since events are immutable)."""
        if self.signal_table is not None and (change.schema, change.table) == self.signal_table:
            self._signal_row(change)
            return
        if self.outboxes and (outbox := self.outboxes.get((change.schema, change.table))) is not None:
            self._outbox_row(change, outbox, now_ms)
            return
        target = self.tables.route(change.schema, change.table)
        if target is None:
            return
        if self.spec.router is not None:
            if change.action != "I":
                return  # events are immutable: only inserts carry news
            outputs = self.spec.router(env.stream_row(change.raw_columns))
        else:
            outputs = self._table_change(change, target, payload, now_ms)
            if self.txmeta is not None:
                outputs = self.txmeta.annotate(outputs, f"{change.schema}.{change.table}")
        self._stage(outputs, now_ms)
        self._tx.changes += 1
        self.status.changes += 1

    def _outbox_row(self, change: wal2json.Change, outbox: OutboxTable, now_ms: int) -> None:
        """A change of a service's outbox table: an INSERT is an event (in a topic that keeps every
        record: events are never compacted away); its updates and deletes are nobody's records."""
        if change.action != "I":
            return
        try:
            outputs = outbox.route(env.stream_row(change.raw_columns))
        except OutboxRowError as exc:
            raise SourceMisconfigured(f"source {self.spec.name!r}: {exc}") from None
        for out in outputs:
            self.staging.event_topics.add(out.topic)
        self._stage(outputs, now_ms)
        self._tx.changes += 1
        self.status.changes += 1

    def _signal_row(self, change: wal2json.Change) -> None:
        """A change of the signal table: an INSERT is a signal, and a commit point of its own (the
        request's); the table's other changes are nobody's records."""
        if change.action != "I":
            return
        row = {c["name"]: c.get("value") for c in change.raw_columns}
        self._signal(lambda: signals.from_row(row, table=f"{change.schema}.{change.table}"))
        self._tx.changes += 1

    def _table_change(
        self, change: wal2json.Change, target: tuple[str, str], payload: bytes, now_ms: int
    ) -> list[env.Output]:
        """A captured table's change → its envelopes: filed under its root table, its key and
        columns checked against what is known (a key change asks for a re-snapshot, new columns are
        a schema change); an INSERT in a transaction teaches its table's template."""
        change.schema, change.table = target  # a leaf partition's change is its root's
        keys = self.tables.key_columns(change.schema, change.table, change.pk)
        if self.tables.key_changes:
            self._resnapshot(self.tables.key_changes, "a key change")
        if change.action != "D":
            self.tables.observe(
                change.schema,
                change.table,
                change.column_types(),
                complete=change.action == "I",
                key=keys,
                now_ms=now_ms,
                xid=change.xid,
            )
        rules = None if self.spec.rules is None else self.spec.rules.for_table(change.schema, change.table, keys)
        outputs = self._envelopes(change, now_ms, keys, rules)
        templated = rules is None and not self.spec.routed(change.schema, change.table)  # no rules, no key field
        if change.action == "I" and self.templates is not None and self.offsets.in_transaction and templated:
            if self.txmeta is not None:
                self._collections[outputs[0].topic] = f"{change.schema}.{change.table}"
            self.templates.learn(
                change,
                payload,
                outputs,
                db=self.db,
                key_columns=keys,
                tx_id=self._tx.xid,
                commit_ts_ms=self._tx.ts_ms,
                now_ms=now_ms,
            )
        return outputs

    def _truncate(self, truncate: wal2json.Truncate, now_ms: int) -> None:
        """A TRUNCATE of a captured table: one record on every partition of its topic. Of one
        partition of a partitioned table: not the root table emptied, so its rows go by re-snapshot."""
        target = self.tables.route(truncate.schema, truncate.table)
        if target is None:
            return
        if self.tables.is_leaf(truncate.schema, truncate.table):
            self._resnapshot([f"{target[0]}.{target[1]}"], f"a TRUNCATE of its partition {truncate.table}")
        elif self.spec.routed(*target):  # its topic holds other tables' rows too: only its keys go
            self._resnapshot([f"{target[0]}.{target[1]}"], "a TRUNCATE of a routed table")
        else:
            outputs = env.truncate_envelope(truncate, **self._context())
            if self.txmeta is not None:
                *begin, truncated = self.txmeta.annotate(outputs, f"{target[0]}.{target[1]}")
                self._stage(begin, now_ms)  # the transaction's BEGIN when it is its first event
                outputs = [truncated]
            for out in outputs:
                self.staging.to_all_partitions(out.topic, out.key, out.value, now_ms)
        self._tx.changes += 1

    def _message(self, message: wal2json.LogicalMessage, now_ms: int) -> bool:
        """A logical message: a chunked snapshot's watermark, a schema change notice, a signal, or
        else a record of `<source>.messages`. Outside a transaction it is its own commit point."""
        if message.prefix == WATERMARK_PREFIX:
            return self._watermark(message)
        if message.prefix == DDL_PREFIX:
            self._ddl_notice(message, now_ms)
            return False
        if message.prefix == signals.SIGNAL_PREFIX:
            self._signal(lambda: signals.from_message(message.content, lsn=str(message.lsn or "")))
        elif message.prefix == STREAM_DELETED_PREFIX and self.spec.router is not None:
            self._stage(route_stream_deleted(message.content), now_ms)  # the event store's delete
        else:
            self._stage(env.message_envelope(message, **self._context()), now_ms)
        if not self.offsets.in_transaction and message.lsn is not None:
            # A non-transactional message stands alone: it is its own commit point.
            self.staging.flush()
            self.last_tx_changes = 1
            self.offsets.standalone(message.lsn)
            return True
        self._tx.changes += 1
        return False

    def _ddl_notice(self, message: wal2json.LogicalMessage, now_ms: int) -> None:
        """A catalog watcher's notice (capture/streaming/ddl_watch.py), acted on where its transaction ends;
        a commit point when acting on it staged records."""
        on_ddl = self.on_ddl
        if on_ddl is not None and self.offsets.in_transaction and on_ddl(message.content, self._tx.nextlsn, now_ms):
            self._tx.changes += 1  # a commit point: its records

    def _signal(self, parse: Callable[[], signals.SnapshotSignal]) -> None:
        """Parse a signal and hand it on; a malformed or refused one is a warning, never a stop.
        What it asks for is logged where it is applied: each table's snapshot requested, or
        refused with the reason (an excluded or keyless table; capture/snapshot/chunked.py)."""
        try:
            signal = parse()
            if self.on_signal is None:
                raise ValueError("this source takes no signals")
            self.on_signal(signal)
        except ValueError as exc:
            log.warning("source %s: signal ignored: %s", self.spec.name, exc)

    def _watermark(self, message: wal2json.LogicalMessage) -> bool:
        """A chunked snapshot's high watermark (capture/snapshot/chunked.py): never a record of its own;
        a commit point when the chunk's rows were staged at it."""
        if message.transactional or self.offsets.in_transaction or message.lsn is None:
            return False
        if self.on_watermark is None or not self.on_watermark(message.content):
            return False
        self.staging.flush()
        self.last_tx_changes = 1
        self.offsets.standalone(message.lsn)
        return True

    def _stage(self, outputs: Iterable[env.Output], now_ms: int) -> None:
        """A streamed record's timestamp is its transaction's commit time (event time)."""
        ts = self._tx.ts_ms or now_ms if self.offsets.in_transaction else now_ms
        self.staging.stage(outputs, ts)

    def _drain_run(self) -> None:
        """Encode the held INSERTs: each run of one table's, column-wise by its template; what a
        template is not sure of, one by one (template, else the generic path), in order."""
        assert self.templates is not None  # INSERTs are held only with templates
        run, self._run = self._run, []
        at = 0
        for tag, same in groupby(table_tags(run, self._last_tag)):
            n = len(list(same))
            payloads = run[at : at + n]
            at += n
            template = self.templates.current(tag)
            self._last_tag = tag
            if template is not None:
                tx = self._tx
                if tx.tx_part is None:
                    tx.tx_part = template.tx_part(tx.xid, tx.ts_ms)
                now_ms = int(self.clock() * 1000)
                records = template.encode_many(payloads, tx.tx_part, now_ms)
                if records is not None:
                    keys, values = records
                    if self.txmeta is not None:
                        values = self._transaction_blocks(template.topic, values, now_ms)
                    self.staging.append_run(template.topic, keys, values, tx.ts_ms or now_ms)
                    tx.changes += n
                    self.status.changes += n
                    self.templated += n
                    continue
            for payload in payloads:
                if not self._insert_fast(payload):
                    self._apply(payload)

    def _insert_fast(self, payload: bytes) -> bool:
        """An INSERT of a table with a template: key and value spliced from the document's bytes,
        staged as `_stage` would (same partition, the transaction's time). False: not handled."""
        assert self.templates is not None
        parts = payload.split(SPLIT)
        template = self.templates.current(table_tag(parts[0]))
        if template is None:
            return False
        tx = self._tx
        if tx.tx_part is None:
            tx.tx_part = template.tx_part(tx.xid, tx.ts_ms)
        now_ms = int(self.clock() * 1000)
        record = template.encode(payload, parts, tx.tx_part, now_ms)
        if record is None:
            return False
        tx.changes += 1
        self.status.changes += 1
        self.templated += 1
        key, value = record
        if self.txmeta is not None:
            (value,) = self._transaction_blocks(template.topic, [value], now_ms)
        self.staging.stage_record(template.topic, key, value, tx.ts_ms or now_ms)
        return True

    def _transaction_blocks(self, topic: str, values: list[bytes], now_ms: int) -> list[bytes]:
        """Templated INSERTs' values with their `transaction` blocks, BEGIN staged before the first."""
        txmeta = self.txmeta
        assert txmeta is not None
        self._stage(txmeta.opening(), now_ms)
        table = self._collections[topic]
        return [txmeta.mark(value, table) for value in values]

    def _context(self, now_ms: int | None = None) -> _EnvelopeContext:
        """The transaction's keywords for `envelopes_for`, `truncate_envelope` and
        `message_envelope`, at `now_ms` (else the clock, read now)."""
        tx = self._tx
        return _EnvelopeContext(
            source_name=self.spec.name,
            db=self.db,
            lsn=tx.lsn,
            tx_id=tx.xid,
            commit_ts_ms=tx.ts_ms,
            now_ms=int(self.clock() * 1000) if now_ms is None else now_ms,
        )

    def _envelopes(
        self, change: wal2json.Change, now_ms: int, keys: tuple[str, ...], rules: TableRules | None = None
    ) -> list[env.Output]:
        """A change's records, with the clock read once per change, not once per use. A table with
        rules (capture/records/rules.py) never has an INSERT template: this is its one path."""
        return env.envelopes_for(
            change,
            known_columns=self.tables.schemas.columns(change.schema, change.table) if change.action == "U" else None,
            key_columns=keys,
            rules=rules,
            routing=self.spec.routing,
            **self._context(now_ms),
        )

    def _resnapshot(self, tables: list[str], why: str) -> None:
        """Ask for a chunked re-snapshot of `tables` (its key check removes what the stream could
        not: keys of an older shape, a truncated partition's rows)."""
        names, tables[:] = list(dict.fromkeys(tables)), []
        if self.on_resnapshot is not None and not self.offsets.skipping:
            self.on_resnapshot(names, why)
