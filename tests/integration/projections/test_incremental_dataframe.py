"""Incremental DataFrame projections on real Spark and Postgres: runs that merge the new records'
partial aggregates give the table a rebuild gives, and read only the new records."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.integration.projections.helpers import LogWriter, dump
from tests.pg import PgServer, fresh_database
from tributary.log.local import TopicConfig, canonical_json
from tributary.projections.loader import resolve
from tributary.projections.runner import RunSettings, rebuild, run, status
from tributary.projections.source import LocalSource, driver_frame, read_range

pytestmark = pytest.mark.integration

HERE = Path(__file__).parent
DEP, WD = "events.deposits", "events.withdrawals"
KINDS = {"MoneyDeposited": DEP, "MoneyWithdrawn": WD, "AccountOpened": DEP}
MERGING = ("totals", "extremes")
MODULES = (str(HERE / "incremental_projections.py"),)

_event = st.tuples(
    st.integers(0, 4),  # account
    st.sampled_from(sorted(KINDS)),
    st.integers(1, 99_999),  # cents
    st.integers(0, 10_000_000),  # event time (ms)
)
_batch = st.tuples(st.lists(_event, max_size=12), st.booleans())  # (events, run after it)
# Runs of at most this many new records read them in the driver: none, the smaller runs, all
_driver_read = st.sampled_from([0, 6, 1_000_000])


def _settings(dsn: str, root: Path, driver_read_records: int = 0) -> RunSettings:
    return RunSettings(
        dsn=dsn,
        log_root=root,
        modules=MODULES,
        spark_master="local[2]",
        shuffle_partitions=2,
        driver_read_records=driver_read_records,
    )


def _append(w: LogWriter, events: list[tuple[int, str, int, int]], versions: dict[str, int]) -> None:
    for account, kind, cents, at in events:
        stream = f"acc-{account}"
        versions[stream] = versions.get(stream, 0) + 1
        data = {} if kind == "AccountOpened" else {"amount": f"{cents // 100}.{cents % 100:02d}"}
        w.append(KINDS[kind], stream, versions[stream], kind, at, **data)
    w.commit()


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batches=st.lists(_batch, min_size=1, max_size=4), driver_read=_driver_read)
def test_any_sequence_of_incremental_runs_equals_a_rebuild(
    spark: Any, pg_server: PgServer, batches: list[tuple[list[tuple[int, str, int, int]], bool]], driver_read: int
) -> None:
    with fresh_database(pg_server) as dsn, tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "log"
        w = LogWriter(root)
        w.topic(DEP)
        w.topic(WD)
        versions: dict[str, int] = {}
        s = _settings(dsn, root, driver_read)
        for events, run_after in batches:
            _append(w, events, versions)
            if run_after:
                for name in MERGING:
                    run(name, s, spark=spark)
        w.close()
        for name in MERGING:
            run(name, s, spark=spark)
            incremental = dump(dsn, f"views.{name}")
            rebuild(name, s, spark=spark)
            assert dump(dsn, f"views.{name}") == incremental, name


def test_a_run_aggregates_only_the_new_records(spark: Any, fresh_db: str, tmp_path: Path) -> None:
    w = LogWriter(tmp_path / "log")
    w.topic(DEP)
    w.topic(WD)
    versions: dict[str, int] = {}
    _append(w, [(i, "MoneyDeposited", 1000 + i, i) for i in range(40)], versions)
    s = _settings(fresh_db, tmp_path / "log")
    assert run("totals", s, spark=spark).rows == 40
    assert run("totals_full", s, spark=spark).rows == 40
    _append(
        w, [(3, "MoneyDeposited", 500, 99), (3, "MoneyWithdrawn", 200, 100), (7, "MoneyWithdrawn", 1, 101)], versions
    )
    w.close()
    merged = run("totals", s, spark=spark)
    assert (merged.records, merged.rows) == (3, 2)  # two accounts' partials, not all 40 rows again
    assert run("totals_full", s, spark=spark).rows == 40  # no merge declared: recomputed whole
    rows = dump(fresh_db, "views.totals")
    assert "(acc-3,15.03,2.00,3)" in rows and "(acc-7,10.07,0.01,2)" in rows
    assert rows == dump(fresh_db, "views.totals_full")
    modes = {r.name: r.mode for r in status(s)}
    assert modes == {
        "totals": "incremental",
        "extremes": "incremental",
        "totals_full": "recomputes: no merge declared",
        "totals_keyed": "incremental",
        "totals_cdc": "recomputes: shop.public.accounts is a CDC topic: its updates and deletes do not decompose",
    }


def test_a_deleted_stream_compacted_away_counts_until_a_rebuild(spark: Any, fresh_db: str, tmp_path: Path) -> None:
    """Kafka Streams' aggregation semantics: the table keeps what the runs read; a rebuild over the
    compacted log no longer sees a deleted stream's events (docs: "Deleted streams and retention")."""
    w = LogWriter(tmp_path / "log")
    w.log.create_topic(DEP, TopicConfig(partitions=1, policy="tombstones"))  # as the event store makes it
    w.topic(WD)
    versions: dict[str, int] = {}
    _append(w, [(1, "MoneyDeposited", 1000, 1), (2, "MoneyDeposited", 2000, 2)], versions)
    s = _settings(fresh_db, tmp_path / "log")
    run("totals", s, spark=spark)
    w.log.append(DEP, 0, [(canonical_json("acc-2"), None, 3, None)])  # stream acc-2 deleted
    _append(w, [(1, "MoneyDeposited", 100, 10 + i) for i in range(40)], versions)  # seals the segments
    w.log.compact(DEP, now_ms=1_800_000_000_000)
    w.close()
    assert run("totals", s, spark=spark).rows == 1  # the tombstone contributes nothing
    assert dump(fresh_db, "views.totals") == ["(acc-1,50.00,0.00,41)", "(acc-2,20.00,0.00,1)"]
    rebuild("totals", s, spark=spark)
    assert dump(fresh_db, "views.totals") == ["(acc-1,50.00,0.00,41)"]


