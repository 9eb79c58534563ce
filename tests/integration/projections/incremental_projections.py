"""DataFrame projections over the bank topics, incremental or not, for the incremental tests."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from tributary.projections.definition import Projection, Table
from tributary.projections.examples import account_totals

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from tributary.projections.records import ProjectionRecord

TOPICS = ("events.deposits", "events.withdrawals")


def extremes(records: DataFrame) -> DataFrame:
    """Per account: the smallest and largest amount moved, the latest event time and a tally —
    partials that merge by `min`, `max` and the author's own SQL."""
    from pyspark.sql import functions as F

    events = records.select(
        F.expr("variant_get(value_v, '$.stream', 'string')").alias("account_id"),
        F.expr("variant_get(value_v, '$.data.amount', 'decimal(20,2)')").alias("amount"),
        F.col("event_time"),
    ).where(F.col("account_id").isNotNull())
    return events.groupBy("account_id").agg(
        F.min("amount").alias("smallest"),
        F.max("amount").alias("largest"),
        F.max("event_time").alias("last_ms"),
        F.count(F.lit(1)).alias("tally"),
    )


def logged_at(record: ProjectionRecord) -> int:
    """An event time of the projection's own (Python), not the log's default."""
    return record.timestamp + 1


PROJECTIONS = [
    account_totals.make(name="totals", topics=TOPICS),
    account_totals.make(name="totals_full", topics=TOPICS, incremental=False),
    account_totals.make(name="totals_cdc", topics=("shop.public.accounts",)),
    replace(account_totals.make(name="totals_keyed", topics=TOPICS), event_time=logged_at),
    Projection(
        name="extremes",
        version=1,
        topics=TOPICS,
        build=extremes,
        table=Table.of(
            {
                "account_id": "text",
                "smallest": "numeric(20,2)",
                "largest": "numeric(20,2)",
                "last_ms": "bigint",
                "tally": "bigint",
            },
            ["account_id"],
        ),
        merge={
            "smallest": "min",
            "largest": "max",
            "last_ms": "GREATEST(old.last_ms, new.last_ms)",
            "tally": "old.tally + new.tally",
        },
    ),
]
