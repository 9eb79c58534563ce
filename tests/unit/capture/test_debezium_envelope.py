"""`envelope = "debezium"`: tributary's records rewritten as Debezium's PostgreSQL connector writes them
(docs/envelope.md, "A Debezium consumer"). The expected values are what Debezium 3.6.1 wrote for the
same data in tests/integration/kafka/test_debezium_oracle.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from tributary.capture.records.debezium import (
    DebeziumRewriter,
    canonical_key,
    connect_field,
    debezium_value,
    snapshot_marker,
)
from tributary.capture.records.schema_tracker import SchemaTracker
from tributary.capture.records.staging import Staged, Staging
from tributary.log.local import Log

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("type_name", "ours", "theirs"),
    [
        ("timestamp with time zone", "2024-01-02T01:04:05.5Z", "2024-01-02T01:04:05.500000Z"),
        ("timestamp with time zone", "2024-06-30T12:00:00Z", "2024-06-30T12:00:00.000000Z"),
        ("timestamp without time zone", "2024-01-02T03:04:05.123456", "2024-01-02T03:04:05.123456Z"),
        ("timestamp(0) without time zone", "2024-01-02T03:04:05", "2024-01-02T03:04:05Z"),
        ("date", "1970-01-01", "1970-01-01Z"),
        ("time without time zone", "23:59:59.999999", "23:59:59.999999Z"),
        ("time with time zone", "03:04:05+02", "01:04:05Z"),
        ("time with time zone", "00:00:00-05:30", "05:30:00Z"),
        ("interval", "1 year 2 mons 3 days 04:05:06.789", "P1Y2M3DT4H5M6.789S"),
        ("interval", "-1 days +00:00:01", "P0Y0M-1DT0H0M1S"),
        ("numeric", "NaN", "NAN"),
        ("numeric", "1.50", "1.50"),
        ("jsonb", {"a": [1, 2], "b": 1}, '{"a": [1, 2], "b": 1}'),
        ("jsonb", {"n": 12345678901234567890}, '{"n": 12345678901234567890}'),
        ("json", [1, "x", None], '[1, "x", null]'),
        ("jsonb[]", [{"a": 1}], ['{"a": 1}']),
        ("date[]", ["2024-01-02"], ["2024-01-02Z"]),
        ("timestamp with time zone[]", ["2024-01-02T03:04:05Z"], ["2024-01-02T03:04:05.000000Z"]),
        ("bit(4)", "1010", "Cg=="),
        ("bit(4)", "0001", "AQ=="),
        ("bit(1)", "1", True),
        ("money", "$12.34", "12.34"),
        ("money", "-$1,000.50", "-1000.50"),
        ("integer", 7, 7),
        ("text", "x", "x"),
        ("date", None, None),
    ],
)
def test_values_take_debeziums_form(type_name: str, ours: Any, theirs: Any) -> None:
    assert debezium_value(type_name, ours) == theirs


def test_columns_get_debeziums_connect_types() -> None:
    assert connect_field("i", "integer", optional=False) == {"type": "int32", "optional": False, "field": "i"}
    assert connect_field("b", "bigint")["type"] == "int64"
    assert connect_field("ts", "timestamp(0) without time zone")["name"] == "io.debezium.time.IsoTimestamp"
    assert connect_field("j", "jsonb")["name"] == "io.debezium.data.Json"
    assert connect_field("a", "integer[]")["items"] == {"type": "int32", "optional": True}
    assert connect_field("r", "real")["type"] == "float" and connect_field("d", "double precision")["type"] == "double"


def _schema_record(key: tuple[str, ...]) -> Staged:
    columns = [("b", "integer", 23), ("a", "integer", 23), ("note", "text", 25), ("doc", "jsonb", 3802)]
    record = SchemaTracker().observe("shop", "public", "t_pair", columns, complete=True, key=key)
    assert record is not None
    return (record.key, record.value, 1, None)


def _change(op: str, before: Any, after: Any) -> bytes:
    source: dict[str, Any] = {"connector": "tributary", "version": "0.1.0", "name": "shop", "db": "d"}
    source["schema"] = "public"
    source |= {"table": "t_pair", "lsn": 5, "txId": 9, "ts_ms": 2, "snapshot": "false"}
    return orjson.dumps({"before": before, "after": after, "source": source, "op": op, "ts_ms": 3})


def test_a_partitions_records_become_debeziums_with_schemas() -> None:
    key = b'{"a":1,"b":2}'  # tributary's: sorted by name
    records = [
        _schema_record(("b", "a")),
        (key, _change("c", None, {"b": 2, "a": 1, "note": "n", "doc": {"z": True}}), 1, None),
        (key, _change("d", {"b": 2, "a": 1}, None), 1, None),  # REPLICA IDENTITY DEFAULT: the old key only
        (key, None, 1, None),
    ]
    out = DebeziumRewriter().rewrite("shop.public.t_pair", 0, records)
    assert len(out) == 3  # the schema record is taken in, not written
    create, delete, tombstone = out
    assert create[0] is not None and create[1] is not None and delete[1] is not None
    created_key = orjson.loads(create[0])
    assert create[0].endswith(b',"payload":{"b":2,"a":1}}')  # primary-key order
    assert created_key["schema"]["name"] == "shop.public.t_pair.Key"
    value = orjson.loads(create[1])
    assert value["schema"]["name"] == "shop.public.t_pair.Envelope"
    payload = value["payload"]
    assert payload["after"] == {"b": 2, "a": 1, "note": "n", "doc": '{"z": true}'}
    assert payload["source"]["connector"] == "postgresql" and payload["source"]["version"] == "3.6.1.Final"
    assert orjson.loads(delete[1])["payload"]["before"] == {"b": 2, "a": 1, "note": None, "doc": None}
    assert tombstone[0] == create[0] and tombstone[1] is None


def _rewritten_create(extra: dict[str, Any]) -> dict[str, Any]:
    """A create of t_pair, with `extra` top-level fields, as the Debezium rewriter writes it."""
    change = orjson.loads(_change("c", None, {"b": 2, "a": 1, "note": "n", "doc": None})) | extra
    records = [_schema_record(("b", "a")), (b'{"a":1,"b":2}', orjson.dumps(change), 1, None)]
    [(_, value, _, _)] = DebeziumRewriter().rewrite("shop.public.t_pair", 0, records)
    return dict(orjson.loads(value or b""))


def test_a_changes_transaction_block_is_kept_with_debeziums_schema_for_it() -> None:
    block = {"id": "9:5", "total_order": 2, "data_collection_order": 1}
    plain, doc = _rewritten_create({}), _rewritten_create({"transaction": block})
    assert doc["payload"]["transaction"] == block and "transaction" not in plain["payload"]
    fields = doc["schema"]["fields"]
    assert fields[:-1] == plain["schema"]["fields"]
    assert fields[-1]["field"] == "transaction" and fields[-1]["name"] == "event.block"
    assert [f["field"] for f in fields[-1]["fields"]] == ["id", "total_order", "data_collection_order"]


def test_each_partition_keeps_the_shape_its_own_schema_record_gave() -> None:
    rewriter = DebeziumRewriter()
    rewriter.rewrite("shop.public.t_pair", 0, [_schema_record(("b", "a"))])
    rewriter.rewrite("shop.public.t_pair", 1, [_schema_record(("a", "b"))])
    change = (b'{"a":1,"b":2}', _change("c", None, {"b": 2, "a": 1, "note": None, "doc": None}), 1, None)
    [(key0, *_)] = rewriter.rewrite("shop.public.t_pair", 0, [change])
    [(key2, *_)] = rewriter.rewrite("shop.public.t_pair", 2, [change])  # none seen there yet: the topic's last
    assert key0 is not None and key0.endswith(b'"payload":{"b":2,"a":1}}')
    assert key2 is not None and key2.endswith(b'"payload":{"a":1,"b":2}}')


def test_records_of_topics_without_a_schema_pass_as_they_are() -> None:
    message = (b'"prefix"', b'{"prefix":"prefix","op":"m"}', 1, None)
    assert DebeziumRewriter().rewrite("shop.messages", 0, [message]) == [message]


def test_a_truncate_of_a_table_not_announced_in_this_run_is_debeziums_too() -> None:
    truncate = (None, _change("t", None, None), 1, None)  # capture stages it on every partition
    rewriter = DebeziumRewriter()
    assert rewriter.rewrite("shop.public.t_pair", 1, [truncate]) == []  # one record, as Debezium writes it
    [(key, value, _, _)] = rewriter.rewrite("shop.public.t_pair", 0, [truncate])
    assert key is not None and orjson.loads(key) == {"schema": None, "payload": None}  # JsonConverter's null
    assert value is not None
    doc = orjson.loads(value)
    assert doc["schema"]["name"] == "shop.public.t_pair.Envelope"
    assert doc["payload"]["op"] == "t" and doc["payload"]["source"]["connector"] == "postgresql"


@pytest.mark.parametrize(
    ("type_name", "value"),
    [
        ("integer", 7),
        ("text", "a b"),
        ("uuid", "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"),
        ("numeric", "NaN"),
        ("numeric", "1.50"),
        ("date", "2024-01-02"),
        ("timestamp without time zone", "2024-01-02T03:04:05.123"),
        ("timestamp with time zone", "2024-01-02T01:04:05.5Z"),
        ("timestamp with time zone", "2024-06-30T12:00:00Z"),
        ("time with time zone", "03:04:05+02"),  # kept as tributary spells it: its offset cannot come back
        ("interval", "1 day"),
        ("money", "$1.00"),
        ("jsonb", {"a": 1}),
    ],
)
def test_a_rewritten_key_goes_back_to_the_key_capture_computes(type_name: str, value: Any) -> None:
    """A re-snapshot's key check compares the log's keys with the table's, as capture keys them."""
    columns = [("k", type_name, 0), ("n", "integer", 23)]
    record = SchemaTracker().observe("shop", "public", "t", columns, complete=True, key=("n", "k"))
    assert record is not None
    ours = orjson.dumps({"k": value, "n": 1}, option=orjson.OPT_SORT_KEYS)
    change = (ours, _change("c", None, {"k": value, "n": 1}), 1, None)
    [(key, *_)] = DebeziumRewriter().rewrite("shop.public.t", 0, [(record.key, record.value, 1, None), change])
    assert key is not None
    assert canonical_key(key) == ours


