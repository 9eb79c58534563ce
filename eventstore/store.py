"""The event store on PostgreSQL (schema `eventstore`, created by the Alembic migrations).

Concurrency by constraint: UNIQUE (stream_id, version) decides who wins; the
loser's UniqueViolation is translated once into `ConcurrencyConflict` with the actual version.
No table lock and no NOTIFY per append: `$all` readers stay gap-free through each event's
transaction id (see `read_all`), and the log's commit order comes from capture. The SQL is
composed once from the tables in `schema.py` (`statements.py`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from types import TracebackType
from typing import Any, Literal

import orjson
import psycopg
from psycopg.types.json import Jsonb
from psycopg_pool import ConnectionPool

from tributary.eventstore.errors import (
    ConcurrencyConflict,
    IdempotencyMismatch,
    InvalidValue,
    MetadataConflict,
    PartialDuplicateBatch,
    StoreUnavailable,
    StreamDeleted,
    StreamNotFound,
    UnknownPosition,
)
from tributary.eventstore.keys import DatabaseKeys, KeyStore, reveal_events, reveal_events_keyed
from tributary.eventstore.model import AppendResult, ExpectedVersion, NewEvent, RecordedEvent, dumps, response_json
from tributary.eventstore.personal import KeyId
from tributary.eventstore.statements import (
    BY_IDS,
    CMD_GET,
    CMD_PUT,
    CURRENT,
    DELETE_STREAM,
    EMIT_DELETED,
    INSERT_MANY,
    INSERT_ONE,
    KEEP_END,
    LOAD,
    META_PUT,
    META_PUT_ANY,
    POSITION_EXISTS,
    PRUNE_REMOVED,
    READ_ALL,
    READ_ALL_FILTERED,
    READ_ALL_HEAD,
    READ_BWD,
    READ_FWD,
    SCAVENGE_BATCH,
    SCAVENGE_STREAMS,
    SNAP_DROP,
    SNAP_GET,
    SNAP_PUT,
    SNAP_PUT_AFTER,
    STREAM_STATE,
    STREAMS_OF_TYPE,
)
from tributary.eventstore.values import check_data, check_id
from tributary.jsonvalue import JsonValue

__all__ = [
    "CONNECTION_WAIT_S",
    "CommandRecord",
    "EventStore",
    "SameCommandRace",
    "SnapshotRecord",
    "STREAM_DELETED_PREFIX",
    "StreamInfo",
    "StreamLoad",
    "StreamMetadata",
    "position_exists_statement",
    "read_all_statement",
    "recorded_event",
    "request_hash",
    "stored_response",
]

_NO_LIMIT = 2**62
_KNOWN_MAX = 100_000
# The prefix of the logical message a delete sends capture (capture/records/outbox.py routes it;
# the same string as its STREAM_DELETED_PREFIX, which a test checks).
STREAM_DELETED_PREFIX = "tributary.eventstore.stream_deleted"
# How long a call waits for a pooled connection before StoreUnavailable: the pool's default (30 s)
# would hold every command that long while the service database is down.
CONNECTION_WAIT_S = 5.0


class _DatabaseErrors:
    """`with _database:` translates, once, the driver errors a caller can act on (the rest stay
    errors of the store): a value the database refused, and a database that did not answer. A
    class, not `@contextmanager`: it wraps every append, and a generator costs more per use."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if isinstance(exc, psycopg.DataError):
            raise InvalidValue("a value", f"cannot be stored: {exc.diag.message_primary or exc}") from None
        if isinstance(exc, psycopg.OperationalError):  # refused, lost, or no pooled connection in time (PoolTimeout)
            raise StoreUnavailable(
                f"the service database did not answer ({type(exc).__name__}); retry the request"
            ) from exc


_database = _DatabaseErrors()


@dataclass(frozen=True, slots=True)
class StreamInfo:
    stream_id: str
    stream_type: str
    version: int  # the stream's current version
    created_at: datetime  # when its first event was recorded


@dataclass(frozen=True, slots=True)
class StreamMetadata:
    """A stream's metadata (KurrentDB's `$maxAge`, `$maxCount`, `$tb` and custom metadata): reads
    hide what it excludes at once; a scavenge removes it. `version`: 0 until first written."""

    max_age: int | None = None  # seconds: events recorded longer ago are hidden
    max_count: int | None = None  # only the last n events are visible
    truncate_before: int | None = None  # versions below it are hidden
    custom: dict[str, Any] | None = None  # the user's own, a JSON object
    version: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "max_age": self.max_age,
            "max_count": self.max_count,
            "truncate_before": self.truncate_before,
            "custom": self.custom or {},
            "version": self.version,
        }


