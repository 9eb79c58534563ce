"""Orders with their customer's name: a fold over `orders` that reads `customers` as a table."""

from typing import Any

from tributary.projections.cdc import apply_change, current_row
from tributary.projections.definition import Fold, Join, Projection, Table
from tributary.projections.records import ProjectionRecord

ORDERS, CUSTOMERS = "shop.public.orders", "shop.public.customers"


def _customer_key(r: ProjectionRecord) -> Any:
    row = current_row(r.value) if isinstance(r.value, dict) else None
    return None if row is None else {"id": row["customer_id"]}


def _apply(state: dict[str, Any], r: ProjectionRecord) -> dict[str, Any]:
    customer = r.lookup("customers")
    name = customer["name"] if isinstance(customer, dict) else None
    return {"row": apply_change(state["row"], r), "name": name}


def _result(state: dict[str, Any]) -> dict[str, Any] | None:
    row = state["row"]
    if row is None:
        return None
    return {"id": row["id"], "customer_id": row["customer_id"], "customer_name": state["name"]}


PROJECTION = Projection(
    name="orders_named",
    version=1,
    topics=(ORDERS,),
    tables={"customers": Join(CUSTOMERS, _customer_key)},
    table=Table.of({"id": "bigint", "customer_id": "bigint", "customer_name": "text"}, ["id"]),
    fold=Fold(initial=lambda key: {"row": None, "name": None}, apply=_apply, result=_result),
)


def _named(state: dict[str, Any], r: ProjectionRecord) -> dict[str, Any]:
    customer = r.lookup("customers")
    return {"id": r.key, "name": customer["data"]["name"] if isinstance(customer, dict) else None}


ORDER_EVENTS = Projection(
    name="order_events_named",
    version=1,
    topics=("events.order",),
    tables={"customers": Join("events.customer", lambda r: r.data["customer"])},  # type: ignore[index,call-overload]
    table=Table.of({"id": "text", "name": "text"}, ["id"]),
    fold=Fold(initial=lambda key: {"id": key, "name": None}, apply=_named, result=lambda s: s),
)
PROJECTIONS = [PROJECTION, ORDER_EVENTS]
