"""Delivering one batch: POST, retry with backoff, split refused batches, give up into dead letters.

Sans-IO in the middle: `Delivery` is handed a `send` function (one POST of some records → the
answer) and a `sleep` function (which returns False when the sink is stopping), so the policy is
tested without sockets and the runner decides how to talk HTTP."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from tributary.sinks.retry import Backoff, Verdict, classify

__all__ = ["Answer", "DeadLetter", "Delivery", "Outcome", "Stopped"]

T = TypeVar("T")


class Stopped(Exception):
    """The sink was asked to stop while waiting to retry: the batch is neither delivered nor
    dead-lettered (it is not committed, so it is delivered again after a restart)."""


@dataclass(frozen=True)
class Answer:
    """What one POST got: the HTTP status (None: no answer — connection error or timeout), a
    `Retry-After` in ms if any, and a one-line description for errors."""

    status: int | None
    error: str = ""
    retry_after_ms: float | None = None


@dataclass(frozen=True)
class DeadLetter(Generic[T]):
    items: tuple[T, ...]
    error: str
    attempts: int


@dataclass
class Outcome(Generic[T]):
    delivered: int = 0
    requests: int = 0
    failed_attempts: int = 0
    dead: list[DeadLetter[T]] = field(default_factory=list)


@dataclass
class Delivery(Generic[T]):
    send: Callable[[Sequence[T]], Answer]
    sleep: Callable[[float], bool]
    backoff: Backoff
    max_attempts: int
    rng: random.Random = field(default_factory=random.Random)

    def deliver(self, items: Sequence[T]) -> Outcome[T]:
        """Deliver `items` in order; every item ends delivered or in `Outcome.dead` (in order).
        Raises Stopped when `sleep` says the sink stops."""
        outcome: Outcome[T] = Outcome()
        if items:
            self._run(tuple(items), outcome)
        return outcome

    def _run(self, items: tuple[T, ...], outcome: Outcome[T]) -> None:
        attempt = 0
        while True:
            attempt += 1
            answer = self.send(items)
            outcome.requests += 1
            verdict = classify(answer.status)
            if verdict is Verdict.DELIVERED:
                outcome.delivered += len(items)
                return
            outcome.failed_attempts += 1
            if verdict is Verdict.REFUSED:
                if len(items) > 1:  # halves in order: the refused records end up alone
                    mid = len(items) // 2
                    self._run(items[:mid], outcome)
                    self._run(items[mid:], outcome)
                else:
                    outcome.dead.append(DeadLetter(items, answer.error, attempt))
                return
            if attempt >= self.max_attempts:
                outcome.dead.append(DeadLetter(items, answer.error, attempt))
                return
            wait = answer.retry_after_ms
            if wait is None:
                wait = self.backoff.delay_ms(attempt, self.rng)
            if not self.sleep(wait):
                raise Stopped
