"""The codec's fast paths write the same bytes as the long way they skip: fold states, unit keys
and COPY lines are compared byte for byte between runs and rebuilds."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tributary.projections import codec

pytestmark = pytest.mark.unit

_atoms = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.floats(allow_nan=False),
    st.text(),
    st.decimals(allow_nan=True, allow_infinity=True),
)
_values = st.recursive(
    _atoms,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.lists(inner, max_size=3).map(tuple),
        st.dictionaries(st.text(max_size=4), inner, max_size=4),
        st.dictionaries(st.one_of(st.integers(), st.booleans(), st.none()), inner, max_size=2),  # not str: the long way
    ),
    max_leaves=12,
)


def _long_way(value: Any) -> str:
    return orjson.dumps(codec._enc(value), option=orjson.OPT_SORT_KEYS).decode()


@given(_values)
def test_state_and_key_json_equal_the_long_way(value: Any) -> None:
    assert codec.dump_state(value) == _long_way(value)
    assert codec.canonical(value) == _long_way(value)
    text = _long_way(value)
    assert repr(codec.load_state(text)) == repr(codec._dec(orjson.loads(text)))


@given(st.lists(st.one_of(st.none(), st.text(alphabet="ab\t\n\r\\N", max_size=5)), min_size=1, max_size=5))
def test_copy_lines_equal_the_escaped_join(values: list[str | None]) -> None:
    escaped = "\t".join("\\N" if v is None else v.translate(codec._ESCAPES) for v in values) + "\n"
    assert codec.copy_line(values) == escaped


def test_a_decimal_state_round_trips() -> None:
    state = {"b": Decimal("1.10"), "a": [Decimal("-0.00"), (1, "x")]}
    assert codec.dump_state(state) == '{"a":[{"$decimal":"-0.00"},[1,"x"]],"b":{"$decimal":"1.10"}}'
    assert codec.load_state(codec.dump_state(state)) == {"a": [Decimal("-0.00"), [1, "x"]], "b": Decimal("1.10")}
