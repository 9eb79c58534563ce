"""A DataFrame projection's output (an Arrow table) as COPY text, rendered by Arrow per column.

`engine.render_row` renders one row at a time in Python (a dict per row, `codec.copy_text` per
value): for the 100,000 rows of a 10M-event `account_totals` rebuild that was most of the sink's
time. Here each column is cast and escaped by pyarrow and the lines are joined by it too, giving
the same bytes as `render_row` for the types whose text Arrow writes exactly as `copy_text` does
(strings, integers, decimals, booleans); for any other type `copy_lines` returns None and the
caller renders rows one by one.
"""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa
import pyarrow.compute as pc

from tributary.projections.definition import Projection
from tributary.projections.engine import render_row

__all__ = ["copy_lines", "distinct_keys", "output_lines"]

_ESCAPES = (("\\", "\\\\"), ("\t", "\\t"), ("\n", "\\n"), ("\r", "\\r"))  # codec._ESCAPES, in this order


def output_lines(p: Projection, table: pa.Table) -> bytes:
    """The COPY text of a DataFrame projection's output rows in the table's column order. Rows
    with unknown columns or a NULL primary key, or columns of other types, go through
    `render_row` (which also names what is wrong)."""
    names = p.table.names
    valid = set(table.column_names) <= set(names) and all(
        k in table.column_names and table.column(k).null_count == 0 for k in p.table.primary_key
    )
    block = copy_lines(table, names) if valid else None
    if block is not None:
        return block
    return "".join(render_row(p, row)[0] for row in table.to_pylist()).encode()


def distinct_keys(p: Projection, table: pa.Table) -> bool:
    """No two output rows share a primary key (then an empty table can take them by COPY alone:
    `Store.replace_rows(distinct_keys=True)`). False when a key column is missing."""
    pk = list(p.table.primary_key)
    if not set(pk) <= set(table.column_names):
        return False
    if len(pk) == 1:
        return bool(pc.count_distinct(table.column(pk[0]), mode="all").as_py() == table.num_rows)
    return bool(table.select(pk).group_by(pk).aggregate([]).num_rows == table.num_rows)


def _text(column: pa.ChunkedArray) -> pa.ChunkedArray | None:
    """The column as COPY text values (nulls as `\\N`), or None for a type rendered otherwise."""
    t = column.type
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        text = column.cast(pa.large_string())
        for old, new in _ESCAPES:
            text = pc.replace_substring(text, old, new)
    elif pa.types.is_integer(t) or pa.types.is_decimal(t):  # str(int), format(Decimal, "f")
        text = column.cast(pa.large_string())
    elif pa.types.is_boolean(t):
        text = pc.if_else(column, "t", "f").cast(pa.large_string())
    else:
        return None
    return pc.fill_null(text, "\\N")


def copy_lines(table: pa.Table, names: Sequence[str]) -> bytes | None:
    """COPY text lines (tab-separated, newline-terminated) of `table`'s columns `names` in that
    order — a name the table lacks is NULL in every line, as `render_row` makes it — or None when
    a column has a type this does not render (the caller falls back to `render_row`)."""
    n = table.num_rows
    if n == 0:
        return b""
    columns = []
    for name in names:
        if name in table.column_names:
            text = _text(table.column(name))
            if text is None:
                return None
        else:
            text = pa.chunked_array([pa.array(["\\N"] * n, pa.large_string())])
        columns.append(text)
    tab, newline, empty = (pa.scalar(c, pa.large_string()) for c in ("\t", "\n", ""))
    lines = pc.binary_join_element_wise(*columns, tab)
    return _data(pc.binary_join_element_wise(lines, empty, newline).combine_chunks())


def _data(texts: pa.Array) -> bytes:
    """The concatenation of a (non-null) large_string array's values: its data buffer's range."""
    offsets = texts.buffers()[1]
    first, last = pa.Array.from_buffers(pa.int64(), len(texts) + 1, [None, offsets], offset=texts.offset).to_numpy()[
        [0, -1]
    ]
    data: bytes = texts.buffers()[2].to_pybytes()
    return data[first:last]
