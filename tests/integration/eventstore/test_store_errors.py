"""The store's driver errors a caller can act on come out as its own: a value PostgreSQL refuses is
`InvalidValue`, a database that does not answer is `StoreUnavailable`."""

from __future__ import annotations

import pytest

from tests.pg import PgServer
from tributary.eventstore.errors import InvalidValue, StoreUnavailable
from tributary.eventstore.migrate import run_migrations
from tributary.eventstore.model import NewEvent
from tributary.eventstore.store import EventStore

pytestmark = pytest.mark.integration


def test_event_data_postgres_cannot_hold_is_an_invalid_value(fresh_db: str) -> None:
    run_migrations(fresh_db)
    store = EventStore.connect(fresh_db, max_size=2)
    try:
        for data in ({"a": "x\x00y"}, {"\x00": 1}):
            with pytest.raises(InvalidValue) as info:
                store.append("s-1", "t", [NewEvent(type="Happened", data=data)])
            assert "cannot be stored" in str(info.value) and "\n" not in str(info.value)
        assert store.read_stream("s-1") == []
        with pytest.raises(InvalidValue):
            store.read_stream("s\x00")
    finally:
        store.close()


def test_a_database_that_does_not_answer_is_store_unavailable(pg_server: PgServer) -> None:
    store = EventStore.connect(pg_server.dsn("no_such_database"), max_size=1, timeout=1.0)
    try:
        with pytest.raises(StoreUnavailable) as info:
            store.append("s-1", "t", [NewEvent(type="Happened", data={})])
        assert "retry" in str(info.value)
        with pytest.raises(StoreUnavailable):
            store.read_stream("s-1")
    finally:
        store.close()
