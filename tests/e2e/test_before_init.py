"""A newcomer who skips `tributary init`: `serve`, `capture` and `project run` each say to run it
(one line; 503 from the API, exit 1 from the CLI) instead of a 500 or a run over nothing."""

from __future__ import annotations

from pathlib import Path

import httpx
import psycopg
import pytest

from tests.integration.capture.helpers import cli
from tests.servers import free_port, serving

pytestmark = pytest.mark.e2e

LINE = "run `tributary init`"


def _config(tmp_path: Path, dsn: str, port: int) -> Path:
    config = tmp_path / "t.toml"
    config.write_text(
        f'[service]\ndsn = "{dsn}"\n[log]\nroot = "{tmp_path / "log"}"\n'
        f'[[sources]]\nname = "shop"\ndsn = "{dsn}"\nslot = "before_init"\ninclude = ["public.*"]\n'
        f'[projections]\nmodules = ["tributary.projections.examples.account_balances"]\n'
        '[eventstore]\nmodules = ["tributary.eventstore.examples.bank"]\n'
        f"[api]\nport = {port}\n"
    )
    return config


def test_serve_before_init_answers_503_naming_init(fresh_db: str, tmp_path: Path) -> None:
    port = free_port()
    config = _config(tmp_path, fresh_db, port)
    with serving(config, port, err_path=tmp_path / "serve.err") as base:
        command = {"type": "open", "data": {"owner": "ada"}}
        for method, path, body in (
            ("POST", "/commands/account/ada", command),
            ("GET", "/streams/ada", None),
        ):
            r = httpx.request(method, base + path, json=body, timeout=30)
            assert r.status_code == 503, (path, r.status_code, r.text)
            detail = r.json()["detail"]
            assert LINE in detail and "\n" not in detail, detail


def test_capture_and_project_run_before_init_exit_1_naming_init(fresh_db: str, tmp_path: Path) -> None:
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE orders (id int PRIMARY KEY)")
        conn.execute("INSERT INTO orders VALUES (1)")
    config = _config(tmp_path, fresh_db, free_port())
    for args in (("capture", "--until-idle", "1"), ("project", "run", "account_balances")):
        r = cli(*args, "--config", str(config), timeout=300)
        assert r.returncode == 1, (args, r.returncode, r.stdout, r.stderr)
        assert LINE in r.stderr, (args, r.stderr)
        assert "Traceback" not in r.stderr, r.stderr
    # after init both work
    assert (r := cli("init", "--config", str(config), timeout=300)).returncode == 0, r.stdout + r.stderr
    r = cli("capture", "--until-idle", "1", "--config", str(config), timeout=300)
    assert r.returncode == 0, r.stderr
