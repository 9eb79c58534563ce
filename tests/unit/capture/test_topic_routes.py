"""Topic routing (`[[sources.routes]]`): tables → topics, the key field, and what `init` refuses. Pure."""

from __future__ import annotations

import re

import orjson
import pytest

from tributary.api.settings.config import RouteSettings, SourceSettings
from tributary.capture.decoding import wal2json
from tributary.capture.decoding.lsn import Lsn
from tributary.capture.records import envelope as env
from tributary.capture.records.routing import KEY_FIELD, Route, Routing, table_keys, topic_problems, without_field

pytestmark = pytest.mark.unit

SHARDS = Routing("shop", [Route(topic="{source}.orders", tables="public.shard_*")])


def test_a_glob_route_sends_its_tables_to_one_topic_and_others_to_their_own() -> None:
    assert SHARDS.resolve("public", "shard_1") == ("shop.orders", (KEY_FIELD, "shop.public.shard_1"))
    assert SHARDS.resolve("public", "shard_22") == ("shop.orders", (KEY_FIELD, "shop.public.shard_22"))
    assert SHARDS.resolve("public", "customers") == ("shop.public.customers", None)
    assert SHARDS.routed("public", "shard_1") and not SHARDS.routed("public", "customers")


def test_a_regex_route_fills_in_its_groups_and_the_first_route_that_takes_a_table_wins() -> None:
    routing = Routing(
        "shop",
        [
            Route(topic="{source}.{schema}.orders_\\1", regex=r"(eu|us)_\d+\.orders"),
            Route(topic="all_orders", regex=r"[a-z_0-9]+\.orders"),
        ],
        key_field="table_id",
    )
    assert routing.resolve("eu_1", "orders") == ("shop.eu_1.orders_eu", ("table_id", "shop.eu_1.orders"))
    assert routing.topic("asia", "orders") == "all_orders"
    assert routing.topic("eu_1", "orders_x") == "shop.eu_1.orders_x"  # a regex takes the whole name only


def test_without_uniqueness_a_routed_tables_key_has_no_key_field() -> None:
    routing = Routing("shop", SHARDS.routes, key_field=None)
    assert routing.resolve("public", "shard_1") == ("shop.orders", None)


def _encoder(routing: Routing | None) -> env.SnapshotEncoder:
    columns = [("id", "integer", 23), ("v", "text", 25)]
    return env.SnapshotEncoder(
        schema="public", table="shard_2", columns=columns, primary_key=["id"], source_name="shop", db="d",
        lsn=Lsn(1), now_ms=5, routing=routing,
    )  # fmt: skip


def test_a_routed_tables_records_carry_the_key_field_and_the_shared_topic() -> None:
    out = _encoder(SHARDS).encode(["1", "a"])
    assert out.topic == "shop.orders"
    assert out.key == b'{"__dbz__physicalTableIdentifier":"shop.public.shard_2","id":1}'
    assert orjson.loads(out.value or b"")["after"] == {"id": 1, "v": "a"}  # the row as it is
    plain = _encoder(None).encode(["1", "a"])
    assert (plain.topic, plain.key) == ("shop.public.shard_2", b'{"id":1}')  # no routing: as before
    assert plain.value == out.value


def test_a_tables_keys_in_a_shared_topic_are_those_its_key_field_names() -> None:
    one = b'{"__dbz__physicalTableIdentifier":"shop.public.shard_1","id":1}'
    two = b'{"__dbz__physicalTableIdentifier":"shop.public.shard_2","id":1}'
    assert table_keys({one, two, b'{"id":1}', b"x"}, (KEY_FIELD, "shop.public.shard_2")) == {two}
    assert table_keys({one, two}, None) == {one, two}
    assert without_field(two, KEY_FIELD) == b'{"id":1}'


def _shape(table: str, key: tuple[str, ...] = ("id",), columns: tuple[str, ...] = ("id", "v")) -> tuple:
    return ("public", table, key, tuple((c, "integer") for c in columns))


def test_init_refuses_tables_that_would_share_a_topic_unsafely() -> None:
    assert topic_problems(SHARDS, [_shape("shard_1"), _shape("shard_2"), _shape("customers")]) == []
    assert topic_problems(SHARDS, [_shape("shard_1"), _shape("shard_2", key=("id", "v"))]) == [
        "public.shard_1 and public.shard_2 cannot share topic shop.orders: their key columns differ"
    ]
    assert topic_problems(SHARDS, [_shape("shard_1"), _shape("shard_2", columns=("id", "v", "w"))]) == [
        "public.shard_1 and public.shard_2 cannot share topic shop.orders: their columns differ"
    ]
    into_a_table = Routing("shop", [Route(topic="shop.public.orders", tables="public.shard_*")])
    assert topic_problems(into_a_table, [_shape("orders"), _shape("shard_1")]) == [
        "public.orders and public.shard_1 cannot share topic shop.public.orders: one of them is not routed, "
        "so its keys lack the key field"
    ]
    bad = Routing("shop", [Route(topic="x" * 300, tables="public.*")])
    assert topic_problems(bad, [_shape("a")]) == [
        f"public.a: routed topic {'x' * 300!r} is not a valid topic name (letters, digits, '.', '_', '-')"
    ]


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"topic": "x"}, "give exactly one of tables (a glob) and regex"),
        ({"tables": "public.a", "regex": "a", "topic": "x"}, "give exactly one of tables (a glob) and regex"),
        ({"regex": "(", "topic": "x"}, "not a regular expression"),
        ({"tables": "public.a", "topic": "a b"}, "must be a topic name"),
        ({"tables": "nodot", "topic": "x"}, "should match pattern"),
    ],
)
def test_a_bad_route_is_refused(entry: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        RouteSettings(**entry)


def test_routes_are_refused_with_the_debezium_envelope() -> None:
    with pytest.raises(ValueError, match="routes are not supported with envelope"):
        SourceSettings(
            name="shop",
            dsn="postgresql://u@h/d",
            envelope="debezium",
            routes=[RouteSettings(tables="public.a", topic="x")],
        )


def test_a_routed_tables_streamed_changes_carry_the_key_field() -> None:
    head = (
        b'{"action":"%s","xid":7,"lsn":"0/1","schema":"public","table":"shard_1","pk":[{"name":"id","type":"integer"}]'
    )
    row = (
        b'[{"name":"id","type":"integer","typeoid":23,"value":%d},{"name":"v","type":"text","typeoid":25,"value":"x"}]'
    )
    context = {"source_name": "shop", "db": "d", "lsn": Lsn(1), "tx_id": 7, "commit_ts_ms": 1, "now_ms": 2}
    key = b'{"__dbz__physicalTableIdentifier":"shop.public.shard_1","id":%d}'
    insert = wal2json.parse_message(head % b"I" + b',"columns":' + row % 1 + b"}")
    assert [(o.topic, o.key) for o in env.envelopes_for(insert, routing=SHARDS, **context)] == [
        ("shop.orders", key % 1)
    ]
    moved = wal2json.parse_message(head % b"U" + b',"columns":' + row % 2 + b',"identity":' + row % 1 + b"}")
    outs = env.envelopes_for(moved, routing=SHARDS, **context)  # a key change: delete, tombstone, create
    assert [o.key for o in outs] == [key % 1, key % 1, key % 2]
    assert orjson.loads(outs[0].value or b"")["before"] == {"id": 1, "v": "x"}  # the row's columns only
