"""The source's replication slot: inspect it, (re)create it, stream from it, confirm to it.

Everything capture says to the server about the slot is here, so what the slot holds (the WAL
since its confirmed position) is easy to audit: it is only ever advanced by `confirm`, and the
caller passes only an LSN a durable manifest covers (capture/streaming/positions.py).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import psycopg

from tributary.capture.database.replication import (
    ReplicationConnection,
    SlotInfo,
    connect_options,
    translate_connect_error,
)
from tributary.capture.database.session_guard import CATALOG_STATEMENT_TIMEOUT_MS, client_params, guard
from tributary.capture.decoding.lsn import Lsn
from tributary.capture.errors import SourceMisconfigured

__all__ = ["Slot", "SlotState", "sql_connection"]


def sql_connection(dsn: str, *, label: str) -> psycopg.Connection[Any]:
    """A plain autocommit connection with capture's session settings (catalog reads, slot checks)."""
    try:
        conn = psycopg.connect(dsn, autocommit=True, connect_timeout=10, **connect_options(), **client_params())
        guard(conn, statement_timeout_ms=CATALOG_STATEMENT_TIMEOUT_MS)  # capture/database/session_guard.py
    except psycopg.OperationalError as exc:
        raise translate_connect_error(exc, f"source {label!r}") from None
    return conn


@dataclass(frozen=True, slots=True)
class SlotState:
    """What `Slot.inspect` found: `status` None = missing, "lost" = invalidated, else its wal_status."""

    database: str
    status: str | None
    start: Lsn = Lsn.ZERO  # the later of its confirmed_flush_lsn and restart_lsn
    encoding: str = "UTF8"  # the database's (server_encoding): wal2json writes in it

    @property
    def usable(self) -> bool:
        """Does the slot still hold every change since its confirmed position?"""
        return self.status is not None and self.status != "lost"

    def starts_after(self, position: Lsn) -> bool:
        """Does the slot start later than `position`? Capture confirms only what its manifest
        holds (capture/streaming/positions.py), so its own slot never does: this one was recreated (or
        advanced) by someone else, and the changes in between are not in it."""
        return self.usable and self.start > position


class Slot:
    """One wal2json slot of one database, and the replication connection streaming from it."""

    def __init__(self, dsn: str, name: str, *, label: str) -> None:
        self.dsn = dsn
        self.name = name
        self.label = label
        self.conn: ReplicationConnection | None = None  # while streaming

    def inspect(self) -> SlotState:
        """The slot's state; a slot of that name for another plugin or database is a configuration
        error (capture must not consume someone else's slot)."""
        with sql_connection(self.dsn, label=self.label) as conn:
            database = str(conn.info.dbname)
            encoding = str(conn.info.parameter_status("server_encoding") or "UTF8")
            row = conn.execute(
                "SELECT plugin, wal_status, database, confirmed_flush_lsn::text, restart_lsn::text"
                " FROM pg_replication_slots WHERE slot_name = %s",
                (self.name,),
            ).fetchone()
        if row is None:
            return SlotState(database, None, encoding=encoding)
        plugin, wal_status, slot_database, confirmed, restart = row
        if plugin != "wal2json" or slot_database != database:
            raise SourceMisconfigured(
                f"source {self.label!r}: slot {self.name!r} exists but is not a wal2json slot of database {database!r}"
            )
        start = max(Lsn.parse(lsn) if lsn else Lsn.ZERO for lsn in (confirmed, restart))
        return SlotState(database, "lost" if wal_status == "lost" else str(wal_status), start, encoding)

    @contextmanager
    def recreate(self, state: SlotState, *, export_snapshot: bool) -> Iterator[SlotInfo]:
        """Drop the slot if it exists and create it again. With `export_snapshot`, the snapshot it
        names lives only until this connection runs its next command, i.e. while the block runs:
        import it (`SnapshotReader`) inside the block."""
        with ReplicationConnection(self.dsn, label=self.label) as repl:
            if state.status is not None:
                repl.drop_slot(self.name)
            yield repl.create_slot(self.name, export_snapshot=export_snapshot)

    def start_streaming(self, start: Lsn, options: Mapping[str, str]) -> ReplicationConnection:
        """START_REPLICATION from `start` (Lsn.ZERO: the slot's confirmed_flush_lsn)."""
        self.close()
        self.conn = ReplicationConnection(self.dsn, label=self.label)
        self.conn.start(self.name, start, options)
        return self.conn

    def confirm(self, lsn: Lsn, *, now_us: int, reply: bool = False) -> bool:
        """Let the server drop WAL up to `lsn`; False when not streaming (nothing sent)."""
        if self.conn is None:
            return False
        self.conn.send_status(lsn, now_us=now_us, reply=reply)
        return True

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None
