"""tributary's records rewritten as Debezium's PostgreSQL connector writes them. Pure.

`[[sources]] envelope = "debezium"`: every record on its way into the log passes through
`DebeziumRewriter.rewrite`, per (topic, partition) in log order. A schema record (which precedes, on
every partition, the rows that use its columns) is taken in and left out of the log; each change
after it becomes Debezium's JSON with its Connect schema (`{"schema": …, "payload": …}`, Kafka's
JsonConverter with `schemas.enable=true`) under the connector settings docs/envelope.md lists
("A Debezium consumer"): `decimal.handling.mode=string`, `time.precision.mode=isostring`,
`binary.handling.mode=hex`, `interval.handling.mode=string`.

Rewriting the finished records, rather than encoding twice, keeps every fast path of the default
envelope (and its bytes) as it is; the columnar snapshot, which writes encoded lines straight into
the log, is not used under this envelope.
"""

from __future__ import annotations

import base64
import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from tributary.capture.decoding.values import type_family
from tributary.capture.records.schema_tracker import SCHEMA_KEY

__all__ = [
    "CONNECTOR",
    "VERSION",
    "DebeziumRewriter",
    "canonical_key",
    "connect_field",
    "debezium_value",
    "snapshot_marker",
]

CONNECTOR = "postgresql"
VERSION = "3.6.1.Final"  # the Debezium release whose records these match (deploy/debezium/pom.xml)

Staged = tuple[bytes | None, bytes | None, int, bytes | None]

_INT_TYPES = {"smallint": "int16", "int2": "int16", "integer": "int32", "int4": "int32"}
_INT_TYPES |= {"bigint": "int64", "int8": "int64", "oid": "int64"}
# Debezium's semantic types (names of Connect string schemas) under time.precision.mode=isostring.
_NAMED = {
    "date": "io.debezium.time.IsoDate",
    "time without time zone": "io.debezium.time.IsoTime",
    "time": "io.debezium.time.IsoTime",
    "time with time zone": "io.debezium.time.ZonedTime",
    "timetz": "io.debezium.time.ZonedTime",
    "timestamp without time zone": "io.debezium.time.IsoTimestamp",
    "timestamp": "io.debezium.time.IsoTimestamp",
    "timestamp with time zone": "io.debezium.time.ZonedTimestamp",
    "timestamptz": "io.debezium.time.ZonedTimestamp",
    "json": "io.debezium.data.Json",
    "jsonb": "io.debezium.data.Json",
    "uuid": "io.debezium.data.Uuid",
    "interval": "io.debezium.time.Interval",
}


def _base(type_name: str) -> str:
    """The type without its modifier: `timestamp(0) without time zone` → `timestamp without time zone`."""
    head, _, rest = type_name.partition("(")
    if not rest:
        return type_name.strip()
    return (head + rest.split(")", 1)[1]).strip()


def connect_field(name: str, type_name: str, *, optional: bool = True) -> dict[str, Any]:
    """The Connect schema of one column, as Debezium declares it (the sink types its columns by it)."""
    if type_name.endswith("[]"):
        items = connect_field("", type_name[:-2])
        items.pop("field")
        out: dict[str, Any] = {"type": "array", "items": items}
    else:
        base = _base(type_name)
        family = type_family(type_name)
        if base in _INT_TYPES:
            out = {"type": _INT_TYPES[base]}
        elif family == "float":
            out = {"type": "float" if base in ("real", "float4") else "double"}
        elif family == "bool" or type_name in ("bit", "bit(1)"):
            out = {"type": "boolean"}
        elif base == "bit" or base.startswith(("bit varying", "varbit")):
            out = {"type": "bytes", "name": "io.debezium.data.Bits", "version": 1}
        else:
            out = {"type": "string"}
            if base in _NAMED:
                out["name"] = _NAMED[base]
                out["version"] = 1
    out["optional"] = optional
    out["field"] = name
    return out


