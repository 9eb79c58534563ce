"""What one HTTP sink is told (built from a `[[sinks]]` table by the CLI)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = ["HttpSinkConfig"]


@dataclass(frozen=True, kw_only=True)
class HttpSinkConfig:
    """One `[[sinks]]` entry of `type = "http"`: the group `group` reads `topics` and POSTs them
    to `url` in batches (a JSON array of records)."""

    name: str
    url: str
    topics: tuple[str, ...]
    group: str
    headers: tuple[tuple[str, str], ...] = ()
    auto_offset_reset: Literal["earliest", "latest", "error"] = "earliest"
    max_batch_records: int = 500
    max_batch_bytes: int = 1_048_576
    linger_ms: int = 100
    max_attempts: int = 10
    initial_backoff_ms: int = 200
    max_backoff_ms: int = 30_000
    request_timeout_s: float = 10.0
    poll_wait_ms: int = 1_000
