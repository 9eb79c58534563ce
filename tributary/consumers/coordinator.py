"""The group coordinator: members, generations, assignments, delivery positions and committed offsets.

Everything a group is lives in the service database (schema `consumers`, migration 0003), so a group
survives a restart of any process, several server processes (`serve --workers N`, a sink in its own
process) coordinate through it, and fencing is a row lock: a rebalance holds the group's row
`FOR UPDATE` while it bumps the generation, a commit holds it `FOR SHARE` while it checks the
generation and writes the offsets — one transaction, so a stale member can never commit after the
rebalance that fenced it. Times are the database's `now()`, one clock for every process.

Thread-safe: each call takes its own pooled connection. The log is read outside any transaction.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import psycopg
from psycopg.types.json import Jsonb
from psycopg_pool import ConnectionPool

from tributary.capture.log import Record
from tributary.consumers import overview
from tributary.consumers.assign import TopicPartition, assign
from tributary.consumers.errors import (
    ConsumerError,
    Fenced,
    GroupBusy,
    NotAssigned,
    NotFound,
    OffsetOutOfRange,
    UnknownMember,
)
from tributary.consumers.logview import LogView
from tributary.consumers.notices import CHANNEL, RebalanceNotices
from tributary.consumers.offsets import DbOffsets, GroupView, OffsetStore

if TYPE_CHECKING:
    from tributary.capture.kafka_options import KafkaOptions

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

log = logging.getLogger(__name__)

OffsetReset = Literal["earliest", "latest", "error"]
OFFSET_RESETS: tuple[OffsetReset, ...] = ("earliest", "latest", "error")
ResetTarget = Literal["earliest", "latest", "datetime", "offset"]

_ALIVE = overview.ALIVE
_EXPIRE = (
    "DELETE FROM consumers.members m WHERE m.group_id = %s "
    "AND m.last_heartbeat + m.session_timeout_ms * interval '1 millisecond' < now() RETURNING m.member_id"
)


@dataclass(frozen=True, slots=True)
class Membership:
    """What a join answers: the member's id, the group's generation and the member's partitions."""

    member_id: str
    generation: int
    assignments: list[TopicPartition]
    session_timeout_ms: int
    heartbeat_interval_ms: int


@dataclass(frozen=True, slots=True)
class Heartbeat:
    generation: int
    assignments: list[TopicPartition]
    rebalance: bool
    session_timeout_ms: int = 10_000


@dataclass(slots=True)
class Batch:
    """Records of one fetch, in offset order per partition; `version` is the log view's version the
    fetch read (wait for a newer one before fetching again when it came back empty)."""

    generation: int
    records: list[Record] = field(default_factory=list)
    version: int = 0
    resets: list[dict[str, Any]] = field(default_factory=list)
    session_timeout_ms: int = 10_000  # the member's: a waiting caller calls again well within it
    assignments: list[TopicPartition] = field(default_factory=list)
    auto_offset_reset: OffsetReset = "latest"
    auto_commit: bool = False


@dataclass(slots=True)
class StreamCursor:
    """Where one stream of a member stands (`GroupCoordinator.stream_fetch` reads and updates it): its
    generation, its delivery positions, and what the last check against the database answered."""

    group: str
    member_id: str
    generation: int
    positions: dict[TopicPartition, int] = field(default_factory=dict)
    assignments: list[TopicPartition] | None = None  # None: not checked yet
    auto_offset_reset: OffsetReset = "latest"
    session_timeout_ms: int = 10_000
    checked_at: float = 0.0  # time.monotonic() of the last check
    notices: tuple[int, int] = (-1, -1)  # RebalanceNotices.seen(group) before the last check
    checks: int = 0  # how many batches asked the database (for tests and diagnostics)


class _Raced(Exception):
    """Another pull of the same member advanced a position this pull read from: read again."""


@dataclass(slots=True)
class _Partition:
    topic: str
    partition: int
    position: int | None  # the next offset to deliver (None: start from the committed offset)
    committed: int | None


