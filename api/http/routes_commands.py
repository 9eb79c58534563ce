"""Commands and streams: `POST /commands/{stream_type}/{stream_id}`, `GET /streams/{id}[/state]`.

The handler is synchronous psycopg (a pooled connection per call); it runs in a worker thread, so
nothing blocks the event loop. Errors map to HTTP in one place (`answers.event_store_problem`).

A command is the API's hottest write: `COMMAND_ROUTE` serves it ahead of the app's routes as a plain
Starlette route (`app.HOT_ROUTES`), reading, checking and validating the request itself in the order
and with the answers of FastAPI's route, which stays in `router` for the OpenAPI document (and the
405 of other methods). FastAPI's request handling of that route (its dependency solving and body
machinery) cost about as much CPU on the event loop as the rest of the request.
"""

from __future__ import annotations

import asyncio
import email.message
import json
import time
from typing import Annotated, Any, Literal

import pydantic_core
from fastapi import APIRouter, Depends, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError
from starlette.datastructures import State
from starlette.exceptions import HTTPException

from tributary.api.http.answers import event_store_problem, json_response
from tributary.api.http.auth import AUTH_RESPONSES, error, require
from tributary.api.http.definitions import current_aggregates, due
from tributary.api.http.domains import GENERIC_COMMAND_PATH
from tributary.api.http.front import TemplateRoute
from tributary.api.http.problems import ConflictBody, Problem
from tributary.api.http.state import AppState, Handler, app_state, handler_of, metrics_of
from tributary.eventstore.errors import EventStoreError, UnknownStreamType
from tributary.eventstore.handler import CommandHandler
from tributary.eventstore.model import event_json
from tributary.eventstore.values import MAX_HEADER_VALUE, MAX_HEADERS, MAX_ID_LENGTH

__all__ = ["COMMAND_ROUTE", "CommandReply", "CommandRequest", "EventOut", "StreamEvents", "StreamState", "router"]

router = APIRouter(tags=["commands"])

_MAX_VERSION = 2**53 - 1  # versions are `bigint`; this bound is also exact as a JSON number (a double)


class CommandRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: str = Field(min_length=1, max_length=100, description="Command type, e.g. `deposit`.")
    data: dict[str, Any] = Field(default_factory=dict, description="The command's fields.")
    expected_version: (
        Annotated[int, Field(ge=0, le=_MAX_VERSION, strict=True)] | Literal["any", "no_stream", "stream_exists"] | None
    ) = Field(
        default=None,
        description="`any` (the default: conflicts with other writers are retried), `stream_exists` (409 unless "
        "the stream has events), `no_stream` or a version n (409 unless the stream is at that version; 0 = no stream). "
        'Strict: `false` or `"3"` is refused, not taken for 0 or 3.',
    )
    command_id: str | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_ID_LENGTH,
        description="Makes the command idempotent; the command's own id (a new one when absent): the events' "
        "`causation_id` and `correlation_id` unless those are sent.",
    )
    correlation_id: str | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_ID_LENGTH,
        description="Stored in each event's metadata (default: the command's id) and carried into the log's headers.",
    )
    causation_id: str | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_ID_LENGTH,
        description="What caused this command (e.g. the id of the event a process manager reacted to): stored "
        "in each event's metadata (default: the command's id) and carried into the log's headers.",
    )
    headers: dict[str, str] | None = Field(
        default=None,
        max_length=MAX_HEADERS,
        description=f"User headers (string values of at most {MAX_HEADER_VALUE} characters): stored in each event's "
        "`metadata.headers` and carried into the log record's headers.",
    )


class EventOut(BaseModel):
    """An event as the API (and the log) shows it; money and other decimals are strings."""

    id: str
    stream: str
    stream_type: str
    version: int
    position: int
    type: str
    schema_version: int
    data: dict[str, Any]
    metadata: dict[str, Any]
    occurred_at: str = Field(description="ISO 8601, UTC (`Z`).")
    recorded_at: str = Field(description="ISO 8601, UTC (`Z`).")


class CommandReply(BaseModel):
    stream_id: str
    version: int = Field(description="The stream's version after the command.")
    events: list[EventOut]


class StreamEvents(BaseModel):
    stream_id: str
    events: list[EventOut]


class StreamState(BaseModel):
    """The aggregate's state fields (per stream type) beside these three."""

    model_config = ConfigDict(extra="allow")

    stream_id: str
    stream_type: str
    version: int


