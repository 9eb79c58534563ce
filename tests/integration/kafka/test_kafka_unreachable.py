"""A Kafka cluster that cannot be reached: the projection status a user (or a `/metrics` scrape)
asks for fails in one line within seconds instead of hanging for a run's timeout."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.integration.capture.helpers import cli
from tributary.eventstore.migrate import run_migrations
from tributary.projections.runner import STATUS_TIMEOUT_S

pytestmark = pytest.mark.integration

PROJECTION = """
from tributary.projections.definition import Projection, Table

PROJECTIONS = [
    Projection(name="orders_seen", version=1, topics=("shop.public.orders",),
               table=Table.of({"id": "bigint"}, ["id"]), build=lambda records: records.select("offset")),
]
"""


def test_project_status_on_an_unreachable_kafka_is_one_line_within_seconds(fresh_db: str, tmp_path: Path) -> None:
    run_migrations(fresh_db)
    (tmp_path / "p.py").write_text(PROJECTION)
    config = tmp_path / "t.toml"
    config.write_text(
        f"""
[service]
dsn = "{fresh_db}"

[projections]
modules = ["{tmp_path / "p.py"}"]

[log]
backend = "kafka"
root = "{tmp_path / "log"}"

[log.kafka]
bootstrap_servers = "127.0.0.1:1"
client = {{ "log_level" = "0", "sasl.password" = "s3cret-value" }}
"""
    )
    t0 = time.monotonic()
    done = cli("project", "status", "--config", str(config), timeout=60)
    took = time.monotonic() - t0
    assert done.returncode != 0
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Kafka at 127.0.0.1:1" in lines[0], done.stderr
    assert "s3cret-value" not in done.stderr + done.stdout
    assert took < STATUS_TIMEOUT_S + 15, f"status waited {took:.1f} s for an unreachable cluster"
