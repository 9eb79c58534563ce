"""Projections written as the README teaches, over a CDC topic whose log holds schema records
(what capture writes before the rows and on every column change)."""

from typing import Any

from tributary.projections.definition import Fold, Projection, Table

TOPIC = "shop.public.orders"
COUNTS = Table.of({"customer": "text", "orders": "bigint"}, ["customer"])


def _initial(key: Any) -> dict[str, Any]:
    return {"customer": key, "orders": 0}


def _count(state: dict[str, Any], record: Any) -> dict[str, Any]:
    after = record.value["after"]  # a schema record has no "after": this fold knows nothing of them
    return {**state, "customer": after["customer"], "orders": state["orders"] + 1}


def _result(state: dict[str, Any]) -> dict[str, Any]:
    return {"customer": state["customer"], "orders": state["orders"]}


def _customer(record: Any) -> Any:
    """Orders without a customer have no row: None drops them."""
    after = (record.value or {}).get("after") or {}
    return after.get("customer")


def _schemas_initial(key: Any) -> dict[str, Any]:
    return {"columns": "", "seen": 0}


def _schemas_apply(state: dict[str, Any], record: Any) -> dict[str, Any]:
    if not record.is_schema:
        return state
    names = ",".join(c["name"] for c in record.value["schema"]["columns"])
    return {"columns": names, "seen": state["seen"] + 1}


def _schemas_result(state: dict[str, Any]) -> dict[str, Any] | None:
    return {"topic": TOPIC, "columns": state["columns"], "seen": state["seen"]} if state["seen"] else None


def _by_op(records: Any) -> Any:
    from pyspark.sql import functions as F

    op = F.coalesce(F.get_json_object("value", "$.op"), F.lit("none"))
    return records.groupBy(op.alias("op")).agg(F.count("*").alias("n"))


PROJECTIONS = [
    # keyed by the log key ({"id": …}): the schema records' own key would make a unit of its own
    Projection(
        name="per_order",
        version=1,
        topics=(TOPIC,),
        table=Table.of({"order_id": "bigint", "customer": "text"}, ["order_id"]),
        fold=Fold(
            lambda key: {"id": key["id"], "customer": None},
            lambda state, r: {**state, "customer": r.value["after"]["customer"]},
            lambda state: {"order_id": state["id"], "customer": state["customer"]},
        ),
    ),
    Projection(
        name="per_customer",
        version=1,
        topics=(TOPIC,),
        table=COUNTS,
        fold=Fold(_initial, _count, _result),
        key=_customer,
    ),
    Projection(
        name="schemas_seen",
        version=1,
        topics=(TOPIC,),
        table=Table.of({"topic": "text", "columns": "text", "seen": "bigint"}, ["topic"]),
        fold=Fold(_schemas_initial, _schemas_apply, _schemas_result),
        key=lambda r: TOPIC,
        schema_records=True,
    ),
    Projection(
        name="orders_by_op",
        version=1,
        topics=(TOPIC,),
        table=Table.of({"op": "text", "n": "bigint"}, ["op"]),
        build=_by_op,
    ),
]
