"""The re-snapshot's key check query (capture/snapshot/chunked.py `absent_query`): which key columns it
matches with `=` (served by the key's index) and which NULL-to-NULL."""

from __future__ import annotations

import pytest

from tributary.capture.database.catalog import Column, TableInfo
from tributary.capture.snapshot.chunked import absent_query

pytestmark = pytest.mark.unit


def test_key_columns_that_are_not_null_are_matched_with_equality() -> None:
    columns = (Column("a", "integer", 23), Column("b", "text", 25))
    info = TableInfo("public", "t", columns, ("a",), "d", ("a", "b"), 0)
    text = absent_query(info, {"a"}).as_string(None)
    assert 'x."a" = r."a"' in text
    assert 'x."b" IS NOT DISTINCT FROM r."b"' in text


def test_a_bytea_key_column_is_read_back_from_its_hex() -> None:
    columns = (Column("b", "bytea", 17),)
    text = absent_query(TableInfo("public", "t", columns, ("b",), "d", ("b",), 0), {"b"}).as_string(None)
    assert """x."b" = decode(encode(r."b", 'escape'), 'hex')""" in text