class GroupCoordinator:
    """Consumer groups over the service database `dsn` and the log at `log_root` — or, with `kafka`
    (`[log] backend = "kafka"`), over that Kafka cluster, committed offsets in Kafka's group offsets
    (docs/kafka.md)."""

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
    ) -> None:
        self.session_timeout_ms = session_timeout_ms
        self.auto_offset_reset: OffsetReset = auto_offset_reset
        self.poll_interval_s = poll_interval_ms / 1000
        self.pool: ConnectionPool[psycopg.Connection[Any]] = ConnectionPool(
            dsn, min_size=1, max_size=max_connections, timeout=10, open=True, kwargs={"autocommit": True}
        )
        self.view: GroupView
        self.offsets: OffsetStore
        if kafka is None:
            self.view, self.offsets = LogView(log_root), DbOffsets(self.pool)
        else:
            from tributary.consumers.kafkaview import KafkaOffsets, KafkaView

            self.view, self.offsets = KafkaView(kafka), KafkaOffsets(kafka)
            self.poll_interval_s = max(self.poll_interval_s, 0.05)  # each refresh asks the cluster
        self._turn = 0  # rotates the partition a fetch reads first, so none starves the others
        self.notices = RebalanceNotices(dsn)  # started by the first stream

    def close(self) -> None:
        self.notices.close()
        self.offsets.close()
        self.pool.close()
        self.view.close()

    def __enter__(self) -> GroupCoordinator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def _tx(self) -> Iterator[psycopg.Cursor[Any]]:
        with self.pool.connection() as conn, conn.transaction(), conn.cursor() as cur:
            yield cur

    # -- membership ---------------------------------------------------------------------------

    def join(
        self,
        group: str,
        topics: Sequence[str],
        *,
        member_id: str | None = None,
        session_timeout_ms: int | None = None,
        auto_offset_reset: OffsetReset | None = None,
        auto_commit: bool = False,
    ) -> Membership:
        """Join, or re-join with the same `member_id` (no rebalance unless the subscription changed;
        its delivery restarts at the committed offsets). A new member, a changed subscription or
        expired members start a rebalance: a new generation."""
        if not topics:
            raise ConsumerError("a member must subscribe to at least one topic")
        timeout = session_timeout_ms or self.session_timeout_ms
        reset = auto_offset_reset or self.auto_offset_reset
        member_id = member_id or f"member-{uuid.uuid4().hex[:16]}"
        wanted = sorted(set(topics))
        self.view.refresh_if_older(self.poll_interval_s)
        with self._tx() as cur:
            cur.execute("INSERT INTO consumers.groups (group_id) VALUES (%s) ON CONFLICT DO NOTHING", (group,))
            generation, layout = self._lock(cur, group)
            changed = bool(cur.execute(_EXPIRE, (group,)).fetchall())
            cur.execute(
                "SELECT topics FROM consumers.members WHERE group_id = %s AND member_id = %s", (group, member_id)
            )
            row = cur.fetchone()
            if row is None:
                cur.execute(
                    "INSERT INTO consumers.members (group_id, member_id, topics, session_timeout_ms, "
                    "auto_offset_reset, auto_commit) VALUES (%s, %s, %s, %s, %s, %s)",
                    (group, member_id, wanted, timeout, reset, auto_commit),
                )
                changed = True
            else:
                cur.execute(
                    "UPDATE consumers.members SET topics = %s, session_timeout_ms = %s, auto_offset_reset = %s, "
                    "auto_commit = %s, last_heartbeat = now() WHERE group_id = %s AND member_id = %s",
                    (wanted, timeout, reset, auto_commit, group, member_id),
                )
                changed |= sorted(row[0]) != wanted
                # a re-join means the member lost track (its restart, a lost response): delivery starts
                # again at the committed offsets, so nothing handed out but not processed is skipped
                cur.execute(
                    "UPDATE consumers.assignments SET position = NULL WHERE group_id = %s AND member_id = %s",
                    (group, member_id),
                )
            generation = self._rebalance(cur, group, generation, layout, force=changed)
            mine = self._assigned(cur, group, member_id)
        return Membership(member_id, generation, mine, timeout, max(timeout // 3, 1))

    def heartbeat(self, group: str, member_id: str, generation: int) -> Heartbeat:
        """Keep the member alive; the answer carries the current generation and assignments
        (`rebalance` when they are newer than `generation`). UnknownMember after a leave or a
        session timeout: join again."""
        self.view.refresh_if_older(self.poll_interval_s)
        with self._tx() as cur:
            locked = self._lock_if_exists(cur, group)
            if locked is None:
                raise UnknownMember(f"no group {group!r}: join it", generation=0)
            current, layout = locked
            expired = cur.execute(_EXPIRE, (group,)).fetchall()
            alive = cur.execute(
                "UPDATE consumers.members SET last_heartbeat = now() WHERE group_id = %s AND member_id = %s "
                "RETURNING session_timeout_ms",
                (group, member_id),
            ).fetchone()
            current = self._rebalance(cur, group, current, layout, force=bool(expired))
            mine = self._assigned(cur, group, member_id) if alive else []
        if not alive:
            raise UnknownMember(_unknown(group, member_id), generation=current)
        return Heartbeat(current, mine, rebalance=current != generation, session_timeout_ms=alive[0])

    def leave(self, group: str, member_id: str) -> None:
        """Leave the group: its partitions move to the other members at once (idempotent)."""
        with self._tx() as cur:
            locked = self._lock_if_exists(cur, group)
            if locked is None:
                return
            gone = cur.execute(
                "DELETE FROM consumers.members WHERE group_id = %s AND member_id = %s RETURNING 1", (group, member_id)
            ).fetchone()
            if gone:
                self._rebalance(cur, group, locked[0], locked[1], force=True)

    def sweep(self) -> list[str]:
        """Rebalance every group with members past their session timeout, or whose topics gained
        partitions (a topic created after members subscribed to it). Returns the groups rebalanced."""
        self.view.refresh_if_older(self.poll_interval_s)
        with self.pool.connection() as conn:
            expired = conn.execute(
                f"SELECT DISTINCT m.group_id FROM consumers.members m WHERE NOT ({_ALIVE})"
            ).fetchall()
            layouts = conn.execute(
                "SELECT g.group_id, g.layout, array_agg(DISTINCT t) FROM consumers.groups g "
                "JOIN consumers.members m ON m.group_id = g.group_id, unnest(m.topics) t GROUP BY g.group_id"
            ).fetchall()
        due = {r[0] for r in expired}
        for group, layout, topics in layouts:
            if self._grown(layout, {t: self.view.partitions(t) for t in topics}):
                due.add(group)
        done = []
        for group in sorted(due):
            with self._tx() as cur:
                locked = self._lock_if_exists(cur, group)
                if locked is None:
                    continue
                expired_now = cur.execute(_EXPIRE, (group,)).fetchall()
                if self._rebalance(cur, group, locked[0], locked[1], force=bool(expired_now)) != locked[0]:
                    done.append(group)
        return done

    # -- delivery -----------------------------------------------------------------------------

    def fetch(
        self,
        group: str,
        member_id: str,
        generation: int,
        *,
        max_records: int = 500,
        max_bytes: int = 1 << 20,
        positions: dict[TopicPartition, int] | None = None,
    ) -> Batch:
        """The next records of the member's partitions (at most `max_records`, about `max_bytes` of
        keys and values, at least one record when there is any), without waiting.

        Delivery positions start at the committed offset (or per `auto_offset_reset`) and advance as
        records are returned; they are kept in the database unless the caller keeps its own
        (`positions`, a stream's: read and updated in place). A position behind the log's retention
        follows `auto_offset_reset` and is recorded as a reset (`resets`, `describe`, the server log);
        `error` raises OffsetOutOfRange instead.

        Pulls of one member never hand out the same records twice, even at the same time and from
        several processes: the positions a pull advances are written only if they are still the ones
        it started from (compare-and-set under the rows' locks); a pull that lost that race to another
        one reads again from where the other one ended."""
        while True:
            try:
                return self._fetch_once(
                    group, member_id, generation, max_records=max_records, max_bytes=max_bytes, positions=positions
                )
            except _Raced:
                continue  # another pull of this member took these records first (it moved the position)

    def _fetch_once(
        self,
        group: str,
        member_id: str,
        generation: int,
        *,
        max_records: int,
        max_bytes: int,
        positions: dict[TopicPartition, int] | None,
    ) -> Batch:
        self.view.refresh_if_older(self.poll_interval_s)
        version = self.view.version
        with self._tx() as cur:
            reset, auto_commit, timeout = self._check_member(cur, group, member_id, generation, share=False)
            cur.execute(
                "SELECT a.topic, a.partition, a.position FROM consumers.assignments a "
                "WHERE a.group_id = %s AND a.member_id = %s ORDER BY a.topic, a.partition",
                (group, member_id),
            )
            parts = [_Partition(t, p, pos, None) for t, p, pos in cur.fetchall()]
        if positions is not None:
            for p in parts:
                p.position = positions.get((p.topic, p.partition))
        # the committed offsets are needed where delivery starts anew, and to auto-commit
        need = [(p.topic, p.partition) for p in parts if auto_commit or p.position is None]
        committed_now = self.offsets.committed(group, need) if need else {}
        for p in parts:
            p.committed = committed_now.get((p.topic, p.partition))
        batch = Batch(
            generation,
            version=version,
            session_timeout_ms=timeout,
            assignments=[(p.topic, p.partition) for p in parts],
            auto_offset_reset=reset,
            auto_commit=auto_commit,
        )
        before = {(p.topic, p.partition): p.position for p in parts}
        for p in parts:
            self._resolve(group, p, reset, batch)
        resolved = {(p.topic, p.partition): p.position for p in parts}
        self._read(group, parts, reset, batch, max_records=max_records, max_bytes=max_bytes)
        after = {(p.topic, p.partition): p.position for p in parts}
        if positions is not None:
            positions.update({tp: pos for tp, pos in after.items() if pos is not None})
        moved = {tp: pos for tp, pos in after.items() if pos != before[tp]}
        commits = {tp: pos for tp, pos in resolved.items() if auto_commit and pos is not None}
        if moved or batch.resets or commits:
            with self._tx() as cur:
                self._check_member(cur, group, member_id, generation, share=True)
                if positions is None and moved:
                    # before any commit (a Kafka commit is not rolled back with the transaction)
                    self._advance(cur, group, member_id, {tp: (before[tp], pos) for tp, pos in moved.items()})
                committed = {(p.topic, p.partition): p.committed for p in parts}
                due = [(tp, pos) for tp, pos in commits.items() if committed[tp] != pos]
                if due:
                    self.offsets.commit(cur, group, member_id, generation, due)
                self._record_resets(cur, group, member_id, batch.resets)
        return batch

    @staticmethod
    def _advance(
        cur: psycopg.Cursor[Any], group: str, member_id: str, moves: dict[TopicPartition, tuple[int | None, int | None]]
    ) -> None:
        """Move delivery positions `(from, to)` if they are still at `from`; _Raced (the transaction
        rolls back) when another pull of the member moved one first. Pulls of one member serialize on the
        member's row (`_check_member` updates it first), so a concurrent one sees what this one wrote."""
        keys = sorted(moves)
        updated = cur.execute(
            "UPDATE consumers.assignments a SET position = u.new FROM unnest(%s::text[], %s::integer[], "
            "%s::bigint[], %s::bigint[]) AS u(topic, partition, old, new) WHERE a.group_id = %s AND "
            "a.member_id = %s AND a.topic = u.topic AND a.partition = u.partition "
            "AND a.position IS NOT DISTINCT FROM u.old RETURNING 1",
            (
                [t for t, _ in keys],
                [p for _, p in keys],
                [moves[k][0] for k in keys],
                [moves[k][1] for k in keys],
                group,
                member_id,
            ),
        ).fetchall()
        if len(updated) != len(keys):
            raise _Raced

    def _record_resets(
        self, cur: psycopg.Cursor[Any], group: str, member_id: str, resets: list[dict[str, Any]]
    ) -> None:
        for r in resets:
            cur.execute(
                "INSERT INTO consumers.out_of_range AS x (group_id, topic, partition, position, start_offset, "
                "end_offset, action, member_id) VALUES (%s, %s, %s, %s, %s, %s, %s, %s) "
                "ON CONFLICT (group_id, topic, partition) DO UPDATE SET at = now(), position = "
                "excluded.position, start_offset = excluded.start_offset, end_offset = excluded.end_offset, "
                "action = excluded.action, member_id = excluded.member_id",
                (
                    group,
                    r["topic"],
                    r["partition"],
                    r["position"],
                    r["start"],
                    r["end"],
                    r["action"],
                    member_id,
                ),
            )

    def stream_fetch(self, cursor: StreamCursor, *, max_records: int = 500, max_bytes: int = 1 << 20) -> Batch:
        """A stream's next records, like `fetch` with the stream's own positions, but without a database
        round trip per batch: the member's generation and assignments are checked against the database
        (which also counts as its heartbeat) on the first call, at least every quarter of its session
        timeout (at most a second), as soon as a rebalance of its group is announced (`RebalanceNotices`),
        whenever a position is not inside the retained offsets, and every time while no announcement can
        be received or the member auto-commits. Between checks a rebalance can be noticed up to one
        announcement late: records of a partition that just moved away may then be delivered to both
        members (at-least-once; a stale member's commit is still refused by `commit`)."""
        self.notices.start()
        seen = self.notices.seen(cursor.group)
        if self._stale(cursor, seen):
            return self._stream_check(cursor, seen, max_records=max_records, max_bytes=max_bytes)
        self.view.refresh_if_older(self.poll_interval_s)
        version = self.view.version
        assert cursor.assignments is not None
        parts = [_Partition(t, p, cursor.positions.get((t, p)), None) for t, p in cursor.assignments]
        for p in parts:
            start, end = self.view.bounds(p.topic, p.partition)
            if p.position is None or not start <= p.position <= end:
                return self._stream_check(cursor, seen, max_records=max_records, max_bytes=max_bytes)
        batch = Batch(
            cursor.generation,
            version=version,
            session_timeout_ms=cursor.session_timeout_ms,
            assignments=list(cursor.assignments),
            auto_offset_reset=cursor.auto_offset_reset,
        )
        self._read(cursor.group, parts, cursor.auto_offset_reset, batch, max_records=max_records, max_bytes=max_bytes)
        if batch.resets:
            with self._tx() as cur:
                self._check_member(cur, cursor.group, cursor.member_id, cursor.generation, share=True)
                self._record_resets(cur, cursor.group, cursor.member_id, batch.resets)
        cursor.positions.update({(p.topic, p.partition): p.position for p in parts if p.position is not None})
        return batch

    def _stale(self, cursor: StreamCursor, seen: tuple[int, int]) -> bool:
        if cursor.assignments is None or seen[0] < 0 or seen != cursor.notices:
            return True
        return time.monotonic() - cursor.checked_at >= min(1.0, cursor.session_timeout_ms / 4000)

    def _stream_check(self, cursor: StreamCursor, seen: tuple[int, int], *, max_records: int, max_bytes: int) -> Batch:
        checked_at = time.monotonic()
        batch = self.fetch(
            cursor.group,
            cursor.member_id,
            cursor.generation,
            max_records=max_records,
            max_bytes=max_bytes,
            positions=cursor.positions,
        )
        cursor.checks += 1
        cursor.checked_at = checked_at
        cursor.notices = seen
        cursor.session_timeout_ms = batch.session_timeout_ms
        cursor.auto_offset_reset = batch.auto_offset_reset
        # an auto-committing member commits on every fetch: keep asking the database each time
        cursor.assignments = None if batch.auto_commit else batch.assignments
        return batch

    def _resolve(self, group: str, p: _Partition, reset: OffsetReset, batch: Batch) -> None:
        """Where delivery of one partition continues: its position, else the committed offset, else
        `auto_offset_reset`; a position outside the retained range follows `auto_offset_reset`."""
        start, end = self.view.bounds(p.topic, p.partition)
        pos = p.position if p.position is not None else p.committed
        if pos is None:
            if reset == "error":
                raise OffsetOutOfRange(
                    f"group {group!r} has no committed offset for {p.topic}/{p.partition} and its "
                    "auto_offset_reset is 'error': reset the group (tributary groups reset) or join with another",
                    topic=p.topic,
                    partition=p.partition,
                    position=-1,
                    start=start,
                )
            p.position = start if reset == "earliest" else end
            return
        if pos > end:
            self.view.refresh()  # another process may have read a newer manifest than ours
            start, end = self.view.bounds(p.topic, p.partition)
        if start <= pos <= end:
            p.position = pos
            return
        self._out_of_range(group, p, pos, start, end, reset, batch)

    def _out_of_range(
        self, group: str, p: _Partition, pos: int, start: int, end: int, reset: OffsetReset, batch: Batch
    ) -> None:
        where = f"{p.topic}/{p.partition}"
        if reset == "error":
            raise OffsetOutOfRange(
                f"group {group!r} is at offset {pos} of {where}, outside the log's retained offsets "
                f"{start}..{end}: reset the group (tributary groups reset) or join with auto_offset_reset "
                "earliest or latest",
                topic=p.topic,
                partition=p.partition,
                position=pos,
                start=start,
            )
        p.position = start if reset == "earliest" else end
        log.warning(
            "consumer group %s: offset %d of %s is outside the retained offsets %d..%d; "
            "auto_offset_reset=%s moves it to %d (offsets %d..%d were not delivered)",
            group,
            pos,
            where,
            start,
            end,
            reset,
            p.position,
            pos,
            p.position - 1,
        )
        batch.resets.append(
            {"topic": p.topic, "partition": p.partition, "position": pos, "start": start, "end": end, "action": reset}
        )

    def _read(
        self, group: str, parts: list[_Partition], reset: OffsetReset, batch: Batch, *, max_records: int, max_bytes: int
    ) -> None:
        if not parts:
            return
        self._turn = turn = (self._turn + 1) % len(parts)
        budget_records, budget_bytes = max_records, max_bytes
        for p in parts[turn:] + parts[:turn]:
            if budget_records <= 0 or (budget_bytes <= 0 and batch.records):
                return
            assert p.position is not None
            start, end = self.view.bounds(p.topic, p.partition)
            if p.position >= end:
                continue
            gaps_allowed = self.view.compacted(p.topic)
            it = self.view.read(p.topic, p.partition, p.position)
            try:
                for record in it:
                    if record.offset != p.position and not gaps_allowed:
                        # retention removed what this read was about to deliver: not a silent skip
                        missed = _Partition(p.topic, p.partition, p.position, None)
                        self._out_of_range(group, missed, p.position, record.offset, end, reset, batch)
                        if reset == "latest":
                            p.position = end
                            break
                    batch.records.append(record)
                    p.position = record.offset + 1
                    budget_records -= 1
                    budget_bytes -= len(record.value or b"") + len(record.key or b"")
                    if budget_records <= 0 or budget_bytes <= 0:
                        break
                else:
                    if getattr(self.view, "skips_markers", False):
                        # the read reached the end: a position at a transaction marker moves past it
                        p.position = max(p.position, end)
            finally:
                close = getattr(it, "close", None)
                if close is not None:
                    close()

    def commit(self, group: str, member_id: str, generation: int, offsets: Sequence[tuple[str, int, int]]) -> None:
        """Commit `(topic, partition, next offset)` for partitions the member holds in `generation`.
        The generation and the assignment are checked in the same transaction as the write, under the
        group's row lock: a member fenced by a rebalance can never commit afterwards."""
        with self._tx() as cur:
            self._check_member(cur, group, member_id, generation, share=True)
            held = {
                (t, p)
                for t, p in cur.execute(
                    "SELECT topic, partition FROM consumers.assignments WHERE group_id = %s AND member_id = %s",
                    (group, member_id),
                ).fetchall()
            }
            foreign = sorted({(t, p) for t, p, _ in offsets} - held)
            if foreign:
                names = ", ".join(f"{t}/{p}" for t, p in foreign)
                raise NotAssigned(
                    f"member {member_id} of group {group!r} does not hold {names} in generation {generation}",
                    generation=generation,
                )
            for _, _, offset in offsets:
                if offset < 0:
                    raise ConsumerError(f"offsets are never negative, got {offset}")
            # under the group's row lock (FOR SHARE): no rebalance can commit in between
            self.offsets.commit(cur, group, member_id, generation, [((t, p), o) for t, p, o in offsets])

    # -- replay -------------------------------------------------------------------------------

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
        self.view.refresh()
        out: list[dict[str, Any]] = []
        with self.pool.connection() as conn:
            tx = conn.transaction(force_rollback=dry_run)
            with tx, conn.cursor() as cur:
                cur.execute("INSERT INTO consumers.groups (group_id) VALUES (%s) ON CONFLICT DO NOTHING", (group,))
                generation, layout = self._lock(cur, group)
                if cur.execute(_EXPIRE, (group,)).fetchall():
                    generation = self._rebalance(cur, group, generation, layout, force=True)
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
                committed = {(t, p): o for _, t, p, o, *_ in self.offsets.listed(conn, group)}
                topics = [topic] if topic else sorted({t for t, _ in committed} | set(layout))
                if not topics:
                    raise NotFound(f"group {group!r} has consumed no topic yet: name one with --topic")
                plan: list[tuple[TopicPartition, int]] = []
                for name in topics:
                    count = self.view.partitions(name)
                    if count == 0:
                        raise NotFound(f"no topic {name!r} in the log")
                    for p in range(count):
                        new = self._target(name, p, to, timestamp_ms, offset)
                        plan.append(((name, p), new))
                        out.append({"topic": name, "partition": p, "previous": committed.get((name, p)), "offset": new})
                if not dry_run:  # (a Kafka commit is not rolled back with the transaction)
                    self.offsets.commit(cur, group, None, generation, plan)
                cur.execute("DELETE FROM consumers.assignments WHERE group_id = %s", (group,))
        return out

    def _target(self, topic: str, p: int, to: ResetTarget, timestamp_ms: int | None, offset: int | None) -> int:
        start, end = self.view.bounds(topic, p)
        if to == "earliest":
            return start
        if to == "latest":
            return end
        if to == "datetime":
            assert timestamp_ms is not None
            return max(self.view.offset_for_time(topic, p, timestamp_ms), start)
        assert offset is not None
        return min(max(offset, start), end)

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

    # -- the group's row, rebalancing -----------------------------------------------------------

    def _lock(self, cur: psycopg.Cursor[Any], group: str) -> tuple[int, dict[str, int]]:
        locked = self._lock_if_exists(cur, group)
        assert locked is not None
        return locked

    def _lock_if_exists(self, cur: psycopg.Cursor[Any], group: str) -> tuple[int, dict[str, int]] | None:
        row = cur.execute(
            "SELECT generation, layout FROM consumers.groups WHERE group_id = %s FOR UPDATE", (group,)
        ).fetchone()
        return None if row is None else (int(row[0]), dict(row[1]))

    def _check_member(
        self, cur: psycopg.Cursor[Any], group: str, member_id: str, generation: int, *, share: bool
    ) -> tuple[OffsetReset, bool, int]:
        """The member is alive and `generation` is current (its heartbeat refreshed); with `share`,
        the group's row stays locked against a rebalance until the transaction ends."""
        row = cur.execute(
            f"SELECT g.generation, m.member_id, {_ALIVE}, m.auto_offset_reset, m.auto_commit, m.session_timeout_ms "
            "FROM consumers.groups g LEFT JOIN consumers.members m ON m.group_id = g.group_id AND m.member_id = %s "
            "WHERE g.group_id = %s" + (" FOR SHARE OF g" if share else ""),
            (member_id, group),
        ).fetchone()
        if row is None:
            raise UnknownMember(f"no group {group!r}: join it", generation=0)
        current, known, alive, reset, auto_commit, timeout = row
        if known is None or not alive:
            raise UnknownMember(_unknown(group, member_id), generation=current)
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

    @staticmethod
    def _grown(layout: dict[str, int], now: dict[str, int]) -> bool:
        """The log holds more partitions of the group's topics than its assignment knows. Counts only
        grow: a process whose view of the log is a moment older never shrinks an assignment."""
        return now != layout and all(now.get(t, 0) >= n for t, n in layout.items() if t in now)

    def _rebalance(
        self, cur: psycopg.Cursor[Any], group: str, generation: int, layout: dict[str, int], *, force: bool
    ) -> int:
        """Divide the partitions anew (group row locked) when forced or when the log's partitions of
        the subscribed topics grew; returns the generation now current."""
        cur.execute("SELECT member_id, topics FROM consumers.members WHERE group_id = %s ORDER BY member_id", (group,))
        subscriptions = {m: list(t) for m, t in cur.fetchall()}
        counts = {t: self.view.partitions(t) for ts in subscriptions.values() for t in ts}
        counts = {t: max(n, layout.get(t, 0)) for t, n in counts.items()}
        if not force and not self._grown(layout, counts):
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

    def _assigned(self, cur: psycopg.Cursor[Any], group: str, member_id: str) -> list[TopicPartition]:
        return [
            (t, p)
            for t, p in cur.execute(
                "SELECT topic, partition FROM consumers.assignments WHERE group_id = %s AND member_id = %s "
                "ORDER BY topic, partition",
                (group, member_id),
            ).fetchall()
        ]


def _unknown(group: str, member_id: str) -> str:
    return f"member {member_id} is not in group {group!r} (it left or missed its session timeout): join again"
