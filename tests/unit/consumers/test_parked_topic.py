"""A group's parked topic: its name for any group name, and a park's headers read back whole."""

from __future__ import annotations

import re
from datetime import UTC, datetime

import orjson
import pytest

from tributary.consumers.parked_topic import Park, capture_namespace, headers_for, parked_topic, read_park
from tributary.log import Record

pytestmark = pytest.mark.unit

TOPIC_RULE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,248}$")  # the local log's and Kafka's (249 chars)
GROUP_RULE = re.compile(r"^[A-Za-z0-9._:@+=-]{1,200}$")


def test_a_topic_safe_group_name_is_kept() -> None:
    assert parked_topic("ledger") == "ledger.parked"
    assert parked_topic("billing.v2_x-1") == "billing.v2_x-1.parked"


@pytest.mark.parametrize("group", ["a:b", "a@b", "a+b", "a=b", ".hidden", "-dash", ":", "x" * 200, ":" * 200])
def test_any_group_name_maps_to_a_valid_topic_name(group: str) -> None:
    assert GROUP_RULE.match(group)
    name = parked_topic(group)
    assert TOPIC_RULE.match(name) and name.endswith(".parked"), name
    assert parked_topic(group) == name  # deterministic


def test_names_that_differ_only_in_mapped_characters_get_different_topics() -> None:
    names = {parked_topic(g) for g in ["a:b", "a@b", "a+b", "a=b", "a_b", "a.b"]}
    assert len(names) == 6


@pytest.mark.parametrize(
    "headers",
    [None, b'{"trace":"t1","event_id":"e"}', b'["not", "an", "object"]', b'{"tributary.parked.reason":"mine"}'],
)
def test_a_park_reads_back_with_the_original_record(headers: bytes | None) -> None:
    original = Record("shop.public.items", 2, 41, 1_700_000_000_123, b'{"id":7}', b'{"n":1}', headers)
    at = datetime(2026, 11, 29, 8, 1, 2, 345678, tzinfo=UTC)
    park = Park(original, "id1", "cannot parse: ünïcode", 3, at, "member-1")
    raw = headers_for(park)
    h = orjson.loads(raw)
    assert h["tributary.parked.topic"] == "shop.public.items" and h["tributary.parked.offset"] == "41"
    assert all(isinstance(v, str) for v in h.values())  # Kafka headers: strings
    in_topic = Record("ledger.parked", 0, 0, original.timestamp, original.key, original.value, raw)
    assert read_park(in_topic) == park  # the original record whole, headers byte for byte


def test_a_record_tributary_did_not_park_is_skipped() -> None:
    assert read_park(Record("ledger.parked", 0, 0, 0, None, b"{}", b'{"x":"y"}')) is None
    assert read_park(Record("ledger.parked", 0, 0, 0, None, b"{}", None)) is None


@pytest.mark.parametrize(
    ("group", "sources", "taken"),
    [
        ("shop.public", ("shop",), True),  # shop.public.parked: the topic of table public.parked
        ("shop", ("shop",), True),
        ("events", (), True),  # events.parked: the event store's topic of stream type `parked`
        ("events.audit", (), True),
        ("shopkeepers", ("shop",), False),
        ("shop_eu.x", ("shop",), False),
        ("ledger", ("shop",), False),
        ("shop.public", (), False),  # no source `shop` configured
        ("shop.x:y", ("shop",), True),  # shop.x_y-<hash>.parked
    ],
)
def test_capture_namespace(group: str, sources: tuple[str, ...], taken: bool) -> None:
    assert (capture_namespace(parked_topic(group), sources) is not None) is taken
