"""Committed offsets: a member's commits (checked against its generation and assignment under the
group's row lock) and an operator's resets (replay: earliest, latest, a datetime, an offset)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tributary.consumers.assign import TopicPartition
from tributary.consumers.datatypes import ResetTarget
from tributary.consumers.errors import ConsumerError, GroupBusy, NotFound
from tributary.consumers.nacks import require_held, settle_commit
from tributary.consumers.rebalancing import EXPIRE, check_member, lock_group, rebalance
from tributary.consumers.state import GroupState

__all__ = ["Commits"]


class Commits:
    """Commits and resets of every group in `state`."""

    def __init__(self, state: GroupState) -> None:
        self.state = state

    def commit(
        self, group: str, member_id: str, generation: int, offsets: Sequence[tuple[str, int, int]]
    ) -> list[tuple[str, int, int]]:
        """Commit `(topic, partition, next offset)` for partitions the member holds in `generation`;
        returns what was committed (an offset stops at a nacked record waiting for its retry).
        The generation and the assignment are checked in the same transaction as the write, under the
        group's row lock: a member fenced by a rebalance can never commit afterwards."""
        with self.state.tx() as cur:
            check_member(cur, group, member_id, generation, share=True)
            require_held(cur, group, member_id, generation, [(t, p) for t, p, _ in offsets])
            for _, _, offset in offsets:
                if offset < 0:
                    raise ConsumerError(f"offsets are never negative, got {offset}")
            # under the group's row lock (FOR SHARE): no rebalance can commit in between
            due = settle_commit(
                cur, self.state.offsets, group, member_id, generation, [((t, p), o) for t, p, o in offsets]
            )
            self.state.offsets.commit(cur, group, member_id, generation, due)
        return [(t, p, o) for (t, p), o in due]

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
        retained offset, the end, the first offset at or after a time (the log's time index), or an
        offset (clamped to the retained range). Refused while the group has live members."""
        if to == "datetime" and timestamp_ms is None:
            raise ConsumerError("a reset to a datetime needs the datetime")
        if to == "offset" and offset is None:
            raise ConsumerError("a reset to an offset needs the offset")
        self.state.view.refresh()
        out: list[dict[str, Any]] = []
        with self.state.pool.connection() as conn:
            tx = conn.transaction(force_rollback=dry_run)
            with tx, conn.cursor() as cur:
                cur.execute("INSERT INTO consumers.groups (group_id) VALUES (%s) ON CONFLICT DO NOTHING", (group,))
                generation, layout = lock_group(cur, group)
                if cur.execute(EXPIRE, (group,)).fetchall():
                    generation = rebalance(cur, self.state.view, group, generation, layout, force=True)
                live = [
                    r[0]
                    for r in cur.execute(
                        "SELECT member_id FROM consumers.members WHERE group_id = %s ORDER BY member_id", (group,)
                    ).fetchall()
                ]
                if live:
                    raise GroupBusy(
                        f"group {group!r} has {len(live)} live member(s) ({', '.join(live[:3])}"
                        f"{', …' if len(live) > 3 else ''}): stop them (or wait for their session timeout) before a reset"
                    )
                committed = {(t, p): o for _, t, p, o, *_ in self.state.offsets.listed(conn, group)}
                topics = [topic] if topic else sorted({t for t, _ in committed} | set(layout))
                if not topics:
                    raise NotFound(f"group {group!r} has consumed no topic yet: name one with --topic")
                plan: list[tuple[TopicPartition, int]] = []
                for name in topics:
                    count = self.state.view.partitions(name)
                    if count == 0:
                        raise NotFound(f"no topic {name!r} in the log")
                    for p in range(count):
                        new = self._target(name, p, to, timestamp_ms, offset)
                        plan.append(((name, p), new))
                        out.append({"topic": name, "partition": p, "previous": committed.get((name, p)), "offset": new})
                if not dry_run:  # (a Kafka commit is not rolled back with the transaction)
                    self.state.offsets.commit(cur, group, None, generation, plan)
                # nacked records waiting for a retry are dropped: the reset says where delivery starts
                cur.execute("DELETE FROM consumers.retries WHERE group_id = %s AND topic = ANY(%s)", (group, topics))
                cur.execute("DELETE FROM consumers.assignments WHERE group_id = %s", (group,))
        return out

    def _target(self, topic: str, p: int, to: ResetTarget, timestamp_ms: int | None, offset: int | None) -> int:
        start, end = self.state.view.bounds(topic, p)
        if to == "earliest":
            return start
        if to == "latest":
            return end
        if to == "datetime":
            assert timestamp_ms is not None
            return max(self.state.view.offset_for_time(topic, p, timestamp_ms), start)
        assert offset is not None
        return min(max(offset, start), end)
