"""`run --continuous`: it wakes on the log's commit instead of polling, and folds small passes in
the driver (no Spark job) with the same tables as a Spark rebuild."""

from __future__ import annotations

import random
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from tests.integration.projections.helpers import DAY, LogWriter, dump
from tests.integration.projections.test_runs import DEP, WD, settings
from tests.waiting import wait_progress
from tributary.projections.runner import rebuild, run, run_continuous

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
