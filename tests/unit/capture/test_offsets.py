"""OffsetContext: which LSN a source may confirm, step by step (capture/streaming/positions.py). Pure."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tributary.capture.decoding.lsn import Lsn
from tributary.capture.streaming.positions import OffsetContext

pytestmark = pytest.mark.unit


def _started(at: int) -> OffsetContext:
    offsets = OffsetContext()
    offsets.start(Lsn(at))
    return offsets


def test_a_boundary_is_confirmed_only_once_committed() -> None:
    offsets = _started(100)
    assert offsets.begin(Lsn(150))
    assert offsets.confirmable() == 100  # inside a transaction: the durable position
    assert offsets.end(Lsn(150), changes=3)
    assert offsets.boundary == 150 and not offsets.in_transaction
    assert offsets.confirmable() == 100  # appended, not durable
    offsets.keepalive(Lsn(400))
    assert offsets.confirmable() == 100  # a pending boundary holds the slot back
    assert not offsets.idle_boundary()  # not while a boundary is pending
    offsets.committed()
    assert (offsets.durable, offsets.boundary) == (150, None)
    assert offsets.confirmable() == 150  # never past what the manifest holds
    assert offsets.idle_boundary() and offsets.boundary == 400  # nothing pending: the keepalive's end
    offsets.committed()
    assert offsets.confirmable() == 400 and not offsets.idle_boundary()


def test_transactions_the_log_holds_are_skipped_whole() -> None:
    offsets = _started(200)
    assert not offsets.begin(Lsn(200))  # ends at the durable position: re-sent after a crash
    assert offsets.skipping
    assert not offsets.end(Lsn(200), changes=0)
    assert not offsets.skipping and offsets.boundary is None
    assert offsets.begin(Lsn(201)) and not offsets.skipping


def test_empty_transactions_advance_the_idle_position_or_the_pending_boundary() -> None:
    offsets = _started(100)
    offsets.begin(Lsn(120))
    assert not offsets.end(Lsn(120), changes=0)  # nothing of ours: no commit forced
    assert offsets.boundary is None and offsets.idle_lsn == 120 and offsets.confirmable() == 100
    offsets.begin(Lsn(130))
    assert offsets.end(Lsn(130), changes=1)
    offsets.begin(Lsn(140))
    assert not offsets.end(Lsn(140), changes=0)
    assert offsets.boundary == 140  # the next commit covers the empty one too
    offsets.committed()
    assert offsets.confirmable() == 140


def test_keepalives_inside_a_transaction_do_not_move_the_idle_position() -> None:
    offsets = _started(100)
    offsets.begin(Lsn(300))
    offsets.keepalive(Lsn(250))
    assert offsets.idle_lsn == 100
    offsets.end(Lsn(300), changes=0)
    offsets.keepalive(Lsn(250))  # older than what is known
    assert offsets.idle_lsn == 300


def test_a_standalone_message_is_its_own_boundary() -> None:
    offsets = _started(100)
    offsets.standalone(Lsn(110))
    assert offsets.boundary == 110
    offsets.standalone(Lsn(105))  # never backwards
    assert offsets.boundary == 110


def test_a_new_slot_is_committed_at_its_consistent_point() -> None:
    offsets = OffsetContext()
    offsets.slot_created(Lsn(500))
    offsets.start(Lsn(500))
    assert offsets.confirmable() == 500 and offsets.boundary == 500
    assert not offsets.begin(Lsn(500))  # the snapshot already holds it


@given(
    st.lists(
        st.tuples(st.sampled_from(["tx", "keepalive", "commit"]), st.integers(1, 50), st.integers(0, 2)),
        max_size=40,
    )
)
def test_never_confirms_past_what_is_durable(steps: list[tuple[str, int, int]]) -> None:
    offsets = _started(10)
    at = 10
    for kind, step, changes in steps:
        at += step  # the server's stream only moves forward
        if kind == "tx":
            appended = offsets.begin(Lsn(at))
            assert appended and offsets.confirmable() == offsets.durable
            offsets.end(Lsn(at), changes=changes)
        elif kind == "keepalive":
            offsets.keepalive(Lsn(at))
        else:
            offsets.idle_boundary()
            pending = offsets.boundary
            offsets.committed()
            assert pending is None or offsets.durable == pending
        assert offsets.confirmable() == offsets.durable  # never past the manifest
        assert offsets.confirmable() <= at
