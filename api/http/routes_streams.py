"""Reads beyond one stream: `GET /streams?type=` (the streams of a type), `GET /all` (`$all`,
paged, optionally one stream type) and `GET /all/subscribe` (the same, followed as server-sent
events). Positions are global positions; `$all`'s order is gap-safe (`EventStore.read_all`)."""

from __future__ import annotations

import asyncio
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header, Query, Request
from fastapi.responses import Response, StreamingResponse
from pydantic import BaseModel, Field

from tributary.api.http.answers import event_store_problem, json_response
from tributary.api.http.auth import AUTH_RESPONSES, error, require
from tributary.api.http.fields import NO_NUL
from tributary.api.http.head import HEAD_MARK
from tributary.api.http.problems import Problem
from tributary.api.http.routes_commands import EventOut
from tributary.api.http.state import Handler, SubscriptionsOf
from tributary.api.http.subscriptions import AllFilter
from tributary.eventstore.errors import EventStoreError, UnknownPosition
from tributary.eventstore.model import event_json
from tributary.eventstore.values import MAX_ID_LENGTH

__all__ = ["AllEvents", "StreamList", "StreamSummary", "router"]

router = APIRouter(tags=["streams"])

_MAX_POSITION = 2**63 - 1


class StreamSummary(BaseModel):
    stream_id: str
    version: int = Field(description="The stream's current version.")
    created_at: str = Field(description="When its first event was recorded (ISO 8601, UTC `Z`).")


class StreamList(BaseModel):
    stream_type: str
    streams: list[StreamSummary]
    next: str | None = Field(description="Pass as `after` for the next page; null when this page is the last.")


class AllEvents(BaseModel):
    events: list[EventOut]
    next: int = Field(description="The position to continue from: pass it as `after` (the same when nothing is new).")


def _position_error(exc: EventStoreError) -> Problem:
    if isinstance(exc, UnknownPosition):
        return Problem(404, "unknown_position", str(exc), position=exc.position)
    return event_store_problem(exc)


_READ_RESPONSES: dict[int | str, dict[str, Any]] = {
    **AUTH_RESPONSES,
    404: error("`after` is not the position of a stored event"),
    503: error("the service database did not answer; retry"),
}
_TYPE = Query(
    None, min_length=1, max_length=MAX_ID_LENGTH, pattern=NO_NUL, description="Only the events of this stream type."
)
_STREAM = Query(
    None,
    min_length=1,
    max_length=MAX_ID_LENGTH,
    pattern=NO_NUL,
    description="Only the events of streams whose id starts with this (a prefix; the whole id for one stream).",
)
_EVENT_TYPE = Query(None, description="Only events of this type (repeat for several: any of them).")
_EventType = Annotated[str, Field(min_length=1, max_length=MAX_ID_LENGTH, pattern=NO_NUL)]


def _only(stream: str | None, event_type: list[str] | None) -> AllFilter | None:
    """The server-side filter of `$all` the query names (applied in SQL), or None."""
    if stream is None and not event_type:
        return None
    return stream, tuple(event_type) if event_type else None


@router.get(
    "/streams",
    dependencies=[Depends(require("read"))],
    responses={200: {"model": StreamList, "description": "streams in stream id order"}, **AUTH_RESPONSES},
)
async def list_streams(
    handler: Handler,
    type: str = Query(min_length=1, max_length=MAX_ID_LENGTH, pattern=NO_NUL, description="The stream type."),
    after: str = Query(
        "", max_length=MAX_ID_LENGTH, pattern=NO_NUL, description="The last stream id of the previous page."
    ),
    limit: int = Query(100, ge=1, le=1000),
) -> Response:
    """The streams of a type, in stream id order, with their current version."""
    store = handler.store
    try:
        found = await asyncio.to_thread(store.streams, type, after=after, limit=limit)
    except EventStoreError as exc:
        raise event_store_problem(exc) from None
    streams = [
        {
            "stream_id": s.stream_id,
            "version": s.version,
            "created_at": s.created_at.isoformat().replace("+00:00", "Z"),
        }
        for s in found
    ]
    return json_response(
        {"stream_type": type, "streams": streams, "next": streams[-1]["stream_id"] if len(streams) == limit else None}
    )


@router.get(
    "/all",
    dependencies=[Depends(require("read"))],
    responses={200: {"model": AllEvents, "description": "events in `$all` order"}, **_READ_RESPONSES},
)
async def read_all(
    subscriptions: SubscriptionsOf,
    after: int = Query(0, ge=0, le=_MAX_POSITION, description="Continue after this position (0: the start)."),
    limit: int = Query(100, ge=1, le=1000),
    type: str | None = _TYPE,
    stream: str | None = _STREAM,
    event_type: list[_EventType] | None = _EVENT_TYPE,
) -> Response:
    """`$all`: every stream's events in commit order by global position, paged. An event is
    listed once every transaction that began before its own has finished, so continuing from
    `next` never skips one that commits late. `stream` (a stream id prefix) and `event_type`
    (repeatable) filter on the server."""
    try:
        events = await subscriptions.read(after, limit, type, _only(stream, event_type))
    except EventStoreError as exc:
        raise _position_error(exc) from None
    return json_response({"events": [event_json(e) for e in events], "next": events[-1].position if events else after})


@router.get(
    "/all/subscribe",
    dependencies=[Depends(require("read"))],
    response_class=StreamingResponse,
    responses={
        200: {
            "content": {"text/event-stream": {}},
            "description": "server-sent events: `id` = the global position, `data` = the event (as `GET /all` "
            "lists it); resume with `Last-Event-ID` or `after`",
        },
        **_READ_RESPONSES,
    },
)
async def subscribe_all(
    request: Request,
    subscriptions: SubscriptionsOf,
    after: int = Query(0, ge=0, le=_MAX_POSITION, description="Start after this position (0: the start)."),
    type: str | None = _TYPE,
    stream: str | None = _STREAM,
    event_type: list[_EventType] | None = _EVENT_TYPE,
    last_event_id: str = Header(
        "", pattern=r"^([0-9]{1,19})?$", description="Resume after this position (wins over `after`)."
    ),
) -> StreamingResponse:
    """Follow `$all` (or one stream type) from a position: the events stored so far, then each new
    one as it is committed, as server-sent events (`text/event-stream`); `stream` (a stream id
    prefix) and `event_type` (repeatable) filter on the server."""
    if last_event_id:
        after = int(last_event_id)  # beyond any position: no such event, a 404 below
    try:  # an unknown position fails now, as a 404, not inside the stream
        await subscriptions.read(after, 1, type, _only(stream, event_type))
    except EventStoreError as exc:
        raise _position_error(exc) from None
    if request.scope.get(HEAD_MARK):  # HEAD: the headers only, and no stream that never ends
        return StreamingResponse(iter(()), media_type="text/event-stream")
    return StreamingResponse(
        subscriptions.follow(after, type, _only(stream, event_type)),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )
