from decimal import Decimal

import pytest

from tributary.projections.codec import copy_line, copy_text, dump_state, load_state
from tributary.projections.records import decode, default_event_time, iso_to_ms, ms_to_iso, sort_key

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("text", "ms"),
    [
        ("1970-01-01T00:00:00Z", 0),
        ("1970-01-01T00:00:00.001+00:00", 1),
        ("2024-01-01T01:00:00+01:00", 1704067200000),
        ("2024-01-01T00:00:00", 1704067200000),
        ("2024-01-01T00:00:00.999999Z", 1704067200999),
    ],
)
def test_iso_to_ms(text: str, ms: int) -> None:
    assert iso_to_ms(text) == ms


def test_ms_to_iso_round_trips() -> None:
    assert iso_to_ms(ms_to_iso(1704067200123)) == 1704067200123


@pytest.mark.parametrize(
    ("topic", "value", "ts", "expected"),
    [
        ("events.account", {"occurred_at": "1970-01-01T00:00:01Z"}, 99, 1000),
        ("events.account", {"type": "X"}, 99, 99),
        ("shop.public.t", {"op": "c", "source": {"ts_ms": 5}, "ts_ms": 7}, 99, 5),
        ("shop.public.t", {"op": "c", "source": {}, "ts_ms": 7}, 99, 7),
        ("shop.public.t", None, 99, 99),
    ],
)
def test_default_event_time(topic: str, value: dict | None, ts: int, expected: int) -> None:
    assert default_event_time(topic, value, ts) == expected


def test_decode_and_order() -> None:
    a = decode("events.b", 0, 5, 1, b'"s1"', b'{"occurred_at":"1970-01-01T00:00:00.002Z"}', None)
    b = decode("events.a", 1, 9, 1, b'"s1"', b'{"occurred_at":"1970-01-01T00:00:00.002Z"}', None)
    c = decode("events.a", 0, 1, 1, b'"s1"', b'{"occurred_at":"1970-01-01T00:00:00.003Z"}', None)
    assert a.key == "s1" and a.event_time == 2
    # event time first, then topic, partition, offset
    assert sorted([c, a, b], key=sort_key) == [b, a, c]


def test_state_round_trip_keeps_decimals() -> None:
    state = {"b": Decimal("12.50"), "l": [Decimal("-0.01"), 1, "x"], "n": None}
    assert load_state(dump_state(state)) == state
    assert str(load_state(dump_state(state))["b"]) == "12.50"


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (None, None),
        (True, "t"),
        (3, "3"),
        (Decimal("1E+2"), "100"),
        ("a\tb", "a\tb"),
        ({"b": 1, "a": [1]}, '{"a":[1],"b":1}'),
    ],
)
def test_copy_text(value: object, text: str | None) -> None:
    assert copy_text(value) == text


def test_copy_line_escapes() -> None:
    assert copy_line(["a\tb\\c\n", None]) == "a\\tb\\\\c\\n\t\\N\n"
