"""What reaches a fold: data records; schema records only on request; nothing its key drops."""

from __future__ import annotations

from typing import Any

import pytest

from tests.unit.projections.helpers import change
from tributary.projections.definition import Fold, Projection, Table, WindowSpec
from tributary.projections.errors import RecordError
from tributary.projections.local import LocalView, run_local
from tributary.projections.records import ProjectionRecord

pytestmark = pytest.mark.unit

TOPIC = "shop.public.orders"


def _schema(offset: int, names: list[str]) -> ProjectionRecord:
    value = {"schema": {"name": "shop", "table": "orders", "columns": [{"name": n, "type": "text"} for n in names]}}
    return ProjectionRecord(TOPIC, 0, offset, 5, {"__schema__": True}, value, None, 5)


def _log() -> dict[tuple[str, int], list[ProjectionRecord]]:
    return {
        (TOPIC, 0): [
            _schema(0, ["id", "customer"]),
            change(TOPIC, 1, {"id": 1}, "c", {"id": 1, "customer": "ann"}, ts=10),
            change(TOPIC, 2, {"id": 2}, "c", {"id": 2, "customer": None}, ts=11),
            _schema(3, ["id", "customer", "note"]),
            change(TOPIC, 4, {"id": 3}, "c", {"id": 3, "customer": "ann"}, ts=12),
        ]
    }


def _counting(**kw: Any) -> Projection:
    """A fold written as the README teaches: it reads `after` and knows nothing of schema records."""
    return Projection(
        name="counts",
        version=1,
        topics=(TOPIC,),
        table=Table.of({"k": "text", "n": "bigint"}, ["k"]),
        fold=Fold(
            lambda key, *w: {"k": key if isinstance(key, str) else str(key["id"]), "n": 0},
            lambda state, r: {**state, "n": state["n"] + len(r.value["after"])},
            lambda state, *w: {"k": state["k"], "n": state["n"]},
        ),
        **kw,
    )


def _rows(view: LocalView) -> list[list[str]]:
    return [line.rstrip("\n").split("\t") for line in view.table()]


def test_schema_records_do_not_reach_a_fold_that_did_not_ask() -> None:
    view = LocalView()
    run_local(_counting(), _log(), view)
    assert _rows(view) == [["1", "2"], ["2", "2"], ["3", "2"]]


def test_schema_records_do_not_reach_a_windowed_fold_either() -> None:
    view = LocalView()
    run_local(_counting(window=WindowSpec.tumbling(1000)), _log(), view)
    assert sorted(r[1] for r in _rows(view)) == ["2", "2", "2"]


def test_a_fold_that_asks_gets_the_schema_records() -> None:
    seen: list[Any] = []

    def apply(state: Any, r: ProjectionRecord) -> Any:
        seen.append(r.is_schema)
        return state

    p = Projection(
        name="all",
        version=1,
        topics=(TOPIC,),
        table=Table.of({"k": "text"}, ["k"]),
        fold=Fold(lambda key: 0, apply, lambda state: None),
        key=lambda r: "one",
        schema_records=True,
    )
    run_local(p, _log(), LocalView())
    # log order, though the second schema record's event time (5) is earlier than the changes'
    assert seen == [True, False, False, True, False]


def test_a_key_of_none_drops_the_record() -> None:
    p = _counting(key=lambda r: r.value["after"]["customer"])
    view = LocalView()
    run_local(p, _log(), view)  # order 2 has no customer: dropped, not a NULL primary key
    assert _rows(view) == [["ann", "4"]]


def test_a_key_function_that_raises_names_the_record() -> None:
    p = _counting(key=lambda r: r.value["after"]["missing"])
    with pytest.raises(RecordError, match=r"failed on shop\.public\.orders/0@1: key: KeyError: 'missing'"):
        run_local(p, _log(), LocalView())
