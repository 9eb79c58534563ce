"""The client's records and partitions: the pull API's JSON shape in, typed values out; the same
record as the HTTP sink posts it, round-tripped."""

from __future__ import annotations

from datetime import UTC, datetime

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st
from tributary_client import Record, TopicPartition

from tributary.log.local import Record as LogRecord
from tributary.sinks import to_record
from tributary.sinks.store import encode

pytestmark = pytest.mark.unit

_json = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8,
)


def test_a_partition_is_the_tuple_the_coordinator_uses() -> None:
    assert TopicPartition("t", 1) == ("t", 1)
    assert {("t", 1): 5}[TopicPartition("t", 1)] == 5
    assert sorted([TopicPartition("t", 2), TopicPartition("s", 9)])[0] == TopicPartition("s", 9)


def test_record_from_the_pull_api() -> None:
    raw = {
        "topic": "shop.public.orders",
        "partition": 2,
        "offset": 41,
        "timestamp_ms": 1_767_225_600_000,
        "key": '{"id":7}',
        "value": None,
        "headers": {"correlation_id": "c1"},
    }
    record = Record.from_json(raw)
    assert record.topic_partition == ("shop.public.orders", 2)
    assert record.timestamp == datetime(2026, 1, 1, tzinfo=UTC)
    assert record.value is None and record.key == '{"id":7}' and record.headers == {"correlation_id": "c1"}


@given(
    key=st.none() | _json,
    value=st.none() | _json,
    headers=st.dictionaries(
        st.text(min_size=1, max_size=5), st.text(max_size=5) | st.integers(-(2**53), 2**53), max_size=3
    ),
    offset=st.integers(0, 2**40),
)
def test_a_log_record_survives_the_sinks_encoding(key: object, value: object, headers: dict, offset: int) -> None:
    log_record = LogRecord(
        "t",
        0,
        offset,
        1_700_000_000_000,
        None if key is None else orjson.dumps(key),
        None if value is None else orjson.dumps(value),
        orjson.dumps(headers) if headers else None,
    )
    record = to_record(log_record)
    assert record.key == (None if key is None else orjson.dumps(key).decode())
    assert record.value == value
    assert all(isinstance(v, str) for v in record.headers.values())
    assert Record.from_json(orjson.loads(encode(record))) == record