def _rows(frame: Any) -> list[tuple[Any, ...]]:
    """Every record of a records frame, the VARIANT as its JSON text, in log order."""
    from pyspark.sql import functions as F

    shown = [F.to_json("value_v").alias("value_v") if c == "value_v" else F.col(c) for c in frame.columns]
    return [tuple(r) for r in frame.select(*shown).orderBy("topic", "partition", "offset").collect()]


@pytest.mark.parametrize("name", ["totals", "totals_keyed"])
def test_records_read_in_the_driver_are_the_frame_spark_reads(spark: Any, tmp_path: Path, name: str) -> None:
    """`build` cannot tell the paths apart: same schema (types, nullability, the VARIANT), same
    rows, from a checkpoint inside a sealed segment (Parquet copies) to the active one's end."""
    w = LogWriter(tmp_path / "log")
    w.topic(DEP)
    w.topic(WD)
    versions: dict[str, int] = {}
    _append(w, [(i % 5, sorted(KINDS)[i % 3], 100 + i, i) for i in range(80)], versions)
    w.close()
    log = LocalSource(tmp_path / "log")
    p = resolve(MODULES, (), name)
    hi = log.ends(p.reads)
    lo = {tp: end // 3 for tp, end in hi.items()}
    assert all(lo.values())
    spark_read = log.records_frame(
        spark, modules=MODULES, mirror=(), name=name, topics=p.reads, lo=lo, hi=hi, max_bytes=1 << 20
    )
    driver_read = driver_frame(spark, p, read_range(log, lo, hi))
    assert driver_read.schema == spark_read.schema
    assert driver_read.rdd.getNumPartitions() == 1
    rows = _rows(driver_read)
    assert rows == _rows(spark_read)
    assert len(rows) == sum(hi[tp] - lo[tp] for tp in hi)
    log.close()


def _tasks_per_stage(spark: Any, group: str) -> list[int]:
    """The task count of every stage the jobs of `group` ran (Spark's status tracker)."""
    tracker = spark.sparkContext.statusTracker()
    stages = [s for j in tracker.getJobIdsForGroup(group) for s in tracker.getJobInfo(j).stageIds]
    return [tracker.getStageInfo(s).numTasks for s in stages if tracker.getStageInfo(s) is not None]


@pytest.mark.parametrize(("driver_read", "one_task"), [(1_000, True), (0, False)])
def test_a_small_run_is_one_task_per_stage(
    spark: Any, fresh_db: str, tmp_path: Path, driver_read: int, one_task: bool
) -> None:
    """Read in the driver, the new records are one in-memory partition and the build's shuffle
    one more: no task reads the log, none waits on an empty shuffle partition."""
    w = LogWriter(tmp_path / "log")
    w.topic(DEP)
    w.topic(WD)
    versions: dict[str, int] = {}
    _append(w, [(i % 5, "MoneyDeposited", 100 + i, i) for i in range(30)], versions)
    s = _settings(fresh_db, tmp_path / "log", driver_read)
    run("totals", s, spark=spark)
    _append(w, [(i % 5, "MoneyWithdrawn", 10 + i, 100 + i) for i in range(12)], versions)
    w.close()
    group = f"small-run-{driver_read}"
    spark.sparkContext.setJobGroup(group, "a merging run")
    try:
        assert run("totals", s, spark=spark).records == 12
    finally:
        spark.sparkContext.setLocalProperty("spark.jobGroup.id", None)
    tasks = _tasks_per_stage(spark, group)
    assert tasks and (set(tasks) == {1}) is one_task, tasks
