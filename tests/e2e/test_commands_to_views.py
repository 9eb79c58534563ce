"""The whole loop as a user runs it: commands → event store → capture (outbox) → log →
`tributary project run` (PySpark) → `views.account_balances` → `GET /views/account_balances`."""

from __future__ import annotations

import subprocess
import sys
from decimal import Decimal
from pathlib import Path

import httpx
import psycopg
import pytest

from tests.servers import free_port, serving
from tests.waiting import run_process
from tributary.eventstore.examples.bank import bank_account
from tributary.eventstore.handler import CommandHandler
from tributary.eventstore.migrate import run_migrations
from tributary.eventstore.store import EventStore

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return run_process(
        [sys.executable, "-c", "from tributary.api.cli.main import main; main()", *args],
        what=f"tributary {args[0]}",
        cwd=ROOT,
    )


def test_commands_become_a_queryable_view(fresh_db: str, tmp_path: Path) -> None:
    run_migrations(fresh_db)
    port = free_port()
    config = tmp_path / "t.toml"
    config.write_text(
        f'[service]\ndsn = "{fresh_db}"\n[log]\nroot = "{tmp_path / "log"}"\npartitions = 2\n'
        f'[projections]\nmodules = ["tributary.projections.examples.account_balances"]\nspark_master = "local[2]"\n'
        f"[api]\nport = {port}\n"
    )
    store = EventStore.connect(fresh_db)
    handler = CommandHandler(store, {"account": bank_account()})
    handler.handle("account", "alice", "open", {"owner": "alice", "overdraft_limit": "100"})
    handler.handle("account", "alice", "deposit", {"amount": "30.00"})
    handler.handle("account", "alice", "withdraw", {"amount": "50.00"})  # into overdraft: fee 5.00
    handler.handle("account", "bob", "open", {"owner": "bob"})
    handler.handle("account", "bob", "deposit", {"amount": "12.34"})
    store.close()

    assert (r := _cli("init", "--config", str(config))).returncode == 0, r.stdout + r.stderr
    assert (r := _cli("capture", "--config", str(config), "--until-idle", "2")).returncode == 0, r.stderr
    run = _cli("project", "run", "account_balances", "--config", str(config))
    assert run.returncode == 0, run.stderr[-3000:]
    assert "account_balances" in run.stdout

    with psycopg.connect(fresh_db) as conn:
        rows = conn.execute("SELECT * FROM views.account_balances ORDER BY 1").fetchall()
        cols = [d.name for d in conn.execute("SELECT * FROM views.account_balances LIMIT 0").description or []]
    by_id = {r[0]: dict(zip(cols, r, strict=True)) for r in rows}
    assert set(by_id) == {"alice", "bob"}
    assert Decimal(by_id["alice"]["balance"]) == Decimal("-25.00")
    assert Decimal(by_id["bob"]["balance"]) == Decimal("12.34")
    assert Decimal(by_id["alice"]["fees_charged"]) == Decimal("5.00") and by_id["alice"]["last_version"] == 4

    with serving(config, port, err_path=tmp_path / "serve.err") as base:
        views = httpx.get(base + "/views").json()
        assert [v["name"] for v in views] == ["account_balances"] and views[0]["build"] is not None
        page = httpx.get(base + "/views/account_balances", params={"limit": 1}).json()
        assert len(page["rows"]) == 1 and page["next_cursor"]
        rest = httpx.get(base + "/views/account_balances", params={"limit": 1, "cursor": page["next_cursor"]}).json()
        assert {page["rows"][0]["account_id"], rest["rows"][0]["account_id"]} == {"alice", "bob"} and rest[
            "next_cursor"
        ] is None
        bad = httpx.get(base + "/views/account_balances", params={"nope": "1"})
        assert bad.status_code == 422 and "nope" in bad.text
        assert httpx.get(base + "/views/missing").status_code == 404

        # /metrics after a real capture and a real projection run: every operating series has data.
        from prometheus_client.parser import text_string_to_metric_families

        families = {f.name: f for f in text_string_to_metric_families(httpx.get(base + "/metrics").text)}
        samples = {(s.name, tuple(sorted(s.labels.items()))): s.value for f in families.values() for s in f.samples}
        assert samples[("tributary_projection_lag_records", (("projection", "account_balances"),))] == 0
        assert samples[("tributary_slot_lag_bytes", (("source", "_eventstore"),))] >= 0
        assert ("tributary_capture_changes_total", (("source", "_eventstore"),)) in samples  # the rows came by snapshot
        assert samples[("tributary_capture_commit_seconds_count", ())] >= 1
        assert samples[("tributary_log_records", (("topic", "events.account"),))] == 6
        assert ("tributary_log_bytes", (("topic", "events.account"),)) in samples
        assert "tributary_rebuild_progress_ratio" in families and "tributary_command_seconds" in families
