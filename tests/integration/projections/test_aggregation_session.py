"""DataFrame projections aggregate in a session capped at one shuffle partition per task slot;
the shared session (and the fold's partitioning) is left as configured."""

from __future__ import annotations

from typing import Any

import pytest

from tributary.projections.spark import aggregation_session

pytestmark = pytest.mark.integration


def test_aggregation_session_caps_partitions_and_leaves_the_shared_one(spark: Any) -> None:
    shared = spark.conf.get("spark.sql.shuffle.partitions")
    slots = 2  # the suite's session is local[2]
    assert aggregation_session(spark, 8).conf.get("spark.sql.shuffle.partitions") == str(min(8, slots))
    one = aggregation_session(spark, 1)
    assert one is not spark and one.sparkContext is spark.sparkContext
    assert one.conf.get("spark.sql.shuffle.partitions") == "1"
    assert spark.conf.get("spark.sql.shuffle.partitions") == shared

    def sums(session: Any) -> Any:
        df = session.range(10_000).selectExpr("id % 97 AS k", "id").groupBy("k").sum("id")
        return df.rdd.getNumPartitions(), sorted(map(tuple, df.collect()))

    (n_one, got), (_, want) = sums(one), sums(spark)
    assert n_one == 1 and got == want
