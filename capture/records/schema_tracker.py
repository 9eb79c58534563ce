"""Remember each table's columns; say when they change, as a schema record for the topic. Pure.

DDL produces no event in wal2json (trap 5): a schema change shows only as a different column
list. The first sighting of a table, and every change of its columns or types, yields a record
{"schema": {...}} (no "op") that the session writes to every partition of the table's topic, so
any reader of any partition sees the types before the rows that use them.

An UPDATE omits an unchanged TOAST value, and also every column that did not exist at that
change (wal2json decodes each change under the catalog of its own moment). So a column the last
shape had and an UPDATE omits is kept (as an unchanged value) only if it is TOAST-able and
`existed` says it was there at the change's transaction (capture/database/catalog.py, `ColumnHistory`);
otherwise the shape lost it — dropped, renamed, or added only after this change — and a record
says so before the change.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import orjson

from tributary.capture.records.envelope import CONNECTOR, toastable
from tributary.capture.records.routing import topic_name

__all__ = ["SCHEMA_KEY", "SchemaRecord", "SchemaTracker"]

SCHEMA_KEY = b'{"__schema__":true}'

ColumnSpec = tuple[str, str, int]


class SchemaRecord:
    __slots__ = ("topic", "key", "value")

    def __init__(self, topic: str, value: bytes) -> None:
        self.topic = topic
        self.key = SCHEMA_KEY
        self.value = value


class SchemaTracker:
    def __init__(self) -> None:
        self._announced: dict[tuple[str, str], tuple[ColumnSpec, ...]] = {}
        self._catalog: dict[tuple[str, str], tuple[ColumnSpec, ...]] = {}
        self._keys: dict[tuple[str, str], tuple[str, ...]] = {}  # the key each table was last announced with
        self.version = 0  # bumped whenever a table's announced columns change (insert templates check it)
        # (schema, table, column, xid, names the change shows) → did the column exist at that change? None: yes
        self.existed: Callable[[str, str, str, int | None, frozenset[str]], bool] | None = None

    def columns(self, schema: str, table: str) -> tuple[ColumnSpec, ...] | None:
        """The table's columns as best known: last announced, else the catalog's."""
        return self._announced.get((schema, table)) or self._catalog.get((schema, table))

    def seed(self, schema: str, table: str, columns: Sequence[ColumnSpec]) -> None:
        """Columns read from the catalog at start-up: used to recognise omitted TOAST values."""
        self._catalog[(schema, table)] = tuple(columns)

    def observe(
        self,
        source: str,
        schema: str,
        table: str,
        columns: Sequence[ColumnSpec],
        *,
        complete: bool,
        key: Sequence[str] = (),
        now_ms: int = 0,
        xid: int | None = None,
    ) -> SchemaRecord | None:
        """A schema record when the columns differ from the last announced ones (or on first
        sight). `complete`: the list is the whole row (INSERT, snapshot); an UPDATE (transaction
        `xid`) may omit unchanged TOAST values: an omitted column stays only if it is TOAST-able
        and existed at that change."""
        current = tuple(columns)
        base = self.columns(schema, table)
        if not complete and base:
            shown = frozenset(c[0] for c in current)
            omitted = [c for c in base if c[0] not in shown]
            existed = self.existed
            kept = tuple(
                c for c in omitted if toastable(c[1]) and (existed is None or existed(schema, table, c[0], xid, shown))
            )
            if kept:  # wal2json lists columns in attnum order; a kept one goes back where it was
                order = {c[0]: i for i, c in enumerate(base)}
                current = tuple(sorted(current + kept, key=lambda c: order.get(c[0], len(order))))
        if base and len(current) == len(base) and current != base and set(current) == set(base):
            current = base  # the same columns in another order: a leaf partition's, routed to its root
        if self._announced.get((schema, table)) == current and self._keys.get((schema, table)) == tuple(key):
            return None
        self._announced[(schema, table)] = current
        self._keys[(schema, table)] = tuple(key)
        self.version += 1
        body = {
            "schema": {
                "connector": CONNECTOR,
                "name": source,
                "schema": schema,
                "table": table,
                "key": list(key),
                "columns": [{"name": n, "type": t, "typeoid": o} for n, t, o in current],
            },
            "ts_ms": now_ms,
        }
        return SchemaRecord(topic_name(source, schema, table), orjson.dumps(body))
