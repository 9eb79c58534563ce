"""A service's own outbox table (`[[sources.outbox]]`) on every log backend: the service writes its
business row and its outbox row in one transaction and deletes the outbox row right after; the
topic its aggregate type names holds exactly the events, keyed by aggregate id, with the payload
as value and the event id, type and configured columns as headers. The outbox is never snapshotted
and never a table's topic; the business table is captured as usual."""

from __future__ import annotations

import signal
import uuid
from pathlib import Path

import orjson
import psycopg
import pytest

from tests.backends import LogBackend, admin, table_state, write_backend_config
from tests.integration.capture.helpers import capture_progress, source_status, spawn_capture, wait_for

pytestmark = pytest.mark.integration

SERVICE_TABLES = """
CREATE TABLE orders (id int PRIMARY KEY, total int NOT NULL, state text NOT NULL);
CREATE TABLE outbox (
    id uuid PRIMARY KEY, aggregatetype text NOT NULL, aggregateid text NOT NULL,
    type text NOT NULL, payload jsonb, tenant text
);
"""

OUTBOX = """
[[sources.outbox]]
table = "public.outbox"
header_columns = ["tenant"]
"""


def _emit(conn: psycopg.Connection, kind: str, aggregate: str, type_: str, payload: object) -> str:
    """The service's outbox row for one event, in the caller's transaction; its id."""
    event_id = str(uuid.uuid4())
    conn.execute(
        "INSERT INTO outbox VALUES (%s, %s, %s, %s, %s, 'acme')",
        (event_id, kind, aggregate, type_, orjson.dumps(payload).decode()),
    )
    return event_id


def _service_writes(dsn: str) -> list[tuple[str, str, str, str, object]]:
    """What the service does, as its transactions commit: (topic, key, event id, type, payload) of each event."""
    events: list[tuple[str, str, str, str, object]] = []
    with psycopg.connect(dsn, autocommit=True) as conn:
        with conn.transaction():  # the outbox row deleted in its own transaction
            conn.execute("INSERT INTO orders VALUES (1, 30, 'placed')")
            placed = {"order": 1, "total": 30}
            events.append(("Order", "1", _emit(conn, "Order", "1", "OrderPlaced", placed), "OrderPlaced", placed))
            conn.execute("DELETE FROM outbox")
        with conn.transaction():  # deleted in the next one
            conn.execute("INSERT INTO orders VALUES (2, 12, 'placed')")
            placed = {"order": 2, "total": 12}
            events.append(("Order", "2", _emit(conn, "Order", "2", "OrderPlaced", placed), "OrderPlaced", placed))
        conn.execute("DELETE FROM outbox")
        with conn.transaction():  # kept, then updated: an update is no event
            conn.execute("UPDATE orders SET state = 'paid' WHERE id = 1")
            paid = {"order": 1, "amount": 30}
            events.append(("Order", "1", _emit(conn, "Order", "1", "OrderPaid", paid), "OrderPaid", paid))
        conn.execute("UPDATE outbox SET type = 'Rewritten'")
        with conn.transaction():  # another aggregate type: another topic
            events.append(("Customer", "c-7", _emit(conn, "Customer", "c-7", "Registered", "c-7"), "Registered", "c-7"))
            conn.execute("DELETE FROM outbox")
    return events


@pytest.mark.parametrize("envelope", ["tributary", "debezium"])
def test_a_services_outbox_rows_become_events_on_the_aggregate_types_topic(
    fresh_db: str, tmp_path: Path, backend: LogBackend, envelope: str
) -> None:
    backend.prepare("shop.public.orders", "outbox.event.Order", "outbox.event.Customer")
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        conn.execute(SERVICE_TABLES)
        conn.execute("INSERT INTO orders VALUES (0, 5, 'old')")
        conn.execute(  # an event of before capture started: an outbox is never snapshotted
            "INSERT INTO outbox VALUES (gen_random_uuid(), 'Order', '0', 'OrderPlaced', '{}', 'acme')"
        )
    log_root = tmp_path / "log"
    config = write_backend_config(
        backend, tmp_path / "t.toml", dsn=fresh_db, log_root=log_root, source_extra=f'envelope = "{envelope}"\n{OUTBOX}'
    )
    proc = spawn_capture(config)
    try:
        wait_for(
            lambda: source_status(log_root, proc.pid).get("state") == "streaming",
            what="capture streaming",
            progress=lambda: capture_progress(log_root),
        )
        events = _service_writes(fresh_db)
        wait_for(
            lambda: len(backend.records(log_root, "outbox.event.Customer")) == 1,
            what="the last event in the log",
            progress=lambda: capture_progress(log_root),
        )
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0, proc.err_path.read_text()
    for kind in ("Order", "Customer"):
        want = [(f'"{key}"', eid, type_, payload) for topic, key, eid, type_, payload in events if topic == kind]
        got = [
            (
                r.key.decode() if r.key else None,
                orjson.loads(r.headers or b"{}").get("id"),
                orjson.loads(r.headers or b"{}").get("type"),
                orjson.loads(r.value) if r.value else None,
            )
            for r in backend.records(log_root, f"outbox.event.{kind}")
        ]
        assert sorted(got, key=str) == sorted(want, key=str), kind  # exactly the events (partitions: any order)
        for r in backend.records(log_root, f"outbox.event.{kind}"):
            assert orjson.loads(r.headers or b"{}")["tenant"] == "acme"
    paid_after_placed = [
        orjson.loads(r.headers or b"{}")["type"]
        for r in backend.records(log_root, "outbox.event.Order")
        if r.key == b'"1"'
    ]
    assert paid_after_placed == ["OrderPlaced", "OrderPaid"]  # one aggregate's events in order
    assert backend.records(log_root, "shop.public.outbox") == []  # never a table's topic
    orders = backend.records(log_root, "shop.public.orders")
    if envelope == "tributary":
        state = {k: v["state"] for k, v in table_state(orders).items()}
        assert state == {'{"id":0}': "old", '{"id":1}': "paid", '{"id":2}': "placed"}
    else:  # Debezium's records (docs/envelope.md): the business table's changes rewritten, the events not
        assert {orjson.loads(r.value)["payload"]["op"] for r in orders if r.value} == {"r", "c", "u"}
    if backend.name == "local":  # events are kept whole, never compacted by key (Kafka's policy shows as "broker")
        policies = {t["topic"]: t["policy"] for t in admin(backend, log_root).topics()}
        assert policies["outbox.event.Order"] == "none" and policies["shop.public.orders"] == "compact"
