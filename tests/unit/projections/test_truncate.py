"""Truncates reach per-key folds: delivered to every unit with a record on the truncate's
topic-partition ordered before it, in rebuilds and incremental runs alike."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tributary.projections.cdc import apply_change
from tributary.projections.codec import canonical
from tributary.projections.definition import Fold, Projection, Table, WindowSpec
from tributary.projections.engine import (
    Item,
    Prior,
    applies_truncates,
    decide,
    deliver_truncates,
    first_keys,
    truncate_points,
)
from tributary.projections.local import LocalView, run_local
from tributary.projections.mirror import mirror_projection
from tributary.projections.records import ProjectionRecord

pytestmark = pytest.mark.unit

TOPIC = "shop.public.orders"
PARTS = 2
MIRROR = mirror_projection(TOPIC)


def _by_commit_time() -> Projection:
    """A user fold keeping the current row with the CDC helper, in event-time (commit) order."""

    def apply(state: dict[str, Any], r: ProjectionRecord) -> dict[str, Any]:
        return {**state, "row": apply_change(state["row"], r), "seen": state["seen"] + 1}

    def result(state: dict[str, Any]) -> dict[str, Any] | None:
        row = state["row"]
        return None if row is None else {"key": canonical(state["key"]), "row": row, "seen": state["seen"]}

    return Projection(
        name="by_time",
        version=1,
        topics=(TOPIC,),
        table=Table.of({"key": "text", "row": "jsonb", "seen": "int"}, ["key"]),
        fold=Fold(initial=lambda k: {"key": k, "row": None, "seen": 0}, apply=apply, result=result),
    )


BY_TIME = _by_commit_time()


def _counting() -> Projection:
    """Every key keeps a row counting the truncates it received: exact delivery shows."""

    def apply(state: dict[str, Any], r: ProjectionRecord) -> dict[str, Any]:
        return {**state, "truncates": state["truncates"] + r.is_truncate}

    return Projection(
        name="counting",
        version=1,
        topics=(TOPIC,),
        table=Table.of({"key": "text", "truncates": "int"}, ["key"]),
        fold=Fold(
            initial=lambda k: {"key": k, "truncates": 0},
            apply=apply,
            result=lambda st: {"key": canonical(st["key"]), "truncates": st["truncates"]},
        ),
    )


COUNTING = _counting()


def _envelope(op: str, after: dict[str, Any] | None, ts: int) -> dict[str, Any]:
    return {"before": None, "after": after, "op": op, "source": {"ts_ms": ts}, "ts_ms": ts}


class Log:
    """A CDC topic as capture writes it: a key's changes on its partition, a truncate on all."""

    def __init__(self) -> None:
        self.parts: dict[tuple[str, int], list[ProjectionRecord]] = {(TOPIC, p): [] for p in range(PARTS)}

    def _add(self, part: int, key: Any, value: Any, ts: int) -> None:
        records = self.parts[(TOPIC, part)]
        records.append(ProjectionRecord(TOPIC, part, len(records), ts, key, value, None, ts))

    def change(self, key: int, op: str, ts: int, total: int = 0) -> None:
        k = {"id": key}
        part = key % PARTS
        if op == "d":
            self._add(part, k, _envelope("d", None, ts), ts)
            self._add(part, k, None, ts)  # the tombstone
        else:
            self._add(part, k, _envelope(op, {"id": key, "total": total}, ts), ts)

    def truncate(self, ts: int) -> None:
        for part in range(PARTS):
            self._add(part, None, _envelope("t", None, ts), ts)

    def prefix(self, cut: dict[int, int]) -> dict[tuple[str, int], list[ProjectionRecord]]:
        return {tp: rs[: cut.get(tp[1], 0)] for tp, rs in self.parts.items()}


def mirrored(view: LocalView) -> dict[str, Any]:
    return dict(line.rstrip("\n").split("\t") for line in view.table())


def test_truncate_removes_rows_changed_before_it_and_keeps_later_ones() -> None:
    log = Log()
    for key in range(6):
        log.change(key, "c", 10, total=key)
    log.change(1, "u", 11, total=100)
    log.truncate(12)
    log.change(2, "c", 13, total=7)  # re-inserted after the truncate
    log.change(9, "c", 13, total=9)  # new after the truncate
    view = LocalView()
    run_local(MIRROR, log.parts, view)
    assert sorted(mirrored(view)) == ['{"id":2}', '{"id":9}']
    assert '"total":7' in mirrored(view)['{"id":2}']


def test_truncate_in_a_later_run_reaches_units_it_has_no_records_for() -> None:
    log = Log()
    for key in range(5):
        log.change(key, "c", 10, total=key)
    view = LocalView()
    run_local(MIRROR, log.parts, view)
    assert len(mirrored(view)) == 5
    log.truncate(20)
    log.change(3, "c", 21, total=33)
    run_local(MIRROR, log.parts, view)
    assert list(mirrored(view)) == ['{"id":3}']
    rebuilt = LocalView()
    run_local(MIRROR, log.parts, rebuilt)
    assert rebuilt.table() == view.table()


def test_user_fold_sees_the_truncate_through_the_cdc_helper() -> None:
    log = Log()
    log.change(1, "c", 10, total=1)
    log.change(3, "c", 10, total=3)
    log.truncate(15)
    log.change(3, "c", 16, total=4)
    view = LocalView()
    run_local(BY_TIME, log.parts, view)
    [line] = view.table()
    key, row, seen = line.rstrip("\n").split("\t")
    assert key == '{"id":3}' and '"total":4' in row
    assert seen == "3", "the key's fold applied its two changes and the truncate between them"


