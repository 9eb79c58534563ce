"""Consumer groups inspected and replayed over HTTP: list, describe, reset (docs/consumers.md)."""

from __future__ import annotations

import datetime as dt
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Body, Depends
from pydantic import BaseModel, ConfigDict, Field, StrictBool

from tributary.api.http.auth import AUTH_RESPONSES, error, require
from tributary.api.http.groups_shared import (
    BODY_ERRORS,
    MAX_INT,
    READ,
    GroupName,
    Topic,
    run_in_thread,
)
from tributary.api.http.problems import Problem
from tributary.api.http.state import Coordinator

__all__ = ["router"]

router = APIRouter(tags=["consumers"])


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
    offset: int = Field(ge=0, le=MAX_INT)


class ResetOffset(BaseModel):
    topic: str
    partition: int
    previous: int | None
    offset: int


class ResetReply(BaseModel):
    group: str
    dry_run: bool
    offsets: list[ResetOffset]


@router.get("/groups", dependencies=READ, response_model=list[GroupSummary], responses=AUTH_RESPONSES)
async def groups(coordinator: Coordinator) -> list[dict[str, Any]]:
    """Every consumer group: live members, generation, lag."""
    return await run_in_thread(coordinator.groups)


@router.get("/groups/{group}", dependencies=READ, responses={**AUTH_RESPONSES, 404: error("no such group")})
async def describe(group: GroupName, coordinator: Coordinator) -> Any:
    """Members (id, topics, assignments, last heartbeat), generation, and per topic-partition the
    member holding it, committed offset, log start and end, lag, last commit and the last reset past
    retention (`out_of_range`)."""
    described = await run_in_thread(coordinator.describe, group)
    if described is None:
        raise Problem(404, "not_found", f"no consumer group {group!r}")
    return described


@router.post(
    "/groups/{group}/reset",
    dependencies=[Depends(require("admin"))],
    response_model=ResetReply,
    responses={
        **AUTH_RESPONSES,
        **BODY_ERRORS,
        404: error("a topic the log does not hold, or a group that consumed no topic yet"),
        409: error("group_not_empty: the group has live members"),
    },
)
async def reset(
    group: GroupName,
    body: Annotated[ResetToEnd | ResetToDatetime | ResetToOffset, Body(discriminator="to")],
    coordinator: Coordinator,
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
    out = await run_in_thread(
        coordinator.reset,
        group,
        body.to,
        timestamp_ms=timestamp_ms,
        offset=body.offset if isinstance(body, ResetToOffset) else None,
        topic=body.topic,
        dry_run=body.dry_run,
    )
    return {"group": group, "dry_run": body.dry_run, "offsets": out}
