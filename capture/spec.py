"""`SourceSpec`: what one captured database is, as configured (`[[sources]]`, or the event store's outbox)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tributary.capture.records import envelope as env
from tributary.capture.records.routing import Routing, table_topic
from tributary.capture.records.rules import SourceRules
from tributary.capture.records.service_outbox import OutboxTable

__all__ = ["CHUNK_ROWS", "SNAPSHOT_MODES", "SourceSpec"]

# `[[sources]] snapshot`, as Debezium's `snapshot.mode` (docs/capture.md); `never` streams from the
# slot's own start without a snapshot, `no_data` from a new slot, with the tables' schema records.
SNAPSHOT_MODES = ("initial", "initial_only", "no_data", "always", "when_needed", "never")

CHUNK_ROWS = 200_000  # rows per chunk of a chunked snapshot, by default (bench/README.md: bench/capture.py --chunked)


@dataclass(frozen=True, slots=True)
class SourceSpec:
    """One source's settings; product configuration only (how capture encodes is not configured)."""

    name: str
    dsn: str
    slot: str
    include: tuple[str, ...]
    exclude: tuple[str, ...]
    snapshot: str  # one of SNAPSHOT_MODES
    partitions: int
    snapshot_method: str = "consistent"  # consistent | chunked (capture/snapshot/chunked.py)
    snapshot_chunk_rows: int = CHUNK_ROWS
    # tributary | debezium: records rewritten into Debezium's form on their way into the log (capture/records/debezium.py)
    envelope: str = "tributary"
    # Outbox sources: each inserted row → records (capture.records.outbox), instead of CDC envelopes.
    router: Callable[[dict[str, Any]], list[env.Output]] | None = None
    # Outbox tables of the user's services (`[[sources.outbox]]`): their INSERTs are events, routed
    # per table (capture/records/service_outbox.py); never snapshotted nor captured as row changes.
    outbox: tuple[OutboxTable, ...] = ()
    # "schema.table" whose INSERTs are signals (capture/snapshot/signals.py), never captured as records.
    signal_table: str | None = None
    # root: a leaf partition's changes are the root table's (its topic, key and schema); leaves: own tables
    partitioned_tables: str = "root"
    # Re-snapshot a table (chunked) when a schema change rewrote its rows (capture/streaming/ddl_watch.py).
    resnapshot_on_rewrite: bool = False
    # "schema.table" without a key whose lost UPDATEs/DELETEs the user accepted (`init` refuses others)
    allow_without_key: tuple[str, ...] = ()
    # Column and row rules per table (`[[sources.rules]]`, capture/records/rules.py); None: none.
    rules: SourceRules | None = None

    # BEGIN/END records on `<source>.transactions` and a `transaction` block in every streamed change
    # (capture/records/transactions.py), as Debezium's provide.transaction.metadata.
    transaction_metadata: bool = False
    # A `<source>.heartbeat` record at this interval, idle or not (0: none), as Debezium's heartbeat.interval.ms.
    heartbeat_interval_ms: int = 0
    # Snapshot notifications on "sink" (`<source>.notifications`) and/or "log" (capture/records/notifications.py).
    notification_channels: tuple[str, ...] = ()

    # `[[sources.routes]]` and the key field, compiled (capture/records/routing.py); None: each table its own topic
    routing: Routing | None = None

    @property
    def snapshots_data(self) -> bool:
        """Does this source's mode read table rows on its own (`never`/`no_data` only stream;
        a requested snapshot is read whatever the mode)?"""
        return self.snapshot not in ("never", "no_data")

    def topic(self, schema: str, table: str) -> str:
        """The topic of a table's records: its route's, else `<source>.<schema>.<table>`."""
        return table_topic(self.routing, self.name, schema, table)[0]

    def routed(self, schema: str, table: str) -> bool:
        """Does a route take the table (then its records take the per-row paths only)?"""
        return self.routing is not None and self.routing.routed(schema, table)

    @property
    def row_exclude(self) -> tuple[str, ...]:
        """`exclude` and the tables whose rows are never row changes: the signal table (the
        source's control channel) and the outbox tables (events)."""
        signal = (self.signal_table,) if self.signal_table else ()
        return (*self.exclude, *signal, *(t.table for t in self.outbox))
