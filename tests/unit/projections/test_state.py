"""A projection's state agrees with its lag: `done` only when caught up, `behind` while records wait."""

from __future__ import annotations

import itertools

import pytest

from tributary.projections.state import BUSY, STATES, projection_state, state_label

pytestmark = pytest.mark.unit

NEWEST = (None, "done", "failed", *sorted(BUSY))


@pytest.mark.parametrize(
    ("serving", "newest", "lag", "locked", "started", "state"),
    [
        (False, None, 0, False, False, "never run"),
        (False, None, 6, False, False, "never run"),  # nothing built: everything in its topics waits
        (False, "building", 6, True, False, "building"),
        (False, "catching_up", 6, True, False, "building"),
        (False, None, 6, False, True, "building"),  # an API rebuild's process before its build row exists
        (False, "failed", 6, False, False, "failed"),
        (False, "building", 6, False, False, "failed"),  # left `building` by a killed process: no lock
        (True, "done", 0, False, False, "done"),
        (True, "done", 162, False, False, "behind"),  # the build's status says done; 162 records wait
        (True, "done", 1, False, False, "behind"),
        (True, "done", 162, True, False, "behind"),  # a catch-up pass holds the lock: still behind
        (True, "failed", 0, False, False, "done"),  # a failed rebuild leaves the old build serving
        (True, "failed", 3, False, False, "behind"),
        (True, "building", 162, True, False, "rebuilding"),
        (True, "swapping", 0, True, False, "rebuilding"),
        (True, "catching_up", 4, False, False, "behind"),  # a killed rebuild: the serving build's lag decides
        (True, "done", 162, False, True, "rebuilding"),
    ],
)
def test_state_from_builds_and_lag(
    serving: bool, newest: str | None, lag: int, locked: bool, started: bool, state: str
) -> None:
    assert projection_state(serving, newest, lag, locked=locked, started=started) == state


def test_done_only_when_caught_up() -> None:
    for serving, newest, lag, locked, started in itertools.product(
        (False, True), NEWEST, (1, 162), (False, True), (False, True)
    ):
        assert projection_state(serving, newest, lag, locked=locked, started=started) != "done"


def test_every_state_is_listed() -> None:
    seen = {
        projection_state(serving, newest, lag, locked=locked, started=started)
        for serving, newest, lag, locked, started in itertools.product(
            (False, True), NEWEST, (0, 5), (False, True), (False, True)
        )
    }
    assert seen == set(STATES)


def test_labels_say_how_far_behind() -> None:
    assert state_label("behind", 162) == "behind (162 records)"
    assert state_label("behind", 1) == "behind (1 record)"
    assert state_label("behind", 12_345) == "behind (12,345 records)"
    assert state_label("done", 0) == "done"
    assert state_label("rebuilding", 40) == "rebuilding"
