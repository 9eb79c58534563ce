"""What capture knows of a source's tables: which are included, their columns as last announced, their keys.

Shared by the snapshot and the stream: a table the snapshot announced (a schema record) is not
announced again by its first streamed change, and a changed shape bumps `schemas.version`, which
the INSERT templates check.

One rule keys every record of a table, whatever path wrote it (snapshot, stream, re-snapshot, the
key check): its primary key, else its REPLICA IDENTITY USING INDEX columns, else the whole row.
A streamed change that names another primary key than the one capture keyed the table by (a key
added or changed while capture ran) switches the table to the new key and is reported
(`key_changes`): the session re-snapshots the table, whose key check removes every record keyed
the old way.

A leaf partition's changes are routed to its root table (`partitioned_tables = "root"`, the
default): the stream names the leaf, the topic, the `source` block, the key and the schema are
the root's, as the snapshot (which reads the root) writes them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any

import psycopg

from tributary.capture.database.catalog import (
    CatalogConnection,
    TableInfo,
    list_tables,
    partition_roots,
    table_info,
    table_warnings,
)
from tributary.capture.records.routing import TableFilter
from tributary.capture.records.schema_tracker import SchemaTracker
from tributary.capture.records.staging import Staging

__all__ = ["SourceTables"]

log = logging.getLogger(__name__)


class SourceTables:
    """The included tables' columns and identity, and the schema records they give rise to."""

    def __init__(
        self,
        source_name: str,
        filter_: TableFilter,
        staging: Staging,
        *,
        schema_records: bool,
        leaves: bool = False,
        topic: Callable[[str, str], str] | None = None,
    ) -> None:
        """`leaves`: leaf partitions are tables of their own (`partitioned_tables = "leaves"`);
        `topic`: a table's topic when the source routes tables (`SourceSpec.topic`)."""
        self.source_name = source_name
        self.topic = topic
        self.filter = filter_
        self.staging = staging
        self.schema_records = schema_records  # False for an outbox: its topics carry events only
        self.leaves = leaves
        self.schemas = SchemaTracker()
        self.identity: dict[tuple[str, str], tuple[str, ...]] = {}  # the record key's columns per table
        self.catalog: CatalogConnection | None = None  # catalog reads while streaming (a table new since start)
        self.key_changes: list[str] = []  # tables whose key changed while streaming, to re-snapshot
        self._roots: dict[tuple[str, str], tuple[str, str]] = {}  # leaf partition → root table
        self._routes: dict[tuple[str, str], tuple[str, str] | None] = {}
        self.routes_partitions = False  # an included table is partitioned: its leaves' changes are routed

    def matches(self, schema: str, table: str) -> bool:
        """Is the table captured (`include`/`exclude`)?"""
        return self.filter.matches(schema, table)

    def included(self, conn: psycopg.Connection[Any]) -> list[TableInfo]:
        """The included tables as the snapshot reads them (partitioned roots, or leaves)."""
        return list_tables(conn, self.filter.matches, leaves=self.leaves)

    def route(self, schema: str, table: str) -> tuple[str, str] | None:
        """The table whose topic a streamed change of `schema.table` belongs to (its root when it
        is a leaf partition), None when it is not captured."""
        key = (schema, table)
        try:
            return self._routes[key]
        except KeyError:
            pass
        target = key
        if not self.leaves:
            root = self._roots.get(key)
            if root is None and key not in self.identity and self.catalog is not None:
                root = partition_roots(self.catalog.connection, [key]).get(key)  # a partition new since start
            target = root or key
        hit = target if self.filter.matches(*target) else None
        if len(self._routes) >= 65536:
            self._routes.clear()
        self._routes[key] = hit
        return hit

    def is_leaf(self, schema: str, table: str) -> bool:
        """Is `schema.table` a leaf partition routed to its root (as far as capture has seen)?"""
        target = self._routes.get((schema, table))
        return target is not None and target != (schema, table)

    def key_columns(self, schema: str, table: str, primary_key: tuple[str, ...] = ()) -> tuple[str, ...]:
        """The record key's columns of a (routed) table; `primary_key`: the one a streamed change
        names (wal2json's `pk`). A table first seen now is read from the catalog; a primary key
        other than the known key is a key change (`key_changes`)."""
        known = self.identity.get((schema, table))
        if known is None:
            known = self.identity[(schema, table)] = self._read_key(schema, table) or primary_key
        if primary_key and primary_key != known:
            log.warning(
                "source %s: %s.%s is now keyed by (%s), was (%s): re-snapshotting it so records keyed the old way go",
                self.source_name,
                schema,
                table,
                ", ".join(primary_key),
                ", ".join(known) or "the whole row",
            )
            self.identity[(schema, table)] = primary_key
            self.key_changes.append(f"{schema}.{table}")
            return primary_key
        return known

    def _read_key(self, schema: str, table: str) -> tuple[str, ...]:
        if self.catalog is None:
            return ()
        info = table_info(self.catalog.connection, schema, table, leaves=self.leaves)
        return info.identity_columns if info is not None else ()

    def seed(self, conn: psycopg.Connection[Any]) -> list[str]:
        """Each table's columns and identity from the catalog: to recognise omitted TOAST values
        and to key tables whose identity is an index or the whole row. Returns the warnings the
        status shows (traps 1 and 4)."""
        warnings = []
        self._routes.clear()
        if not self.leaves:
            self._roots = partition_roots(conn)
        included = self.included(conn)
        self.routes_partitions = any(t.partitioned for t in included)
        for table in included:
            self.schemas.seed(table.schema, table.table, [(c.name, c.type, c.typeoid) for c in table.columns])
            self.identity[(table.schema, table.table)] = table.identity_columns
            numeric = [c.name for c in table.columns if c.type.startswith("numeric")]
            if numeric:
                # Trap 1: wal2json 2.5 prints NaN/±Infinity numerics as null, like SQL NULL.
                warnings.append(
                    f"{table.qualified}: numeric column(s) {', '.join(numeric)}: NaN and Infinity are captured as null (wal2json 2.5)"
                )
            warnings += table_warnings(table)
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
            topic = record.topic if self.topic is None else self.topic(schema, table)
            self.staging.to_all_partitions(topic, record.key, record.value, now_ms)
