"""A user fold keeping each key's current row with the default event time (`source.ts_ms`)."""

from typing import Any

from tributary.projections.cdc import apply_change
from tributary.projections.codec import canonical
from tributary.projections.definition import Fold, Projection, Table
from tributary.projections.records import ProjectionRecord

TOPIC = "shop.public.orders"


def _apply(state: dict[str, Any], r: ProjectionRecord) -> dict[str, Any]:
    return {**state, "row": apply_change(state["row"], r)}


def _result(state: dict[str, Any]) -> dict[str, Any] | None:
    row = state["row"]
    return None if row is None else {"key": canonical(state["key"]), "status": row["status"]}


PROJECTION = Projection(
    name="order_status",
    version=1,
    topics=(TOPIC,),
    table=Table.of({"key": "text", "status": "text"}, ["key"]),
    fold=Fold(initial=lambda k: {"key": k, "row": None}, apply=_apply, result=_result),
)
