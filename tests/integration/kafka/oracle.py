"""Pairing tributary's change records with Debezium's and naming every difference. Pure.

A change is paired with the other side's change of the same table, key and op, in log order (on each
side a key's records stay in one partition). For each pair the key,
`before`, `after` and the `source` fields both carry are compared; a difference is
`(field, type, ours, theirs)` with values as compact JSON, so equal findings collapse into one row
of the table the test asserts.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any, NamedTuple

import orjson

from tests.integration.kafka.helpers import Seen

__all__ = ["EXPECTED", "EXPECTED_DEBEZIUM", "Change", "Difference", "Expected", "changes_of", "diff", "render_table"]

TOMBSTONE = "tombstone"
ABSENT = "(absent)"
SHARED_SOURCE = ("name", "db", "schema", "table", "connector", "version", "snapshot", "lsn", "txId", "ts_ms")


class Difference(NamedTuple):
    """One kind of difference: where (`field`), for what (`type`: a column's type, an op, a table),
    and what each side wrote."""

    field: str
    type: str
    ours: str
    theirs: str


class Expected(NamedTuple):
    """A difference the comparison finds, and why it stays: the Debezium setting closest to ours, or
    the reason the two cannot agree."""

    field: str
    type: str
    ours: str
    theirs: str
    why: str

    @property
    def difference(self) -> Difference:
        return Difference(self.field, self.type, self.ours, self.theirs)


@dataclass(frozen=True)
class Change:
    """One record of a table's topic, schema records left out."""

    table: str
    key: Any  # the parsed key (None for a truncate)
    key_bytes: bytes | None
    op: str  # c u d r t, or "tombstone"
    value: dict[str, Any] | None


def changes_of(seen: list[Seen], prefix: str) -> list[Change]:
    """Records read from `<prefix>.<schema>.<table>` topics → changes in log order per partition."""
    out = []
    for topic, _partition, _offset, key, value, _headers, _ts in sorted(seen, key=lambda s: (s[0], s[1], s[2])):
        parsed_key = orjson.loads(key) if key else None  # a truncate: no key (an empty one on Kafka)
        if isinstance(parsed_key, dict) and "__schema__" in parsed_key:
            continue
        doc = None if value is None else orjson.loads(value)
        if isinstance(parsed_key, dict) and _with_schema(parsed_key):  # JSON with schemas: the payload is the record
            parsed_key = parsed_key["payload"]
            key = None if parsed_key is None else orjson.dumps(parsed_key)  # JsonConverter's null key
        if isinstance(doc, dict) and _with_schema(doc):
            doc = doc["payload"]
        op = TOMBSTONE if doc is None else doc["op"]
        out.append(Change(topic.removeprefix(prefix + ".").split(".", 1)[1], parsed_key, key, op, doc))
    return out


def _with_schema(doc: dict[str, Any]) -> bool:
    """Kafka's JsonConverter with `schemas.enable=true` (`envelope = "debezium"`): `{"schema", "payload"}`."""
    return set(doc) == {"schema", "payload"}


def _json(value: Any) -> str:
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()


def _group(changes: list[Change]) -> dict[tuple[str, str, str], list[Change]]:
    groups: dict[tuple[str, str, str], list[Change]] = defaultdict(list)
    for change in changes:
        groups[(change.table, _json(change.key), change.op)].append(change)
    return groups


def diff(ours: list[Change], theirs: list[Change], types: dict[tuple[str, str], str]) -> list[tuple[str, Difference]]:
    """Every difference between the two sides, each with the table and key it was seen at."""
    found: list[tuple[str, Difference]] = []
    mine, other = _group(ours), _group(theirs)
    for ident in sorted(set(mine) | set(other)):
        table, key, op = ident
        a, b = mine.get(ident, []), other.get(ident, [])
        where = f"{table} {key}"
        if len(a) != len(b):
            found.append((where, Difference("records per change", op, str(len(a)), str(len(b)))))
        for x, y in zip(a, b, strict=False):
            found.extend((where, d) for d in _pair(x, y, types))
    return found


# `source` fields whose values differ between any two snapshots (each side reads its own, at its own
# slot's point): a difference there is named by the kinds of the values, not the values.
_PER_SNAPSHOT = ("lsn", "txId", "ts_ms")
# `source` fields that name the writer: one row for every op.
_WRITER = ("connector", "version")


def _pair(ours: Change, theirs: Change, types: dict[tuple[str, str], str]) -> list[Difference]:
    out = []
    if ours.key_bytes != theirs.key_bytes:
        out.append(_key_difference(ours, theirs))
    if ours.value is None or theirs.value is None:
        return out
    for side in ("before", "after"):
        out.extend(_rows(side, ours.op, ours.value.get(side), theirs.value.get(side), ours.table, types))
    mine, other = ours.value["source"], theirs.value["source"]
    for name in SHARED_SOURCE:
        a, b = _json(mine.get(name)), _json(other.get(name))
        if a == b:
            continue
        if name in _WRITER:
            out.append(Difference(f"source.{name}", "every op", a, b))
        elif name in _PER_SNAPSHOT and ours.op == "r":
            out.append(Difference(f"source.{name}", "r", _kind(mine.get(name)), _kind(other.get(name))))
        else:
            out.append(Difference(f"source.{name}", ours.op, a, b))
    return out


def _kind(value: Any) -> str:
    """A per-snapshot value by its kind: `null`, or the JSON type (both sides' numbers differ)."""
    return "null" if value is None else f"<{type(value).__name__}>"


def _key_difference(ours: Change, theirs: Change) -> Difference:
    """Keys equal as objects but not as bytes are told by their column order; other keys by value."""
    if ours.key != theirs.key or not isinstance(ours.key, dict):
        return Difference("key", ours.op, _raw(ours.key_bytes), _raw(theirs.key_bytes))
    order = list(ours.key) == sorted(ours.key), list(theirs.key) == sorted(theirs.key)
    names = {True: "columns sorted by name", False: "columns in primary-key order"}
    return Difference("key bytes", "composite primary key", names[order[0]], names[order[1]])


def _raw(key: bytes | None) -> str:
    """A key as text: `null` for none, `(empty)` for zero bytes."""
    if key is None:
        return "null"
    return key.decode() or "(empty)"


def _rows(side: str, op: str, mine: Any, other: Any, table: str, types: dict[tuple[str, str], str]) -> list[Difference]:
    """Column by column; a column only one side carries is `(absent)` on the other."""
    if mine is None or other is None:
        a, b = _json(mine), _json(other)
        return [] if a == b else [Difference(side, op, a, b)]
    out = []
    for column in sorted(set(mine) | set(other)):
        a = _json(mine[column]) if column in mine else ABSENT
        b = _json(other[column]) if column in other else ABSENT
        if a == b:
            continue
        if side == "before" and op == "d" and ABSENT in (a, b):
            out.append(Difference("before of a delete", "non-key column (identity default)", a, b))
        else:
            out.append(Difference("value", types.get((table, column), "?"), a, b))
    return out


def render_table(rows: list[Expected]) -> str:
    """The expected differences as the Markdown table docs/envelope.md holds."""
    lines = ["| field | type | tributary | Debezium | why |", "| --- | --- | --- | --- | --- |"]
    lines += [f"| {e.field} | {e.type} | {_cell(e.ours)} | {_cell(e.theirs)} | {e.why} |" for e in rows]
    return "\n".join(lines)


def _cell(value: str) -> str:
    return "`" + value.replace("|", "\\|") + "`"


_SNAPSHOT_MARKS = (
    "Debezium also marks the snapshot's first row and each table's first and last; tributary marks only"
    " the snapshot's last row (`last`); the two read the tables in different orders"
)
_ISO = (
    "`time.precision.mode=isostring` (the closest) writes zone-less values with a `Z`; tributary leaves them zone-less"
)
_JSON = "Debezium's `io.debezium.data.Json` is a string holding the JSON text; tributary embeds the JSON (no setting)"
_WAL2JSON_NAN = "wal2json 2.5 sends numeric NaN/±Infinity as null (pgoutput sends the text); tributary warns"
_FLOAT = "JSON has no NaN/Infinity: tributary writes null, Kafka's JsonConverter a string"
_INTERVAL = "`interval.handling.mode=string` gives ISO-8601 durations; tributary keeps PostgreSQL's text"

# Every difference the test finds, and why it stays. A row the run does not find fails the test, as
# does a difference no row names. docs/envelope.md ("Compared with Debezium") shows the same table.
EXPECTED: list[Expected] = [
    Expected("source.connector", "every op", '"tributary"', '"postgresql"', "names the writer"),
    Expected("source.version", "every op", '"0.1.0"', '"3.6.1.Final"', "the writer's version"),
    Expected("source.snapshot", "r", '"true"', '"first"', _SNAPSHOT_MARKS),
    Expected("source.snapshot", "r", '"true"', '"first_in_data_collection"', _SNAPSHOT_MARKS),
    Expected("source.snapshot", "r", '"true"', '"last_in_data_collection"', _SNAPSHOT_MARKS),
    Expected("source.snapshot", "r", '"true"', '"last"', _SNAPSHOT_MARKS),
    Expected("source.snapshot", "r", '"last"', '"last_in_data_collection"', _SNAPSHOT_MARKS),
    Expected("source.lsn", "r", "<int>", "<int>", "each reads its own snapshot, at its own slot's point"),
    Expected("source.ts_ms", "r", "<int>", "<int>", "each reads its own snapshot, at its own time"),
    Expected("source.txId", "r", "null", "<int>", "Debezium names its snapshot's transaction; tributary none"),
    Expected(
        "key bytes",
        "composite primary key",
        "columns sorted by name",
        "columns in primary-key order",
        "tributary's keys are canonical JSON (sorted keys), so the same key bytes, hence partition, whoever wrote"
        " the record; equal as JSON objects",
    ),
    Expected(
        "before of a delete",
        "non-key column (identity default)",
        "(absent)",
        "null",
        "under REPLICA IDENTITY DEFAULT the server sends only the old key: Debezium fills the other columns"
        " with null, tributary leaves them out (use REPLICA IDENTITY FULL for the whole old row, on both)",
    ),
    Expected(
        "key", "t", "(empty)", "null", "on Kafka only: a compacted topic refuses a record without a key (docs/kafka.md)"
    ),
    Expected("records per change", "t", "3", "1", "tributary writes a truncate to every partition of the topic"),
    Expected("value", "numeric", '"NaN"', '"NAN"', "Debezium's `decimal.handling.mode=string` spells it `NAN`"),
    Expected("value", "numeric", "null", '"NAN"', _WAL2JSON_NAN),
    Expected("value", "numeric", "null", '"POSITIVE_INFINITY"', _WAL2JSON_NAN),
    Expected("value", "numeric[]", '["NaN"]', "null", "Debezium drops an array holding a numeric NaN"),
    Expected("value", "real", "null", '"NaN"', _FLOAT),
    Expected("value", "real", "null", '"-Infinity"', _FLOAT),
    Expected("value", "double precision", "null", '"Infinity"', _FLOAT),
    Expected(
        "value",
        "integer[]",
        '"{{1,2},{3,4}}"',
        "[null,null]",
        "Debezium loses multi-dimensional arrays; tributary keeps PostgreSQL's text",
    ),
    Expected("value", "double precision[]", "[null]", '["NaN"]', _FLOAT),
    Expected("value", "date[]", '["2024-01-02"]', '["2024-01-02Z"]', _ISO),
    Expected(
        "value",
        "timestamp with time zone[]",
        '["2024-01-02T03:04:05Z"]',
        '["2024-01-02T03:04:05.000000Z"]',
        "the same instant: Debezium always writes six fraction digits, tributary PostgreSQL's (none when zero)",
    ),
    Expected("value", "jsonb[]", '[{"a":1}]', '["{\\"a\\": 1}"]', _JSON),
    Expected("value", "json", '[1,"x",null]', '"[1, \\"x\\", null]"', _JSON),
    Expected("value", "json", '{"a":[1,2],"b":1}', '"{\\"b\\": 1, \\"a\\": [1, 2]}"', _JSON),
    Expected("value", "jsonb", '{"a":[1,2],"b":1}', '"{\\"a\\": [1, 2], \\"b\\": 1}"', _JSON),
    Expected("value", "jsonb", '{"n":12345678901234567890}', '"{\\"n\\": 12345678901234567890}"', _JSON),
    Expected("value", "jsonb", '{"z":true}', '"{\\"z\\": true}"', _JSON),
    Expected("value", "bit(4)", '"1010"', '"Cg=="', "Debezium's `Bits`: little-endian bytes, base64 in JSON"),
    Expected("value", "bit(4)", '"0001"', '"AQ=="', "Debezium's `Bits`: little-endian bytes, base64 in JSON"),
    Expected("value", "money", '"$12.34"', '"12.34"', "tributary keeps PostgreSQL's text (`lc_monetary`)"),
    Expected("value", "money", '"-$0.50"', '"-0.50"', "tributary keeps PostgreSQL's text (`lc_monetary`)"),
    Expected("value", "date", '"2024-01-02"', '"2024-01-02Z"', _ISO),
    Expected("value", "date", '"1970-01-01"', '"1970-01-01Z"', _ISO),
    Expected("value", "time without time zone", '"03:04:05.123456"', '"03:04:05.123456Z"', _ISO),
    Expected("value", "time without time zone", '"23:59:59.999999"', '"23:59:59.999999Z"', _ISO),
    Expected(
        "value", "timestamp without time zone", '"2024-01-02T03:04:05.123456"', '"2024-01-02T03:04:05.123456Z"', _ISO
    ),
    Expected("value", "timestamp without time zone", '"1999-12-31T23:59:59"', '"1999-12-31T23:59:59Z"', _ISO),
    Expected("value", "timestamp(0) without time zone", '"2024-01-02T03:04:05"', '"2024-01-02T03:04:05Z"', _ISO),
    Expected("value", "timestamp(0) without time zone", '"2024-06-30T12:00:00"', '"2024-06-30T12:00:00Z"', _ISO),
    Expected(
        "value",
        "timestamp with time zone",
        '"2024-01-02T01:04:05.5Z"',
        '"2024-01-02T01:04:05.500000Z"',
        "the same instant: Debezium always writes six fraction digits, tributary PostgreSQL's (none when zero)",
    ),
    Expected(
        "value",
        "timestamp with time zone",
        '"2024-06-30T12:00:00Z"',
        '"2024-06-30T12:00:00.000000Z"',
        "the same instant: Debezium always writes six fraction digits, tributary PostgreSQL's (none when zero)",
    ),
    Expected(
        "value",
        "time with time zone",
        '"03:04:05+02"',
        '"01:04:05Z"',
        "Debezium moves the time to UTC; tributary keeps PostgreSQL's text with its offset",
    ),
    Expected(
        "value",
        "time with time zone",
        '"00:00:00-05:30"',
        '"05:30:00Z"',
        "Debezium moves the time to UTC; tributary keeps PostgreSQL's text with its offset",
    ),
    Expected("value", "interval", '"1 year 2 mons 3 days 04:05:06.789"', '"P1Y2M3DT4H5M6.789S"', _INTERVAL),
    Expected("value", "interval", '"-1 days +00:00:01"', '"P0Y0M-1DT0H0M1S"', _INTERVAL),
]

# The same comparison with `envelope = "debezium"`: what still differs, and why.
# Each row is also in EXPECTED (the same reason), or says why the rewriting leaves it.
EXPECTED_DEBEZIUM: list[Expected] = [
    *(e for e in EXPECTED if e.field in ("source.lsn", "source.ts_ms", "source.txId")),
    Expected("value", "numeric", "null", '"NAN"', _WAL2JSON_NAN),
    Expected("value", "numeric", "null", '"POSITIVE_INFINITY"', _WAL2JSON_NAN),
    Expected("value", "numeric[]", '["NAN"]', "null", "Debezium drops an array holding a numeric NaN"),
    Expected("value", "real", "null", '"NaN"', _FLOAT),
    Expected("value", "real", "null", '"-Infinity"', _FLOAT),
    Expected("value", "double precision", "null", '"Infinity"', _FLOAT),
    Expected("value", "double precision[]", "[null]", '["NaN"]', _FLOAT),
    Expected(
        "value",
        "integer[]",
        '"{{1,2},{3,4}}"',
        "[null,null]",
        "Debezium loses multi-dimensional arrays; tributary keeps PostgreSQL's text",
    ),
]

# A chunked snapshot under `envelope = "debezium"` marks rows as the default envelope does (only the
# snapshot's last row is `last`), not as Debezium's blocking snapshot: its rows are read in chunks
# beside the stream, and a table's last row is known only after its last chunk was staged.
EXPECTED_DEBEZIUM_CHUNKED: list[Expected] = [
    *(e for e in EXPECTED if e.field == "source.snapshot"),
    *EXPECTED_DEBEZIUM,
]
