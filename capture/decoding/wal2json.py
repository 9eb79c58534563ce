"""wal2json format-version 2 messages → typed values. Pure: bytes in, dataclasses out.

orjson parses the common case fast. It would turn a `numeric` such as
12345678901234567890.123456789 into a float, so any change carrying a numeric column takes an
exact path (the standard library, keeping each fraction's literal text): exactness first.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import orjson

from tributary.capture.decoding.lsn import Lsn

__all__ = [
    "WAL2JSON_OPTIONS",
    "Begin",
    "Change",
    "Column",
    "Commit",
    "LogicalMessage",
    "Message",
    "Truncate",
    "parse_message",
    "parse_timestamp_ms",
]

# Exactly what the replication connection asks for (and the benchmark's pg_recvlogical).
WAL2JSON_OPTIONS: dict[str, str] = {
    "format-version": "2",
    "include-xids": "1",
    "include-timestamp": "1",
    "include-lsn": "1",
    "include-transaction": "1",
    "include-pk": "1",
    "include-type-oids": "1",
    "include-typmod": "1",
}


@dataclass(frozen=True, slots=True)
class Column:
    name: str
    type: str
    typeoid: int
    value: Any  # as wal2json printed it: int, float, bool, str (also a numeric's literal) or None


@dataclass(frozen=True, slots=True)
class Begin:
    xid: int
    lsn: Lsn
    nextlsn: Lsn
    timestamp_ms: int


@dataclass(frozen=True, slots=True)
class Commit:
    xid: int
    lsn: Lsn
    nextlsn: Lsn
    timestamp_ms: int


@dataclass(slots=True)  # not frozen: a frozen dataclass's __init__ is slower, and this is the hot path
class Change:
    """An INSERT/UPDATE/DELETE. Columns stay the dicts wal2json sent ({"name", "type",
    "typeoid", "value"}): building an object per column cost more than the JSON parse itself."""

    action: str  # I U D
    schema: str
    table: str
    raw_columns: list[dict[str, Any]]  # new values (I, U); unchanged TOAST columns are absent
    raw_identity: list[dict[str, Any]]  # old key (U, D), or the whole old row under REPLICA IDENTITY FULL
    pk: tuple[str, ...]
    lsn_text: str | None
    xid: int | None = None  # the change's transaction (include-xids): which DDL it came after

    @property
    def lsn(self) -> Lsn | None:
        return Lsn.parse(self.lsn_text) if self.lsn_text else None

    @property
    def columns(self) -> tuple[Column, ...]:
        return _columns(self.raw_columns)

    @property
    def identity(self) -> tuple[Column, ...]:
        return _columns(self.raw_identity)

    def column_types(self) -> list[tuple[str, str, int]]:
        return [(c["name"], c["type"], c.get("typeoid", 0)) for c in self.raw_columns or self.raw_identity]


@dataclass(frozen=True, slots=True)
class Truncate:
    schema: str
    table: str
    lsn: Lsn | None


@dataclass(frozen=True, slots=True)
class LogicalMessage:
    transactional: bool
    prefix: str
    content: str
    lsn: Lsn | None


Message = Begin | Commit | Change | Truncate | LogicalMessage


def parse_timestamp_ms(text: str) -> int:
    """`2026-11-22 22:45:54.385451+00` (TimeZone=UTC) → ms since the epoch."""
    from datetime import datetime

    return int(datetime.fromisoformat(text).timestamp() * 1000)


_NEG_ZERO = b'"value":-0}'
_NEG_ZERO_FLOAT = b'"value":-0.0}'


def _head(data: bytes) -> bytes:
    """What an error may quote of a document: its start, never its columns' values (a masked or
    excluded column's value must not reach a message: capture/records/rules.py)."""
    head = data[:120]
    for field in (b'"columns"', b'"identity"'):
        at = head.find(field)
        if at >= 0:
            head = head[:at] + b"..."
    return head


def _decode(data: bytes) -> dict[str, Any]:
    if _NEG_ZERO in data:
        # A float's -0 (only floats print it): a JSON parser reads the integer 0 and drops the sign.
        data = data.replace(_NEG_ZERO, _NEG_ZERO_FLOAT)
    if b'"numeric' in data:
        # Keep a fraction's literal text (Decimal would print 1E-30 for 0.000…001).
        return dict(json.loads(data, parse_float=str))
    try:
        doc = orjson.loads(data)
    except orjson.JSONDecodeError:
        # orjson refuses integers beyond 64 bits; the standard library keeps them exact.
        return dict(json.loads(data, parse_float=str))
    if not isinstance(doc, dict):
        raise ValueError(f"not a wal2json document: {_head(data)!r}")
    return doc


def _columns(raw: list[dict[str, Any]] | None) -> tuple[Column, ...]:
    if not raw:
        return ()
    return tuple(Column(c["name"], c["type"], int(c.get("typeoid", 0)), c.get("value")) for c in raw)


def _lsn(doc: dict[str, Any], key: str = "lsn") -> Lsn | None:
    text = doc.get(key)
    return Lsn.parse(text) if text else None


def parse_message(data: bytes) -> Message:
    """One wal2json v2 document (the XLogData payload) → a typed message."""
    doc = _decode(data)
    action = doc.get("action")
    if action in ("I", "U", "D"):
        pk = doc.get("pk")
        return Change(
            action,
            doc["schema"],
            doc["table"],
            doc.get("columns") or [],
            doc.get("identity") or [],
            tuple(p["name"] for p in pk) if pk else (),
            doc.get("lsn"),
            doc.get("xid"),
        )
    if action == "B":
        return Begin(
            int(doc["xid"]), Lsn.parse(doc["lsn"]), Lsn.parse(doc["nextlsn"]), parse_timestamp_ms(doc["timestamp"])
        )
    if action == "C":
        return Commit(
            int(doc["xid"]), Lsn.parse(doc["lsn"]), Lsn.parse(doc["nextlsn"]), parse_timestamp_ms(doc["timestamp"])
        )
    if action == "T":
        return Truncate(doc["schema"], doc["table"], _lsn(doc))
    if action == "M":
        return LogicalMessage(
            bool(doc.get("transactional")), str(doc.get("prefix", "")), str(doc.get("content", "")), _lsn(doc)
        )
    raise ValueError(f"unknown wal2json action {action!r} in {_head(data)!r}")
