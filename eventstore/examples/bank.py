"""The bank-account example (stream type `account`): open, deposit, withdraw, overdraft fee, close.

Pure: no I/O, exact Decimal money with two places. Each refusal names the rule it applies. Load it
like any domain: `[eventstore] modules = ["tributary.eventstore.examples.bank"]` (`tributary demo`
does). The fee is this example's own setting: `OVERDRAFT_FEE`, or `bank_account(overdraft_fee=…)` in
a module of your own that exports the result as `AGGREGATE`.
"""

from __future__ import annotations

from collections.abc import Sequence
from decimal import Decimal
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from tributary.eventstore.aggregate import Aggregate
from tributary.eventstore.errors import CommandRejected

__all__ = ["AGGREGATE", "MAX_BALANCE", "OVERDRAFT_FEE", "AccountState", "bank_account"]

_CENTS = Decimal("0.01")
_Cents = AfterValidator(lambda d: d.quantize(_CENTS))  # "20" and "20.0" are both 20.00
Money = Annotated[Decimal, Field(max_digits=20, decimal_places=2), _Cents]
PositiveMoney = Annotated[Decimal, Field(gt=0, max_digits=20, decimal_places=2), _Cents]
# The largest balance (either sign) that `Money` holds: the state is `Money` too, and a snapshot of a
# state that does not validate could not be loaded again.
MAX_BALANCE = Decimal("999999999999999999.99")
OVERDRAFT_FEE = Decimal("5.00")  # charged whenever a withdrawal takes the balance below zero


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


# -- commands -----------------------------------------------------------------------------------
class Open(_Model):
    owner: Annotated[str, Field(min_length=1, max_length=200)]
    overdraft_limit: Annotated[Decimal, Field(ge=0, max_digits=20, decimal_places=2), _Cents] = Decimal("0.00")


class Deposit(_Model):
    amount: PositiveMoney


class Withdraw(_Model):
    amount: PositiveMoney


class Close(_Model):
    pass


# -- events ---------------------------------------------------------------------------------------
class AccountOpened(_Model):
    owner: str
    overdraft_limit: Money


class MoneyDeposited(_Model):
    amount: Money


class MoneyWithdrawn(_Model):
    amount: Money


class OverdraftFeeCharged(_Model):
    amount: Money


class AccountClosed(_Model):
    pass


class AccountState(_Model):
    status: Literal["new", "open", "closed"] = "new"
    owner: str | None = None
    balance: Money = Decimal("0.00")
    overdraft_limit: Money = Decimal("0.00")
    fees_charged: Money = Decimal("0.00")


def _must_be_open(state: AccountState) -> None:
    if state.status == "new":
        raise CommandRejected("account_must_exist", "no account has been opened on this stream")
    if state.status == "closed":
        raise CommandRejected("account_must_be_open", "the account is closed")


def _within_limits(balance: Decimal) -> None:
    if abs(balance) > MAX_BALANCE:
        raise CommandRejected("balance_limit", f"the balance would be {balance}, beyond ±{MAX_BALANCE}")


def bank_account(*, overdraft_fee: Decimal = OVERDRAFT_FEE) -> Aggregate[AccountState]:
    """The aggregate, with the fee charged whenever a withdrawal takes the balance below zero."""

    def decide(state: AccountState, command: BaseModel) -> Sequence[BaseModel]:
        if isinstance(command, Open):
            if state.status != "new":
                raise CommandRejected(
                    "open_only_new",
                    "this account is already open" if state.status == "open" else "this account was closed",
                )
            return [AccountOpened(owner=command.owner, overdraft_limit=command.overdraft_limit)]
        _must_be_open(state)
        if isinstance(command, Deposit):
            _within_limits(state.balance + command.amount)
            return [MoneyDeposited(amount=command.amount)]
        if isinstance(command, Withdraw):
            after = state.balance - command.amount
            if after < -state.overdraft_limit:
                raise CommandRejected(
                    "overdraft_limit",
                    f"withdrawing {command.amount} would leave {after}, below the overdraft limit of -{state.overdraft_limit}",
                )
            events: list[BaseModel] = [MoneyWithdrawn(amount=command.amount)]
            if after < 0 and overdraft_fee > 0:
                events.append(OverdraftFeeCharged(amount=overdraft_fee))
                after -= overdraft_fee
            _within_limits(after)
            return events
        if isinstance(command, Close):
            if state.balance != 0:
                raise CommandRejected("close_at_zero", f"the balance is {state.balance}; it must be 0.00 to close")
            return [AccountClosed()]
        raise CommandRejected("unknown_command", type(command).__name__)

    def evolve(state: AccountState, event: BaseModel) -> AccountState:
        update: dict[str, Any]
        if isinstance(event, AccountOpened):
            update = {"status": "open", "owner": event.owner, "overdraft_limit": event.overdraft_limit}
        elif isinstance(event, MoneyDeposited):
            update = {"balance": state.balance + event.amount}
        elif isinstance(event, MoneyWithdrawn):
            update = {"balance": state.balance - event.amount}
        elif isinstance(event, OverdraftFeeCharged):
            update = {"balance": state.balance - event.amount, "fees_charged": state.fees_charged + event.amount}
        elif isinstance(event, AccountClosed):
            update = {"status": "closed"}
        else:
            return state
        return state.model_copy(update=update)

    return Aggregate(
        stream_type="account",
        state_type=AccountState,
        commands={"open": Open, "deposit": Deposit, "withdraw": Withdraw, "close": Close},
        events=[AccountOpened, MoneyDeposited, MoneyWithdrawn, OverdraftFeeCharged, AccountClosed],
        decide=decide,
        evolve=evolve,
        # v1 of AccountOpened had no overdraft_limit (it defaulted to 0): lifted on read.
        upcasters={("AccountOpened", 1): lambda d: {**d, "overdraft_limit": d.get("overdraft_limit", "0.00")}},
        event_versions={"AccountOpened": 2},
    )


AGGREGATE = bank_account()
