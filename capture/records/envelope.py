"""Debezium-style envelopes and keys from parsed changes and snapshot rows. Pure.

value = {"before", "after", "source": {connector, version, name, db, schema, table, lsn, txId,
ts_ms, snapshot}, "op": c|u|d|r|t|m, "ts_ms"}; key = the primary-key columns as canonical JSON
(sorted keys, no whitespace). A delete is followed by a tombstone (value None); a primary-key
change becomes delete + tombstone for the old key and a create for the new one (trap 8).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from tributary.capture.decoding.lsn import Lsn
from tributary.capture.decoding.values import UNAVAILABLE, stream_converter, text_converter, type_family
from tributary.capture.decoding.wal2json import Change, LogicalMessage, Truncate
from tributary.capture.records.routing import Routing, table_topic
from tributary.capture.records.rules import TableRules

__all__ = [
    "CONNECTOR",
    "SNAPSHOT_MARKERS",
    "Output",
    "SnapshotEncoder",
    "envelopes_for",
    "message_envelope",
    "snapshot_envelope",
    "stream_row",
    "text_row",
    "toastable",
    "truncate_envelope",
]

CONNECTOR = "tributary"
# `source.snapshot` of snapshot reads: "true", the snapshot's last row "last"; under the Debezium
# envelope also Debezium's first-row and per-table marks (capture/records/debezium.py).
SNAPSHOT_MARKERS = ("true", "last", "first", "first_in_data_collection", "last_in_data_collection")
VERSION = "0.1.0"
_SORTED = orjson.OPT_SORT_KEYS


@dataclass(slots=True)  # not frozen: a frozen dataclass's __init__ is slower, and this is the hot path
class Output:
    topic: str
    key: bytes | None
    value: bytes | None
    headers: bytes | None = None
    timestamp_ms: int | None = None  # None: the source transaction's commit time


def _source(
    source_name: str,
    db: str,
    schema: str,
    table: str,
    lsn: Lsn | int | None,
    tx_id: int | None,
    ts_ms: int | None,
    snapshot: str,
) -> dict[str, Any]:
    return {
        "connector": CONNECTOR,
        "version": VERSION,
        "name": source_name,
        "db": db,
        "schema": schema,
        "table": table,
        "lsn": None if lsn is None else int(lsn),
        "txId": tx_id,
        "ts_ms": ts_ms,
        "snapshot": snapshot,
    }


def stream_row(columns: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """wal2json's column dicts → {name: envelope value}."""
    return _row(columns)


def text_row(columns: Sequence[tuple[str, str, int]], values: Sequence[str | None]) -> dict[str, Any]:
    """A snapshot row (PostgreSQL text) → {name: envelope value}, equal to the streamed form."""
    after = {}
    for (name, type_name, _), value in zip(columns, values, strict=True):
        conv = text_converter(type_name)
        after[name] = value if conv is None or value is None else conv(value)
    return after


_CONVERTERS: dict[str, Any] = {}  # type name -> stream converter (None = as is): one dict probe per column


def _row(columns: Sequence[dict[str, Any]]) -> dict[str, Any]:
    # The per-column hot loop of capture: no function call unless the value needs converting.
    row = {}
    convs = _CONVERTERS
    for c in columns:
        type_name = c["type"]
        try:
            conv = convs[type_name]
        except KeyError:
            conv = convs[type_name] = stream_converter(type_name)
        value = c.get("value")
        row[c["name"]] = value if conv is None else conv(value)
    return row


def _lsn(text: str | None, default: Lsn | None) -> int | Lsn | None:
    """A change's own LSN text as an int (what `source.lsn` carries), without building an Lsn."""
    if not text:
        return default
    hi, _, lo = text.partition("/")
    return (int(hi, 16) << 32) | int(lo, 16)


def _key(row: dict[str, Any], key_columns: Sequence[str], field: tuple[str, str] | None = None) -> bytes:
    """The key: the key columns (or the whole row), and the routing key field when the table's
    topic is shared (capture/records/routing.py)."""
    if field is not None:
        return _routed_key(row, key_columns, field)
    if key_columns:
        return orjson.dumps({k: row.get(k) for k in key_columns}, option=_SORTED)
    return orjson.dumps(row, option=_SORTED)  # no key at all: the whole row (init warns)


def _routed_key(row: dict[str, Any], key_columns: Sequence[str], field: tuple[str, str]) -> bytes:
    key = {k: row.get(k) for k in key_columns} if key_columns else dict(row)
    key[field[0]] = field[1]
    return orjson.dumps(key, option=_SORTED)


