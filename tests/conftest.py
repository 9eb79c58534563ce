"""Shared fixtures: a real PostgreSQL (with wal2json) for the whole session, fresh databases per test."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from tests.kafka_fixtures import (  # noqa: F401  (fixtures: the Kafka tests' and the contract suite's)
    kafka,
    kafka_broker,
    kafka_broker_session,
    kafka_cluster3,
    kafka_cluster3_session,
    kafka_mock,
)
from tests.markers import pytest_collection_modifyitems  # noqa: F401  (a hook: every test has its level)
from tests.pg import REPO_ROOT, PgServer, fresh_database, start_server

# Property tests check laws, not speed: a loaded machine must not fail an example by its time
# (hypothesis' 200 ms deadline) nor a test by its input generation (too_slow). Timing thresholds
# belong in bench/.
settings.register_profile("suite", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("suite")

# Spark's Python workers import the tests' own projection modules (`tests.…`) by name: they
# see the checkout through PYTHONPATH, which the session hands to them at start.
if str(REPO_ROOT) not in os.environ.get("PYTHONPATH", "").split(os.pathsep):
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH")) if p)


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PgServer]:
    """One real server per test session (TRIBUTARY_TEST_PG=embedded|docker|<dsn>)."""
    mode = os.environ.get("TRIBUTARY_TEST_PG", "embedded")
    workdir = Path(tempfile.mkdtemp(prefix="tributary-test-"))
    server = start_server(mode, workdir)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def fresh_db(pg_server: PgServer) -> Iterator[str]:
    """DSN of a new, empty database, dropped (with its replication slots) after the test."""
    with fresh_database(pg_server) as dsn:
        yield dsn
