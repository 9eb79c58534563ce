import pytest

from tests.unit.projections.helpers import change
from tributary.projections.cdc import TOAST_PLACEHOLDER, apply_change, current_row, resolve_toast, unresolved

pytestmark = pytest.mark.unit
T = "shop.public.docs"


@pytest.mark.parametrize(
    ("envelope", "row"),
    [
        ({"op": "c", "after": {"id": 1}}, {"id": 1}),
        ({"op": "r", "after": {"id": 1}}, {"id": 1}),
        ({"op": "u", "before": {"id": 1}, "after": {"id": 1, "x": "2"}}, {"id": 1, "x": "2"}),
        ({"op": "d", "before": {"id": 1}, "after": None}, None),
        ({"op": "t"}, None),
        (None, None),
    ],
)
def test_current_row(envelope: dict | None, row: dict | None) -> None:
    assert current_row(envelope) == row


def test_unknown_op_is_an_error() -> None:
    with pytest.raises(ValueError, match="op"):
        current_row({"op": "x"})


def test_toast_placeholder_resolved_from_previous_value() -> None:
    prev = {"id": 1, "body": "long text", "n": 1}
    after = {"id": 1, "body": TOAST_PLACEHOLDER, "n": 2}
    assert resolve_toast(prev, after) == {"id": 1, "body": "long text", "n": 2}
    assert resolve_toast(None, after) == after
    assert unresolved(resolve_toast(None, after)) == ["body"]


def test_apply_change_sequence() -> None:
    k = {"id": 1}
    seq = [
        change(T, 0, k, "c", {"id": 1, "body": "a" * 3000, "n": 1}),
        change(T, 1, k, "u", {"id": 1, "body": TOAST_PLACEHOLDER, "n": 2}),
        change(T, 2, k, "d", None),
        change(T, 3, k, "tombstone", None),
        change(T, 4, k, "c", {"id": 1, "body": "b", "n": 3}),
    ]
    states = []
    row = None
    for r in seq:
        row = apply_change(row, r)
        states.append(row)
    assert states[1] == {"id": 1, "body": "a" * 3000, "n": 2}
    assert states[2] is None and states[3] is None
    assert states[4] == {"id": 1, "body": "b", "n": 3}


def test_schema_records_leave_the_row_alone() -> None:
    from tributary.projections.records import ProjectionRecord

    schema = ProjectionRecord(T, 0, 9, 0, None, {"schema": {"columns": []}}, None, 0)
    assert apply_change({"id": 1}, schema) == {"id": 1}