def _value(before: Any, after: Any, source: dict[str, Any], op: str, now_ms: int) -> bytes:
    return orjson.dumps({"before": before, "after": after, "source": source, "op": op, "ts_ms": now_ms})


_HEADS: dict[tuple[str, str, str, str], bytes] = {}  # the `source` block up to "lsn", per table
_NULL = b"null"
_OPS = {op: b',"op":"%s","ts_ms":' % op.encode() for op in "cud"}


def _source_json(
    source_name: str, db: str, schema: str, table: str, lsn: int | None, tx_id: int | None, ts_ms: int | None
) -> bytes:
    """`orjson.dumps(_source(…, snapshot="false"))`, with the part that names the table serialised
    once per table: a streamed change's envelope is the hot path (tests check the bytes are equal)."""
    head = _HEADS.get((source_name, db, schema, table))
    if head is None:
        if len(_HEADS) >= 4096:
            _HEADS.clear()
        fixed = _source(source_name, db, schema, table, None, None, None, "false")
        named = {k: v for k, v in fixed.items() if k not in ("lsn", "txId", "ts_ms", "snapshot")}
        head = _HEADS[(source_name, db, schema, table)] = orjson.dumps(named)[:-1] + b',"lsn":'
    return b'%b%b,"txId":%b,"ts_ms":%b,"snapshot":"false"}' % (
        head,
        _NULL if lsn is None else b"%d" % lsn,
        _NULL if tx_id is None else b"%d" % tx_id,
        _NULL if ts_ms is None else b"%d" % ts_ms,
    )


def _stream_value(before: Any, after: Any, source: bytes, op: str, now_ms: int) -> bytes:
    """`_value(before, after, source-dict, op, now_ms)` around an already serialised `source`."""
    return b'{"before":%b,"after":%b,"source":%b%b%d}' % (
        _NULL if before is None else orjson.dumps(before),
        _NULL if after is None else orjson.dumps(after),
        source,
        _OPS[op],
        now_ms,
    )


def envelopes_for(
    change: Change,
    *,
    source_name: str,
    db: str,
    lsn: Lsn | None,
    tx_id: int | None,
    commit_ts_ms: int | None,
    now_ms: int,
    known_columns: Sequence[tuple[str, str, int]] | None = None,
    key_columns: Sequence[str] | None = None,
    rules: TableRules | None = None,
    routing: Routing | None = None,
) -> list[Output]:
    """The records one streamed change becomes, in order.

    `known_columns`: the table's current columns (name, type, oid), so that an UPDATE's
    missing columns can be told apart as unchanged TOAST values (trap 3). `key_columns`: the
    table's key (capture/database/source_tables.py) when the change names no primary key: the replica identity
    index's columns, or () for the whole row. `rules`: the table's column and row rules
    (capture/records/rules.py), if it has any. `routing`: the source's routes (topic, key field).
    """
    topic, field = table_topic(routing, source_name, change.schema, change.table)
    change_lsn = _lsn(change.lsn_text, lsn)
    source = _source_json(
        source_name,
        db,
        change.schema,
        change.table,
        None if change_lsn is None else int(change_lsn),
        tx_id,
        commit_ts_ms,
    )
    keys = change.pk or tuple(key_columns or ())
    if rules is not None:
        return _ruled_envelopes(change, rules, topic, source, keys, known_columns, now_ms, field)
    if change.action == "I":
        after = _row(change.raw_columns)
        return [Output(topic, _key(after, keys, field), _stream_value(None, after, source, "c", now_ms))]
    old = _row(change.raw_identity) if change.raw_identity else None
    if change.action == "D":
        before = old or {}
        key = _key(before, keys or tuple(before), field)
        return [Output(topic, key, _stream_value(old, None, source, "d", now_ms)), Output(topic, key, None)]
    after = _row(change.raw_columns)
    _fill_unchanged_toast(after, change, known_columns, old)
    new_key = _key(after, keys, field)
    whole_old = not keys and old is not None  # keyed by the whole row: FULL sent the old one
    if old is not None and (whole_old or (keys and all(k in old for k in keys))):
        old_key = _key(old, keys, field)
        if old_key != new_key:  # the key changed (any column, for a whole-row key): delete the old, create the new
            return [
                Output(topic, old_key, _stream_value(old, None, source, "d", now_ms)),
                Output(topic, old_key, None),
                Output(topic, new_key, _stream_value(None, after, source, "c", now_ms)),
            ]
    full_old = old if old is not None and len(old) > len(keys) else None  # a whole old row (FULL)
    return [Output(topic, new_key, _stream_value(full_old, after, source, "u", now_ms))]


