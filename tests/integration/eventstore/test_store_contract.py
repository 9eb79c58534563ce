"""The event store against a real PostgreSQL: expected versions, idempotency, concurrency, handler."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from decimal import Decimal

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tributary.eventstore.errors import ConcurrencyConflict, IdempotencyMismatch, PartialDuplicateBatch
from tributary.eventstore.examples.bank import bank_account
from tributary.eventstore.handler import CommandHandler
from tributary.eventstore.migrate import head_revision, migrations_current, run_migrations
from tributary.eventstore.model import NewEvent
from tributary.eventstore.store import EventStore

pytestmark = pytest.mark.integration


@pytest.fixture
def store(fresh_db: str) -> Iterator[EventStore]:
    assert not migrations_current(fresh_db)
    assert run_migrations(fresh_db) == head_revision()
    assert migrations_current(fresh_db)
    s = EventStore.connect(fresh_db, max_size=10)
    try:
        yield s
    finally:
        s.close()


def ev(n: int = 1, t: str = "Happened") -> list[NewEvent]:
    return [NewEvent(type=t, data={"i": i, "amount": Decimal("0.10")}) for i in range(n)]


@pytest.mark.parametrize(
    ("prepared", "expected", "ok"),
    [
        (0, "no_stream", True),
        (2, "no_stream", False),
        (0, "stream_exists", False),
        (2, "stream_exists", True),
        (0, "any", True),
        (2, "any", True),
        (0, 0, True),
        (2, 2, True),
        (2, 1, False),
        (2, 3, False),
        (0, 1, False),
        (2, 7, False),
        (0, -1, False),
    ],
)
@pytest.mark.parametrize("size", [1, 3])  # one event and a batch take different statements
def test_expected_version_matrix(store: EventStore, prepared: int, expected: object, ok: bool, size: int) -> None:
    if prepared:
        store.append("s", "t", ev(prepared), "no_stream")
    if ok:
        batch = ev(size)
        result = store.append("s", "t", batch, expected)  # type: ignore[arg-type]
        versions = list(range(prepared + 1, prepared + size + 1))
        assert result.version == prepared + size and [e.version for e in result.events] == versions
        again = store.append("s", "t", batch, expected)  # type: ignore[arg-type]
        assert again.duplicate and [e.position for e in again.events] == [e.position for e in result.events]
    else:
        with pytest.raises(ConcurrencyConflict) as info:
            store.append("s", "t", ev(size), expected)  # type: ignore[arg-type]
        assert info.value.actual == prepared and info.value.expected == expected
    assert [e.version for e in store.read_stream("s")] == list(range(1, store.version("s") + 1))


def test_event_ids_make_appends_idempotent_and_partial_overlap_is_refused(store: EventStore) -> None:
    batch = ev(3)
    first = store.append("s", "t", batch, "no_stream")
    again = store.append("s", "t", batch, "no_stream")  # same ids: a no-op with the original answer
    assert again.duplicate and again.version == first.version == 3
    assert [e.event_id for e in again.events] == [e.event_id for e in first.events]
    assert store.version("s") == 3
    with pytest.raises(PartialDuplicateBatch):
        store.append("s", "t", [batch[0], *ev(1)], "any")
    assert store.version("s") == 3


def test_money_stays_exact_and_reads_go_both_ways(store: EventStore) -> None:
    store.append("s", "t", ev(5), "no_stream")
    fwd = store.read_stream("s", from_version=2, limit=2)
    assert [e.version for e in fwd] == [2, 3] and fwd[0].data["amount"] == "0.10"
    bwd = store.read_stream("s", from_version=0, backwards=True, limit=2)
    assert [e.version for e in bwd] == [5, 4]
    store.append("other", "t", ev(1), "no_stream")
    assert [e.stream_id for e in store.read_all(stream_type="t")] == ["s"] * 5 + ["other"]


def test_concurrent_appenders_keep_every_stream_gapless(store: EventStore) -> None:
    streams = [f"acc-{i}" for i in range(20)]
    successes: list[tuple[str, int]] = []
    conflicts: list[tuple[str, int, int]] = []
    lock = threading.Lock()

    def worker(seed: int) -> None:
        import random

        rng = random.Random(seed)
        for _ in range(500):
            s = rng.choice(streams)
            expected = store.version(s)
            try:
                r = store.append(s, "t", ev(1), expected)
                with lock:
                    successes.append((s, r.version))
            except ConcurrencyConflict as exc:
                with lock:
                    conflicts.append((s, exc.expected, exc.actual))  # type: ignore[arg-type]

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(successes) + len(conflicts) == 8 * 500
    for s in streams:
        versions = [e.version for e in store.read_stream(s)]
        assert versions == list(range(1, len(versions) + 1)), f"{s} has a gap or a repeat"
    assert sorted(successes) == sorted((e.stream_id, e.version) for s in streams for e in store.read_stream(s))
    for _, expected, actual in conflicts:
        assert actual > expected  # the true version moved on past what the loser read


def test_handler_idempotency_retries_and_snapshots(store: EventStore, fresh_db: str) -> None:
    handler = CommandHandler(store, {"account": bank_account()}, snapshot_every=3)
    first = handler.handle("account", "a1", "open", {"owner": "ada"}, command_id="c1")
    again = handler.handle("account", "a1", "open", {"owner": "ada"}, command_id="c1")
    assert again.replayed and again.to_json() == first.to_json() and store.version("a1") == 1
    with pytest.raises(IdempotencyMismatch):
        handler.handle("account", "a1", "open", {"owner": "eve"}, command_id="c1")
    for _ in range(7):
        handler.handle("account", "a1", "deposit", {"amount": "1.10"})
    with_snap = handler.load("account", "a1")
    without = handler.load("account", "a1", use_snapshot=False)
    assert with_snap.from_snapshot > 0 and without.from_snapshot == 0
    assert with_snap.state == without.state and with_snap.version == without.version == 8
    assert str(with_snap.state.balance) == "7.70"  # type: ignore[attr-defined]
    with pytest.raises(ConcurrencyConflict) as info:
        handler.handle("account", "a1", "deposit", {"amount": "1"}, expected_version=3)
    assert info.value.actual == 8
    with psycopg.connect(fresh_db) as conn:
        assert conn.execute("SELECT count(*) FROM eventstore.commands").fetchone() == (1,)


def test_concurrent_commands_on_one_account_are_retried(store: EventStore) -> None:
    handler = CommandHandler(store, {"account": bank_account()}, max_retries=50, snapshot_every=None)
    handler.handle("account", "hot", "open", {"owner": "ada"})
    errors: list[Exception] = []

    def deposit() -> None:
        for _ in range(25):
            try:
                handler.handle("account", "hot", "deposit", {"amount": "1.00"}, command_id=str(uuid.uuid4()))
            except Exception as exc:  # noqa: BLE001 - collected and asserted below
                errors.append(exc)

    threads = [threading.Thread(target=deposit) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    state = handler.load("account", "hot")
    assert state.version == 101 and str(state.state.balance) == "100.00"  # type: ignore[attr-defined]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    st.lists(
        st.tuples(st.integers(0, 1), st.integers(-2, 2), st.sampled_from(["append", "read", "version"]), st.booleans()),
        min_size=1,
        max_size=20,
    )
)
def test_two_stores_skipping_lookups_of_known_versions_never_make_a_gap(
    fresh_db: str, ops: list[tuple[int, int, str, bool]]
) -> None:
    """Each store skips the lookup of n when it saw n committed (its appends, its reads); the other
    store's appends move the stream on without it knowing. An append succeeds iff its expected
    version is the stream's true one, and the stream stays gapless."""
    run_migrations(fresh_db)
    stores = [EventStore.connect(fresh_db, max_size=2) for _ in range(2)]
    stream = f"p-{uuid.uuid4().hex[:8]}"
    true_version = 0
    try:
        for who, offset, op, batch in ops:
            s = stores[who]
            if op == "read":
                s.read_stream(stream)
            elif op == "version":
                assert s.version(stream) == true_version
            else:
                expected = true_version + offset
                events = ev(2 if batch else 1)
                if offset == 0:
                    result = s.append(stream, "t", events, expected)
                    true_version += len(events)
                    assert result.version == true_version
                else:
                    with pytest.raises(ConcurrencyConflict) as info:
                        s.append(stream, "t", events, expected)
                    assert info.value.actual == true_version
        versions = [e.version for e in stores[0].read_stream(stream)]
        assert versions == list(range(1, true_version + 1))
    finally:
        for s in stores:
            s.close()
