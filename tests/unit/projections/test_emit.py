"""Derived streams (`Projection.emit`), pure: what incremental runs emit equals what one rebuild
emits, each source record's outputs exactly once, whatever the run boundaries."""

from __future__ import annotations

import zlib
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.unit.projections.helpers import event, log_of
from tributary.projections.definition import Emit, Fold, Projection, Table, WindowSpec
from tributary.projections.errors import DefinitionError, RecordError
from tributary.projections.local import LocalView, run_local
from tributary.projections.records import ProjectionRecord

pytestmark = pytest.mark.unit

DEP = "events.deposits"


def _apply(state: dict[str, Any], r: ProjectionRecord) -> dict[str, Any]:
    return {**state, "balance": state["balance"] + Decimal(r.data["amount"]), "n": state["n"] + 1}


def _emits(state: dict[str, Any], r: ProjectionRecord) -> list[tuple[Any, Any]]:
    """One balance record per deposit; every third deposit of an account also a tombstone of its 'low' key."""
    out: list[tuple[Any, Any]] = [(state["id"], {"balance": state["balance"], "n": state["n"]})]
    if state["n"] % 3 == 0:
        out.append(({"low": state["id"]}, None))
    return out


FOLD = Fold(
    initial=lambda key: {"id": key, "balance": Decimal(0), "n": 0},
    apply=_apply,
    result=lambda s: {"id": s["id"], "balance": s["balance"]},
)
BALANCES = Projection(
    name="balances_stream",
    version=1,
    topics=(DEP,),
    table=Table.of({"id": "text", "balance": "numeric"}, ["id"]),
    fold=FOLD,
    emit=Emit("balances", _emits),
)


@st.composite
def logs(draw: st.DrawFn) -> tuple[list[ProjectionRecord], list[dict[tuple[str, int], int]]]:
    """A keyed topic (an account's records on one partition, as capture and Kafka place them),
    random event times, and random run boundaries."""
    records: list[ProjectionRecord] = []
    nxt: dict[tuple[str, int], int] = {}
    for _ in range(draw(st.integers(1, 40))):
        stream = draw(st.sampled_from(["a", "b", "c", "d"]))
        tp = (DEP, zlib.crc32(stream.encode()) % 3)
        off = nxt.get(tp, 0)
        nxt[tp] = off + 1
        at = draw(st.integers(0, 40))
        records.append(event(DEP, tp[1], off, stream, "MoneyDeposited", at, amount=f"{draw(st.integers(1, 99))}.50"))
    cuts = draw(st.lists(st.dictionaries(st.sampled_from(sorted(nxt)), st.integers(0, 40)), max_size=5))
    return records, cuts


@settings(max_examples=100, deadline=None)
@given(logs())
def test_incremental_runs_emit_what_one_rebuild_emits(data: Any) -> None:
    records, cuts = data
    full = log_of(records)
    rebuilt = LocalView()
    run_local(BALANCES, full, rebuilt)
    view = LocalView()
    seen: dict[tuple[str, int], int] = {}
    for cut in cuts:  # each run sees a longer committed prefix of some partitions
        for tp, n in cut.items():
            seen[tp] = max(seen.get(tp, 0), n)
        run_local(BALANCES, {tp: rs[: seen.get(tp, 0)] for tp, rs in full.items()}, view)
    run_local(BALANCES, full, view)
    run_local(BALANCES, full, view)  # a run with nothing new emits nothing
    assert sorted(view.emitted) == sorted(rebuilt.emitted)
    assert len(set(view.emitted)) == len(view.emitted)  # each output once
    assert view.table() == rebuilt.table()
    per_record = {(e[0], e[1], e[2]) for e in rebuilt.emitted}
    assert per_record == {(r.topic, r.partition, r.offset) for r in records}  # every record emitted


def test_emitted_values_are_exact_json() -> None:
    view = LocalView()
    run_local(BALANCES, log_of([event(DEP, 0, 0, "a", "MoneyDeposited", 5, amount="10.10")]), view)
    assert view.emitted == [(DEP, 0, 0, 0, '"a"', '{"balance":"10.10","n":1}', 5)]


def test_an_emit_that_raises_names_the_record() -> None:
    def broken(state: Any, r: ProjectionRecord) -> list[tuple[Any, Any]]:
        raise KeyError("x")

    p = Projection(name="broken", version=1, topics=(DEP,), table=BALANCES.table, fold=FOLD, emit=Emit("out", broken))
    with pytest.raises(RecordError, match=r"events.deposits/0@0: emit: KeyError"):
        run_local(p, log_of([event(DEP, 0, 0, "a", "MoneyDeposited", 5, amount="1")]), LocalView())


def test_emit_is_for_plain_folds_and_names_a_topic_of_its_own() -> None:
    assert BALANCES.emit is not None
    assert BALANCES.emit.topic_for(1, 1) == "balances"
    assert BALANCES.emit.topic_for(2, 3) == "balances.v2_3"
    with pytest.raises(DefinitionError, match="without a window"):
        Projection(
            name="w",
            version=1,
            topics=(DEP,),
            table=BALANCES.table,
            fold=FOLD,
            window=WindowSpec.tumbling(10),
            emit=Emit("out", _emits),
        )
    with pytest.raises(DefinitionError, match="one it reads"):
        Projection(name="loop", version=1, topics=(DEP,), table=BALANCES.table, fold=FOLD, emit=Emit(DEP, _emits))
    with pytest.raises(DefinitionError, match="Emit topic"):
        Emit("no spaces", _emits)


def test_a_recomputed_unit_emits_only_its_new_records() -> None:
    """A record ordered before what a unit already applied recomputes the unit: its earlier records
    are refolded without emitting again (readers have them), the new one emits from the new state."""
    wd = "events.withdrawals"

    def apply(state: dict[str, Any], r: ProjectionRecord) -> dict[str, Any]:
        sign = 1 if r.topic == DEP else -1
        return {**state, "balance": state["balance"] + sign * Decimal(r.data["amount"]), "n": state["n"] + 1}

    p = Projection(
        name="two_topics",
        version=1,
        topics=(DEP, wd),
        table=BALANCES.table,
        fold=Fold(initial=FOLD.initial, apply=apply, result=FOLD.result),
        emit=Emit("two_topics_out", lambda s, r: [(s["id"], {"balance": s["balance"], "n": s["n"]})]),
    )
    deposit = event(DEP, 0, 0, "a", "MoneyDeposited", 10, amount="5")
    earlier = event(wd, 0, 0, "a", "MoneyWithdrawn", 3, amount="2")  # committed later, earlier in event time
    view = LocalView()
    run_local(p, log_of([deposit]), view)
    run_local(p, log_of([deposit, earlier]), view)
    rebuilt = LocalView()
    run_local(p, log_of([deposit, earlier]), rebuilt)
    assert view.table() == rebuilt.table()
    assert [e[:3] for e in view.emitted] == [(DEP, 0, 0), (wd, 0, 0)]  # each record once
    assert view.emitted[1][5] == '{"balance":"-2","n":1}'  # the withdrawal, first in merge order
