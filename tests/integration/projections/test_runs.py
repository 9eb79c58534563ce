"""Real Spark, real Postgres, a real log: ordering, incremental == rebuild, the swap."""

from __future__ import annotations

import random
import threading
from dataclasses import replace
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.integration.projections.helpers import DAY, LogWriter, dump
from tests.waiting import wait_threads
from tributary.projections.errors import RunError
from tributary.projections.runner import RunSettings, rebuild, run, run_continuous, status

pytestmark = pytest.mark.integration

HERE = Path(__file__).parent
DEP, WD = "events.deposits", "events.withdrawals"


def settings(dsn: str, root: Path) -> RunSettings:
    return RunSettings(
        dsn=dsn,
        log_root=root,
        modules=(str(HERE / "bank_projections.py"),),
        spark_master="local[2]",
        shuffle_partitions=2,
    )


def test_bank_example_event_time_order_across_topics(spark: Any, fresh_db: str, tmp_path: Path) -> None:
    w = LogWriter(tmp_path / "log")
    w.topic(DEP)
    w.topic(WD)
    w.append(DEP, "acc-1", 1, "AccountOpened", 1_000, owner="ann", overdraft_limit="0")
    w.append(DEP, "acc-1", 2, "MoneyDeposited", 10_000, amount="100.00")
    w.append(DEP, "acc-1", 4, "MoneyDeposited", 30_000, amount="50.00")
    # withdrawals travel on another topic and are committed first
    w.append(WD, "acc-1", 3, "MoneyWithdrawn", 20_000, amount="80.00")
    w.append(WD, "acc-1", 5, "MoneyWithdrawn", 40_000, amount="60.00")
    w.commit()
    w.close()
    s = settings(fresh_db, tmp_path / "log")
    result = run("bank", s, spark=spark)
    assert result.rebuilt and result.records == 5
    [row] = dump(fresh_db, "views.bank")
    assert row.startswith("(acc-1,ann,open,10.00,0.00,0.00,0,5,"), row  # no false overdraft
    naps: list[float] = []  # --continuous while idle: no pass, a stat of the log's manifest every 10 ms
    assert run_continuous("bank", s, spark=spark, freshness_s=0.8, stop=lambda: len(naps) >= 3, sleep=naps.append) == 1
    assert naps == [0.01, 0.01, 0.01]


