"""Task slots of a master URL (the DataFrame projections' shuffle partitions are capped by them)."""

from __future__ import annotations

import os

import pytest

from tributary.projections.spark import local_cores

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("master", "slots"),
    [
        ("local", 1),
        ("local[1]", 1),
        ("local[3]", 3),
        ("local[*]", os.cpu_count()),
        ("local[2,4]", 2),  # local[n, maxFailures]
        ("local[*,4]", os.cpu_count()),
        ("local[0]", None),
        ("local-cluster[2,1,1024]", None),
        ("spark://127.0.0.1:7077", None),
        ("yarn", None),
    ],
)
def test_local_cores(master: str, slots: int | None) -> None:
    assert local_cores(master) == slots
