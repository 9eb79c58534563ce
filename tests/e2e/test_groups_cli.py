"""`tributary groups list | describe | reset` as a user runs them, on a real service database and log."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.integration.capture.helpers import cli
from tests.integration.projections.helpers import LogWriter
from tributary.consumers import GroupCoordinator
from tributary.eventstore.migrate import run_migrations

pytestmark = pytest.mark.e2e

TOPIC = "events.account"


def test_list_describe_and_reset_a_group(fresh_db: str, tmp_path: Path) -> None:
    config = tmp_path / "t.toml"
    config.write_text(f'[service]\ndsn = "{fresh_db}"\n[log]\nroot = "{tmp_path / "log"}"\n')
    before = cli("groups", "list", "--config", str(config))
    assert before.returncode == 1 and "tributary init" in before.stderr
    run_migrations(fresh_db)
    assert "no consumer groups yet" in cli("groups", "list", "--config", str(config)).stdout

    writer = LogWriter(tmp_path / "log")
    writer.topic(TOPIC, partitions=2)
    for i in range(10):
        writer.append(TOPIC, f"s{i % 3}", i, "Deposited", 1_000_000 + i * 1000, amount=i)
    writer.commit()
    # a session that outlives the CLI calls however loaded the machine: the member stays live until it leaves
    with GroupCoordinator(fresh_db, tmp_path / "log", auto_offset_reset="earliest", session_timeout_ms=600_000) as c:
        m = c.join("billing", [TOPIC], member_id="worker-1")
        batch = c.fetch("billing", "worker-1", m.generation)
        ends = {(r.topic, r.partition): r.offset + 1 for r in batch.records}
        c.commit("billing", "worker-1", m.generation, [(t, p, o) for (t, p), o in ends.items()])

        listed = cli("groups", "list", "--config", str(config))
        assert listed.returncode == 0, listed.stderr
        assert listed.stdout.split("\n")[0].split() == ["GROUP", "MEMBERS", "GENERATION", "LAG"]
        assert listed.stdout.split("\n")[1].split() == ["billing", "1", str(m.generation), "0"]
        described = cli("groups", "describe", "billing", "--config", str(config))
        assert described.returncode == 0, described.stderr
        assert "worker-1" in described.stdout and "1 live member(s), lag 0" in described.stdout

        busy = cli("groups", "reset", "billing", "--to-earliest", "--config", str(config))
        assert busy.returncode == 1 and "live member" in busy.stderr and busy.stderr.count("\n") == 1
        c.leave("billing", "worker-1")

    both = cli("groups", "reset", "billing", "--to-earliest", "--to-latest", "--config", str(config))
    assert both.returncode == 1 and "exactly one" in both.stderr
    dry = cli("groups", "reset", "billing", "--to-earliest", "--dry-run", "--json", "--config", str(config))
    assert dry.returncode == 0, dry.stderr
    assert {o["offset"] for o in json.loads(dry.stdout)["offsets"]} == {0}
    assert json.loads(cli("groups", "describe", "billing", "--json", "--config", str(config)).stdout)["lag"] == 0

    at = cli("groups", "reset", "billing", "--to-datetime", "1970-01-01T00:16:45", "--config", str(config))
    assert at.returncode == 0, at.stderr
    assert "reset to datetime" in at.stdout
    lag = json.loads(cli("groups", "describe", "billing", "--json", "--config", str(config)).stdout)["lag"]
    assert lag == 5  # records at 1,005,000 ms and later
    off = cli("groups", "reset", "billing", "--to-offset", "1", "--topic", TOPIC, "--config", str(config))
    assert off.returncode == 0, off.stderr
    missing = cli("groups", "describe", "nobody", "--config", str(config))
    assert missing.returncode == 1 and "no consumer group 'nobody'" in missing.stderr
