"""The event store tests' shared fixture: a migrated fresh database and a store on it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tributary.eventstore.migrate import run_migrations
from tributary.eventstore.store import EventStore


@pytest.fixture
def store(fresh_db: str) -> Iterator[EventStore]:
    run_migrations(fresh_db)
    s = EventStore.connect(fresh_db, max_size=4)
    try:
        yield s
    finally:
        s.close()
