"""Where a consumer group's committed offsets live: the backend seam of `GroupCoordinator`.

- `DbOffsets` (the local log): table `consumers.offsets` of the service database.
- `BackendOffsets` (a backend that keeps group offsets itself, `tributary.log.open_group_offsets`:
  on Kafka its own group offsets, so `kafka-consumer-groups --describe --group G` shows them and a
  Kafka consumer can go on from them). Each commit is also noted in `consumers.offsets` (when, by
  whom, in which generation: what `describe` shows); the offsets read back are the backend's.

A commit is always made by the caller inside the database transaction that holds the group's row
lock (`FOR SHARE`; a rebalance takes it `FOR UPDATE`): the Kafka commit happens while that lock is
held, so a member fenced by a rebalance can never overwrite a newer commit.

`GroupView` is what the coordinator reads the log through: the log's `LogReader`
(`tributary.log.open_reader`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import psycopg
from psycopg_pool import ConnectionPool

from tributary.consumers.assign import TopicPartition
from tributary.log import GroupOffsets, LogReader

__all__ = ["WRITE_OFFSETS", "BackendOffsets", "DbOffsets", "GroupView", "OffsetStore", "listed_offsets"]


GroupView = LogReader
"""The log as the coordinator reads it."""


class OffsetStore(Protocol):
    """Committed offsets of consumer groups (the next offset each reads)."""

    def committed(self, group: str, tps: Sequence[TopicPartition]) -> dict[TopicPartition, int]:
        """The committed offsets of `tps` that have one."""
        ...

    def commit(
        self,
        cur: psycopg.Cursor[Any],
        group: str,
        member_id: str | None,
        generation: int,
        offsets: Sequence[tuple[TopicPartition, int]],
    ) -> None:
        """Write `offsets`; `cur` is the transaction holding the group's row lock."""
        ...

    def listed(self, conn: psycopg.Connection[Any], group: str | None = None) -> list[tuple[Any, ...]]:
        """(group, topic, partition, committed, committed_at, member_id, generation) of every committed
        partition (of `group`), ordered by group, topic, partition."""
        ...

    def close(self) -> None: ...


_LISTED = (
    "SELECT group_id, topic, partition, committed_offset, committed_at, member_id, generation "
    "FROM consumers.offsets {where} ORDER BY 1, 2, 3"
)
WRITE_OFFSETS = (
    "INSERT INTO consumers.offsets (group_id, topic, partition, committed_offset, member_id, generation) "
    "VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT (group_id, topic, partition) DO UPDATE SET "
    "committed_offset = excluded.committed_offset, committed_at = now(), member_id = excluded.member_id, "
    "generation = excluded.generation"
)


def listed_offsets(conn: psycopg.Connection[Any], group: str | None) -> list[tuple[Any, ...]]:
    if group is None:
        return conn.execute(_LISTED.format(where="")).fetchall()
    return conn.execute(_LISTED.format(where="WHERE group_id = %s"), (group,)).fetchall()


class DbOffsets:
    """Committed offsets in the service database (`consumers.offsets`)."""

    def __init__(self, pool: ConnectionPool[psycopg.Connection[Any]]) -> None:
        self.pool = pool

    def committed(self, group: str, tps: Sequence[TopicPartition]) -> dict[TopicPartition, int]:
        if not tps:
            return {}
        with self.pool.connection() as conn:
            rows = conn.execute(
                "SELECT topic, partition, committed_offset FROM consumers.offsets WHERE group_id = %s", (group,)
            ).fetchall()
        wanted = set(tps)
        return {(t, p): int(o) for t, p, o in rows if (t, p) in wanted}

    def commit(
        self,
        cur: psycopg.Cursor[Any],
        group: str,
        member_id: str | None,
        generation: int,
        offsets: Sequence[tuple[TopicPartition, int]],
    ) -> None:
        cur.executemany(WRITE_OFFSETS, [(group, t, p, o, member_id, generation) for (t, p), o in offsets])

    def listed(self, conn: psycopg.Connection[Any], group: str | None = None) -> list[tuple[Any, ...]]:
        return listed_offsets(conn, group)

    def close(self) -> None:
        pass


class BackendOffsets:
    """Committed offsets kept by the log's backend (`GroupOffsets`), each commit also noted in
    `consumers.offsets` (who, when, which generation) for `describe`."""

    def __init__(self, store: GroupOffsets) -> None:
        self.store = store
        self.where = store.where

    def committed(self, group: str, tps: Sequence[TopicPartition]) -> dict[TopicPartition, int]:
        return self.store.committed(group, tps)

    def commit(
        self,
        cur: psycopg.Cursor[Any],
        group: str,
        member_id: str | None,
        generation: int,
        offsets: Sequence[tuple[TopicPartition, int]],
    ) -> None:
        if not offsets:
            return
        self.store.commit(group, f"tributary {member_id or 'reset'} generation {generation}", offsets)
        # who committed when (describe shows it); the offsets themselves are read back from the backend
        cur.executemany(WRITE_OFFSETS, [(group, t, p, o, member_id, generation) for (t, p), o in offsets])

    def listed(self, conn: psycopg.Connection[Any], group: str | None = None) -> list[tuple[Any, ...]]:
        rows = listed_offsets(conn, group)
        by_group: dict[str, list[TopicPartition]] = {}
        for g, t, p, *_ in rows:
            by_group.setdefault(g, []).append((t, p))
        now = {g: self.committed(g, tps) for g, tps in by_group.items()}
        # the backend's offsets are the truth (a Kafka tool may have moved them; Kafka may have expired them)
        return [(g, t, p, now[g][(t, p)], *rest) for g, t, p, _, *rest in rows if (t, p) in now[g]]

    def close(self) -> None:
        self.store.close()
