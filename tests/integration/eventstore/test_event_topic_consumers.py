"""Consumer groups on the event store's topics (`events.<type>`): the event id travels in each
record's headers (`event_id`, the key a consumer drops a redelivered record by), and a member's
server-side filter (event types, a stream prefix) passes over the other events while its position,
and so its commits, move past them."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from tests.integration.capture.helpers import cli
from tributary.consumers import GroupCoordinator
from tributary.eventstore.examples.bank import bank_account
from tributary.eventstore.handler import CommandHandler
from tributary.eventstore.migrate import run_migrations
from tributary.eventstore.store import EventStore

pytestmark = pytest.mark.integration


@pytest.fixture
def captured(fresh_db: str, tmp_path: Path) -> EventStore:
    """Accounts a1, a2 and b1 opened, a1 and b1 with a deposit, captured into the log (one partition)."""
    run_migrations(fresh_db)
    store = EventStore.connect(fresh_db)
    handler = CommandHandler(store, {"account": bank_account()})
    for account in ("a1", "a2", "b1"):
        handler.handle("account", account, "open", {"owner": "o"})
    handler.handle("account", "a1", "deposit", {"amount": "2.00"})
    handler.handle("account", "b1", "deposit", {"amount": "3.00"})
    config = tmp_path / "t.toml"
    config.write_text(f'[service]\ndsn = "{fresh_db}"\n\n[log]\nroot = "{tmp_path / "log"}"\npartitions = 1\n')
    for args in (("init",), ("capture", "--until-idle", "2")):
        done = cli(*args, "--config", str(config))
        assert done.returncode == 0, done.stdout + done.stderr
    return store


def test_a_redelivered_event_carries_the_same_event_id(captured: EventStore, fresh_db: str, tmp_path: Path) -> None:
    stored = {str(e.event_id) for e in captured.read_stream("a1")}

    def deliveries(c: GroupCoordinator) -> list[tuple[int, str, str]]:
        me = c.join("audit", ["events.account"], member_id="m1")
        batch = c.fetch("audit", me.member_id, me.generation)
        return [
            (r.offset, orjson.loads(r.headers or b"{}")["event_id"], orjson.loads(r.value or b"{}")["id"])
            for r in batch.records
            if r.key == b'"a1"'
        ]

    with GroupCoordinator(fresh_db, tmp_path / "log", auto_offset_reset="earliest") as groups:
        first = deliveries(groups)
        again = deliveries(groups)  # a re-join without a commit: delivered again
    assert len(first) == 2 and {eid for _, eid, _ in first} == stored
    assert all(eid == value_id for _, eid, value_id in first)
    assert again == first


def test_a_filtered_member_gets_only_matching_events_and_its_position_passes_the_rest(
    captured: EventStore, fresh_db: str, tmp_path: Path
) -> None:
    types = {e.type for e in captured.read_all()}
    deposit = next(t for t in types if "eposit" in t)
    with GroupCoordinator(fresh_db, tmp_path / "log", auto_offset_reset="earliest") as groups:
        me = groups.join(
            "deposits", ["events.account"], member_id="m", event_types=[deposit], stream_prefix="a", auto_commit=True
        )
        batch = groups.fetch("deposits", "m", me.generation)
        got = [(orjson.loads(r.key or b"null"), orjson.loads(r.value or b"{}")["type"]) for r in batch.records]
        assert got == [("a1", deposit)]
        assert groups.fetch("deposits", "m", me.generation).records == []  # the rest was passed over
        # auto-commit commits the position, past the last (filtered-out) event of the partition
        described = groups.describe("deposits")
        assert described is not None
        assert [(p["committed"], p["end"]) for p in described["partitions"]] == [(5, 5)]
