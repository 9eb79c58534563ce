"""Members that can say no: a nacked record is delivered again after a backoff, a parked one is set
aside with its reason and its partition moves on, and an operator replays what was parked
(KurrentDB's persistent subscriptions: nack with retry or park, the parked-messages stream, replay).

A nack keeps the partition's order (as Kafka clients' retrying error handlers do): the member's
delivery goes back to the nacked record, which is delivered again once its backoff is over, followed
by what came after it. Its attempts are kept in `consumers.retries` until a commit passes it, and no
commit passes it before it was delivered again, so a rebalance or a restart redelivers it to whoever
holds the partition then, with its attempts. Past `max_retries` nacks it is parked instead.

A parked record goes to the group's parked topic of the log (`parked_topic.py`: the original record,
headers saying where from and why), then its park commits in `consumers.parked`, which keeps the
replay state and the copy a replay hands back: replaying hands them to the member holding the
original partition, before that partition's next records; a commit of the partition by that member
afterwards marks them `replayed` (a nack or a park parks them again). Every write happens under the
group's row lock with the member's generation checked, as a commit does; the topic is written last
in that transaction, so a park that fails to commit left at most a record the listing leaves out
(its `parked_at` matches no committed park).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import psycopg

from tributary.consumers.assign import TopicPartition
from tributary.consumers.errors import ConsumerError, NotAssigned, NotFound
from tributary.consumers.offsets import OffsetStore
from tributary.consumers.parked_topic import Park, ParkedTopic
from tributary.consumers.rebalancing import check_member
from tributary.consumers.state import GroupState
from tributary.log import Record

__all__ = [
    "MAX_RETRY_BACKOFF_MS",
    "Nacks",
    "SaidNo",
    "backoff_ms",
    "require_held",
    "said_no_before",
    "settle_commit",
    "token",
]

MAX_RETRY_BACKOFF_MS = 60_000  # the longest wait between two deliveries of a nacked record


def backoff_ms(attempts: int, base_ms: int) -> int:
    """How long a record nacked `attempts` times waits: `base_ms`, doubling per attempt, at most
    MAX_RETRY_BACKOFF_MS (a poison record costs little; a flaky dependency gets time to recover)."""
    return min(base_ms << min(max(attempts - 1, 0), 30), MAX_RETRY_BACKOFF_MS)


def token(member_id: str, generation: int) -> str:
    """Who a replayed record was handed to: a commit by that member in that generation settles it."""
    return f"{member_id}/{generation}"


def require_held(
    cur: psycopg.Cursor[Any], group: str, member_id: str, generation: int, tps: Sequence[TopicPartition]
) -> None:
    """NotAssigned unless the member holds every one of `tps` in this generation."""
    held = {
        (t, p)
        for t, p in cur.execute(
            "SELECT topic, partition FROM consumers.assignments WHERE group_id = %s AND member_id = %s",
            (group, member_id),
        ).fetchall()
    }
    foreign = sorted(set(tps) - held)
    if foreign:
        names = ", ".join(f"{t}/{p}" for t, p in foreign)
        raise NotAssigned(
            f"member {member_id} of group {group!r} does not hold {names} in generation {generation}",
            generation=generation,
        )


def settle_commit(
    cur: psycopg.Cursor[Any],
    offsets_store: OffsetStore,
    group: str,
    member_id: str | None,
    generation: int,
    offsets: Sequence[tuple[TopicPartition, int]],
) -> list[tuple[TopicPartition, int]]:
    """What a commit of `offsets` may write, and what it settles (in the commit's transaction): an
    offset stops at a nacked record not yet delivered again; the retries it passes are done; the
    replayed records handed to the member are `replayed`, and a commit that settles them never moves
    the committed offset back (a replayed record lies behind it)."""
    if not offsets:
        return []
    rows = cur.execute(
        'SELECT topic, partition, min("offset") FROM consumers.retries WHERE group_id = %s AND NOT redelivered '
        "GROUP BY topic, partition",
        (group,),
    ).fetchall()
    waiting = {(t, p): int(o) for t, p, o in rows}
    out = [(tp, min(o, waiting.get(tp, o))) for tp, o in offsets]
    cur.executemany(
        'DELETE FROM consumers.retries WHERE group_id = %s AND topic = %s AND partition = %s AND "offset" < %s',
        [(group, t, p, o) for (t, p), o in out],
    )
    if member_id is None:
        return out
    settled = {
        (t, p)
        for t, p in cur.execute(
            "UPDATE consumers.parked SET state = 'replayed', replayed_at = now(), handed_to = NULL "
            "WHERE group_id = %s AND state = 'replaying' AND handed_to = %s "
            "AND (topic, partition) IN (SELECT * FROM unnest(%s::text[], %s::integer[])) RETURNING topic, partition",
            (group, token(member_id, generation), [t for (t, _), _ in out], [p for (_, p), _ in out]),
        ).fetchall()
    }
    if not settled:
        return out
    now = offsets_store.committed(group, sorted(settled))
    return [(tp, max(o, now.get(tp, o))) for tp, o in out]


@dataclass(slots=True)
class SaidNo:
    """What a fetch must know of a group's nacks and replays: where partitions wait for a retry,
    the nacked records whose redelivery is to be noted, the replayed records being handed back."""

    stops: dict[TopicPartition, int] = field(default_factory=dict)
    pending: set[tuple[str, int, int]] = field(default_factory=set)
    replays: list[tuple[Record, str | None]] = field(default_factory=list)

    def replays_for(self, me: str, *, restarted: set[TopicPartition], held: set[TopicPartition]) -> list[Record]:
        """The replayed records of `held` partitions this member's delivery has not handed out yet
        (all of them again where its delivery restarted: a re-join, a rebalance)."""
        return [
            r
            for r, to in self.replays
            if (r.topic, r.partition) in held and (to != me or (r.topic, r.partition) in restarted)
        ]

    def retried(self, records: Sequence[Record]) -> list[tuple[str, int, int]]:
        """Of `records`, the nacked ones (now delivered again)."""
        return [(r.topic, r.partition, r.offset) for r in records if (r.topic, r.partition, r.offset) in self.pending]

    @staticmethod
    def handed(
        cur: psycopg.Cursor[Any],
        group: str,
        me: str,
        replayed: Sequence[Record],
        retried: Sequence[tuple[str, int, int]],
    ) -> None:
        """Note what this fetch handed out: replays to `me`, nacked records delivered again."""
        cur.executemany(
            "UPDATE consumers.parked SET handed_to = %s WHERE group_id = %s AND topic = %s AND partition = %s "
            "AND \"offset\" = %s AND state = 'replaying'",
            [(me, group, r.topic, r.partition, r.offset) for r in replayed],
        )
        cur.executemany(
            "UPDATE consumers.retries SET redelivered = true WHERE group_id = %s AND topic = %s AND partition = %s "
            'AND "offset" = %s',
            [(group, t, p, o) for t, p, o in retried],
        )


def said_no_before(cur: psycopg.Cursor[Any], group: str) -> SaidNo:
    """The group's nacked records waiting for a retry and its records being replayed."""
    out = SaidNo()
    for t, p, o, waiting in cur.execute(
        'SELECT topic, partition, "offset", retry_at > now() FROM consumers.retries '
        "WHERE group_id = %s AND NOT redelivered",
        (group,),
    ).fetchall():
        out.pending.add((t, p, int(o)))
        if waiting:
            out.stops[(t, p)] = min(int(o), out.stops.get((t, p), int(o)))
    for t, p, o, ts, key, value, headers, to in cur.execute(
        'SELECT topic, partition, "offset", timestamp_ms, key, value, headers, handed_to FROM consumers.parked '
        "WHERE group_id = %s AND state = 'replaying' ORDER BY topic, partition, \"offset\"",
        (group,),
    ).fetchall():
        out.replays.append((Record(t, p, o, ts, _bytes(key), _bytes(value), _bytes(headers)), to))
    return out


_PARK = (
    'INSERT INTO consumers.parked AS x (group_id, topic, partition, "offset", timestamp_ms, key, value, headers, '
    "reason, attempts, parked_by) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s) "
    "ON CONFLICT (group_id, topic, partition, \"offset\") DO UPDATE SET state = 'parked', reason = excluded.reason, "
    "attempts = greatest(x.attempts, excluded.attempts), parked_at = now(), parked_by = excluded.parked_by, "
    "handed_to = NULL RETURNING attempts, parked_at"
)


class Nacks:
    """nack, park, the parked records and their replay, for every group in `state`; members that
    name none retry `max_retries` times, `retry_backoff_ms` apart at first."""

    def __init__(self, state: GroupState, topic: ParkedTopic, *, max_retries: int, retry_backoff_ms: int) -> None:
        self.state = state
        self.topic = topic
        self.max_retries = max_retries
        self.retry_backoff_ms = retry_backoff_ms

    def nack(
        self, group: str, member_id: str, generation: int, records: Sequence[tuple[str, int, int]], reason: str | None
    ) -> list[dict[str, Any]]:
        """Deliver `records` (topic, partition, offset) again after their backoff, their partition
        rewound to the earliest; a record nacked more than the member's `max_retries` is parked."""
        self._require_holder(group, member_id, generation, records)
        copies = self._copies(records)
        out: list[dict[str, Any]] = []
        with self.state.tx() as cur:
            check_member(cur, group, member_id, generation, share=True)
            require_held(cur, group, member_id, generation, [(t, p) for t, p, _ in records])
            limit, base = cur.execute(
                "SELECT coalesce(max_retries, %s), coalesce(retry_backoff_ms, %s) FROM consumers.members "
                "WHERE group_id = %s AND member_id = %s",
                (self.max_retries, self.retry_backoff_ms, group, member_id),
            ).fetchone() or (self.max_retries, self.retry_backoff_ms)
            parks: list[Park] = []
            for rec in copies:
                if again := self._reparked(cur, group, rec, reason or "nacked after a replay", member_id):
                    parks.append(again)
                    out.append(_answer(rec, "parked", None))
                    continue
                (attempts,) = cur.execute(
                    'INSERT INTO consumers.retries AS r (group_id, topic, partition, "offset", attempts, retry_at, '
                    "reason) VALUES (%s, %s, %s, %s, 1, now(), %s) ON CONFLICT (group_id, topic, partition, "
                    '"offset") DO UPDATE SET attempts = r.attempts + 1, reason = excluded.reason RETURNING attempts',
                    (group, rec.topic, rec.partition, rec.offset, reason),
                ).fetchone() or (1,)
                if attempts > limit:
                    why = f"nacked {attempts} times (max_retries {limit})" + (f": {reason}" if reason else "")
                    parks.append(self._park(cur, group, rec, why, attempts, member_id))
                    out.append(_answer(rec, "parked", attempts))
                    continue
                wait = backoff_ms(attempts, base)
                cur.execute(
                    "UPDATE consumers.retries SET retry_at = now() + make_interval(secs => %s), redelivered = false "
                    'WHERE group_id = %s AND topic = %s AND partition = %s AND "offset" = %s',
                    (wait / 1000, group, rec.topic, rec.partition, rec.offset),
                )
                # delivery goes back to it (a position not yet set starts at the committed offset anyway)
                cur.execute(
                    "UPDATE consumers.assignments SET position = %s WHERE group_id = %s AND topic = %s "
                    "AND partition = %s AND position > %s",
                    (rec.offset, group, rec.topic, rec.partition, rec.offset),
                )
                out.append({**_answer(rec, "retry", attempts), "retry_in_ms": wait})
            self.topic.append(group, parks)  # last: a failure here rolls the parks back
        return out

    def park(
        self, group: str, member_id: str, generation: int, records: Sequence[tuple[str, int, int]], reason: str
    ) -> list[dict[str, Any]]:
        """Set `records` aside in the group's parked records with `reason`: their partition moves on."""
        self._require_holder(group, member_id, generation, records)
        copies = self._copies(records)
        with self.state.tx() as cur:
            check_member(cur, group, member_id, generation, share=True)
            require_held(cur, group, member_id, generation, [(t, p) for t, p, _ in records])
            parks: list[Park] = []
            for rec in copies:
                if again := self._reparked(cur, group, rec, reason, member_id):
                    parks.append(again)
                    continue
                row = cur.execute(
                    'DELETE FROM consumers.retries WHERE group_id = %s AND topic = %s AND partition = %s AND "offset" = %s '
                    "RETURNING attempts",
                    (group, rec.topic, rec.partition, rec.offset),
                ).fetchone()
                parks.append(self._park(cur, group, rec, reason, row[0] if row else 0, member_id))
            self.topic.append(group, parks)  # last: a failure here rolls the parks back
        return [_answer(rec, "parked", None) for rec in copies]

    def parked(self, group: str, *, state: str | None = None, limit: int = 1000) -> list[dict[str, Any]]:
        """The group's parked records (oldest first), with the original record and why, and their
        replay state: the parks the database committed (a park whose commit failed after its topic
        record was written is not one; a record parked again shows its latest park). The parked
        topic holds the same records for consumers; this listing reads the database's copy, so it
        is one indexed query whatever the topic's length, and parks from before the topic existed
        are listed too."""
        with self.state.pool.connection() as conn:
            if conn.execute("SELECT 1 FROM consumers.groups WHERE group_id = %s", (group,)).fetchone() is None:
                raise NotFound(f"no group {group!r}")
            rows = conn.execute(
                'SELECT topic, partition, "offset", timestamp_ms, key, value, headers, reason, attempts, parked_at, '
                "parked_by, state, replays, replayed_at FROM consumers.parked WHERE group_id = %s "
                'AND (%s::text IS NULL OR state = %s) ORDER BY parked_at, topic, partition, "offset" LIMIT %s',
                (group, state, state, limit),
            ).fetchall()
        return [_parked_row(r) for r in rows]

    def replay(self, group: str, *, topic: str | None = None) -> int:
        """Hand the group's parked records (of `topic`, or all) back to it: each goes to the member
        holding its partition, before that partition's next records. Returns how many."""
        with self.state.tx() as cur:
            if cur.execute("SELECT 1 FROM consumers.groups WHERE group_id = %s", (group,)).fetchone() is None:
                raise NotFound(f"no group {group!r}")
            done = cur.execute(
                "UPDATE consumers.parked SET state = 'replaying', replays = replays + 1, handed_to = NULL "
                "WHERE group_id = %s AND state = 'parked' AND (%s::text IS NULL OR topic = %s) RETURNING 1",
                (group, topic, topic),
            ).fetchall()
        return len(done)

    def _require_holder(
        self, group: str, member_id: str, generation: int, records: Sequence[tuple[str, int, int]]
    ) -> None:
        """The member's checks before the log is read: a stranger, a fenced member or a partition the
        member does not hold is told so (409), whatever the offsets name (checked again when writing)."""
        with self.state.tx() as cur:
            check_member(cur, group, member_id, generation, share=True)
            require_held(cur, group, member_id, generation, [(t, p) for t, p, _ in records])

    def _copies(self, records: Sequence[tuple[str, int, int]]) -> list[Record]:
        """Each record as the log holds it (read outside any transaction)."""
        if not records:
            raise ConsumerError("name at least one record (topic, partition, offset)")
        self.state.view.refresh_if_older(self.state.poll_interval_s)
        out = []
        for topic, partition, offset in records:
            with _reading(self.state.view.read(topic, partition, offset)) as it:
                found = next(iter(it), None)
            if found is None or found.offset != offset:
                raise NotFound(f"no record at offset {offset} of {topic}/{partition} in the log")
            out.append(found)
        return out

    @staticmethod
    def _reparked(cur: psycopg.Cursor[Any], group: str, rec: Record, reason: str, member_id: str) -> Park | None:
        """A replayed record said no to again: parked again (not retried: its partition moved on)."""
        again = cur.execute(
            "UPDATE consumers.parked SET state = 'parked', reason = %s, attempts = attempts + 1, parked_at = now(), "
            "parked_by = %s, handed_to = NULL WHERE group_id = %s AND topic = %s AND partition = %s "
            "AND \"offset\" = %s AND state = 'replaying' RETURNING attempts, parked_at",
            (reason, member_id, group, rec.topic, rec.partition, rec.offset),
        ).fetchone()
        if again is None:
            return None
        return Park(rec, uuid.uuid4().hex, reason, again[0], again[1], member_id)

    @staticmethod
    def _park(cur: psycopg.Cursor[Any], group: str, rec: Record, reason: str, attempts: int, member_id: str) -> Park:
        """Park `rec` in the database (its retry done); what the parked topic gets for it."""
        row = cur.execute(
            _PARK,
            (
                group,
                rec.topic,
                rec.partition,
                rec.offset,
                rec.timestamp,
                rec.key,
                rec.value,
                rec.headers,
                reason,
                attempts,
                member_id,
            ),
        ).fetchone()
        assert row is not None  # an upsert returns its row
        kept, parked_at = row
        cur.execute(
            'DELETE FROM consumers.retries WHERE group_id = %s AND topic = %s AND partition = %s AND "offset" = %s',
            (group, rec.topic, rec.partition, rec.offset),
        )
        return Park(rec, uuid.uuid4().hex, reason, kept, parked_at, member_id)


@contextmanager
def _reading(it: Iterator[Record]) -> Iterator[Iterator[Record]]:
    """A log read, closed when done with (a read stopped early holds a segment or a consumer)."""
    try:
        yield it
    finally:
        close = getattr(it, "close", None)
        if close is not None:
            close()


def _answer(rec: Record, action: str, attempts: int | None) -> dict[str, Any]:
    return {
        "topic": rec.topic,
        "partition": rec.partition,
        "offset": rec.offset,
        "action": action,
        "attempts": attempts,
    }


def _parked_row(r: tuple[Any, ...]) -> dict[str, Any]:
    topic, partition, offset, ts, key, value, headers, reason, attempts, parked_at, by, state, replays, replayed_at = r
    return {
        "record": Record(topic, partition, offset, ts, _bytes(key), _bytes(value), _bytes(headers)),
        "reason": reason,
        "attempts": attempts,
        "parked_at": parked_at,
        "parked_by": by,
        "state": state,
        "replays": replays,
        "replayed_at": replayed_at,
    }


def _bytes(v: Any) -> bytes | None:
    return None if v is None else bytes(v)
