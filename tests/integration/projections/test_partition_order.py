"""Real Spark, Postgres and log: a fold keeps log order within a topic-partition, whatever the
records' event times say (a snapshot read's `ts_ms` is when the snapshot ran)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.integration.projections.helpers import LogWriter, dump
from tributary.log.local import canonical_json
from tributary.projections.runner import RunSettings, rebuild, run

pytestmark = pytest.mark.integration

HERE = Path(__file__).parent
TOPIC = "shop.public.orders"
SNAPSHOT_TS = 1_700_000_000_325  # when the snapshot ran
STREAMED_TS = 1_700_000_000_306  # a commit just after the snapshot point, before the reads


def _change(w: LogWriter, key: int, op: str, status: str, ts: int) -> None:
    k = canonical_json({"id": key})
    value = {
        "before": None,
        "after": {"id": key, "status": status},
        "op": op,
        "source": {"ts_ms": ts, "snapshot": op == "r"},
        "ts_ms": ts,
    }
    w.log.append(TOPIC, w.log.partition_for(TOPIC, k), [(k, orjson.dumps(value), ts, None)])


def test_a_streamed_change_wins_over_an_earlier_committed_snapshot_row(
    spark: Any, fresh_db: str, tmp_path: Path
) -> None:
    w = LogWriter(tmp_path / "log")
    w.topic(TOPIC)
    for key in range(1, 7):
        _change(w, key, "r", "new", SNAPSHOT_TS)
    _change(w, 1, "u", "paid", STREAMED_TS)  # the same rebuild reads both
    w.commit()
    s = RunSettings(
        dsn=fresh_db,
        log_root=tmp_path / "log",
        modules=(str(HERE / "order_projections.py"),),
        spark_master="local[2]",
        shuffle_partitions=2,
    )
    assert run("order_status", s, spark=spark).rebuilt
    rows = dump(fresh_db, "views.order_status")
    assert '("{""id"":1}",paid)' in rows, rows
    _change(w, 2, "u", "shipped", STREAMED_TS + 1)  # a later run resumes key 2: no recompute
    w.commit()
    w.close()
    result = run("order_status", s, spark=spark)
    assert result.records == 1 and result.recomputed == 0
    incremental = dump(fresh_db, "views.order_status")
    assert '("{""id"":2}",shipped)' in incremental, incremental
    assert len(incremental) == 6
    rebuilt = rebuild("order_status", s, spark=spark)
    assert rebuilt.build == 2
    assert dump(fresh_db, "views.order_status") == incremental
