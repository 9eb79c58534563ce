"""The bank account's rules as a table: given events, a command → expected events or the rule that refuses."""

from __future__ import annotations

from decimal import Decimal as D
from typing import Any

import pytest
from pydantic import BaseModel

from tributary.eventstore.aggregate import fold
from tributary.eventstore.errors import CommandRejected, InvalidCommand, UnknownCommand
from tributary.eventstore.examples.bank import (
    AccountClosed,
    AccountOpened,
    AccountState,
    MoneyDeposited,
    MoneyWithdrawn,
    OverdraftFeeCharged,
    bank_account,
)

pytestmark = pytest.mark.unit

BANK = bank_account()
OPEN = AccountOpened(owner="ada", overdraft_limit=D("0"))
OPEN_100 = AccountOpened(owner="ada", overdraft_limit=D("100"))

CASES: list[tuple[str, list[BaseModel], str, dict[str, Any], list[BaseModel] | str]] = [
    ("open a new account", [], "open", {"owner": "ada"}, [OPEN]),
    ("open with a limit", [], "open", {"owner": "ada", "overdraft_limit": "100.00"}, [OPEN_100]),
    ("open twice", [OPEN], "open", {"owner": "bob"}, "open_only_new"),
    ("reopen a closed account", [OPEN, AccountClosed()], "open", {"owner": "ada"}, "open_only_new"),
    ("deposit", [OPEN], "deposit", {"amount": "12.50"}, [MoneyDeposited(amount=D("12.50"))]),
    ("deposit on a missing account", [], "deposit", {"amount": "1.00"}, "account_must_exist"),
    ("deposit on a closed account", [OPEN, AccountClosed()], "deposit", {"amount": "1.00"}, "account_must_be_open"),
    (
        "withdraw within the balance",
        [OPEN, MoneyDeposited(amount=D("10"))],
        "withdraw",
        {"amount": "10.00"},
        [MoneyWithdrawn(amount=D("10.00"))],
    ),
    (
        "withdraw below zero without a limit",
        [OPEN, MoneyDeposited(amount=D("10"))],
        "withdraw",
        {"amount": "10.01"},
        "overdraft_limit",
    ),
    (
        "withdraw into the overdraft charges a fee",
        [OPEN_100],
        "withdraw",
        {"amount": "30.00"},
        [MoneyWithdrawn(amount=D("30.00")), OverdraftFeeCharged(amount=D("5.00"))],
    ),
    (
        "withdraw to exactly the limit",
        [OPEN_100],
        "withdraw",
        {"amount": "100.00"},
        [MoneyWithdrawn(amount=D("100.00")), OverdraftFeeCharged(amount=D("5.00"))],
    ),
    ("withdraw past the limit", [OPEN_100], "withdraw", {"amount": "100.01"}, "overdraft_limit"),
    ("withdraw on a missing account", [], "withdraw", {"amount": "1.00"}, "account_must_exist"),
    ("close at zero", [OPEN], "close", {}, [AccountClosed()]),
    ("close with money left", [OPEN, MoneyDeposited(amount=D("1"))], "close", {}, "close_at_zero"),
    (
        "close in overdraft",
        [OPEN_100, MoneyWithdrawn(amount=D("1")), OverdraftFeeCharged(amount=D("5"))],
        "close",
        {},
        "close_at_zero",
    ),
    ("close twice", [OPEN, AccountClosed()], "close", {}, "account_must_be_open"),
    ("close a missing account", [], "close", {}, "account_must_exist"),
]


@pytest.mark.parametrize(("given", "command", "data", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_rules(given: list[BaseModel], command: str, data: dict[str, Any], expected: list[BaseModel] | str) -> None:
    state = fold(BANK, BANK.initial(), given)
    parsed = BANK.parse_command(command, data)
    if isinstance(expected, str):
        with pytest.raises(CommandRejected) as info:
            BANK.decide(state, parsed)
        assert info.value.rule == expected and info.value.reason
    else:
        assert list(BANK.decide(state, parsed)) == expected


@pytest.mark.parametrize(
    ("command", "data", "field"),
    [
        ("deposit", {"amount": "0"}, "amount"),
        ("deposit", {"amount": "-1"}, "amount"),
        ("deposit", {"amount": "1.001"}, "amount"),
        ("deposit", {}, "amount"),
        ("open", {"owner": ""}, "owner"),
        ("open", {"owner": "x", "overdraft_limit": "-5"}, "overdraft_limit"),
        ("withdraw", {"amount": "1", "extra": 1}, "extra"),
    ],
)
def test_invalid_data_names_the_field(command: str, data: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidCommand) as info:
        BANK.parse_command(command, data)
    assert field in str(info.value)


def test_unknown_command() -> None:
    with pytest.raises(UnknownCommand, match="transfer"):
        BANK.parse_command("transfer", {})


def test_evolve_keeps_exact_money_and_counts_fees() -> None:
    events = [
        OPEN_100,
        MoneyDeposited(amount=D("0.10")),
        MoneyDeposited(amount=D("0.20")),
        MoneyWithdrawn(amount=D("10.00")),
        OverdraftFeeCharged(amount=D("5.00")),
    ]
    state = fold(BANK, BANK.initial(), events)
    assert state == AccountState(
        status="open", owner="ada", balance=D("-14.70"), overdraft_limit=D("100"), fees_charged=D("5.00")
    )


def test_configurable_fee_and_upcasting_old_events() -> None:
    cheap = bank_account(overdraft_fee=D("1.50"))
    state = fold(cheap, cheap.initial(), [OPEN_100])
    assert list(cheap.decide(state, cheap.parse_command("withdraw", {"amount": "1"})))[1] == OverdraftFeeCharged(
        amount=D("1.50")
    )
    v1 = BANK.load_event("AccountOpened", 1, {"owner": "old"})  # written before overdraft limits existed
    assert v1 == AccountOpened(owner="old", overdraft_limit=D("0.00"))
