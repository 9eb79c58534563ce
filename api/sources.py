"""From settings to capture sources: the configured databases (and, later, the event store outbox)."""

from __future__ import annotations

import psycopg

from api.config import Settings
from capture.replication import connect_options
from capture.source import SourceSpec

__all__ = ["slot_lag_bytes", "source_specs"]


def source_specs(settings: Settings) -> list[SourceSpec]:
    """One SourceSpec per `[[sources]]` entry, defaults filled in."""
    return [
        SourceSpec(
            name=s.name,
            dsn=s.dsn,
            slot=s.slot_name,
            include=s.include,
            exclude=s.exclude,
            snapshot=s.snapshot,
            partitions=s.partitions or settings.log.partitions,
        )
        for s in settings.sources
    ]


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
