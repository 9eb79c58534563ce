"""Consumer groups over HTTP: join, heartbeat, leave, pull (long poll), commit, stream (server-sent
events), list, describe, reset (docs/consumers.md).

The group coordinator (`tributary.consumers.GroupCoordinator`) is synchronous psycopg; every call runs
in a worker thread. Waiting for records never polls the database: a pull or a stream sleeps on the log
watcher (`LogChanges`), which re-reads the log's manifest when it is replaced (inotify; else every
`[consumers] poll_interval_ms`) while someone waits. A stream checks its membership against the database
only on rebalance notices or once per beat (`GroupCoordinator.stream_fetch`). A stream reads at most `[consumers] stream_batch_records` ahead of what its client has
taken (the next batch is read only when the previous one was handed to the connection), so a slow
client holds only its own stream.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import signal
from collections.abc import AsyncIterator, Callable
from types import FrameType
from typing import Annotated, Any, Literal, TypeVar

import orjson
from fastapi import APIRouter, Body, Depends, Header, HTTPException, Path, Query, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, StrictBool

from tributary.api.http.auth import AUTH_RESPONSES, error, require
from tributary.api.settings.log import kafka_options
from tributary.capture.log import LogError, Record
from tributary.consumers import (
    ConsumerError,
    Fenced,
    GroupBusy,
    GroupCoordinator,
    LogChanges,
    NotAssigned,
    NotFound,
    OffsetOutOfRange,
    StreamCursor,
    UnknownMember,
)

__all__ = ["consumer_error", "record_json", "router", "start_consumers"]

log = logging.getLogger(__name__)
router = APIRouter(tags=["consumers"])
T = TypeVar("T")

_NAME = r"^[A-Za-z0-9._:@+=-]{1,200}$"
_TOPIC = r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,248}$"  # the log's own rule for topic names
_MAX_INT = 2**53 - 1  # offsets and generations: exact as a JSON number (a double)
Topic = Annotated[str, Field(pattern=_TOPIC, description="A topic of the log, e.g. `shop.public.orders`.")]
GroupName = Annotated[str, Path(pattern=_NAME, description="The consumer group's name.")]
MemberId = Annotated[str, Path(pattern=_NAME, description="The id `POST /groups/{group}/members` returned.")]
_READ = [Depends(require("read"))]


class Assignment(BaseModel):
    topic: str
    partition: int


class JoinRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    topics: list[Topic] = Field(min_length=1, max_length=100, description="Topics to consume.")
    member_id: str | None = Field(
        default=None, pattern=_NAME, description="Re-join as this member (after a restart or a 409); new when unset."
    )
    session_timeout_ms: int | None = Field(
        default=None,
        ge=100,
        le=3_600_000,
        description="Leave the group after this long without a call (default `[consumers] session_timeout_ms`).",
    )
    auto_offset_reset: Literal["earliest", "latest", "error"] | None = Field(
        default=None, description="Start of a partition without a committed offset, or behind retention."
    )
    auto_commit: StrictBool = Field(default=False, description="Each pull commits what the previous pulls returned.")


class JoinReply(BaseModel):
    member_id: str
    generation: int
    assignments: list[Assignment]
    heartbeat_interval_ms: int
    session_timeout_ms: int


class HeartbeatRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    generation: int = Field(ge=0, le=_MAX_INT)


class HeartbeatReply(BaseModel):
    generation: int
    assignments: list[Assignment]
    rebalance: bool = Field(description="The generation moved on: use these assignments from now on.")


class RecordOut(BaseModel):
    topic: str
    partition: int
    offset: int
    timestamp_ms: int
    key: str | None = Field(description="The record key's JSON text, or null.")
    value: Any = Field(description="The record's JSON value (null: a tombstone).")
    headers: dict[str, str]


class Records(BaseModel):
    generation: int
    records: list[RecordOut]


class OffsetIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    topic: Topic
    partition: int = Field(ge=0, le=1_000_000)
    offset: int = Field(ge=0, le=_MAX_INT, description="The next offset to read (Kafka's convention).")


class CommitRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    generation: int = Field(ge=0, le=_MAX_INT)
    offsets: list[OffsetIn] = Field(max_length=100_000)


class CommitReply(BaseModel):
    generation: int
    offsets: list[OffsetIn]


class GroupSummary(BaseModel):
    group: str
    members: int
    generation: int
    lag: int | None = Field(
        description="Records between the committed offsets and the log's end (null: none committed)."
    )


class _Reset(BaseModel):
    model_config = ConfigDict(extra="forbid")

    topic: Topic | None = Field(default=None, description="Only this topic (default: every topic the group consumed).")
    dry_run: StrictBool = Field(default=False, description="Answer the new offsets without writing them.")


class ResetToEnd(_Reset):
    to: Literal["earliest", "latest"] = Field(description="The first offset the log still holds, or its end.")


class ResetToDatetime(_Reset):
    to: Literal["datetime"] = Field(description="The first record at or after `datetime` (the log's time index).")
    datetime: dt.datetime = Field(description="ISO-8601; without a zone, UTC.")


class ResetToOffset(_Reset):
    to: Literal["offset"] = Field(description="`offset`, kept within the offsets the log holds.")
    offset: int = Field(ge=0, le=_MAX_INT)


class ResetOffset(BaseModel):
    topic: str
    partition: int
    previous: int | None
    offset: int


class ResetReply(BaseModel):
    group: str
    dry_run: bool
    offsets: list[ResetOffset]


_BODY: dict[int | str, dict[str, Any]] = {
    400: error("the body is not JSON"),
    413: error("the body is larger than [api] max_body_bytes"),
    422: error("invalid request"),
}
_CONFLICT: dict[int | str, dict[str, Any]] = {
    409: error("fenced (a rebalance happened), unknown_member (join again) or not_assigned: see `code`")
}


def _coordinator(request: Request) -> GroupCoordinator:
    return request.app.state.coordinator  # type: ignore[no-any-return]


async def _run(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """`fn` in a worker thread; a log that cannot be read as it is (e.g. its manifest vanished) is a 503
    with the log's one-line message, which says how to repair it."""
    try:
        return await asyncio.to_thread(fn, *args, **kwargs)
    except LogError as exc:
        raise HTTPException(503, str(exc)) from None


