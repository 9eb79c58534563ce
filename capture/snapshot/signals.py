"""Signals: requests that reach capture through the source database's WAL, in order with the stream. Pure.

Two ways in, both read by the stream (capture/streaming/stream.py) where they were committed:

* a **logical message** with prefix `tributary.signal` (what `tributary capture snapshot` emits:
  `pg_logical_emit_message(true, 'tributary.signal', '{"type": "execute-snapshot", "tables": […]}')`);
* a row INSERTed into the source's **signal table** (`[[sources]] signal_table`), columns
  `(id, type, data)` as Debezium's signalling table: `type = 'execute-snapshot'`,
  `data = '{"tables": ["public.orders"]}'`.

`execute-snapshot` is the one signal type: re-read those tables, chunked, beside the stream. A
malformed signal raises `BadSignal`; the stream logs it as a warning and goes on.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "EXECUTE_SNAPSHOT",
    "SIGNAL_PREFIX",
    "BadSignal",
    "SnapshotSignal",
    "from_message",
    "from_row",
    "qualified_table",
    "snapshot_message",
]

SIGNAL_PREFIX = "tributary.signal"
EXECUTE_SNAPSHOT = "execute-snapshot"

# schema.table as the catalog spells them (no quotes, no globs)
_QUALIFIED = re.compile(r"^[^.\s\"*?\[\]]+\.[^.\s\"*?\[\]]+$")


class BadSignal(ValueError):
    """A signal capture cannot act on; the message says why, in one line."""


@dataclass(frozen=True, slots=True)
class SnapshotSignal:
    """`execute-snapshot`: the tables to re-read ("schema.table"), and where the request came from."""

    tables: tuple[str, ...]
    origin: str


def qualified_table(name: str) -> str:
    """`schema.table` as given (catalog names: no quotes, no globs); BadSignal unless it has both parts."""
    if not isinstance(name, str) or not _QUALIFIED.match(name):
        raise BadSignal(f"table {name!r} must be written schema.table")
    return name


def snapshot_message(tables: Iterable[str]) -> str:
    """The logical message content that asks for a snapshot of `tables`."""
    return json.dumps({"type": EXECUTE_SNAPSHOT, "tables": [qualified_table(t) for t in tables]})


def _tables(data: Mapping[str, Any]) -> tuple[str, ...]:
    # `data-collections` is Debezium's spelling; `tables` ours.
    tables = data.get("tables", data.get("data-collections"))
    if not isinstance(tables, list) or not tables:
        raise BadSignal('an execute-snapshot signal needs "tables": a non-empty list of "schema.table"')
    out: list[str] = []
    for table in tables:
        name = qualified_table(table)
        if name not in out:
            out.append(name)
    return tuple(out)


def _document(text: object, what: str) -> dict[str, Any]:
    if isinstance(text, Mapping):
        return dict(text)
    if not isinstance(text, str):
        raise BadSignal(f"{what} is not JSON text")
    try:
        doc = json.loads(text)
    except ValueError:
        raise BadSignal(f"{what} is not JSON: {text[:80]!r}") from None
    if not isinstance(doc, dict):
        raise BadSignal(f"{what} is not a JSON object: {text[:80]!r}")
    return doc


def from_message(content: str, *, lsn: str | None = None) -> SnapshotSignal:
    """A `tributary.signal` logical message's content → the request it makes."""
    doc = _document(content, "the signal message")
    kind = doc.get("type")
    if kind != EXECUTE_SNAPSHOT:
        raise BadSignal(f"unknown signal type {kind!r} (known: {EXECUTE_SNAPSHOT})")
    return SnapshotSignal(_tables(doc), f"signal message at {lsn}" if lsn else "signal message")


def from_row(row: Mapping[str, Any], *, table: str) -> SnapshotSignal:
    """A signal table's inserted row (column name → value as wal2json printed it) → the request."""
    kind = row.get("type")
    if kind != EXECUTE_SNAPSHOT:
        raise BadSignal(f"{table} row {row.get('id')!r}: unknown signal type {kind!r} (known: {EXECUTE_SNAPSHOT})")
    try:
        tables = _tables(_document(row.get("data"), "its data"))
    except BadSignal as exc:
        raise BadSignal(f"{table} row {row.get('id')!r}: {exc}") from None
    return SnapshotSignal(tables, f"{table} row {row.get('id')!r}")
