"""Consumer-group membership over HTTP: join, heartbeat, leave (docs/consumers.md)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter
from fastapi.responses import Response
from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, StrictBool

from tributary.api.http.auth import AUTH_RESPONSES, error
from tributary.api.http.fields import NO_NUL, no_bool, storable
from tributary.api.http.groups_shared import (
    BODY_ERRORS,
    CONFLICT_ERRORS,
    MAX_INT,
    NAME_PATTERN,
    READ,
    Assignment,
    GroupName,
    MemberId,
    Topic,
    assignments_json,
    run_in_thread,
)
from tributary.api.http.state import Coordinator

__all__ = ["router"]

router = APIRouter(tags=["consumers"])


class JoinFilter(BaseModel):
    model_config = ConfigDict(extra="forbid")

    event_types: (
        list[Annotated[str, Field(min_length=1, max_length=200, pattern=NO_NUL), AfterValidator(storable)]] | None
    ) = Field(default=None, max_length=100, description="Only events of these types (default: every type).")
    stream_prefix: (
        Annotated[str, Field(min_length=1, max_length=500, pattern=NO_NUL), AfterValidator(storable)] | None
    ) = Field(default=None, description="Only events of streams whose id starts with this.")


_Retries = Annotated[int, Field(ge=0, le=1000), BeforeValidator(no_bool)]
_BackoffMs = Annotated[int, Field(ge=1, le=60_000), BeforeValidator(no_bool)]


class JoinRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    topics: list[Topic] = Field(min_length=1, max_length=100, description="Topics to consume.")
    member_id: str | None = Field(
        default=None,
        pattern=NAME_PATTERN,
        description="Re-join as this member (after a restart or a 409); new when unset.",
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
    filter: JoinFilter | None = Field(
        default=None,
        description="Applies to event topics (`events.<type>`): the server passes over the other events (the "
        "member's position moves past them, so its commits cover them); records of other topics are not filtered.",
    )
    max_retries: _Retries | None = Field(
        default=None,
        description="Nacks of one record before it is parked (default `[consumers] max_retries`).",
    )
    retry_backoff_ms: _BackoffMs | None = Field(
        default=None,
        description="Wait before a nacked record's first redelivery, doubling per attempt up to 60 s "
        "(default `[consumers] retry_backoff_ms`).",
    )


class JoinReply(BaseModel):
    member_id: str
    generation: int
    assignments: list[Assignment]
    heartbeat_interval_ms: int
    session_timeout_ms: int


class HeartbeatRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    generation: int = Field(ge=0, le=MAX_INT)


class HeartbeatReply(BaseModel):
    generation: int
    assignments: list[Assignment]
    rebalance: bool = Field(description="The generation moved on: use these assignments from now on.")


@router.post(
    "/groups/{group}/members",
    dependencies=READ,
    response_model=JoinReply,
    responses={
        **AUTH_RESPONSES,
        **BODY_ERRORS,
        409: error("parked_topic_taken: the group's parked topic `<group>.parked` is another writer's"),
    },
)
async def join(group: GroupName, body: JoinRequest, coordinator: Coordinator) -> dict[str, Any]:
    """Join the group (or re-join with `member_id`): the answer names the member's partitions. Send a
    heartbeat every `heartbeat_interval_ms` (pulls and an open stream count as heartbeats too)."""
    m = await run_in_thread(
        coordinator.join,
        group,
        body.topics,
        member_id=body.member_id,
        session_timeout_ms=body.session_timeout_ms,
        auto_offset_reset=body.auto_offset_reset,
        auto_commit=body.auto_commit,
        max_retries=body.max_retries,
        retry_backoff_ms=body.retry_backoff_ms,
        event_types=body.filter.event_types if body.filter else None,
        stream_prefix=body.filter.stream_prefix if body.filter else None,
    )
    return {
        "member_id": m.member_id,
        "generation": m.generation,
        "assignments": assignments_json(m.assignments),
        "heartbeat_interval_ms": m.heartbeat_interval_ms,
        "session_timeout_ms": m.session_timeout_ms,
    }


@router.post(
    "/groups/{group}/members/{member_id}/heartbeat",
    dependencies=READ,
    response_model=HeartbeatReply,
    responses={**AUTH_RESPONSES, **BODY_ERRORS, **CONFLICT_ERRORS},
)
async def heartbeat(
    group: GroupName, member_id: MemberId, body: HeartbeatRequest, coordinator: Coordinator
) -> dict[str, Any]:
    """Stay in the group; `rebalance` = true when the generation moved on (take the new assignments;
    records of partitions no longer held will be redelivered to their new member from the committed offset)."""
    hb = await run_in_thread(coordinator.heartbeat, group, member_id, body.generation)
    return {"generation": hb.generation, "assignments": assignments_json(hb.assignments), "rebalance": hb.rebalance}


@router.delete("/groups/{group}/members/{member_id}", dependencies=READ, status_code=204, responses=AUTH_RESPONSES)
async def leave(group: GroupName, member_id: MemberId, coordinator: Coordinator) -> Response:
    """Leave the group: its partitions move to the other members at once."""
    await run_in_thread(coordinator.leave, group, member_id)
    return Response(status_code=204)
