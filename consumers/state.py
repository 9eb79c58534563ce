"""Where a consumer group's state lives, shared by the coordinator's parts: the service database
(schema `consumers`, one pooled connection per call), the log as the groups read it, and the store of
committed offsets (the database's, or Kafka's on `[log] backend = "kafka"`)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg_pool import ConnectionPool

from tributary.consumers.offsets import GroupView, OffsetStore

__all__ = ["GroupState"]


@dataclass(slots=True)
class GroupState:
    pool: ConnectionPool[psycopg.Connection[Any]]
    view: GroupView
    offsets: OffsetStore
    poll_interval_s: float  # how old the log view may be before a call re-reads it

    @contextmanager
    def tx(self) -> Iterator[psycopg.Cursor[Any]]:
        """A cursor in a transaction of its own (committed when the block ends)."""
        with self.pool.connection() as conn, conn.transaction(), conn.cursor() as cur:
            yield cur
