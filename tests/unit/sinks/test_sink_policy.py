"""The HTTP sink's pure parts: batching limits, the retry verdicts and backoff, and delivery's
splitting and giving up — every item ends delivered or dead-lettered, in order."""

from __future__ import annotations

import random
from collections.abc import Sequence

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tributary.sinks import Answer, Backoff, Batcher, Delivery, Stopped, Verdict, classify, retry_after_ms

pytestmark = pytest.mark.unit


@given(
    sizes=st.lists(st.integers(1, 300), max_size=200),
    max_records=st.integers(1, 20),
    max_bytes=st.integers(1, 1000),
)
def test_batches_keep_order_and_respect_limits(sizes: list[int], max_records: int, max_bytes: int) -> None:
    batcher: Batcher[int] = Batcher(max_records, max_bytes, linger_ms=50)
    batches = batcher.add([(i, s) for i, s in enumerate(sizes)], now_ms=0)
    rest = batcher.take()
    if rest is not None:
        batches.append(rest)
    assert [i for b in batches for i in b.items] == list(range(len(sizes)))
    for b in batches:
        assert 1 <= len(b.items) <= max_records
        assert b.nbytes == sum(sizes[i] for i in b.items)
        assert b.nbytes <= max_bytes or len(b.items) == 1  # an oversized record travels alone
    for b, after in zip(batches, batches[1:], strict=False):  # a batch was cut only when the next record did not fit
        assert len(b.items) == max_records or b.nbytes >= max_bytes or b.nbytes + sizes[after.items[0]] > max_bytes


def test_linger_lets_a_small_batch_go_after_its_first_record_waited() -> None:
    batcher: Batcher[str] = Batcher(max_records=10, max_bytes=1000, linger_ms=100)
    assert batcher.wait_ms(0, idle_ms=5000) == 5000  # empty: wait for records as long as the caller likes
    assert batcher.add([("a", 10)], now_ms=1000) == []
    assert not batcher.due(1050) and batcher.wait_ms(1050, idle_ms=5000) == 50
    batcher.add([("b", 10)], now_ms=1080)
    assert batcher.due(1100)  # counted from the first record, not the last
    batch = batcher.take()
    assert batch is not None and batch.items == ("a", "b") and len(batcher) == 0


@pytest.mark.parametrize(
    ("status", "verdict"),
    [
        (200, Verdict.DELIVERED),
        (204, Verdict.DELIVERED),
        (400, Verdict.REFUSED),
        (413, Verdict.REFUSED),
        (422, Verdict.REFUSED),
        (None, Verdict.TRANSIENT),
        (401, Verdict.TRANSIENT),
        (404, Verdict.TRANSIENT),
        (429, Verdict.TRANSIENT),
        (500, Verdict.TRANSIENT),
        (503, Verdict.TRANSIENT),
    ],
)
def test_verdicts(status: int | None, verdict: Verdict) -> None:
    assert classify(status) is verdict


@given(initial=st.integers(1, 5000), cap=st.integers(1, 60_000), attempt=st.integers(1, 200), seed=st.integers())
def test_backoff_grows_exponentially_within_its_ceiling(initial: int, cap: int, attempt: int, seed: int) -> None:
    delay = Backoff(initial, cap).delay_ms(attempt, random.Random(seed))
    ceiling = min(cap, initial * 2 ** min(attempt - 1, 60))
    assert ceiling / 2 <= delay <= ceiling


def test_retry_after() -> None:
    assert retry_after_ms("2", 30_000) == 2000
    assert retry_after_ms("3600", 30_000) == 30_000
    assert retry_after_ms("Wed, 21 Oct 2015 07:28:00 GMT", 30_000) is None
    assert retry_after_ms("nan", 30_000) is None
    assert retry_after_ms(None, 30_000) is None


class Receiver:
    """A receiver's behaviour as a table: refuses the items in `poison`, fails the first
    `transient` requests, and records what it accepted."""

    def __init__(self, poison: set[int], transient: int) -> None:
        self.poison, self.transient = poison, transient
        self.accepted: list[int] = []
        self.requests = 0

    def send(self, items: Sequence[int]) -> Answer:
        self.requests += 1
        if self.transient > 0:
            self.transient -= 1
            return Answer(503, "HTTP 503")
        if self.poison & set(items):
            return Answer(400, "HTTP 400 bad record")
        self.accepted.extend(items)
        return Answer(200)


@given(
    n=st.integers(0, 64),
    poison=st.sets(st.integers(0, 63), max_size=5),
    transient=st.integers(0, 3),
    max_attempts=st.integers(1, 5),
)
def test_every_item_is_delivered_or_dead_lettered_in_order(
    n: int, poison: set[int], transient: int, max_attempts: int
) -> None:
    receiver = Receiver(poison, transient)
    waits: list[float] = []
    delivery = Delivery(
        send=receiver.send,
        sleep=lambda ms: waits.append(ms) or True,
        backoff=Backoff(100, 1000),
        max_attempts=max_attempts,
        rng=random.Random(0),
    )
    outcome = delivery.deliver(list(range(n)))
    dead = [i for letter in outcome.dead for i in letter.items]
    assert receiver.accepted == sorted(receiver.accepted)  # order kept
    assert sorted(receiver.accepted + dead) == list(range(n))  # nothing lost, nothing twice
    assert outcome.delivered == len(receiver.accepted) and outcome.requests == receiver.requests
    if transient < max_attempts:
        assert set(dead) == poison & set(range(n))  # only the refused records, each alone
        assert all(len(letter.items) == 1 for letter in outcome.dead)
    assert len(waits) == min(transient, max_attempts - 1) if n else waits == []


def test_a_stop_during_backoff_abandons_the_batch() -> None:
    receiver = Receiver(set(), transient=10)
    delivery = Delivery(
        send=receiver.send, sleep=lambda ms: False, backoff=Backoff(100, 1000), max_attempts=5, rng=random.Random(0)
    )
    with pytest.raises(Stopped):
        delivery.deliver([1, 2, 3])
    assert receiver.accepted == []