# The routes answer with `_json` (decimals exact, no re-validation); these models document the bodies so that
# schemathesis' response_schema_conformance checks them.


async def _current(state: State, handler: CommandHandler) -> CommandHandler:
    """The handler, with the aggregates of `[eventstore] modules` as the config and domain files say
    now (looked at once a second at most: `definitions.current_aggregates`)."""
    if due(state, "aggregates"):
        await asyncio.to_thread(current_aggregates, state, checked=True)
    return handler


def _no_modules(state: State, stream_type: str) -> Problem:
    """404 for a command while no domain module is configured: which config file says so."""
    path = getattr(state, "config_path", None)
    if path is None:  # nothing to follow: the server read no file at start
        how = "the server read no config file at start; list them in one and restart `tributary serve --config FILE`"
    else:
        how = f"add them to [eventstore] modules in {path}; the running server loads them within a second"
    return Problem(
        404, "unknown_stream_type", f"no stream type {stream_type!r}: no [eventstore] modules are configured ({how})"
    )


@router.post(
    "/commands/{stream_type}/{stream_id}",
    dependencies=[Depends(require("write"))],
    responses={
        200: {"model": CommandReply, "description": "the events the command appended (or, replayed, had appended)"},
        **AUTH_RESPONSES,
        400: error("the body is not JSON"),
        404: error("unknown stream type"),
        409: error(
            "`conflict`: the stream is not at `expected_version`, or other writers won every retry "
            "(`stream`, `expected`, `actual`, `attempts`, and a `detail` that says what to do)",
            ConflictBody,
        ),
        410: error("`stream_deleted`: the stream was deleted for good (a hard delete); use another id"),
        413: error("the body is larger than `[api] max_body_bytes`"),
        422: error(f"invalid or rejected command, or a stream id over {MAX_ID_LENGTH} characters"),
        503: error("the service database did not answer; retry (a `command_id` makes the retry safe)"),
    },
)
async def send_command(stream_type: str, stream_id: str, body: CommandRequest, request: Request) -> Response:
    """Validate the command against the aggregate's state and append its events."""
    return await _send(request, stream_type, stream_id, body)


async def _send(request: Request, stream_type: str, stream_id: str, body: CommandRequest) -> Response:
    """The command, checked and parsed, through the handler (in a worker thread) to its answer."""
    # The app's state through its typed accessors, not `Depends`: a hot route (see `state`).
    state, metrics = await app_state(request), await metrics_of(request)
    handler = await _current(state, await handler_of(request))
    started = time.perf_counter()
    outcome = "ok"
    try:
        result = await asyncio.to_thread(
            handler.handle,
            stream_type,
            stream_id,
            body.type,
            body.data,
            expected_version=body.expected_version,
            command_id=body.command_id,
            correlation_id=body.correlation_id,
            causation_id=body.causation_id,
            headers=body.headers,
        )
    except EventStoreError as exc:
        outcome = type(exc).__name__
        if isinstance(exc, UnknownStreamType) and not handler.aggregates:
            raise _no_modules(state, stream_type) from None
        raise event_store_problem(exc) from None
    finally:
        metrics.command_seconds.labels(stream_type).observe(time.perf_counter() - started)
        metrics.commands.labels(stream_type, outcome).inc()
    return json_response(result.to_json())


# -- the command route served ahead of FastAPI's (same answers) ---------------------------------------

_COMMAND_BODY: TypeAdapter[CommandRequest] = TypeAdapter(CommandRequest)
_WRITE = require("write")
_NO_BODY = object()  # an empty body: FastAPI validates it as a missing one


def _is_json(content_type: str | None) -> bool:
    """Whether FastAPI reads a body of this type as JSON: `application/json` or `application/*+json`;
    without a type it does not (its strict default), and the body fails validation as bytes."""
    if content_type == "application/json":
        return True
    if not content_type:
        return False
    message = email.message.Message()
    message["content-type"] = content_type
    subtype = message.get_content_subtype()
    return message.get_content_maintype() == "application" and (subtype == "json" or subtype.endswith("+json"))


def _parse_json(raw: bytes) -> Any:
    """The body's JSON as `json.loads` reads it, in a tenth of its time: pydantic-core's parser
    (orjson would turn an integer past 64 bits into a float), and `json.loads` for what that parser
    refuses (its errors, NaN it takes too, lone surrogates, UTF-16 and UTF-32, a byte order mark)."""
    try:
        return pydantic_core.from_json(raw)
    except ValueError:
        return json.loads(raw)


