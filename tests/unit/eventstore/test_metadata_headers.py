"""User headers' bounds, and the outbox's log headers from an event's metadata (pure)."""

from __future__ import annotations

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tributary.capture.records.outbox import event_headers
from tributary.eventstore.errors import InvalidValue
from tributary.eventstore.values import MAX_HEADER_NAME, MAX_HEADER_VALUE, MAX_HEADERS, check_headers

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("headers", "field"),
    [
        ({f"h{i}": "v" for i in range(MAX_HEADERS + 1)}, "headers"),
        ({"": "v"}, "headers"),
        ({"n" * (MAX_HEADER_NAME + 1): "v"}, "headers"),
        ({"causation_id": "x"}, "headers.causation_id"),
        ({"n": 1}, "headers.n"),
        ({"n": "v" * (MAX_HEADER_VALUE + 1)}, "headers.n"),
        ({"n": "a\x00b"}, "headers.n"),
    ],
)
def test_headers_out_of_bounds_are_refused(headers: dict[str, object], field: str) -> None:
    with pytest.raises(InvalidValue) as refused:
        check_headers(headers)  # type: ignore[arg-type]
    assert refused.value.field == field


def test_headers_at_the_bounds_are_taken() -> None:
    check_headers({f"{i:0{MAX_HEADER_NAME}d}": "v" * MAX_HEADER_VALUE for i in range(MAX_HEADERS)})


def test_log_headers_from_metadata() -> None:
    meta = {
        "command_id": "c",
        "correlation_id": "r",
        "causation_id": "c",
        "headers": {"tenant": "acme", "correlation_id": "not this one"},
        "other": {"nested": 1},
    }
    expected = {"tenant": "acme", "command_id": "c", "correlation_id": "r", "causation_id": "c"}
    assert orjson.loads(event_headers(meta) or b"null") == expected
    # capture hands jsonb over as raw JSON
    assert orjson.loads(event_headers(orjson.Fragment(orjson.dumps(meta))) or b"null") == expected
    assert event_headers({}) is None
    assert event_headers(orjson.Fragment(b"{}")) is None
    assert event_headers({"other": 1}) is None


@given(st.dictionaries(st.text(min_size=1, max_size=5), st.text(max_size=5), max_size=5), st.text(min_size=1))
def test_user_headers_and_ids_all_arrive_as_strings(user: dict[str, str], correlation: str) -> None:
    got = orjson.loads(event_headers({"headers": user, "correlation_id": correlation}) or b"{}")
    assert got == {**user, "correlation_id": correlation}


def test_the_event_id_is_a_header_no_user_header_shadows() -> None:
    assert orjson.loads(event_headers({}, "e-1") or b"null") == {"event_id": "e-1"}
    assert orjson.loads(event_headers(orjson.Fragment(b"{}"), "e-1") or b"null") == {"event_id": "e-1"}
    got = orjson.loads(event_headers({"headers": {"event_id": "forged", "t": "x"}, "command_id": "c"}, "e-2") or b"{}")
    assert got == {"event_id": "e-2", "t": "x", "command_id": "c"}
