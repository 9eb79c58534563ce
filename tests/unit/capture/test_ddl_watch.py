"""Which catalog changes make the watcher write a notice, and which restate untouched rows."""

from __future__ import annotations

import pytest

from tributary.capture.streaming.ddl_watch import TableShape, changed

pytestmark = pytest.mark.unit


def _shape(**kw: object) -> TableShape:
    base: dict[str, object] = dict(
        oid=1, schema="public", table="t", relfilenode=100, columns_sig="id int, v int", attrs_sig="5,5", detailed=True
    )
    base.update(kw)
    return TableShape(**base)  # type: ignore[arg-type]


def test_nothing_changed() -> None:
    assert changed(_shape(), _shape()) == (False, False, False)


def test_a_rewrite_without_a_column_change_is_vacuum_full_or_cluster() -> None:
    assert changed(_shape(), _shape(relfilenode=200)) == (False, False, False)


def test_a_column_altered_without_a_rewrite_is_set_default_or_not_null() -> None:
    assert changed(_shape(), _shape(attrs_sig="5,9")) == (False, False, False)


def test_a_same_type_alter_using_rewrites_the_rows() -> None:
    assert changed(_shape(), _shape(relfilenode=200, attrs_sig="5,9")) == (False, False, True)


def test_a_new_column_restates_the_rows() -> None:
    after = _shape(columns_sig="id int, v int, c int", attrs_sig="5,5,9")
    assert changed(_shape(), after) == (False, True, True)


def test_a_retyped_column_restates_the_rows() -> None:
    after = _shape(columns_sig="id int, v text", relfilenode=200, attrs_sig="5,9")
    assert changed(_shape(), after) == (False, True, True)


def test_a_rename_is_seen_for_a_table_not_watched_closely() -> None:
    before = TableShape(1, "public", "t", 100)
    assert changed(before, _shape(table="t2")) == (True, False, False)
