"""Who is in a group: joining, heartbeats, leaving, and moving the partitions of silent members
(each change of membership rebalances the group: a new generation)."""

from __future__ import annotations

import uuid
from collections.abc import Sequence

from psycopg.types.json import Jsonb

from tributary.consumers.datatypes import Heartbeat, Membership, OffsetReset
from tributary.consumers.errors import ConsumerError, UnknownMember
from tributary.consumers.filters import EventFilter
from tributary.consumers.overview import ALIVE
from tributary.consumers.parked_topic import check_name
from tributary.consumers.rebalancing import (
    EXPIRE,
    assigned,
    grown,
    lock_group,
    lock_group_if_exists,
    rebalance,
    unknown_member,
)
from tributary.consumers.state import GroupState

__all__ = ["Members"]


class Members:
    """Membership of every group in `state`; members join with `session_timeout_ms` and
    `auto_offset_reset` unless they name their own. `capture_sources`: the configured sources,
    whose topics' names no group's parked topic may take."""

    def __init__(
        self,
        state: GroupState,
        *,
        session_timeout_ms: int,
        auto_offset_reset: OffsetReset,
        capture_sources: Sequence[str] = (),
    ) -> None:
        self.state = state
        self.capture_sources = tuple(capture_sources)
        self.session_timeout_ms = session_timeout_ms
        self.auto_offset_reset: OffsetReset = auto_offset_reset

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
        record_filter: EventFilter | None = None,
    ) -> Membership:
        """Join, or re-join with the same `member_id` (no rebalance unless the subscription changed;
        its delivery restarts at the committed offsets). A new member, a changed subscription or
        expired members start a rebalance: a new generation. `max_retries` and `retry_backoff_ms`
        are the member's nack policy (None: the coordinator's); `record_filter` its server-side filter."""
        if not topics:
            raise ConsumerError("a member must subscribe to at least one topic")
        timeout = session_timeout_ms or self.session_timeout_ms
        reset = auto_offset_reset or self.auto_offset_reset
        member_id = member_id or f"member-{uuid.uuid4().hex[:16]}"
        wanted = sorted(set(topics))
        kept = None if record_filter is None else Jsonb(record_filter.to_json())
        view = self.state.view
        view.refresh_if_older(self.state.poll_interval_s)
        check_name(group, view, self.capture_sources)  # before the group exists: a refused one never does
        with self.state.tx() as cur:
            cur.execute("INSERT INTO consumers.groups (group_id) VALUES (%s) ON CONFLICT DO NOTHING", (group,))
            generation, layout = lock_group(cur, group)
            changed = bool(cur.execute(EXPIRE, (group,)).fetchall())
            cur.execute(
                "SELECT topics FROM consumers.members WHERE group_id = %s AND member_id = %s", (group, member_id)
            )
            row = cur.fetchone()
            if row is None:
                cur.execute(
                    "INSERT INTO consumers.members (group_id, member_id, topics, session_timeout_ms, "
                    "auto_offset_reset, auto_commit, max_retries, retry_backoff_ms, filter) "
                    "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)",
                    (group, member_id, wanted, timeout, reset, auto_commit, max_retries, retry_backoff_ms, kept),
                )
                changed = True
            else:
                cur.execute(
                    "UPDATE consumers.members SET topics = %s, session_timeout_ms = %s, auto_offset_reset = %s, "
                    "auto_commit = %s, max_retries = %s, retry_backoff_ms = %s, filter = %s, last_heartbeat = now() "
                    "WHERE group_id = %s AND member_id = %s",
                    (wanted, timeout, reset, auto_commit, max_retries, retry_backoff_ms, kept, group, member_id),
                )
                changed |= sorted(row[0]) != wanted
                # a re-join means the member lost track (its restart, a lost response): delivery starts
                # again at the committed offsets, so nothing handed out but not processed is skipped
                cur.execute(
                    "UPDATE consumers.assignments SET position = NULL WHERE group_id = %s AND member_id = %s",
                    (group, member_id),
                )
            generation = rebalance(cur, view, group, generation, layout, force=changed)
            mine = assigned(cur, group, member_id)
        return Membership(member_id, generation, mine, timeout, max(timeout // 3, 1))

    def heartbeat(self, group: str, member_id: str, generation: int) -> Heartbeat:
        """Keep the member alive; the answer carries the current generation and assignments
        (`rebalance` when they are newer than `generation`). UnknownMember after a leave or a
        session timeout: join again."""
        view = self.state.view
        view.refresh_if_older(self.state.poll_interval_s)
        with self.state.tx() as cur:
            locked = lock_group_if_exists(cur, group)
            if locked is None:
                raise UnknownMember(f"no group {group!r}: join it", generation=0)
            current, layout = locked
            expired = cur.execute(EXPIRE, (group,)).fetchall()
            alive = cur.execute(
                "UPDATE consumers.members SET last_heartbeat = now() WHERE group_id = %s AND member_id = %s "
                "RETURNING session_timeout_ms",
                (group, member_id),
            ).fetchone()
            current = rebalance(cur, view, group, current, layout, force=bool(expired))
            mine = assigned(cur, group, member_id) if alive else []
        if not alive:
            raise UnknownMember(unknown_member(group, member_id), generation=current)
        return Heartbeat(current, mine, rebalance=current != generation, session_timeout_ms=alive[0])

    def leave(self, group: str, member_id: str) -> None:
        """Leave the group: its partitions move to the other members at once (idempotent)."""
        with self.state.tx() as cur:
            locked = lock_group_if_exists(cur, group)
            if locked is None:
                return
            gone = cur.execute(
                "DELETE FROM consumers.members WHERE group_id = %s AND member_id = %s RETURNING 1", (group, member_id)
            ).fetchone()
            if gone:
                rebalance(cur, self.state.view, group, locked[0], locked[1], force=True)

    def sweep(self) -> list[str]:
        """Rebalance every group with members past their session timeout, or whose topics gained
        partitions (a topic created after members subscribed to it). Returns the groups rebalanced."""
        view = self.state.view
        view.refresh_if_older(self.state.poll_interval_s)
        with self.state.pool.connection() as conn:
            expired = conn.execute(
                f"SELECT DISTINCT m.group_id FROM consumers.members m WHERE NOT ({ALIVE})"
            ).fetchall()
            layouts = conn.execute(
                "SELECT g.group_id, g.layout, array_agg(DISTINCT t) FROM consumers.groups g "
                "JOIN consumers.members m ON m.group_id = g.group_id, unnest(m.topics) t GROUP BY g.group_id"
            ).fetchall()
        due = {r[0] for r in expired}
        for group, layout, topics in layouts:
            if grown(layout, {t: view.partitions(t) for t in topics}):
                due.add(group)
        done = []
        for group in sorted(due):
            with self.state.tx() as cur:
                locked = lock_group_if_exists(cur, group)
                if locked is None:
                    continue
                expired_now = cur.execute(EXPIRE, (group,)).fetchall()
                if rebalance(cur, view, group, locked[0], locked[1], force=bool(expired_now)) != locked[0]:
                    done.append(group)
        return done
