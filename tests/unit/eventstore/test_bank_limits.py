"""Every state the bank account accepts stays a valid `AccountState`: a snapshot of it loads again."""

from __future__ import annotations

from decimal import Decimal as D

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tributary.eventstore.errors import CommandRejected
from tributary.eventstore.examples.bank import MAX_BALANCE, AccountState, bank_account

pytestmark = pytest.mark.unit

BANK = bank_account()
AMOUNT = st.decimals(min_value=D("0.01"), max_value=MAX_BALANCE, places=2)
COMMAND = st.one_of(
    st.tuples(st.just("deposit"), AMOUNT.map(lambda a: {"amount": str(a)})),
    st.tuples(st.just("withdraw"), AMOUNT.map(lambda a: {"amount": str(a)})),
)


def _open(limit: D) -> AccountState:
    state = BANK.initial()
    for event in BANK.decide(state, BANK.parse_command("open", {"owner": "a", "overdraft_limit": str(limit)})):
        state = BANK.evolve(state, event)
    return state


@settings(max_examples=200, deadline=None, derandomize=True)
@given(limit=st.sampled_from([D(0), D(100), MAX_BALANCE]), commands=st.lists(COMMAND, max_size=30))
def test_accepted_commands_keep_the_state_loadable_from_a_snapshot(
    limit: D, commands: list[tuple[str, dict[str, str]]]
) -> None:
    state = _open(limit)
    for name, data in commands:
        try:
            events = BANK.decide(state, BANK.parse_command(name, data))
        except CommandRejected:
            continue
        for event in events:
            state = BANK.evolve(state, event)
        assert AccountState.model_validate(state.model_dump(mode="json")) == state


def test_a_deposit_beyond_the_largest_balance_is_refused_by_a_rule() -> None:
    state = _open(D(0))
    state = BANK.evolve(state, BANK.decide(state, BANK.parse_command("deposit", {"amount": str(MAX_BALANCE)}))[0])
    with pytest.raises(CommandRejected) as info:
        BANK.decide(state, BANK.parse_command("deposit", {"amount": "0.01"}))
    assert info.value.rule == "balance_limit"


def test_an_overdraft_fee_beyond_the_largest_balance_is_refused_by_a_rule() -> None:
    state = _open(MAX_BALANCE)
    with pytest.raises(CommandRejected) as info:
        BANK.decide(state, BANK.parse_command("withdraw", {"amount": str(MAX_BALANCE)}))
    assert info.value.rule == "balance_limit"
