"""Consumer-group delivery over HTTP: pull (long poll), commit, and the stream of server-sent events
(docs/consumers.md).

Waiting for records never polls the database: a pull or a stream sleeps on the log watcher
(`LogChanges`), which re-reads the log's manifest when it is replaced (inotify; else every
`[consumers] poll_interval_ms`) while someone waits. A stream checks its membership against the
database only on rebalance notices or once per beat (`GroupCoordinator.stream_fetch`). A stream reads
at most `[consumers] stream_batch_records` ahead of what its client has taken (the next batch is read
only when the previous one was handed to the connection), so a slow client holds only its own stream.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Annotated, Any

import orjson
from fastapi import APIRouter, Header, Query
from fastapi.responses import Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from tributary.api.http.auth import AUTH_RESPONSES, error
from tributary.api.http.groups_shared import (
    BODY_ERRORS,
    CONFLICT_ERRORS,
    MAX_INT,
    READ,
    GroupName,
    MemberId,
    Topic,
    assignments_json,
    consumer_problem,
    run_in_thread,
)
from tributary.api.http.state import Changes, Coordinator, SettingsOf
from tributary.consumers import (
    ConsumerError,
    Fenced,
    GroupCoordinator,
    LogChanges,
    OffsetOutOfRange,
    StreamCursor,
    UnknownMember,
)
from tributary.jsonvalue import JsonValue
from tributary.log import Record

__all__ = ["record_json", "router"]

router = APIRouter(tags=["consumers"])


class RecordOut(BaseModel):
    topic: str
    partition: int
    offset: int
    timestamp_ms: int
    key: str | None = Field(description="The record key's JSON text, or null.")
    value: JsonValue = Field(description="The record's JSON value (null: a tombstone).")
    headers: dict[str, str]


class Records(BaseModel):
    generation: int
    records: list[RecordOut]


class OffsetIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    topic: Topic
    partition: int = Field(ge=0, le=1_000_000)
    offset: int = Field(ge=0, le=MAX_INT, description="The next offset to read (Kafka's convention).")


class CommitRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    generation: int = Field(ge=0, le=MAX_INT)
    offsets: list[OffsetIn] = Field(max_length=100_000)


class CommitReply(BaseModel):
    generation: int
    offsets: list[OffsetIn]


@router.get(
    "/groups/{group}/members/{member_id}/records",
    dependencies=READ,
    response_class=Response,
    responses={
        200: {"model": Records, "description": "records in offset order per partition (empty after `wait_ms`)"},
        **AUTH_RESPONSES,
        **CONFLICT_ERRORS,
        410: error("offset_out_of_range: the position fell behind retention and auto_offset_reset is error"),
    },
)
async def records(
    group: GroupName,
    member_id: MemberId,
    coordinator: Coordinator,
    changes: Changes,
    generation: Annotated[int, Query(ge=0, le=MAX_INT)],
    max_records: Annotated[int, Query(ge=1, le=100_000)] = 500,
    max_bytes: Annotated[int, Query(ge=1, le=64 << 20)] = 1 << 20,
    wait_ms: Annotated[int, Query(ge=0, le=60_000)] = 5000,
) -> Response:
    """The next records of the member's partitions: as soon as there is at least one, or none after
    `wait_ms`. Each call continues where the previous one ended (at-least-once: after a rebalance or
    a restart, delivery restarts at the committed offset)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait_ms / 1000
    while True:
        batch = await run_in_thread(
            coordinator.fetch, group, member_id, generation, max_records=max_records, max_bytes=max_bytes
        )
        left = deadline - loop.time()
        if batch.records or left <= 0 or changes.closed:
            break
        await changes.wait(batch.version, min(left, _beat(batch.session_timeout_ms)))
    body = b'{"generation":%d,"records":[%b]}' % (batch.generation, b",".join(map(record_json, batch.records)))
    return Response(body, media_type="application/json")


@router.post(
    "/groups/{group}/members/{member_id}/commit",
    dependencies=READ,
    response_model=CommitReply,
    responses={**AUTH_RESPONSES, **BODY_ERRORS, **CONFLICT_ERRORS},
)
async def commit(
    group: GroupName, member_id: MemberId, body: CommitRequest, coordinator: Coordinator
) -> dict[str, Any]:
    """Commit the next offset to read per partition; refused (409) from a generation that is over or
    for a partition the member does not hold. The answer names what was committed: an offset stops at
    a nacked record that was not delivered again yet."""
    offsets = [(o.topic, o.partition, o.offset) for o in body.offsets]
    done = await run_in_thread(coordinator.commit, group, member_id, body.generation, offsets)
    return {"generation": body.generation, "offsets": [{"topic": t, "partition": p, "offset": o} for t, p, o in done]}


@router.get(
    "/groups/{group}/members/{member_id}/stream",
    dependencies=READ,
    response_class=StreamingResponse,
    responses={
        200: {
            "content": {"text/event-stream": {}},
            "description": "`record` events (id = topic/partition/offset, data = a record as in the pull), "
            "`rebalance` events (data: generation and assignments), `error` events before the stream ends",
        },
        **AUTH_RESPONSES,
        **CONFLICT_ERRORS,
    },
)
async def stream(
    group: GroupName,
    member_id: MemberId,
    coordinator: Coordinator,
    changes: Changes,
    settings: SettingsOf,
    generation: Annotated[int, Query(ge=0, le=MAX_INT)],
    last_event_id: Annotated[str | None, Query(max_length=600, description="Resume after this event id.")] = None,
    last_event_header: Annotated[str | None, Header(alias="Last-Event-ID", max_length=600)] = None,
) -> StreamingResponse:
    """The member's records as server-sent events, from its committed offsets (or just after
    `Last-Event-ID`, the header or the query parameter); the stream follows rebalances by itself
    (a `rebalance` event, then the new partitions' records) and keeps the member alive."""
    hb = await run_in_thread(coordinator.heartbeat, group, member_id, generation)
    if hb.rebalance:
        raise Fenced(
            f"generation {generation} of group {group!r} is over (now {hb.generation}): heartbeat or join again",
            generation=hb.generation,
        )
    positions: dict[tuple[str, int], int] = {}
    resume = last_event_header or last_event_id
    if resume:
        parsed = _event_id(resume)
        if parsed is not None and (parsed[0], parsed[1]) in hb.assignments:
            positions[(parsed[0], parsed[1])] = parsed[2] + 1
    batch_records = settings.consumers.stream_batch_records
    return StreamingResponse(
        _events(coordinator, changes, group, member_id, hb.generation, positions, batch_records),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
    )


async def _events(
    coordinator: GroupCoordinator,
    changes: LogChanges,
    group: str,
    member_id: str,
    generation: int,
    positions: dict[tuple[str, int], int],
    batch_records: int,
) -> AsyncIterator[bytes]:
    loop = asyncio.get_running_loop()
    quiet_since = loop.time()
    cursor = StreamCursor(group, member_id, generation, positions)
    yield b"retry: 1000\n\n"
    while not changes.closed:
        try:
            batch = await run_in_thread(coordinator.stream_fetch, cursor, max_records=batch_records)
        except Fenced:
            try:
                hb = await run_in_thread(coordinator.heartbeat, group, member_id, generation)
            except UnknownMember as gone:
                yield _sse_error(gone)
                return
            generation = cursor.generation = hb.generation
            cursor.assignments = None
            for tp in [tp for tp in positions if tp not in hb.assignments]:
                del positions[tp]  # moved away: its new member starts at the committed offset
            data = {"generation": generation, "assignments": assignments_json(hb.assignments)}
            yield b"event: rebalance\ndata: %b\n\n" % orjson.dumps(data)
            continue
        except (UnknownMember, OffsetOutOfRange) as gone:
            yield _sse_error(gone)
            return
        if batch.records:
            yield b"".join(map(_sse_record, batch.records))
            quiet_since = loop.time()
            continue
        if loop.time() - quiet_since >= 15:
            yield b": keep-alive\n\n"
            quiet_since = loop.time()
        # (a client that goes away cancels this generator: Starlette listens for the disconnect)
        await changes.wait(batch.version, _beat(batch.session_timeout_ms))


def _beat(session_timeout_ms: int) -> float:
    """How long a waiting pull or stream sleeps at most before it calls the coordinator again (which
    also keeps its member alive): a quarter of the session timeout, at most a second."""
    return min(1.0, session_timeout_ms / 4000)


def _sse_record(r: Record) -> bytes:
    return b"id: %b/%d/%d\nevent: record\ndata: %b\n\n" % (r.topic.encode(), r.partition, r.offset, record_json(r))


def _sse_error(exc: ConsumerError) -> bytes:
    return b"event: error\ndata: %b\n\n" % orjson.dumps(consumer_problem(exc))


def _event_id(text: str) -> tuple[str, int, int] | None:
    """`topic/partition/offset` → its parts; None when it is not one."""
    topic, _, rest = text.strip().rpartition("/")
    topic, _, partition = topic.rpartition("/")
    if not (topic and partition.isdigit() and rest.isdigit()):
        return None
    return topic, int(partition), int(rest)


def record_json(r: Record) -> bytes:
    """A record as the pull and the stream send it: key as its JSON text, value as JSON, headers as strings."""
    return orjson.dumps(
        {
            "topic": r.topic,
            "partition": r.partition,
            "offset": r.offset,
            "timestamp_ms": r.timestamp,
            "key": None if r.key is None else r.key.decode(),
            "value": None if r.value is None else orjson.Fragment(r.value),
            "headers": _headers(r.headers),
        }
    )


def _headers(raw: bytes | None) -> dict[str, str]:
    if raw is None:
        return {}
    parsed = orjson.loads(raw)
    if not isinstance(parsed, dict):
        return {}
    return {str(k): v if isinstance(v, str) else orjson.dumps(v).decode() for k, v in parsed.items()}
