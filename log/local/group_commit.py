"""Group commit policy (pure; time is passed in): commit after `linger_ms` or `max_records`,
whichever comes first — Kafka's `linger.ms` / `batch.size` trade of latency for throughput."""

from __future__ import annotations

__all__ = ["GroupCommitter"]


class GroupCommitter:
    """Tracks what is pending since the last commit and says when the next one is due."""

    __slots__ = ("linger_ms", "max_records", "pending", "_first_ms")

    def __init__(self, linger_ms: float = 5, max_records: int = 1000) -> None:
        if linger_ms < 0 or max_records < 1:
            raise ValueError(f"need linger_ms >= 0 and max_records >= 1, got {linger_ms}, {max_records}")
        self.linger_ms = linger_ms
        self.max_records = max_records
        self.pending = 0
        self._first_ms: float | None = None

    def record_appended(self, n: int, now_ms: float) -> None:
        if n <= 0:
            return
        if self._first_ms is None:
            self._first_ms = now_ms
        self.pending += n

    def due(self, now_ms: float) -> bool:
        if self._first_ms is None:
            return False
        return self.pending >= self.max_records or now_ms - self._first_ms >= self.linger_ms

    def wait_ms(self, now_ms: float) -> float | None:
        """How long until a commit is due (None: nothing pending) — for a poll timeout."""
        if self._first_ms is None:
            return None
        return max(0.0, self._first_ms + self.linger_ms - now_ms)

    def committed(self, now_ms: float) -> None:
        self.pending = 0
        self._first_ms = None
