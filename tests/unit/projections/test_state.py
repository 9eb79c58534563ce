"""A projection's state agrees with its lag: `done` only when caught up, `behind` while records wait."""

from __future__ import annotations

import pytest

from tributary.projections.state import BUSY, STATES, projection_state, state_label

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("serving", "newest", "lag", "rebuilding", "state"),
    [
        (False, None, 0, False, "never run"),
        (False, None, 6, False, "never run"),  # nothing built: everything in its topics waits
        (False, "building", 6, False, "building"),
        (False, "catching_up", 6, False, "building"),
        (False, None, 6, True, "building"),  # an API rebuild's process before its build row exists
        (False, "failed", 6, False, "failed"),
        (True, "done", 0, False, "done"),
        (True, "done", 162, False, "behind"),  # the build's status says done; 162 records wait
        (True, "done", 1, False, "behind"),
        (True, "failed", 0, False, "done"),  # a failed rebuild leaves the old build serving
        (True, "failed", 3, False, "behind"),
        (True, "building", 162, False, "rebuilding"),
        (True, "swapping", 0, False, "rebuilding"),
        (True, "done", 162, True, "rebuilding"),
    ],
)
def test_state_from_builds_and_lag(serving: bool, newest: str | None, lag: int, rebuilding: bool, state: str) -> None:
    assert projection_state(serving, newest, lag, rebuilding=rebuilding) == state


def test_done_only_when_caught_up() -> None:
    for serving in (False, True):
        for newest in (None, "done", "failed", *BUSY):
            for lag in (1, 162):
                assert projection_state(serving, newest, lag) != "done"


def test_every_state_is_listed() -> None:
    seen = {
        projection_state(serving, newest, lag, rebuilding=r)
        for serving in (False, True)
        for newest in (None, "done", "failed", *BUSY)
        for lag in (0, 5)
        for r in (False, True)
    }
    assert seen == set(STATES)


def test_labels_say_how_far_behind() -> None:
    assert state_label("behind", 162) == "behind (162 records)"
    assert state_label("behind", 1) == "behind (1 record)"
    assert state_label("behind", 12_345) == "behind (12,345 records)"
    assert state_label("done", 0) == "done"
    assert state_label("rebuilding", 40) == "rebuilding"
