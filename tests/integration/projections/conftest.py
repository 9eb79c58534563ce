"""One SparkSession for every Spark test: a session takes seconds to start, so tests share one."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tributary.projections.spark import get_session, stop_session


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    session = get_session("local[2]", shuffle_partitions=2)
    try:
        yield session
    finally:
        stop_session()
