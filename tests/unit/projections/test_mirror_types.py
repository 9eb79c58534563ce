"""The typed mirror's column types: Postgres types that cast back exactly keep their type, the
rest fall back to jsonb, and a schema record's columns become the view's columns."""

from __future__ import annotations

import pytest

from tributary.projections.mirror import mirror_projection, sql_type, typed_columns

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("pg", "want"),
    [
        ("integer", ("integer", "cast")),
        ("numeric(10,2)", ("numeric(10,2)", "cast")),
        ("numeric", ("numeric", "cast")),
        ("timestamp(3) with time zone", ("timestamp(3) with time zone", "cast")),
        ("time without time zone", ("time without time zone", "cast")),
        ("oid", ("bigint", "cast")),
        ("character varying(20)", ("character varying(20)", "text")),
        ("text", ("text", "text")),
        ("bytea", ("bytea", "hex")),
        ("jsonb", ("jsonb", "json")),
        ("integer[]", ("jsonb", "json")),
        ("mood", ("jsonb", "json")),
        ("money", ("jsonb", "json")),
        ("integer; DROP TABLE x", ("jsonb", "json")),
    ],
)
def test_sql_type(pg: str, want: tuple[str, str]) -> None:
    assert sql_type(pg) == want


def test_typed_columns_from_a_schema_record() -> None:
    schema = {
        "columns": [{"name": "id", "type": "integer"}, {"name": "key", "type": "text"}, {"name": "t", "type": "x"}]
    }
    assert typed_columns(schema) == [("id", "integer", "cast"), ("t", "jsonb", "json")]
    assert typed_columns(None) == []


def test_the_default_mirror_asks_for_schema_records_and_a_typed_one_does_not() -> None:
    assert mirror_projection("shop.public.orders").schema_records
    typed = mirror_projection("shop.public.orders", columns={"id": "integer"}, primary_key=("id",))
    assert not typed.schema_records
