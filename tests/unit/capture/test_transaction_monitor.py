"""Transaction metadata as a pure fold (capture/records/transactions.py): what counts as an event,
the orders, the BEGIN before the first one and the END's counts; and which topics are a source's
side topics (kept by retention, never a table's)."""

from __future__ import annotations

import orjson
import pytest

from tributary.capture.records.envelope import Output
from tributary.capture.records.routing import is_side_topic
from tributary.capture.records.transactions import TransactionMonitor

pytestmark = pytest.mark.unit


def _change(topic: str, op: str) -> Output:
    return Output(topic, b'{"id":1}', orjson.dumps({"before": None, "after": {"id": 1}, "op": op, "ts_ms": 1}))


def test_events_are_numbered_in_total_and_per_table_and_counted_at_the_end() -> None:
    monitor = TransactionMonitor("shop")
    monitor.begin(571, 53195829, 1700000000000)
    first = monitor.annotate([_change("shop.public.a", "c")], "public.a")
    delete = monitor.annotate([_change("shop.public.b", "d"), Output("shop.public.b", b'{"id":1}', None)], "public.b")
    key_change = monitor.annotate([_change("shop.public.a", "d"), _change("shop.public.a", "c")], "public.a")
    begin, created = first
    assert orjson.loads(begin.value or b"") == {
        "status": "BEGIN",
        "id": "571:53195829",
        "event_count": None,
        "data_collections": None,
        "ts_ms": 1700000000000,
    }
    assert begin.topic == "shop.transactions" and orjson.loads(begin.key or b"") == {"id": "571:53195829"}
    blocks = [orjson.loads(o.value)["transaction"] for o in (created, *delete, *key_change) if o.value is not None]
    assert [(b["total_order"], b["data_collection_order"]) for b in blocks] == [(1, 1), (2, 1), (3, 2), (4, 3)]
    assert delete[1].value is None, "a tombstone is no event"
    (end,) = monitor.end()
    assert orjson.loads(end.value or b"") == {
        "status": "END",
        "id": "571:53195829",
        "event_count": 4,
        "data_collections": [
            {"data_collection": "public.a", "event_count": 3},
            {"data_collection": "public.b", "event_count": 1},
        ],
        "ts_ms": 1700000000000,
    }


def test_a_transaction_without_events_writes_neither_begin_nor_end() -> None:
    monitor = TransactionMonitor("shop")
    monitor.begin(7, 100, None)
    assert monitor.annotate([Output("shop.public.a", b"{}", None)], "public.a") == [
        Output("shop.public.a", b"{}", None)
    ]
    assert monitor.end() == []
    monitor.begin(8, 200, None)  # the next one starts afresh
    assert monitor.annotate([_change("shop.public.a", "c")], "public.a")[0].topic == "shop.transactions"


@pytest.mark.parametrize(
    ("topic", "side"),
    [
        ("shop.transactions", True),
        ("shop.heartbeat", True),
        ("shop.notifications", True),
        ("shop.messages", True),
        ("shop.public.transactions", False),
        ("events.transactions", False),
        ("shop.public.orders", False),
    ],
)
def test_side_topics_are_the_sources_own(topic: str, side: bool) -> None:
    assert is_side_topic(topic) is side