def _six_digits(text: str) -> str:
    """`…05.5Z` → `…05.500000Z`: Debezium's ZonedTimestamp always writes microseconds."""
    body = text[:-1]
    clock = body.rsplit("T", 1)[-1]
    whole, dot, fraction = clock.partition(".")
    return f"{body[: len(body) - len(clock)]}{whole}.{(fraction if dot else '').ljust(6, '0')}Z"


def _utc_time(text: str) -> str:
    """PostgreSQL's timetz text (`03:04:05.5+02`, `00:00:00-05:30`) → the UTC time Debezium writes."""
    cut = max(text.rfind("+"), text.rfind("-"))
    clock, zone = text[:cut], text[cut:]
    sign = -1 if zone[0] == "-" else 1
    parts = [int(p) for p in zone[1:].split(":")] + [0, 0]
    offset = sign * (parts[0] * 3600 + parts[1] * 60 + parts[2])
    whole, dot, fraction = clock.partition(".")
    h, m, s = (int(p) for p in whole.split(":"))
    seconds = (h * 3600 + m * 60 + s - offset) % 86400
    return f"{seconds // 3600:02d}:{seconds // 60 % 60:02d}:{seconds % 60:02d}{dot}{fraction}Z"


_UNITS = {"year": 0, "years": 0, "mon": 1, "mons": 1, "day": 2, "days": 2}


def _interval(text: str) -> str:
    """PostgreSQL's interval text (IntervalStyle postgres) → Debezium's ISO-8601 form `PnYnMnDTnHnMnS`."""
    ymd = [0, 0, 0]
    hms = ["0", "0", "0"]
    words = text.split()
    i = 0
    while i < len(words):
        word = words[i]
        if ":" in word:
            sign = "-" if word.startswith("-") else ""
            h, m, s = word.lstrip("+-").split(":")
            whole, dot, fraction = s.partition(".")
            fraction = fraction.rstrip("0")
            hms = [f"{sign}{int(h)}", f"{sign}{int(m)}", f"{sign}{int(whole)}" + (f".{fraction}" if fraction else "")]
            i += 1
        else:
            ymd[_UNITS[words[i + 1]]] = int(word)
            i += 2
    return f"P{ymd[0]}Y{ymd[1]}M{ymd[2]}DT{hms[0]}H{hms[1]}M{hms[2]}S"


