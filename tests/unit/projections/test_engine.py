from decimal import Decimal
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.unit.projections.helpers import event, log_of
from tributary.projections.definition import Fold, Projection, Table, WindowSpec
from tributary.projections.engine import Prior, decide
from tributary.projections.errors import RecordError
from tributary.projections.examples import account_balances, account_daily_totals
from tributary.projections.local import LocalView, run_local
from tributary.projections.records import ProjectionRecord

pytestmark = pytest.mark.unit

DEP, WD = "events.deposits", "events.withdrawals"
BANK = account_balances.make(name="bank", topics=(DEP, WD))


def rows(view: LocalView) -> list[list[str]]:
    return [line.rstrip("\n").split("\t") for line in view.table()]


def test_bank_no_false_overdraft_in_event_time_order() -> None:
    deposits = [
        event(DEP, 0, 0, "a1", "AccountOpened", 0, owner="ann", overdraft_limit="0"),
        event(DEP, 0, 1, "a1", "MoneyDeposited", 10, amount="100.00"),
        event(DEP, 0, 2, "a1", "MoneyDeposited", 30, amount="50.00"),
    ]
    withdrawals = [
        event(WD, 0, 0, "a1", "MoneyWithdrawn", 20, amount="80.00"),
        event(WD, 0, 1, "a1", "MoneyWithdrawn", 40, amount="60.00"),
    ]
    view = LocalView()
    # the withdrawals topic arrives first and alone: a run sees only it
    run_local(BANK, log_of(withdrawals), view)
    assert rows(view)[0][3] == "-140.00" and rows(view)[0][6] == "1"  # provisional, arrival order
    run_local(BANK, log_of(withdrawals + deposits), view)
    [row] = rows(view)
    assert row[0] == "a1" and row[1] == "ann" and row[3] == "10.00"
    assert row[6] == "0", "a deposit earlier in event time must count before the withdrawal"


def test_record_error_names_the_record() -> None:
    bad = event(DEP, 0, 7, "a1", "MoneyDeposited", 10, amount="not money")
    with pytest.raises(RecordError, match=r"events.deposits/0@7"):
        run_local(BANK, log_of([bad]), LocalView())


def test_skip_errors_dead_letters_the_record_and_goes_on() -> None:
    recs = [
        event(DEP, 0, 0, "a1", "MoneyDeposited", 10, amount="5.00"),
        event(DEP, 0, 1, "a1", "MoneyDeposited", 11, amount="oops"),
        event(DEP, 0, 2, "a1", "MoneyDeposited", 12, amount="2.00"),
    ]
    view = LocalView()
    run_local(BANK, log_of(recs), view, skip_errors=True)
    assert rows(view)[0][3] == "7.00"
    assert list(view.dead) == [(DEP, 0, 1)] and "InvalidOperation" in view.dead[(DEP, 0, 1)]


def test_daily_totals_late_policies() -> None:
    day = account_daily_totals.DAY
    p_drop = account_daily_totals.make(window=WindowSpec.tumbling(day, lateness=0, late="drop"))
    p_upd = account_daily_totals.make(window=WindowSpec.tumbling(day, late="update", grace=day))
    recs = [
        event("events.account", 0, 0, "a", "MoneyDeposited", 5, amount="1.00"),
        event("events.account", 0, 1, "a", "MoneyDeposited", day + 5, amount="2.00"),
        event("events.account", 0, 2, "a", "MoneyDeposited", 6, amount="4.00"),  # late
        event("events.account", 0, 3, "a", "MoneyDeposited", 3 * day, amount="8.00"),
        event("events.account", 0, 4, "a", "MoneyDeposited", 7, amount="16.00"),
    ]  # too late
    v1, v2 = LocalView(), LocalView()
    run_local(p_drop, log_of(recs), v1)
    run_local(p_upd, log_of(recs), v2)
    assert [r[2] for r in rows(v1)] == ["1.00", "2.00", "8.00"]
    assert [r[2] for r in rows(v2)] == ["5.00", "2.00", "8.00"]
    assert sum(s.dropped for s in v1.states.values()) == 2
    assert sum(s.dropped for s in v2.states.values()) == 1
    # the late records are kept, with the window they missed, the watermark and why
    late_drop = sorted((e.offset, e.window_start, e.window_end, e.watermark, e.reason) for e in v1.late.values())
    assert late_drop == [(2, 0, day, day + 5, "closed"), (4, 0, day, 3 * day, "closed")]
    assert [(e.offset, e.reason) for e in v2.late.values()] == [(4, "past_grace")]
    assert orjson.loads(v2.late[("events.account", 0, 4, 0)].value or "null")["data"] == {"amount": "16.00"}


