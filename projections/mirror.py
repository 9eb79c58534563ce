"""The generic table mirror: the current state of a captured table, kept by a fold per key.

`[projections] mirror = ["shop.public.orders"]` mirrors a topic into `views.shop_public_orders`
with columns (key text, row jsonb); give `columns`/`primary_key` for a typed table instead.
Records are folded in log order (event time is held constant): a key's changes are totally
ordered by their offsets, while commit timestamps of snapshot reads and streamed changes
may interleave. A truncate removes the rows of the keys whose last change precedes it on their
partition (the engine delivers it to those keys; `apply_change` reads it as a delete).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tributary.projections.cdc import apply_change
from tributary.projections.codec import canonical
from tributary.projections.definition import Fold, Projection, Table
from tributary.projections.records import ProjectionRecord

__all__ = ["mirror_projection"]


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

    def initial(key: Any) -> dict[str, Any]:
        return {"key": key, "row": None}

    def apply(state: dict[str, Any], record: ProjectionRecord) -> dict[str, Any]:
        return {"key": state["key"], "row": apply_change(state["row"], record)}

    def result(state: dict[str, Any]) -> dict[str, Any] | None:
        row = state["row"]
        if row is None:
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
    )