def test_a_truncate_reaches_a_key_once_per_change_before_it() -> None:
    log = Log()
    log.change(1, "c", 10)
    log.truncate(11)
    log.truncate(12)  # key 1 was already truncated: nothing to remove
    log.change(1, "c", 13)
    log.change(2, "c", 13)
    log.truncate(14)
    view = LocalView()
    run_local(COUNTING, log.prefix({0: 3, 1: 4}), view)
    run_local(COUNTING, log.parts, view)
    counted = dict(line.rstrip("\n").split("\t") for line in view.table())
    assert counted == {'{"id":1}': "2", '{"id":2}': "1"}
    rebuilt = LocalView()
    run_local(COUNTING, log.parts, rebuilt)
    assert rebuilt.table() == view.table()


def test_a_change_logged_after_a_truncate_survives_it_whatever_its_commit_time() -> None:
    # key 5's insert carries an earlier ts than the truncate but follows it on its partition:
    # log order is commit order, so the insert happened after the truncate and keeps its row
    log = Log()
    log.change(1, "c", 10, total=1)
    log.truncate(20)
    view = LocalView()
    run_local(BY_TIME, log.parts, view)
    assert view.table() == []
    log.change(5, "c", 15, total=5)
    log.change(7, "c", 25, total=7)
    run_local(BY_TIME, log.parts, view)
    rebuilt = LocalView()
    run_local(BY_TIME, log.parts, rebuilt)
    assert [line.split("\t")[0] for line in rebuilt.table()] == ['{"id":5}', '{"id":7}']
    assert view.table() == rebuilt.table()


def test_windowed_and_event_folds_do_not_take_deliveries() -> None:
    windowed = Projection(
        name="w",
        version=1,
        topics=(TOPIC,),
        table=MIRROR.table,
        fold=MIRROR.fold,
        window=WindowSpec.tumbling(10),
    )
    events = Projection(name="e", version=1, topics=("events.account",), table=MIRROR.table, fold=MIRROR.fold)
    assert applies_truncates(MIRROR) and applies_truncates(BY_TIME)
    assert not applies_truncates(windowed) and not applies_truncates(events)


def test_deliver_to_stored_holders_and_resume_after_the_truncate() -> None:
    t = ProjectionRecord(TOPIC, 0, 9, 50, None, _envelope("t", None, 50), None, 50)
    rec = ProjectionRecord(TOPIC, 0, 10, 40, {"id": 1}, _envelope("c", {"id": 1}, 40), None, 40)
    new = [Item('{"id":1}', '{"id":1}', None, None, True, rec)]
    stored = {
        '{"id":1}': Prior("{}", (45, TOPIC, 0, 2), (), 0, False, ()),
        '{"id":2}': Prior("{}", (30, TOPIC, 0, 3), (), 0, False, ((TOPIC, 0),)),
        '{"id":3}': Prior("{}", (30, TOPIC, 1, 3), (), 0, False, ((TOPIC, 1),)),
    }
    items = deliver_truncates(new, [t], stored)
    delivered = sorted(i.unit for i in items if i.record.is_truncate)
    assert delivered == ['{"id":1}', '{"id":2}'], "units on partition 0 only, stored or new"
    # key 1's record (40) follows on the partition of its last item (45): it resumes
    priors, recompute = decide(stored, first_keys(items, merged=True))
    assert priors['{"id":1}'].resume and priors['{"id":2}'].resume and not recompute
    assert truncate_points({(TOPIC, 0): (55, 2)}, [t]) == {(TOPIC, 0): (50, 9)}, "the latest by offset"


OPS = st.tuples(
    st.sampled_from(["c", "u", "d", "t"]),
    st.integers(0, 5),  # key
    st.integers(-3, 3),  # commit-time jitter: event time is not always in log order
)


@settings(max_examples=80, deadline=None)
@given(st.lists(OPS, min_size=1, max_size=30), st.lists(st.tuples(st.integers(0, 40), st.integers(0, 40)), max_size=4))
def test_incremental_runs_equal_one_rebuild_and_the_mirror_equals_the_table(ops: Any, cuts: Any) -> None:
    log = Log()
    table: dict[int, int] = {}  # what the source table holds, change by change
    ts = 100
    for i, (op, key, jitter) in enumerate(ops):
        ts += 5
        if op == "t":
            log.truncate(ts + jitter)
            table.clear()
        elif op == "d" and key in table:
            log.change(key, "d", ts + jitter)
            del table[key]
        elif op != "d":
            log.change(key, "u" if key in table else "c", ts + jitter, total=i)
            table[key] = i
    for p in (MIRROR, BY_TIME, COUNTING):
        rebuilt = LocalView()
        run_local(p, log.parts, rebuilt)
        view = LocalView()
        seen = {0: 0, 1: 0}
        for a, b in cuts:  # each run sees a longer committed prefix of some partitions
            seen = {0: max(seen[0], a), 1: max(seen[1], b)}
            run_local(p, log.prefix(seen), view)
        run_local(p, log.parts, view)
        assert view.table() == rebuilt.table(), p.name
    mirror = LocalView()
    run_local(MIRROR, log.parts, mirror)
    assert {k: v.split('"total":')[1].rstrip("}") for k, v in mirrored(mirror).items()} == {
        canonical({"id": k}): str(v) for k, v in table.items()
    }
