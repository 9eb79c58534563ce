"""Command handling: load (snapshot + tail), decide, append with the loaded version.

A conflict with a concurrent writer is retried a bounded number of times, after a pause drawn
from an exponentially growing range ("full jitter": writers that collided once do not collide
again in lockstep), unless the caller pinned `expected_version`: then the conflict is theirs to
see. A `command_id` makes a command idempotent: its answer is stored with its events, in one
transaction.
"""

from __future__ import annotations

import random
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import psycopg
from pydantic import BaseModel, ValidationError

from tributary.eventstore.aggregate import Aggregate
from tributary.eventstore.errors import ConcurrencyConflict, HistoryHidden, UnknownStreamType
from tributary.eventstore.keys import reveal_json
from tributary.eventstore.model import ExpectedVersion, NewEvent, event_json
from tributary.eventstore.personal import KeyId, personal_fields, seal, subjects_of
from tributary.eventstore.store import (
    CommandRecord,
    EventStore,
    SameCommandRace,
    SnapshotRecord,
    StreamLoad,
    request_hash,
    stored_response,
)
from tributary.eventstore.values import check_data, check_headers, check_id

__all__ = ["CommandHandler", "CommandResult", "LoadedState", "backoff"]


def backoff(attempt: int, *, base_s: float, cap_s: float, rng: random.Random) -> float:
    """The pause before retry `attempt` (0-based): uniform in [0, min(cap, base * 2**attempt)]."""
    return rng.uniform(0.0, min(cap_s, base_s * 2.0**attempt))


@dataclass(frozen=True, slots=True)
class LoadedState:
    state: BaseModel
    version: int
    from_snapshot: int  # version the snapshot covered (0: folded from the first event)
    keys: frozenset[KeyId] = frozenset()  # the subject keys that revealed what the state was folded from


@dataclass(frozen=True, slots=True)
class CommandResult:
    stream_id: str
    version: int
    events: list[dict[str, Any]]
    replayed: bool = False  # the answer to an earlier identical command

    def to_json(self) -> dict[str, Any]:
        return {"stream_id": self.stream_id, "version": self.version, "events": self.events}


