"""A service database that does not answer in time, through a real `tributary serve`: `GET /views`
answers a one-line 503 instead of listing every view as never built, and the background refresh of
/metrics says in the server log that its query was cancelled instead of reporting nothing."""

from __future__ import annotations

from pathlib import Path

import httpx
import psycopg
import pytest
from psycopg.conninfo import make_conninfo

from tests.servers import free_port, served
from tests.waiting import tree_cpu_s, wait_progress
from tributary.projections.definition import Projection, Table
from tributary.projections.store import Store

pytestmark = pytest.mark.e2e

MODULE = """
from tributary.projections.definition import Projection, Table

PROJECTION = Projection(
    name="things", version=1, topics=("none",), table=Table.of({"id": "bigint"}, ["id"]), build=lambda df: df
)
"""


def test_a_locked_builds_table_is_a_503_and_a_logged_refresh_failure(fresh_db: str, tmp_path: Path) -> None:
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        store = Store(conn)
        store.ensure()
        p = Projection(name="things", version=1, topics=("none",), table=Table.of({"id": "bigint"}, ["id"]), build=len)
        store.swap(store.new_build(p))
    (tmp_path / "things.py").write_text(MODULE)
    impatient = make_conninfo(fresh_db, options="-c statement_timeout=300")  # every query of the server
    port = free_port()
    config = tmp_path / "t.toml"
    config.write_text(
        f'[service]\ndsn = "{impatient}"\n[log]\nroot = "{tmp_path / "log"}"\n'
        f'[projections]\nmodules = ["{tmp_path / "things.py"}"]\n[api]\nport = {port}\nstatus_refresh_s = 0.2\n'
    )
    err = tmp_path / "serve.err"
    base = f"http://127.0.0.1:{port}"
    with served(config, port, err_path=err) as server, httpx.Client(base_url=base, timeout=30) as client:
        assert [v["build"] for v in client.get("/views").json()] == [1]
        with psycopg.connect(fresh_db) as locker:  # a transaction holding the builds table
            locker.execute("LOCK TABLE tributary_projections.builds IN ACCESS EXCLUSIVE MODE")
            got = client.get("/views")
            assert got.status_code == 503, got.text
            assert got.json()["code"] == "unavailable"
            assert got.json()["detail"] == "the service database did not answer (timed out, lost or refused); retry"
            wait_progress(
                lambda: "QueryCanceled" in err.read_text(),
                lambda: tree_cpu_s(server.pid),
                what="the refresh's cancelled status query in the server log",
                ceiling=120,  # it refreshes 5 times a second: a server that keeps running without saying it is wrong
            )
            assert "refreshing /readyz and /metrics failed" in err.read_text()
        assert [v["build"] for v in client.get("/views").json()] == [1]
