"""The event id travels in each `events.<type>` record's headers (`event_id`): the key a consumer
drops a redelivered record by. A group member that does not commit gets the same event again, with
the same `event_id`."""

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


def test_a_redelivered_event_carries_the_same_event_id(fresh_db: str, tmp_path: Path) -> None:
    run_migrations(fresh_db)
    store = EventStore.connect(fresh_db)
    handler = CommandHandler(store, {"account": bank_account()})
    handler.handle("account", "a1", "open", {"owner": "o1"})
    handler.handle("account", "a1", "deposit", {"amount": "2.00"})
    config = tmp_path / "t.toml"
    config.write_text(f'[service]\ndsn = "{fresh_db}"\n\n[log]\nroot = "{tmp_path / "log"}"\npartitions = 1\n')
    for args in (("init",), ("capture", "--until-idle", "2")):
        done = cli(*args, "--config", str(config))
        assert done.returncode == 0, done.stdout + done.stderr
    stored = {str(e.event_id) for e in store.read_stream("a1")}

    def deliveries(c: GroupCoordinator) -> list[tuple[int, str, str]]:
        me = c.join("audit", ["events.account"], member_id="m1")
        batch = c.fetch("audit", me.member_id, me.generation)
        return [(r.offset, orjson.loads(r.headers or b"{}")["event_id"], orjson.loads(r.value)["id"]) for r in batch.records]

    with GroupCoordinator(fresh_db, tmp_path / "log", auto_offset_reset="earliest") as groups:
        first = deliveries(groups)
        again = deliveries(groups)  # a re-join without a commit: delivered again
    assert len(first) == 2 and {eid for _, eid, _ in first} == stored
    assert all(eid == value_id for _, eid, value_id in first)
    assert again == first
