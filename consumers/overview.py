"""What `tributary groups list | describe`, `GET /groups…` and `/metrics` show of consumer groups:
read-only queries of schema `consumers` and the offset store, joined with the log's committed ends."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import psycopg

from tributary.consumers.offsets import GroupView, OffsetStore

__all__ = ["ALIVE", "describe", "groups", "lag_rows"]

# a member is alive while its last call is within its session timeout (the database's clock)
ALIVE = "m.last_heartbeat + m.session_timeout_ms * interval '1 millisecond' >= now()"


def groups(conn: psycopg.Connection[Any], view: GroupView, store: OffsetStore) -> list[dict[str, Any]]:
    """Every group: live members, generation, total lag of its committed partitions."""
    rows = conn.execute(
        f"SELECT g.group_id, g.generation, count(m.member_id) FILTER (WHERE {ALIVE}) "
        "FROM consumers.groups g LEFT JOIN consumers.members m ON m.group_id = g.group_id "
        "GROUP BY g.group_id, g.generation ORDER BY g.group_id"
    ).fetchall()
    lag: dict[str, int] = {}
    for group, topic, p, committed, *_ in store.listed(conn):
        lag[group] = lag.get(group, 0) + max(view.bounds(topic, p)[1] - committed, 0)
    return [{"group": g, "members": n, "generation": gen, "lag": lag.get(g)} for g, gen, n in rows]


def describe(conn: psycopg.Connection[Any], view: GroupView, store: OffsetStore, group: str) -> dict[str, Any] | None:
    """Members (id, topics, assignments, last heartbeat), generation, and per topic-partition the
    committed offset, log start and end, lag, last commit, the member holding it and the last
    out-of-range reset. None when there is no such group."""
    head = conn.execute(
        "SELECT generation, layout, created_at, rebalanced_at FROM consumers.groups WHERE group_id = %s",
        (group,),
    ).fetchone()
    if head is None:
        return None
    members = conn.execute(
        f"SELECT m.member_id, m.topics, m.joined_at, m.last_heartbeat, m.session_timeout_ms, "
        f"m.auto_offset_reset, m.auto_commit, {ALIVE} FROM consumers.members m WHERE m.group_id = %s "
        "ORDER BY m.member_id",
        (group,),
    ).fetchall()
    held = conn.execute(
        "SELECT topic, partition, member_id FROM consumers.assignments WHERE group_id = %s", (group,)
    ).fetchall()
    offsets = [row[1:] for row in store.listed(conn, group)]
    resets = conn.execute(
        "SELECT topic, partition, at, position, start_offset, end_offset, action FROM consumers.out_of_range "
        "WHERE group_id = %s",
        (group,),
    ).fetchall()
    generation, layout, created_at, rebalanced_at = head
    owner = {(t, p): m for t, p, m in held}
    committed = {(t, p): (o, at, m, gen) for t, p, o, at, m, gen in offsets}
    last_reset = {
        (t, p): {"at": _iso(at), "position": pos, "start": s, "end": e, "action": a}
        for t, p, at, pos, s, e, a in resets
    }
    keys = set(owner) | set(committed) | {(t, p) for t, n in layout.items() for p in range(n)}
    partitions = []
    for t, p in sorted(keys):
        start, end = view.bounds(t, p)
        c = committed.get((t, p))
        partitions.append(
            {
                "topic": t,
                "partition": p,
                "member": owner.get((t, p)),
                "committed": c[0] if c else None,
                "start": start,
                "end": end,
                "lag": max(end - c[0], 0) if c else None,
                "last_commit": _iso(c[1]) if c else None,
                "committed_by": c[2] if c else None,
                "out_of_range": last_reset.get((t, p)),
            }
        )
    lags = [x["lag"] for x in partitions if x["lag"] is not None]
    return {
        "group": group,
        "generation": generation,
        "state": "stable" if any(m[7] for m in members) else "empty",
        "created_at": _iso(created_at),
        "rebalanced_at": _iso(rebalanced_at),
        "members": [
            {
                "member_id": m,
                "topics": list(topics),
                "assignments": [{"topic": t, "partition": p} for (t, p), o in sorted(owner.items()) if o == m],
                "joined_at": _iso(joined),
                "last_heartbeat": _iso(beat),
                "session_timeout_ms": timeout,
                "auto_offset_reset": reset,
                "auto_commit": auto,
                "alive": alive,
            }
            for m, topics, joined, beat, timeout, reset, auto, alive in members
        ],
        "partitions": partitions,
        "lag": sum(lags) if lags else None,
    }


def lag_rows(
    conn: psycopg.Connection[Any], view: GroupView, store: OffsetStore
) -> list[tuple[str, str, int, int, int]]:
    """(group, topic, partition, committed, end) of every committed partition (for /metrics)."""
    return [(g, t, p, o, view.bounds(t, p)[1]) for g, t, p, o, *_ in store.listed(conn)]


def _iso(at: datetime | None) -> str | None:
    return None if at is None else at.isoformat()