def _assignments(tps: list[tuple[str, int]]) -> list[dict[str, Any]]:
    return [{"topic": t, "partition": p} for t, p in tps]


@router.post(
    "/groups/{group}/members",
    dependencies=_READ,
    response_model=JoinReply,
    responses={**AUTH_RESPONSES, **_BODY},
)
async def join(group: GroupName, body: JoinRequest, request: Request) -> dict[str, Any]:
    """Join the group (or re-join with `member_id`): the answer names the member's partitions. Send a
    heartbeat every `heartbeat_interval_ms` (pulls and an open stream count as heartbeats too)."""
    m = await _run(
        _coordinator(request).join,
        group,
        body.topics,
        member_id=body.member_id,
        session_timeout_ms=body.session_timeout_ms,
        auto_offset_reset=body.auto_offset_reset,
        auto_commit=body.auto_commit,
    )
    return {
        "member_id": m.member_id,
        "generation": m.generation,
        "assignments": _assignments(m.assignments),
        "heartbeat_interval_ms": m.heartbeat_interval_ms,
        "session_timeout_ms": m.session_timeout_ms,
    }


@router.post(
    "/groups/{group}/members/{member_id}/heartbeat",
    dependencies=_READ,
    response_model=HeartbeatReply,
    responses={**AUTH_RESPONSES, **_BODY, **_CONFLICT},
)
async def heartbeat(group: GroupName, member_id: MemberId, body: HeartbeatRequest, request: Request) -> dict[str, Any]:
    """Stay in the group; `rebalance` = true when the generation moved on (take the new assignments;
    records of partitions no longer held will be redelivered to their new member from the committed offset)."""
    hb = await _run(_coordinator(request).heartbeat, group, member_id, body.generation)
    return {"generation": hb.generation, "assignments": _assignments(hb.assignments), "rebalance": hb.rebalance}


@router.delete("/groups/{group}/members/{member_id}", dependencies=_READ, status_code=204, responses=AUTH_RESPONSES)
async def leave(group: GroupName, member_id: MemberId, request: Request) -> Response:
    """Leave the group: its partitions move to the other members at once."""
    await _run(_coordinator(request).leave, group, member_id)
    return Response(status_code=204)


