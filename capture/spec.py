"""`SourceSpec`: what one captured database is, as configured (`[[sources]]`, or the event store's outbox)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tributary.capture.records import envelope as env

__all__ = ["CHUNK_ROWS", "SourceSpec"]

CHUNK_ROWS = 200_000  # rows per chunk of a chunked snapshot, by default (bench/README.md: bench/capture.py --chunked)


@dataclass(frozen=True, slots=True)
class SourceSpec:
    """One source's settings; product configuration only (how capture encodes is not configured)."""

    name: str
    dsn: str
    slot: str
    include: tuple[str, ...]
    exclude: tuple[str, ...]
    snapshot: str  # initial | never | when_needed
    partitions: int
    snapshot_method: str = "consistent"  # consistent | chunked (capture/snapshot/chunked.py)
    snapshot_chunk_rows: int = CHUNK_ROWS
    # tributary | debezium: records rewritten into Debezium's form on their way into the log (capture/records/debezium.py)
    envelope: str = "tributary"
    # Outbox sources: each inserted row → records (capture.records.outbox), instead of CDC envelopes.
    router: Callable[[dict[str, Any]], list[env.Output]] | None = None
    # "schema.table" whose INSERTs are signals (capture/snapshot/signals.py), never captured as records.
    signal_table: str | None = None
    # root: a leaf partition's changes are the root table's (its topic, key and schema); leaves: own tables
    partitioned_tables: str = "root"
    # Re-snapshot a table (chunked) when a schema change rewrote its rows (capture/streaming/ddl_watch.py).
    resnapshot_on_rewrite: bool = False
    # "schema.table" without a key whose lost UPDATEs/DELETEs the user accepted (`init` refuses others)
    allow_without_key: tuple[str, ...] = ()
    # BEGIN/END records on `<source>.transactions` and a `transaction` block in every streamed change
    # (capture/records/transactions.py), as Debezium's provide.transaction.metadata.
    transaction_metadata: bool = False
    # A `<source>.heartbeat` record at this interval, idle or not (0: none), as Debezium's heartbeat.interval.ms.
    heartbeat_interval_ms: int = 0
    # Snapshot notifications on "sink" (`<source>.notifications`) and/or "log" (capture/records/notifications.py).
    notification_channels: tuple[str, ...] = ()
