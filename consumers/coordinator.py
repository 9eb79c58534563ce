"""The group coordinator: the whole server side of consumer groups behind one object, usable
in-process (the HTTP routes, the CLI and the sinks call it).

Everything a group is lives in the service database (schema `consumers`, migration 0003), so a group
survives a restart of any process, and several server processes (`serve --workers N`, a sink in its own
process) coordinate through it. Times are the database's `now()`, one clock for every process. Each job
has its module: `membership` (join, heartbeat, leave, sweep), `rebalancing` (the group's row: locking,
fencing, dividing the partitions), `delivery` (fetches and streams), `commits` (commits and resets),
`overview` (what list, describe and /metrics show).

Thread-safe: each call takes its own pooled connection. The log is read outside any transaction.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg_pool import ConnectionPool

from tributary.consumers import overview
from tributary.consumers.commits import Commits
from tributary.consumers.datatypes import (
    OFFSET_RESETS,
    Batch,
    Heartbeat,
    Membership,
    OffsetReset,
    ResetTarget,
    StreamCursor,
)
from tributary.consumers.delivery import Delivery
from tributary.consumers.filters import EventFilter
from tributary.consumers.membership import Members
from tributary.consumers.nacks import Nacks
from tributary.consumers.notices import RebalanceNotices
from tributary.consumers.offsets import BackendOffsets, DbOffsets, GroupView, OffsetStore
from tributary.consumers.parked_topic import ParkedTopic
from tributary.consumers.state import GroupState
from tributary.log import open_group_offsets, open_reader

if TYPE_CHECKING:
    from tributary.log import KafkaOptions

__all__ = [
    "OFFSET_RESETS",
    "Batch",
    "GroupCoordinator",
    "Heartbeat",
    "Membership",
    "OffsetReset",
    "ResetTarget",
    "StreamCursor",
]


class GroupCoordinator:
    """Consumer groups over the service database `dsn` and the log at `log_root` — or, with `kafka`
    (`[log] backend = "kafka"`), over that Kafka cluster, committed offsets in Kafka's group offsets
    (docs/kafka.md). `capture_sources`: the configured sources' names, whose topics no group's
    parked topic may take."""

    def __init__(
        self,
        dsn: str,
        log_root: Path,
        *,
        session_timeout_ms: int = 10_000,
        auto_offset_reset: OffsetReset = "latest",
        poll_interval_ms: int = 20,
        max_connections: int = 8,
        kafka: KafkaOptions | None = None,
        max_retries: int = 5,
        retry_backoff_ms: int = 1000,
        capture_sources: Sequence[str] = (),
    ) -> None:
        self.session_timeout_ms = session_timeout_ms
        self.auto_offset_reset: OffsetReset = auto_offset_reset
        poll_interval_s = poll_interval_ms / 1000
        self.pool: ConnectionPool[psycopg.Connection[Any]] = ConnectionPool(
            dsn, min_size=1, max_size=max_connections, timeout=10, open=True, kwargs={"autocommit": True}
        )
        self.view: GroupView
        self.offsets: OffsetStore
        self.view = open_reader(root=log_root, kafka=kafka)
        kept = open_group_offsets(kafka=kafka)
        self.offsets = DbOffsets(self.pool) if kept is None else BackendOffsets(kept)
        if self.view.root is None:
            poll_interval_s = max(poll_interval_s, 0.05)  # nothing to watch: each refresh asks the backend
        self.poll_interval_s = poll_interval_s
        self.notices = RebalanceNotices(dsn)  # started by the first stream
        self.state = GroupState(self.pool, self.view, self.offsets, poll_interval_s)
        self.members = Members(
            self.state,
            session_timeout_ms=session_timeout_ms,
            auto_offset_reset=auto_offset_reset,
            capture_sources=capture_sources,
        )
        self.delivery = Delivery(self.state, self.notices)
        self.commits = Commits(self.state)
        self.nacks = Nacks(
            self.state, ParkedTopic(log_root, kafka), max_retries=max_retries, retry_backoff_ms=retry_backoff_ms
        )

    def close(self) -> None:
        self.nacks.topic.close()
        self.notices.close()
        self.offsets.close()
        self.pool.close()
        self.view.close()

    def __enter__(self) -> GroupCoordinator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- membership (tributary.consumers.membership) --------------------------------------------

    def join(
        self,
        group: str,
        topics: Sequence[str],
        *,
        member_id: str | None = None,
        session_timeout_ms: int | None = None,
        auto_offset_reset: OffsetReset | None = None,
        auto_commit: bool = False,
        max_retries: int | None = None,
        retry_backoff_ms: int | None = None,
        event_types: Sequence[str] | None = None,
        stream_prefix: str | None = None,
    ) -> Membership:
        """Join, or re-join with the same `member_id` (no rebalance unless the subscription changed;
        its delivery restarts at the committed offsets). A new member, a changed subscription or
        expired members start a rebalance: a new generation. `max_retries` and `retry_backoff_ms`:
        the member's nack policy (None: the coordinator's). `event_types` and `stream_prefix` filter
        event topics on the server (`EventFilter`): the member's position passes the others."""
        return self.members.join(
            group,
            topics,
            member_id=member_id,
            session_timeout_ms=session_timeout_ms,
            auto_offset_reset=auto_offset_reset,
            auto_commit=auto_commit,
            max_retries=max_retries,
            retry_backoff_ms=retry_backoff_ms,
            record_filter=EventFilter.for_topics(topics, event_types, stream_prefix),
        )

    def heartbeat(self, group: str, member_id: str, generation: int) -> Heartbeat:
        """Keep the member alive; the answer carries the current generation and assignments
        (`rebalance` when they are newer than `generation`). UnknownMember after a leave or a
        session timeout: join again."""
        return self.members.heartbeat(group, member_id, generation)

    def leave(self, group: str, member_id: str) -> None:
        """Leave the group: its partitions move to the other members at once (idempotent)."""
        self.members.leave(group, member_id)

    def sweep(self) -> list[str]:
        """Rebalance every group with members past their session timeout, or whose topics gained
        partitions. Returns the groups rebalanced."""
        return self.members.sweep()

    # -- delivery (tributary.consumers.delivery) --------------------------------------------------

    def fetch(
        self,
        group: str,
        member_id: str,
        generation: int,
        *,
        max_records: int = 500,
        max_bytes: int = 1 << 20,
        positions: dict[tuple[str, int], int] | None = None,
    ) -> Batch:
        """The next records of the member's partitions, without waiting (`Delivery.fetch`)."""
        return self.delivery.fetch(
            group, member_id, generation, max_records=max_records, max_bytes=max_bytes, positions=positions
        )

    def stream_fetch(self, cursor: StreamCursor, *, max_records: int = 500, max_bytes: int = 1 << 20) -> Batch:
        """A stream's next records, checked against the database only when it must
        (`Delivery.stream_fetch`)."""
        return self.delivery.stream_fetch(cursor, max_records=max_records, max_bytes=max_bytes)

    # -- committed offsets (tributary.consumers.commits) -----------------------------------------

    def commit(
        self, group: str, member_id: str, generation: int, offsets: Sequence[tuple[str, int, int]]
    ) -> list[tuple[str, int, int]]:
        """Commit `(topic, partition, next offset)` for partitions the member holds in `generation`;
        a member fenced by a rebalance can never commit afterwards. Returns what was committed: an
        offset stops at a nacked record that was not delivered again yet."""
        return self.commits.commit(group, member_id, generation, offsets)

    def reset(
        self,
        group: str,
        to: ResetTarget,
        *,
        timestamp_ms: int | None = None,
        offset: int | None = None,
        topic: str | None = None,
        dry_run: bool = False,
    ) -> list[dict[str, Any]]:
        """Set the group's committed offsets (every topic it consumed, or `topic`) to the earliest
        retained offset, the end, a time, or an offset. Refused while the group has live members."""
        return self.commits.reset(group, to, timestamp_ms=timestamp_ms, offset=offset, topic=topic, dry_run=dry_run)

    # -- saying no (tributary.consumers.nacks) ---------------------------------------------------

    def nack(
        self,
        group: str,
        member_id: str,
        generation: int,
        records: Sequence[tuple[str, int, int]],
        *,
        reason: str | None = None,
    ) -> list[dict[str, Any]]:
        """Deliver `(topic, partition, offset)` records again after a backoff (their partition waits
        at the earliest); past the member's `max_retries` a record is parked (`Nacks.nack`)."""
        return self.nacks.nack(group, member_id, generation, records, reason)

    def park(
        self, group: str, member_id: str, generation: int, records: Sequence[tuple[str, int, int]], *, reason: str
    ) -> list[dict[str, Any]]:
        """Set records aside in the group's parked records: their partition moves on (`Nacks.park`)."""
        return self.nacks.park(group, member_id, generation, records, reason)

    def parked(self, group: str, *, state: str | None = None, limit: int = 1000) -> list[dict[str, Any]]:
        """The group's parked records, oldest first: `record` (a Record), `reason`, `attempts`,
        `parked_at`, `parked_by`, `state` (parked, replaying, replayed), `replays`, `replayed_at`."""
        return self.nacks.parked(group, state=state, limit=limit)

    def replay_parked(self, group: str, *, topic: str | None = None) -> int:
        """Hand the group's parked records back to it (`Nacks.replay`); how many."""
        return self.nacks.replay(group, topic=topic)

    # -- inspecting (tributary.consumers.overview) ------------------------------------------------

    def groups(self) -> list[dict[str, Any]]:
        """Every group: live members, generation, total lag of its committed partitions."""
        self.view.refresh_if_older(self.poll_interval_s)
        with self.pool.connection() as conn:
            return overview.groups(conn, self.view, self.offsets)

    def describe(self, group: str) -> dict[str, Any] | None:
        """Members (id, topics, assignments, last heartbeat), generation, and per topic-partition the
        committed offset, log start and end, lag, last commit, the member holding it and the last
        out-of-range reset. None when there is no such group."""
        self.view.refresh_if_older(self.poll_interval_s)
        with self.pool.connection() as conn:
            return overview.describe(conn, self.view, self.offsets, group)

    def lag_rows(self) -> list[tuple[str, str, int, int, int]]:
        """(group, topic, partition, committed, end) of every committed partition (for /metrics)."""
        self.view.refresh_if_older(self.poll_interval_s)
        with self.pool.connection() as conn:
            return overview.lag_rows(conn, self.view, self.offsets)
