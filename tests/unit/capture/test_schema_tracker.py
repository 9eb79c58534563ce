"""The schema tracker's rule for an UPDATE's omitted columns (#18 item 1): kept as an unchanged TOAST
value only if the column is TOAST-able and existed at that change; otherwise the shape lost it and a
schema record says so before the change."""

from __future__ import annotations

import orjson
import pytest

from tributary.capture.records.envelope import toastable
from tributary.capture.records.schema_tracker import SchemaRecord, SchemaTracker

pytestmark = pytest.mark.unit

COLUMNS = [("id", "integer", 23), ("n", "bigint", 20), ("note", "text", 25), ("at", "date", 1082)]


def _names(record: SchemaRecord) -> list[str]:
    value = orjson.loads(record.value)
    return [c["name"] for c in value["schema"]["columns"]]


@pytest.mark.parametrize(
    ("type_name", "expected"),
    [
        ("text", True),
        ("character varying(20)", True),
        ("bytea", True),
        ("jsonb", True),
        ("numeric(10,2)", True),
        ("integer[]", True),
        ("tsvector", True),
        ("integer", False),
        ("bigint", False),
        ("boolean", False),
        ("double precision", False),
        ("date", False),
        ("uuid", False),
        ("timestamp(3) with time zone", False),
        ("time(3) without time zone", False),
        ("interval", False),
    ],
)
def test_toastable_is_varlena_only(type_name: str, expected: bool) -> None:
    assert toastable(type_name) is expected


def test_omitted_column_that_existed_is_kept_and_no_record_follows() -> None:
    tracker = SchemaTracker()
    tracker.existed = lambda schema, table, column, xid, shown: True
    assert tracker.observe("s", "public", "t", COLUMNS, complete=True) is not None
    shown = [c for c in COLUMNS if c[0] != "note"]
    assert tracker.observe("s", "public", "t", shown, complete=False, xid=7) is None
    assert tracker.columns("public", "t") == tuple(COLUMNS)


def test_omitted_column_that_did_not_exist_at_the_change_is_announced_as_gone() -> None:
    asked: list[tuple[str, int | None]] = []

    def existed(schema: str, table: str, column: str, xid: int | None, shown: frozenset[str]) -> bool:
        asked.append((column, xid))
        return False

    tracker = SchemaTracker()
    tracker.existed = existed
    tracker.observe("s", "public", "t", COLUMNS, complete=True)
    version = tracker.version
    record = tracker.observe("s", "public", "t", [c for c in COLUMNS if c[0] != "note"], complete=False, xid=9)
    assert record is not None and _names(record) == ["id", "n", "at"]
    assert tracker.version == version + 1  # the insert templates made under the old shape are stale
    assert asked == [("note", 9)]


def test_omitted_fixed_width_column_is_dropped_without_asking() -> None:
    tracker = SchemaTracker()
    tracker.existed = lambda schema, table, column, xid, shown: pytest.fail("a date is never TOASTed")
    tracker.observe("s", "public", "t", COLUMNS, complete=True)
    record = tracker.observe("s", "public", "t", COLUMNS[:3], complete=False, xid=3)
    assert record is not None and _names(record) == ["id", "n", "note"]


def test_catalog_seed_alone_does_not_make_a_column_exist() -> None:
    """Read back after a restart: the catalog of today has a column the old change did not."""
    tracker = SchemaTracker()
    tracker.existed = lambda schema, table, column, xid, shown: column != "big"
    tracker.seed("public", "t", [*COLUMNS, ("big", "text", 25)])
    record = tracker.observe("s", "public", "t", COLUMNS[:2], complete=False, xid=5)
    assert record is not None and _names(record) == ["id", "n", "note"]