class CommandHandler:
    def __init__(
        self,
        store: EventStore,
        aggregates: Mapping[str, Aggregate[Any]],
        *,
        max_retries: int = 3,
        snapshot_every: int | None = 100,
        retry_base_s: float = 0.005,
        retry_cap_s: float = 0.2,
        sleep: Callable[[float], None] = time.sleep,
        rng: random.Random | None = None,
    ) -> None:
        self.store = store
        self.aggregates = dict(aggregates)
        self.max_retries = max_retries
        self.snapshot_every = snapshot_every
        self.retry_base_s, self.retry_cap_s = retry_base_s, retry_cap_s
        self._sleep = sleep
        self._rng = rng or random.Random()

    def aggregate(self, stream_type: str) -> Aggregate[Any]:
        try:
            return self.aggregates[stream_type]
        except KeyError:
            known = ", ".join(sorted(self.aggregates))
            raise UnknownStreamType(
                f"no stream type {stream_type!r} (known: {known})"
                if known
                else f"no stream type {stream_type!r}: no [eventstore] modules are configured, so no command types"
            ) from None

    # -- loading ---------------------------------------------------------------------------------
    def load(self, stream_type: str, stream_id: str, *, use_snapshot: bool = True) -> LoadedState:
        agg = self.aggregate(stream_type)
        with self.store.session() as conn:
            return self._fold(agg, conn, stream_id, self._read(agg, conn, stream_id, None, use_snapshot))

    def _read(
        self,
        agg: Aggregate[Any],
        conn: psycopg.Connection[Any],
        stream_id: str,
        command_id: str | None,
        use_snapshot: bool = True,
    ) -> StreamLoad:
        state_version = agg.state_version if use_snapshot and self.snapshot_every else None
        return self.store.load(conn, stream_id, state_version=state_version, command_id=command_id)

    def _fold(
        self, agg: Aggregate[Any], conn: psycopg.Connection[Any], stream_id: str, read: StreamLoad
    ) -> LoadedState:
        """The state after the snapshot (if it still validates) and the events after it, at the
        stream's end. Stream metadata may hide early events (KurrentDB reads from the first
        visible one): a snapshot must then cover them, else HistoryHidden — a fold of part of the
        history would be a wrong state."""
        state, version, base, events, keys = agg.initial(), 0, 0, read.events, read.keys
        first = read.start  # the first version the fold needs
        if read.snapshot is not None:
            try:
                state = agg.state_type.model_validate(read.snapshot[1])
                version = base = read.snapshot[0]
                first = base + 1
            except ValidationError:  # taken by other code: fold from the first event (one more read)
                again = self.store.load(conn, stream_id, state_version=None)
                events, keys = again.events, again.keys
        end = max(events[-1].version if events else version, read.end)
        if (events[0].version if events else end + 1) > first and end >= first:
            raise HistoryHidden(stream_id, first, events[0].version if events else None)
        for e in events:
            state = agg.evolve(state, agg.load_event(e.type, e.schema_version, e.data))
        return LoadedState(state, end, base, keys)

    # -- handling ----------------------------------------------------------------------------------
    def handle(
        self,
        stream_type: str,
        stream_id: str,
        command_type: str,
        data: Mapping[str, Any],
        *,
        expected_version: ExpectedVersion | None = None,
        command_id: str | None = None,
        correlation_id: str | None = None,
        causation_id: str | None = None,
        headers: Mapping[str, str] | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> CommandResult:
        """Decide and append. `expected_version`: None or "any" (retry conflicts), "stream_exists"
        (the stream must have events; retry conflicts), "no_stream" or n (the stream must be at
        that version: a conflict is the caller's). Each event's metadata: `causation_id` (default:
        the command's id, `command_id`, else a new one), `correlation_id` (default: the command's
        id), the user `headers`, and `metadata`'s own fields."""
        agg = self.aggregate(stream_type)
        check_id("stream id", stream_id)
        if command_id is not None:
            check_id("command_id", command_id)
        if correlation_id is not None:
            check_id("correlation_id", correlation_id)
        if causation_id is not None:
            check_id("causation_id", causation_id)
        check_data("data", data)
        if metadata:
            check_data("metadata", metadata)
        if headers:
            check_headers(headers)
        if expected_version == "any":
            expected_version = None
        pinned: int | None = 0 if expected_version == "no_stream" else None
        if isinstance(expected_version, int):
            pinned = expected_version
        command = agg.parse_command(command_type, data)
        req = request_hash(stream_type, stream_id, command_type, dict(data), expected_version)
        own_id = command_id or str(uuid.uuid4())
        meta = {**(metadata or {}), "correlation_id": correlation_id or own_id, "causation_id": causation_id or own_id}
        if command_id is not None:
            meta["command_id"] = command_id
        if headers:
            meta["headers"] = dict(headers)
        record = None if command_id is None else CommandRecord(command_id, req)
        # One pooled connection for the whole command: each attempt is a load (the command's record
        # with it: one round trip; a retry finds the record a twin of this command stored meanwhile)
        # and an append (with the snapshot and the record, in one transaction).
        with self.store.session() as conn:
            for attempt in range(self.max_retries + 1):
                read = self._read(agg, conn, stream_id, command_id)
                if read.stored is not None:
                    return self._replayed(conn, command_id or "", req, read.stored)
                loaded = self._fold(agg, conn, stream_id, read)
                if (pinned is not None and loaded.version != pinned) or (
                    expected_version == "stream_exists" and loaded.version == 0
                ):
                    raise ConcurrencyConflict(stream_id, expected_version, loaded.version)
                decided = agg.decide(loaded.state, command)
                plain = [self._new_event(agg, e, meta) for e in decided]
                events, sealed_with = self._sealed(conn, stream_id, decided, plain)
                snapshot = self._snapshot(agg, loaded, decided, loaded.version + len(events), sealed_with)
                try:
                    appended = self.store.append(
                        stream_id, stream_type, events, loaded.version, command=record, snapshot=snapshot, conn=conn
                    )
                except ConcurrencyConflict as exc:
                    if pinned is not None:
                        raise ConcurrencyConflict(stream_id, expected_version, exc.actual) from None
                    if attempt == self.max_retries:
                        raise ConcurrencyConflict(stream_id, exc.expected, exc.actual, attempts=attempt + 1) from None
                    self._sleep(backoff(attempt, base_s=self.retry_base_s, cap_s=self.retry_cap_s, rng=self._rng))
                    continue
                except SameCommandRace:
                    stored = self.store.load(conn, stream_id, state_version=None, command_id=command_id).stored
                    assert stored is not None
                    return self._replayed(conn, command_id or "", req, stored)
                shown = {e.event_id: e.data for e in plain}  # the answer shows what was decided, not its envelopes
                answer = [event_json(e) | {"data": shown.get(e.event_id, e.data)} for e in appended.events]
                return CommandResult(stream_id, appended.version, reveal_json(self.store.keys_on(conn), answer))
        raise AssertionError("unreachable")

    def _replayed(
        self, conn: psycopg.Connection[Any], command_id: str, req: str, stored: tuple[str, dict[str, Any]]
    ) -> CommandResult:
        """The stored answer (its personal data is stored sealed, and revealed here)."""
        answer = stored_response(command_id, req, stored)
        events = reveal_json(self.store.keys_on(conn), answer["events"])
        return CommandResult(answer["stream_id"], answer["version"], events, replayed=True)

    def _sealed(
        self, conn: psycopg.Connection[Any], stream_id: str, decided: Sequence[BaseModel], plain: list[NewEvent]
    ) -> tuple[list[NewEvent], frozenset[KeyId]]:
        """The events with their personal-data fields sealed under each subject's current key
        (one key lookup for the command; none when its events hold no personal data), and those keys."""
        fields = [personal_fields(type(e)) for e in decided]
        if not any(fields):
            return plain, frozenset()
        subjects: set[str] = set()
        for f, e in zip(fields, plain, strict=True):
            subjects |= subjects_of(f, e.data, stream_id)
        keys = self.store.keys_on(conn).current(subjects)
        used = frozenset((subject, kid) for subject, (kid, _) in keys.items())
        return [
            replace(e, data=seal(f, e.data, stream_id, keys)) if f else e for f, e in zip(fields, plain, strict=True)
        ], used

    @staticmethod
    def _new_event(agg: Aggregate[Any], event: BaseModel, metadata: dict[str, Any]) -> NewEvent:
        etype = agg.event_type(event)
        return NewEvent(
            type=etype, data=event.model_dump(mode="json"), metadata=metadata, schema_version=agg.schema_version(etype)
        )

    def _snapshot(
        self,
        agg: Aggregate[Any],
        loaded: LoadedState,
        decided: Sequence[BaseModel],
        version: int,
        sealed_with: frozenset[KeyId] = frozenset(),
    ) -> SnapshotRecord | None:
        """The snapshot to write with the append, every `snapshot_every` events (none for a
        command that appends nothing: a snapshot is a cache). It names the keys its state's personal
        data came from: the store writes it only while they all live."""
        if not self.snapshot_every or not decided or version - loaded.from_snapshot < self.snapshot_every:
            return None
        state = loaded.state
        for event in decided:
            state = agg.evolve(state, event)
        return SnapshotRecord(version, state.model_dump(mode="json"), agg.state_version, loaded.keys | sealed_with)