def _workload(w: LogWriter, rng: random.Random, n: int, clock: list[int]) -> None:
    for _ in range(n):
        stream = f"acc-{rng.randrange(6)}"
        topic = rng.choice([DEP, WD])
        kind = "MoneyDeposited" if topic == DEP else "MoneyWithdrawn"
        clock[0] += rng.randrange(0, DAY // 3)
        at = clock[0] - rng.randrange(0, DAY // 2)  # out of order, sometimes past the lateness
        if rng.random() < 0.1:
            at = rng.randrange(0, clock[0] + 1)  # a straggler from long ago
        w.append(topic, stream, 1, kind, at, amount=f"{rng.randrange(1, 500)}.{rng.randrange(100):02d}")


@pytest.mark.parametrize(
    "names",
    [
        pytest.param(("bank", "bank_daily", "bank_totals"), id="fold-tumbling-dataframe"),
        pytest.param(("bank_sessions", "bank_hopping"), id="session-hopping", marks=pytest.mark.slow),
    ],
)
def test_incremental_runs_equal_rebuild_byte_for_byte(
    spark: Any, fresh_db: str, tmp_path: Path, names: tuple[str, ...]
) -> None:
    rng = random.Random(7)
    w = LogWriter(tmp_path / "log")
    w.topic(DEP)
    w.topic(WD)
    s = settings(fresh_db, tmp_path / "log")
    clock = [0]
    recomputed = 0
    for batch in (40, 25, 30):
        _workload(w, rng, batch, clock)
        w.commit()
        for name in names:
            recomputed += run(name, s, spark=spark).recomputed
    assert recomputed > 0, "the workload should send some units down the recompute path"
    w.close()
    incremental = {n: dump(fresh_db, f"views.{n}") for n in names}
    assert all(len(rows) >= 6 for rows in incremental.values())
    windowed = [n for n in names if n != "bank" and n != "bank_totals"]
    late = {n: dump(fresh_db, f"tributary_projections.{n}__v1_1__late") for n in windowed}
    assert all(late.values()), "the workload's stragglers should be past some window's lateness"
    for name in names:
        rebuilt = rebuild(name, s, spark=spark)
        assert rebuilt.build == 2 and rebuilt.records == 95
        assert dump(fresh_db, f"views.{name}") == incremental[name], name
        if name in late:  # the late output of a rebuild equals the incremental runs' too
            assert dump(fresh_db, f"tributary_projections.{name}__v1_2__late") == late[name], name
    [st] = status(s, names[0])
    assert st.build == 2 and st.lag == 0 and st.state == "done" and not st.needs_rebuild
    with psycopg.connect(fresh_db) as conn:  # the old builds are gone
        tables = {
            r[0]
            for r in conn.execute(
                "SELECT table_name FROM information_schema.tables WHERE table_schema = 'views' AND table_type = 'BASE TABLE'"
            )
        }
    assert tables == {f"{n}__v1_2" for n in names}


def test_reader_during_rebuild_never_sees_error_or_empty(spark: Any, fresh_db: str, tmp_path: Path) -> None:
    rng = random.Random(11)
    w = LogWriter(tmp_path / "log")
    w.topic(DEP)
    w.topic(WD)
    _workload(w, rng, 60, [0])
    w.commit()
    w.close()
    s = settings(fresh_db, tmp_path / "log")
    run("bank", s, spark=spark)
    expected = dump(fresh_db, "views.bank")
    seen: list[int] = []
    errors: list[BaseException] = []
    done = threading.Event()

    def reader() -> None:
        with psycopg.connect(fresh_db, autocommit=True) as conn:
            while not done.is_set():
                try:
                    seen.append(len(conn.execute("SELECT * FROM views.bank").fetchall()))
                except psycopg.Error as exc:
                    errors.append(exc)

    t = threading.Thread(target=reader)
    t.start()
    try:
        for _ in range(2):
            rebuild("bank", s, spark=spark)
    finally:
        done.set()
        wait_threads([t], what="the reader to stop", progress=lambda: len(seen))
    assert not errors, errors[:3]
    assert seen and min(seen) == len(expected) == max(seen)
    assert dump(fresh_db, "views.bank") == expected


def test_failing_record_stops_with_its_position_old_build_keeps_serving(
    spark: Any, fresh_db: str, tmp_path: Path
) -> None:
    w = LogWriter(tmp_path / "log")
    w.topic(DEP)
    w.topic(WD)
    w.append(DEP, "acc-1", 1, "MoneyDeposited", 1_000, amount="10.00")
    w.commit()
    s = settings(fresh_db, tmp_path / "log")
    run("bank_strict", s, spark=spark)
    serving = dump(fresh_db, "views.bank_strict")
    w.append(DEP, "acc-1", 2, "MoneyDeposited", 2_000, amount="666.66")
    w.commit()
    part = w.log.partition_for(DEP, b'"acc-1"')
    w.close()
    with pytest.raises(RunError, match=rf"failed on events.deposits/{part}@1: ValueError: cursed"):
        rebuild("bank_strict", s, spark=spark)
    assert dump(fresh_db, "views.bank_strict") == serving
    [st] = status(s, "bank_strict")
    assert st.build == 1 and st.last_error and "cursed amount" in st.last_error
    skipping = replace(s, skip_errors=True)
    rebuild("bank_strict", skipping, spark=spark)
    [st] = status(skipping, "bank_strict")
    assert st.dead_letters == 1 and st.build == 3 and st.lag == 0
    assert dump(fresh_db, "views.bank_strict") == serving  # the cursed deposit was skipped


def test_rows_claimed_by_two_units_are_refused(spark: Any, fresh_db: str, tmp_path: Path) -> None:
    w = LogWriter(tmp_path / "log")
    w.topic(DEP)
    w.topic(WD)
    w.append(DEP, "acc-1", 1, "MoneyDeposited", DAY + 1 * 3_600_000, amount="10.00")
    w.append(DEP, "acc-1", 2, "MoneyDeposited", DAY + 13 * 3_600_000, amount="10.00")
    w.commit()
    w.close()
    with pytest.raises(RunError, match="two units produced different rows with primary key"):
        run("bank_collide", settings(fresh_db, tmp_path / "log"), spark=spark)
    # a DataFrame projection's rows with one key (its rebuild would COPY distinct keys straight in)
    with pytest.raises(RunError, match="two units produced different rows with primary key"):
        rebuild("bank_dupes", settings(fresh_db, tmp_path / "log"), spark=spark)