def test_live_keys_come_back_as_capture_keys_them(tmp_path: Path) -> None:
    """The real log: keys written rewritten, read back (`Staging.live_keys`) as capture computed them."""
    with Log.open(tmp_path / "log", writer=True, default_partitions=2) as log:
        staging = Staging(log, partitions=2, rewrite=DebeziumRewriter().rewrite, key_back=canonical_key)
        schema = _schema_record(("b", "a"))
        assert schema[0] is not None and schema[1] is not None
        staging.to_all_partitions("shop.public.t_pair", schema[0], schema[1], 1)
        for a in (1, 2):
            after = {"b": 2, "a": a, "note": None, "doc": None}
            key = orjson.dumps({"a": a, "b": 2}, option=orjson.OPT_SORT_KEYS)
            staging.stage_record("shop.public.t_pair", key, _change("c", None, after), 1)
        staging.flush()
        log.commit(upto=log.mark())
        assert all(b'"payload"' in k for k in log.live_keys("shop.public.t_pair"))
        assert staging.live_keys("shop.public.t_pair") == {b'{"a":1,"b":2}', b'{"a":2,"b":2}'}


def _marks(tables: list[int]) -> list[str]:
    """The markers of a snapshot whose tables hold these many rows, one row per unit, in order."""
    rows = [(t, i) for t, n in enumerate(tables) for i in range(n)]
    return [
        snapshot_marker(
            first=at == 0,
            last=at == len(rows) - 1,
            first_in_table=i == 0,
            last_in_table=i == tables[t] - 1,
        )
        for at, (t, i) in enumerate(rows)
    ]


def test_snapshot_rows_are_marked_as_debeziums_relational_snapshot_marks_them() -> None:
    assert _marks([3, 2, 3]) == [
        "first",
        "true",
        "last_in_data_collection",
        "first_in_data_collection",
        "last_in_data_collection",
        "first_in_data_collection",
        "true",
        "last",
    ]
    assert _marks([1, 1, 1]) == ["first", "last_in_data_collection", "last"]  # a one-row table's row is its last
    assert _marks([1]) == ["last"]
