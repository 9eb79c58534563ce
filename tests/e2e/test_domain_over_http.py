"""A domain written in the test suite, served by `tributary serve` from a file named in the config:
its commands over HTTP, and a code change behind stored snapshots (a `state_version` bump) served
after a restart without touching the database."""

from __future__ import annotations

from pathlib import Path

import httpx
import psycopg
import pytest

from tests.servers import free_port, serving
from tributary.eventstore.migrate import run_migrations

pytestmark = pytest.mark.e2e

VARIANT = "from tests.domains.tally import make_tally\n\nAGGREGATE = make_tally(state_version={v}, scale={scale})\n"


def test_a_state_version_bump_serves_the_new_fold_after_a_restart(fresh_db: str, tmp_path: Path) -> None:
    run_migrations(fresh_db)
    (tmp_path / "domain").mkdir()
    module = tmp_path / "domain" / "tally.py"
    module.write_text(VARIANT.format(v=1, scale=1))
    port = free_port()
    config = tmp_path / "t.toml"
    config.write_text(
        f'[service]\ndsn = "{fresh_db}"\n[log]\nroot = "{tmp_path / "log"}"\n[api]\nport = {port}\n'
        '[eventstore]\nmodules = ["domain/tally.py"]\nsnapshot_every = 3\n'
    )
    with serving(config, port, err_path=tmp_path / "serve-1.err") as base, httpx.Client(base_url=base) as api:
        for n in (1, 2, 3, 4):
            got = api.post("/commands/tally/t-1", json={"type": "add", "data": {"n": n}, "expected_version": n - 1})
            assert got.status_code == 200 and got.json()["version"] == n, got.text
        assert api.get("/streams/t-1/state").json()["total"] == 10
        stale = api.post("/commands/tally/t-1", json={"type": "add", "data": {"n": 1}, "expected_version": 1})
        assert stale.status_code == 409 and stale.json()["actual"] == 4
        unknown = api.post("/commands/tally/t-1", json={"type": "subtract", "data": {}})
        assert unknown.status_code == 422 and "commands: add, close" in unknown.json()["detail"]
        invalid = api.post("/commands/tally/t-1", json={"type": "add", "data": {"n": 0}})
        assert invalid.status_code == 422 and invalid.json()["fields"][0]["loc"] == ["n"]
        missing = api.post("/commands/account/a-1", json={"type": "open", "data": {"owner": "x"}})
        assert missing.status_code == 404 and "known: tally" in missing.json()["detail"]
    with psycopg.connect(fresh_db) as conn:
        assert conn.execute("SELECT version, state_version FROM eventstore.snapshots").fetchall() == [(3, 1)]

    module.write_text(VARIANT.format(v=2, scale=10))  # evolve changed, and the state version with it
    with serving(config, port, err_path=tmp_path / "serve-2.err") as base, httpx.Client(base_url=base) as api:
        assert api.get("/streams/t-1/state").json()["total"] == 100  # not 10 + a stale snapshot's fold
        got = api.post("/commands/tally/t-1", json={"type": "add", "data": {"n": 5}})
        assert got.status_code == 200 and got.json()["version"] == 5
        assert api.get("/streams/t-1/state").json()["total"] == 150
    with psycopg.connect(fresh_db) as conn:
        assert conn.execute("SELECT version, state_version FROM eventstore.snapshots").fetchall() == [(5, 2)]