@router.get(
    "/groups/{group}/members/{member_id}/records",
    dependencies=_READ,
    response_class=Response,
    responses={
        200: {"model": Records, "description": "records in offset order per partition (empty after `wait_ms`)"},
        **AUTH_RESPONSES,
        **_CONFLICT,
        410: error("offset_out_of_range: the position fell behind retention and auto_offset_reset is error"),
    },
)
async def records(
    group: GroupName,
    member_id: MemberId,
    request: Request,
    generation: Annotated[int, Query(ge=0, le=_MAX_INT)],
    max_records: Annotated[int, Query(ge=1, le=100_000)] = 500,
    max_bytes: Annotated[int, Query(ge=1, le=64 << 20)] = 1 << 20,
    wait_ms: Annotated[int, Query(ge=0, le=60_000)] = 5000,
) -> Response:
    """The next records of the member's partitions: as soon as there is at least one, or none after
    `wait_ms`. Each call continues where the previous one ended (at-least-once: after a rebalance or
    a restart, delivery restarts at the committed offset)."""
    coordinator = _coordinator(request)
    changes: LogChanges = request.app.state.log_changes
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait_ms / 1000
    while True:
        batch = await _run(
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
    dependencies=_READ,
    response_model=CommitReply,
    responses={**AUTH_RESPONSES, **_BODY, **_CONFLICT},
)
async def commit(group: GroupName, member_id: MemberId, body: CommitRequest, request: Request) -> dict[str, Any]:
    """Commit the next offset to read per partition; refused (409) from a generation that is over or
    for a partition the member does not hold."""
    offsets = [(o.topic, o.partition, o.offset) for o in body.offsets]
    await _run(_coordinator(request).commit, group, member_id, body.generation, offsets)
    return {"generation": body.generation, "offsets": [o.model_dump() for o in body.offsets]}


@router.get(
    "/groups/{group}/members/{member_id}/stream",
    dependencies=_READ,
    response_class=StreamingResponse,
    responses={
        200: {
            "content": {"text/event-stream": {}},
            "description": "`record` events (id = topic/partition/offset, data = a record as in the pull), "
            "`rebalance` events (data: generation and assignments), `error` events before the stream ends",
        },
        **AUTH_RESPONSES,
        **_CONFLICT,
    },
)
async def stream(
    group: GroupName,
    member_id: MemberId,
    request: Request,
    generation: Annotated[int, Query(ge=0, le=_MAX_INT)],
    last_event_id: Annotated[str | None, Query(max_length=600, description="Resume after this event id.")] = None,
    last_event_header: Annotated[str | None, Header(alias="Last-Event-ID", max_length=600)] = None,
) -> StreamingResponse:
    """The member's records as server-sent events, from its committed offsets (or just after
    `Last-Event-ID`, the header or the query parameter); the stream follows rebalances by itself
    (a `rebalance` event, then the new partitions' records) and keeps the member alive."""
    coordinator = _coordinator(request)
    hb = await _run(coordinator.heartbeat, group, member_id, generation)
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
    batch_records = request.app.state.settings.consumers.stream_batch_records
    changes: LogChanges = request.app.state.log_changes
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
            batch = await _run(coordinator.stream_fetch, cursor, max_records=batch_records)
        except Fenced:
            try:
                hb = await _run(coordinator.heartbeat, group, member_id, generation)
            except UnknownMember as gone:
                yield _sse_error(gone)
                return
            generation = cursor.generation = hb.generation
            cursor.assignments = None
            for tp in [tp for tp in positions if tp not in hb.assignments]:
                del positions[tp]  # moved away: its new member starts at the committed offset
            data = {"generation": generation, "assignments": _assignments(hb.assignments)}
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
    return b"event: error\ndata: %b\n\n" % orjson.dumps(_error_body(exc))


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


@router.get("/groups", dependencies=_READ, response_model=list[GroupSummary], responses=AUTH_RESPONSES)
async def groups(request: Request) -> list[dict[str, Any]]:
    """Every consumer group: live members, generation, lag."""
    return await _run(_coordinator(request).groups)


@router.get("/groups/{group}", dependencies=_READ, responses={**AUTH_RESPONSES, 404: error("no such group")})
async def describe(group: GroupName, request: Request) -> Any:
    """Members (id, topics, assignments, last heartbeat), generation, and per topic-partition the
    member holding it, committed offset, log start and end, lag, last commit and the last reset past
    retention (`out_of_range`)."""
    described = await _run(_coordinator(request).describe, group)
    if described is None:
        return JSONResponse({"detail": f"no consumer group {group!r}"}, status_code=404)
    return described


