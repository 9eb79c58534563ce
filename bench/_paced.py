"""A writer that runs one statement at a steady rate (shared by the latency benchmarks)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import psycopg


def paced_writes(
    dsn: str, sql: str, seconds: float, tps: int, params: Callable[[int], Sequence[Any] | None] = lambda _n: None
) -> int:
    """Execute `sql` (with `params(n)` for the n-th statement) on one autocommit connection, `tps`
    times a second for `seconds`, sleeping when ahead of the pace; returns how many were sent."""
    sent = 0
    with psycopg.connect(dsn, autocommit=True) as conn:
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            conn.execute(sql, params(sent))
            sent += 1
            ahead = sent / tps - (time.perf_counter() - t0)
            if ahead > 0:
                time.sleep(ahead)
    return sent
