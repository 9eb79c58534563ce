"""What capture knows of a source's tables: which are included, their columns as last announced, their keys.

Shared by the snapshot and the stream: a table the snapshot announced (a schema record) is not
announced again by its first streamed change, and a changed shape bumps `schemas.version`, which
the INSERT templates check.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import psycopg

from tributary.capture.catalog import list_tables
from tributary.capture.routing import TableFilter
from tributary.capture.schema_tracker import SchemaTracker
from tributary.capture.staging import Staging

__all__ = ["SourceTables"]


class SourceTables:
    """The included tables' columns and identity, and the schema records they give rise to."""

    def __init__(self, source_name: str, filter_: TableFilter, staging: Staging, *, schema_records: bool) -> None:
        self.source_name = source_name
        self.filter = filter_
        self.staging = staging
        self.schema_records = schema_records  # False for an outbox: its topics carry events only
        self.schemas = SchemaTracker()
        self.identity: dict[tuple[str, str], tuple[str, ...]] = {}

    def matches(self, schema: str, table: str) -> bool:
        """Is the table captured (`include`/`exclude`)?"""
        return self.filter.matches(schema, table)

    def seed(self, conn: psycopg.Connection[Any]) -> list[str]:
        """Each table's columns and identity from the catalog: to recognise omitted TOAST values
        and to key tables whose identity is an index or the whole row. Returns the warnings the
        status shows (traps 1 and 4)."""
        warnings = []
        for table in list_tables(conn, self.filter.matches):
            self.schemas.seed(table.schema, table.table, [(c.name, c.type, c.typeoid) for c in table.columns])
            self.identity[(table.schema, table.table)] = table.identity_columns
            numeric = [c.name for c in table.columns if c.type.startswith("numeric")]
            if numeric:
                # Trap 1: wal2json 2.5 prints NaN/±Infinity numerics as null, like SQL NULL.
                warnings.append(
                    f"{table.qualified}: numeric column(s) {', '.join(numeric)}: NaN and Infinity are captured as null (wal2json 2.5)"
                )
            if table.loses_updates:
                warnings.append(
                    f"{table.qualified} has no primary key or replica identity: its UPDATEs and DELETEs are not captured"
                )
        return warnings

    def observe(
        self,
        schema: str,
        table: str,
        columns: Iterable[Any],
        *,
        complete: bool,
        key: Iterable[str],
        now_ms: int,
        xid: int | None = None,
    ) -> None:
        """Stage a schema record on every partition of the table's topic when its columns differ
        from the last announced ones (or on first sight)."""
        if not self.schema_records:
            return
        record = self.schemas.observe(
            self.source_name, schema, table, list(columns), complete=complete, key=tuple(key), now_ms=now_ms, xid=xid
        )
        if record is not None:
            self.staging.to_all_partitions(record.topic, record.key, record.value, now_ms)
