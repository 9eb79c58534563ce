"""A command takes one pooled connection and few round trips (counted from libpq's protocol trace:
each run of client messages is one wait for the server), and the pieces
sent together stay atomic: a command record that cannot be stored takes its events with it."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from pydantic import BaseModel

from tributary.eventstore.errors import IdempotencyMismatch
from tributary.eventstore.examples.bank import AccountState, bank_account
from tributary.eventstore.handler import CommandHandler
from tributary.eventstore.migrate import run_migrations
from tributary.eventstore.store import EventStore

pytestmark = pytest.mark.integration


@pytest.fixture
def store(fresh_db: str) -> Iterator[EventStore]:
    run_migrations(fresh_db)
    s = EventStore.connect(fresh_db, max_size=1)  # one connection: the trace sees every statement
    try:
        yield s
    finally:
        s.close()


class Trace:
    """libpq's trace of the store's one pooled connection, read as round trips."""

    def __init__(self, store: EventStore, path: Path) -> None:
        self.store, self.path, self.file, self.seen = store, path, path.open("w"), 0
        self.checkouts = 0  # the trace's own pooled connection requests
        self._trace(on=True)

    def _trace(self, *, on: bool) -> None:
        self.checkouts += 1
        with self.store.pool.connection() as conn:
            if on:
                # psycopg prepares a statement on its 5th use (one more round trip, once per
                # connection): off, so that each count is the steady state's.
                conn.prepare_threshold = None
                conn.pgconn.trace(self.file.fileno())
                conn.pgconn.set_trace_flags(psycopg.pq.Trace.SUPPRESS_TIMESTAMPS)
            else:
                conn.pgconn.untrace()  # flushes libpq's buffer

    def close(self) -> None:
        self._trace(on=False)
        self.file.close()

    def round_trips(self) -> int:
        """Runs of client messages since the last call: each is one wait for the server."""
        self._trace(on=False)
        lines = self.path.read_text().splitlines()
        self._trace(on=True)
        lines, self.seen = lines[self.seen :], len(lines)
        sides = [side for side in (line.split("\t", 1)[0] for line in lines) if side in ("F", "B")]
        return sum(1 for i, side in enumerate(sides) if side == "F" and (i == 0 or sides[i - 1] == "B"))


def requests(store: EventStore, trace: Trace) -> int:
    """Pooled connections handed out, but for the trace's own."""
    return int(store.pool.get_stats().get("requests_num", 0)) - trace.checkouts


@pytest.fixture
def trace(store: EventStore, tmp_path: Path) -> Iterator[Trace]:
    t = Trace(store, tmp_path / "trace")
    try:
        yield t
    finally:
        t.close()


def test_round_trips_and_connections_per_command(store: EventStore, trace: Trace, fresh_db: str) -> None:
    handler = CommandHandler(store, {"account": bank_account()}, snapshot_every=3)
    trace.round_trips()
    before = requests(store, trace)
    handler.handle("account", "a1", "open", {"owner": "ada"})
    assert trace.round_trips() == 2  # load (snapshot + events, one statement), append
    handler.handle("account", "a1", "deposit", {"amount": "1"}, command_id="c1")
    assert trace.round_trips() == 3  # load + the record pipelined; insert; record + commit
    replay = handler.handle("account", "a1", "deposit", {"amount": "1"}, command_id="c1")
    assert replay.replayed and trace.round_trips() == 1
    handler.handle("account", "a1", "deposit", {"amount": "2"})  # version 3: a snapshot point
    assert trace.round_trips() == 2  # the snapshot travels with the insert
    assert requests(store, trace) - before == 4  # one pooled connection per command
    with psycopg.connect(fresh_db) as conn:
        assert conn.execute("SELECT version FROM eventstore.snapshots WHERE stream_id = 'a1'").fetchone() == (3,)
    handler.handle("account", "a1", "deposit", {"amount": "4"})
    assert trace.round_trips() == 2  # loaded from the snapshot, in the same one statement
    loaded = handler.load("account", "a1")
    assert trace.round_trips() == 1
    assert loaded.from_snapshot == 3 and loaded.version == 4
    assert loaded.state == handler.load("account", "a1", use_snapshot=False).state


def _twin(store: EventStore, stream: str, command_id: str) -> CommandHandler:
    """A handler whose first `decide` lets a twin command (same command id, on `stream`) through
    another handler first, as a concurrent request would."""
    bank = bank_account()
    other = CommandHandler(EventStore(store.pool), {"account": bank})
    left = [1]

    def decide(state: AccountState, command: BaseModel) -> Any:
        if left[0]:
            left[0] = 0
            other.handle("account", stream, "open", {"owner": "ada"}, command_id=command_id)
        return bank.decide(state, command)

    return CommandHandler(EventStore(store.pool), {"account": dataclasses.replace(bank, decide=decide)})


@pytest.fixture
def roomy(fresh_db: str) -> Iterator[EventStore]:
    run_migrations(fresh_db)
    s = EventStore.connect(fresh_db, max_size=3)
    try:
        yield s
    finally:
        s.close()


def test_a_twin_that_stored_first_is_replayed(roomy: EventStore) -> None:
    """The twin appends first: this command's append conflicts, its retry finds the twin's record."""
    result = _twin(roomy, "t1", "k1").handle("account", "t1", "open", {"owner": "ada"}, command_id="k1")
    assert result.replayed and result.version == 1
    assert [e.version for e in roomy.read_stream("t1")] == [1]


def test_a_refused_command_record_takes_the_events_with_it(roomy: EventStore, fresh_db: str) -> None:
    """The twin used the id for another stream: this command's insert succeeds, its record cannot be
    stored, and the transaction they share leaves neither."""
    with pytest.raises(IdempotencyMismatch):
        _twin(roomy, "elsewhere", "k2").handle("account", "t2", "open", {"owner": "ada"}, command_id="k2")
    assert roomy.read_stream("t2") == [] and roomy.version("elsewhere") == 1
    with psycopg.connect(fresh_db) as conn:
        assert conn.execute("SELECT stream_id FROM eventstore.commands").fetchall() == [("elsewhere",)]
