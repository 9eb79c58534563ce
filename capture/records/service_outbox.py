"""Outbox tables of the user's own services (`[[sources.outbox]]`): each inserted row is an event.

Debezium's outbox event router (`io.debezium.transforms.outbox.EventRouter`) for any table the user
names: a service writes its business rows and an outbox row in one transaction, and capture turns
the outbox row into a record on the topic its aggregate type names, keyed by its aggregate id, the
payload as the value and the event id (the consumers' dedupe key) and type in the headers. Only the
WAL matters: the writer may delete the row right after inserting it, and updates and deletes of the
table are never records. Pure.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from tributary.capture.records.envelope import Output
from tributary.capture.records.routing import topic_part

__all__ = ["ROUTE_PLACEHOLDER", "OutboxRowError", "OutboxTable"]

ROUTE_PLACEHOLDER = "{route}"  # Debezium's ${routedByValue} in route.topic.replacement


class OutboxRowError(ValueError):
    """An outbox row that cannot be an event (a configured column missing, no aggregate type)."""


@dataclass(frozen=True, slots=True)
class OutboxTable:
    """One outbox table and which of its columns make the event (defaults: Debezium's)."""

    table: str  # schema.table
    id_column: str = "id"  # table.field.event.id
    key_column: str = "aggregateid"  # table.field.event.key
    type_column: str = "type"  # table.field.event.type
    payload_column: str = "payload"  # table.field.event.payload
    route_by_column: str = "aggregatetype"  # route.by.field
    topic: str = "outbox.event.{route}"  # route.topic.replacement
    header_columns: tuple[str, ...] = ()  # table.fields.additional.placement=<column>:header

    @property
    def qualified(self) -> tuple[str, str]:
        schema, _, table = self.table.partition(".")
        return schema, table

    def columns(self) -> list[tuple[str, str]]:
        """(setting, column) of every column an event is made of."""
        named = [
            ("id_column", self.id_column),
            ("key_column", self.key_column),
            ("type_column", self.type_column),
            ("payload_column", self.payload_column),
            ("route_by_column", self.route_by_column),
        ]
        return named + [("header_columns", name) for name in self.header_columns]

    def route(self, row: dict[str, Any]) -> list[Output]:
        """One inserted row (as `envelope.stream_row` converts it) → its event record; the
        timestamp is left to the stream (the transaction's commit time)."""
        route = self._column(row, self.route_by_column, "route_by_column")
        if route is None:
            raise OutboxRowError(
                f"outbox table {self.table}: a row's {self.route_by_column} (route_by_column) is null, "
                "so it names no topic"
            )
        key = self._column(row, self.key_column, "key_column")
        headers = {
            "id": self._column(row, self.id_column, "id_column"),
            "type": self._column(row, self.type_column, "type_column"),
        }
        for name in self.header_columns:
            headers[name] = self._column(row, name, "header_columns")
        return [
            Output(
                self.topic.replace(ROUTE_PLACEHOLDER, topic_part(str(route))),
                None if key is None else orjson.dumps(key),
                orjson.dumps(self._column(row, self.payload_column, "payload_column")),
                headers=orjson.dumps({k: _text(v) for k, v in headers.items() if v is not None}),
            )
        ]

    def _column(self, row: dict[str, Any], name: str, setting: str) -> Any:
        try:
            return row[name]
        except KeyError:
            raise OutboxRowError(f"outbox table {self.table} has no column {name!r} ({setting})") from None


def _text(value: Any) -> str:
    """A header's value: headers are strings (a JSON value, such as a jsonb column's, as its JSON)."""
    return value if isinstance(value, str) else orjson.dumps(value).decode()
