"""The order a fold applies a key's records in: never reordered within a topic-partition; event
time only picks which topic-partition's head goes next (a k-way merge), with a total tie-break."""

from __future__ import annotations

import heapq
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.unit.projections.helpers import change, event
from tributary.projections.cdc import apply_change
from tributary.projections.codec import canonical
from tributary.projections.definition import Fold, Projection, Table
from tributary.projections.engine import Item, fold_order
from tributary.projections.local import LocalView, run_local
from tributary.projections.records import ProjectionRecord, sort_key

pytestmark = pytest.mark.unit

TOPIC = "shop.public.orders"


def _current_row() -> Projection:
    """A user fold keeping a key's current row, with the default event time (`source.ts_ms`)."""

    def apply(state: dict[str, Any], r: ProjectionRecord) -> dict[str, Any]:
        return {**state, "row": apply_change(state["row"], r)}

    def result(state: dict[str, Any]) -> dict[str, Any] | None:
        row = state["row"]
        return None if row is None else {"key": canonical(state["key"]), "row": row}

    return Projection(
        name="current",
        version=1,
        topics=(TOPIC,),
        table=Table.of({"key": "text", "row": "jsonb"}, ["key"]),
        fold=Fold(initial=lambda k: {"key": k, "row": None}, apply=apply, result=result),
    )


CURRENT = _current_row()


def _rows(view: LocalView) -> dict[str, str]:
    return dict(line.rstrip("\n").split("\t") for line in view.table())


def test_a_streamed_change_wins_over_an_earlier_committed_snapshot_row_with_a_later_ts() -> None:
    # the snapshot read carries the time the snapshot ran (…325); the change streamed after the
    # snapshot point was committed at …306 and comes later on the same partition
    snapshot = change(TOPIC, 0, {"id": 1}, "r", {"id": 1, "status": "new"}, ts=1_700_000_000_325)
    streamed = change(TOPIC, 1, {"id": 1}, "u", {"id": 1, "status": "paid"}, ts=1_700_000_000_306)
    log = {(TOPIC, 0): [snapshot, streamed]}
    rebuilt = LocalView()
    run_local(CURRENT, log, rebuilt)
    assert '"paid"' in _rows(rebuilt)['{"id":1}']
    view = LocalView()  # and incrementally: the streamed change arrives in a later run
    run_local(CURRENT, {(TOPIC, 0): [snapshot]}, view)
    run_local(CURRENT, log, view)
    assert view.table() == rebuilt.table()
    assert view.states['{"id":1}'].last == (1_700_000_000_325, TOPIC, 0, 1), "resumed, not recomputed"


def test_events_whose_clocks_disagree_apply_in_log_order_within_a_partition() -> None:
    seen: list[int] = []

    def apply(state: int, r: ProjectionRecord) -> int:
        seen.append(r.offset)
        return state + 1

    p = Projection(
        name="seq",
        version=1,
        topics=("events.a", "events.b"),
        table=Table.of({"k": "text", "n": "int"}, ["k"]),
        fold=Fold(lambda key: 0, apply, lambda n: None),
    )
    a = [event("events.a", 0, i, "s", "X", at) for i, at in enumerate([50, 10, 40])]
    b = [event("events.b", 0, 10 + i, "s", "X", at) for i, at in enumerate([20, 60])]
    run_local(p, {("events.a", 0): a, ("events.b", 0): b}, LocalView())
    # a's head 50 waits behind b's 20; a's 10 and 40 stay after a's 50 (order keys 50, 50, 50)
    assert seen == [10, 0, 1, 2, 11]


def _reference(items: list[Item]) -> list[Item]:
    """The seeds' scheduling, literally: per-(topic, partition) runs in offset order, merged by
    repeatedly taking the run whose head has the smallest (event time, topic, partition, offset)."""
    runs: dict[tuple[str, int], list[Item]] = {}
    for it in sorted(items, key=Item.order):
        runs.setdefault((it.record.topic, it.record.partition), []).append(it)
    heads = [(sort_key(run[0].record), tp, 0) for tp, run in runs.items()]
    heapq.heapify(heads)
    out: list[Item] = []
    while heads:
        _, tp, i = heapq.heappop(heads)
        out.append(runs[tp][i])
        if i + 1 < len(runs[tp]):
            heapq.heappush(heads, (sort_key(runs[tp][i + 1].record), tp, i + 1))
    return out


RECORDS = st.lists(
    st.tuples(st.sampled_from(["events.a", "events.b"]), st.integers(0, 2), st.integers(0, 20)),
    max_size=40,
)


@settings(max_examples=300, deadline=None)
@given(RECORDS)
def test_fold_order_is_the_k_way_merge_of_partition_runs(draws: list[tuple[str, int, int]]) -> None:
    nxt: dict[tuple[str, int], int] = {}
    items = []
    for topic, part, at in draws:
        off = nxt[(topic, part)] = nxt.get((topic, part), -1) + 1
        items.append(Item("u", "u", None, None, True, event(topic, part, off, "s", "X", at)))
    items.sort(key=Item.order)
    ordered = [it for _, it in fold_order(items)]
    assert ordered == _reference(items)
    keys = [k for k, _ in fold_order(items)]
    assert keys == sorted(keys), "order keys never decrease: `last` is the greatest a unit saw"
