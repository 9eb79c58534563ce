"""The Arrow rendering of a DataFrame projection's output gives `render_row`'s bytes exactly,
and falls back to it (with its errors) where it does not apply."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tributary.projections.arrow_copy import distinct_keys, output_lines
from tributary.projections.definition import Projection, Table
from tributary.projections.engine import render_row
from tributary.projections.errors import DefinitionError

pytestmark = pytest.mark.unit

P = Projection(
    name="totals",
    version=1,
    topics=("events.account",),
    table=Table.of({"id": "text", "amount": "numeric(30,2)", "n": "bigint", "ok": "boolean", "note": "text"}, ["id"]),
    build=lambda records: records,
)
TYPES = {"id": pa.string(), "amount": pa.decimal128(30, 2), "n": pa.int64(), "ok": pa.bool_(), "note": pa.string()}
texts = st.text(alphabet=st.sampled_from(["a", "é", "\\", "\t", "\n", "\r", " ", "N", "\u2028", "0"]), max_size=6)
amounts = st.decimals(min_value=Decimal("-1e27"), max_value=Decimal("1e27"), places=2, allow_nan=False)
rows = st.fixed_dictionaries(
    {
        "id": texts,
        "amount": st.none() | amounts,
        "n": st.none() | st.integers(-(2**63), 2**63 - 1),
        "ok": st.none() | st.booleans(),
        "note": st.none() | texts,
    }
)


def by_rows(table: pa.Table) -> bytes:
    return "".join(render_row(P, row)[0] for row in table.to_pylist()).encode()


@settings(max_examples=200, deadline=None)
@given(st.lists(rows, max_size=20), st.sets(st.sampled_from(["amount", "n", "ok", "note"])), st.integers(1, 5))
def test_arrow_lines_equal_render_row(data: list[dict[str, Any]], dropped: set[str], chunks: int) -> None:
    names = [n for n in TYPES if n not in dropped]  # columns the output lacks are NULL
    table = pa.table({n: pa.array([r[n] for r in data], TYPES[n]) for n in names})
    if table.num_rows:  # several chunks, as Spark's batches arrive
        size = -(-table.num_rows // chunks)
        table = pa.concat_tables([table.slice(i, size) for i in range(0, table.num_rows, size)])
    assert output_lines(P, table) == by_rows(table)


def test_other_types_fall_back_to_render_row() -> None:
    table = pa.table({"id": ["a"], "note": pa.array([datetime(2024, 1, 2, 3, 4, 5, tzinfo=UTC)], pa.timestamp("us"))})
    assert output_lines(P, table) == by_rows(table)


@pytest.mark.parametrize(
    ("table", "message"),
    [
        (pa.table({"id": ["a"], "other": [1]}), "unknown columns"),
        (pa.table({"id": pa.array([None], pa.string())}), "NULL primary key"),
        (pa.table({"n": [1]}), "NULL primary key"),
    ],
)
def test_invalid_rows_raise_render_rows_errors(table: pa.Table, message: str) -> None:
    with pytest.raises(DefinitionError, match=message):
        output_lines(P, table)


def test_distinct_keys() -> None:
    assert distinct_keys(P, pa.table({"id": ["a", "b", "é"], "n": [1, 1, 1]}))
    assert not distinct_keys(P, pa.table({"id": ["a", "b", "a"]}))
    assert not distinct_keys(P, pa.table({"n": [1]}))  # no key column
    two = Projection(
        name="pairs",
        version=1,
        topics=("t",),
        table=Table.of({"a": "text", "b": "bigint"}, ["a", "b"]),
        build=lambda records: records,
    )
    assert distinct_keys(two, pa.table({"a": ["x", "x", "y"], "b": [1, 2, 1]}))
    assert not distinct_keys(two, pa.table({"a": ["x", "y", "x"], "b": [1, 1, 1]}))