def _ruled_envelopes(
    change: Change,
    rules: TableRules,
    topic: str,
    source: bytes,
    keys: tuple[str, ...],
    known: Sequence[tuple[str, str, int]] | None,
    now_ms: int,
    field: tuple[str, str] | None = None,
) -> list[Output]:
    """`envelopes_for` of a table with rules: rows outside its filter are not captured (an UPDATE
    that moves a row out is a delete of its key, one that moves it in a create), and every row is
    `rules.apply`'d before its key is taken. When the old row is not known to be out of the filter
    (wal2json sent only its key), an UPDATE out of it or a DELETE is a delete: never a row kept."""
    if change.action == "I":
        after = _row(change.raw_columns)
        if not rules.keeps(after):
            return []
        after = rules.apply(after)
        return [Output(topic, _key(after, keys, field), _stream_value(None, after, source, "c", now_ms))]
    old = _row(change.raw_identity) if change.raw_identity else None
    old_in = rules.keeps_old(old)
    shown_old = rules.apply(old) if old is not None else None
    if change.action == "D":
        if old_in is False:
            return []
        before = shown_old or {}
        key = _key(before, keys or tuple(before), field)
        return [Output(topic, key, _stream_value(shown_old, None, source, "d", now_ms)), Output(topic, key, None)]
    after = _row(change.raw_columns)
    _fill_unchanged_toast(after, change, known, old)
    new_in = rules.keeps(after)
    shown = rules.apply(after)
    new_key = _key(shown, keys, field)
    old_key = new_key
    if old is not None and shown_old is not None and ((not keys) or all(k in old for k in keys)):
        old_key = _key(shown_old, keys, field)
    moved = old_key != new_key
    out = []
    if old_in is not False and (moved or not new_in):
        before = shown_old if shown_old is not None else {k: shown.get(k) for k in keys}
        out += [Output(topic, old_key, _stream_value(before, None, source, "d", now_ms)), Output(topic, old_key, None)]
    if new_in and (old_in is False or moved):
        out.append(Output(topic, new_key, _stream_value(None, shown, source, "c", now_ms)))
    elif new_in:
        full_old = shown_old if old is not None and len(old) > len(keys) else None
        out.append(Output(topic, new_key, _stream_value(full_old, shown, source, "u", now_ms)))
    return out


_FIXED_WIDTH = frozenset(
    ("date", "uuid", "time", "time without time zone", "time with time zone", "timetz", "interval", "money")
    + ("oid", "xid", "cid", "tid", "pg_lsn", "point", "macaddr", "macaddr8", '"char"')
)


@functools.lru_cache(maxsize=1024)
def toastable(type_name: str) -> bool:
    """Can a value of this type be stored out of line (a varlena), so that an UPDATE may omit it?
    Fixed-width types never are: such a column missing from an UPDATE does not exist there."""
    if type_family(type_name) in ("int", "float", "bool", "tstz", "ts"):
        return False
    return type_name.split("(", 1)[0].strip() not in _FIXED_WIDTH


def _fill_unchanged_toast(
    after: dict[str, Any], change: Change, known: Sequence[tuple[str, str, int]] | None, old: dict[str, Any] | None
) -> None:
    """Columns the table has but the UPDATE omitted were unchanged TOASTed values: take the old
    value when REPLICA IDENTITY FULL sent it, else mark them unavailable — never null."""
    if not known:
        return
    for name, type_name, _ in known:
        if name in after:
            continue
        if not toastable(type_name):
            continue  # fixed-width types are never TOASTed: the column was dropped, not omitted
        after[name] = old[name] if old is not None and name in old and old[name] is not None else UNAVAILABLE


