"""From settings to capture sources: the configured databases (and, later, the event store outbox)."""

from __future__ import annotations

import contextlib
from typing import Any

import psycopg

from tributary.api.settings.config import Settings, SourceSettings
from tributary.capture.database.replication import connect_options
from tributary.capture.records.outbox import OUTBOX_TABLE, route_event
from tributary.capture.records.routing import Route, Routing
from tributary.capture.records.rules import RuleSpec, SourceRules
from tributary.capture.records.service_outbox import OutboxTable
from tributary.capture.source import SourceSpec
from tributary.capture.status import read_status, snapshot_view

__all__ = ["OUTBOX_SOURCE", "outbox_spec", "slot_lag_bytes", "source_rules", "source_specs", "source_statuses"]


OUTBOX_SOURCE = "_eventstore"  # reserved: the event store's outbox, captured like any source


def _default_partitions(settings: Settings) -> int:
    """Partitions of the topics a source creates when its entry names none: `[log.kafka]
    partitions` on the Kafka backend, `[log] partitions` on the local log."""
    return settings.log.kafka.partitions if settings.log.backend == "kafka" else settings.log.partitions


def outbox_spec(settings: Settings, service_dsn: str) -> SourceSpec:
    """The service database's `eventstore.events`, routed to `events.<stream_type>`."""
    return SourceSpec(
        name=OUTBOX_SOURCE,
        dsn=service_dsn,
        slot="tributary_eventstore",
        include=(OUTBOX_TABLE,),
        exclude=(),
        snapshot="initial",
        partitions=_default_partitions(settings),
        router=route_event,
    )


def source_rules(source: SourceSettings) -> SourceRules | None:
    """The source's `[[sources.rules]]` as capture applies them; None without any (the fast paths)."""
    if not source.rules:
        return None
    specs = [
        RuleSpec(
            tables=r.tables,
            exclude=r.exclude,
            mask=r.mask,
            mask_chars=r.mask_chars,
            hash=r.hash,
            hash_salt=r.hash_salt or "",
            truncate=r.truncate,
            truncate_chars=r.truncate_chars,
            row_filter=r.row_filter,
        )
        for r in source.rules
    ]
    return SourceRules(source.name, specs)


def _routing(source: SourceSettings) -> Routing | None:
    """The source's routes compiled once, or None: each table its own topic (no routes)."""
    if not source.routes:
        return None
    routes = (Route(topic=r.topic, tables=r.tables, regex=r.regex) for r in source.routes)
    return Routing(source.name, routes, source.key_field if source.key_enforce_uniqueness else None)


def source_specs(settings: Settings, *, with_outbox: bool = False) -> list[SourceSpec]:
    """One SourceSpec per `[[sources]]` entry, defaults filled in; with the outbox when asked
    and `[capture] capture_eventstore` is on and a service database is known."""
    specs = [
        SourceSpec(
            name=s.name,
            dsn=s.dsn,
            slot=s.slot_name,
            include=s.include,
            exclude=s.exclude,
            snapshot=s.snapshot,
            partitions=s.partitions or _default_partitions(settings),
            signal_table=s.signal_table,
            snapshot_method=s.snapshot_method,
            envelope=s.envelope,
            snapshot_chunk_rows=s.snapshot_chunk_rows,
            partitioned_tables=s.partitioned_tables,
            resnapshot_on_rewrite=s.resnapshot_on_rewrite,
            allow_without_key=s.allow_without_key,
            rules=source_rules(s),
            outbox=tuple(OutboxTable(**t.model_dump()) for t in s.outbox),
            transaction_metadata=s.transaction_metadata,
            heartbeat_interval_ms=s.heartbeat_interval_ms,
            notification_channels=s.notification_channels,
            routing=_routing(s),
        )
        for s in settings.sources
    ]
    if with_outbox and settings.capture.capture_eventstore:
        from tributary.api.settings.service import UserError, service_dsn

        with contextlib.suppress(UserError):  # no service database yet: nothing to route
            specs.append(outbox_spec(settings, service_dsn(settings)))
    return specs


def slot_lag_bytes(spec: SourceSpec) -> int | None:
    """WAL the slot still holds: pg_current_wal_lsn() - confirmed_flush_lsn (None if unknown)."""
    try:
        with psycopg.connect(spec.dsn, autocommit=True, connect_timeout=3, **connect_options()) as conn:
            row = conn.execute(
                "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn)::bigint "
                "FROM pg_replication_slots WHERE slot_name = %s",
                (spec.slot,),
            ).fetchone()
    except psycopg.Error:
        return None
    return None if row is None or row[0] is None else int(row[0])


def source_statuses(
    settings: Settings, current: dict[str, Any] | None = None
) -> tuple[int | None, list[dict[str, Any]]]:
    """(capture pid, one entry per source): the daemon's last status (`current`, else read from the
    status file) plus the live slot lag and `snapshot`, the snapshot under way (or None)."""
    current = current or read_status(settings.log.root) or {"pid": None, "sources": []}
    by_name = {s["name"]: s for s in current.get("sources", [])}
    rows = []
    for spec in source_specs(settings, with_outbox=True):
        entry = dict(by_name.get(spec.name, {"name": spec.name, "slot": spec.slot, "state": "never started"}))
        entry["slot_lag_bytes"] = slot_lag_bytes(spec)
        entry["snapshot"] = snapshot_view(entry)  # the snapshot under way, consistent or chunked
        rows.append(entry)
    return current.get("pid"), rows
