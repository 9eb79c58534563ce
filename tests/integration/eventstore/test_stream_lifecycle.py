"""A stream's lifecycle against a real PostgreSQL: metadata with its own expected version, limits
honoured by reads at once and removed by the scavenge (appends going on meanwhile, versions
continuing after removed events), soft delete and recreate, hard delete refused for good."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import psycopg
import pytest
from psycopg_pool import ConnectionPool

from tributary.eventstore.errors import (
    ConcurrencyConflict,
    MetadataConflict,
    StreamDeleted,
    StreamNotFound,
    UnknownPosition,
)
from tributary.eventstore.examples.bank import bank_account
from tributary.eventstore.handler import CommandHandler
from tributary.eventstore.migrate import run_migrations
from tributary.eventstore.model import NewEvent
from tributary.eventstore.store import EventStore, StreamMetadata

pytestmark = pytest.mark.integration


@pytest.fixture
def dsn(fresh_db: str) -> str:
    run_migrations(fresh_db)
    return fresh_db


@pytest.fixture
def store(dsn: str) -> Iterator[EventStore]:
    s = EventStore.connect(dsn, max_size=6)
    try:
        yield s
    finally:
        s.close()


def ev(n: int = 1) -> list[NewEvent]:
    return [NewEvent(type="Happened", data={"i": i}) for i in range(n)]


def versions(store: EventStore, stream: str, **kw: object) -> list[int]:
    return [e.version for e in store.read_stream(stream, **kw)]  # type: ignore[arg-type]


def stored_versions(dsn: str, stream: str) -> list[int]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute("SELECT version FROM eventstore.events WHERE stream_id = %s ORDER BY 1", (stream,))
        return [int(r[0]) for r in rows]


def test_metadata_has_its_own_expected_version(store: EventStore) -> None:
    store.append("s", "thing", ev(2))
    assert store.stream_metadata("s") == StreamMetadata()
    first = store.set_stream_metadata("s", StreamMetadata(max_count=5, custom={"owner": "ops"}), expected_version=0)
    assert first.version == 1
    with pytest.raises(MetadataConflict) as conflict:
        store.set_stream_metadata("s", StreamMetadata(max_count=1), expected_version=0)
    assert conflict.value.actual == 1
    with pytest.raises(MetadataConflict):
        store.set_stream_metadata("s", StreamMetadata(max_count=1), expected_version=2)
    got = store.stream_metadata("s")
    assert (got.max_count, got.custom, got.version) == (5, {"owner": "ops"}, 1)
    assert store.set_stream_metadata("s", StreamMetadata(truncate_before=2), expected_version=1).version == 2
    assert store.set_stream_metadata("s", StreamMetadata(), expected_version="any").version == 3
    # metadata of a stream with no events yet: written ahead of it, version 1
    assert store.set_stream_metadata("later", StreamMetadata(max_age=60), expected_version=0).version == 1
    assert store.version("s") == 2  # the metadata is no event of the stream


def test_truncate_before_hides_at_once_and_scavenge_removes(store: EventStore, dsn: str) -> None:
    store.append("s", "thing", ev(10))
    store.append("other", "thing", ev(3))
    before = store.read_all()
    store.set_stream_metadata("s", StreamMetadata(truncate_before=7))
    assert versions(store, "s") == [7, 8, 9, 10]
    assert versions(store, "s", backwards=True, from_version=0) == [10, 9, 8, 7]
    assert versions(store, "s", backwards=True, from_version=5) == []
    assert [(e.stream_id, e.version) for e in store.read_all() if e.stream_id == "s"] == [
        ("s", v) for v in (7, 8, 9, 10)
    ]
    assert stored_versions(dsn, "s") == list(range(1, 11))  # hidden, still stored
    assert store.scavenge(batch=4) == 6
    assert stored_versions(dsn, "s") == [7, 8, 9, 10]
    assert stored_versions(dsn, "other") == [1, 2, 3]
    # `$all` continues after the place of a removed event
    removed = before[0]
    assert removed.stream_id == "s" and removed.version == 1
    assert [e.version for e in store.read_all(after=removed.position) if e.stream_id == "s"] == [7, 8, 9, 10]
    assert store.append("s", "thing", ev(1), 10).version == 11
    assert store.scavenge() == 0


def test_max_count_and_max_age(store: EventStore, dsn: str) -> None:
    store.append("count", "thing", ev(6))
    store.set_stream_metadata("count", StreamMetadata(max_count=2))
    assert versions(store, "count") == [5, 6]
    store.append("count", "thing", ev(1))
    assert versions(store, "count") == [6, 7]
    store.append("age", "thing", ev(4))
    with psycopg.connect(dsn) as conn:  # the first three were recorded an hour ago
        conn.execute(
            "UPDATE eventstore.events SET recorded_at = now() - interval '1 hour' "
            "WHERE stream_id = 'age' AND version <= 3"
        )
    store.set_stream_metadata("age", StreamMetadata(max_age=600))
    assert versions(store, "age") == [4]
    assert store.scavenge() == 5 + 3
    assert stored_versions(dsn, "count") == [6, 7]
    assert stored_versions(dsn, "age") == [4]


def test_versions_continue_after_every_event_is_removed(store: EventStore, dsn: str) -> None:
    store.append("s", "thing", ev(5))
    with psycopg.connect(dsn) as conn:
        conn.execute("UPDATE eventstore.events SET recorded_at = now() - interval '1 hour' WHERE stream_id = 's'")
    store.set_stream_metadata("s", StreamMetadata(max_age=60))
    assert versions(store, "s") == []
    assert store.scavenge() == 5
    assert stored_versions(dsn, "s") == []
    assert store.version("s") == 5
    for expected in ("no_stream", 0, 4, 6):
        with pytest.raises(ConcurrencyConflict) as conflict:
            store.append("s", "thing", ev(1), expected)  # type: ignore[arg-type]
        assert conflict.value.actual == 5
    fresh = EventStore(store.pool)  # no known versions: the exact statement's own proof
    assert fresh.append("s", "thing", ev(1), 5).version == 6
    assert store.append("s", "thing", ev(2), "stream_exists").version == 8


def test_a_stale_known_version_cannot_reuse_a_removed_version(store: EventStore, dsn: str) -> None:
    store.append("s", "thing", ev(3))
    assert store.read_stream("s")[-1].version == 3  # the store now knows 3
    other = EventStore(store.pool)
    other.append("s", "thing", ev(3), 3)
    other.set_stream_metadata("s", StreamMetadata(max_count=1))
    other.scavenge()
    assert stored_versions(dsn, "s") == [6]
    with pytest.raises(ConcurrencyConflict):
        store.append("s", "thing", ev(1), 3)  # 4 was removed: never stored again
    assert stored_versions(dsn, "s") == [6]


def test_soft_delete_and_recreate(store: EventStore, dsn: str) -> None:
    store.append("acc", "thing", ev(3))
    store.save_snapshot("acc", "thing", 3, {"x": 1}, 1)
    assert store.delete_stream("acc") == 3
    assert store.read_stream("acc") == []
    assert store.version("acc") == 3
    with pytest.raises(StreamNotFound):
        store.delete_stream("acc")
    assert store.snapshot("acc") is None
    assert store.append("acc", "thing", ev(2), "no_stream").version == 5
    assert versions(store, "acc") == [4, 5]
    assert [e.version for e in store.read_all() if e.stream_id == "acc"] == [4, 5]
    store.scavenge()
    assert stored_versions(dsn, "acc") == [4, 5]
    with pytest.raises(ConcurrencyConflict):
        store.append("acc", "thing", ev(1), "no_stream")


def test_soft_deleted_account_is_recreated_by_a_command(store: EventStore) -> None:
    handler = CommandHandler(store, {"account": bank_account()}, snapshot_every=2)
    handler.handle("account", "a1", "open", {"owner": "ann"})
    handler.handle("account", "a1", "deposit", {"amount": "10.00"})
    store.delete_stream("a1")
    store.scavenge()
    assert handler.load("account", "a1").version == 0
    result = handler.handle("account", "a1", "open", {"owner": "bob"}, expected_version="no_stream")
    assert result.version == 3
    loaded = handler.load("account", "a1")
    assert loaded.version == 3
    assert loaded.state.model_dump(mode="json")["owner"] == "bob"


def test_hard_delete_refuses_forever(store: EventStore, dsn: str) -> None:
    store.append("gone", "thing", ev(3))
    store.delete_stream("gone", hard=True)
    for expected in ("any", "no_stream", "stream_exists", 3, 0):
        for size in (1, 2):
            with pytest.raises(StreamDeleted):
                store.append("gone", "thing", ev(size), expected)  # type: ignore[arg-type]
    with pytest.raises(StreamDeleted):
        store.read_stream("gone")
    with pytest.raises(StreamDeleted):
        store.stream_metadata("gone")
    with pytest.raises(StreamDeleted):
        store.delete_stream("gone")
    with pytest.raises(StreamDeleted):
        store.delete_stream("gone", hard=True)
    assert [e for e in store.read_all() if e.stream_id == "gone"] == []
    store.scavenge()
    assert stored_versions(dsn, "gone") == []
    with pytest.raises(StreamDeleted):
        store.append("gone", "thing", ev(1))
    handler = CommandHandler(store, {"account": bank_account()}, snapshot_every=2)
    with pytest.raises(StreamDeleted):
        handler.handle("account", "gone", "open", {"owner": "ann"})


def test_appends_go_on_while_a_scavenge_removes_a_large_stream(dsn: str) -> None:
    """Each batch is a short transaction locking only the rows it removes: an append (to the
    stream being scavenged, and to another) completes between every two batches, and none waits
    on a lock (lock_timeout would fail it)."""
    scavenger = EventStore.connect(dsn, max_size=2)
    writer = EventStore(
        ConnectionPool(
            dsn, min_size=1, max_size=2, open=True, kwargs={"autocommit": True, "options": "-c lock_timeout=5000"}
        )
    )
    try:
        for _ in range(20):
            scavenger.append("big", "thing", ev(1000))
        scavenger.set_stream_metadata("big", StreamMetadata(truncate_before=19_001))
        appended: list[int] = []
        progress = threading.Condition()
        done = threading.Event()
        errors: list[BaseException] = []

        def append_loop() -> None:
            try:
                while not done.is_set():
                    for stream in ("big", "small"):
                        result = writer.append(stream, "thing", ev(1))
                        with progress:
                            appended.append(result.version)
                            progress.notify_all()
            except BaseException as exc:  # noqa: BLE001  (reported by the test)
                errors.append(exc)
                with progress:
                    progress.notify_all()

        def pause() -> None:
            """Between batches: wait until an append completed since the last one."""
            with progress:
                seen = len(appended)
                assert progress.wait_for(lambda: len(appended) > seen or bool(errors), timeout=120)
            assert not errors, errors

        thread = threading.Thread(target=append_loop, daemon=True)
        thread.start()
        try:
            removed = scavenger.scavenge(batch=1000, pause=pause)
        finally:
            done.set()
            thread.join(timeout=120)
        assert not errors, errors
        assert removed == 19_000
        assert len(appended) >= 19
        big = [e.version for e in scavenger.read_stream("big")]
        assert big[0] == 19_001 and big == list(range(19_001, big[-1] + 1))
        assert stored_versions(dsn, "big")[0] == 19_001
    finally:
        scavenger.close()
        writer.close()


def test_the_streams_of_a_type_after_scavenges_and_deletes(store: EventStore) -> None:
    """Listed while events are stored (also once the first ones are removed), not once deleted."""
    for name in ("a", "b", "c", "d", "e"):
        store.append(name, "thing", ev(3))
    store.set_stream_metadata("a", StreamMetadata(truncate_before=3))
    store.delete_stream("b")
    store.delete_stream("c", hard=True)
    store.delete_stream("d")
    store.append("d", "thing", ev(1), "no_stream")
    store.append("other", "elsewhere", ev(1))
    assert [(s.stream_id, s.version) for s in store.streams("thing")] == [("a", 3), ("d", 4), ("e", 3)]
    store.scavenge()
    assert [(s.stream_id, s.version) for s in store.streams("thing")] == [("a", 3), ("d", 4), ("e", 3)]
    assert [s.stream_id for s in store.streams("thing", limit=1)] == ["a"]
    assert [s.stream_id for s in store.streams("thing", after="a", limit=1)] == ["d"]  # past the deleted ones
    assert [s.stream_id for s in store.streams("thing", after="d", limit=2)] == ["e"]


def test_removed_positions_are_kept_for_a_while_then_forgotten(store: EventStore, dsn: str) -> None:
    """A reader holding the position of a removed event continues after it while the store keeps
    removed positions; once they are older than the keep interval, a scavenge's prune forgets them
    and such a reader gets UnknownPosition instead of a place in `$all`."""
    store.append("s", "thing", ev(3))
    store.append("t", "thing", ev(1))
    held = store.read_all()[1].position  # the reader stopped after the second event of `s`
    store.set_stream_metadata("s", StreamMetadata(max_count=1))
    assert store.scavenge() == 2
    assert [(e.stream_id, e.version) for e in store.read_all(after=held)] == [("s", 3), ("t", 1)]
    assert store.prune_removed(3600) == 0  # removed just now: kept
    with psycopg.connect(dsn) as conn:
        conn.execute("UPDATE eventstore.removed_events SET removed_at = now() - interval '2 hours'")
    assert [(e.stream_id, e.version) for e in store.read_all(after=held)] == [("s", 3), ("t", 1)]
    assert store.prune_removed(3600, batch=1) == 2
    with psycopg.connect(dsn) as conn:
        assert conn.execute("SELECT count(*) FROM eventstore.removed_events").fetchone() == (0,)
    with pytest.raises(UnknownPosition):
        store.read_all(after=held)