@router.post(
    "/groups/{group}/reset",
    dependencies=[Depends(require("admin"))],
    response_model=ResetReply,
    responses={
        **AUTH_RESPONSES,
        **_BODY,
        404: error("a topic the log does not hold, or a group that consumed no topic yet"),
        409: error("group_not_empty: the group has live members"),
    },
)
async def reset(
    group: GroupName,
    body: Annotated[ResetToEnd | ResetToDatetime | ResetToOffset, Body(discriminator="to")],
    request: Request,
) -> dict[str, Any]:
    """Move the group's committed offsets (every topic it consumed, or `topic`): `earliest`, `latest`,
    `datetime` (the first record at or after it, by the log's time index) or `offset` (clamped to the
    retained offsets). Refused while the group has live members."""
    when = body.datetime if isinstance(body, ResetToDatetime) else None
    if when is not None and when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    timestamp_ms = None
    if when is not None:
        try:
            timestamp_ms = int(when.timestamp() * 1000)
        except OverflowError:  # a zone offset pushed it past year 1 or 9999: before or after every record
            timestamp_ms = -(2**62) if when.year < 1970 else 2**62
    out = await _run(
        _coordinator(request).reset,
        group,
        body.to,
        timestamp_ms=timestamp_ms,
        offset=body.offset if isinstance(body, ResetToOffset) else None,
        topic=body.topic,
        dry_run=body.dry_run,
    )
    return {"group": group, "dry_run": body.dry_run, "offsets": out}


def _error_body(exc: ConsumerError) -> dict[str, Any]:
    body: dict[str, Any] = {"error": str(exc), "code": getattr(exc, "code", "invalid"), "detail": str(exc)}
    if isinstance(exc, UnknownMember | Fenced | NotAssigned):
        body["generation"] = exc.generation
    if isinstance(exc, OffsetOutOfRange):
        body |= {"topic": exc.topic, "partition": exc.partition, "position": exc.position, "start": exc.start}
    return body


async def consumer_error(request: Request, exc: Exception) -> JSONResponse:
    """The one mapping of the consumers' errors to HTTP: 409 for membership and fencing, 410 past
    retention, 404 for a topic or group that is not there, 422 for the rest."""
    assert isinstance(exc, ConsumerError)
    if isinstance(exc, UnknownMember | Fenced | NotAssigned | GroupBusy):
        status = 409
    elif isinstance(exc, OffsetOutOfRange):
        status = 410
    elif isinstance(exc, NotFound):
        status = 404
    else:
        status = 422
    return JSONResponse(_error_body(exc), status_code=status)


async def _sweep(coordinator: GroupCoordinator, interval_s: float) -> None:
    failure = None
    while True:
        await asyncio.sleep(interval_s)
        try:
            await asyncio.to_thread(coordinator.sweep)
            failure = None
        except Exception as exc:  # noqa: BLE001 - the sweeper outlives a failure (e.g. before `tributary init`)
            if repr(exc) != failure:
                log.warning(
                    "moving the partitions of silent consumers failed: %s",
                    (str(exc) or type(exc).__name__).splitlines()[0],
                )
            failure = repr(exc)


def _end_streams_on_exit_signals(changes: LogChanges) -> None:
    """End every stream as soon as the server is told to stop (SIGTERM, SIGINT), then let the server's
    own handler run: uvicorn waits for open responses before it shuts the app down, and a stream never
    ends by itself. Chains the handler in place; outside the main thread there is none to chain."""
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        previous = signal.getsignal(sig)
        if not callable(previous):
            continue

        def handler(signum: int, frame: FrameType | None, previous: Callable[..., Any] = previous) -> None:
            loop.call_soon_threadsafe(changes.end_waits)
            previous(signum, frame)

        try:
            signal.signal(sig, handler)
        except ValueError:  # not the main thread
            return


def start_consumers(app: Any, *, dsn: str) -> Callable[[], Any]:
    """Create the app's coordinator, log watcher and sweeper; returns the coroutine function that
    stops them (the lifespan awaits it on shutdown)."""
    settings = app.state.settings
    c = settings.consumers
    coordinator = GroupCoordinator(
        dsn,
        settings.log.root,
        session_timeout_ms=c.session_timeout_ms,
        auto_offset_reset=c.auto_offset_reset,
        poll_interval_ms=c.poll_interval_ms,
        kafka=kafka_options(settings),
    )
    app.state.coordinator = coordinator
    app.state.log_changes = changes = LogChanges(coordinator.view, interval_s=coordinator.poll_interval_s)
    _end_streams_on_exit_signals(changes)
    sweeper = asyncio.create_task(_sweep(coordinator, c.sweep_interval_ms / 1000), name="consumer-sweeper")

    async def stop() -> None:
        sweeper.cancel()
        await changes.close()
        await asyncio.to_thread(coordinator.close)

    return stop