@dataclass(frozen=True, slots=True)
class _StreamState:
    """A stream's end and lifecycle (`STREAM_STATE`)."""

    end: int  # its last version, stored or kept after removal
    deleted_end: int | None  # soft-deleted up to this version
    hard: bool
    metadata: StreamMetadata
    stream_type: str | None

    @property
    def visible_end(self) -> int:
        """The version a command continues from: 0 for a soft-deleted stream with nothing new."""
        return 0 if self.deleted_end is not None and self.end <= self.deleted_end else self.end


def _stream_state(row: Sequence[Any]) -> _StreamState:
    meta = StreamMetadata(row[4], row[5], row[6], dict(row[7]) if row[7] is not None else None, int(row[3]))
    return _StreamState(int(row[0]), row[1], bool(row[2]), meta, row[8])


def check_metadata(meta: StreamMetadata) -> None:
    """InvalidValue naming the field: limits are positive integers, custom metadata an object."""
    for name in ("max_age", "max_count", "truncate_before"):
        value = getattr(meta, name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or not 0 < value < 2**62):
            raise InvalidValue(name, "must be a positive integer (or null)")
    if meta.custom is not None and not isinstance(meta.custom, dict):
        raise InvalidValue("custom", "must be a JSON object")
    if meta.custom:
        check_data("custom", meta.custom)
        if _has_huge_number(meta.custom):
            raise InvalidValue("custom", "holds a number of 2**63 or more; send it as a string")


def _has_huge_number(tree: JsonValue) -> bool:
    """A float at or beyond 2**63 comes back from `jsonb` as an integer beyond 64 bits (`jsonb`
    prints numbers without an exponent), which JSON encoders refuse. Walked without recursion."""
    stack: list[Any] = [tree]
    while stack:
        value = stack.pop()
        if isinstance(value, float) and not abs(value) < 2.0**63:
            return True
        if isinstance(value, dict):
            stack.extend(value.values())
        elif isinstance(value, list):
            stack.extend(value)
    return False


@dataclass(frozen=True, slots=True)
class CommandRecord:
    """Stored with the events of a command, in the same transaction: makes it idempotent."""

    command_id: str
    request_hash: str


@dataclass(frozen=True, slots=True)
class SnapshotRecord:
    """A snapshot sent with an append (same transaction): stored only if the append is."""

    version: int
    state: dict[str, Any]
    state_version: int
    key_ids: frozenset[KeyId] = frozenset()  # the subject keys that revealed its personal data


@dataclass(frozen=True, slots=True)
class StreamLoad:
    """What a command reads before it decides, in one round trip (`EventStore.load`)."""

    stored: tuple[str, dict[str, Any]] | None  # the command id's record: (request hash, response)
    snapshot: tuple[int, dict[str, Any]] | None  # (version, state) of the asked state version
    events: list[RecordedEvent]  # the visible events after the snapshot (all of them without one)
    end: int = 0  # the version an append continues from (0: a new or soft-deleted stream)
    start: int = 1  # where the stream's history begins: after a soft delete's end, else 1
    keys: frozenset[KeyId] = frozenset()  # the subject keys that revealed the snapshot's and events' data


def request_hash(
    stream_type: str, stream_id: str, command_type: str, data: JsonValue, expected: ExpectedVersion | None
) -> str:
    return hashlib.sha256(dumps([stream_type, stream_id, command_type, data, expected])).hexdigest()


def recorded_event(r: Sequence[Any]) -> RecordedEvent:
    """A row of the reads' columns (`statements.COLUMNS`) as an event."""
    return RecordedEvent(int(r[0]), r[1], r[2], int(r[3]), r[4], r[5], int(r[6]), r[7], r[8], r[9], r[10])


