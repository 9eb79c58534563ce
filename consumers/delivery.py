"""Handing out records: where each partition's delivery continues, reading the log from there, and
keeping the positions (a pull's in the database, a stream's its own) — at-least-once, in offset order
per partition, and never a silent skip past retention (`auto_offset_reset` decides, and it is
recorded).

The log is read outside any transaction; the positions a pull advances are then written by
compare-and-set, so pulls of one member never hand out the same records twice.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

import psycopg

from tributary.consumers.assign import TopicPartition
from tributary.consumers.datatypes import Batch, OffsetReset, StreamCursor
from tributary.consumers.errors import OffsetOutOfRange
from tributary.consumers.filters import EventFilter
from tributary.consumers.nacks import said_no_before, settle_commit, token
from tributary.consumers.notices import RebalanceNotices
from tributary.consumers.rebalancing import check_member
from tributary.consumers.state import GroupState

__all__ = ["Delivery"]

log = logging.getLogger(__name__)


class _Raced(Exception):
    """Another pull of the same member advanced a position this pull read from: read again."""


@dataclass(slots=True)
class _Partition:
    topic: str
    partition: int
    position: int | None  # the next offset to deliver (None: start from the committed offset)
    committed: int | None


class Delivery:
    """Fetches for the members of every group in `state`; `notices` tell streams of rebalances."""

    def __init__(self, state: GroupState, notices: RebalanceNotices) -> None:
        self.state = state
        self.notices = notices
        self._turn = 0  # rotates the partition a fetch reads first, so none starves the others

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
        self.state.view.refresh_if_older(self.state.poll_interval_s)
        version = self.state.view.version
        with self.state.tx() as cur:
            reset, auto_commit, timeout = check_member(cur, group, member_id, generation, share=False)
            cur.execute(
                "SELECT a.topic, a.partition, a.position FROM consumers.assignments a "
                "WHERE a.group_id = %s AND a.member_id = %s ORDER BY a.topic, a.partition",
                (group, member_id),
            )
            parts = [_Partition(t, p, pos, None) for t, p, pos in cur.fetchall()]
            said_no = said_no_before(cur, group)
            kept = cur.execute(
                "SELECT filter FROM consumers.members WHERE group_id = %s AND member_id = %s", (group, member_id)
            ).fetchone()
        record_filter = EventFilter.from_json(kept[0] if kept else None)
        if positions is not None:
            for p in parts:
                p.position = positions.get((p.topic, p.partition))
        # the committed offsets are needed where delivery starts anew, and to auto-commit
        need = [(p.topic, p.partition) for p in parts if auto_commit or p.position is None]
        committed_now = self.state.offsets.committed(group, need) if need else {}
        for p in parts:
            p.committed = committed_now.get((p.topic, p.partition))
        batch = Batch(
            generation,
            version=version,
            session_timeout_ms=timeout,
            assignments=[(p.topic, p.partition) for p in parts],
            auto_offset_reset=reset,
            auto_commit=auto_commit,
            record_filter=record_filter,
        )
        before = {(p.topic, p.partition): p.position for p in parts}
        for p in parts:
            self._resolve(group, p, reset, batch)
        resolved = {(p.topic, p.partition): p.position for p in parts}
        replayed = said_no.replays_for(
            token(member_id, generation),
            restarted={tp for tp, pos in before.items() if pos is None},
            held=set(resolved),
        )[:max_records]
        batch.records.extend(replayed)
        self._read(
            group,
            parts,
            reset,
            batch,
            max_records=max_records - len(replayed),
            max_bytes=max_bytes,
            stops=said_no.stops,
            keep=record_filter,
        )
        after = {(p.topic, p.partition): p.position for p in parts}
        retried = said_no.retried(batch.records[len(replayed) :])
        if positions is not None:
            positions.update({tp: pos for tp, pos in after.items() if pos is not None})
        moved = {tp: pos for tp, pos in after.items() if pos != before[tp]}
        commits = {tp: pos for tp, pos in resolved.items() if auto_commit and pos is not None}
        if moved or batch.resets or commits or replayed or retried:
            with self.state.tx() as cur:
                check_member(cur, group, member_id, generation, share=True)
                said_no.handed(cur, group, token(member_id, generation), replayed, retried)
                if positions is None and moved:
                    # before any commit (a Kafka commit is not rolled back with the transaction)
                    self._advance(cur, group, member_id, {tp: (before[tp], pos) for tp, pos in moved.items()})
                committed = {(p.topic, p.partition): p.committed for p in parts}
                due = [(tp, pos) for tp, pos in commits.items() if committed[tp] != pos]
                due = settle_commit(cur, self.state.offsets, group, member_id, generation, due)
                if due:
                    self.state.offsets.commit(cur, group, member_id, generation, due)
                self._record_resets(cur, group, member_id, batch.resets)
        return batch

    @staticmethod
    def _advance(
        cur: psycopg.Cursor[Any], group: str, member_id: str, moves: dict[TopicPartition, tuple[int | None, int | None]]
    ) -> None:
        """Move delivery positions `(from, to)` if they are still at `from`; _Raced (the transaction
        rolls back) when another pull of the member moved one first. Pulls of one member serialize on the
        member's row (`check_member` updates it first), so a concurrent one sees what this one wrote."""
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
        self.state.view.refresh_if_older(self.state.poll_interval_s)
        version = self.state.view.version
        assert cursor.assignments is not None
        parts = [_Partition(t, p, cursor.positions.get((t, p)), None) for t, p in cursor.assignments]
        for p in parts:
            start, end = self.state.view.bounds(p.topic, p.partition)
            if p.position is None or not start <= p.position <= end:
                return self._stream_check(cursor, seen, max_records=max_records, max_bytes=max_bytes)
        batch = Batch(
            cursor.generation,
            version=version,
            session_timeout_ms=cursor.session_timeout_ms,
            assignments=list(cursor.assignments),
            auto_offset_reset=cursor.auto_offset_reset,
            record_filter=cursor.record_filter,
        )
        self._read(
            cursor.group,
            parts,
            cursor.auto_offset_reset,
            batch,
            max_records=max_records,
            max_bytes=max_bytes,
            keep=cursor.record_filter,
        )
        if batch.resets:
            with self.state.tx() as cur:
                check_member(cur, cursor.group, cursor.member_id, cursor.generation, share=True)
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
        cursor.record_filter = batch.record_filter
        # an auto-committing member commits on every fetch: keep asking the database each time
        cursor.assignments = None if batch.auto_commit else batch.assignments
        return batch

    def _resolve(self, group: str, p: _Partition, reset: OffsetReset, batch: Batch) -> None:
        """Where delivery of one partition continues: its position, else the committed offset, else
        `auto_offset_reset`; a position outside the retained range follows `auto_offset_reset`."""
        start, end = self.state.view.bounds(p.topic, p.partition)
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
            self.state.view.refresh()  # another process may have read a newer manifest than ours
            start, end = self.state.view.bounds(p.topic, p.partition)
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
        self,
        group: str,
        parts: list[_Partition],
        reset: OffsetReset,
        batch: Batch,
        *,
        max_records: int,
        max_bytes: int,
        stops: dict[TopicPartition, int] | None = None,
        keep: EventFilter | None = None,
    ) -> None:
        """Read on from each partition's position; a partition waits at its offset in `stops` (a nacked
        record whose backoff is not over). Records `keep` does not match are passed over (the position
        moves past them; they count toward no budget)."""
        if not parts or max_records <= 0:
            return
        stops = stops or {}
        self._turn = turn = (self._turn + 1) % len(parts)
        budget_records, budget_bytes = max_records, max_bytes
        for p in parts[turn:] + parts[:turn]:
            if budget_records <= 0 or (budget_bytes <= 0 and batch.records):
                return
            assert p.position is not None
            start, end = self.state.view.bounds(p.topic, p.partition)
            stop = stops.get((p.topic, p.partition), end)
            stop = end if stop < p.position else stop
            if p.position >= min(end, stop):
                continue
            gaps_allowed = self.state.view.compacted(p.topic)
            it = self.state.view.read(p.topic, p.partition, p.position)
            try:
                for record in it:
                    if record.offset >= stop:
                        break  # waits for its retry
                    if record.offset != p.position and not gaps_allowed:
                        # retention removed what this read was about to deliver: not a silent skip
                        missed = _Partition(p.topic, p.partition, p.position, None)
                        self._out_of_range(group, missed, p.position, record.offset, end, reset, batch)
                        if reset == "latest":
                            p.position = end
                            break
                    p.position = record.offset + 1
                    if keep is not None and not keep.matches(record):
                        continue
                    batch.records.append(record)
                    budget_records -= 1
                    budget_bytes -= len(record.value or b"") + len(record.key or b"")
                    if budget_records <= 0 or budget_bytes <= 0:
                        break
                else:
                    if self.state.view.skips_markers and stop >= end:
                        # the read reached the end: a position at a transaction marker moves past it
                        p.position = max(p.position, end)
            finally:
                close = getattr(it, "close", None)
                if close is not None:
                    close()
