"""`run --continuous`: it wakes on the log's commit instead of polling, and folds small passes in
the driver (no Spark job) with the same tables as a Spark rebuild."""

from __future__ import annotations

import random
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.integration.projections.helpers import DAY, LogWriter, dump
from tests.integration.projections.test_runs import DEP, WD, settings
from tests.waiting import wait_progress
from tributary.projections.errors import ProjectionError, RunError
from tributary.projections.runner import _Continuous, rebuild, run, run_continuous

pytestmark = pytest.mark.integration


def _spark_jobs(spark: Any) -> int:
    """Spark jobs this application ran so far outside a job group."""
    return len(spark.sparkContext.statusTracker().getJobIdsForGroup())


def test_continuous_run_waits_on_the_log_not_on_passes(spark: Any, fresh_db: str, tmp_path: Path) -> None:
    w = LogWriter(tmp_path / "log")
    w.topic(DEP)
    w.topic(WD)
    w.append(DEP, "acc-1", 1, "AccountOpened", 1_000, owner="ann", overdraft_limit="0")
    w.commit()
    s = settings(fresh_db, tmp_path / "log")
    run("bank", s, spark=spark)  # built: the continuous run starts caught up
    naps: list[float] = []
    done = threading.Event()
    passes: list[int] = []

    def nap(seconds: float) -> None:
        naps.append(seconds)
        time.sleep(seconds)

    def continuous() -> None:  # an hour's freshness: only the log's commit can bring the pass
        passes.append(run_continuous("bank", s, spark=spark, freshness_s=3600, stop=done.is_set, sleep=nap))

    t = threading.Thread(target=continuous)
    t.start()
    try:
        wait_progress(lambda: len(naps) >= 20, lambda: len(naps), what="the continuous run idling")
        jobs = _spark_jobs(spark)
        w.append(DEP, "acc-1", 2, "MoneyDeposited", 2_000, amount="5.00")
        w.commit()
        wait_progress(
            lambda: any(",5.00," in row for row in dump(fresh_db, "views.bank")),
            lambda: len(naps),
            what="the new deposit in the view",
        )
        new_jobs = _spark_jobs(spark) - jobs
        idle = len(naps)  # then idle again: the pass after the fold found nothing
        wait_progress(lambda: len(naps) >= idle + 5, lambda: len(naps), what="the continuous run idling again")
    finally:
        done.set()
        t.join()
        w.close()
    # idle: no pass while nothing is committed, short naps (the manifest's stat); the commit:
    # one pass that folds it, one that finds nothing more, neither a Spark job
    assert passes == [3]
    assert set(naps) == {0.01}
    assert new_jobs == 0