async def _read_body(request: Request) -> Any:
    """The body as FastAPI reads a JSON body parameter, with its errors: 422 `json_invalid` for
    JSON that does not parse, 400 for a body it could not read or decode."""
    try:
        raw = await request.body()
        if not raw:
            return _NO_BODY
        return _parse_json(raw) if _is_json(request.headers.get("content-type")) else raw
    except json.JSONDecodeError as exc:
        error = {"type": "json_invalid", "loc": ("body", exc.pos), "msg": "JSON decode error", "input": {}}
        raise RequestValidationError([{**error, "ctx": {"error": exc.msg}}], body=exc.doc) from exc
    except HTTPException:
        raise
    except Exception as exc:
        raise HTTPException(status_code=400, detail="There was an error parsing the body") from exc


def _command_body(body: Any) -> CommandRequest:
    """The body validated as FastAPI validates the route's `CommandRequest` (errors under `body`)."""
    if body is _NO_BODY:
        raise RequestValidationError([{"type": "missing", "loc": ("body",), "msg": "Field required", "input": None}])
    try:
        return _COMMAND_BODY.validate_python(body, from_attributes=True)
    except ValidationError as exc:
        errors = [{**e, "loc": ("body", *e["loc"])} for e in exc.errors(include_url=False)]
        raise RequestValidationError(errors, body=body) from None


async def _command_endpoint(request: Request) -> Response:
    """`POST /commands/{stream_type}/{stream_id}` in FastAPI's order: the body read and parsed, the
    key's scope, the body validated, the command."""
    body = await _read_body(request)
    await _WRITE(request)
    command = _command_body(body)
    params = request.path_params
    return await _send(request, params["stream_type"], params["stream_id"], command)


COMMAND_ROUTE = TemplateRoute(GENERIC_COMMAND_PATH, _command_endpoint, methods=["POST"], include_in_schema=False)


_STREAM_RESPONSES: dict[int | str, dict[str, Any]] = {
    **AUTH_RESPONSES,
    404: error("no stream with this id (never written, or deleted)"),
    410: error("`stream_deleted`: the stream was deleted for good (a hard delete)"),
    422: error(f"not a stream id the store can hold (over {MAX_ID_LENGTH} characters, or a NUL)"),
    503: error("the service database did not answer; retry"),
}


@router.get(
    "/streams/{stream_id}",
    dependencies=[Depends(require("read"))],
    responses={200: {"model": StreamEvents, "description": "events, oldest (or newest) first"}, **_STREAM_RESPONSES},
)
async def read_stream(
    stream_id: str,
    handler: Handler,
    from_version: int | None = Query(
        None, ge=1, le=_MAX_VERSION, description="First version to return (default: the first, or backwards the last)."
    ),
    limit: int = Query(100, ge=1, le=1000),
    direction: Literal["forwards", "backwards"] = Query("forwards"),
) -> Response:
    """The stream's events from `from_version`, oldest first (or newest first, `direction=backwards`)."""
    store = handler.store
    backwards = direction == "backwards"
    start = from_version or (0 if backwards else 1)
    try:
        events = await asyncio.to_thread(
            store.read_stream, stream_id, from_version=start, limit=limit, backwards=backwards
        )
    except EventStoreError as exc:
        raise event_store_problem(exc) from None
    if not events and (backwards or start == 1):
        raise Problem(404, "unknown_stream", f"no stream {stream_id!r}")
    return json_response({"stream_id": stream_id, "events": [event_json(e) for e in events]})


@router.get(
    "/streams/{stream_id}/state",
    dependencies=[Depends(require("read"))],
    responses={200: {"model": StreamState, "description": "folded state and version"}, **_STREAM_RESPONSES},
)
async def stream_state(stream_id: str, state: AppState, handler: Handler) -> Response:
    """The aggregate's folded state and version."""
    handler = await _current(state, handler)
    try:
        first = await asyncio.to_thread(handler.store.read_stream, stream_id, limit=1)
    except EventStoreError as exc:
        raise event_store_problem(exc) from None
    if not first:
        raise Problem(404, "unknown_stream", f"no stream {stream_id!r}")
    stream_type = first[0].stream_type
    try:
        loaded = await asyncio.to_thread(handler.load, stream_type, stream_id)
    except EventStoreError as exc:
        raise event_store_problem(exc) from None
    return json_response(
        {
            "stream_id": stream_id,
            "stream_type": stream_type,
            "version": loaded.version,
            **loaded.state.model_dump(mode="json"),
        }
    )