def _bits(text: str) -> str:
    """A bit string → Debezium's `Bits`: its number as little-endian bytes, base64 as JSON carries bytes."""
    number = int(text, 2) if text else 0
    return base64.b64encode(number.to_bytes((len(text) + 7) // 8, "little")).decode()


def _money(text: str) -> str:
    """PostgreSQL's money text (`-$1,234.50`, by `lc_monetary`) → its digits, as Debezium's
    `decimal.handling.mode=string` writes them (`-1234.50`); a locale whose decimal mark is not `.` is not undone."""
    digits = "".join(c for c in text if c.isdigit() or c == ".")
    return ("-" if "-" in text or text.startswith("(") else "") + digits


def _json_text(value: Any) -> str:
    """JSON as PostgreSQL prints jsonb (`{"a": 1, "b": [1, 2]}`): Debezium's Json is that text."""
    if isinstance(value, dict):
        return "{" + ", ".join(f"{orjson.dumps(k).decode()}: {_json_text(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(_json_text(v) for v in value) + "]"
    return orjson.dumps(value).decode()


def debezium_value(type_name: str, value: Any) -> Any:
    """One column's value in tributary's form → Debezium's (None stays None)."""
    convert = converter(type_name)
    return value if convert is None or value is None else convert(value)


Convert = Callable[[Any], Any]
_UNAVAILABLE = "__tributary_unavailable__"
_ZONELESS = ("timestamp without time zone", "timestamp", "date", "time without time zone", "time")


@functools.lru_cache(maxsize=1024)
def converter(type_name: str) -> Convert | None:
    """The function taking a (non-null) value of this type to Debezium's form; None: the same in both.
    Worked out once per type: the rewriting runs it for every column of every record."""
    if type_name.endswith("[]"):
        element = converter(type_name[:-2])
        if element is None:
            return None
        # a multi-dimensional array stays PostgreSQL's text (no better form on either side)
        return lambda v: [None if x is None else element(x) for x in v] if isinstance(v, list) else v
    base = _base(type_name)
    if base in ("json", "jsonb"):
        return _json_text
    text: Callable[[str], Any] | None = None
    if base in ("timestamp with time zone", "timestamptz"):
        text = _zoned
    elif base in _ZONELESS:
        text = _zoneless
    elif base in ("time with time zone", "timetz"):
        text = _utc_time
    elif base == "interval":
        text = _interval
    elif base in ("numeric", "decimal"):
        text = _numeric
    elif base == "money":
        text = _money
    elif type_name in ("bit", "bit(1)"):
        text = _bit
    elif base == "bit" or base.startswith(("bit varying", "varbit")):
        text = _bits
    if text is None:
        return None
    spelled = text
    return lambda v: spelled(v) if isinstance(v, str) and v != _UNAVAILABLE else v


def _zoned(value: str) -> str:
    return _six_digits(value) if value.endswith("Z") else value


def _zoneless(value: str) -> str:
    return value if value.endswith(("infinity", " BC")) else value + "Z"


def _numeric(value: str) -> str:
    return "NAN" if value == "NaN" else value


def _bit(value: str) -> bool:
    return value == "1"


_INVERTIBLE = frozenset(("int", "float", "bool", "ts", "tstz", "text"))  # numeric: NAN and a text "NAN" alike
_NOT_INVERTIBLE = ("time with time zone", "timetz", "interval", "money", "bit")


def _invertible(type_name: str) -> bool:
    """Does `canonical_key` take this type's Debezium value back to tributary's?"""
    if type_family(type_name) not in _INVERTIBLE or type_name.endswith("[]"):
        return False
    return not _base(type_name).startswith(_NOT_INVERTIBLE)


@dataclass(frozen=True)
class _Table:
    """One table's shape as its last schema record gave it, and its schemas serialised once."""

    columns: tuple[tuple[str, str], ...]  # (name, type) in the table's order
    key: tuple[str, ...]  # the key's columns in primary-key order
    key_schema: bytes
    value_schema: bytes

    # each column's type; a key column whose Debezium value does not go back to tributary's
    # (`canonical_key`) as "text": it keeps tributary's spelling, so a re-snapshot's key check knows its keys
    types: dict[str, str]
    converters: tuple[tuple[str, Convert | None], ...]  # per column in order, after `types`


def _table(source: str, schema: str, table: str, columns: Sequence[tuple[str, str]], key: Sequence[str]) -> _Table:
    """The table's key and envelope schemas, named as Debezium names them (`<topic>.Key`, `.Value`, `.Envelope`)."""
    prefix = f"{source}.{schema}.{table}"
    keys = tuple(key) or tuple(n for n, _ in columns)
    types = dict(columns)
    key_schema = {
        "type": "struct",
        "fields": [connect_field(k, types.get(k, "text"), optional=False) for k in keys],
        "optional": False,
        "name": f"{prefix}.Key",
    }
    row = {
        "type": "struct",
        "fields": [connect_field(n, t, optional=n not in keys) for n, t in columns],
        "optional": True,
        "name": f"{prefix}.Value",
    }
    envelope = {
        "type": "struct",
        "fields": [
            {**row, "field": "before"},
            {**row, "field": "after"},
            _SOURCE_SCHEMA,
            {"type": "string", "optional": False, "field": "op"},
            {"type": "int64", "optional": True, "field": "ts_ms"},
        ],
        "optional": False,
        "name": f"{prefix}.Envelope",
        "version": 2,
    }
    kept = {name: "text" for name in keys if name in types and not _invertible(types[name])}
    final = types | kept
    converters = tuple((name, converter(type_name)) for name, type_name in final.items())
    return _Table(tuple(columns), keys, orjson.dumps(key_schema), orjson.dumps(envelope), final, converters)


_SOURCE_SCHEMA = {
    "type": "struct",
    "fields": [
        {"type": "string", "optional": False, "field": "version"},
        {"type": "string", "optional": False, "field": "connector"},
        {"type": "string", "optional": False, "field": "name"},
        {"type": "int64", "optional": True, "field": "ts_ms"},
        {"type": "string", "optional": True, "field": "snapshot", "default": "false"},
        {"type": "string", "optional": False, "field": "db"},
        {"type": "string", "optional": False, "field": "schema"},
        {"type": "string", "optional": False, "field": "table"},
        {"type": "int64", "optional": True, "field": "txId"},
        {"type": "int64", "optional": True, "field": "lsn"},
    ],
    "optional": False,
    "name": "io.debezium.connector.postgresql.Source",
    "field": "source",
}


def snapshot_marker(*, first: bool, last: bool, first_in_table: bool, last_in_table: bool) -> str:
    """`source.snapshot` of a snapshot row as Debezium's relational snapshot marks it: the very
    last row `last`, the very first `first`, else a table's last `last_in_data_collection` and its
    first `first_in_data_collection` (a one-row table's row is its last), every other `true`."""
    if last:
        return "last"
    if first:
        return "first"
    if last_in_table:
        return "last_in_data_collection"
    return "first_in_data_collection" if first_in_table else "true"


class DebeziumRewriter:
    """Rewrites one source's records, partition by partition, as they go into the log."""

    def __init__(self) -> None:
        # per (topic, partition), and per (topic, -1) the topic's latest: the last schema record's shape
        self._tables: dict[tuple[str, int], _Table] = {}

    def rewrite(self, topic: str, partition: int, records: list[Staged]) -> list[Staged]:
        """The records of one partition in log order → Debezium's; schema records taken in and left out."""
        out: list[Staged] = []
        for key, value, ts, headers in records:
            if key == SCHEMA_KEY and value is not None:
                self._tables[(topic, partition)] = self._tables[(topic, -1)] = _from_schema_record(value)
                continue
            # The partition's own shape; a partition that has not seen one yet in this run takes the topic's last.
            table = self._tables.get((topic, partition)) or self._tables.get((topic, -1))
            if key is None and partition != 0 and value is not None and b'"op":"t"' in value:
                continue  # a truncate: one record, as Debezium writes it (capture writes it to every partition)
            if table is None:
                table = _unannounced(value)  # a truncate of a table no change announced in this run
            if table is None:  # not a table's change (`.messages`): as it is
                out.append((key, value, ts, headers))
                continue
            out.append((_key(table, key), _value(table, value), ts, headers))
        return out


def _unannounced(value: bytes | None) -> _Table | None:
    """A truncate needs no columns (`before` and `after` are null): its table's schemas without them."""
    if value is None:
        return None
    doc = orjson.loads(value)
    source = doc.get("source")
    if doc.get("op") != "t" or not isinstance(source, dict):
        return None
    return _table(source["name"], source["schema"], source["table"], [], ())


def _from_schema_record(value: bytes) -> _Table:
    body = orjson.loads(value)["schema"]
    columns = [(c["name"], c["type"]) for c in body["columns"]]
    return _table(body["name"], body["schema"], body["table"], columns, body["key"])


# A truncate's key: Kafka's JsonConverter (schemas on) spells a null key so, and reads it back as
# null, as Debezium's own truncate has; a compacted topic refuses a record with no key at all.
NULL_KEY = b'{"schema":null,"payload":null}'


def _key(table: _Table, key: bytes | None) -> bytes | None:
    """The key's columns in primary-key order, with the key schema; a truncate's (none) as `NULL_KEY`."""
    if not key:
        return NULL_KEY
    parsed = orjson.loads(key)
    types = table.types
    payload = {k: debezium_value(types.get(k, "text"), parsed.get(k)) for k in table.key}
    return b'{"schema":%b,"payload":%b}' % (table.key_schema, orjson.dumps(payload))


def _row(table: _Table, row: dict[str, Any] | None, *, fill: bool) -> dict[str, Any] | None:
    """A row's values in Debezium's form, in the table's column order; `fill`: columns the row lacks
    (a delete's old key under REPLICA IDENTITY DEFAULT) as null, as Debezium writes them."""
    if row is None:
        return None
    out = {}
    for name, convert in table.converters:
        if name in row:
            value = row[name]
            out[name] = value if convert is None or value is None else convert(value)
        elif fill:
            out[name] = None
    out.update((name, value) for name, value in row.items() if name not in out)
    return out


def _value(table: _Table, value: bytes | None) -> bytes | None:
    """A change (or a tombstone, None) in Debezium's form with the envelope schema."""
    if value is None:
        return None
    doc = orjson.loads(value)
    op = doc.get("op")
    source = dict(doc["source"], connector=CONNECTOR, version=VERSION)
    payload = {
        "before": _row(table, doc.get("before"), fill=op == "d"),
        "after": _row(table, doc.get("after"), fill=False),
        "source": source,
        "op": op,
        "ts_ms": doc.get("ts_ms"),
    }
    block = doc.get("transaction")  # `transaction_metadata = true` (capture/records/transactions.py)
    if block is not None:
        payload["transaction"] = block
        return b'{"schema":%b,"payload":%b}' % (_with_transaction(table.value_schema), orjson.dumps(payload))
    return b'{"schema":%b,"payload":%b}' % (table.value_schema, orjson.dumps(payload))


_TRANSACTION_FIELD = {
    "type": "struct",
    "fields": [
        {"type": "string", "optional": False, "field": "id"},
        {"type": "int64", "optional": False, "field": "total_order"},
        {"type": "int64", "optional": False, "field": "data_collection_order"},
    ],
    "optional": True,
    "name": "event.block",
    "version": 1,
    "field": "transaction",
}


@functools.lru_cache(maxsize=1024)
def _with_transaction(value_schema: bytes) -> bytes:
    """An envelope schema with Debezium's `transaction` field last, as its connector writes it
    under `provide.transaction.metadata=true` (made once per table shape)."""
    schema = orjson.loads(value_schema)
    schema["fields"].append(_TRANSACTION_FIELD)
    return orjson.dumps(schema)


def canonical_key(key: bytes) -> bytes:
    """A key as the log holds it under this envelope → the key capture computes for the row (canonical
    JSON of tributary's values): what a re-snapshot's key check compares the table's keys with.

    Each key value goes back to tributary's form where Debezium's differs by its spelling only
    (`Z` after zone-less times, six fraction digits); a key column of a type whose value does not
    go back (numeric, timetz, interval, money, bit, json) keeps tributary's spelling (`_table`)."""
    doc = orjson.loads(key)
    if not isinstance(doc, dict) or set(doc) != {"schema", "payload"}:
        return key
    types = {f["field"]: f for f in doc["schema"].get("fields", [])}
    payload = {name: _key_value_back(types.get(name, {}), value) for name, value in doc["payload"].items()}
    return orjson.dumps(payload, option=orjson.OPT_SORT_KEYS)


def _key_value_back(field: dict[str, Any], value: Any) -> Any:
    """`debezium_value` undone for the spellings it changes in key columns."""
    name = field.get("name")
    if not isinstance(value, str):
        return value
    if name in ("io.debezium.time.IsoDate", "io.debezium.time.IsoTime", "io.debezium.time.IsoTimestamp"):
        return value.removesuffix("Z")
    if name == "io.debezium.time.ZonedTimestamp" and value.endswith("Z"):
        whole, dot, fraction = value[:-1].partition(".")
        fraction = fraction.rstrip("0")
        return f"{whole}.{fraction}Z" if dot and fraction else f"{whole}Z"
    return value
