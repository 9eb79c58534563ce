"""One SparkSession for every Spark test (start-up costs 6–8 s; DESIGN.md "Facts about Spark")."""

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
