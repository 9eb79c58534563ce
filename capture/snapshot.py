"""The consistent initial snapshot: read every included table inside the slot's exported snapshot.

`CREATE_REPLICATION_SLOT … EXPORT_SNAPSHOT` names a snapshot that sees exactly the rows committed
before the slot's consistent point; a REPEATABLE READ transaction that imports it (before the
replication connection runs its next command) reads them, and the stream carries everything after.
Rows come out of `COPY … TO STDOUT` as PostgreSQL text, the same text wal2json would print.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
from psycopg import sql

from capture.catalog import TableInfo
from capture.errors import TransientSourceError
from capture.replication import connect_options, translate_connect_error

__all__ = ["SnapshotReader"]


class SnapshotReader:
    """One read-only REPEATABLE READ transaction pinned to an exported snapshot."""

    def __init__(self, dsn: str, snapshot_name: str, *, label: str) -> None:
        self.label = label
        try:
            self._conn: psycopg.Connection[Any] = psycopg.connect(dsn, connect_timeout=10, **connect_options())
        except psycopg.OperationalError as exc:
            raise translate_connect_error(exc, f"source {label!r} (snapshot)") from None
        self._conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        self._conn.read_only = True
        self._conn.execute(sql.SQL("SET TRANSACTION SNAPSHOT {}").format(sql.Literal(snapshot_name)))

    def rows(self, table: TableInfo, *, ordered: bool = False) -> Iterator[tuple[str | None, ...]]:
        """Every row of `table` as text values in `table.columns` order.

        `ordered`: by primary key. A CDC snapshot holds one row per key, so heap order is fine
        (and fastest); an outbox holds many rows per stream, whose order is the point."""
        cols = sql.SQL(", ").join(sql.Identifier(c.name) for c in table.columns)
        order = sql.SQL("")
        if ordered and table.primary_key:
            order = sql.SQL(" ORDER BY ") + sql.SQL(", ").join(sql.Identifier(k) for k in table.primary_key)
        query = sql.SQL("COPY (SELECT {} FROM {}.{}{}) TO STDOUT").format(
            cols, sql.Identifier(table.schema), sql.Identifier(table.table), order
        )
        try:
            with self._conn.cursor().copy(query) as copy:
                yield from copy.rows()
        except psycopg.OperationalError as exc:
            raise TransientSourceError(f"source {self.label!r}: snapshot of {table.qualified} broke: {exc}") from None

    def close(self) -> None:
        if not self._conn.closed:
            self._conn.rollback()
            self._conn.close()

    def __enter__(self) -> SnapshotReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
