"""Projections the integration tests name by path, as a user's `modules = [...]` would."""

from decimal import Decimal
from typing import Any

from tributary.projections.definition import Fold, Projection, Table, WindowSpec
from tributary.projections.examples import account_balances, account_daily_totals, account_totals

TOPICS = ("events.deposits", "events.withdrawals")
HOUR = 3_600_000

PROJECTIONS = [
    account_balances.make(name="bank", topics=TOPICS),
    account_daily_totals.make(
        name="bank_daily",
        topics=TOPICS,
        window=WindowSpec.tumbling(account_daily_totals.DAY, lateness=HOUR, late="update", grace=HOUR),
    ),
    account_totals.make(name="bank_totals", topics=TOPICS),
]


def _strict_apply(state: Any, record: Any) -> Any:
    if record.data.get("amount") == "666.66":
        raise ValueError("cursed amount")
    return account_balances.apply(state, record)


PROJECTIONS.append(
    Projection(
        name="bank_strict",
        version=1,
        topics=TOPICS,
        table=account_balances.TABLE,
        fold=Fold(account_balances.initial, _strict_apply, account_balances.result),
    )
)


def _session_initial(key: Any, start: int, end: int) -> dict[str, Any]:
    return {"id": key, "n": 0, "sum": Decimal(0)}


def _session_apply(s: dict[str, Any], r: Any) -> dict[str, Any]:
    return {**s, "n": s["n"] + 1, "sum": s["sum"] + Decimal(r.data["amount"])}


def _session_result(s: dict[str, Any], start: int, end: int) -> dict[str, Any]:
    return {"account_id": s["id"], "start_ms": start, "end_ms": end, "movements": s["n"], "amount": s["sum"]}


WINDOW_TABLE = Table.of(
    {
        "account_id": "text",
        "start_ms": "bigint",
        "end_ms": "bigint",
        "movements": "integer",
        "amount": "numeric(20,2)",
    },
    ["account_id", "start_ms"],  # rows must be unique per unit: the window start is in the key
)
WINDOW_FOLD = Fold(_session_initial, _session_apply, _session_result)

PROJECTIONS += [
    Projection(
        name="bank_sessions",
        version=1,
        topics=TOPICS,
        table=WINDOW_TABLE,
        fold=WINDOW_FOLD,
        window=WindowSpec.session(6 * HOUR, lateness=2 * HOUR, late="update", grace=HOUR),
    ),
    Projection(
        name="bank_hopping",
        version=1,
        topics=TOPICS,
        table=WINDOW_TABLE,
        fold=WINDOW_FOLD,
        window=WindowSpec.hopping(24 * HOUR, 12 * HOUR, lateness=HOUR),
    ),
]

# a mistake the runner must refuse: hopping windows keyed by date collide (two starts per day)
PROJECTIONS.append(
    account_daily_totals.make(
        name="bank_collide",
        topics=TOPICS,
        window=WindowSpec.hopping(24 * HOUR, 12 * HOUR),
    )
)


def _per_record(records: Any) -> Any:
    """A DataFrame transform that (wrongly) emits one row per record, keyed by account."""
    from pyspark.sql import functions as F

    return records.select(F.col("key").alias("account_id"), F.col("offset").alias("events"))


PROJECTIONS.append(
    Projection(
        name="bank_dupes",
        version=1,
        topics=TOPICS,
        table=Table.of({"account_id": "text", "events": "bigint"}, ["account_id"]),
        build=_per_record,
    )
)