def read_all_statement(
    *,
    after: int,
    limit: int,
    stream_type: str | None,
    stream_prefix: str | None = None,
    event_types: Sequence[str] | None = None,
) -> tuple[str, tuple[Any, ...]]:
    """`EventStore.read_all`'s statement and parameters (also run by the HTTP subscriptions on
    their own async pool); `stream_prefix` and `event_types` filter in SQL. `UnknownPosition` for a
    position beyond `bigint`."""
    if after >= 2**63:
        raise UnknownPosition(after)
    params: tuple[Any, ...] = (limit,) if after <= 0 else (after, after, after, limit)
    filtered = stream_prefix is not None or event_types is not None
    if filtered:
        types = None if event_types is None else list(event_types)
        params = (stream_prefix, stream_prefix, types, types, *params)
    if stream_type is not None:
        params = (stream_type, *params)
    return (READ_ALL_FILTERED if filtered else READ_ALL)[(stream_type is not None, after <= 0)], params


def position_exists_statement(position: int) -> tuple[str, tuple[Any, ...]]:
    """Whether `position` names an event, stored or removed by a scavenge (`read_all`'s 404 check)."""
    return POSITION_EXISTS, (position, position)


def _utc(t: datetime) -> datetime:
    """As the server returns timestamptz: in UTC (a naive time is taken as UTC, like the session)."""
    return t.replace(tzinfo=UTC) if t.tzinfo is None else t.astimezone(UTC)


def _statement(
    queries: dict[str, str],
    stream_id: str,
    stream_type: str,
    values: tuple[Any, ...],
    expected: ExpectedVersion,
    known: int,
) -> tuple[str, tuple[Any, ...]]:
    """The insert for this expected version, with its parameters (see `INSERT_ONE`); `known`: a
    version the stream is proven to have reached."""
    if expected == "no_stream" or expected == 0:
        return queries["no_stream"], (stream_id, stream_type, stream_id, *values, stream_id)
    if isinstance(expected, int):
        if 0 < expected == known:
            return queries["new"], (stream_id, stream_type, expected, *values, stream_id, expected)
        exact = (stream_id, stream_type, expected, *values, stream_id, expected, stream_id, expected)
        return queries["exact"], (*exact, stream_id, expected)
    if expected == "stream_exists":
        return queries[expected], (
            stream_id,
            stream_id,
            stream_type,
            stream_id,
            *values,
            stream_id,
            stream_id,
            stream_id,
        )
    return queries[expected], (stream_id, stream_id, stream_type, stream_id, *values, stream_id)


def _recorded(
    stream_id: str,
    stream_type: str,
    e: NewEvent,
    data: str,
    meta: str,
    position: int,
    version: int,
    recorded_at: datetime,
) -> RecordedEvent:
    """The appended event as a read returns it: data as the store holds it (JSON, decimals as strings)."""
    return RecordedEvent(
        position,
        stream_id,
        stream_type,
        version,
        e.event_id,
        e.type,
        e.schema_version,
        orjson.loads(data),
        orjson.loads(meta),
        _utc(e.occurred_at),
        recorded_at,
    )


def _jsonb(obj: JsonValue) -> Jsonb:
    return Jsonb(obj, dumps=lambda o: dumps(o).decode())


