"""Batches of records: at most `max_records` records or `max_bytes` bytes, sent at the latest
`linger_ms` after their first record arrived (Kafka's `linger.ms`). Pure: time is passed in.

Records keep their arrival order inside and across batches, and batches leave one at a time, so a
key's records (one key, one partition, offset order) reach the receiver in order."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

__all__ = ["Batch", "Batcher"]

T = TypeVar("T")


@dataclass(frozen=True)
class Batch(Generic[T]):
    items: tuple[T, ...]
    nbytes: int


@dataclass
class Batcher(Generic[T]):
    max_records: int
    max_bytes: int
    linger_ms: int
    _items: list[T] = field(default_factory=list)
    _sizes: list[int] = field(default_factory=list)
    _nbytes: int = 0
    _first_at_ms: float | None = None

    def __post_init__(self) -> None:
        if self.max_records < 1 or self.max_bytes < 1 or self.linger_ms < 0:
            raise ValueError("max_records and max_bytes must be ≥ 1, linger_ms ≥ 0")

    def __len__(self) -> int:
        return len(self._items)

    def add(self, items: Sequence[tuple[T, int]], now_ms: float) -> list[Batch[T]]:
        """Add (item, encoded size) pairs; return the batches they filled (full ones leave at once).
        A single item larger than `max_bytes` travels alone."""
        full: list[Batch[T]] = []
        for item, size in items:
            if self._items and (len(self._items) >= self.max_records or self._nbytes + size > self.max_bytes):
                full.append(self._cut())
            if not self._items:
                self._first_at_ms = now_ms
            self._items.append(item)
            self._sizes.append(size)
            self._nbytes += size
            if len(self._items) >= self.max_records or self._nbytes >= self.max_bytes:
                full.append(self._cut())
        return full

    def due(self, now_ms: float) -> bool:
        """True when the pending batch has lingered long enough."""
        return self._first_at_ms is not None and now_ms - self._first_at_ms >= self.linger_ms

    def wait_ms(self, now_ms: float, idle_ms: int) -> int:
        """How long a caller may wait for more records: the rest of the linger, else `idle_ms`."""
        if self._first_at_ms is None:
            return idle_ms
        return max(0, int(self._first_at_ms + self.linger_ms - now_ms))

    def take(self) -> Batch[T] | None:
        """The pending batch (however small), or None when empty."""
        return self._cut() if self._items else None

    def _cut(self) -> Batch[T]:
        batch = Batch(tuple(self._items), self._nbytes)
        self._items, self._sizes, self._nbytes, self._first_at_ms = [], [], 0, None
        return batch
