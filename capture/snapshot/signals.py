"""Signals: requests that reach capture through the source database's WAL, in order with the stream. Pure.

Two ways in, both read by the stream (capture/streaming/stream.py) where they were committed:

* a **logical message** with prefix `tributary.signal` (what `tributary capture snapshot` emits:
  `pg_logical_emit_message(true, 'tributary.signal', '{"type": "execute-snapshot", "tables": […]}')`);
* a row INSERTed into the source's **signal table** (`[[sources]] signal_table`), columns
  `(id, type, data)` as Debezium's signalling table: `type = 'execute-snapshot'`,
  `data = '{"tables": ["public.orders"]}'`.

Signal types, as Debezium's: `execute-snapshot` re-reads those tables, chunked, beside the stream
(with `additional-conditions`, `[{"data-collection": "public.orders", "filter": "status = 'open'"}]`,
only the rows a table's filter selects); `stop-snapshot` ends the chunked snapshot under way (of
the tables named, or all); `pause-snapshot` and `resume-snapshot` hold and release it. A malformed
signal raises `BadSignal`; the stream logs it as a warning and goes on.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "CONTROL_SIGNALS",
    "EXECUTE_SNAPSHOT",
    "PAUSE_SNAPSHOT",
    "RESUME_SNAPSHOT",
    "STOP_SNAPSHOT",
    "SIGNAL_PREFIX",
    "BadSignal",
    "SnapshotSignal",
    "from_message",
    "from_row",
    "qualified_table",
    "control_message",
    "snapshot_message",
]

SIGNAL_PREFIX = "tributary.signal"
EXECUTE_SNAPSHOT = "execute-snapshot"
STOP_SNAPSHOT = "stop-snapshot"
PAUSE_SNAPSHOT = "pause-snapshot"
RESUME_SNAPSHOT = "resume-snapshot"
CONTROL_SIGNALS = (STOP_SNAPSHOT, PAUSE_SNAPSHOT, RESUME_SNAPSHOT)  # act on the chunked snapshot under way
_KNOWN = ", ".join((EXECUTE_SNAPSHOT, *CONTROL_SIGNALS))

# schema.table as the catalog spells them (no quotes, no globs)
_QUALIFIED = re.compile(r"^[^.\s\"*?\[\]]+\.[^.\s\"*?\[\]]+$")


class BadSignal(ValueError):
    """A signal capture cannot act on; the message says why, in one line."""


@dataclass(frozen=True, slots=True)
class SnapshotSignal:
    """A signal: its type, the tables it names ("schema.table"; none: all, for `stop-snapshot`),
    each filtered table's condition (`execute-snapshot`'s `additional-conditions`), its origin."""

    tables: tuple[str, ...]
    origin: str
    kind: str = EXECUTE_SNAPSHOT
    filters: tuple[tuple[str, str], ...] = ()  # (table, SQL condition), only of tables in `tables`


def qualified_table(name: object) -> str:
    """`schema.table` as given (catalog names: no quotes, no globs); BadSignal unless it has both parts."""
    if not isinstance(name, str) or not _QUALIFIED.match(name):
        raise BadSignal(f"table {name!r} must be written schema.table")
    return name


def snapshot_message(tables: Iterable[str], filters: Mapping[str, str] | None = None) -> str:
    """The logical message content that asks for a snapshot of `tables` (each of `filters`'
    tables only where its condition holds)."""
    doc: dict[str, Any] = {"type": EXECUTE_SNAPSHOT, "tables": [qualified_table(t) for t in tables]}
    if filters:
        doc["additional-conditions"] = [{"data-collection": t, "filter": f} for t, f in filters.items()]
    return json.dumps(doc)


def control_message(kind: str, tables: Iterable[str] = ()) -> str:
    """The logical message content of a `stop-snapshot` (of `tables`, or all), `pause-snapshot`
    or `resume-snapshot` signal."""
    if kind not in CONTROL_SIGNALS:
        raise BadSignal(f"unknown snapshot control {kind!r}")
    doc: dict[str, Any] = {"type": kind}
    names = [qualified_table(t) for t in tables]
    if names:
        doc["tables"] = names
    return json.dumps(doc)


def _tables(data: Mapping[str, Any], *, optional: bool = False) -> tuple[str, ...]:
    # `data-collections` is Debezium's spelling; `tables` ours.
    tables = data.get("tables", data.get("data-collections"))
    if optional and tables is None:
        return ()
    if not isinstance(tables, list) or not tables:
        raise BadSignal('an execute-snapshot signal needs "tables": a non-empty list of "schema.table"')
    out: list[str] = []
    for table in tables:
        name = qualified_table(table)
        if name not in out:
            out.append(name)
    return tuple(out)


def _filters(data: Mapping[str, Any], tables: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    """`additional-conditions` (Debezium's spelling): one filter per table, a table of the signal."""
    conditions = data.get("additional-conditions")
    if conditions is None:
        return ()
    if not isinstance(conditions, list):
        raise BadSignal('"additional-conditions" must be a list of {"data-collection": ..., "filter": ...}')
    out: dict[str, str] = {}
    for cond in conditions:
        if not isinstance(cond, Mapping):
            raise BadSignal('"additional-conditions" must be a list of {"data-collection": ..., "filter": ...}')
        table, where = qualified_table(cond.get("data-collection")), cond.get("filter")
        if table not in tables:
            raise BadSignal(f"a condition names {table}, which the signal does not snapshot")
        if not isinstance(where, str) or not where.strip():
            raise BadSignal(f'the condition of {table} needs a non-empty "filter"')
        if table in out:
            raise BadSignal(f"{table} has more than one condition")
        out[table] = where.strip()
    return tuple(out.items())


def _signal(doc: Mapping[str, Any], origin: str) -> SnapshotSignal:
    """A signal document (its type checked) → the request it makes."""
    kind = doc.get("type")
    if kind == EXECUTE_SNAPSHOT:
        tables = _tables(doc)
        return SnapshotSignal(tables, origin, kind, _filters(doc, tables))
    if kind in CONTROL_SIGNALS:
        tables = _tables(doc, optional=True) if kind == STOP_SNAPSHOT else ()
        return SnapshotSignal(tables, origin, kind)
    raise BadSignal(f"unknown signal type {kind!r} (known: {_KNOWN})")


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
    return _signal(doc, f"signal message at {lsn}" if lsn else "signal message")


def from_row(row: Mapping[str, Any], *, table: str) -> SnapshotSignal:
    """A signal table's inserted row (column name → value as wal2json printed it) → the request."""
    where = f"{table} row {row.get('id')!r}"
    try:
        data = row.get("data")
        doc = {} if data is None and row.get("type") in CONTROL_SIGNALS else _document(data, "its data")
        return _signal({**doc, "type": row.get("type")}, where)
    except BadSignal as exc:
        raise BadSignal(f"{where}: {exc}") from None
