"""Fixtures of the end-to-end tests that serve the API under each HTTP parser."""

from __future__ import annotations

import pytest

from tributary.eventstore.migrate import run_migrations


@pytest.fixture(params=["h11", "httptools"])
def http(request: pytest.FixtureRequest) -> str:
    """`[api] http`: the test runs against both parsers, each under the connection guard."""
    return str(request.param)


@pytest.fixture
def db(fresh_db: str) -> str:
    """A new database with the event store's schema."""
    run_migrations(fresh_db)
    return fresh_db
