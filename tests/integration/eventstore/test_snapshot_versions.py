"""Snapshots follow the code: a snapshot carries its aggregate's `state_version`; one of another
version (or one whose state no longer validates) is ignored and replaced at the next snapshot point."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from tests.domains.tally import Tally, make_tally
from tributary.eventstore.handler import CommandHandler
from tributary.eventstore.store import EventStore

pytestmark = pytest.mark.integration


def handler(store: EventStore, *, state_version: int, scale: int) -> CommandHandler:
    return CommandHandler(store, {"tally": make_tally(state_version=state_version, scale=scale)}, snapshot_every=3)


def snapshot_row(dsn: str, stream_id: str) -> tuple[Any, ...] | None:
    with psycopg.connect(dsn) as conn:
        return conn.execute(
            "SELECT version, state_version, state FROM eventstore.snapshots WHERE stream_id = %s", (stream_id,)
        ).fetchone()


def forge(dsn: str, stream_id: str, state: dict[str, Any], state_version: int) -> None:
    with psycopg.connect(dsn) as conn:
        conn.execute(
            "UPDATE eventstore.snapshots SET state = %s, state_version = %s WHERE stream_id = %s",
            (Jsonb(state), state_version, stream_id),
        )


def test_a_state_version_bump_serves_the_new_fold_and_replaces_the_snapshot(store: EventStore, fresh_db: str) -> None:
    old = handler(store, state_version=1, scale=1)
    for n in (1, 2, 3, 4):
        old.handle("tally", "t-1", "add", {"n": n})
    assert snapshot_row(fresh_db, "t-1") == (3, 1, {"status": "open", "total": 6, "count": 3})

    # A forged snapshot of the same state version is used: that is what a snapshot is for ...
    forge(fresh_db, "t-1", {"status": "open", "total": 1000, "count": 3}, 1)
    loaded = old.load("tally", "t-1")
    assert (loaded.from_snapshot, loaded.state) == (3, Tally(total=1004, count=4))

    # ... and is how an `evolve` fix would keep serving the old fold, but for the version bump:
    new = handler(store, state_version=2, scale=10)
    loaded = new.load("tally", "t-1")
    assert (loaded.from_snapshot, loaded.version, loaded.state) == (0, 4, Tally(total=100, count=4))

    # The command path folds with the new code, and the next snapshot point replaces the old snapshot.
    new.handle("tally", "t-1", "add", {"n": 5})
    assert snapshot_row(fresh_db, "t-1") == (5, 2, {"status": "open", "total": 150, "count": 5})
    loaded = new.load("tally", "t-1")
    assert (loaded.from_snapshot, loaded.state) == (5, Tally(total=150, count=5))
    assert loaded.state == new.load("tally", "t-1", use_snapshot=False).state

    # Going back to the old code is as safe: it does not use the newer state.
    loaded = old.load("tally", "t-1")
    assert (loaded.from_snapshot, loaded.state) == (0, Tally(total=15, count=5))


def test_a_snapshot_whose_state_no_longer_validates_is_ignored(store: EventStore, fresh_db: str) -> None:
    h = handler(store, state_version=1, scale=1)
    for n in (1, 2, 3):
        h.handle("tally", "t-2", "add", {"n": n})
    forge(fresh_db, "t-2", {"status": "open", "sum": 6}, 1)  # a field renamed without a version bump
    loaded = h.load("tally", "t-2")
    assert (loaded.from_snapshot, loaded.state) == (0, Tally(total=6, count=3))
    h.handle("tally", "t-2", "close", {})
    assert h.load("tally", "t-2").state.status == "closed"  # type: ignore[attr-defined]
