"""A copy is scanned without the offset filter only when every offset it holds is in the run's range."""

from __future__ import annotations

import pytest

from tributary.log.local import TailCopy
from tributary.projections.source import Segment

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("lo", "hi", "stop", "whole"),
    [
        (0, 100, 50, True),  # a rebuild: the sealed segment [10, 50) is all wanted
        (10, 50, 50, True),
        (11, 100, 50, False),  # the run starts inside the segment
        (0, 49, 50, False),  # ... or ends inside it
        (0, 100, None, False),  # its end is unknown
    ],
)
def test_sealed(lo: int, hi: int, stop: int | None, whole: bool) -> None:
    assert Segment("t", 0, 10, "/x/t/0/00000000000000000010.log", lo, hi, [], stop=stop).whole is whole


@pytest.mark.parametrize(("hi", "whole"), [(40, True), (39, False)])
def test_tail_copy_ends_at_its_end(hi: int, whole: bool) -> None:
    copy = TailCopy(10, 40, 1234)
    assert Segment("t", 0, 10, "/x/t/0/00000000000000000010.log", 0, hi, [], copy, stop=None).whole is whole
