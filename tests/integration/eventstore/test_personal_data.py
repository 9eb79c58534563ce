"""Personal data on a real database: sealed at rest, revealed by every read, erased after forget,
readable across key versions."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import psycopg
import pytest
from pydantic import BaseModel

from tests.domains.customers import Customer, customers, orders
from tests.integration.capture.helpers import cli
from tributary.eventstore.forget import forget, rotate
from tributary.eventstore.handler import CommandHandler
from tributary.eventstore.personal import ERASED
from tributary.eventstore.store import EventStore

pytestmark = pytest.mark.integration

SECRET = "Wilhelmina Xanthoula-Pemberton"


def _handler(store: EventStore) -> CommandHandler:
    return CommandHandler(store, {"customer": customers(), "order": orders()}, snapshot_every=2)


def _stored_text(dsn: str, tables: tuple[str, ...] = ("events", "commands", "snapshots")) -> str:
    """Every row of these event store tables, as text."""
    with psycopg.connect(dsn) as conn:
        return "".join(
            str(conn.execute(f"SELECT coalesce(jsonb_agg(t)::text, '') FROM eventstore.{table} t").fetchone())
            for table in tables
        )


def test_sealed_at_rest_revealed_on_read_erased_after_forget(store: EventStore, fresh_db: str) -> None:
    h = _handler(store)
    answer = h.handle(
        "customer", "c-1", "register", {"name": SECRET, "email": "w@x.example", "age": 52}, command_id="k1"
    )
    assert answer.events[0]["data"]["name"] == SECRET  # the answer shows what was decided
    h.handle("customer", "c-1", "change_email", {"email": "w2@x.example"})  # a snapshot point (every 2)
    h.handle("order", "o-1", "place", {"customer_id": "c-1", "address": "9 Quince Lane", "amount": 5})
    h.handle("customer", "c-2", "register", {"name": "Other Person", "email": "o@x.example"})

    text = _stored_text(fresh_db, ("events", "commands"))  # snapshots hold plaintext state until a forget
    assert SECRET not in text and "Quince" not in text and "w2@x.example" not in text
    assert "Other Person" not in text  # every subject's data is sealed

    assert store.read_stream("c-1")[0].data == {"name": SECRET, "email": "w@x.example", "age": 52, "tier": "basic"}
    assert [e.data.get("address") for e in store.read_all() if e.stream_type == "order"] == ["9 Quince Lane"]
    assert h.load("customer", "c-1").state == Customer(registered=True, name=SECRET, email="w2@x.example", age=52)
    replay = h.handle(
        "customer", "c-1", "register", {"name": SECRET, "email": "w@x.example", "age": 52}, command_id="k1"
    )
    assert replay.replayed and replay.events[0]["data"]["name"] == SECRET
    with psycopg.connect(fresh_db) as conn:
        assert conn.execute("SELECT count(*) FROM eventstore.snapshots WHERE stream_id = 'c-1'").fetchone() == (1,)

    done = forget(store, "c-1")
    assert done.keys == 1 and set(done.streams) == {("c-1", "customer"), ("o-1", "order")}
    with psycopg.connect(fresh_db) as conn:  # the snapshot held the state in plaintext
        assert conn.execute("SELECT count(*) FROM eventstore.snapshots WHERE stream_id = 'c-1'").fetchone() == (0,)
    assert SECRET not in _stored_text(fresh_db)

    assert store.read_stream("c-1")[0].data == {"name": ERASED, "email": ERASED, "age": None, "tier": "basic"}
    assert store.read_stream("o-1")[0].data == {"customer_id": "c-1", "address": ERASED, "amount": 5}
    assert h.load("customer", "c-1").state == Customer(registered=True, name=ERASED, email=ERASED, age=None)
    replay = h.handle(
        "customer", "c-1", "register", {"name": SECRET, "email": "w@x.example", "age": 52}, command_id="k1"
    )
    assert replay.events[0]["data"]["name"] == ERASED
    assert store.read_stream("c-2")[0].data["name"] == "Other Person"  # others are untouched

    # the subject may come back: new events get a new key version, the old ones stay erased
    h.handle("customer", "c-1", "change_email", {"email": "new@x.example"})
    assert [e.data["email"] for e in store.read_stream("c-1")] == [ERASED, ERASED, "new@x.example"]
    assert forget(store, "c-1").keys == 1


def test_a_rotated_key_seals_new_events_and_old_ones_still_read(store: EventStore, fresh_db: str) -> None:
    h = _handler(store)
    h.handle("customer", "c-1", "register", {"name": SECRET, "email": "a@x.example"})
    assert rotate(store.keys, "c-1") == 2
    h.handle("customer", "c-1", "change_email", {"email": "b@x.example"})
    with psycopg.connect(fresh_db) as conn:
        kids = [r[0] for r in conn.execute("SELECT data->'email'->>'kid' FROM eventstore.events ORDER BY version")]
    assert kids == ["1", "2"]
    assert [e.data["email"] for e in store.read_stream("c-1")] == ["a@x.example", "b@x.example"]
    forget(store, "c-1")
    assert [e.data["email"] for e in store.read_stream("c-1")] == [ERASED, ERASED]


def test_the_cli_forgets_and_rotates(store: EventStore, fresh_db: str, tmp_path: Path) -> None:
    h = _handler(store)
    h.handle("customer", "c-1", "register", {"name": SECRET, "email": "a@x.example"})
    config = tmp_path / "t.toml"
    config.write_text(f'[service]\ndsn = "{fresh_db}"\n[log]\nroot = "{tmp_path / "log"}"\n')
    rotated = cli("events", "rotate-key", "c-1", "--config", str(config))
    assert (rotated.returncode, rotated.stdout.strip()) == (0, "c-1: key version 2"), rotated.stderr
    forgot = cli("events", "forget", "c-1", "--config", str(config))
    assert forgot.returncode == 0, forgot.stderr
    assert forgot.stdout.strip() == "c-1: 2 key(s) destroyed; 1 stream(s) hold its data, their snapshots deleted"
    assert store.read_stream("c-1")[0].data["name"] == ERASED
    bad = cli("events", "forget", "x" * 201, "--config", str(config))
    assert bad.returncode == 1 and len(bad.stderr.strip().splitlines()) == 1 and "subject" in bad.stderr


def test_a_forget_while_a_command_decides_leaves_no_plaintext_snapshot(store: EventStore, fresh_db: str) -> None:
    """A command loads the subject's state (revealed: plaintext), a forget destroys the keys and
    deletes the snapshots, then the command appends with a snapshot of that state: the snapshot is
    not written, since a key it was revealed with is gone."""
    agg = customers()
    deciding, go_on = threading.Event(), threading.Event()

    def slow_decide(state: Customer, command: BaseModel) -> Sequence[BaseModel]:
        if getattr(command, "email", None) == "slow@x.example":
            deciding.set()
            assert go_on.wait(120)
        return agg.decide(state, command)

    h = CommandHandler(store, {"customer": replace(agg, decide=slow_decide)}, snapshot_every=1)
    h.handle("customer", "c-1", "register", {"name": SECRET, "email": "w@x.example"})
    with psycopg.connect(fresh_db) as conn:
        assert conn.execute("SELECT key_ids FROM eventstore.snapshots WHERE stream_id = 'c-1'").fetchone() == (
            [["c-1", 1]],
        )
    answers: list[object] = []
    command = threading.Thread(
        target=lambda: answers.append(h.handle("customer", "c-1", "change_email", {"email": "slow@x.example"}))
    )
    command.start()
    assert deciding.wait(120)
    forget(store, "c-1")
    go_on.set()
    command.join(120)
    assert len(answers) == 1  # the command went through (its event sealed under the subject's new key)
    assert SECRET not in _stored_text(fresh_db)
    with psycopg.connect(fresh_db) as conn:
        assert conn.execute("SELECT count(*) FROM eventstore.snapshots").fetchone() == (0,)
    assert h.load("customer", "c-1").state == Customer(registered=True, name=ERASED, email="slow@x.example")
