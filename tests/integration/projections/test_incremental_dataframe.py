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
from tributary.projections.runner import RunSettings, rebuild, run, status

pytestmark = pytest.mark.integration

HERE = Path(__file__).parent
DEP, WD = "events.deposits", "events.withdrawals"
KINDS = {"MoneyDeposited": DEP, "MoneyWithdrawn": WD, "AccountOpened": DEP}
MERGING = ("totals", "extremes")

_event = st.tuples(
    st.integers(0, 4),  # account
    st.sampled_from(sorted(KINDS)),
    st.integers(1, 99_999),  # cents
    st.integers(0, 10_000_000),  # event time (ms)
)
_batch = st.tuples(st.lists(_event, max_size=12), st.booleans())  # (events, run after it)


def _settings(dsn: str, root: Path) -> RunSettings:
    return RunSettings(
        dsn=dsn,
        log_root=root,
        modules=(str(HERE / "incremental_projections.py"),),
        spark_master="local[2]",
        shuffle_partitions=2,
    )


def _append(w: LogWriter, events: list[tuple[int, str, int, int]], versions: dict[str, int]) -> None:
    for account, kind, cents, at in events:
        stream = f"acc-{account}"
        versions[stream] = versions.get(stream, 0) + 1
        data = {} if kind == "AccountOpened" else {"amount": f"{cents // 100}.{cents % 100:02d}"}
        w.append(KINDS[kind], stream, versions[stream], kind, at, **data)
    w.commit()


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batches=st.lists(_batch, min_size=1, max_size=4))
def test_any_sequence_of_incremental_runs_equals_a_rebuild(
    spark: Any, pg_server: PgServer, batches: list[tuple[list[tuple[int, str, int, int]], bool]]
) -> None:
    with fresh_database(pg_server) as dsn, tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "log"
        w = LogWriter(root)
        w.topic(DEP)
        w.topic(WD)
        versions: dict[str, int] = {}
        s = _settings(dsn, root)
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