class EventStore:
    """Append and read events. Thread-safe: every call takes its own pooled connection."""

    def __init__(self, pool: ConnectionPool[psycopg.Connection[Any]], *, keys: KeyStore | None = None) -> None:
        self.pool = pool
        # the keys of personal data (docs/eventstore.md, "Personal data"): reads reveal it
        self.keys: KeyStore = keys if keys is not None else DatabaseKeys(pool.connection)
        self._cursors: dict[int, psycopg.Cursor[Any]] = {}
        # stream -> a version it is proven to have reached: one this store saw committed (its own
        # appends, reads). The fact stays true (removed events leave their end behind, in
        # `streams`), so an append at exactly that version needs no lookup of it (the statement
        # still refuses it below an end kept by a removal). A racing thread writing an older fact
        # only costs a lookup later.
        self._known: dict[str, int] = {}

    def keys_on(self, conn: psycopg.Connection[Any]) -> KeyStore:
        """The key store, on `conn` when the keys are the database's (a command's session must not
        wait for a second pooled connection)."""
        return DatabaseKeys.on(conn) if isinstance(self.keys, DatabaseKeys) else self.keys

    def _note(self, stream_id: str, version: int) -> None:
        known = self._known
        if version > known.get(stream_id, 0):
            if len(known) >= _KNOWN_MAX:
                known.clear()  # a bound, not an LRU: losing facts costs lookups, never answers
            known[stream_id] = version

    def _cursor(self, conn: psycopg.Connection[Any]) -> psycopg.Cursor[Any]:
        """The connection's reusable cursor: a new cursor per statement (what `conn.execute` makes)
        is a noticeable part of a one-event append's client CPU. A pooled connection serves one
        thread at a time, and so does its cursor."""
        cur = self._cursors.get(id(conn))
        if cur is None or cur.connection is not conn or cur.closed:
            if len(self._cursors) > 64:  # connections replaced by the pool: drop the stale ones
                self._cursors.clear()
            cur = self._cursors[id(conn)] = conn.cursor()
        return cur

    @classmethod
    def connect(cls, dsn: str, *, max_size: int = 8, timeout: float = CONNECTION_WAIT_S) -> EventStore:
        # Autocommit: a plain append is one statement, its own transaction; reads need none.
        pool: ConnectionPool[psycopg.Connection[Any]] = ConnectionPool(
            dsn, min_size=1, max_size=max_size, timeout=timeout, open=True, kwargs={"autocommit": True}
        )
        return cls(pool)

    def close(self) -> None:
        self.pool.close()

    @contextmanager
    def session(self) -> Iterator[psycopg.Connection[Any]]:
        """One pooled connection for a sequence of calls (a command's load and append: `load`,
        `append(..., conn=…)`), with the store's error translation. Autocommit, as every call's."""
        with _database, self.pool.connection() as conn:
            yield conn

    # -- appending ------------------------------------------------------------------------------
    def append(
        self,
        stream_id: str,
        stream_type: str,
        events: Sequence[NewEvent],
        expected_version: ExpectedVersion = "any",
        *,
        command: CommandRecord | None = None,
        snapshot: SnapshotRecord | None = None,
        attempts: int = 5,
        conn: psycopg.Connection[Any] | None = None,
    ) -> AppendResult:
        """Append atomically; re-appending the same event ids returns the original result.
        `command` (an idempotency record) and `snapshot` are written in the same transaction;
        `conn`: a connection of `session()` (else a pooled one for this call)."""
        check_id("stream id", stream_id)
        with _database:
            if conn is not None:
                return self._append_attempts(
                    conn, stream_id, stream_type, events, expected_version, command, snapshot, attempts
                )
            pool = self.pool
            own = pool.getconn()
            try:
                return self._append_attempts(
                    own, stream_id, stream_type, events, expected_version, command, snapshot, attempts
                )
            finally:
                pool.putconn(own)

    def _append_attempts(
        self,
        conn: psycopg.Connection[Any],
        stream_id: str,
        stream_type: str,
        events: Sequence[NewEvent],
        expected_version: ExpectedVersion,
        command: CommandRecord | None,
        snapshot: SnapshotRecord | None,
        attempts: int,
    ) -> AppendResult:
        for _ in range(attempts):
            try:
                result = self._append(conn, stream_id, stream_type, events, expected_version, command, snapshot)
                self._note(stream_id, result.version)  # committed: now a fact
                return result
            except psycopg.errors.UniqueViolation as exc:
                constraint = exc.diag.constraint_name or ""
            if "commands" in constraint:
                raise SameCommandRace()
            # A re-append of stored events can hit either constraint first (an exact version
            # inserts n + 1 without looking at the stream's end): the ids decide.
            original = self._existing(conn, events)
            if original is not None:
                return original
            if "event_id" in constraint:
                raise PartialDuplicateBatch("some of these event ids are already stored in another batch")
            actual = self._current(conn, stream_id)
            if isinstance(expected_version, int) or expected_version == "no_stream":
                raise ConcurrencyConflict(stream_id, expected_version, actual)
            # `any` / `stream_exists`: someone appended meanwhile; go again from the new end.
        raise ConcurrencyConflict(stream_id, expected_version, actual, attempts=attempts)

    @staticmethod
    def _current(conn: psycopg.Connection[Any], stream_id: str) -> int:
        return int(conn.execute(CURRENT, (stream_id, stream_id)).fetchone()[0])  # type: ignore[index]  # an aggregate: one row

    def _append(
        self,
        conn: psycopg.Connection[Any],
        stream_id: str,
        stream_type: str,
        events: Sequence[NewEvent],
        expected: ExpectedVersion,
        command: CommandRecord | None,
        snapshot: SnapshotRecord | None,
    ) -> AppendResult:
        if not events:
            current = self._current(conn, stream_id)
            if (
                (expected == "no_stream" and current != 0)
                or (expected == "stream_exists" and current == 0)
                or (isinstance(expected, int) and current != expected)
            ):
                raise ConcurrencyConflict(stream_id, expected, current)
            result = AppendResult(stream_id, current, ())
            if command is not None:
                conn.execute(
                    CMD_PUT, (command.command_id, stream_id, command.request_hash, _jsonb(response_json(result)))
                )
            return result
        known = self._known.get(stream_id, 0)
        cursor = self._cursor(conn)
        if command is None and snapshot is None:  # one statement, its own transaction
            return self._appended(
                conn,
                stream_id,
                expected,
                events,
                self._insert(cursor, stream_id, stream_type, events, expected, known)(),
            )
        # Pipeline mode: the statements up to the pipeline's sync are one implicit transaction
        # (PostgreSQL's extended protocol; a fetch flushes, it does not sync), so the insert, the
        # snapshot and the command record commit together or not at all. Without a record: one
        # round trip (the insert's rows are read after the sync); with one, two (its answer holds
        # the positions the insert returns).
        with conn.pipeline():
            receive = self._insert(cursor, stream_id, stream_type, events, expected, known)
            if snapshot is not None:  # written only if the insert's last event is stored
                conn.execute(
                    SNAP_PUT_AFTER,
                    (
                        stream_id,
                        stream_type,
                        snapshot.version,
                        _jsonb(snapshot.state),
                        snapshot.state_version,
                        _jsonb([list(k) for k in sorted(snapshot.key_ids)]) if snapshot.key_ids else None,
                        stream_id,
                        snapshot.version,
                        events[-1].event_id,
                        [k[0] for k in sorted(snapshot.key_ids)],
                        [k[1] for k in sorted(snapshot.key_ids)],
                        len(snapshot.key_ids),
                    ),
                )
            if command is not None:
                result = self._appended(conn, stream_id, expected, events, receive())
                conn.execute(
                    CMD_PUT, (command.command_id, stream_id, command.request_hash, _jsonb(response_json(result)))
                )
                return result
        return self._appended(conn, stream_id, expected, events, receive())

    def _appended(
        self,
        conn: psycopg.Connection[Any],
        stream_id: str,
        expected: ExpectedVersion,
        events: Sequence[NewEvent],
        recorded: tuple[RecordedEvent, ...] | None,
    ) -> AppendResult:
        if recorded is None:  # the expected version did not hold — unless this very batch is stored
            original = self._existing(conn, events)
            if original is not None:
                return original
            if self._state(conn, stream_id).hard:
                raise StreamDeleted(stream_id)
            raise ConcurrencyConflict(stream_id, expected, self._current(conn, stream_id))
        return AppendResult(stream_id, recorded[-1].version, recorded)

    @staticmethod
    def _insert(
        cursor: psycopg.Cursor[Any],
        stream_id: str,
        stream_type: str,
        events: Sequence[NewEvent],
        expected: ExpectedVersion,
        known: int,
    ) -> Callable[[], tuple[RecordedEvent, ...] | None]:
        """Send the insert of `events` after the stream's end if `expected` holds; the function
        returned reads its result: the recorded events, None when `expected` did not hold. (In
        pipeline mode, whatever is sent between the two travels in the same round trip.)"""
        if len(events) == 1:  # the common case, kept short: one row back, no id map
            e = events[0]
            d, m = dumps(e.data).decode(), dumps(e.metadata).decode()
            values: tuple[Any, ...] = (e.event_id, e.type, e.schema_version, d, m, e.occurred_at)
            cursor.execute(*_statement(INSERT_ONE, stream_id, stream_type, values, expected, known))

            def one() -> tuple[RecordedEvent, ...] | None:
                row = cursor.fetchone()
                return None if row is None else (_recorded(stream_id, stream_type, e, d, m, *row),)

            return one
        data = [dumps(e.data).decode() for e in events]
        meta = [dumps(e.metadata).decode() for e in events]
        values = (
            [e.event_id for e in events],
            [e.type for e in events],
            [e.schema_version for e in events],
            data,
            meta,
            [e.occurred_at for e in events],
        )
        cursor.execute(*_statement(INSERT_MANY, stream_id, stream_type, values, expected, known))

        def many() -> tuple[RecordedEvent, ...] | None:
            rows = cursor.fetchall()
            if not rows:
                return None
            stored = {r[2]: r for r in rows}
            out = []
            for e, d, m in zip(events, data, meta, strict=True):
                position, version, _, recorded_at = stored[e.event_id]
                out.append(_recorded(stream_id, stream_type, e, d, m, position, version, recorded_at))
            return tuple(out)

        return many

    def _existing(self, conn: psycopg.Connection[Any], events: Sequence[NewEvent]) -> AppendResult | None:
        """The original result when every id is stored already; PartialDuplicateBatch when some are."""
        if not events:
            return None
        found = [recorded_event(r) for r in conn.execute(BY_IDS, ([e.event_id for e in events],)).fetchall()]
        if not found:
            return None
        if len(found) != len(events) or len({e.stream_id for e in found}) != 1:
            raise PartialDuplicateBatch(
                f"{len(found)} of the {len(events)} event ids are already stored: send the batch as it was, or new ids"
            )
        return AppendResult(found[0].stream_id, found[-1].version, tuple(found), duplicate=True)

    # -- idempotent commands ------------------------------------------------------------------------
    def command_response(self, command_id: str, request: str) -> dict[str, Any] | None:
        """The stored answer to `command_id`; IdempotencyMismatch if it was a different command."""
        check_id("command_id", command_id)
        with _database, self.pool.connection() as conn:
            row = conn.execute(CMD_GET, (command_id,)).fetchone()
        return None if row is None else stored_response(command_id, request, (str(row[0]), dict(row[1])))

    # -- a command's load --------------------------------------------------------------------------------
    def load(
        self,
        conn: psycopg.Connection[Any],
        stream_id: str,
        *,
        state_version: int | None,
        command_id: str | None = None,
    ) -> StreamLoad:
        """What a command needs before it decides, on `conn` (of `session()`), in one round trip:
        the record of `command_id` (if any), the snapshot of `state_version` (None: no snapshot)
        and the events after it. The record and the stream are two statements in one pipeline."""
        check_id("stream id", stream_id)
        stored = None
        params: tuple[Any, ...]
        if state_version is None:
            query, params = READ_FWD, (stream_id, 1, _NO_LIMIT)
        else:
            query, params = LOAD, (stream_id, state_version, stream_id)
        if command_id is not None:
            check_id("command_id", command_id)
        with conn.pipeline():
            record = None if command_id is None else conn.execute(CMD_GET, (command_id,))
            stream = conn.execute(query, params)
            status = conn.execute(STREAM_STATE, (stream_id,))
        if record is not None:
            row = record.fetchone()
            stored = None if row is None else (str(row[0]), dict(row[1]))
        rows = stream.fetchall()
        state = _stream_state(status.fetchone())  # type: ignore[arg-type]  # an outer join: one row
        if state.hard:
            raise StreamDeleted(stream_id)
        snapshot, snapshot_keys = None, frozenset[KeyId]()
        if rows and rows[0][0] is None:  # the snapshot row (no position; its key ids in `metadata`)
            snapshot = (int(rows[0][3]), dict(rows[0][7]))
            snapshot_keys = frozenset((str(k[0]), int(k[1])) for k in rows[0][8] or ())
            rows = rows[1:]
        events = [recorded_event(r) for r in rows]
        if events:
            self._note(stream_id, events[-1].version)
        revealed, used = reveal_events_keyed(self.keys_on(conn), events)
        return StreamLoad(
            stored, snapshot, revealed, state.visible_end, (state.deleted_end or 0) + 1, snapshot_keys | used
        )

    # -- reading ---------------------------------------------------------------------------------------
    def read_stream(
        self, stream_id: str, *, from_version: int = 1, limit: int | None = None, backwards: bool = False
    ) -> list[RecordedEvent]:
        query = READ_BWD if backwards else READ_FWD
        start = from_version if not backwards or from_version > 0 else _NO_LIMIT
        check_id("stream id", stream_id)
        with _database, self.pool.connection() as conn:
            rows = conn.execute(query, (stream_id, start, limit or _NO_LIMIT)).fetchall()
            if not rows and self._state(conn, stream_id).hard:
                raise StreamDeleted(stream_id)
        events = [recorded_event(r) for r in rows]
        if events:
            self._note(stream_id, max(events[0].version, events[-1].version))
        return reveal_events(self.keys, events)

    def read_all(
        self,
        *,
        after: int = 0,
        limit: int = 1000,
        stream_type: str | None = None,
        stream_prefix: str | None = None,
        event_types: Sequence[str] | None = None,
    ) -> list[RecordedEvent]:
        """`$all` (or one stream type's events) after position `after` (0: from the start), in
        the order every reader sees, with no event ever skipped: by (writing transaction, position),
        only transactions that every later reader also sees as finished (`statements.READ_ALL`).
        Only streams whose id starts with `stream_prefix` and events of `event_types`, when given.
        Continue from the last event's position. `UnknownPosition` if `after` names no event."""
        query, params = read_all_statement(
            after=after, limit=limit, stream_type=stream_type, stream_prefix=stream_prefix, event_types=event_types
        )
        with _database, self.pool.connection() as conn:
            rows = conn.execute(query, params).fetchall()
            if not rows and after > 0 and not conn.execute(*position_exists_statement(after)).fetchone()[0]:  # type: ignore[index]  # EXISTS: one row
                raise UnknownPosition(after)
        return reveal_events(self.keys, [recorded_event(r) for r in rows])

    def head_position(self) -> int:
        """The position of the last event `read_all` would return now (0: none yet): what a
        subscription polls to know whether there is anything new, in one index probe."""
        with _database, self.pool.connection() as conn:
            row = conn.execute(READ_ALL_HEAD).fetchone()
        return 0 if row is None else int(row[0])

    def streams(self, stream_type: str, *, after: str = "", limit: int = 100) -> list[StreamInfo]:
        """The streams of a type in stream id order, after the stream id `after`: those with
        events stored, deleted ones left out (pages are filled past them)."""
        found: list[StreamInfo] = []
        with _database, self.pool.connection() as conn:
            while len(found) < limit:
                rows = conn.execute(STREAMS_OF_TYPE, (stream_type, after, stream_type, after, limit)).fetchall()
                for sid, end, created, hard, deleted_end in rows:
                    gone = hard or created is None or (deleted_end is not None and int(end) <= deleted_end)
                    if not gone and len(found) < limit:
                        found.append(StreamInfo(sid, stream_type, int(end), created))
                if len(rows) < limit:
                    break
                after = rows[-1][0]
        return found

    def version(self, stream_id: str) -> int:
        check_id("stream id", stream_id)
        with _database, self.pool.connection() as conn:
            v = int(conn.execute(CURRENT, (stream_id, stream_id)).fetchone()[0])  # type: ignore[index]  # an aggregate: one row
        self._note(stream_id, v)
        return v

    # -- a stream's lifecycle: metadata, deletes, scavenge ------------------------------------------
    @staticmethod
    def _state(conn: psycopg.Connection[Any], stream_id: str) -> _StreamState:
        return _stream_state(conn.execute(STREAM_STATE, (stream_id,)).fetchone())  # type: ignore[arg-type]  # an outer join: one row

    def stream_metadata(self, stream_id: str) -> StreamMetadata:
        """The stream's metadata (version 0 and no limits until first written)."""
        check_id("stream id", stream_id)
        with _database, self.pool.connection() as conn:
            state = self._state(conn, stream_id)
        if state.hard:
            raise StreamDeleted(stream_id)
        return state.metadata

    def set_stream_metadata(
        self, stream_id: str, meta: StreamMetadata, *, expected_version: int | Literal["any"] = "any"
    ) -> StreamMetadata:
        """Write the stream's metadata if it is at `expected_version` (0: never written), else
        MetadataConflict; reads honour it at once. Returns it with its new version."""
        check_id("stream id", stream_id)
        check_metadata(meta)
        limits = (meta.max_age, meta.max_count, meta.truncate_before, dumps(meta.custom or {}).decode())
        with _database, self.pool.connection() as conn:
            if expected_version == "any":
                row = conn.execute(META_PUT_ANY, (stream_id, *limits)).fetchone()
            else:
                row = conn.execute(META_PUT, (stream_id, *limits, expected_version)).fetchone()
            if row is None:
                state = self._state(conn, stream_id)
                if state.hard:
                    raise StreamDeleted(stream_id)
                raise MetadataConflict(stream_id, expected_version, state.metadata.version)
            written = int(row[0])
        return StreamMetadata(meta.max_age, meta.max_count, meta.truncate_before, meta.custom or {}, written)

    def delete_stream(self, stream_id: str, *, hard: bool = False) -> int:
        """Delete the stream, in one short transaction; returns the version it ended at. Soft: it
        reads as gone and an append (`no_stream`) recreates it after that version (KurrentDB's
        delete); hard: a tombstone, its id is refused for good. Its events go at the next
        scavenge; capture is told at once (a logical message the outbox routes to the log)."""
        check_id("stream id", stream_id)
        with _database, self.pool.connection() as conn, conn.transaction():
            state = self._state(conn, stream_id)
            if state.hard:
                raise StreamDeleted(stream_id)
            if not hard and state.visible_end == 0:
                raise StreamNotFound(stream_id)
            conn.execute(DELETE_STREAM, (stream_id, state.stream_type, state.end, state.end, hard))
            conn.execute(SNAP_DROP, (stream_id,))
            marker = {
                "stream": stream_id,
                "stream_type": state.stream_type,
                "hard": hard,
                "version": state.end,
                "occurred_at": datetime.now(UTC).isoformat().replace("+00:00", "Z"),
            }
            conn.execute(EMIT_DELETED, (STREAM_DELETED_PREFIX, dumps(marker).decode()))
        return state.end

    def scavenge(self, *, batch: int = 500, pause: Callable[[], None] | None = None) -> int:
        """Remove what stream metadata and deletes hide, stream by stream, `batch` events per
        short transaction (row locks on the removed events only: appends go on). `pause` runs
        between batches (a background scavenge yields there). Returns how many events went."""
        removed, after = 0, ""
        while True:
            with _database, self.pool.connection() as conn:
                ids = [r[0] for r in conn.execute(SCAVENGE_STREAMS, (after, 100)).fetchall()]
            for stream_id in ids:
                removed += self._scavenge_stream(stream_id, batch, pause)
            if len(ids) < 100:
                return removed
            after = ids[-1]

    def prune_removed(self, keep_s: float, *, batch: int = 5000) -> int:
        """Forget the `$all` positions of events removed more than `keep_s` seconds ago, `batch` per
        short transaction: a reader continuing after one of them gets UnknownPosition from then on
        (it kept a position longer than the store keeps removed ones). Returns how many went."""
        pruned = 0
        while True:
            with _database, self.pool.connection() as conn:
                gone = conn.execute(PRUNE_REMOVED, (keep_s, batch)).rowcount
            pruned += gone
            if gone < batch:
                return pruned

    def _scavenge_stream(self, stream_id: str, batch: int, pause: Callable[[], None] | None) -> int:
        removed = 0
        while True:
            with _database, self.pool.connection() as conn, conn.transaction():
                conn.execute(
                    KEEP_END, (stream_id, stream_id, stream_id)
                )  # before anything goes: versions continue after it
                gone = len(conn.execute(SCAVENGE_BATCH, (stream_id, stream_id, batch)).fetchall())
            removed += gone
            if gone < batch:
                return removed
            if pause is not None:
                pause()

    # -- snapshots (a cache: they speed loading up and never change answers) ---------------------------------
    def snapshot(self, stream_id: str) -> tuple[int, dict[str, Any], int] | None:
        check_id("stream id", stream_id)
        with _database, self.pool.connection() as conn:
            row = conn.execute(SNAP_GET, (stream_id,)).fetchone()
        return None if row is None else (int(row[0]), dict(row[1]), int(row[2]))

    def save_snapshot(
        self, stream_id: str, stream_type: str, version: int, state: dict[str, Any], state_version: int
    ) -> None:
        with _database, self.pool.connection() as conn, conn.transaction():
            conn.execute(SNAP_PUT, (stream_id, stream_type, version, _jsonb(state), state_version))


def stored_response(command_id: str, request: str, stored: tuple[str, dict[str, Any]]) -> dict[str, Any]:
    """A command record's answer; IdempotencyMismatch if the record is of a different command."""
    if stored[0] != request:
        raise IdempotencyMismatch(f"command id {command_id!r} was already used for a different command")
    return stored[1]


class SameCommandRace(Exception):
    """Two requests with one command id raced; the handler answers with the stored response."""
