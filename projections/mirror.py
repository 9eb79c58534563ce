"""The generic table mirror: the current state of a captured table, kept by a fold per key.

`[projections] mirror = ["shop.public.orders"]` mirrors a topic into `views.shop_public_orders`.
The build table holds each key's current row as (key text, row jsonb); the view readers query
gives the captured table's columns typed (`typed_columns`), from the topic's schema records,
followed by `key` and `row`. Give `columns`/`primary_key` for a typed table of your own instead.

The schema records reach this fold (`schema_records=True`) as a unit of their own: its state
is the latest schema (the last one in fold order; capture writes every change to every
partition) and it owns no row. The store reads it from the unit's state to define the view, at
the swap and in any incremental run that changes it (`Store.commit_folds`).

Records are folded in log order (event time is held constant): a key's changes are totally
ordered by their offsets, while commit timestamps of snapshot reads and streamed changes
may interleave. A truncate removes the rows of the keys whose last change precedes it on their
partition (the engine delivers it to those keys; `apply_change` reads it as a delete).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from tributary.jsonvalue import JsonObject, JsonValue
from tributary.projections.cdc import apply_change
from tributary.projections.codec import canonical
from tributary.projections.definition import Fold, Projection, Table
from tributary.projections.records import SCHEMA_KEY, ProjectionRecord

__all__ = ["SCHEMA_UNIT", "TYPED_VIEW", "ViewColumn", "mirror_projection", "sql_type", "typed_columns"]

# `Projection.options` flag of a mirror whose view is typed from its schema records.
TYPED_VIEW = "typed_view"

# Postgres types (format_type spelling, as capture records them) whose JSON text casts back to
# the same type exactly: numbers, booleans, and types written as PostgreSQL's own text output.
_CASTABLE = re.compile(
    r"^(?:smallint|integer|bigint|real|double precision|boolean|date|uuid|interval|inet|cidr|macaddr"
    r"|numeric(?:\(\d{1,4}(?:,-?\d{1,4})?\))?"
    r"|(?:timestamp|time)(?:\(\d\))? with(?:out)? time zone)$"
)
_TEXT = re.compile(r"^(?:text|name|character varying(?:\(\d{1,8}\))?|character(?:\(\d{1,8}\))?)$")

ViewColumn = tuple[str, str, str]  # (name, SQL type, how: "cast" | "text" | "json" | "hex")


def sql_type(pg_type: str) -> tuple[str, str]:
    """The column type of a captured column in the typed view, and how its JSON becomes it:
    `cast` (the JSON text cast to the same type), `text`, `hex` (bytea, written as hex), or
    `json` — the fallback for every type not mapped (arrays, enums, domains, money, …): the
    JSON value as `jsonb`."""
    t = pg_type.strip()
    if t == "oid":
        return "bigint", "cast"
    if _CASTABLE.match(t):
        return t, "cast"
    if _TEXT.match(t):
        return t, "text"
    if t == "bytea":
        return "bytea", "hex"
    return "jsonb", "json"


def typed_columns(schema: Mapping[str, Any] | None) -> list[ViewColumn]:
    """The typed view's columns from a schema record's `schema` object; [] when there is none.
    Columns named `key` or `row` are left to the `row` column (the view keeps both)."""
    if not isinstance(schema, Mapping) or not isinstance(schema.get("columns"), Sequence):
        return []
    out: list[ViewColumn] = []
    for c in schema["columns"]:
        if not isinstance(c, Mapping) or not isinstance(c.get("name"), str) or c["name"] in ("key", "row"):
            continue
        out.append((c["name"], *sql_type(str(c.get("type", "")))))
    return out


def _is_schema_unit(key: JsonValue) -> bool:
    return isinstance(key, dict) and key.get("__schema__") is True


def mirror_projection(
    topic: str,
    *,
    name: str | None = None,
    version: int = 1,
    columns: Mapping[str, str] | None = None,
    primary_key: tuple[str, ...] | None = None,
) -> Projection:
    """A projection mirroring one CDC topic `<source>.<schema>.<table>`."""
    pname = name or topic.replace(".", "_").replace("-", "_").lower()
    if columns is None:
        table = Table.of({"key": "text", "row": "jsonb"}, ["key"])
    else:
        table = Table.of(columns, list(primary_key or ()))
    names = table.names
    typed_view = columns is None

    def initial(key: JsonValue) -> JsonObject:
        return {"key": key, "row": None}

    def apply(state: dict[str, Any], record: ProjectionRecord) -> dict[str, Any]:
        if record.is_schema:  # the schema unit keeps the latest schema
            schema = record.value.get("schema") if isinstance(record.value, dict) else None
            return {"key": state["key"], "row": schema}
        if _is_schema_unit(state["key"]):  # a truncate delivered to it: schemas stay
            return state
        return {"key": state["key"], "row": apply_change(state["row"], record)}

    def result(state: dict[str, Any]) -> dict[str, Any] | None:
        row = state["row"]
        if row is None or _is_schema_unit(state["key"]):
            return None
        if columns is None:
            return {"key": canonical(state["key"]), "row": row}
        return {c: row.get(c) for c in names}

    return Projection(
        name=pname,
        version=version,
        topics=(topic,),
        table=table,
        fold=Fold(initial=initial, apply=apply, result=result),
        event_time=lambda r: 0,
        description=f"current rows of {topic}",
        schema_records=typed_view,
        options={TYPED_VIEW: True} if typed_view else {},
    )


SCHEMA_UNIT = SCHEMA_KEY  # the unit (canonical key) whose state holds the latest schema
