"""Projections the integration tests name by path, as a user's `modules = [...]` would."""

from typing import Any

from projections.definition import Fold, Projection, WindowSpec
from projections.examples import account_balances, account_daily_totals, account_totals

TOPICS = ("events.deposits", "events.withdrawals")
HOUR = 3_600_000

PROJECTIONS = [
    account_balances.make(name="bank", topics=TOPICS),
    account_daily_totals.make(
        name="bank_daily",
        topics=TOPICS,
        window=WindowSpec.tumbling(
            account_daily_totals.DAY, lateness=HOUR, late="update", grace=HOUR
        ),
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
