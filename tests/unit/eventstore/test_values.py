"""What the store can hold, checked before the database sees it, and the retry pause's range."""

from __future__ import annotations

import random

import pytest

from tributary.eventstore.errors import ConcurrencyConflict, InvalidValue
from tributary.eventstore.handler import backoff
from tributary.eventstore.values import MAX_ID_LENGTH, check_data, check_id

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("good", ["a", "acc-1", "x" * MAX_ID_LENGTH, "ünïcødé-😀"])
def test_ids_the_store_can_hold(good: str) -> None:
    check_id("stream id", good)


@pytest.mark.parametrize(
    ("bad", "says"),
    [
        ("", "is empty"),
        ("x" * (MAX_ID_LENGTH + 1), f"is {MAX_ID_LENGTH + 1} characters long; the maximum is {MAX_ID_LENGTH}"),
        ("a\x00b", "NUL"),
        ("a\ud83d", "unpaired UTF-16 surrogate ('\\ud83d' at index 1)"),
    ],
)
def test_ids_the_store_cannot_hold(bad: str, says: str) -> None:
    with pytest.raises(InvalidValue) as info:
        check_id("stream id", bad)
    assert str(info.value).startswith("stream id ") and says in str(info.value)
    assert "\n" not in str(info.value) and str(info.value).encode()  # one line, encodable


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({"owner": "a\x00"}, "data.owner"),
        ({"owner": "\udc00"}, "data.owner"),
        ({"a": [1, {"b": ["ok", "\ud83d"]}]}, "data.a[1].b[1]"),
        ({"x\x00": 1}, "a key of data"),
        ({"\ud83d": 1}, "a key of data"),
        ({"n": 2**64}, "data.n"),
        ({"n": -(2**63) - 1}, "data.n"),
        ({"not an identifier": "\x00"}, "data['not an identifier']"),
    ],
)
def test_data_the_store_cannot_hold_names_the_field(data: dict[str, object], field: str) -> None:
    with pytest.raises(InvalidValue) as info:
        check_data("data", data)
    assert info.value.field == field
    assert str(info.value).encode() and "\n" not in str(info.value)


def test_storable_data_and_deep_nesting_pass() -> None:
    check_data("data", {"n": 2**64 - 1, "m": -(2**63), "f": 1.5, "b": True, "z": None, "s": "😀", "l": [[]]})
    deep: object = "ok"
    for _ in range(50_000):  # far deeper than the interpreter's recursion limit
        deep = [deep]
    check_data("data", {"deep": deep})


def test_backoff_grows_exponentially_up_to_the_cap_with_jitter() -> None:
    rng = random.Random(7)
    for attempt in range(12):
        ceiling = min(0.2, 0.005 * 2**attempt)
        pauses = [backoff(attempt, base_s=0.005, cap_s=0.2, rng=rng) for _ in range(300)]
        assert all(0 <= p <= ceiling for p in pauses)
        assert max(pauses) > 0.8 * ceiling and min(pauses) < 0.2 * ceiling  # spread over the whole range
        assert len(set(pauses)) == len(pauses)  # jitter: no two writers pause alike


def test_a_conflict_says_what_happened_and_what_to_do() -> None:
    pinned = str(ConcurrencyConflict("acc-1", 0, 3))
    assert "'acc-1'" in pinned and "version 3" in pinned and "expected 0" in pinned and "retry" in pinned
    retried = ConcurrencyConflict("acc-1", 4, 9, attempts=4)
    assert "4 attempts" in str(retried) and "version 9" in str(retried) and "retry" in str(retried)
    assert retried.attempts == 4
