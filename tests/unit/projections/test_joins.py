"""Stream–table joins: a fold's record sees its tables as of its place in the merge order, and
incremental runs equal one rebuild whatever the interleaving of table and fold records."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.unit.projections.helpers import change, log_of
from tributary.projections.cdc import apply_change
from tributary.projections.definition import Fold, Join, Projection, Table
from tributary.projections.errors import DefinitionError, RecordError
from tributary.projections.local import LocalView, run_local
from tributary.projections.records import ProjectionRecord

pytestmark = pytest.mark.unit

ORDERS, CUSTOMERS = "shop.public.orders", "shop.public.customers"


def _customer_of(r: ProjectionRecord) -> Any:
    after = (r.value or {}).get("after") if isinstance(r.value, dict) else None
    return None if not after else {"id": after["customer_id"]}


def _apply(state: dict[str, Any], r: ProjectionRecord) -> dict[str, Any]:
    row = apply_change(state["row"], r)
    customer = r.lookup("customers")
    name = customer["name"] if isinstance(customer, dict) else None
    return {"row": row, "name": name, "seen": [*state["seen"], [r.partition, r.offset, name]]}


def _result(state: dict[str, Any]) -> dict[str, Any] | None:
    row = state["row"]
    if row is None:
        return None
    return {"id": row["id"], "customer_name": state["name"], "seen": state["seen"]}


NAMED = Projection(
    name="orders_named",
    version=1,
    topics=(ORDERS,),
    tables={"customers": Join(CUSTOMERS, _customer_of)},
    table=Table.of({"id": "bigint", "customer_name": "text", "seen": "jsonb"}, ["id"]),
    fold=Fold(lambda key: {"row": None, "name": None, "seen": []}, _apply, _result),
)


def names(view: LocalView) -> dict[str, str]:
    return {line.split("\t")[0]: line.split("\t")[1] for line in view.table()}


def test_an_order_sees_the_customer_as_of_its_change_and_a_rename_reaches_later_changes() -> None:
    recs = [
        change(CUSTOMERS, 0, {"id": 1}, "c", {"id": 1, "name": "Ann"}, ts=10),
        change(ORDERS, 0, {"id": 100}, "c", {"id": 100, "customer_id": 1}, ts=20),
        change(ORDERS, 1, {"id": 101}, "c", {"id": 101, "customer_id": 2}, ts=21),  # customer 2 not there yet
        change(CUSTOMERS, 1, {"id": 1}, "u", {"id": 1, "name": "Anna"}, ts=30),  # renamed after order 100
        change(CUSTOMERS, 2, {"id": 2}, "c", {"id": 2, "name": "Bob"}, ts=31),
        change(ORDERS, 2, {"id": 102}, "c", {"id": 102, "customer_id": 1}, ts=40),
        change(ORDERS, 3, {"id": 101}, "u", {"id": 101, "customer_id": 2}, ts=41),  # changed after Bob exists
    ]
    view = LocalView()
    run_local(NAMED, log_of(recs), view)
    assert names(view) == {"100": "Ann", "101": "Bob", "102": "Anna"}  # KStream–KTable: as of the order
    # a customer deleted: later changes of its orders see no row
    more = [
        change(CUSTOMERS, 3, {"id": 1}, "d", None, ts=50),
        change(ORDERS, 4, {"id": 100}, "u", {"id": 100, "customer_id": 1}, ts=60),
    ]
    run_local(NAMED, log_of(recs + more), view)
    assert names(view)["100"] == "\\N"


def test_a_truncated_table_has_no_rows_after_the_truncate() -> None:
    trunc = ProjectionRecord(CUSTOMERS, 0, 1, 15, None, {"op": "t", "source": {"ts_ms": 15}}, None, 15)
    recs = [
        change(CUSTOMERS, 0, {"id": 1}, "c", {"id": 1, "name": "Ann"}, ts=10),
        trunc,
        change(ORDERS, 0, {"id": 100}, "c", {"id": 100, "customer_id": 1}, ts=20),
    ]
    view = LocalView()
    run_local(NAMED, log_of(recs), view)
    assert names(view) == {"100": "\\N"}


def test_tables_are_checked() -> None:
    fold = Fold(lambda k: 0, lambda s, r: s, lambda s: None)
    table = Table.of({"id": "text"}, ["id"])
    with pytest.raises(DefinitionError, match="one of its own topics"):
        Projection("p", 1, (ORDERS,), table, fold=fold, tables={"o": Join(ORDERS, _customer_of)})
    with pytest.raises(DefinitionError, match="must be a Join"):
        Projection("p", 1, (ORDERS,), table, fold=fold, tables={"o": CUSTOMERS})  # type: ignore[dict-item]
    with pytest.raises(DefinitionError, match="table name 'Bad-Name'"):
        Projection("p", 1, (ORDERS,), table, fold=fold, tables={"Bad-Name": Join(CUSTOMERS, _customer_of)})
    with pytest.raises(DefinitionError, match="key must be a function"):
        Join(CUSTOMERS, "customer_id")  # type: ignore[arg-type]
    with pytest.raises(DefinitionError, match="a DataFrame transform joins the topics it lists"):
        Projection("p", 1, (ORDERS,), table, build=lambda df: df, tables={"c": Join(CUSTOMERS, _customer_of)})


def test_a_failing_join_key_names_the_record() -> None:
    bad = Projection(
        name="bad",
        version=1,
        topics=(ORDERS,),
        tables={"customers": Join(CUSTOMERS, lambda r: r.value["nope"])},  # type: ignore[index]
        table=NAMED.table,
        fold=NAMED.fold,
    )
    rec = change(ORDERS, 0, {"id": 1}, "c", {"id": 1, "customer_id": 1}, ts=1)
    with pytest.raises(RecordError, match=r"shop.public.orders/0@0: tables\['customers'\].key: KeyError"):
        run_local(bad, log_of([rec]), LocalView())


@st.composite
def interleavings(draw: st.DrawFn) -> tuple[list[ProjectionRecord], list[dict[tuple[str, int], int]]]:
    """Random orders and customers changes over two partitions each, event times out of order."""
    n = draw(st.integers(1, 40))
    records: list[ProjectionRecord] = []
    nxt: dict[tuple[str, int], int] = {}
    for _ in range(n):
        topic = draw(st.sampled_from([ORDERS, CUSTOMERS]))
        part = draw(st.integers(0, 1))
        off = nxt.get((topic, part), 0)
        nxt[(topic, part)] = off + 1
        ts = draw(st.integers(0, 30))
        ident = draw(st.integers(1, 3))
        op = draw(st.sampled_from(["c", "u", "u", "d"]))
        if topic == ORDERS:
            after = {"id": ident, "customer_id": draw(st.integers(1, 3))}
        else:
            after = {"id": ident, "name": draw(st.sampled_from(["ann", "bob", "cy", "dee"]))}
        records.append(change(topic, off, {"id": ident}, op, None if op == "d" else after, ts=ts, partition=part))
    cuts = draw(st.lists(st.dictionaries(st.sampled_from(sorted(nxt)), st.integers(0, 40)), max_size=4))
    return records, cuts


@settings(max_examples=150, deadline=None)
@given(interleavings())
def test_incremental_runs_equal_one_rebuild_with_tables(data: Any) -> None:
    records, cuts = data
    full = log_of(records)
    rebuilt = LocalView()
    run_local(NAMED, full, rebuilt)
    view = LocalView()
    seen: dict[tuple[str, int], int] = {}
    for cut in cuts:  # each run sees a longer committed prefix of some partitions
        for tp, n in cut.items():
            seen[tp] = max(seen.get(tp, 0), n)
        run_local(NAMED, {tp: rs[: seen.get(tp, 0)] for tp, rs in full.items()}, view)
    run_local(NAMED, full, view)
    assert view.table() == rebuilt.table()


def _merge_lookup(records: list[ProjectionRecord]) -> dict[str, list[list[Any]]]:
    """The reference: one literal k-way merge of every topic-partition by its head's event time
    (ties by topic, partition, offset), customers kept in a dict, each order's lookups in turn."""
    runs = {tp: list(rs) for tp, rs in log_of(records).items()}
    top: dict[tuple[str, int], int] = {}
    customers: dict[int, str | None] = {}
    seen: dict[str, list[list[Any]]] = {}
    while any(runs.values()):

        def head(tp: tuple[str, int]) -> tuple[int, str, int, int]:
            r = runs[tp][0]
            return (max(top.get(tp, r.event_time), r.event_time), r.topic, r.partition, r.offset)

        tp = min((tp for tp, rs in runs.items() if rs), key=head)
        r = runs[tp].pop(0)
        top[tp] = max(top.get(tp, r.event_time), r.event_time)
        after = r.value["after"] if isinstance(r.value, dict) else None  # type: ignore[index]
        if r.topic == CUSTOMERS:
            customers[r.key["id"]] = None if after is None else after["name"]  # type: ignore[index]
        else:
            name = None if after is None else customers.get(after["customer_id"])
            seen.setdefault(orjson.dumps(r.key).decode(), []).append([r.partition, r.offset, name])
    return seen


@settings(max_examples=100, deadline=None)
@given(interleavings())
def test_lookups_follow_the_merge_order_of_every_topic_partition(data: Any) -> None:
    records, _ = data
    view = LocalView()
    run_local(NAMED, log_of(records), view)
    expected = _merge_lookup(records)
    for unit, prior in view.states.items():
        assert sorted(orjson.loads(prior.state or "null")["seen"]) == sorted(expected[unit])
