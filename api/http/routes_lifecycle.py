"""A stream's lifecycle over HTTP: `GET/PUT /streams/{id}/metadata` (KurrentDB's stream metadata,
with its own expected version) and `DELETE /streams/{id}[?hard=true]` (soft delete, or a
tombstone). Writing metadata and deleting remove events for good (at the next scavenge), so both
need the `admin` scope; reading metadata needs `read`."""

from __future__ import annotations

import asyncio
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Query
from fastapi.responses import Response
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from tributary.api.http.answers import event_store_problem, json_response
from tributary.api.http.auth import AUTH_RESPONSES, error, require
from tributary.api.http.fields import no_bool
from tributary.api.http.state import Handler
from tributary.eventstore.errors import EventStoreError
from tributary.eventstore.store import StreamMetadata

__all__ = ["MetadataIn", "MetadataOut", "router"]

router = APIRouter(tags=["streams"])

_LIMIT = 2**53 - 1  # exact as a JSON number


_Limit = Annotated[int, Field(ge=1, le=_LIMIT), BeforeValidator(no_bool)]
_Version = Annotated[int, Field(ge=0, le=_LIMIT), BeforeValidator(no_bool)]


class MetadataIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    max_age: _Limit | None = Field(None, description="Seconds: older events are hidden ($maxAge).")
    max_count: _Limit | None = Field(None, description="Only the last n events are visible ($maxCount).")
    truncate_before: _Limit | None = Field(None, description="Versions below it are hidden ($tb).")
    custom: dict[str, Any] = Field(default_factory=dict, description="Your own metadata, a JSON object.")
    expected_metadata_version: _Version | None = Field(
        None, description="Write only if the metadata is at this version (0: never written)."
    )


class MetadataOut(BaseModel):
    stream_id: str
    max_age: int | None
    max_count: int | None
    truncate_before: int | None
    custom: dict[str, Any]
    version: int = Field(description="The metadata's own version (0: never written).")


class Deleted(BaseModel):
    stream_id: str
    hard: bool
    version: int = Field(description="The version the stream ended at; a recreated stream continues after it.")


_RESPONSES: dict[int | str, dict[str, Any]] = {
    **AUTH_RESPONSES,
    410: error("`stream_deleted`: the stream was deleted for good (a hard delete)"),
    422: error("not a stream id the store can hold, or a limit that is not a positive integer"),
    503: error("the service database did not answer; retry"),
}


def _out(stream_id: str, meta: StreamMetadata) -> Response:
    return json_response({"stream_id": stream_id, **meta.to_json()})


@router.get(
    "/streams/{stream_id}/metadata",
    dependencies=[Depends(require("read"))],
    responses={200: {"model": MetadataOut, "description": "the stream's metadata"}, **_RESPONSES},
)
async def get_metadata(stream_id: str, handler: Handler) -> Response:
    """The stream's metadata and its version (version 0 and no limits until first written)."""
    try:
        meta = await asyncio.to_thread(handler.store.stream_metadata, stream_id)
    except EventStoreError as exc:
        raise event_store_problem(exc) from None
    return _out(stream_id, meta)


@router.put(
    "/streams/{stream_id}/metadata",
    dependencies=[Depends(require("admin"))],
    responses={
        200: {"model": MetadataOut, "description": "the metadata as written, with its new version"},
        400: error("the body is not JSON"),
        409: error("`metadata_conflict`: the metadata is not at `expected_metadata_version`"),
        **_RESPONSES,
    },
)
async def put_metadata(stream_id: str, body: MetadataIn, handler: Handler) -> Response:
    """Replace the stream's metadata; reads honour its limits at once, a scavenge removes what they hide."""
    meta = StreamMetadata(body.max_age, body.max_count, body.truncate_before, body.custom)
    expected: int | Literal["any"] = "any" if body.expected_metadata_version is None else body.expected_metadata_version
    try:
        written = await asyncio.to_thread(handler.store.set_stream_metadata, stream_id, meta, expected_version=expected)
    except EventStoreError as exc:
        raise event_store_problem(exc) from None
    return _out(stream_id, written)


@router.delete(
    "/streams/{stream_id}",
    dependencies=[Depends(require("admin"))],
    responses={
        200: {"model": Deleted, "description": "deleted; its events go at the next scavenge"},
        404: error("no stream with this id (never written, or already deleted)"),
        **_RESPONSES,
    },
)
async def delete_stream(
    stream_id: str,
    handler: Handler,
    hard: bool = Query(False, description="A tombstone: the id can never be used again."),
) -> Response:
    """Delete the stream: soft (reads 404; a command or `no_stream` append recreates it, versions
    continuing) or hard (a tombstone: reads and appends answer 410 for good)."""
    try:
        end = await asyncio.to_thread(handler.store.delete_stream, stream_id, hard=hard)
    except EventStoreError as exc:
        raise event_store_problem(exc) from None
    return json_response({"stream_id": stream_id, "hard": hard, "version": end})
