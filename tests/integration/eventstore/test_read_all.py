"""Reads beyond one stream against a real PostgreSQL: `$all` paged in commit order and gap-safe
(a lower position that commits late is delayed, never skipped), a stream type's events, the
streams of a type, a stream backwards, and the tables' metadata equal to the migrated schema."""

from __future__ import annotations

import random
import uuid
import warnings
from collections.abc import Iterator

import psycopg
import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import create_engine, pool
from sqlalchemy.exc import SAWarning

from tributary.eventstore.errors import UnknownPosition
from tributary.eventstore.migrate import run_migrations, sqlalchemy_url
from tributary.eventstore.model import NewEvent, RecordedEvent
from tributary.eventstore.schema import SCHEMA, metadata
from tributary.eventstore.store import EventStore

pytestmark = pytest.mark.integration


@pytest.fixture
def dsn(fresh_db: str) -> str:
    run_migrations(fresh_db)
    return fresh_db


@pytest.fixture
def store(dsn: str) -> Iterator[EventStore]:
    s = EventStore.connect(dsn, max_size=4)
    try:
        yield s
    finally:
        s.close()


def _page_all(store: EventStore, *, limit: int, stream_type: str | None = None, after: int = 0) -> list[RecordedEvent]:
    out: list[RecordedEvent] = []
    while page := store.read_all(after=after, limit=limit, stream_type=stream_type):
        out.extend(page)
        after = page[-1].position
    return out


def test_all_pages_across_streams_in_commit_order(store: EventStore) -> None:
    rng = random.Random(7)
    committed: list[tuple[str, int]] = []  # (stream, version) in the order the appends committed
    for i in range(60):
        stream = f"s{rng.randrange(8)}"
        kind = "even" if int(stream[1:]) % 2 == 0 else "odd"
        events = [NewEvent(type="Happened", data={"i": i, "j": j}) for j in range(rng.choice((1, 1, 3)))]
        result = store.append(stream, kind, events)
        committed.extend((stream, e.version) for e in result.events)
    for limit in (1, 7, 1000):
        paged = _page_all(store, limit=limit)
        assert [(e.stream_id, e.version) for e in paged] == committed
        assert [e.position for e in paged] == sorted(e.position for e in paged)
    evens = _page_all(store, limit=5, stream_type="even")
    assert [(e.stream_id, e.version) for e in evens] == [c for c in committed if int(c[0][1:]) % 2 == 0]
    # Continuing from any event's position gives exactly what follows it.
    middle = paged[25].position
    assert [e.position for e in store.read_all(after=middle, limit=1000)] == [e.position for e in paged[26:]]


def test_a_lower_position_that_commits_late_is_delayed_not_skipped(store: EventStore, dsn: str) -> None:
    store.append("before", "t", [NewEvent(type="Happened", data={})])
    seen = store.read_all(after=0)
    assert [e.stream_id for e in seen] == ["before"]
    with psycopg.connect(dsn) as slow:  # a transaction: its INSERT takes a position now, commits later
        slow.execute(
            "INSERT INTO eventstore.events (stream_id, stream_type, version, event_id, type, data)"
            " VALUES ('late', 't', 1, %s, 'Happened', '{}')",
            (uuid.uuid4(),),
        )
        early = store.append("early", "t", [NewEvent(type="Happened", data={})]).events[0]
        with psycopg.connect(dsn, autocommit=True) as naive:
            # What a reader paging by position alone sees now: `early`, whose position is above
            # `late`'s, which is not visible yet. Continuing after `early` would skip `late`.
            visible = naive.execute(
                "SELECT stream_id FROM eventstore.events WHERE global_position > %s ORDER BY global_position",
                (seen[-1].position,),
            ).fetchall()
            assert visible == [("early",)]
        assert store.read_all(after=seen[-1].position) == []  # held back while `late` may still commit
        slow.commit()
    late = store.read_stream("late")[0]
    assert late.position < early.position
    rest = store.read_all(after=seen[-1].position)
    assert [e.stream_id for e in rest] == ["late", "early"]
    assert _page_all(store, limit=1) == seen + rest


def test_an_aborted_transaction_leaves_no_hole(store: EventStore, dsn: str) -> None:
    store.append("a", "t", [NewEvent(type="Happened", data={})])
    with psycopg.connect(dsn) as aborted:
        aborted.execute(
            "INSERT INTO eventstore.events (stream_id, stream_type, version, event_id, type, data)"
            " VALUES ('gone', 't', 1, %s, 'Happened', '{}')",
            (uuid.uuid4(),),
        )
        store.append("b", "t", [NewEvent(type="Happened", data={})])
        aborted.rollback()
    assert [e.stream_id for e in _page_all(store, limit=1)] == ["a", "b"]


def test_unknown_position(store: EventStore) -> None:
    store.append("a", "t", [NewEvent(type="Happened", data={})])
    with pytest.raises(UnknownPosition, match="no event at position 999"):
        store.read_all(after=999)


def test_streams_of_a_type_paged(store: EventStore) -> None:
    for i in range(7):
        store.append(f"acc-{i}", "account", [NewEvent(type="Opened", data={})] * 1)
        store.append(f"acc-{i}", "account", [NewEvent(type="Touched", data={}) for _ in range(i)])
    store.append("other-1", "other", [NewEvent(type="Opened", data={})])
    pages, after = [], ""
    while page := store.streams("account", after=after, limit=3):
        pages.append([(s.stream_id, s.version) for s in page])
        after = page[-1].stream_id
    assert pages == [
        [("acc-0", 1), ("acc-1", 2), ("acc-2", 3)],
        [("acc-3", 4), ("acc-4", 5), ("acc-5", 6)],
        [("acc-6", 7)],
    ]
    assert [s.stream_id for s in store.streams("other")] == ["other-1"]


def test_a_stream_backwards_from_a_version(store: EventStore) -> None:
    store.append("s", "t", [NewEvent(type="E", data={"i": i}) for i in range(1, 8)])
    assert [e.version for e in store.read_stream("s", from_version=5, backwards=True, limit=3)] == [5, 4, 3]
    assert [e.version for e in store.read_stream("s", from_version=0, backwards=True, limit=2)] == [7, 6]
    assert [e.version for e in store.read_stream("s", from_version=6, limit=5)] == [6, 7]


def test_the_tables_metadata_is_the_migrated_schema(dsn: str) -> None:
    """eventstore/schema.py and the migrations describe the same tables: Alembic's autogenerate
    comparison finds nothing to do after `upgrade head`."""
    engine = create_engine(sqlalchemy_url(dsn), poolclass=pool.NullPool)
    try:
        with engine.connect() as conn:
            context = MigrationContext.configure(
                conn,
                opts={
                    "include_schemas": True,
                    "include_name": lambda name, kind, parents: (
                        name == SCHEMA if kind == "schema" else name != "alembic_version"
                    ),
                },
            )
            with warnings.catch_warnings():  # SQLAlchemy reflects no type for xid8 (Alembic then skips it)
                warnings.filterwarnings("ignore", "Did not recognize type 'xid8'", SAWarning)
                assert compare_metadata(context, metadata) == []
    finally:
        engine.dispose()
