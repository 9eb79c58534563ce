"""Pure rules of untidy schemas: topic names for any identifier, the key rule, whole-row keys."""

from __future__ import annotations

import re

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tributary.capture.database.catalog import Column, TableInfo, table_warnings
from tributary.capture.decoding.wal2json import Change
from tributary.capture.records import envelope as env
from tributary.capture.records.routing import topic_name, topic_part

pytestmark = pytest.mark.unit

_VALID = re.compile(r"[A-Za-z0-9._-]+")


def test_plain_identifiers_keep_their_names() -> None:
    assert topic_name("shop", "public", "orders") == "shop.public.orders"
    assert topic_name("shop", "Sales", "Order-Lines_2") == "shop.Sales.Order-Lines_2"


def test_odd_identifiers_get_a_readable_name_and_a_stable_suffix() -> None:
    assert topic_part("my table").startswith("my_table_") and len(topic_part("my table")) == len("my_table_") + 8
    assert topic_part("tëst") != topic_part("tøst")  # both `t_st`, told apart by the suffix
    assert topic_part("a.b") != topic_part("a_b")  # `a_b` is plain; `a.b` is mapped
    assert topic_name("s", "a.b", "c") != topic_name("s", "a", "b.c")


@given(st.text(min_size=1, max_size=63), st.text(min_size=1, max_size=63))
def test_any_identifier_gives_a_valid_topic_and_distinct_identifiers_distinct_topics(a: str, b: str) -> None:
    for name in (a, b):
        assert _VALID.fullmatch(topic_part(name)), name
        assert "." not in topic_part(name)  # never a part separator of its own
        assert topic_part(name) == topic_part(name)
    if a != b:
        assert topic_part(a) != topic_part(b)


def _table(ident: str, pk: tuple[str, ...] = (), index: tuple[str, ...] = ()) -> TableInfo:
    cols = tuple(Column(n, "integer", 23) for n in ("id", "code", "v"))
    return TableInfo("public", "t", cols, pk, ident, pk or index, 0, index)


def test_the_key_is_the_primary_key_whatever_the_replica_identity() -> None:
    assert _table("i", ("id",), ("code",)).identity_columns == ("id",)
    assert _table("f", ("id",)).identity_columns == ("id",)
    assert _table("i", (), ("code",)).identity_columns == ("code",)
    assert _table("f").identity_columns == ()


def test_which_tables_lose_updates_and_what_init_says() -> None:
    assert _table("d").loses_updates and _table("n", ("id",)).loses_updates
    assert not _table("d", ("id",)).loses_updates and not _table("f").loses_updates
    assert not _table("i", (), ("code",)).loses_updates
    assert table_warnings(_table("d", ("id",))) == []
    assert "does not cover its primary key" in table_warnings(_table("i", ("id",), ("code",)))[0]
    assert table_warnings(_table("i", ("id",), ("id", "code"))) == []
    assert "keyed by the whole row" in table_warnings(_table("f"))[0]
    assert "not captured" in table_warnings(_table("d"))[0]


def _col(name: str, value: object) -> dict[str, object]:
    return {"name": name, "type": "integer", "typeoid": 23, "value": value}


def _envelopes(change: Change, keys: tuple[str, ...]) -> list[env.Output]:
    return env.envelopes_for(
        change, source_name="s", db="d", lsn=None, tx_id=1, commit_ts_ms=0, now_ms=0, key_columns=keys
    )


def test_an_update_of_a_whole_row_keyed_table_deletes_the_old_row_key() -> None:
    old, new = [_col("a", 1), _col("b", 2)], [_col("a", 1), _col("b", 3)]
    out = _envelopes(Change("U", "public", "t", new, old, (), None), ())
    assert [o.key for o in out] == [b'{"a":1,"b":2}', b'{"a":1,"b":2}', b'{"a":1,"b":3}']
    assert [orjson.loads(o.value)["op"] if o.value else None for o in out] == ["d", None, "c"]


def test_an_update_keyed_by_an_identity_index_keeps_its_key() -> None:
    old, new = [_col("code", 7)], [_col("code", 7), _col("v", 2)]
    out = _envelopes(Change("U", "public", "t", new, old, (), None), ("code",))
    assert [o.key for o in out] == [b'{"code":7}'] and orjson.loads(out[0].value)["op"] == "u"