class SnapshotEncoder:
    """`op: "r"` records for one table's snapshot rows (values are PostgreSQL text).

    Everything that is the same for every row — converters, the key columns, the `source`
    block — is worked out once per table: the snapshot is a hot loop over millions of rows."""

    def __init__(
        self,
        *,
        schema: str,
        table: str,
        columns: Sequence[tuple[str, str, int]],
        primary_key: Sequence[str],
        source_name: str,
        db: str,
        lsn: Lsn,
        now_ms: int,
        rules: TableRules | None = None,
        routing: Routing | None = None,
    ) -> None:
        """`rules`: the table's column and row rules (capture/records/rules.py): `encode` applies
        them (None for a row outside the filter); the paths that skip `encode` are not taken.
        `routing`: the source's routes (the topic, and the key field of a routed table)."""
        self.topic, self.key_field = table_topic(routing, source_name, schema, table)
        self.rules = rules
        self._names = [c[0] for c in columns]
        self._convs = [text_converter(c[1]) for c in columns]
        self._keys = tuple(primary_key)
        self._now_ms = now_ms
        self._sources = {
            marker: _source(source_name, db, schema, table, lsn, None, now_ms, marker) for marker in SNAPSHOT_MARKERS
        }
        # Everything after "after" is the same for every row of the table: serialised once. The
        # bytes equal `_value(None, after, source, "r", now_ms)` (tests/unit/capture checks).
        self._tails = {
            marker: b',"source":' + orjson.dumps(source) + b',"op":"r","ts_ms":' + str(now_ms).encode() + b"}"
            for marker, source in self._sources.items()
        }

    def encode_json(self, key: bytes, after: bytes, marker: str = "true") -> Output:
        """The record from PostgreSQL-built JSON (SnapshotReader.json_rows): no per-value Python."""
        return Output(self.topic, key, self.value_json(after, marker))

    def value_json(self, after: bytes, marker: str = "true") -> bytes:
        return b'{"before":null,"after":' + after + self._tails[marker]

    def tail(self, marker: str = "true") -> bytes:
        """What follows the `after` object in every record of this table: `,"source":…}`."""
        return self._tails[marker]

    def row(self, values: Sequence[str | None]) -> dict[str, Any]:
        return {
            name: value if conv is None or value is None else conv(value)
            for name, conv, value in zip(self._names, self._convs, values, strict=True)
        }

    def encode(self, values: Sequence[str | None], marker: str = "true") -> Output:
        """The row's record (of a table with rules: one its filter keeps, `encode_ruled`)."""
        out = self.encode_ruled(values, marker)
        if out is None:
            raise ValueError("a row outside its table's filter has no record")
        return out

    def encode_ruled(self, values: Sequence[str | None], marker: str = "true") -> Output | None:
        """`encode`, or None for a row its table's row filter leaves out."""
        after = self.row(values)
        if self.rules is not None:
            if not self.rules.keeps(after):
                return None
            after = self.rules.apply(after)
        value = b'{"before":null,"after":' + orjson.dumps(after) + self._tails[marker]
        return Output(self.topic, _key(after, self._keys, self.key_field), value)


def snapshot_envelope(
    *,
    schema: str,
    table: str,
    columns: Sequence[tuple[str, str, int]],
    values: Sequence[str | None],
    primary_key: Sequence[str],
    source_name: str,
    db: str,
    lsn: Lsn,
    snapshot: str,
    now_ms: int,
) -> list[Output]:
    """An `op: "r"` record for one row read by the snapshot (values are PostgreSQL text)."""
    encoder = SnapshotEncoder(
        schema=schema,
        table=table,
        columns=columns,
        primary_key=primary_key,
        source_name=source_name,
        db=db,
        lsn=lsn,
        now_ms=now_ms,
    )
    return [encoder.encode(values, snapshot)]


def truncate_envelope(
    truncate: Truncate,
    *,
    source_name: str,
    db: str,
    lsn: Lsn | None,
    tx_id: int | None,
    commit_ts_ms: int | None,
    now_ms: int,
    routing: Routing | None = None,
) -> list[Output]:
    """`op: "t"`, key None: the caller writes it to every partition of the table's topic."""
    source = _source(
        source_name, db, truncate.schema, truncate.table, truncate.lsn or lsn, tx_id, commit_ts_ms, "false"
    )
    return [
        Output(
            table_topic(routing, source_name, truncate.schema, truncate.table)[0],
            None,
            _value(None, None, source, "t", now_ms),
        )
    ]


def message_envelope(
    message: LogicalMessage,
    *,
    source_name: str,
    db: str,
    lsn: Lsn | None,
    tx_id: int | None,
    commit_ts_ms: int | None,
    now_ms: int,
) -> list[Output]:
    """`pg_logical_emit_message` → `<source>.messages`, key = the prefix."""
    source = _source(
        source_name, db, "", "", message.lsn or lsn, tx_id if message.transactional else None, commit_ts_ms, "false"
    )
    value = orjson.dumps(
        {
            "prefix": message.prefix,
            "content": message.content,
            "transactional": message.transactional,
            "source": source,
            "op": "m",
            "ts_ms": now_ms,
        }
    )
    return [Output(f"{source_name}.messages", orjson.dumps(message.prefix), value)]