def _workload(w: LogWriter, rng: random.Random, n: int, clock: list[int]) -> None:
    for _ in range(n):
        stream = f"acc-{rng.randrange(6)}"
        topic = rng.choice([DEP, WD])
        kind = "MoneyDeposited" if topic == DEP else "MoneyWithdrawn"
        clock[0] += rng.randrange(0, DAY // 3)
        at = clock[0] - rng.randrange(0, DAY // 10)  # out of order, sometimes before a unit's last record
        w.append(topic, stream, 1, kind, at, amount=f"{rng.randrange(1, 500)}.{rng.randrange(100):02d}")


def test_small_passes_in_the_driver_equal_a_spark_rebuild(spark: Any, fresh_db: str, tmp_path: Path) -> None:
    rng = random.Random(5)
    w = LogWriter(tmp_path / "log")
    w.topic(DEP)
    w.topic(WD)
    s = settings(fresh_db, tmp_path / "log")
    small = replace(s, small_pass_records=50)
    clock = [0]
    _workload(w, rng, 60, clock)  # above the threshold: the first build runs on Spark
    w.commit()
    run("bank", small, spark=spark)
    in_driver = recomputed = 0
    for batch in (1, 3, 7, 2, 0, 12, 5, 9, 1, 30):
        if batch:
            _workload(w, rng, batch, clock)
        else:  # stragglers on both topics: one is on a topic-partition its unit's last record was not
            w.append(DEP, "acc-0", 1, "MoneyDeposited", 0, amount="1.00")
            w.append(WD, "acc-0", 1, "MoneyWithdrawn", 0, amount="2.00")
            batch = 2
        w.commit()
        jobs = _spark_jobs(spark)
        result = run("bank", small, spark=spark)
        assert result.records == batch
        if _spark_jobs(spark) == jobs:
            in_driver += 1
        recomputed += result.recomputed  # a unit to recompute hands the pass to Spark
    assert in_driver >= 3, "most small passes should fold in the driver"
    assert recomputed > 0, "the workload should send some units down the recompute path"
    w.close()
    incremental = dump(fresh_db, "views.bank")
    states = dump(fresh_db, "tributary_projections.bank__v1_1__state")
    rebuilt = rebuild("bank", s, spark=spark)  # all on Spark
    assert rebuilt.records == 132
    assert dump(fresh_db, "views.bank") == incremental
    assert dump(fresh_db, "tributary_projections.bank__v1_2__state") == states


FLAKY = """
from pathlib import Path

from tributary.projections.definition import Fold, Projection
from tributary.projections.examples import account_balances

POISON = Path(__file__).with_name("poison")


def apply(state, record):
    if POISON.exists() and record.data.get("amount") == "666.66":
        raise ValueError("poisoned")
    return account_balances.apply(state, record)


PROJECTION = Projection(
    name="flaky",
    version=1,
    topics=("events.deposits", "events.withdrawals"),
    table=account_balances.TABLE,
    fold=Fold(account_balances.initial, apply, account_balances.result),
)
"""


def test_cached_states_over_many_passes_equal_a_rebuild(spark: Any, fresh_db: str, tmp_path: Path) -> None:
    """States kept between passes, through a pass that fails midway, Spark passes (units to
    recompute) and a rebuild swapped in between passes: the view equals one rebuild's."""
    (tmp_path / "flaky.py").write_text(FLAKY)
    rng = random.Random(11)
    w = LogWriter(tmp_path / "log")
    w.topic(DEP)
    w.topic(WD)
    s = replace(
        settings(fresh_db, tmp_path / "log"),
        modules=(str(tmp_path / "flaky.py"),),
        small_pass_records=50,
        state_cache_units=5,  # fewer than the accounts: some states come from the cache, some are loaded
    )
    clock = [0]
    _workload(w, rng, 20, clock)
    w.commit()
    runs = _Continuous("flaky", s, spark)
    failed = rebuilt = 0
    try:
        runs.step()
        for i, batch in enumerate((4, 1, 6, 3, 8, 2, 5, 7, 1, 3, 9, 2)):
            _workload(w, rng, batch, clock)
            w.commit()
            if i == 4:  # a pass that fails midway: its first units fold, a later one raises
                (tmp_path / "poison").touch()
                w.append(DEP, "acc-5", 1, "MoneyDeposited", clock[0], amount="666.66")
                w.commit()
                with pytest.raises(ProjectionError, match="poisoned"):
                    runs.step()
                (tmp_path / "poison").unlink()
                failed += 1
            if i == 7:  # idle: a rebuild takes the lock and swaps in a build the cache never saw
                runs.idle()
                _workload(w, rng, 4, clock)
                w.commit()
                rebuilt = rebuild("flaky", s, spark=spark).build
            runs.step()
    finally:
        runs.close()
        w.close()
    assert failed == 1 and rebuilt == 2
    incremental = dump(fresh_db, "views.flaky")
    states = dump(fresh_db, "tributary_projections.flaky__v1_2__state")
    assert rebuild("flaky", s, spark=spark).records == 20 + 51 + 1 + 4
    assert dump(fresh_db, "views.flaky") == incremental
    assert dump(fresh_db, "tributary_projections.flaky__v1_3__state") == states


def test_a_continuous_run_keeps_its_connection(spark: Any, fresh_db: str, tmp_path: Path) -> None:
    """One backend serves every pass; losing it while the run holds the lock stops the run with
    one line."""
    w = LogWriter(tmp_path / "log")
    w.topic(DEP)
    w.append(DEP, "acc-1", 1, "AccountOpened", 1_000, owner="ann", overdraft_limit="0")
    w.commit()
    s = settings(fresh_db, tmp_path / "log")
    run("bank", s, spark=spark)
    done = threading.Event()
    seen: set[int] = set()
    passes: list[int] = []
    with psycopg.connect(fresh_db, autocommit=True) as watcher, psycopg.connect(fresh_db, autocommit=True) as reader:
        ours = (watcher.info.backend_pid, reader.info.backend_pid)

        def stop() -> bool:  # between passes and while idle: which other backends are connected
            rows = watcher.execute(
                "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                "AND NOT pid = ANY(%s) AND backend_type = 'client backend'",
                (list(ours),),
            ).fetchall()
            seen.update(r[0] for r in rows)
            return done.is_set()

        def shows(v: int) -> bool:
            row = reader.execute("SELECT last_version FROM views.bank WHERE account_id = 'acc-1'").fetchone()
            return row is not None and row[0] >= v

        t = threading.Thread(target=lambda: passes.append(run_continuous("bank", s, spark=spark, stop=stop)))
        t.start()
        try:
            for v in range(2, 12):
                w.append(DEP, "acc-1", v, "MoneyDeposited", v * 1_000, amount="1.00")
                w.commit()
                wait_progress(
                    lambda v=v: shows(v),
                    lambda: len(seen),
                    what=f"version {v} in the view",
                )
        finally:
            done.set()
            t.join()
    assert passes[0] >= 10
    assert len(seen) == 1, f"the run connected {len(seen)} times"
    runs = _Continuous("bank", s, spark)
    try:
        w.append(DEP, "acc-1", 12, "MoneyDeposited", 12_000, amount="1.00")
        w.commit()
        assert runs.step() == 1  # it holds the lock until it goes idle
        assert runs.held is not None
        with psycopg.connect(fresh_db, autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", (runs.held.conn.info.backend_pid,))
        w.append(DEP, "acc-1", 13, "MoneyDeposited", 13_000, amount="1.00")
        w.commit()
        with pytest.raises(RunError, match="lost the connection to the service database, and its lock with it"):
            runs.step()
    finally:
        runs.close()
        w.close()
