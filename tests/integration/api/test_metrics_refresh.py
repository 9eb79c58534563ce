"""The metrics' background refresh on a real PostgreSQL: a service database that cannot be reached
leaves the projections' lag unreported while the other figures still count, but a status query
that times out once connected is the refresh's error (its loop logs it), not "nothing to report"."""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

from tributary.api.devdb.embedded import free_port
from tributary.api.http.metrics import Metrics
from tributary.api.settings.config import LogSettings, Settings
from tributary.projections.definition import Projection, Table
from tributary.projections.store import Store

pytestmark = pytest.mark.integration

THINGS = {
    "things": Projection(
        name="things", version=1, topics=("none",), table=Table.of({"id": "bigint"}, ["id"]), build=len
    )
}


def _settings(tmp_path: Path) -> Settings:
    return Settings(log=LogSettings(root=tmp_path / "log"))


def test_a_status_query_that_times_out_is_raised(fresh_db: str, tmp_path: Path) -> None:
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        Store(conn).ensure()
    impatient = make_conninfo(fresh_db, options="-c statement_timeout=200")
    metrics = Metrics()
    metrics.refresh(_settings(tmp_path), dsn=impatient, projections=THINGS)
    assert b'tributary_projection_lag_records{projection="things"} 0.0' in metrics.render()
    with psycopg.connect(fresh_db) as locker:  # a transaction holding the builds table
        locker.execute("LOCK TABLE tributary_projections.builds IN ACCESS EXCLUSIVE MODE")
        with pytest.raises(psycopg.errors.QueryCanceled):
            metrics.refresh(_settings(tmp_path), dsn=impatient, projections=THINGS)


def test_an_unreachable_database_leaves_the_lag_unreported(tmp_path: Path) -> None:
    metrics = Metrics()
    metrics.refresh(_settings(tmp_path), dsn=f"postgresql://127.0.0.1:{free_port()}/none", projections=THINGS)
    assert b"tributary_projection_lag_records{" not in metrics.render()