def _count(kind: str) -> Projection:
    def initial(key: Any, *w: int) -> dict[str, Any]:
        return {"k": key, "n": 0, "sum": Decimal(0), "seq": []}

    def apply(s: dict[str, Any], r: ProjectionRecord) -> dict[str, Any]:
        return {
            **s,
            "n": s["n"] + 1,
            "sum": s["sum"] + Decimal(r.data["amount"]),
            "seq": (s["seq"] + [r.offset])[-4:],
        }

    def result(s: dict[str, Any], *w: int) -> dict[str, Any]:
        return {"k": s["k"], "w": w[0] if w else 0, "n": s["n"], "total": s["sum"], "seq": s["seq"]}

    window = {
        "none": None,
        "tumbling": WindowSpec.tumbling(10, lateness=3, late="update", grace=5),
        "hopping": WindowSpec.hopping(10, 5, lateness=2),
        "session": WindowSpec.session(4, lateness=6),
    }[kind]
    return Projection(
        name=f"c_{kind}",
        version=1,
        topics=(DEP, WD),
        table=Table.of({"k": "text", "w": "bigint", "n": "int", "total": "numeric", "seq": "jsonb"}, ["k", "w"]),
        fold=Fold(initial, apply, result),
        window=window,
    )


def _trail() -> Projection:
    """Every record a key's fold applied, in order: shows the fold order in the table."""
    return Projection(
        name="trail",
        version=1,
        topics=(DEP, WD),
        table=Table.of({"k": "text", "seq": "jsonb"}, ["k"]),
        fold=Fold(
            lambda key: {"k": key, "seq": []},
            lambda s, r: {**s, "seq": [*s["seq"], [r.topic, r.partition, r.offset, r.event_time]]},
            lambda s: s,
        ),
    )


TRAIL = _trail()
PROJECTIONS = [BANK, *(_count(k) for k in ("none", "tumbling", "hopping", "session")), TRAIL]


def _merge_rule_holds(view: LocalView) -> None:
    """Log order within each topic-partition; a head goes next only if no other is earlier."""
    for _, seq in rows(view):
        trail = [tuple(x) for x in orjson.loads(seq)]
        for i, (topic, part, off, at) in enumerate(trail):
            assert all(o < off for t, p, o, _ in trail[:i] if (t, p) == (topic, part)), trail
            heads: dict[tuple[str, int], tuple[int, str, int, int]] = {}  # the others' pending heads
            for t, p, o, a in trail[i + 1 :]:
                heads.setdefault((t, p), (a, t, p, o))
            assert all((at, topic, part, off) < h for tp, h in heads.items() if tp != (topic, part)), trail


@st.composite
def logs(draw: st.DrawFn) -> tuple[list[ProjectionRecord], list[dict[tuple[str, int], int]]]:
    n = draw(st.integers(1, 40))
    records: list[ProjectionRecord] = []
    nxt: dict[tuple[str, int], int] = {}
    for _ in range(n):
        topic = draw(st.sampled_from([DEP, WD]))
        part = draw(st.integers(0, 1))
        off = nxt.get((topic, part), 0)
        nxt[(topic, part)] = off + 1
        kind = "MoneyDeposited" if topic == DEP else "MoneyWithdrawn"
        records.append(
            event(
                topic,
                part,
                off,
                draw(st.sampled_from(["a", "b", "c"])),
                kind,
                draw(st.integers(0, 40)),
                amount=f"{draw(st.integers(1, 99))}.50",
            )
        )
    cuts = draw(st.lists(st.dictionaries(st.sampled_from(sorted(nxt)), st.integers(0, 40)), max_size=4))
    return records, cuts


@settings(max_examples=60, deadline=None)
@given(logs(), st.sampled_from(range(len(PROJECTIONS))))
def test_incremental_runs_equal_one_rebuild(data: Any, which: int) -> None:
    records, cuts = data
    p = PROJECTIONS[which]
    full = log_of(records)
    rebuilt = LocalView()
    run_local(p, full, rebuilt)
    view = LocalView()
    seen: dict[tuple[str, int], int] = {}
    for cut in cuts:  # each run sees a longer committed prefix of some partitions
        for tp, n in cut.items():
            seen[tp] = max(seen.get(tp, 0), n)
        run_local(p, {tp: rs[: seen.get(tp, 0)] for tp, rs in full.items()}, view)
    run_local(p, full, view)
    assert view.table() == rebuilt.table()
    assert view.late == rebuilt.late  # the late side output too
    if p is TRAIL:
        _merge_rule_holds(rebuilt)


def test_decide_resumes_only_in_order_units() -> None:
    last = (5, "t", 0, 1)
    stored = {u: Prior("{}", last, (), 0, False) for u in ("u1", "u2", "u4", "u5")}
    firsts = {
        "u1": [(6, "s", 0, 0)],  # later event time on another topic
        "u2": [(5, "s", 0, 0)],  # same time, another topic ordered before "t"
        "u3": [(1, "t", 0, 0)],  # not stored: folded from scratch
        "u4": [(2, "t", 0, 2)],  # earlier event time, but the same topic-partition as `last`
        "u5": [(2, "t", 0, 2), (4, "t", 1, 0)],  # ... and one on another partition, earlier
    }
    priors, recompute = decide(stored, firsts)
    assert priors["u1"].resume and priors["u4"].resume
    assert recompute == {"u2", "u5"} and "u3" not in priors
    _, by_time = decide(stored, firsts, merged=False)  # session windows: event time decides
    assert by_time == {"u2", "u4", "u5"}
