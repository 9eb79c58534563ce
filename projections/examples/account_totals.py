"""`account_totals`: a DataFrame-transform projection — vectorised sums per account, no fold.

`build(records)` gets the log records (topic, partition, offset, timestamp, key, value, headers,
event_time, pkey; JSON as strings; and `value_v`, the value as a VARIANT) and returns rows with the
table's columns. Its sums and count decompose, and it reads event topics only (append-only), so it
declares how a partial aggregate merges into a stored row (`merge=`): a run hands `build` only
the records past the checkpoints and adds its partial sums to the table (docs/projections.md,
"Incremental DataFrame projections"). Order does not matter to a sum; use a fold when it does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tributary.projections.definition import Projection, Table

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["MERGE", "PROJECTION", "build", "build_from_json", "make"]


def build(records: DataFrame) -> DataFrame:
    from pyspark.sql import functions as F

    # Fields of the VARIANT value, not a JSON parse: from the Parquet copies of sealed segments
    # Spark reads just these three shredded columns. (`from_json("value", ...)` gives the same
    # rows, parsing every value.) Amounts are JSON strings: the cast to decimal is exact.
    events = records.select(
        F.expr("variant_get(value_v, '$.stream', 'string')").alias("account_id"),
        F.expr("variant_get(value_v, '$.type', 'string')").alias("kind"),
        F.expr("variant_get(value_v, '$.data.amount', 'decimal(20,2)')").alias("amount"),
    )
    return _totals(events)


def _totals(events: DataFrame) -> DataFrame:
    from pyspark.sql import functions as F

    zero = F.lit(0).cast("decimal(20,2)")
    return (
        events.groupBy("account_id")
        .agg(
            F.coalesce(F.sum(F.when(F.col("kind") == "MoneyDeposited", F.col("amount"))), zero).alias("deposits"),
            F.coalesce(F.sum(F.when(F.col("kind") == "MoneyWithdrawn", F.col("amount"))), zero).alias("withdrawals"),
            F.count(F.lit(1)).alias("events"),
        )
        .where(F.col("account_id").isNotNull())
    )


def build_from_json(records: DataFrame) -> DataFrame:
    """The same rows, written the way a projection reads the JSON text (`value`): one typed
    `from_json` parse per record. Works unchanged; `build` is faster on Parquet copies."""
    from pyspark.sql import functions as F

    fields = F.from_json("value", "stream string, type string, data struct<amount: string>")
    return _totals(
        records.where(F.col("value").isNotNull())
        .select(fields.alias("v"))
        .select(
            F.col("v.stream").alias("account_id"),
            F.col("v.type").alias("kind"),
            F.col("v.data.amount").cast("decimal(20,2)").alias("amount"),
        )
    )


MERGE = {"deposits": "sum", "withdrawals": "sum", "events": "count"}
"""How a run's partial aggregates merge into the stored rows: what makes runs incremental."""


def make(
    name: str = "account_totals",
    topics: tuple[str, ...] = ("events.account",),
    version: int = 1,
    *,
    from_json: bool = False,
    incremental: bool = True,
) -> Projection:
    """The projection; `incremental=False` leaves out `merge` (every run recomputes the whole log)."""
    return Projection(
        name=name,
        version=version,
        topics=topics,
        build=build_from_json if from_json else build,
        table=Table.of(
            {
                "account_id": "text",
                "deposits": "numeric(20,2)",
                "withdrawals": "numeric(20,2)",
                "events": "bigint",
            },
            ["account_id"],
        ),
        merge=MERGE if incremental else {},
        description="deposit and withdrawal sums per account (DataFrame transform)",
    )


PROJECTION = make()
