"""Which implementation runs, across processes: a capture daemon run with `TRIBUTARY_IMPL=python`
says so in its status file, and the API (compiled) shows both in `/metrics`."""

from __future__ import annotations

from pathlib import Path

import httpx
import psycopg
import pytest

from tests.integration.capture.helpers import cli, wait_for, write_config
from tests.servers import serving
from tributary import __version__
from tributary.api.devdb.embedded import free_port
from tributary.capture.status import read_status
from tributary.eventstore.migrate import run_migrations

pytestmark = pytest.mark.integration


def test_metrics_show_the_api_and_the_capture_daemon_implementations(fresh_db: str, tmp_path: Path) -> None:
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
        conn.execute("INSERT INTO t SELECT g, 'v' FROM generate_series(1, 10) g")
    log_root = tmp_path / "log"
    port = free_port()
    config = write_config(
        tmp_path / "t.toml",
        dsn=fresh_db,
        log_root=log_root,
        extra=f'[api]\nport = {port}\nstatus_refresh_s = 0.5\n\n[service]\ndsn = "{fresh_db}"\n',
    )
    run_migrations(fresh_db)
    res = cli("capture", "--config", str(config), "--until-idle", "1", env={"TRIBUTARY_IMPL": "python"})
    assert res.returncode == 0, res.stderr
    assert (read_status(log_root) or {}).get("build") == {"version": __version__, "impl": "python", "compiled": ""}

    capture = f'tributary_build_info{{compiled="",impl="python",process="capture",version="{__version__}"}} 1.0'
    api = (
        f'tributary_build_info{{compiled="capture._hotpath,log._typed",impl="compiled",process="api",'
        f'version="{__version__}"}} 1.0'
    )
    with serving(config, port, err_path=tmp_path / "serve.err") as base:

        def both_shown() -> bool:  # the API reads the status file every `status_refresh_s`
            lines = httpx.get(base + "/metrics").text.splitlines()
            return capture in lines and api in lines

        wait_for(both_shown, timeout=60, what="/metrics to show the API's and capture's implementations")
