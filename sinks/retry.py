"""Retry policy of the HTTP sink: which answers are worth another try, and how long to wait.

- 2xx: delivered.
- 400, 413, 415, 422: the receiver refuses this content. Retrying the same bytes cannot help, so
  a batch of several records is split in halves (sent in order) until the refused records stand
  alone; a refused single record goes to the dead letters at once.
- anything else (connection refused or reset, timeouts, 401/403/404, 408, 429, 5xx): transient —
  retried with exponential backoff (a `Retry-After` of a few seconds is honoured within the ceiling)
  until `max_attempts` attempts failed; then the batch goes to the dead letters and the sink moves on.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from enum import Enum

__all__ = ["Backoff", "Verdict", "classify", "retry_after_ms"]

_REFUSED = frozenset({400, 413, 415, 422})


class Verdict(Enum):
    DELIVERED = "delivered"
    REFUSED = "refused"  # the content: split, then dead-letter
    TRANSIENT = "transient"  # the receiver or the network: retry with backoff


def classify(status: int | None) -> Verdict:
    """`status` None = no HTTP answer (connection error or timeout)."""
    if status is not None and 200 <= status < 300:
        return Verdict.DELIVERED
    if status in _REFUSED:
        return Verdict.REFUSED
    return Verdict.TRANSIENT


@dataclass(frozen=True)
class Backoff:
    """Exponential backoff with "full jitter" (a uniform wait between half and all of
    `initial_ms · 2^(attempt-1)`, capped at `max_ms`): retries of many sinks do not arrive together."""

    initial_ms: int
    max_ms: int

    def delay_ms(self, attempt: int, rng: random.Random) -> float:
        """The wait after failed attempt number `attempt` (1-based)."""
        if attempt < 1:
            raise ValueError("attempt is 1-based")
        ceiling = min(float(self.max_ms), self.initial_ms * 2.0 ** min(attempt - 1, 60))
        return rng.uniform(ceiling / 2, ceiling)


def retry_after_ms(value: str | None, max_ms: int) -> float | None:
    """A `Retry-After` header's seconds as milliseconds within `max_ms` (dates are ignored)."""
    if not value:
        return None
    try:
        seconds = float(value.strip())
    except ValueError:
        return None
    if seconds != seconds or seconds < 0:  # NaN or negative
        return None
    return min(seconds * 1000, float(max_ms))
