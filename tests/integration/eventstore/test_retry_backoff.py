"""A command sent without `expected_version` that loses to other writers is retried after pauses
drawn from an exponentially growing range; when every retry loses, the conflict says so."""

from __future__ import annotations

import dataclasses
import random
from typing import Any

import pytest
from pydantic import BaseModel

from tributary.eventstore.aggregate import Aggregate
from tributary.eventstore.errors import ConcurrencyConflict
from tributary.eventstore.examples.bank import AccountState, bank_account
from tributary.eventstore.handler import CommandHandler
from tributary.eventstore.model import NewEvent
from tributary.eventstore.store import EventStore

pytestmark = pytest.mark.integration

BASE, CAP = 0.01, 0.05


def _interfering(store: EventStore, stream: str, times: int) -> Aggregate[AccountState]:
    """The bank account whose `decide` lets another writer append to the stream first, `times` times:
    the handler's append at the version it loaded then loses to a real unique-constraint conflict."""
    bank = bank_account()
    left = [times]

    def decide(state: AccountState, command: BaseModel) -> Any:
        if left[0] > 0:
            left[0] -= 1
            store.append(stream, "account", [NewEvent(type="MoneyDeposited", data={"amount": "1.00"})], "any")
        return bank.decide(state, command)

    return dataclasses.replace(bank, decide=decide)


def _handler(store: EventStore, stream: str, times: int, pauses: list[float]) -> CommandHandler:
    store.append(stream, "account", [NewEvent(type="AccountOpened", data={"owner": "a", "overdraft_limit": "0"})])
    return CommandHandler(
        store,
        {"account": _interfering(store, stream, times)},
        max_retries=3,
        retry_base_s=BASE,
        retry_cap_s=CAP,
        sleep=pauses.append,
        rng=random.Random(3),
    )


def test_conflicts_are_retried_after_growing_jittered_pauses(store: EventStore) -> None:
    pauses: list[float] = []
    result = _handler(store, "r-1", 3, pauses).handle("account", "r-1", "deposit", {"amount": "5"})
    assert result.version == 5  # opened, 3 deposits by the other writer, then ours
    assert len(pauses) == 3
    assert all(0 < p <= min(CAP, BASE * 2**i) for i, p in enumerate(pauses)), pauses


def test_a_command_that_loses_every_retry_says_so(store: EventStore) -> None:
    pauses: list[float] = []
    with pytest.raises(ConcurrencyConflict) as info:
        _handler(store, "r-2", 100, pauses).handle("account", "r-2", "deposit", {"amount": "5"})
    assert len(pauses) == 3 and info.value.attempts == 4 and info.value.actual == 5
    assert "4 attempts" in str(info.value) and "retry" in str(info.value)


def test_a_pinned_expected_version_is_not_retried(store: EventStore) -> None:
    pauses: list[float] = []
    handler = _handler(store, "r-3", 1, pauses)
    with pytest.raises(ConcurrencyConflict) as info:
        handler.handle("account", "r-3", "deposit", {"amount": "5"}, expected_version=1)
    assert pauses == [] and info.value.attempts == 1 and info.value.actual == 2
