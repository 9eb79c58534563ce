"""Projections the integration tests name by path, as a user's `modules = [...]` would."""

from projections.definition import WindowSpec
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
