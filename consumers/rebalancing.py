"""The group's row in the database, which every change of a group goes through: locking it, checking a
member against it, and rebalancing under it.

Fencing is that row's lock: a rebalance holds it `FOR UPDATE` while it bumps the generation, a commit
holds it `FOR SHARE` while it checks the generation and writes the offsets — one transaction, so a
stale member can never commit after the rebalance that fenced it. Every rebalance also sends
`NOTIFY tributary_consumers, '<group>'` (delivered when it commits; `RebalanceNotices`).
"""

from __future__ import annotations

import logging
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from tributary.consumers.assign import TopicPartition, assign
from tributary.consumers.datatypes import OffsetReset
from tributary.consumers.errors import Fenced, UnknownMember
from tributary.consumers.notices import CHANNEL
from tributary.consumers.offsets import GroupView
from tributary.consumers.overview import ALIVE

__all__ = [
    "EXPIRE",
    "assigned",
    "check_member",
    "grown",
    "lock_group",
    "lock_group_if_exists",
    "rebalance",
    "unknown_member",
]

log = logging.getLogger(__name__)

# removes the group's members past their session timeout (the database's clock); returns their ids
EXPIRE = (
    "DELETE FROM consumers.members m WHERE m.group_id = %s "
    "AND m.last_heartbeat + m.session_timeout_ms * interval '1 millisecond' < now() RETURNING m.member_id"
)


def lock_group(cur: psycopg.Cursor[Any], group: str) -> tuple[int, dict[str, int]]:
    """Lock the group's row (which must exist) against other changes; its (generation, layout)."""
    locked = lock_group_if_exists(cur, group)
    assert locked is not None
    return locked


def lock_group_if_exists(cur: psycopg.Cursor[Any], group: str) -> tuple[int, dict[str, int]] | None:
    row = cur.execute(
        "SELECT generation, layout FROM consumers.groups WHERE group_id = %s FOR UPDATE", (group,)
    ).fetchone()
    return None if row is None else (int(row[0]), dict(row[1]))


def check_member(
    cur: psycopg.Cursor[Any], group: str, member_id: str, generation: int, *, share: bool
) -> tuple[OffsetReset, bool, int]:
    """The member is alive and `generation` is current (its heartbeat refreshed); with `share`,
    the group's row stays locked against a rebalance until the transaction ends. Returns the member's
    (auto_offset_reset, auto_commit, session_timeout_ms)."""
    row = cur.execute(
        f"SELECT g.generation, m.member_id, {ALIVE}, m.auto_offset_reset, m.auto_commit, m.session_timeout_ms "
        "FROM consumers.groups g LEFT JOIN consumers.members m ON m.group_id = g.group_id AND m.member_id = %s "
        "WHERE g.group_id = %s" + (" FOR SHARE OF g" if share else ""),
        (member_id, group),
    ).fetchone()
    if row is None:
        raise UnknownMember(f"no group {group!r}: join it", generation=0)
    current, known, alive, reset, auto_commit, timeout = row
    if known is None or not alive:
        raise UnknownMember(unknown_member(group, member_id), generation=current)
    if current != generation:
        raise Fenced(
            f"generation {generation} of group {group!r} is over (now {current}): heartbeat or join again",
            generation=current,
        )
    cur.execute(
        "UPDATE consumers.members SET last_heartbeat = now() WHERE group_id = %s AND member_id = %s",
        (group, member_id),
    )
    return reset, bool(auto_commit), int(timeout)


def grown(layout: dict[str, int], now: dict[str, int]) -> bool:
    """The log holds more partitions of the group's topics than its assignment knows. Counts only
    grow: a process whose view of the log is a moment older never shrinks an assignment."""
    return now != layout and all(now.get(t, 0) >= n for t, n in layout.items() if t in now)


def rebalance(
    cur: psycopg.Cursor[Any], view: GroupView, group: str, generation: int, layout: dict[str, int], *, force: bool
) -> int:
    """Divide the partitions anew (group row locked) when forced or when the log's partitions of
    the subscribed topics grew; returns the generation now current."""
    cur.execute("SELECT member_id, topics FROM consumers.members WHERE group_id = %s ORDER BY member_id", (group,))
    subscriptions = {m: list(t) for m, t in cur.fetchall()}
    counts = {t: view.partitions(t) for ts in subscriptions.values() for t in ts}
    counts = {t: max(n, layout.get(t, 0)) for t, n in counts.items()}
    if not force and not grown(layout, counts):
        return generation
    plan = assign(subscriptions, counts)
    old = {
        (t, p): (m, pos)
        for t, p, m, pos in cur.execute(
            "SELECT topic, partition, member_id, position FROM consumers.assignments WHERE group_id = %s",
            (group,),
        ).fetchall()
    }
    generation += 1
    cur.execute("DELETE FROM consumers.assignments WHERE group_id = %s", (group,))
    rows = []
    for member, tps in plan.items():
        for t, p in tps:
            was = old.get((t, p))
            # a partition that stays with its member keeps its delivery position
            rows.append((group, t, p, member, generation, was[1] if was and was[0] == member else None))
    if rows:
        cur.executemany(
            "INSERT INTO consumers.assignments (group_id, topic, partition, member_id, generation, position) "
            "VALUES (%s, %s, %s, %s, %s, %s)",
            rows,
        )
    cur.execute(
        "UPDATE consumers.groups SET generation = %s, layout = %s, rebalanced_at = now() WHERE group_id = %s",
        # with no member left, the layout stays the last generation's: the topics a reset applies to
        (generation, Jsonb(counts if subscriptions else layout), group),
    )
    cur.execute("SELECT pg_notify(%s, %s)", (CHANNEL, group))  # delivered when the rebalance commits
    log.info("consumer group %s: generation %d, %d member(s)", group, generation, len(plan))
    return generation


def assigned(cur: psycopg.Cursor[Any], group: str, member_id: str) -> list[TopicPartition]:
    """The member's partitions in the current generation, in (topic, partition) order."""
    return [
        (t, p)
        for t, p in cur.execute(
            "SELECT topic, partition FROM consumers.assignments WHERE group_id = %s AND member_id = %s "
            "ORDER BY topic, partition",
            (group, member_id),
        ).fetchall()
    ]


def unknown_member(group: str, member_id: str) -> str:
    return f"member {member_id} is not in group {group!r} (it left or missed its session timeout): join again"
