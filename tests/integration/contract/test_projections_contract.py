"""Projections on every log backend: a Postgres table captured into the log, folded, aggregated
and mirrored on Spark (real Spark, real Postgres): a rebuild and incremental runs give the views SQL
says they should, and a rebuild over the same log gives the same tables; runs read the configured
backend (the local log's files, or Kafka read by the executors themselves)."""

# ruff: noqa: F811  # `spark`, imported below, is the tests' parameter

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import orjson
import psycopg
import pytest

from tests.backends import LogBackend
from tests.integration.capture.helpers import cli
from tests.integration.projections.conftest import spark  # noqa: F401  # the suite's one SparkSession
from tests.integration.projections.helpers import dump
from tests.integration.projections.orders_views import (
    NAMES,
    PROJECTIONS,
    capture_until_idle,
    expected_views,
    orders_config,
    views,
)
from tributary.api.settings.config import load_settings
from tributary.projections.runner import RunSettings, rebuild, run, status

pytestmark = pytest.mark.integration


def _setup(tmp_path: Path, dsn: str, backend: LogBackend) -> Path:
    return orders_config(tmp_path, dsn, backend, PROJECTIONS, mirror=True)


def _settings(config: Path, backend: LogBackend) -> RunSettings:
    s = RunSettings.from_settings(load_settings(config))
    assert (s.kafka is not None) == (backend.kafka_options() is not None)  # `[log] backend` reaches the runner
    return dataclasses.replace(s, kafka_split_offsets=7)  # on Kafka: several ranges per partition


def test_rebuild_and_incremental_runs_give_the_same_views(
    fresh_db: str, tmp_path: Path, backend: LogBackend, spark: Any
) -> None:
    config = _setup(tmp_path, fresh_db, backend)
    s = _settings(config, backend)
    inserted = [(g, f"c{g % 4}", g) for g in range(1, 31)]
    for name in NAMES:
        done = rebuild(name, s, spark=spark)
        assert done.rebuilt and done.records > 0
    assert views(fresh_db) == expected_views(fresh_db, inserted)

    with psycopg.connect(fresh_db, autocommit=True) as conn:
        conn.execute("INSERT INTO orders SELECT g, 'c' || (g % 5), g * 10 FROM generate_series(31, 45) g")
        conn.execute("UPDATE orders SET amount = amount + 1 WHERE id % 6 = 0")
        conn.execute("DELETE FROM orders WHERE id % 7 = 0")
    inserted += [(g, f"c{g % 5}", g * 10) for g in range(31, 46)]
    capture_until_idle(config)
    lagging = {st.name: st.lag for st in status(s)}
    assert all(lagging[name] > 0 for name in NAMES), lagging
    for name in NAMES:
        done = run(name, s, spark=spark)
        assert not done.rebuilt and done.records > 0
    incremental = views(fresh_db)
    assert incremental == expected_views(fresh_db, inserted)
    assert {st.name: st.lag for st in status(s)} == dict.fromkeys(NAMES, 0)

    for name in NAMES:  # a rebuild over the same log gives the same tables
        rebuild(name, s, spark=spark)
    assert views(fresh_db) == incremental

    shown = cli("project", "status", "--json", "--config", str(config))  # as a user asks
    assert shown.returncode == 0, shown.stderr
    assert {r["name"]: r["lag"] for r in orjson.loads(shown.stdout)} == dict.fromkeys(NAMES, 0)
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        conn.execute("INSERT INTO orders VALUES (46, 'c9', 46), (47, 'c1', 47)")
    capture_until_idle(config)
    ran = cli("project", "run", "customer_folds", "--config", str(config), timeout=600)
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert "customer_folds: caught up" in ran.stdout, ran.stdout
    want = expected_views(fresh_db, [*inserted, (46, "c9", 46), (47, "c1", 47)])
    assert dump(fresh_db, "views.customer_folds") == want["customer_folds"]
