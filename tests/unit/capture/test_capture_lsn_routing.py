"""Lsn value object and table routing: pure."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tributary.capture.decoding.lsn import Lsn
from tributary.capture.records.routing import TableFilter, topic_name

pytestmark = pytest.mark.unit


def test_lsn_parses_prints_and_orders() -> None:
    lsn = Lsn.parse("16/B374D848")
    assert int(lsn) == (0x16 << 32) | 0xB374D848
    assert str(lsn) == "16/B374D848"
    assert Lsn.parse("0/1") < Lsn.parse("0/10") < Lsn.parse("1/0")
    assert Lsn(0) == Lsn.ZERO and str(Lsn.ZERO) == "0/0"


@pytest.mark.parametrize("bad", ["", "16", "/1", "1/", "xyz/1", "1/2/3"])
def test_lsn_rejects_bad_text(bad: str) -> None:
    with pytest.raises(ValueError, match="not an LSN"):
        Lsn.parse(bad)


def test_lsn_range() -> None:
    with pytest.raises(ValueError):
        Lsn(-1)
    with pytest.raises(ValueError):
        Lsn(1 << 64)


@given(st.integers(min_value=0, max_value=(1 << 64) - 1))
def test_lsn_round_trips(value: int) -> None:
    assert Lsn.parse(str(Lsn(value))) == value


def test_topic_names_and_globs() -> None:
    assert topic_name("shop", "public", "orders") == "shop.public.orders"
    f = TableFilter(["public.*", "sales.order?"], ["public.tmp_*"])
    assert f.matches("public", "orders")
    assert not f.matches("public", "tmp_x")
    assert f.matches("sales", "orders") and not f.matches("sales", "order_items")
    assert not f.matches("Public", "orders")  # case-sensitive, like PostgreSQL's quoted names
    assert f.wal2json_options() == {}  # `?` is not something wal2json's add-tables understands
    assert TableFilter(["public.*"]).wal2json_options() == {"add-tables": "public.*"}
    with pytest.raises(ValueError, match="schema.table"):
        TableFilter(["orders"])


def test_the_snapshot_order_of_debezium_follows_the_include_patterns_then_names() -> None:
    f = TableFilter(["sales.*", "public.b", "public.*"])
    tables = [("public.a"), ("public.b"), ("sales.z"), ("sales.c"), ("other.x")]
    ranked = sorted(tables, key=lambda n: f.snapshot_rank(*n.split(".")))
    assert ranked == ["sales.c", "sales.z", "public.b", "public.a", "other.x"]
