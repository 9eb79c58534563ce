"""The comparison with Debezium (tests/integration/kafka/test_debezium_oracle.py) without Kafka: the
pairing finds each kind of difference and no false one, and docs/envelope.md shows the settings and
the table of differences the test asserts. Also the Kafka codec's key for records without one."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from tests.debezium import CONNECTOR_SETTINGS
from tests.integration.kafka.oracle import EXPECTED, EXPECTED_DEBEZIUM, Difference, changes_of, diff, render_table
from tests.pg import REPO_ROOT
from tributary.log.kafka.codec import NO_KEY, kafka_key, log_key

pytestmark = pytest.mark.unit

DOC = REPO_ROOT / "docs" / "envelope.md"


def _record(prefix: str, table: str, partition: int, offset: int, key: Any, value: dict[str, Any] | None) -> Any:
    raw_key = key if isinstance(key, bytes) or key is None else orjson.dumps(key)
    raw_value = None if value is None else orjson.dumps(value)
    return (f"{prefix}.public.{table}", partition, offset, raw_key, raw_value, None, 0)


def _change(op: str, after: dict[str, Any] | None, **source: Any) -> dict[str, Any]:
    base = {"name": "shop", "db": "d", "schema": "public", "table": "t", "lsn": 10, "txId": 5, "ts_ms": 7}
    return {"before": None, "after": after, "op": op, "source": base | {"snapshot": "false"} | source}


TYPES = {("t", "id"): "integer", ("t", "v"): "numeric"}


def test_equal_changes_differ_in_nothing() -> None:
    value = _change("c", {"id": 1, "v": "1.5"})
    ours = changes_of([_record("shop", "t", 0, 0, {"id": 1}, value)], "shop")
    theirs = changes_of([_record("dbz", "t", 2, 9, {"id": 1}, value)], "dbz")
    assert diff(ours, theirs, TYPES) == []


def test_each_kind_of_difference_is_named() -> None:
    ours = changes_of(
        [
            _record("shop", "t", 0, 0, {"a": 1, "b": 2}, _change("r", {"id": 1, "v": "NaN"}, snapshot="last", lsn=1)),
            _record("shop", "t", 0, 1, None, _change("t", None)),
            _record("shop", "t", 1, 0, None, _change("t", None)),
            _record("shop", "t", 0, 2, {"a": 1, "b": 2}, _change("u", {"id": 1, "v": "2"}, lsn=20)),
        ],
        "shop",
    )
    theirs = changes_of(
        [
            _record("dbz", "t", 0, 0, b'{"b":2,"a":1}', _change("r", {"id": 1, "v": "NAN"}, snapshot="true", lsn=2)),
            _record("dbz", "t", 0, 1, None, _change("t", None)),
            _record("dbz", "t", 0, 2, b'{"b":2,"a":1}', _change("u", {"id": 1, "v": "2"}, lsn=21)),
        ],
        "dbz",
    )
    found = {d for _, d in diff(ours, theirs, TYPES)}
    assert found == {
        Difference("key bytes", "composite primary key", "columns sorted by name", "columns in primary-key order"),
        Difference("value", "numeric", '"NaN"', '"NAN"'),
        Difference("source.snapshot", "r", '"last"', '"true"'),
        Difference("source.lsn", "r", "<int>", "<int>"),  # each side's own snapshot: by kind
        Difference("source.lsn", "u", "20", "21"),  # a streamed change's: by value
        Difference("records per change", "t", "2", "1"),
    }


def test_a_delete_under_default_identity_names_the_columns_only_one_side_has() -> None:
    ours = changes_of([_record("shop", "t", 0, 0, {"id": 1}, _change("d", None) | {"before": {"id": 1}})], "shop")
    theirs = changes_of(
        [_record("dbz", "t", 0, 0, {"id": 1}, _change("d", None) | {"before": {"id": 1, "v": None}})], "dbz"
    )
    found = [d for _, d in diff(ours, theirs, TYPES)]
    assert found == [Difference("before of a delete", "non-key column (identity default)", "(absent)", "null")]


def test_the_docs_show_the_table_the_test_asserts() -> None:
    assert render_table(EXPECTED) in DOC.read_text()
    assert len({e.difference for e in EXPECTED}) == len(EXPECTED)  # each row once


def test_the_docs_show_the_table_the_test_asserts_under_the_debezium_envelope() -> None:
    section = DOC.read_text().split("## A Debezium consumer", 1)[1]
    assert render_table(EXPECTED_DEBEZIUM) in section
    assert len({e.difference for e in EXPECTED_DEBEZIUM}) == len(EXPECTED_DEBEZIUM)
    assert {e.difference for e in EXPECTED_DEBEZIUM} < {e.difference for e in EXPECTED} | {
        Difference("value", "numeric[]", '["NAN"]', "null")  # the element in Debezium's spelling now
    }


def test_the_docs_show_the_debezium_settings_the_test_runs_with() -> None:
    text = DOC.read_text()
    block = text.split("## Compared with Debezium", 1)[1].split("```properties\n", 1)[1].split("```", 1)[0]
    documented = {}
    for line in filter(None, block.splitlines()):
        name, value = line.split("#", 1)[0].strip().split("=", 1)
        documented[name] = value
    assert documented == CONNECTOR_SETTINGS


def test_a_record_without_a_key_travels_with_an_empty_one_on_kafka() -> None:
    assert kafka_key(None) == NO_KEY == b""
    assert log_key(kafka_key(None)) is None
    assert log_key(None) is None
    assert kafka_key(b'{"id":1}') == log_key(b'{"id":1}') == b'{"id":1}'
