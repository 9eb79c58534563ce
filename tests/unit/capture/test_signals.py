"""Signals (capture/snapshot/signals.py): what `capture snapshot` writes reads back as the same request; a
signal table's row as Debezium's; anything malformed is a one-line BadSignal. Pure."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tributary.capture.snapshot.signals import (
    EXECUTE_SNAPSHOT,
    PAUSE_SNAPSHOT,
    RESUME_SNAPSHOT,
    STOP_SNAPSHOT,
    BadSignal,
    control_message,
    from_message,
    from_row,
    qualified_table,
    snapshot_message,
)

pytestmark = pytest.mark.unit

_PART = st.text(
    alphabet=st.characters(blacklist_characters='."*?[]', blacklist_categories=("Zs", "Cc", "Zl", "Zp", "Cs")),
    min_size=1,
    max_size=12,
).filter(lambda s: not any(c.isspace() for c in s))
TABLES = st.lists(st.builds(lambda a, b: f"{a}.{b}", _PART, _PART), min_size=1, max_size=5)


@given(TABLES)
def test_the_message_capture_snapshot_writes_reads_back_as_the_same_tables(tables: list[str]) -> None:
    signal = from_message(snapshot_message(tables), lsn="0/16B3748")
    assert list(signal.tables) == list(dict.fromkeys(tables))  # in order, each once
    assert signal.origin == "signal message at 0/16B3748"


def test_a_signal_table_row_in_either_spelling() -> None:
    ours = from_row({"id": "a1", "type": EXECUTE_SNAPSHOT, "data": '{"tables": ["public.orders"]}'}, table="s.sig")
    debezium = from_row(
        {"id": 7, "type": EXECUTE_SNAPSHOT, "data": '{"data-collections": ["public.orders", "x.y"]}'}, table="s.sig"
    )
    assert ours.tables == ("public.orders",)
    assert ours.origin == "s.sig row 'a1'"
    assert debezium.tables == ("public.orders", "x.y")


@pytest.mark.parametrize(
    ("content", "why"),
    [
        ("not json", "not JSON"),
        ("[1, 2]", "not a JSON object"),
        ('{"tables": ["public.t"]}', "unknown signal type None"),
        ('{"type": "log-snapshot", "tables": ["public.t"]}', "unknown signal type 'log-snapshot'"),
        ('{"type": "stop-snapshot", "tables": []}', "non-empty list"),
        (
            '{"type": "execute-snapshot", "tables": ["public.t"], "additional-conditions": '
            '[{"data-collection": "public.u", "filter": "a = 1"}]}',
            "names public.u, which the signal does not snapshot",
        ),
        (
            '{"type": "execute-snapshot", "tables": ["public.t"], "additional-conditions": '
            '[{"data-collection": "public.t", "filter": " "}]}',
            "needs a non-empty",
        ),
        ('{"type": "execute-snapshot", "tables": ["public.t"], "additional-conditions": {}}', "must be a list"),
        ('{"type": "execute-snapshot"}', "non-empty list"),
        ('{"type": "execute-snapshot", "tables": []}', "non-empty list"),
        ('{"type": "execute-snapshot", "tables": "public.t"}', "non-empty list"),
        ('{"type": "execute-snapshot", "tables": ["orders"]}', "'orders' must be written schema.table"),
        ('{"type": "execute-snapshot", "tables": ["public.*"]}', "must be written schema.table"),
        ('{"type": "execute-snapshot", "tables": [3]}', "must be written schema.table"),
    ],
)
def test_a_malformed_message_is_one_line_saying_why(content: str, why: str) -> None:
    with pytest.raises(BadSignal, match=why.replace("*", r"\*").replace("[", r"\[")) as info:
        from_message(content)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("row", "why"),
    [
        ({"id": "1", "type": "log", "data": "{}"}, "row '1': unknown signal type 'log'"),
        ({"id": "2", "type": EXECUTE_SNAPSHOT, "data": None}, "row '2': its data is not JSON text"),
        ({"id": "3", "type": EXECUTE_SNAPSHOT, "data": "{oops"}, "row '3': its data is not JSON"),
        ({"id": "4", "type": EXECUTE_SNAPSHOT, "data": '{"tables": ["a"]}'}, "row '4': table 'a'"),
    ],
)
def test_a_malformed_row_names_the_table_and_row(row: dict[str, object], why: str) -> None:
    with pytest.raises(BadSignal, match=why):
        from_row(row, table="public.sig")


def test_the_message_is_the_documented_json() -> None:
    assert json.loads(snapshot_message(["public.t"])) == {"type": "execute-snapshot", "tables": ["public.t"]}
    with pytest.raises(BadSignal):
        qualified_table("public.t.x")


def test_a_filtered_snapshot_reads_back_with_its_condition_in_either_spelling() -> None:
    ours = from_message(snapshot_message(["public.orders", "public.t"], {"public.orders": "status = 'open'"}))
    assert ours.kind == EXECUTE_SNAPSHOT and ours.filters == (("public.orders", "status = 'open'"),)
    debezium = from_row(
        {
            "id": "ad-hoc-1",
            "type": EXECUTE_SNAPSHOT,
            "data": json.dumps(
                {
                    "data-collections": ["public.orders"],
                    "type": "incremental",
                    "additional-conditions": [{"data-collection": "public.orders", "filter": "status = 'open'"}],
                }
            ),
        },
        table="s.sig",
    )
    assert debezium.tables == ("public.orders",) and debezium.filters == ours.filters[:1]


@pytest.mark.parametrize("kind", [STOP_SNAPSHOT, PAUSE_SNAPSHOT, RESUME_SNAPSHOT])
def test_controls_read_back_from_a_message_and_from_a_row_without_data(kind: str) -> None:
    signal = from_message(control_message(kind))
    assert (signal.kind, signal.tables) == (kind, ())
    row = from_row({"id": "c", "type": kind, "data": None}, table="s.sig")
    assert (row.kind, row.tables) == (kind, ())


def test_a_stop_may_name_its_tables() -> None:
    signal = from_row(
        {"id": 1, "type": STOP_SNAPSHOT, "data": '{"data-collections": ["public.a"], "type": "incremental"}'},
        table="s.sig",
    )
    assert signal.tables == ("public.a",)
    assert from_message(control_message(STOP_SNAPSHOT, ["public.b"])).tables == ("public.b",)
